import Conveyor
import ConveyorTestSupport
import Testing

/// Summaries on the in-memory store: whole records read and their payloads cut (the default).
@Suite struct InMemoryJobSummaryTests {
  @Test func summaryPagesMatchTheListing() async throws {
    try await JobSummaryChecks.pagesMatchTheListing(InMemoryJobStore())
  }
}
