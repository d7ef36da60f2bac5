import CLibPQ
import Conveyor
import Foundation
import Synchronization

/// Receives the store's notifications on a connection of its own and wakes the tasks waiting in
/// ``wait(queue:timeout:)``; hands the cancels' announcements (on a channel of their own) to the
/// subscribers of ``cancellations(queue:)``.
///
/// The connection lives on a thread of its own, started by the first wait: the thread `LISTEN`s,
/// then blocks in `poll(2)` on the socket (a quarter second at most, to notice ``stop()``), and
/// hands each notification's queue name to the waiters. When the connection breaks it is opened
/// again with backoff; meanwhile waits simply time out, and the queue's polling finds the work.
/// Every `LISTEN`, the first included, wakes every waiter (and makes every watched queue's next
/// wait return at once), since notifications sent before it are lost; so does the first wait
/// for a queue this listener never watched, which may follow a notification it did not keep.
/// Every `LISTEN` also gives every subscriber to cancellations a notice naming no job (check
/// every claim), for the same reason.
///
/// A connection that goes silent is given up: after ``heartbeatAfter`` without a byte from the
/// server the thread sends `SELECT 1`, and a statement (that one, or `LISTEN`) whose answer takes
/// longer than `answerTimeout` ends the connection, as for a server that stopped answering or
/// died without its reset reaching us. Nothing waits on the server without a deadline, so
/// ``stop()`` always ends the thread.
final class Listener: Sendable {
  private struct Waiter {
    var queue: ExactText
    /// The waiting task (its hash), which a notification that wakes it marks as served.
    var task: Int?
    var continuation: CheckedContinuation<Bool, Never>
    /// Ends the wait at its timeout; cancelled (and so freed) when the wait ends otherwise.
    var timer: Task<Void, Never>?

    func resume(returning notified: Bool) {
      timer?.cancel()
      continuation.resume(returning: notified)
    }
  }

  private struct State {
    var started = false
    var stopped = false
    var waiters: [UInt64: Waiter] = [:]
    var nextToken: UInt64 = 0
    /// Queues notified while fewer watchers waited than ``watchers`` counts: the next waits of the
    /// watchers that were between two waits return at once.
    var pending: [ExactText: Owed] = [:]
    /// The most waits seen at once for a queue (each watcher of a queue, a `JobQueue`, has at most
    /// one wait at a time): how many a notification should reach. Never lowered: the returns owed
    /// to a watcher that stopped are left to tasks the notification did not wake (a watcher that
    /// comes back as a new task takes one, and claims once more than it needed), where a watcher
    /// missed would sleep until its poll.
    var watchers: [ExactText: Int] = [:]
    /// Queues a wait was made for, so `pending` only holds names someone watches.
    var watched: Set<ExactText> = []
    /// The subscribers to cancellations, by token.
    var subscribers: [UInt64: Subscriber] = [:]
    /// Whether the thread's `LISTEN` holds now: a subscriber that joins then is told at once to
    /// check its claims (the `LISTEN`'s own notice went out before it joined).
    var listening = false
  }

  /// A subscriber to one queue's cancellations (a running `JobQueue`'s lease keeper).
  private struct Subscriber {
    var queue: ExactText
    var continuation: AsyncStream<CancellationNotice>.Continuation
  }

  /// The notices a subscriber may have waiting before the oldest are dropped: a subscriber reads
  /// them as they come, and one dropped is made up by the queue's periodic check of its claims.
  static let noticeBuffer = 64

  /// Early returns a queue's notifications left for watchers that did not wait then.
  private struct Owed {
    /// How many of the queue's next waits return at once.
    var count = 0
    /// The tasks the latest of those notifications woke: their next waits wait (a watcher, one
    /// task, waits again at once after each wake-up, and would otherwise take the return owed to
    /// another).
    var served: Set<Int> = []
  }

  private let state = Mutex(State())
  private let armed = Atomic<Int>(0)

  /// Timeouts of waits scheduled and not yet freed (for tests).
  var armedTimeouts: Int { armed.load(ordering: .relaxed) }

  /// How many of `queue`'s next waits return at once (for tests).
  func owedReturns(_ queue: String) -> Int { state.withLock { $0.pending[ExactText(queue)]?.count ?? 0 } }
  private let conninfo: String
  private let scrubber: Scrubber
  private let channel: String
  private let cancelChannel: String
  private let answerTimeout: Duration

  /// How long the connection may stay silent before the thread asks the server for a sign of life.
  static let heartbeatAfter = Duration.seconds(10)

