import Foundation
import Testing

/// The dashboard in a real headless Chromium (Debian `chromium`, which `.ci/run` installs): the
/// pages load under the strict Content-Security-Policy and show the seeded jobs, a filter narrows
/// the list, a click on Retry re-queues a dead job, the live script updates counts, and off
/// loopback only the sign-in form shows. A screenshot of the queues page is saved (to
/// `$CONVEYOR_DASHBOARD_SCREENSHOT` when set, else the system's temporary folder).
@Suite(
  .enabled(if: Chromium.path != nil, "chromium is not installed; .ci/run installs it"),
  .timeLimit(.minutes(4)),
  .serialized)
struct DashboardBrowserTests {
  @Test func thePagesLoadAndShowTheSeededJobsAndAFilterNarrowsThem() async throws {
    let sandbox = try Sandbox()
    let jobs = try await SeededJobs.seed(sandbox)
    let dashboard = try await DashboardProcess.start(sandbox)
    let profile = URL(fileURLWithPath: sandbox.path("chromium"))

    let queues = try await Chromium.dumpDOM(dashboard.url, profile: profile)
    #expect(queues.contains(#"<tr data-queue="outbox">"#), "\(queues)")
    #expect(queues.contains(#"<tr data-queue="emails">"#))

    let list = try await Chromium.dumpDOM(
      dashboard.url.appendingPathComponent("jobs").appending(queryItems: [
        .init(name: "queue", value: "outbox")
      ]),
      profile: profile)
    #expect(
      list.contains("<tr data-job=\"\(jobs.dead)\">") && list.contains("<tr data-job=\"\(jobs.http)\">"))
    // The hostile error is text in the DOM, not an element.
    #expect(list.contains("&lt;script&gt;alert(\"pwned\")&lt;/script&gt;"))
    #expect(!list.contains("<script>alert"))

    let dead = try await Chromium.dumpDOM(
      URL(string: "jobs?queue=outbox&state=dead", relativeTo: dashboard.url)!, profile: profile)
    #expect(dead.contains("<tr data-job=\"\(jobs.dead)\">"))
    #expect(!dead.contains("<tr data-job=\"\(jobs.http)\">"), "the state filter narrows the list")

    let shot =
      ProcessInfo.processInfo.environment["CONVEYOR_DASHBOARD_SCREENSHOT"].map {
        URL(fileURLWithPath: $0)
      } ?? FileManager.default.temporaryDirectory.appendingPathComponent("conveyor-dashboard-queues.png")
    try await Chromium.screenshot(dashboard.url, to: shot, profile: profile)
    let png = try Data(contentsOf: shot)
    #expect(png.starts(with: [0x89, 0x50, 0x4E, 0x47]) && png.count > 5000, "a PNG at \(shot.path)")
    print("dashboard screenshot: \(shot.path)")
  }

  @Test func aRetryClickRequeuesADeadJobAndTheCountsUpdateLive() async throws {
    let sandbox = try Sandbox()
    let jobs = try await SeededJobs.seed(sandbox)
    let dashboard = try await DashboardProcess.start(sandbox)
    let browser = try await DrivenBrowser(
      URL(string: "jobs?queue=outbox&state=dead", relativeTo: dashboard.url)!.absoluteURL,
      profile: URL(fileURLWithPath: sandbox.path("chromium")))
    let button = "document.querySelector('form[action=\"/jobs/\(jobs.dead)/retry\"] button')"
    try await browser.waitUntil("the Retry button", button)
    _ = try await browser.evaluate("\(button).click(), 'clicked'")
    try await browser.waitUntil("the re-queued notice", "document.body.innerText.includes('Job re-queued')")
    #expect(try await sandbox.counts() == counts(ready: 2))

    // The queues page's script (same-origin, allowed by the policy) refreshes counts in place.
    _ = try await browser.evaluate("location.href = '/', 'going'")
    let readyCell = "document.querySelector('tr[data-queue=\"outbox\"] [data-field=\"ready\"] a')"
    try await browser.waitUntil("the queues page", "\(readyCell) && \(readyCell).textContent === '2'")
    _ = try await browser.evaluate("window.marker = 'same page', 'marked'")
    try await sandbox.add(["exec", "--", "true"])
    try await browser.waitUntil("the live count", "\(readyCell).textContent === '3'")
    #expect(try await browser.evaluate("window.marker") == "same page", "updated without a reload")
    #expect(
      try await browser.evaluate("document.getElementById('updated').textContent").hasPrefix(
        "live, counts as of"))
  }

  @Test func offLoopbackTheBrowserSeesOnlyTheSignInForm() async throws {
    let sandbox = try Sandbox()
    _ = try await SeededJobs.seed(sandbox)
    let dashboard = try await DashboardProcess.start(
      sandbox, ["--listen", "0.0.0.0:0", "--token", "correct-horse-battery-staple"])
    let page = try await Chromium.dumpDOM(
      URL(string: "http://127.0.0.1:\(dashboard.port)/")!,
      profile: URL(fileURLWithPath: sandbox.path("chromium")))
    #expect(page.contains("Sign in"))
    #expect(page.contains(#"<input type="password" name="token""#))
    #expect(!page.contains("data-queue"))
  }
}
