import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import Conveyor

/// The queue's activity counts (`QueueActivity.swift`): what a stopping queue does with the counts
/// it has not yet given to its store.
///
/// The store here is the in-memory store with a `recordActivity` that keeps what it is given and
/// answers slowly in one of two ways a real store does: a PostgreSQL server that takes a moment
/// (a cancel request's round trip) to give up a statement, and an SQLite connection busy-waiting
/// for another process's write lock, which `sqlite3_interrupt` does not cut short.
@Suite("Activity counts at shutdown", .timeLimit(.minutes(10)))
struct QueueActivityShutdownTests {
  struct Item: Queueable { var n: Int }

  /// How the store's first `recordActivity` call behaves.
  enum FirstCall: Sendable, Equatable {
    /// Answers after two seconds (well within the five a stopping queue promises to wait); when
    /// cancelled, takes 300 ms to give up (the round trip of a cancel request) and throws
    /// `CancellationError`, having stored nothing.
    case slowButCancellable
    /// Blocks, ignoring cancellation, until ``ActivityStore/release()``; so do all later calls.
    case blockedUntilReleased
  }

  /// The in-memory store, keeping activity, with a slow first `recordActivity`.
  final class ActivityStore: JobStore {
    let base = InMemoryJobStore()
    let first: FirstCall
    private let recorded = Mutex<[QueueActivity]>([])
    private let calls = Mutex(0)
    private let entered = Mutex(false)
    private let gate = DispatchSemaphore(value: 0)
    private let released = Mutex(false)

    init(first: FirstCall) { self.first = first }

    var recordsActivity: Bool { true }

    /// Everything stored so far, summed.
    var total: QueueActivity {
      recorded.withLock { rows in
        rows.reduce(into: QueueActivity(queue: "sum", minute: Date())) { $0.add($1) }
      }
    }
    /// Whether the first `recordActivity` call has begun.
    var firstCallEntered: Bool { entered.withLock { $0 } }
    /// Ends the ``FirstCall/blockedUntilReleased`` calls, and lets later ones through.
    func release() {
      guard
        released.withLock({
          let was = $0
          $0 = true
          return !was
        })
      else { return }
      for _ in 0..<100 { gate.signal() }
    }

    func recordActivity(_ activity: [QueueActivity]) async throws {
      let call = calls.withLock {
        $0 += 1
        return $0
      }
      if call == 1 { entered.withLock { $0 = true } }
      if call == 1 || first == .blockedUntilReleased {
        switch first {
        case .slowButCancellable:
          do {
            try await Task.sleep(for: .seconds(2))
          } catch {
            // The cancel request's round trip: not cut short by the cancellation itself.
            await withCheckedContinuation { continuation in
              DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(300)) {
                continuation.resume()
              }
            }
            throw CancellationError()
          }
        case .blockedUntilReleased:
          let gate = self.gate
          if released.withLock({ $0 }) { break }
          // On a thread of its own: a dispatch thread is one of the cooperative pool's on Linux.
          _ = try? await onOwnThread(name: "test-gate") { gate.wait() }
        }
      }
      recorded.withLock { $0 += activity }
    }

    func activity(since: Date, limit: Int) async throws -> [QueueActivity] {
      recorded.withLock { $0 }
    }

