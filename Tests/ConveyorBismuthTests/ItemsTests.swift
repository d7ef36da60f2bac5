import Conveyor
import ConveyorBismuth
import Foundation
import Synchronization
import Testing

/// `items` and `count`: every item not handled yet, the running one included, in arrival order.
@Suite("Bismuth: items in arrival order", .timeLimit(.minutes(10)))
@MainActor
struct ItemsTests {
  @Test("items keep arrival order across a retry, and include the running item")
  func itemsOrderAcrossRetry() async throws {
    let config = try temporaryConfig("order", retryTime: 3600, autoStart: false)
    let queue = Bismuth.Queue<NamedItem>(config: config)
    let delegate = RecordingDelegate(answer: .retry)
    queue.delegate = delegate
    queue.add([NamedItem(name: "a"), NamedItem(name: "b"), NamedItem(name: "c")])
    queue.start()
    #expect(await eventually { delegate.seen.count == 3 })
    try await Task.sleep(for: .milliseconds(200))
    #expect(queue.items.map(\.name) == ["a", "b", "c"])
    #expect(queue.count == 3)
    #expect(queue.remove(NamedItem(name: "b")) == 1)
    #expect(queue.items.map(\.name) == ["a", "c"])
    await queue.jobQueue.shutdown(gracePeriod: .zero)
  }
}

/// A store that forwards to another and, once armed, runs a step of another process's worker
/// right after a page of waiting jobs (or of all jobs) has been read: the moment a listing that
/// read waiting and running jobs separately could see a job twice, or not at all.
private final class StepAfterWaitingListing: JobStore {
  typealias Step = @Sendable (InMemoryJobStore, String) async throws -> Void
  let base = InMemoryJobStore()
  private let armed = Mutex<Step?>(nil)

  func arm(_ step: @escaping Step) { armed.withLock { $0 = step } }

  /// Another process's worker claims the queue's first waiting job.
  static let claimElsewhere: Step = { base, queue in
    _ = try await base.settleAndClaim(
      [], queue: queue, limit: 1, lease: Lease(owner: "elsewhere", duration: .seconds(60)),
      clock: SystemJobClock())
  }

  func jobs(queue: String, status: JobStatus?, after: JobID?, limit: Int) async throws -> [JobRecord] {
    let page = try await base.jobs(queue: queue, status: status, after: after, limit: limit)
    if status == .pending || status == nil,
      let step = armed.withLock({ armed in
        defer { armed = nil }
        return armed
      })
    {
      try await step(base, queue)
    }
    return page
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
  { try await base.heartbeat(claims, queue: queue, lease: lease, clock: clock) }
  func rescueExpiredLeases(queue: String, clock: any JobClock) async throws -> Int {
    try await base.rescueExpiredLeases(queue: queue, clock: clock)
  }
  func counts(queue: String, clock: any JobClock) async throws -> JobCounts {
    try await base.counts(queue: queue, clock: clock)
  }
  func job(_ id: JobID) async throws -> JobRecord? { try await base.job(id) }
  func remove(_ ids: [JobID], queue: String) async throws -> Int { try await base.remove(ids, queue: queue) }
  func clear(queue: String, statuses: Set<JobStatus>) async throws -> Int {
    try await base.clear(queue: queue, statuses: statuses)
  }
  func cancel(_ ids: [JobID], queue: String?, clock: any JobClock) async throws -> [CancelResult] {
    try await base.cancel(ids, queue: queue, clock: clock)
  }
  func currentClaims(_ claims: [ClaimReference], queue: String) async throws -> [ClaimReference] {
    try await base.currentClaims(claims, queue: queue)
  }
  func tally(queue: String, statuses: Set<JobStatus>) async throws -> JobTally {
    try await base.tally(queue: queue, statuses: statuses)
  }
  func clear(queue: String, statuses: Set<JobStatus>, through: JobID, expecting expected: Int) async throws
    -> Int?
  { try await base.clear(queue: queue, statuses: statuses, through: through, expecting: expected) }
  func prune(queue: String, status: JobStatus, olderThan age: Duration, limit: Int, clock: any JobClock)
    async throws -> Int
  { try await base.prune(queue: queue, status: status, olderThan: age, limit: limit, clock: clock) }
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
  func waitForWork(queue: String, timeout: Duration) async -> Bool {
    await base.waitForWork(queue: queue, timeout: timeout)
  }
  var recordsActivity: Bool { base.recordsActivity }
  func recordActivity(_ activity: [QueueActivity]) async throws { try await base.recordActivity(activity) }
  func activity(since: Date, limit: Int) async throws -> [QueueActivity] {
    try await base.activity(since: since, limit: limit)
  }
  func oldestReadyRunDate(queue: String, clock: any JobClock) async throws -> Date? {
    try await base.oldestReadyRunDate(queue: queue, clock: clock)
  }
}

@Suite("Bismuth: items while another process works the queue", .timeLimit(.minutes(10)))
@MainActor
struct ItemsWhileWorkedElsewhereTests {
  @Test("an item claimed elsewhere while items are listed is listed once")
  func itemClaimedDuringListingIsListedOnce() async throws {
    let store = StepAfterWaitingListing()
    let config = try temporaryConfig("claimed-elsewhere", autoStart: false)
    let queue = try Bismuth.Queue<NamedItem>(config: config, store: store)
    queue.add([NamedItem(name: "a")])
    #expect(queue.items.map(\.name) == ["a"])
    store.arm(StepAfterWaitingListing.claimElsewhere)
    // Waiting when the waiting jobs are read, running when the running ones are.
    #expect(queue.items.map(\.name) == ["a"])
    await queue.jobQueue.shutdown(gracePeriod: .zero)
  }

  @Test("an item retried elsewhere while items are listed is listed, and can be removed")
  func itemRetriedDuringListingIsListed() async throws {
    let store = StepAfterWaitingListing()
    let config = try temporaryConfig("retried-elsewhere", autoStart: false)
    let queue = try Bismuth.Queue<NamedItem>(config: config, store: store)
    queue.add([NamedItem(name: "a")])
    let lease = Lease(owner: "elsewhere", duration: .seconds(60))
    // Claimed elsewhere; once the waiting jobs are read, retried (waiting again) before the
    // running ones are.
    func claimedThenRetried() async throws -> StepAfterWaitingListing.Step {
      let held = try await store.base.settleAndClaim(
        [], queue: "retried-elsewhere", limit: 1, lease: lease, clock: SystemJobClock()
      ).claimed
      #expect(held.count == 1)
      return { base, queue in
        _ = try await base.settleAndClaim(
          held.map { JobSettlement(claim: $0.claim, action: .retry(after: .zero, error: "again")) },
          queue: queue, limit: 0, lease: lease, clock: SystemJobClock())
      }
    }
    store.arm(try await claimedThenRetried())
    #expect(queue.items.map(\.name) == ["a"])
    store.arm(try await claimedThenRetried())
    #expect(queue.remove(NamedItem(name: "a")) == 1)
    await queue.jobQueue.shutdown(gracePeriod: .zero)
  }
}
