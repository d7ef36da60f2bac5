import Conveyor
import ConveyorPostgres
import ConveyorTestSupport
import Foundation
import Testing

@Suite("PostgresJobStore activity and oldest ready job")
struct PostgresActivityTests {
  @Test func activityIsRecordedAndRead() async throws {
    let server = try await PostgresServer.shared()
    let store = try await PostgresJobStore.open(url: server.url, options: .init(schema: uniqueSchema()))
    try await ActivityChecks.recordAndRead(store)
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
}
