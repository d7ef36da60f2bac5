import Conveyor
import ConveyorDashboard
import ConveyorTestSupport
import Foundation
import Testing

/// A workflow run's job page: its workflow, input and history, one row per step or sleep, with
/// each entry's state, failed attempts, times, and result or error, every value escaped.
@Suite struct WorkflowPageTests {
  @Test func aRunsPageShowsItsHistoryEscaped() async throws {
    let harness = try DashboardHarness()
    let run = try await WorkflowFixture.retryingRun(in: harness.store.base)
    let page = await harness.get("/jobs/\(run.rawValue)")
    #expect(page.status == 200, "\(page)")
    let body = page.body
    #expect(body.contains("<h2>Workflow run</h2>"), "\(body)")
    #expect(body.contains("Workflow <code>checkout</code>"), "\(body)")
    #expect(body.contains(#"&quot;&lt;script&gt;alert(1)&lt;\/script&gt;&quot;"#), "the input, escaped")
    #expect(!body.contains("<script>alert(1)"), "never raw")
    #expect(
      body.contains("step <code>charge</code>")
        && body.contains("<span class=\"badge completed\">completed</span>"))
    #expect(body.contains("ch_&lt;1&gt;"), "the result, escaped")
    #expect(
      body.contains("sleep <code>cool-off</code>")
        && body.contains("<span class=\"badge slept\">slept</span>"))
    #expect(
      body.contains("step <code>notify</code>")
        && body.contains("<span class=\"badge retrying\">retrying</span>"))
    #expect(body.contains("mail &lt;server&gt; down"), "the error, escaped")
  }
}

extension WorkflowPageTests {
  /// A run whose retrying step has the longest name and a long error (kept to 4,096 bytes): the
  /// page's workflow section cuts the error to 1,000 bytes, so it stays small.
  @Test func aRunsSectionCutsLongErrors() async throws {
    let harness = try DashboardHarness()
    let run = try await WorkflowFixture.retryingRun(
      in: harness.store.base, stepName: String(repeating: "n", count: 200),
      error: String(repeating: "<e>", count: 20_000))
    let body = await harness.get("/jobs/\(run.rawValue)").body
    let start = try #require(body.range(of: "<h2>Workflow run</h2>"), "no workflow section")
    let end = try #require(body.range(of: "<h2>Payload</h2>"))
    let section = body[start.lowerBound..<end.lowerBound]
    #expect(section.utf8.count < 8_000, "the workflow section takes \(section.utf8.count) bytes")
    #expect(section.contains(String(repeating: "n", count: 200)), "the whole name")
  }
}
