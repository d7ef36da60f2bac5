import CLibPQ
import Conveyor
import Foundation
import Synchronization

/// Confines one libpq connection to a thread of the store's own, bridges it to `async`, and
/// opens it again when it breaks.
///
/// Blocking libpq calls never run on Swift's cooperative thread pool: every use of the
/// connection is a block on `thread`, which runs them one at a time. Cancelling the awaiting task
/// sends `PQcancel` for the statement running on the server, and skips the block when it has not
/// started.
///
/// A block that fails because the connection broke is run again on a new connection, with
/// backoff, for up to `reconnectTimeout`: the connection is checked (without a round trip)
/// before each block, so a connection the server closed while idle is replaced before anything is
/// sent. A block marked not idempotent is not run again when the connection broke while a commit
/// was in flight; it fails with ``PostgresError/Code/commitUnknown``.
///
/// `@unchecked Sendable` is safe because `connection` and `closed` are only touched from blocks
/// running on the serial `thread`; `cancelHandle` (the `PGcancel` of the current connection,
/// which libpq documents as usable from any thread) is guarded by its `Mutex`, and is replaced
/// only by the thread, under that lock; `watchdog` is set once, in `init`, and only cancelled after.
final class SerializedConnection: @unchecked Sendable {
  private let thread: StoreThread
  private let conninfo: String
  private let scrubber: Scrubber
  private let reconnectTimeout: Duration
  /// How long a caller may wait on its own thread for its call's answer before it suspends, in
  /// nanoseconds (see ``Handoff/waitBriefly(nanoseconds:)``); zero: never.
  private let answerWait: UInt64
  /// How long one run of a block may take before its socket is shut down; nil: no limit.
  private let callTimeout: Duration?
  /// Run on each new connection before it is used (session settings).
  private let setup: @Sendable (Connection) throws -> Void
  private var connection: Connection?
  private var closed = false
  private let cancelHandle = Mutex<CancelHandle?>(nil)
  /// The run of a block that `callTimeout` applies to, while it runs.
  private let watched = Mutex<Watched?>(nil)
  /// Looks at `watched` a few times per `callTimeout` (nil without one).
  private var watchdog: (any DispatchSourceTimer)?

  private struct Watched: Sendable {
    var operation: Operation
    var attempt: Int
    var deadline: ContinuousClock.Instant
  }

  /// A `PGcancel` object, freed when replaced, and the connection's socket.
  final class CancelHandle: Sendable {
    // Safe to send: libpq allows PQcancel on this object from any thread; it is freed once, in deinit.
    nonisolated(unsafe) let pointer: OpaquePointer
    /// The connection's socket; valid while this handle is the current one (see ``abort()``).
    let socket: Int32
    init(_ pointer: OpaquePointer, socket: Int32) {
      self.pointer = pointer
      self.socket = socket
    }
    deinit { PQfreeCancel(pointer) }

    /// Shuts the socket down, so a call blocked on a server that stopped answering fails with a
    /// connection loss (and the store opens a new connection). Called under `cancelHandle`'s lock:
    /// the thread drops the handle under that lock before it closes the socket, so the
    /// descriptor cannot have been reused.
    func abort() {
      if socket >= 0 { _ = shutdown(socket, Int32(SHUT_RDWR)) }
    }

    /// Whether a cancel request is on its way (its thread has not returned).
    private let sending = Atomic<Bool>(false)
    /// Whether a cancel request is on its way: one may still reach the server and cancel
    /// whatever statement its backend runs then.
    var isSending: Bool { sending.load(ordering: .acquiring) }

