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