    // Everything else goes to the in-memory store.
    func enqueue(_ jobs: [NewJob], queue: String, clock: any JobClock) async throws -> [EnqueueResult] {
      try await base.enqueue(jobs, queue: queue, clock: clock)
    }
    func settleAndClaim(
      _ settlements: [JobSettlement], queue: String, limit: Int, lease: Lease, clock: any JobClock
    ) async throws -> ClaimBatch {
      try await base.settleAndClaim(settlements, queue: queue, limit: limit, lease: lease, clock: clock)
    }
    func heartbeat(_ claims: [ClaimReference], queue: String, lease: Lease, clock: any JobClock)
      async throws -> [ClaimReference]
    {
      try await base.heartbeat(claims, queue: queue, lease: lease, clock: clock)
    }
    func rescueExpiredLeases(queue: String, clock: any JobClock) async throws -> Int {
      try await base.rescueExpiredLeases(queue: queue, clock: clock)
    }
    func counts(queue: String, clock: any JobClock) async throws -> JobCounts {
      try await base.counts(queue: queue, clock: clock)
    }
    func jobs(queue: String, status: JobStatus?, after: JobID?, limit: Int) async throws -> [JobRecord] {
      try await base.jobs(queue: queue, status: status, after: after, limit: limit)
    }
    func job(_ id: JobID) async throws -> JobRecord? { try await base.job(id) }
    func remove(_ ids: [JobID], queue: String) async throws -> Int {
      try await base.remove(ids, queue: queue)
    }
    func cancel(_ ids: [JobID], queue: String?, clock: any JobClock) async throws -> [CancelResult] {
      try await base.cancel(ids, queue: queue, clock: clock)
    }
    func prune(queue: String, status: JobStatus, olderThan age: Duration, limit: Int, clock: any JobClock)
      async throws -> Int
    {
      try await base.prune(queue: queue, status: status, olderThan: age, limit: limit, clock: clock)
    }
    func cancellations(queue: String) -> AsyncStream<CancellationNotice>? {
      base.cancellations(queue: queue)
    }
    func currentClaims(_ claims: [ClaimReference], queue: String) async throws -> [ClaimReference] {
      try await base.currentClaims(claims, queue: queue)
    }
    func clear(queue: String, statuses: Set<JobStatus>) async throws -> Int {
      try await base.clear(queue: queue, statuses: statuses)
    }
    func tally(queue: String, statuses: Set<JobStatus>) async throws -> JobTally {
      try await base.tally(queue: queue, statuses: statuses)
    }
    func clear(queue: String, statuses: Set<JobStatus>, through: JobID, expecting expected: Int)
      async throws -> Int?
    {
      try await base.clear(queue: queue, statuses: statuses, through: through, expecting: expected)
    }
    func requeueDead(_ ids: [JobID]?, queue: String, clock: any JobClock) async throws -> Int {
      try await base.requeueDead(ids, queue: queue, clock: clock)
    }
    func setPaused(_ paused: Bool, queue: String) async throws {
      try await base.setPaused(paused, queue: queue)
    }
    func isPaused(queue: String) async throws -> Bool { try await base.isPaused(queue: queue) }
    func nextWake(queue: String, clock: any JobClock) async throws -> WakeHint {
      try await base.nextWake(queue: queue, clock: clock)
    }
    func queueNames() async throws -> [String] { try await base.queueNames() }
    var maximumLockWait: Duration { base.maximumLockWait }
  }

  /// A queue on `store` that handles every job. Its periodic flush runs every 200 ms rather than
  /// every 5 s (so the tests need not wait for it); it hands its counts over at shutdown within
  /// `handover` (default: the 5 s every queue promises).
  static func queue(_ store: ActivityStore, handover: Duration = .seconds(5)) throws -> JobQueue<Item> {
    var configuration = JobQueueConfiguration(identifier: "mail")
    configuration.activityFlushInterval = .milliseconds(200)
    configuration.activityHandoverLimit = handover
    return try JobQueue<Item>(configuration: configuration, store: store) { _, _ in .handled }
  }

  /// The periodic flush (every 5 s; 200 ms here) is on its way to the store when the queue is asked to stop.
  /// The store would answer within 2 s, inside the 5 s the queue promises to wait for its counts;
  /// but the queue cancels that flush at once, and its final flush finds the tally empty (the
  /// counts are with the cancelled call). The cancelled call puts them back into the tally of a
  /// queue that has stopped: they never reach the store.
  ///
  /// Failed before the fix: `JobQueue.runLoop` cancelled `activityFlusher` without waiting for it
  /// before `flushActivity(within:)`; `flushActivity()` then `restore`d into a tally nobody
  /// flushed.
  @Test func countsOfAFlushInFlightWhenTheQueueStopsReachTheStore() async throws {
    let store = ActivityStore(first: .slowButCancellable)
    let queue = try Self.queue(store)
    try await queue.add(Item(n: 1))
    await queue.waitUntilFinished()
    // The periodic flush is now with the store, holding the counts.
    try await eventually("the periodic flush began", timeout: .seconds(90)) { store.firstCallEntered }
    await queue.shutdown(gracePeriod: .seconds(5))
    // Generous: whatever arrives within ten seconds of the shutdown counts.
    let arrived = await eventually(timeout: .seconds(90)) { store.total.succeeded == 1 }
    #expect(arrived, "the job's success never reached the store: \(store.total)")
    #expect(store.total.started == 1, "its start neither: \(store.total)")
  }

  /// "A stopping queue waits at most 5 s to hand its counts over." The final flush races a 5 s
  /// sleep in a task group; but a task group waits for every child before it returns, so a store
  /// call that does not end at cancellation (an SQLite connection waiting out `busyTimeout` for a
  /// lock another process holds; any third-party store) holds the shutdown for as long as it
  /// takes. Here it would be forever: the shutdown has not returned after 30 s (six times the
  /// promise) when the test lets the store go. (The queue here promises 1 s rather than 5, so
  /// the test need not wait out the default bound; 30 s stays a generous hang bound.)
  ///
  /// Failed before the fix: `JobQueue.flushActivity(within:)` (`withTaskGroup` awaited the
  /// cancelled flush).
  @Test func aStoreThatIgnoresCancellationDoesNotHoldTheShutdownPastFiveSeconds() async throws {
    let store = ActivityStore(first: .blockedUntilReleased)
    defer { store.release() }
    let queue = try Self.queue(store, handover: .seconds(1))
    try await queue.add(Item(n: 1))
    await queue.waitUntilFinished()
    // The periodic flush is stuck with the store; a second job's counts wait in the tally for the
    // final flush.
    try await eventually("the periodic flush began", timeout: .seconds(90)) { store.firstCallEntered }
    try await queue.add(Item(n: 2))
    await queue.waitUntilFinished()
    let stopped = Mutex(false)
    let shutdown = Task {
      await queue.shutdown(gracePeriod: .seconds(5))
      stopped.withLock { $0 = true }
    }
    let returned = await eventually(timeout: .seconds(90)) { stopped.withLock { $0 } }
    store.release()
    await shutdown.value
    #expect(returned, "the shutdown was still waiting for the store's activity call after 90 s")
  }
}