    /// Sends a cancel request on a thread of its own, unless one is still on its way; returns at
    /// once.
    ///
    /// `PQcancel` connects to the server and waits for its postmaster to close the connection:
    /// against a server that froze whole (a paused machine, dropped packets) it blocks until the
    /// server comes back or TCP gives up, minutes later. Run by the canceller, it blocked
    /// `Task.cancel()` itself, under the call's lock, which kept ``abort()`` from ever running.
    /// The thread keeps the handle (and its `PGcancel`) alive until the request returns.
    func cancel() {
      guard !sending.exchange(true, ordering: .acquiringAndReleasing) else { return }
      let thread = Thread { [self] in
        var buffer = [CChar](repeating: 0, count: 256)
        _ = PQcancel(pointer, &buffer, 256)
        sending.store(false, ordering: .releasing)
      }
      thread.name = "conveyor-postgres-cancel"
      thread.start()
    }
  }

  init(
    label: String, conninfo: String, scrubber: Scrubber, reconnectTimeout: Duration,
    callTimeout: Duration? = nil, answerWait: Duration = .zero, callsInFlight: CallsInFlight = .process,
    setup: @escaping @Sendable (Connection) throws -> Void
  ) {
    self.callTimeout = callTimeout
    self.answerWait = Self.nanoseconds(min(max(answerWait, .zero), .milliseconds(1)))
    self.callsInFlight = callsInFlight
    self.thread = StoreThread(name: label, spins: 50)
    self.conninfo = conninfo
    self.scrubber = scrubber
    self.reconnectTimeout = reconnectTimeout
    self.setup = setup
    if let callTimeout {
      // Checked ten times per timeout, every 10 ms to 1 s: a call is ended at most one tick after
      // `callTimeout`.
      let tick = max(min(callTimeout / 10, .seconds(1)), .milliseconds(10))
      let timer = DispatchSource.makeTimerSource(queue: .global())
      let milliseconds = Int((tick / .milliseconds(1)).rounded())  // 10 to 1,000
      timer.schedule(deadline: .now() + .milliseconds(milliseconds), repeating: .milliseconds(milliseconds))
      timer.setEventHandler { [weak self] in self?.checkCallTimeout() }
      timer.resume()
      watchdog = timer
    }
  }

  deinit {
    watchdog?.cancel()
    thread.stop()
  }

  /// Opens the connection now (on the store's thread), so that opening the store reports a bad
  /// URL or an unreachable server at once.
  func connect() async throws {
    try await perform(idempotent: true, retrying: false) { _ in }
  }

  /// Closes the connection after every block submitted before; later blocks fail with `closed`.
  func close() async {
    await withUnsafeContinuation { (continuation: UnsafeContinuation<Void, Never>) in
      thread.submit {
        self.closed = true
        self.drop()
        continuation.resume()
      }
    }
  }

