import Conveyor
import ConveyorSQLite
import ConveyorTestSupport
import Foundation
import Testing

/// The stores the helpers are tested on: the in-memory store and a SQLite file in a fresh
/// temporary folder.
enum StoreKind: String, CaseIterable, Sendable, CustomTestStringConvertible {
  case inMemory
  case sqlite

  var testDescription: String { rawValue }

  /// A new, empty store of this kind (the folder holding a SQLite file lives as long as it).
  func make() throws -> TestStore {
    switch self {
    case .inMemory: return TestStore(store: InMemoryJobStore(), folder: nil)
    case .sqlite:
      let folder = try TemporaryFolder(prefix: "conveyor-testing")
      return TestStore(store: try SQLiteJobStore(path: folder.path("jobs.sqlite")), folder: folder)
    }
  }
}

/// A store and, for a SQLite file, the temporary folder that holds it.
struct TestStore: Sendable {
  let store: any JobStore
  let folder: TemporaryFolder?
}

/// The job type of these tests.
struct SendEmail: Queueable, Equatable {
  var to: String
  var subject = "Hello"
}

/// Another job type, to check that items of a different type never match.
struct ResizeImage: Queueable, Equatable {
  var width: Int
}

/// A queue of `SendEmail` on `clock`, started, with a fixed 15 s retry.
func emailQueue(
  _ store: any JobStore, clock: ManualJobClock, identifier: String = "emails", maxAttempts: Int? = nil,
  handler: @escaping JobQueue<SendEmail>.Handler
) throws -> JobQueue<SendEmail> {
  try JobQueue<SendEmail>(
    configuration: .init(
      identifier: identifier, retryPolicy: .fixed(.seconds(15)), maxAttempts: maxAttempts, clock: clock),
    store: store, handler: handler)
}

/// An in-memory store whose `nextWake` always reports a running job's lease, though its counts
/// show none running: answers that disagree, as a store judging time by another clock might give.
final class PhantomLeaseStore: JobStore {
  let base = InMemoryJobStore()

  func nextWake(queue: String, clock: any JobClock) async throws -> WakeHint {
    var hint = try await base.nextWake(queue: queue, clock: clock)
    hint.nextLeaseExpiry = hint.nextLeaseExpiry ?? clock.now().addingTimeInterval(60)
    return hint
  }

  func enqueue(_ jobs: [NewJob], queue: String, clock: any JobClock) async throws -> [EnqueueResult] {
    try await base.enqueue(jobs, queue: queue, clock: clock)
  }
  func settleAndClaim(
    _ settlements: [JobSettlement], queue: String, limit: Int, lease: Lease, clock: any JobClock
  ) async throws -> ClaimBatch {
    try await base.settleAndClaim(settlements, queue: queue, limit: limit, lease: lease, clock: clock)
  }
  func heartbeat(_ claims: [ClaimReference], queue: String, lease: Lease, clock: any JobClock) async throws
    -> [ClaimReference]
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
  func clear(queue: String, statuses: Set<JobStatus>, through: JobID, expecting expected: Int) async throws
    -> Int?
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
  func queueNames() async throws -> [String] { try await base.queueNames() }
}
