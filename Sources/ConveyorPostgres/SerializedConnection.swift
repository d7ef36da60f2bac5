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

    func cancel() {
      var buffer = [CChar](repeating: 0, count: 256)
      _ = PQcancel(pointer, &buffer, 256)
    }
  }

  init(
    label: String, conninfo: String, scrubber: Scrubber, reconnectTimeout: Duration,
    callTimeout: Duration? = nil,
    setup: @escaping @Sendable (Connection) throws -> Void
  ) {
    self.callTimeout = callTimeout
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

  /// Runs `body` on the connection's thread without blocking the calling thread.
  ///
  /// - Parameters:
  ///   - idempotent: Whether `body` may run again after the connection broke during a commit.
  ///   - retrying: Whether to reconnect and run again at all (false: fail at once).
  func perform<T: Sendable>(
    idempotent: Bool, retrying: Bool = true, _ body: @escaping @Sendable (Connection) throws -> T
  ) async throws -> T {
    try Task.checkCancellation()
    let operation = Operation()
    return try await withTaskCancellationHandler {
      try await withUnsafeThrowingContinuation { (continuation: UnsafeContinuation<T, any Error>) in
        thread.submit {
          guard operation.start() else {
            continuation.resume(throwing: CancellationError())
            return
          }
          let result = Result { try self.run(idempotent: idempotent, retrying: retrying, operation, body) }
          let cancelled = operation.finish()
          if cancelled, case .failure(let error as PostgresError) = result, error.sqlState == "57014" {
            continuation.resume(throwing: CancellationError())
          } else {
            continuation.resume(with: result)
          }
        }
      }
    } onCancel: {
      operation.cancel()
      sendCancel(operation, since: .now)
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

  /// Starts watching the block's current run for `callTimeout` (see ``checkCallTimeout()``).
  private func watch(_ operation: Operation) {
    guard let callTimeout else { return }
    let attempt = operation.beginAttempt()
    watched.withLock { $0 = Watched(operation: operation, attempt: attempt, deadline: .now + callTimeout) }
  }

  /// Ends a call still running after `callTimeout` (a server that stopped answering, a network
  /// cut that sent no reset): its socket is shut down, so the call sees a broken connection and,
  /// like any other, runs again on a new one within `reconnectTimeout`. Called by `watchdog`, one
  /// timer per connection (a timer per call would keep one alive per call made in the last
  /// `callTimeout`: hundreds of thousands at full speed).
  private func checkCallTimeout() {
    guard let current = watched.withLock({ $0 }), ContinuousClock.now >= current.deadline else { return }
    _ = current.operation.whileRunning(attempt: current.attempt) { cancelHandle.withLock { $0?.abort() } }
  }

  /// Runs `body`, reconnecting and running it again after a connection loss. On the thread.
  private func run<T>(
    idempotent: Bool, retrying: Bool, _ operation: Operation, _ body: (Connection) throws -> T
  ) throws -> T {
    let deadline = ContinuousClock.now + reconnectTimeout
    var pause = Duration.milliseconds(10)
    var replanned = false
    while true {
      if closed {
        throw PostgresError(
          code: .closed, message: "this store was closed; open the database again to use it")
      }
      if operation.isCancelled { throw CancellationError() }
      do {
        let connection = try connected()
        connection.isCancelled = { operation.isCancelled }
        watch(operation)
        defer { watched.withLock { $0 = nil } }
        return try body(connection)
      } catch let error as PostgresError where error.isStalePreparedStatement && !replanned {
        // Nothing was committed (the statement failed, and its transaction was rolled back), so
        // running the block again is safe whether or not it is idempotent; the connection has
        // forgotten its prepared statements. Once: a second failure is the caller's.
        replanned = true
      } catch let error as PostgresError where error.isConnectionLoss {
        let ambiguous = connection?.lostDuringCommit ?? false
        drop()
        if ambiguous && !idempotent {
          throw PostgresError(
            code: .commitUnknown,
            message: "the connection broke while the transaction was committing (\(error.message)); "
              + "whether it committed is unknown", sqlState: error.sqlState, sql: error.sql)
        }
        guard retrying, ContinuousClock.now + pause < deadline else { throw error }
        // Sleep in slices so a cancellation ends the wait.
        let wake = ContinuousClock.now + pause
        while ContinuousClock.now < wake && !operation.isCancelled {
          Thread.sleep(forTimeInterval: 0.01)
        }
        pause = min(pause * 2, .milliseconds(500))
      }
    }
  }

  /// The open connection, opening a new one when there is none or it broke. On the thread.
  private func connected() throws -> Connection {
    if let connection, connection.isHealthy { return connection }
    drop()
    let fresh = try Connection(conninfo: conninfo, scrubber: scrubber)
    try setup(fresh)
    connection = fresh
    let handle = fresh.makeCancelHandle().map { CancelHandle($0, socket: fresh.socketDescriptor) }
    cancelHandle.withLock { $0 = handle }
    return fresh
  }

  /// Closes the current connection, if any. On the thread.
  private func drop() {
    cancelHandle.withLock { $0 = nil }
    connection = nil
  }

  /// The state of one queued block, shared between the block and the cancellation handler.
  private final class Operation: Sendable {
    private struct State {
      var started = false
      var finished = false
      var cancelled = false
      var attempt = 0
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

    /// Calls `interrupt` if the block is running, under the lock, so the block cannot finish and
    /// let the next block's statement be cancelled instead; returns whether it was running.
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

    /// Like ``whileRunning(_:)``, only while run number `attempt` is the current one.
    func whileRunning(attempt: Int, _ interrupt: () -> Void) -> Bool {
      state.withLock { state in
        guard state.started && !state.finished && state.attempt == attempt else { return false }
        interrupt()
        return true
      }
    }
  }
}