  /// - Parameters:
  ///   - answerTimeout: The longest the thread waits for the answer to `LISTEN` or a heartbeat
  ///     before it gives the connection up (the store's `callTimeout`).
  ///   - cancelChannel: The channel cancels announce the running jobs they cancelled on
  ///     (``CancelPayload``).
  init(conninfo: String, scrubber: Scrubber, channel: String, cancelChannel: String, answerTimeout: Duration)
  {
    self.conninfo = conninfo
    self.scrubber = scrubber
    self.channel = channel
    self.cancelChannel = cancelChannel
    self.answerTimeout = answerTimeout
  }

  /// Ends the thread within a quarter second, wakes every waiter and ends every subscription to
  /// cancellations. Later waits last their timeout and return false, as a store that hears of
  /// nothing does; later subscriptions end at once.
  func stop() {
    let (waiters, subscribers) = state.withLock { state -> ([Waiter], [Subscriber]) in
      state.stopped = true
      defer {
        state.waiters = [:]
        state.subscribers = [:]
      }
      return (Array(state.waiters.values), Array(state.subscribers.values))
    }
    for waiter in waiters { waiter.resume(returning: false) }
    for subscriber in subscribers { subscriber.continuation.finish() }
  }

  /// The announcements of cancelled running jobs of `queue` (queue names told apart byte for
  /// byte), from the first `LISTEN` on, until the iteration ends or the listener stops. Starts
  /// the thread if no wait did.
  func cancellations(queue name: String) -> AsyncStream<CancellationNotice> {
    let (stream, continuation) = AsyncStream.makeStream(
      of: CancellationNotice.self, bufferingPolicy: .bufferingNewest(Self.noticeBuffer))
    let token = state.withLock { state -> UInt64 in
      state.nextToken += 1
      return state.nextToken
    }
    continuation.onTermination = { [weak self] _ in
      _ = self?.state.withLock { $0.subscribers.removeValue(forKey: token) }
    }
    let (subscribed, listening) = state.withLock { state -> (Bool, Bool) in
      guard !state.stopped else { return (false, false) }
      state.subscribers[token] = Subscriber(queue: ExactText(name), continuation: continuation)
      return (true, state.listening)
    }
    guard subscribed else {
      continuation.finish()
      return stream
    }
    // Anything announced before it joined is unknown to it: it checks its claims once.
    if listening { continuation.yield(CancellationNotice(jobs: nil)) }
    // Started once the subscriber is in place, so the thread's first `LISTEN` tells it.
    startIfNeeded()
    return stream
  }

  /// Number of subscribers to cancellations (for tests).
  var subscriberCount: Int { state.withLock { $0.subscribers.count } }

  /// Hands a cancel's announcement to the subscribers of its queue (of every queue when it names
  /// none), or a notice naming no job to every subscriber when `payload` is nil (after a
  /// `LISTEN`).
  private func announce(_ payload: String?) {
    let parsed = payload.map(CancelPayload.parse) ?? (queue: nil, notice: CancellationNotice(jobs: nil))
    let queue = parsed.queue.map(ExactText.init)
    let reached = state.withLock { state in
      state.subscribers.values.filter { queue == nil || $0.queue == queue }.map(\.continuation)
    }
    for continuation in reached { continuation.yield(parsed.notice) }
  }

