import Conveyor
import ConveyorTestSupport
import Synchronization

/// Forwards to `base`; runs `hook` before each `settleAndClaim` (the hook may suspend the call,
/// which fails when it returns true) and `wakeHook` before each `nextWake` (it may suspend the
/// loop's look at the store, or fail it), and fails every `settleAndClaim`, heartbeat, rescue and `nextWake`
/// while `dead` (a process that vanished, as its store sees it).
final class HookedStore: JobStore {
  let base: any JobStore
  let hook: @Sendable ([JobSettlement], Int) async -> Bool
  let wakeHook: @Sendable () async throws -> Void
  let dead = Mutex(false)

  struct Dead: Error {}
  struct Injected: Error {}

  init(
    _ base: any JobStore, hook: @escaping @Sendable ([JobSettlement], Int) async -> Bool = { _, _ in false },
    wakeHook: @escaping @Sendable () async throws -> Void = {}
  ) {
    self.base = base
    self.hook = hook
    self.wakeHook = wakeHook
  }

  func enqueue(_ jobs: [NewJob], queue: String, clock: any JobClock) async throws -> [EnqueueResult] {
    try await base.enqueue(jobs, queue: queue, clock: clock)
  }
  func settleAndClaim(
    _ settlements: [JobSettlement], queue: String, limit: Int, lease: Lease, clock: any JobClock
  ) async throws -> ClaimBatch {
    if dead.withLock({ $0 }) { throw Dead() }
    if await hook(settlements, limit) { throw Injected() }
    return try await base.settleAndClaim(settlements, queue: queue, limit: limit, lease: lease, clock: clock)
  }
  func heartbeat(_ claims: [ClaimReference], queue: String, lease: Lease, clock: any JobClock)
    async throws -> [ClaimReference]
  {
    if dead.withLock({ $0 }) { throw Dead() }
    return try await base.heartbeat(claims, queue: queue, lease: lease, clock: clock)
  }
  func rescueExpiredLeases(queue: String, clock: any JobClock) async throws -> Int {
    if dead.withLock({ $0 }) { throw Dead() }
    return try await base.rescueExpiredLeases(queue: queue, clock: clock)
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
    try await wakeHook()
    if dead.withLock({ $0 }) { throw Dead() }
    return try await base.nextWake(queue: queue, clock: clock)
  }
  func queueNames() async throws -> [String] { try await base.queueNames() }
  var maximumLockWait: Duration { base.maximumLockWait }
  var maximumLockWaitSetting: String { base.maximumLockWaitSetting }
}

/// Whether a call records releases and claims nothing (the loop handing jobs back).
func isHandBack(_ settlements: [JobSettlement], _ limit: Int) -> Bool {
  limit == 0
    && settlements.contains {
      if case .release = $0.action { return true }
      return false
    }
}

/// Watches a store through a `HookedStore`: records every `settleAndClaim` (the IDs of its
/// outcomes, how many of them hand jobs back, its claim limit) and counts the loop's looks
/// (`nextWake`); fails either while told to.
final class StoreProbe: Sendable {
  let failWake = Mutex(false)
  let failClaim = Mutex(false)
  let wakeCalls = Mutex(0)
  let calls = Log<(ids: [JobID], releases: Int, limit: Int)>()
  let handBacks = Mutex(0)

  struct Injected: Error {}

  init() {}

  /// `base`, watched.
  func store(over base: any JobStore) -> HookedStore {
    HookedStore(
      base,
      hook: { [self] settlements, limit in
        let releases = settlements.filter {
          if case .release = $0.action { return true }
          return false
        }.count
        calls.append((settlements.map(\.id), releases, limit))
        if isHandBack(settlements, limit) { handBacks.withLock { $0 += 1 } }
        return failClaim.withLock { $0 }
      },
      wakeHook: { [self] in
        wakeCalls.withLock { $0 += 1 }
        if failWake.withLock({ $0 }) { throw Injected() }
      })
  }

  /// Store calls so far, looks and claims.
  var total: Int { wakeCalls.withLock { $0 } + calls.count }
}
