import Conveyor
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import ConveyorPostgres

/// Review 3 of commit 1d5847a: the listener's per-queue `pending` count.
@Suite("Review 3", .serialized)
struct Review3Tests {
  /// Two watchers A and B of one queue on one store (two `JobQueue`s). A notification comes while
  /// A waits and B is between two waits. A is woken, and (as `JobQueue`'s watcher loop does: it
  /// signals the loop and waits again at once) A waits again before B does. The one early return
  /// the notification left "for B" is taken by A's next wait (a spurious wake-up for A), and B's
  /// next wait sleeps until its poll: the case the commit fixes is only fixed when B happens to
  /// come back before A. `pending` is a count per queue, not per watcher.
  @Test func theEarlyReturnOwedToTheWatcherBetweenWaitsIsTakenByTheWokenWatcher() async throws {
    let (_, worker, other) = try await openWakeStores("rev3")
    defer {
      Task {
        await worker.close()
        await other.close()
      }
    }
    let queue = "stolen"
    // Both watchers wait at once: the listener counts two watchers.
    try await countTwoWatchers(worker, through: other, queue: queue)

    // A's watcher (one task, as `JobQueue`'s is) waits; B is between two waits (its loop has not
    // come back yet). A is woken, and waits again at once (it only signals its loop).
    let aWoken = Counter()
    let a = Task { () -> (Bool, Bool) in
      let a2 = await worker.waitForWork(queue: queue, timeout: .seconds(60))
      aWoken.increment()
      let a3 = await worker.waitForWork(queue: queue, timeout: .seconds(60))
      aWoken.increment()
      return (a2, a3)
    }
    #expect(await waitsRegistered(worker, 1))
    try await other.setPaused(false, queue: queue)
    // A's second wait has returned, or waits.
    #expect(
      await eventually(timeout: .seconds(10)) {
        aWoken.value == 2 || (aWoken.value == 1 && worker.listener!.armedTimeouts == 1)
      })

    // B comes back: the notification it missed should end its wait at once (a hang bound: it
    // otherwise lasts its 8 s and returns false).
    let b2 = await worker.waitForWork(queue: queue, timeout: .seconds(8))
    #expect(b2, "B, between two waits when the notification came, slept until its poll")
    a.cancel()
    let (a2, a3) = await a.value
    #expect(a2, "A is woken by the notification")
    #expect(!a3, "A, already woken by the notification, took the early return owed to B")
  }

  struct Item: Queueable { var number: Int }

  /// The same scenario through two `JobQueue`s of one queue on one store. A (concurrency 1) is
  /// busy with job 1 for good; B is idle. A notification wakes both watchers; B's watcher is
  /// slower to come back (its next wait starts a few seconds later here, standing for a loaded
  /// pool: any delay that lets A's watcher come back first will do). Job 2 is added meanwhile: A
  /// is woken but cannot take it, and takes the early return owed to B; B's next wait sleeps
  /// until its 60-second poll, and job 2 waits for it: the case the commit promises to fix.
  @Test func anIdleJobQueueBetweenTwoWaitsStillMissesAJobWhenABusyOneComesBackFirst() async throws {
    let (_, worker, other) = try await openWakeStores("rev3")
    let queue = "stolen-queue"
    try await primeListener(worker, through: other, queue: queue)
    #expect(await waitsRegistered(worker, 0))
    let (started, startedContinuation) = AsyncStream.makeStream(of: Int.self)
    let busy = try JobQueue<Item>(
      configuration: JobQueueConfiguration(identifier: queue, concurrency: 1, pollInterval: .seconds(60)),
      store: worker
    ) { item, _ in
      startedContinuation.yield(item.number)
      try await Task.sleep(for: .seconds(3_600))
      return .handled
    }
    try await enqueue(1, on: other, queue: queue)
    let held = await first(started, within: 30)
    #expect(held == 1, "the busy queue holds job 1")

    let lagging = LaggingStore(worker)
    let (handled, handledContinuation) = AsyncStream.makeStream(of: Int.self)
    let idle = try JobQueue<Item>(
      configuration: JobQueueConfiguration(identifier: queue, concurrency: 1, pollInterval: .seconds(60)),
      store: lagging
    ) { item, _ in
      handledContinuation.yield(item.number)
      return .handled
    }
    // Both watchers wait: the listener counts two watchers of the queue.
    #expect(await waitsRegistered(worker, 2))
    // A notification wakes both; B's watcher will come back late.
    lagging.lagAfterNextWakeUp(.seconds(5))
    let turnsBefore = lagging.nextWakeCalls
    try await other.setPaused(false, queue: queue)
    // B's loop turned (found nothing) and A's watcher waits again; B's does not yet.
    #expect(await eventually(timeout: .seconds(10)) { lagging.nextWakeCalls > turnsBefore })
    #expect(await waitsRegistered(worker, 1))
    try await enqueue(2, on: other, queue: queue)
    let second = await first(handled, within: 15)
    #expect(second == 2, "the idle queue started job 2 within 15 s (it polls every 60 s)")
    await busy.shutdown(gracePeriod: .milliseconds(100))
    await idle.shutdown(gracePeriod: .seconds(5))
    await worker.close()
    await other.close()
  }

  func enqueue(_ number: Int, on store: PostgresJobStore, queue: String) async throws {
    _ = try await store.enqueue(
      [NewJob(payload: try JSONEncoder().encode(Item(number: number)))], queue: queue, clock: SystemJobClock()
    )
  }
}

/// Forwards to a store; once armed, the wait that follows the next wait that returned true starts
/// late (the watcher is between two waits for that long). Counts `nextWake` calls (one per turn
/// of the queue's loop that found nothing to do).
final class LaggingStore: JobStore {
  let base: PostgresJobStore
  private struct State {
    var lagArmed: Duration?
    var lagNext: Duration?
    var nextWakes = 0
  }
  private let state = Mutex(State())

  init(_ base: PostgresJobStore) { self.base = base }

  func lagAfterNextWakeUp(_ lag: Duration) { state.withLock { $0.lagArmed = lag } }
  var nextWakeCalls: Int { state.withLock { $0.nextWakes } }

  func waitForWork(queue: String, timeout: Duration) async -> Bool {
    if let lag = state.withLock({ state -> Duration? in
      defer { state.lagNext = nil }
      return state.lagNext
    }) {
      try? await Task.sleep(for: lag)
    }
    let woken = await base.waitForWork(queue: queue, timeout: timeout)
    if woken {
      state.withLock { state in
        if let lag = state.lagArmed {
          state.lagArmed = nil
          state.lagNext = lag
        }
      }
    }
    return woken
  }

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
  func remove(_ ids: [JobID], queue: String) async throws -> Int { try await base.remove(ids, queue: queue) }
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
    let hint = try await base.nextWake(queue: queue, clock: clock)
    state.withLock { $0.nextWakes += 1 }
    return hint
  }
  func queueNames() async throws -> [String] { try await base.queueNames() }
  var maximumLockWait: Duration { base.maximumLockWait }
}