  /// Waits for a notification about `queue`, `timeout`, or the task's cancellation.
  ///
  /// Queue names are told apart byte for byte, as the database does (see ``ExactText``): a
  /// notification about a precomposed "é" neither wakes nor takes a return owed to the waiters of
  /// the decomposed one.
  func wait(queue name: String, timeout: Duration) async -> Bool {
    let queue = ExactText(name)
    if isStopped {
      // A queue's watcher waits again at once: returning at once would make it spin.
      try? await DispatchSleep.sleep(for: max(timeout, .milliseconds(1)))
      return false
    }
    let token = state.withLock { state -> UInt64 in
      state.nextToken += 1
      return state.nextToken
    }
    let task = withUnsafeCurrentTask { $0?.hashValue }
    return await withTaskCancellationHandler {
      await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
        let immediate = state.withLock { state -> Bool? in
          if state.stopped || Task.isCancelled { return false }
          // A queue watched for the first time: a notification for it may have come (and been
          // dropped) between its first look at the store and this wait; it looks again.
          if state.watched.insert(queue).inserted && state.started { return true }
          if var owed = state.pending[queue], !(task.map { owed.served.contains($0) } ?? false) {
            owed.count -= 1
            // Told now: its next wait leaves the rest to the others.
            if let task { owed.served.insert(task) }
            state.pending[queue] = owed.count > 0 ? owed : nil
            return true
          }
          state.waiters[token] = Waiter(queue: queue, task: task, continuation: continuation)
          let waiting = state.waiters.values.reduce(0) { $0 + ($1.queue == queue ? 1 : 0) }
          state.watchers[queue] = max(state.watchers[queue] ?? 1, waiting)
          return nil
        }
        if let immediate {
          continuation.resume(returning: immediate)
          return
        }
        // Started once this waiter is in place, so the thread's first `LISTEN` wakes it.
        startIfNeeded()
        // A timer of the wait's own, freed as soon as the wait ends: the watcher of a queue waits
        // again after every notification, and a timeout left scheduled until it passed (an
        // hour's poll interval) would keep one timer per notification.
        armed.add(1, ordering: .relaxed)
        let timer = Task { [self] in
          do {
            try await DispatchSleep.sleep(for: max(timeout, .milliseconds(1)))
          } catch {
            armed.subtract(1, ordering: .relaxed)
            return
          }
          // Freed before the wait returns, so a caller that reads the count after sees it.
          armed.subtract(1, ordering: .relaxed)
          finish(token, notified: false)
        }
        let waiting = state.withLock { state -> Bool in
          state.waiters[token]?.timer = timer
          return state.waiters[token] != nil
        }
        if !waiting { timer.cancel() }
      }
    } onCancel: {
      finish(token, notified: false)
    }
  }

  private func finish(_ token: UInt64, notified: Bool) {
    let waiter = state.withLock { $0.waiters.removeValue(forKey: token) }
    waiter?.resume(returning: notified)
  }

  /// Wakes the waiters of `queue` (of every queue when nil). A watched queue with fewer waits
  /// than it has watchers (none waits, or one of two `JobQueue`s of the queue is between two
  /// waits) is kept pending for the missing ones, so their next waits return at once.
  private func deliver(_ name: String?) {
    let queue = name.map(ExactText.init)
    let woken = state.withLock { state -> [Waiter] in
      let matching = state.waiters.filter { queue == nil || $0.value.queue == queue }
      for token in matching.keys { state.waiters[token] = nil }
      let notified = queue.map { state.watched.contains($0) ? [$0] : [] } ?? Array(state.watched)
      for name in notified {
        let watchers = state.watchers[name] ?? 1
        let reached = matching.values.filter { $0.queue == name }
        guard reached.count < watchers else { continue }
        var owed = state.pending[name] ?? Owed()
        owed.count = min(owed.count + watchers - reached.count, watchers)
        // The tasks this notification woke, not earlier ones: a watcher between two waits now
        // is owed a return even if an earlier notification woke it.
        owed.served = Set(reached.compactMap(\.task))
        state.pending[name] = owed
      }
      return Array(matching.values)
    }
    for waiter in woken { waiter.resume(returning: true) }
  }

  private func startIfNeeded() {
    let start = state.withLock { state -> Bool in
      guard !state.started, !state.stopped else { return false }
      state.started = true
      return true
    }
    guard start else { return }
    let thread = Thread { [self] in run() }
    thread.name = "Conveyor.PostgresJobStore.listener"
    thread.start()
  }

  private var isStopped: Bool { state.withLock { $0.stopped } }

  /// The thread: listen, wait for the socket, deliver; reconnect with backoff when it breaks.
  private func run() {
    var pause = 0.05
    while !isStopped {
      // The error is not needed: the store's own connection reports why the server cannot be
      // reached, and polling goes on meanwhile; this one retries with backoff.
      guard
        let connection = try? Connection(conninfo: conninfo, scrubber: scrubber, isCancelled: { isStopped }),
        answers(listenScript, on: connection)
      else {
        rest(&pause)
        continue
      }
      let listening = ContinuousClock.now
      state.withLock { $0.listening = true }
      // Notifications sent before this `LISTEN` (while connecting for the first time, or while
      // down) are lost: every waiter looks again, and every subscriber checks its claims.
      deliver(nil)
      announce(nil)
      listen(on: connection)
      state.withLock { $0.listening = false }
      // A connection that lasted only moments (a server that ends sessions at once, a proxy
      // that drops them) is not opened again at full speed: each time wakes every waiter.
      if ContinuousClock.now - listening < Self.heartbeatAfter {
        rest(&pause)
      } else {
        pause = 0.05
      }
    }
  }

  /// Turns off the server's `idle_session_timeout` for this session (where the server has the
  /// setting, PostgreSQL 14 on), then listens, in one round trip. The timeout counts the time
  /// since the client's last statement: notifications coming in keep the heartbeat from being
  /// sent, and a server that ended the session every few seconds would have every reconnect's
  /// `LISTEN` wake every waiter. The heartbeat already gives up a connection gone silent.
  private var listenScript: String {
    """
    SELECT set_config('idle_session_timeout', '0', false) FROM pg_settings WHERE name = 'idle_session_timeout';
    LISTEN "\(channel)";
    LISTEN "\(cancelChannel)"
    """
  }

  /// Waits for notifications and delivers them until the connection breaks, goes silent, or the
  /// listener stops.
  private func listen(on connection: Connection) {
    let handle = connection.handle
    var lastHeard = ContinuousClock.now
    while !isStopped {
      let socket = PQsocket(handle)
      guard socket >= 0 else { return }
      let ready = conveyor_pq_wait_readable(socket, 250)
      if ready < 0 && errno != EINTR { return }
      if ready > 0 {
        guard PQconsumeInput(handle) == 1 else { return }
        lastHeard = .now
      } else if ContinuousClock.now - lastHeard >= Self.heartbeatAfter {
        // Silence: a live server answers at once; a dead one, or a cut link, never does.
        guard answers("SELECT 1", on: connection) else { return }
        lastHeard = .now
      }
      while let notification = PQnotifies(handle) {
        let channel = String(cString: notification.pointee.relname)
        let payload = String(cString: notification.pointee.extra)
        PQfreemem(notification)
        if channel == cancelChannel { announce(payload) } else { deliver(payload) }
      }
      if PQstatus(handle) != CONNECTION_OK { return }
    }
  }

  /// Sends `sql` and reads its results; false when it fails, when its answer takes longer than
  /// `answerTimeout`, or when the listener stops meanwhile. Notifications that arrive meanwhile
  /// stay queued in libpq for ``listen(on:)``.
  private func answers(_ sql: String, on connection: Connection) -> Bool {
    let handle = connection.handle
    guard PQsendQuery(handle, sql) == 1 else { return false }
    let deadline = ContinuousClock.now + answerTimeout
    var succeeded = true
    while true {
      while PQisBusy(handle) == 0 {
        guard let result = PQgetResult(handle) else { return succeeded }
        let status = PQresultStatus(result)
        if status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK { succeeded = false }
        PQclear(result)
      }
      let now = ContinuousClock.now
      guard !isStopped, now < deadline else { return false }
      let socket = PQsocket(handle)
      guard socket >= 0 else { return false }
      let (seconds, attoseconds) = min(deadline - now, .milliseconds(250)).components
      let slice = Int32(seconds * 1_000 + attoseconds / 1_000_000_000_000_000)
      let ready = conveyor_pq_wait_readable(socket, max(1, slice))
      if ready < 0 && errno != EINTR { return false }
      if ready > 0 && PQconsumeInput(handle) != 1 { return false }
    }
  }

  /// Sleeps `pause` seconds (in slices, to notice ``stop()``), then doubles it up to a second.
  private func rest(_ pause: inout Double) {
    let end = ContinuousClock.now + .milliseconds(Int64(pause * 1000))
    while !isStopped && ContinuousClock.now < end { Thread.sleep(forTimeInterval: 0.05) }
    pause = min(pause * 2, 1)
  }
}

