import Conveyor
import ConveyorTestSupport
import Testing

@testable import ConveyorSQLite

/// Summaries on a real SQLite file: the listing's pages, each payload read up to its first bytes
/// by incremental blob I/O.
@Suite("SQLite job summaries")
struct SQLiteJobSummaryTests {
  @Test func summaryPagesMatchTheListing() async throws {
    let folder = try TemporaryFolder()
    try await JobSummaryChecks.pagesMatchTheListing(try makeStore(folder))
  }

  /// Past the listing's window of 256 rows, a small queue's page comes from its indexes: the same
  /// jobs as `jobs(…)`, with summaries.
  @Test func summaryPagesMatchTheListingBeyondTheWindow() async throws {
    let folder = try TemporaryFolder()
    let store = try makeStore(folder)
    _ = try await store.enqueue(
      (0..<300).map { NewJob(payload: payload("big \($0)"), runAt: epoch) }, queue: "big", now: epoch)
    _ = try await store.enqueue(
      (0..<5).map { NewJob(payload: payload("small \($0)"), runAt: epoch) }, queue: "small", now: epoch)
    let records = try await store.jobs(queue: "small", status: .pending, after: nil, limit: 10)
    let summaries = try await store.jobSummaries(
      queue: "small", status: .pending, after: nil, limit: 10, payloadPrefix: 3)
    #expect(records.count == 5)
    #expect(summaries.map(\.id) == records.map(\.id))
    #expect(
      summaries.map { String(decoding: $0.record.payload, as: UTF8.self) }
        == Array(repeating: "sma", count: 5))
    #expect(summaries.map(\.payloadSize) == records.map(\.payload.count))
  }
}
