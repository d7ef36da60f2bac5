import CLibPQ
import Conveyor
import Foundation
import Synchronization

/// Receives the store's notifications on a connection of its own and wakes the tasks waiting in
/// ``wait(queue:timeout:)``.
///
/// The connection lives on a thread of its own, started by the first wait: the thread `LISTEN`s,
/// then blocks in `poll(2)` on the socket (a quarter second at most, to notice ``stop()``), and
/// hands each notification's queue name to the waiters. When the connection breaks it is opened
/// again with backoff; meanwhile waits simply time out, and the queue's polling finds the work.
/// Every `LISTEN`, the first included, wakes every waiter (and makes every watched queue's next
/// wait return at once), since notifications sent before it are lost.
final class Listener: Sendable {
  private struct Waiter {
    var queue: String
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
    /// Queues notified while nobody waited: the next wait returns at once.
    var pending: Set<String> = []
    /// Queues a wait was made for, so `pending` only holds names someone watches.
    var watched: Set<String> = []
  }

  private let state = Mutex(State())
  private let armed = Atomic<Int>(0)

  /// Timeouts of waits scheduled and not yet freed (for tests).
  var armedTimeouts: Int { armed.load(ordering: .relaxed) }
  private let conninfo: String
  private let scrubber: Scrubber
  private let channel: String

  init(conninfo: String, scrubber: Scrubber, channel: String) {
    self.conninfo = conninfo
    self.scrubber = scrubber
    self.channel = channel
  }

  /// Ends the thread within a quarter second and wakes every waiter.
  func stop() {
    let waiters = state.withLock { state -> [Waiter] in
      state.stopped = true
      defer { state.waiters = [:] }
      return Array(state.waiters.values)
    }
    for waiter in waiters { waiter.resume(returning: false) }
  }

  /// Waits for a notification about `queue`, `timeout`, or the task's cancellation.
  func wait(queue: String, timeout: Duration) async -> Bool {
    let token = state.withLock { state -> UInt64 in
      state.nextToken += 1
      return state.nextToken
    }
    return await withTaskCancellationHandler {
      await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
        let immediate = state.withLock { state -> Bool? in
          if state.stopped || Task.isCancelled { return false }
          state.watched.insert(queue)
          if state.pending.remove(queue) != nil { return true }
          state.waiters[token] = Waiter(queue: queue, continuation: continuation)
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
          defer { armed.subtract(1, ordering: .relaxed) }
          do { try await DispatchSleep.sleep(for: max(timeout, .milliseconds(1))) } catch { return }
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

  /// Wakes the waiters of `queue` (of every queue when nil). A watched queue nobody waits for
  /// just now is kept pending, so its next wait returns at once.
  private func deliver(_ queue: String?) {
    let woken = state.withLock { state -> [Waiter] in
      let matching = state.waiters.filter { queue == nil || $0.value.queue == queue }
      for token in matching.keys { state.waiters[token] = nil }
      let waited = Set(matching.values.map(\.queue))
      let missed = queue.map { state.watched.contains($0) ? [$0] : [] } ?? Array(state.watched)
      for name in missed where !waited.contains(name) { state.pending.insert(name) }
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
        let connection = try? Connection(conninfo: conninfo, scrubber: scrubber, isCancelled: { isStopped })
      else {
        Thread.sleep(forTimeInterval: pause)
        pause = min(pause * 2, 1)
        continue
      }
      do {
        try connection.executeScript("LISTEN \"\(channel)\"")
      } catch {
        Thread.sleep(forTimeInterval: pause)
        pause = min(pause * 2, 1)
        continue
      }
      pause = 0.05
      // Notifications sent before this `LISTEN` (while connecting for the first time, or while
      // down) are lost: every waiter looks again.
      deliver(nil)
      while !isStopped {
        let socket = PQsocket(connection.handle)
        guard socket >= 0 else { break }
        let ready = conveyor_pq_wait_readable(socket, 250)
        if ready < 0 && errno != EINTR { break }
        if ready > 0 {
          guard PQconsumeInput(connection.handle) == 1 else { break }
        }
        while let notification = PQnotifies(connection.handle) {
          let queue = String(cString: notification.pointee.extra)
          PQfreemem(notification)
          deliver(queue)
        }
        if PQstatus(connection.handle) != CONNECTION_OK { break }
      }
    }
  }
}