/// The payload of a cancel's notification (``SQL/cancel``), one per queue: the IDs of the running
/// jobs it cancelled, in decimal, separated by commas, a space, then the queue name
/// (`"12,15 mail"`); `"* mail"` when the IDs would make it too long (some of the queue's running
/// jobs); `"*"` when the queue name alone would (some running jobs of some queue).
enum CancelPayload {
  /// A payload is shorter than this many bytes (PostgreSQL's limit, by default).
  static let limit = 8_000

  /// The queue (nil: any) and the notice a payload gives. One it cannot read concerns every
  /// claim of every queue: the check that follows costs a read, a notice dropped a cancellation.
  static func parse(_ payload: String) -> (queue: String?, notice: CancellationNotice) {
    // Split by Unicode scalars, not `Character`s: a queue name may start with a combining mark,
    // which makes one grapheme of it and the space before it.
    let scalars = payload.unicodeScalars
    guard let space = scalars.firstIndex(of: " ") else { return (nil, CancellationNotice(jobs: nil)) }
    let queue = String(scalars[scalars.index(after: space)...])
    let head = String(scalars[..<space])
    if head == "*" { return (queue, CancellationNotice(jobs: nil)) }
    var jobs: Set<JobID> = []
    for field in head.split(separator: ",", omittingEmptySubsequences: false) {
      guard let id = Int64(field) else { return (queue, CancellationNotice(jobs: nil)) }
      jobs.insert(JobID(id))
    }
    return (queue, CancellationNotice(jobs: jobs))
  }
}
