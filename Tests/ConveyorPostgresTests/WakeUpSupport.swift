import Conveyor
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import ConveyorPostgres

/// Two stores on one schema of the shared server: `worker` for the idle queue, `other` standing
/// for another process.
func openWakeStores(_ prefix: String = "wake") async throws -> (
  PostgresServer, worker: PostgresJobStore, other: PostgresJobStore
) {
  let server = try await PostgresServer.shared()
  let schema = uniqueSchema(prefix)
  let worker = try await PostgresJobStore.open(url: server.url, options: .init(schema: schema))
  let other = try await PostgresJobStore.open(url: server.url, options: .init(schema: schema))
  return (server, worker, other)
}

/// Makes sure `store`'s listener is up (it starts with the first wait) and nothing is pending.
func primeListener(_ store: PostgresJobStore, through other: PostgresJobStore, queue: String) async throws {
  var live = false
  for _ in 0..<50 where !live {
    let waiter = Task { await store.waitForWork(queue: queue, timeout: .seconds(2)) }
    try await Task.sleep(for: .milliseconds(100))
    try await other.setPaused(false, queue: queue)
    live = await waiter.value
  }
  #expect(live, "the listener hears a resume")
  while await store.waitForWork(queue: queue, timeout: .milliseconds(300)) {}
}

/// Waits until exactly `count` waits of `store`'s listener are registered (each registered wait
/// arms a timeout, freed as soon as the wait ends).
func waitsRegistered(_ store: PostgresJobStore, _ count: Int) async -> Bool {
  await eventually(timeout: .seconds(10)) { store.listener!.armedTimeouts == count }
}

/// The first value of `stream`, or nil when none comes within `seconds`.
func first(_ stream: AsyncStream<Int>, within seconds: Int = 5) async -> Int? {
  await withTaskGroup(of: Int?.self) { group in
    group.addTask {
      var iterator = stream.makeAsyncIterator()
      return await iterator.next()
    }
    group.addTask {
      try? await Task.sleep(for: .seconds(seconds))
      return nil
    }
    let value = await group.next() ?? nil
    group.cancelAll()
    return value
  }
}

/// Primes `worker`'s listener for `queue` and makes it count two watchers of the queue (two waits
/// at once, both woken by one notification), then waits until no wait is left registered.
func countTwoWatchers(_ worker: PostgresJobStore, through other: PostgresJobStore, queue: String) async throws
{
  try await primeListener(worker, through: other, queue: queue)
  // Every earlier wait's timeout freed first: a notified wait's is freed once its timer task sees
  // the cancel.
  #expect(await waitsRegistered(worker, 0))
  let first = Task { await worker.waitForWork(queue: queue, timeout: .seconds(60)) }
  let second = Task { await worker.waitForWork(queue: queue, timeout: .seconds(60)) }
  #expect(await waitsRegistered(worker, 2))
  try await other.setPaused(false, queue: queue)
  let (firstWoken, secondWoken) = (await first.value, await second.value)
  #expect(firstWoken && secondWoken, "both waiting watchers are woken")
  #expect(await waitsRegistered(worker, 0))
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

  func cancellations(queue: String) -> AsyncStream<CancellationNotice>? {
    base.cancellations(queue: queue)
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
  func cancel(_ ids: [JobID], queue: String?, clock: any JobClock) async throws -> [CancelResult] {
    try await base.cancel(ids, queue: queue, clock: clock)
  }
  func prune(queue: String, status: JobStatus, olderThan age: Duration, limit: Int, clock: any JobClock)
    async throws -> Int
  {
    try await base.prune(queue: queue, status: status, olderThan: age, limit: limit, clock: clock)
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
    let hint = try await base.nextWake(queue: queue, clock: clock)
    state.withLock { $0.nextWakes += 1 }
    return hint
  }
  func queueNames() async throws -> [String] { try await base.queueNames() }
  var maximumLockWait: Duration { base.maximumLockWait }
}

/// Makes sure the store's listener is up for `queue` and no notification is pending.
func primeListener(_ store: PostgresJobStore, queue: String) async throws {
  var live = false
  for _ in 0..<20 where !live {
    let waiter = Task { await store.waitForWork(queue: queue, timeout: .seconds(2)) }
    try await Task.sleep(for: .milliseconds(200))
    try await store.setPaused(false, queue: queue)
    live = await waiter.value
  }
  #expect(live, "the listener hears a resume")
  while await store.waitForWork(queue: queue, timeout: .milliseconds(300)) {}
}

/// Waits on `listener` for `queue` after draining what is pending; returns whether `action`
/// woke it.
func wakes(
  _ listener: PostgresJobStore, queue: String, _ action: @Sendable () async throws -> Void
) async throws -> Bool {
  while await listener.waitForWork(queue: queue, timeout: .milliseconds(300)) {}
  let waiter = Task { await listener.waitForWork(queue: queue, timeout: .seconds(10)) }
  try await Task.sleep(for: .milliseconds(300))
  try await action()
  return await waiter.value
}
