import Conveyor
import ConveyorTestSupport
import Testing

@testable import ConveyorPostgres

/// Summaries on PostgreSQL: the listing's pages, each payload sent up to its first bytes.
@Suite("PostgresJobStore job summaries")
struct PostgresJobSummaryTests {
  @Test func summaryPagesMatchTheListing() async throws {
    let server = try await PostgresServer.shared()
    let store = try await PostgresJobStore.open(url: server.url, options: .init(schema: uniqueSchema()))
    try await JobSummaryChecks.pagesMatchTheListing(store)
    await store.close()
  }
}
