import Conveyor
import ConveyorTestSupport
import Foundation
import Testing

@testable import ConveyorPostgres

@Suite("PostgresJobStore activity and oldest ready job")
struct PostgresActivityTests {
  @Test func activityIsRecordedAndRead() async throws {
    let server = try await PostgresServer.shared()
    let store = try await PostgresJobStore.open(url: server.url, options: .init(schema: uniqueSchema()))
    try await ActivityChecks.recordAndRead(store)
    await store.close()
  }

  @Test func equivalentQueueNamesKeepTheirOwnCounts() async throws {
    let server = try await PostgresServer.shared()
    let store = try await PostgresJobStore.open(url: server.url, options: .init(schema: uniqueSchema()))
    try await ActivityChecks.equivalentNamesKeepTheirOwnCounts(store)
    await store.close()
  }

  /// With the callers' clock, so the check can drive time.
  @Test func theOldestReadyJobIsFoundAcrossPriorityLevels() async throws {
    let server = try await PostgresServer.shared()
    let store = try await PostgresJobStore.open(
      url: server.url, options: .init(schema: uniqueSchema(), clock: .caller))
    try await ActivityChecks.oldestReady(store)
    await store.close()
  }

  /// With the database's clock, the date comes back on the caller's clock: a job added now is
  /// about zero seconds old for a caller whose clock is an hour ahead of the server's.
  @Test func theOldestReadyDateIsOnTheCallersClock() async throws {
    let server = try await PostgresServer.shared()
    let store = try await PostgresJobStore.open(url: server.url, options: .init(schema: uniqueSchema()))
    let ahead = FixedJobClock(Date().addingTimeInterval(3600))
    _ = try await store.enqueue([NewJob(payload: Data("{}".utf8))], queue: "q", clock: ahead)
    let oldest = try #require(try await store.oldestReadyRunDate(queue: "q", clock: ahead))
    let age = ahead.now().timeIntervalSince(oldest)
    #expect(age >= -1 && age < 60, "age on the caller's clock: \(age)")
    await store.close()
  }

  /// The oldest-ready query and the chart's read use their indexes on a backlog (checked with
  /// `EXPLAIN ANALYZE` of their generic plans after `ANALYZE`): no sequential scan of the jobs or
  /// activity table.
  @Test func theQueriesUseTheirIndexes() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema()
    let store = try await PostgresJobStore.open(url: server.url, options: .init(schema: schema))
    for _ in 0..<4 {
      _ = try await store.enqueue(
        (0..<5_000).map { NewJob(payload: Data("{}".utf8), priority: $0 % 3) }, queue: "big",
        clock: SystemJobClock())
    }
    _ = try await store.enqueue([NewJob(payload: Data("{}".utf8))], queue: "small", clock: SystemJobClock())
    // A day of minutes for 50 queues: the last hour is a small part of it.
    let now = Date()
    try await store.recordActivity(
      (0..<50).flatMap { queue in
        (0..<1_400).map {
          QueueActivity(queue: "q\(queue)", minute: now.addingTimeInterval(-60 * Double($0)), succeeded: 1)
        }
      })
    let admin = try AdminConnection(server.url)
    _ = try await admin.queryOffPool("ANALYZE \(schema).jobs; ANALYZE \(schema).activity")
    func plan(_ sql: String, _ types: String, _ values: String) throws -> String {
      let name = "p\(UInt32.random(in: 0...UInt32.max))"
      _ = try admin.query("PREPARE \(name)(\(types)) AS \(sql)")
      // Planned once for every value, as the store's connections plan their statements.
      _ = try admin.query("SET plan_cache_mode = force_generic_plan")
      return try admin.query("EXPLAIN (ANALYZE, COSTS OFF) EXECUTE \(name)(\(values))").compactMap {
        $0.first ?? nil
      }
      .joined(separator: "\n")
    }
    let oldest = try plan(store.sql.oldestReady, "text, timestamptz, int8", "'small', NULL, 100")
    #expect(oldest.contains("jobs_ready") && !oldest.contains("Seq Scan on jobs"), "\(oldest)")
    let levels = try plan(store.sql.oldestReady, "text, timestamptz, int8", "'big', NULL, 100")
    #expect(levels.contains("jobs_ready") && !levels.contains("Seq Scan on jobs"), "\(levels)")
    let read = try plan(store.sql.readActivity, "timestamptz, int8", "now() - interval '1 hour', 60000")
    #expect(read.contains("activity_minute") && !read.contains("Seq Scan on activity"), "\(read)")
    #expect(try await store.activity(since: now.addingTimeInterval(-3_540), limit: 100_000).count == 50 * 60)
    #expect(try await store.oldestReadyRunDate(queue: "big", clock: SystemJobClock()) != nil)
    await store.close()
  }

  /// Rows are merged by the name's bytes, then written under `storable(name)` (NUL as U+FFFD): two
  /// names that differ only there become one key twice in one `INSERT … ON CONFLICT DO UPDATE`.
  @Test func activityOfNamesThatStoreAlikeIsRecorded() async throws {
    let store = try await openCallerClockStore()
    let minute = QueueActivity.minute(containing: Date().addingTimeInterval(-60))
    do {
      try await store.recordActivity([
        QueueActivity(queue: "a\0b", minute: minute, succeeded: 1),
        QueueActivity(queue: "a\u{FFFD}b", minute: minute, succeeded: 2),
        QueueActivity(queue: "mail", minute: minute, succeeded: 5),
      ])
    } catch {
      Issue.record("recordActivity failed (every queue's counts lost): \(error)")
    }
    let rows = try await store.activity(since: minute, limit: 10)
    #expect(
      rows.reduce(0) { $0 + $1.succeeded } == 8,
      "rows: \(rows.map { (scalarsInHex($0.queue), $0.succeeded) })")
    await store.close()
  }

  /// `activity(since:limit:)` is sorted by queue and then minute with `String`'s `<`: two
  /// equivalent names' minutes interleave.
  @Test func activityOfEquivalentNamesIsNotInterleaved() async throws {
    let store = try await openCallerClockStore()
    let composed = "caf\u{E9}"
    let decomposed = "cafe\u{301}"
    let m1 = QueueActivity.minute(containing: Date().addingTimeInterval(-600))
    try await store.recordActivity([
      QueueActivity(queue: composed, minute: m1, succeeded: 1),
      QueueActivity(queue: decomposed, minute: m1.addingTimeInterval(60), succeeded: 2),
      QueueActivity(queue: composed, minute: m1.addingTimeInterval(120), succeeded: 3),
    ])
    let rows = try await store.activity(since: m1, limit: 10)
    #expect(
      rows.map { scalarsInHex($0.queue) } == [
        scalarsInHex(decomposed), scalarsInHex(composed), scalarsInHex(composed),
      ],
      "rows: \(rows.map { (scalarsInHex($0.queue), $0.succeeded) })")
    await store.close()
  }
}