  /// Runs `body` on the connection's thread; the calling thread waits for the answer at most
  /// `answerWait`, and only while no other call is in flight or overlapped another lately (see
  /// ``Handoff/waitBriefly(nanoseconds:)``), then suspends.
  ///
  /// - Parameters:
  ///   - idempotent: Whether `body` may run again after the connection broke during a commit.
  ///   - retrying: Whether to reconnect and run again at all (false: fail at once).
  func perform<T: Sendable>(
    idempotent: Bool, retrying: Bool = true, _ body: @escaping @Sendable (Connection) throws -> T
  ) async throws -> T {
    try Task.checkCancellation()
    let operation = Operation()
    let handoff = Handoff<T>(callsInFlight)
    // Read before the block is submitted: once submitted, a quick store thread may have run it
    // and stored this call's own run time before the caller looks (seen in a loaded full run: the
    // call after a 50 ms one waited).
    let lastCallWasShort = lastRun.load(ordering: .relaxed) < answerWait
    return try await withTaskCancellationHandler {
      thread.submit {
        guard operation.start() else {
          handoff.deliver(.failure(CancellationError()))
          return
        }
        let start = DispatchTime.now().uptimeNanoseconds
        let result = Result { try self.run(idempotent: idempotent, retrying: retrying, operation, body) }
        self.lastRun.store(DispatchTime.now().uptimeNanoseconds &- start, ordering: .relaxed)
        let cancelled = operation.finish()
        // A cancel request still on its way names this connection's backend: it would cancel
        // the next block's statement. The connection is dropped, so the next block runs on a
        // new backend and the late request finds none. (`cancel()` marks the request sent under
        // the operation's lock, which `finish()` takes, so none can start after this look.)
        if cancelled, self.cancelHandle.withLock({ $0?.isSending ?? false }) { self.drop() }
        if cancelled, case .failure(let error as PostgresError) = result, error.sqlState == "57014" {
          handoff.deliver(.failure(CancellationError()))
        } else {
          handoff.deliver(result)
        }
      }
      // A connection whose last call took longer than the wait (a batch, a slow server) is not
      // waited for: the caller would only spend the wait.
      if answerWait > 0, lastCallWasShort {
        // Waits spend the pool's thread: after a millisecond of them, the caller lets the pool's
        // other tasks run (it yields, or it parks because its wait was cut to what was left).
        let used = min(callsInFlight.spent.load(ordering: .relaxed), CallsInFlight.waitBudget)
        let limit = min(answerWait, CallsInFlight.waitBudget - used)
        longestWait.max(limit, ordering: .relaxed)
        let (answer, spent, waited) = handoff.waitBriefly(nanoseconds: limit)
        if let answer {
          if waited {
            answeredWhileWaiting.add(1, ordering: .relaxed)
          } else {
            answeredAtOnce.add(1, ordering: .relaxed)
          }
          if callsInFlight.spent.wrappingAdd(spent, ordering: .relaxed).newValue >= CallsInFlight.waitBudget {
            callsInFlight.spent.store(0, ordering: .relaxed)
            budgetYields.add(1, ordering: .relaxed)
            await Task.yield()
          }
          return try answer.get()
        }
        // The caller parks below: the budget starts again (also when it was used up to the
        // last nanosecond and this caller could not wait at all).
        if spent > 0 || used == CallsInFlight.waitBudget { callsInFlight.spent.store(0, ordering: .relaxed) }
      }
      return try await withUnsafeThrowingContinuation { handoff.park($0) }
    } onCancel: {
      operation.cancel()
      sendCancel(operation, since: .now)
    }
  }

  /// Runs `body` on the connection's thread as ``perform(idempotent:retrying:_:)`` does (reconnecting
  /// and running it again after a connection loss), with no caller waiting for it: `completion`
  /// gets the outcome, on the thread. Nobody can cancel it: for work several callers share (a
  /// group of adds), which none of them may cut short.
  func submit<T: Sendable>(
    idempotent: Bool, _ body: @escaping @Sendable (Connection) throws -> T,
    completion: @escaping @Sendable (Result<T, any Error>) -> Void
  ) {
    let operation = Operation()
    thread.submit {
      _ = operation.start()
      let start = DispatchTime.now().uptimeNanoseconds
      let result = Result { try self.run(idempotent: idempotent, retrying: true, operation, body) }
      self.lastRun.store(DispatchTime.now().uptimeNanoseconds &- start, ordering: .relaxed)
      _ = operation.finish()
      completion(result)
    }
  }

