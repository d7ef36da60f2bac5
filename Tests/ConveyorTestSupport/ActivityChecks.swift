import Conveyor
import Foundation

/// Checks of ``JobStore/recordActivity(_:)``, ``JobStore/activity(since:limit:)`` and
/// ``JobStore/oldestReadyRunDate(queue:clock:)`` for a store that keeps activity; each store's
/// tests run them on a fresh store.
public enum ActivityChecks {
  static func expect(_ condition: Bool, _ message: @autoclosure () -> String) throws {
    if !condition { throw ConformanceFailure(description: message()) }
  }

  /// Counts add up per queue and minute, reads are sorted and bounded, old minutes are pruned.
  public static func recordAndRead(_ store: any JobStore) async throws {
    try expect(store.recordsActivity, "the store says it keeps no activity")
    let m0 = QueueActivity.minute(containing: Date().addingTimeInterval(-120))
    let m1 = m0.addingTimeInterval(60)
    try await store.recordActivity([
      QueueActivity(
        queue: "mail", minute: m0, succeeded: 3, started: 2, waitMillisecondsTotal: 100,
        waitMillisecondsMax: 80),
      QueueActivity(queue: "mail", minute: m1, retried: 1, stuck: 2),
      QueueActivity(queue: "hooks", minute: m0.addingTimeInterval(5), died: 1),
      // A minute with only a stuck handler is recorded too.
      QueueActivity(queue: "stuck", minute: m0, stuck: 1),
    ])
    // A second worker's counts of the same minute add up; the longest wait is the larger one.
    try await store.recordActivity([
      QueueActivity(
        queue: "mail", minute: m0.addingTimeInterval(59), succeeded: 2, started: 1, waitMillisecondsTotal: 50,
        waitMillisecondsMax: 50)
    ])
    let all = try await store.activity(since: m0.addingTimeInterval(-3600), limit: 100)
    try expect(
      all.map { "\($0.queue)@\(Int($0.minute.timeIntervalSince(m0)))" }
        == ["hooks@0", "mail@0", "mail@60", "stuck@0"],
      "rows by queue and minute: \(all)")
    try expect(all[2].stuck == 2 && all[3].stuck == 1 && all[1].stuck == 0, "stuck handlers counted: \(all)")
    let mail = all[1]
    try expect(
      mail.succeeded == 5 && mail.started == 3 && mail.waitMillisecondsTotal == 150
        && mail.waitMillisecondsMax == 80 && mail.retried == 0 && mail.died == 0,
      "the minute's counts added up: \(mail)")
    try expect(all[2].retried == 1 && all[0].died == 1, "other minutes kept: \(all)")
    // From a minute on; and never more than the limit.
    let later = try await store.activity(since: m1.addingTimeInterval(30), limit: 100)
    try expect(later.map(\.minute) == [m1], "only the minute holding `since` and later: \(later)")
    let latest = try await store.activity(since: m0.addingTimeInterval(-3600), limit: 1)
    try expect(latest.map(\.minute) == [m1], "at most `limit` rows, the latest minutes: \(latest)")
    try expect(try await store.activity(since: m0, limit: 0).isEmpty, "a limit of 0 reads nothing")
    // Minutes older than the retention are deleted when newer ones are recorded.
    let old = m0.addingTimeInterval(-2 * 86_400)
    try await store.recordActivity([QueueActivity(queue: "mail", minute: old, succeeded: 7)])
    try await store.recordActivity([QueueActivity(queue: "mail", minute: m1, succeeded: 1)])
    let kept = try await store.activity(since: old.addingTimeInterval(-60), limit: 100)
    try expect(!kept.contains { $0.minute == old }, "a minute two days old is pruned: \(kept)")
    try expect(kept.first { $0.queue == "mail" && $0.minute == m1 }?.succeeded == 1, "newer minutes stay")
  }

  /// Two queue names that `String` takes for one (a precomposed and a decomposed "é") keep their
  /// own counts, recorded in one call: the databases compare names byte for byte.
  public static func equivalentNamesKeepTheirOwnCounts(_ store: any JobStore) async throws {
    let minute = QueueActivity.minute(containing: Date().addingTimeInterval(-60))
    let composed = "caf\u{E9}"
    let decomposed = "cafe\u{301}"
    try await store.recordActivity([
      QueueActivity(queue: composed, minute: minute, succeeded: 1),
      QueueActivity(queue: decomposed, minute: minute, succeeded: 2),
    ])
    let rows = try await store.activity(since: minute, limit: 10)
    let counts = rows.map { (Array($0.queue.utf8), $0.succeeded) }
    try expect(
      counts.count == 2 && counts.contains { $0.0 == Array(composed.utf8) && $0.1 == 1 }
        && counts.contains { $0.0 == Array(decomposed.utf8) && $0.1 == 2 },
      "each name its own row: \(rows.map { ($0.queue.unicodeScalars.map(\.value), $0.succeeded) })")
  }

  /// The earliest run date among ready jobs, whatever their priority; due scheduled jobs count,
  /// running and later ones do not.
  public static func oldestReady(_ store: any JobStore) async throws {
    let t0 = Date(timeIntervalSince1970: 1_700_000_000)
    func at(_ seconds: Double) -> Date { t0.addingTimeInterval(seconds) }
    func clock(_ seconds: Double) -> any JobClock { FixedJobClock(at(seconds)) }
    func job(_ priority: Int, _ seconds: Double) -> NewJob {
      NewJob(payload: Data("{}".utf8), priority: priority, runAt: at(seconds))
    }
    try expect(try await store.oldestReadyRunDate(queue: "none", clock: clock(0)) == nil, "no job: nil")
    _ = try await store.enqueue(
      [job(5, 50), job(5, 60), job(0, 20), job(3, 40), job(9, 90), job(0, 150)], queue: "q", clock: clock(100)
    )
    var oldest = try await store.oldestReadyRunDate(queue: "q", clock: clock(100))
    try expect(
      oldest == at(20), "the oldest ready job sits at the lowest priority: \(String(describing: oldest))")
    // A scheduled job only: nil before its date, its date once due (not yet promoted by a claim).
    _ = try await store.enqueue([job(0, 150)], queue: "later", clock: clock(100))
    oldest = try await store.oldestReadyRunDate(queue: "later", clock: clock(100))
    try expect(oldest == nil, "a job not yet due is not ready: \(String(describing: oldest))")
    oldest = try await store.oldestReadyRunDate(queue: "later", clock: clock(200))
    try expect(
      oldest == at(150), "a due job counts before a claim promotes it: \(String(describing: oldest))")
    // A running job is not waiting.
    let lease = Lease(owner: "w", duration: .seconds(600))
    let claimed = try await store.settleAndClaim(
      [], queue: "later", limit: 1, lease: lease, clock: clock(200))
    try expect(claimed.claimed.count == 1, "claimed the due job")
    oldest = try await store.oldestReadyRunDate(queue: "later", clock: clock(200))
    try expect(oldest == nil, "a running job is not ready: \(String(describing: oldest))")
  }
}
