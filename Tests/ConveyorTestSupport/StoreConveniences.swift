import Conveyor
import Foundation

/// A clock that always shows one date: for store calls in tests that name "now" directly.
public struct FixedJobClock: JobClock {
  /// The date it shows.
  public var date: Date
  /// A clock showing `date`.
  public init(_ date: Date) { self.date = date }
  /// `date`.
  public func now() -> Date { date }
  /// Returns at once when the deadline is not after `date`; otherwise sleeps a moment (the clock
  /// never moves, so callers must not wait for it).
  public func sleep(until deadline: Date) async throws {
    if deadline > date { try await Task.sleep(for: .milliseconds(1)) }
  }
}

/// Store calls with a fixed "now", so tests read as the dates they check.
extension JobStore {
  /// ``JobStore/enqueue(_:queue:clock:)`` at `now`.
  public func enqueue(_ jobs: [NewJob], queue: String, now: Date) async throws -> [EnqueueResult] {
    try await enqueue(jobs, queue: queue, clock: FixedJobClock(now))
  }

  /// ``JobStore/settleAndClaim(_:queue:limit:lease:clock:)`` at `now`.
  public func settleAndClaim(
    _ settlements: [JobSettlement], queue: String, limit: Int, lease: Lease, now: Date
  ) async throws -> ClaimBatch {
    try await settleAndClaim(settlements, queue: queue, limit: limit, lease: lease, clock: FixedJobClock(now))
  }

  /// ``JobStore/counts(queue:clock:)`` at `now`.
  public func counts(queue: String, now: Date) async throws -> JobCounts {
    try await counts(queue: queue, clock: FixedJobClock(now))
  }

  /// ``JobStore/rescueExpiredLeases(queue:clock:)`` at `now`.
  public func rescueExpiredLeases(queue: String, now: Date) async throws -> Int {
    try await rescueExpiredLeases(queue: queue, clock: FixedJobClock(now))
  }

  /// ``JobStore/requeueDead(_:queue:clock:)`` at `now`.
  public func requeueDead(_ ids: [JobID]?, queue: String, now: Date) async throws -> Int {
    try await requeueDead(ids, queue: queue, clock: FixedJobClock(now))
  }

  /// ``JobStore/nextWake(queue:clock:)`` at the system clock's now.
  public func nextWake(queue: String) async throws -> WakeHint {
    try await nextWake(queue: queue, clock: SystemJobClock())
  }
}

extension JobCounts {
  /// These counts without the history: completed and cancelled as 0 (waiting, running and dead
  /// jobs as counted), for checks of what a queue still holds to work on.
  public var withoutHistory: JobCounts {
    var counts = self
    counts.completed = 0
    counts.cancelled = 0
    return counts
  }
}

/// The migration tests' look at jobs stored before the keyed-jobs index (schema 7).
extension JobStore {
  /// Adds, to `queue`, a job of key "r" one at a time, then two of key "c": one scoped to an hour
  /// after completion, one to a minute. A store whose running job of "r" and job of "c" completed
  /// ten minutes before are seen answers `.existing`, `.existing`, `.inserted`.
  public func addScopedProbes(queue: String, clock: any JobClock) async throws -> [EnqueueResult] {
    let payload = Data("{}".utf8)
    return try await enqueue(
      [
        NewJob(payload: payload, deduplicationKey: "r", deduplicationScope: .waitingOrRunning),
        NewJob(
          payload: payload, deduplicationKey: "c", deduplicationScope: .completedWithin(.seconds(3_600))),
        NewJob(payload: payload, deduplicationKey: "c", deduplicationScope: .completedWithin(.seconds(60))),
      ], queue: queue, clock: clock)
  }
}