  /// Sends `PQcancel` while the operation's block runs, again every 50 ms: a cancel request that
  /// reaches the server between two statements is ignored, so one request could be lost.
  /// A server that does not act on the request (it stopped answering) cannot end the call that
  /// way: after two seconds the socket is shut down, which ends it.
  private func sendCancel(_ operation: Operation, since start: ContinuousClock.Instant) {
    let abort = ContinuousClock.now - start > .seconds(2)
    let running = operation.whileRunning {
      cancelHandle.withLock { handle in
        if abort { handle?.abort() } else { handle?.cancel() }
      }
    }
    guard running else { return }
    DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(50)) {
      self.sendCancel(operation, since: start)
    }
  }

  /// Starts watching the block's current run for `callTimeout` (see ``checkCallTimeout()``);
  /// returns the run's number (nil without a `callTimeout`).
  private func watch(_ operation: Operation) -> Int? {
    guard let callTimeout else { return nil }
    let attempt = operation.beginAttempt()
    watched.withLock { $0 = Watched(operation: operation, attempt: attempt, deadline: .now + callTimeout) }
    return attempt
  }

  /// Ends a call still running after `callTimeout` (a server that stopped answering, a network
  /// cut that sent no reset): its socket is shut down, so the call sees a broken connection and,
  /// like any other, runs again on a new one within `reconnectTimeout`. Called by `watchdog`, one
  /// timer per connection (a timer per call would keep one alive per call made in the last
  /// `callTimeout`: hundreds of thousands at full speed).
  private func checkCallTimeout() {
    guard let current = watched.withLock({ $0 }), ContinuousClock.now >= current.deadline else { return }
    current.operation.timeOut(attempt: current.attempt) { cancelHandle.withLock { $0?.abort() } }
  }

  /// Runs `body`, reconnecting and running it again after a connection loss. On the thread.
  private func run<T>(
    idempotent: Bool, retrying: Bool, _ operation: Operation, _ body: (Connection) throws -> T
  ) throws -> T {
    let deadline = ContinuousClock.now + reconnectTimeout
    var pause = Duration.milliseconds(10)
    var replanned = false
    var deadlocks = 0
    var firstPass = true
    // The last reconnect that failed before the deadline (a refused login, a wrong password):
    // what the reader must fix when a later reconnect is only cut short by the deadline.
    var refusal: PostgresError?
    while true {
      defer { firstPass = false }
      if closed {
        throw PostgresError(
          code: .closed, message: "this store was closed; open the database again to use it")
      }
      if operation.isCancelled { throw CancellationError() }
      // This pass's run, once `callTimeout` watches it.
      var attempt: Int?
      do {
        defer { watched.withLock { $0 = nil } }
        // The call's first pass may connect for as long as a connect may take (the URL's
        // `connect_timeout`, 30 s without one), even when `reconnectTimeout` is shorter (zero
        // included): the reconnect deadline bounds the attempts after a failure.
        let connection = try connected(until: firstPass ? nil : deadline, for: operation, watching: &attempt)
        return try body(connection)
      } catch let error as PostgresError where error.isStalePreparedStatement && !replanned {
        // Nothing was committed (the statement failed, and its transaction was rolled back), so
        // running the block again is safe whether or not it is idempotent; the connection has
        // forgotten its prepared statements. Once: a second failure is the caller's.
        replanned = true
      } catch let error as PostgresError where error.sqlState == "40P01" && deadlocks < 3 {
        // The server broke a deadlock by rolling back this call's transaction, nothing of which
        // was committed: the block runs again (twice at most, after a short pause), as the other
        // transaction has gone on. A block of several transactions (cancel, remove) starts over
        // with the work of those that committed already done: a job removed by an earlier one is
        // not counted again. Ordinary traffic takes its locks in one order (see
        // `SQL.version9`); a deadlock comes from an add replacing a job an operator deletes.
        deadlocks += 1
        Thread.sleep(forTimeInterval: Double(deadlocks) * 0.01)
      } catch let error as PostgresError where error.isConnectionLoss {
        let ambiguous = connection?.lostDuringCommit ?? false
        drop()
        if ambiguous && !idempotent {
          throw PostgresError(
            code: .commitUnknown,
            message: "the connection broke while the transaction was committing (\(error.message)); "
              + "whether it committed is unknown", sqlState: error.sqlState, sql: error.sql)
        }
        // A cancelled call whose socket was shut down (its server did not act on the cancel
        // request) ends as cancelled, not as a lost connection.
        if operation.isCancelled { throw CancellationError() }
        // This pass failed while connecting (nothing was watched yet): cut short by the
        // deadline, or refused.
        let cutShort = attempt == nil && !firstPass && ContinuousClock.now >= deadline
        if attempt == nil && !cutShort { refusal = error }
        guard retrying, ContinuousClock.now + pause < deadline else {
          if cutShort, let refusal { throw refusal }
          // Only when this last pass was the one ended: an earlier pass's timeout followed by a
          // refused login is the login's error.
          guard operation.timedOut(attempt), let callTimeout else { throw error }
          // What libpq says of the closed socket ("server closed the connection unexpectedly")
          // would send the reader to a server that may only be busy.
          throw PostgresError(
            code: .timedOut,
            message: "no answer within callTimeout (\(callTimeout)), so the store closed the connection"
              + (reconnectTimeout > .zero
                ? " and tried again until reconnectTimeout (\(reconnectTimeout))" : ""),
            sqlState: error.sqlState, sql: error.sql)
        }
        // Sleep in slices so a cancellation ends the wait.
        let wake = ContinuousClock.now + pause
        while ContinuousClock.now < wake && !operation.isCancelled {
          Thread.sleep(forTimeInterval: 0.01)
        }
        pause = min(pause * 2, .milliseconds(500))
      }
    }
  }

  /// The open connection, opening a new one when there is none or it broke, with `operation`'s
  /// run watched by `callTimeout` from then on (its number in `attempt`). The opening gives up at
  /// `deadline` (the call's reconnect deadline; nil: the connect timeout alone) and once the
  /// operation is cancelled. On the thread.
  private func connected(
    until deadline: ContinuousClock.Instant?, for operation: Operation, watching attempt: inout Int?
  ) throws -> Connection {
    let isCancelled = { @Sendable in operation.isCancelled }
    if let connection, connection.isHealthy {
      connection.isCancelled = isCancelled
      attempt = watch(operation)
      return connection
    }
    drop()
    let fresh = try Connection(
      conninfo: conninfo, scrubber: scrubber, deadline: deadline, isCancelled: isCancelled)
    fresh.isCancelled = isCancelled
    connection = fresh
    let handle = fresh.makeCancelHandle().map { CancelHandle($0, socket: fresh.socketDescriptor) }
    cancelHandle.withLock { $0 = handle }
    // The session's setup is a statement like the block's: `callTimeout` watches it and a cancel
    // reaches it (a server that stopped answering just after the connection was made held the
    // store's thread for good). A connection whose setup failed is not used.
    attempt = watch(operation)
    do {
      try setup(fresh)
    } catch {
      drop()
      throw error
    }
    return fresh
  }

  /// Closes the current connection, if any. On the thread.
  private func drop() {
    cancelHandle.withLock { $0 = nil }
    connection = nil
  }

  /// How long the last block took to run, in nanoseconds.
  private let lastRun = Atomic<UInt64>(0)
  /// The longest wait a caller was allowed, in nanoseconds: for tests.
  let longestWait = Atomic<UInt64>(0)
  /// Yields of callers whose waits used up ``CallsInFlight/waitBudget``: for tests.
  let budgetYields = Atomic<Int>(0)

  /// Whole nanoseconds of a duration that is not negative, at most a day's.
  static func nanoseconds(_ duration: Duration) -> UInt64 {
    guard duration > .zero else { return 0 }
    let (seconds, attoseconds) = duration.components
    return UInt64(min(seconds, 86_400)) * 1_000_000_000 + UInt64(attoseconds / 1_000_000_000)
  }

  /// Calls submitted and not yet answered: of the whole process (``process``), on every
  /// connection, unless a test gives a connection a count of its own.
  ///
  /// Calls that overlap mark the process busy for a while (``busyFor``): concurrent callers
  /// (several workers) come and go between each other's calls, and a caller that waited in such
  /// a gap would take a processor their connections' servers need.
  final class CallsInFlight: Sendable {
    let count = Atomic<Int>(0)
    /// Until when (`DispatchTime` nanoseconds) no caller waits: the last overlap plus ``busyFor``.
    let busyUntil = Atomic<UInt64>(0)
    /// How long an overlap of calls keeps callers from waiting, in nanoseconds.
    let busyFor: UInt64
    /// Nanoseconds callers waited for answers they took since one of them that waited parked or
    /// yielded. It is the process's, not a thread's: callers that take turns without overlapping
    /// share it, so it bounds the waiting between two of those hand-backs across the process.
    let spent = Atomic<UInt64>(0)
    /// How long waits may hold a thread of the pool before its caller lets others run: 1 ms.
    static let waitBudget: UInt64 = 1_000_000
    /// The process's count.
    static let process = CallsInFlight()

    /// A count whose overlaps keep callers from waiting for `busyFor` (default 10 ms).
    init(busyFor: Duration = .milliseconds(10)) {
      self.busyFor = SerializedConnection.nanoseconds(busyFor)
    }

    /// Counts a new call; marks the process busy when another is in flight.
    func begin() {
      if count.wrappingAdd(1, ordering: .relaxed).newValue > 1 { markBusy() }
    }

    /// Counts an answered call; the end of an overlap marks the process busy again, so the window
    /// runs from the end of the overlap, however long it lasted.
    func end() {
      if count.wrappingSubtract(1, ordering: .releasing).oldValue > 1 { markBusy() }
    }

    func markBusy() {
      busyUntil.store(DispatchTime.now().uptimeNanoseconds &+ busyFor, ordering: .relaxed)
    }

    /// Whether a caller may wait now: its call is the only one in flight, and none overlapped
    /// another lately.
    var isQuiet: Bool {
      count.load(ordering: .acquiring) <= 1
        && DispatchTime.now().uptimeNanoseconds >= busyUntil.load(ordering: .relaxed)
    }
  }

  /// The calls in flight this connection's callers look at before they wait.
  private let callsInFlight: CallsInFlight
  /// Calls whose answer the caller took while it waited (see ``Handoff/waitBriefly(nanoseconds:)``):
  /// for tests.
  let answeredWhileWaiting = Atomic<Int>(0)
  /// Calls whose answer was there when the caller first looked, taken without waiting: for tests.
  let answeredAtOnce = Atomic<Int>(0)

  /// A call's answer, passed from the store's thread to its caller: taken by the caller while it
  /// waits briefly for it, or given to the caller's continuation once it suspended.
  final class Handoff<T: Sendable>: Sendable {
    private enum State {
      case pending
      case answered(Result<T, any Error>)
      case parked(UnsafeContinuation<T, any Error>)
      case done
    }
    private let state = Mutex(State.pending)
    /// Set after the answer is stored: what a waiting caller reads without taking the lock.
    private let answered = Atomic<Bool>(false)
    /// Whether the call is still counted in ``callsInFlight``.
    private let counted = Atomic<Bool>(true)

    private let callsInFlight: CallsInFlight

    init(_ callsInFlight: CallsInFlight) {
      self.callsInFlight = callsInFlight
      callsInFlight.begin()
    }

    /// Stores the answer, or resumes the parked caller with it. On the store's thread.
    ///
    /// The call leaves the count of calls in flight only once its answer can be seen: a caller
    /// reads a count of one as "my call alone", so a call that left the count before its answer
    /// was visible let its caller wait beside another call (the first review's race test).
    func deliver(_ result: Result<T, any Error>) {
      let parked = state.withLock { state -> UnsafeContinuation<T, any Error>? in
        switch state {
        case .parked(let continuation):
          state = .done
          return continuation
        default:
          state = .answered(result)
          return nil
        }
      }
      if let parked {
        uncount()
        parked.resume(with: result)
      } else {
        answered.store(true, ordering: .releasing)
        uncount()
      }
    }

    /// Takes the call out of the count, once (the store's thread or the caller, whichever is
    /// first once the answer is visible).
    private func uncount() {
      if counted.exchange(false, ordering: .acquiringAndReleasing) { callsInFlight.end() }
    }

    /// Waits up to `limit` nanoseconds on the calling thread, yielding the processor, for the
    /// answer, while no other call of the process is in flight and none overlapped another lately
    /// (``CallsInFlight/isQuiet``). Returns the answer, or nil when the wait ended without it, and
    /// the nanoseconds it waited.
    ///
    /// A call answered within the wait returns without suspending: no wake-up of a parked
    /// thread of the cooperative pool, and the caller's next call finds the store's thread still
    /// polling for work. Each costs tens of microseconds on a virtual machine. The wait ends as
    /// soon as a second call is in flight, so that concurrent calls keep the pool's threads.
    ///
    /// An answer that is already there is taken at once, whatever the other calls (`waited` is
    /// false): a caller that was descheduled after it submitted its call finds it so, and taking
    /// it costs nothing, while parking would hop through the executor to resume at once.
    func waitBriefly(nanoseconds limit: UInt64) -> (Result<T, any Error>?, spent: UInt64, waited: Bool) {
      if answered.load(ordering: .acquiring) { return (take(), 0, false) }
      guard limit > 0, callsInFlight.isQuiet else { return (nil, 0, false) }
      let start = DispatchTime.now().uptimeNanoseconds
      var now = start
      var looked = false
      while !answered.load(ordering: .acquiring) {
        if now &- start >= limit || !callsInFlight.isQuiet { return (nil, now &- start, false) }
        sched_yield()
        looked = true
        now = DispatchTime.now().uptimeNanoseconds
      }
      // An answer that came between the first look and the loop's counts as there at once.
      return (take(), now &- start, looked)
    }

    /// The stored answer, once: nil when there is none or it was taken. The call leaves the
    /// count here if the store's thread has not taken it out yet, so that the caller's next call
    /// does not find it still counted and take the two for an overlap.
    private func take() -> Result<T, any Error>? {
      let answer = state.withLock { state -> Result<T, any Error>? in
        guard case .answered(let result) = state else { return nil }
        state = .done
        return result
      }
      uncount()
      return answer
    }

    /// Gives the answer to `continuation`, now or when it comes.
    func park(_ continuation: UnsafeContinuation<T, any Error>) {
      let result = state.withLock { state -> Result<T, any Error>? in
        if case .answered(let result) = state {
          state = .done
          return result
        }
        state = .parked(continuation)
        return nil
      }
      if let result {
        uncount()
        continuation.resume(with: result)
      }
    }
  }

  /// The state of one queued block, shared between the block and the cancellation handler.
  private final class Operation: Sendable {
    private struct State {
      var started = false
      var finished = false
      var cancelled = false
      var attempt = 0
      /// The run that `callTimeout` ended, if any.
      var timedOutAttempt: Int?
    }
    private let state = Mutex(State())

    func start() -> Bool {
      state.withLock { state in
        state.started = true
        return !state.cancelled
      }
    }

    func finish() -> Bool {
      state.withLock { state in
        state.finished = true
        return state.cancelled
      }
    }

    var isCancelled: Bool { state.withLock { $0.cancelled } }

    /// Marks the operation cancelled.
    func cancel() {
      state.withLock { $0.cancelled = true }
    }

    /// Calls `interrupt` if the block is running, under the lock, so the block cannot finish
    /// meanwhile; returns whether it was running. A cancel request sent here reaches the server
    /// later, on a thread of its own: a block that finishes before it does has its connection
    /// dropped (see `perform`), so the request cannot cancel the next block's statement.
    func whileRunning(_ interrupt: () -> Void) -> Bool {
      state.withLock { state in
        guard state.started && !state.finished else { return false }
        interrupt()
        return true
      }
    }

    /// Counts a new run of the block (after a reconnect); returns its number.
    func beginAttempt() -> Int {
      state.withLock { state in
        state.attempt += 1
        return state.attempt
      }
    }

    /// Calls `abort` (under the lock) if run number `attempt` is still running, and marks it
    /// ended by `callTimeout`.
    func timeOut(attempt: Int, _ abort: () -> Void) {
      state.withLock { state in
        guard state.started && !state.finished && state.attempt == attempt else { return }
        state.timedOutAttempt = attempt
        abort()
      }
    }

    /// Whether `callTimeout` ended run number `attempt`.
    func timedOut(_ attempt: Int?) -> Bool {
      attempt != nil && state.withLock { $0.timedOutAttempt == attempt }
    }
  }
}
