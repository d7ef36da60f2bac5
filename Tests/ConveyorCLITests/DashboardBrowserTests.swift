import Foundation
import Testing

/// The dashboard in a real headless Chromium (Debian `chromium`, which `.ci/run` installs): the
/// pages load under the strict Content-Security-Policy and show the seeded jobs, a filter narrows
/// the list, a click on Retry re-queues a dead job, one on Cancel cancels a waiting job, the live script updates counts, and off
/// loopback only the sign-in form shows. A screenshot of the queues page is saved (to
/// `$CONVEYOR_DASHBOARD_SCREENSHOT` when set, else the system's temporary folder).
@Suite(
  .enabled(if: Chromium.path != nil, "chromium is not installed; .ci/run installs it"),
  .timeLimit(.minutes(10)),
  .serialized)
struct DashboardBrowserTests {
  @Test func thePagesLoadAndShowTheSeededJobsAndAFilterNarrowsThem() async throws {
    let sandbox = try Sandbox()
    let jobs = try await SeededJobs.seed(sandbox)
    let dashboard = try await DashboardProcess.start(sandbox)
    let profile = URL(fileURLWithPath: sandbox.path("chromium"))

    let queues = try await Chromium.dumpDOM(dashboard.url, profile: profile)
    #expect(queues.contains(#"<tr data-queue="outbox" data-key="outbox">"#), "\(queues)")
    #expect(queues.contains(#"<tr data-queue="emails" data-key="emails">"#))

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

    // Some traffic for the screenshot's charts: a queue whose jobs a worker ran.
    try await DashboardActivityTests.add(sandbox, queue: "reports", count: 6, ["true"])
    try await DashboardActivityTests.add(sandbox, queue: "reports", count: 1, ["sh", "-c", "exit 3"])
    _ = try await sandbox.run(["--queue", "reports", "work", "--until-empty", "--max-attempts", "1"])
    try await DashboardActivityTests.add(sandbox, queue: "reports", count: 2, ["true"])
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
    // A job held behind an earlier one of its ordering key is counted in its own column, live too.
    let heldCell = "document.querySelector('tr[data-queue=\"outbox\"] [data-field=\"held\"] a')"
    #expect(try await browser.evaluate("\(heldCell).textContent") == "0")
    try await sandbox.add(["exec", "--ordering-key", "K", "--", "true"])
    try await sandbox.add(["exec", "--ordering-key", "K", "--", "true"])
    try await browser.waitUntil("the live held count", "\(heldCell).textContent === '1'")
    #expect(try await browser.evaluate("window.marker") == "same page", "updated without a reload")
    #expect(
      try await browser.evaluate("document.getElementById('updated').textContent").hasPrefix(
        "live, counts as of"))
  }

  /// A click on a waiting job's Cancel button cancels it, and the page then says so and offers
  /// no Cancel button.
  @Test func aCancelClickCancelsAWaitingJob() async throws {
    let sandbox = try Sandbox()
    let jobs = try await SeededJobs.seed(sandbox)
    let dashboard = try await DashboardProcess.start(sandbox)
    let browser = try await DrivenBrowser(
      URL(string: "jobs/\(jobs.http)", relativeTo: dashboard.url)!.absoluteURL,
      profile: URL(fileURLWithPath: sandbox.path("chromium")))
    let button = "document.querySelector('form[action=\"/jobs/\(jobs.http)/cancel\"] button')"
    try await browser.waitUntil("the Cancel button", "\(button) !== null")
    _ = try await browser.evaluate("\(button).click(), 'clicked'")
    try await browser.waitUntil("the cancelled notice", "document.body.innerText.includes('Job cancelled')")
    #expect(try await sandbox.allCounts() == allCounts(dead: 1, cancelled: 1))
    #expect(try await browser.evaluate("String(\(button) === null)") == "true", "Cancel offered again")
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

  /// The charts are SVG the browser lays out under the policy, with bars for the worker's jobs,
  /// and the script swaps in fresh ones without reloading the page.
  @Test func theChartsRenderAndUpdateLive() async throws {
    let sandbox = try Sandbox()
    try await DashboardActivityTests.add(sandbox, queue: "charts", count: 3, ["true"])
    _ = try await sandbox.succeed(["--queue", "charts", "work", "--until-empty"])
    let dashboard = try await DashboardProcess.start(sandbox)
    let browser = try await DrivenBrowser(
      dashboard.url, profile: URL(fileURLWithPath: sandbox.path("chromium")))
    let chart = "document.querySelector('[data-chart-queue=\"charts\"] svg[data-finished]')"
    try await browser.waitUntil("the throughput chart", "\(chart) !== null")
    // The stylesheet is a file of its own: the page's elements can be read before it has loaded,
    // and a bar then has the default black fill (seen once in a loaded full run).
    try await browser.waitUntil("the page and its stylesheet", "document.readyState === 'complete'")
    #expect(try await browser.evaluate("\(chart).getAttribute('data-finished')") == "3")
    // One green bar a minute the jobs ran in (two when the worker ran across a minute's turn).
    let labels = try await browser.evaluate(
      "Array.from(\(chart).querySelectorAll('g > title')).map(t => t.textContent).join('\\n')")
    let bars = DashboardActivityTests.succeededPerBar(
      labels.split(separator: "\n").map { "<g><title>\($0)</title>" }.joined())
    #expect(bars.reduce(0, +) == 3 && (1...2).contains(bars.count), "\(labels)")
    #expect(
      try await browser.evaluate("String(\(chart).querySelectorAll('rect.ok').length)") == String(bars.count))
    // Laid out: the SVG has a size, and its bar has a height and the stylesheet's colour.
    #expect(try await browser.evaluate("String(\(chart).getBoundingClientRect().width > 100)") == "true")
    #expect(
      try await browser.evaluate("String(\(chart).querySelector('rect.ok').getBBox().height > 10)") == "true")
    #expect(
      try await browser.evaluate("getComputedStyle(\(chart).querySelector('rect.ok')).fill")
        == "rgb(31, 122, 63)")
    _ = try await browser.evaluate("window.marker = 'same page', 'marked'")
    try await DashboardActivityTests.add(sandbox, queue: "charts", count: 2, ["true"])
    _ = try await sandbox.succeed(["--queue", "charts", "work", "--until-empty"])
    try await browser.waitUntil("the live chart", "\(chart).getAttribute('data-finished') === '5'")
    #expect(try await browser.evaluate("window.marker") == "same page", "updated without a reload")
  }

  /// Queue names with CR or NUL (stored by an application's own INSERT): the browser rewrites
  /// them in the rows' attributes, and the script, which compared names, reloaded the page every
  /// 3 s. It matches rows by their percent-encoded key now: the page stays, and updates live.
  @Test func queueNamesWithControlCharactersKeepThePageStill() async throws {
    let sandbox = try Sandbox()
    try await sandbox.add(["exec", "--", "true"])
    try DashboardTests.insertJobs(sandbox, queues: ["line\rbreak", "nul\0byte"])
    let dashboard = try await DashboardProcess.start(sandbox)
    let browser = try await DrivenBrowser(
      dashboard.url, profile: URL(fileURLWithPath: sandbox.path("chromium")))
    try await browser.waitUntil("the queues page", "document.querySelectorAll('tr[data-queue]').length === 3")
    _ = try await browser.evaluate("window.marker = 'same page', 'marked'")
    // The script's first refresh, 3 s in, either reloads the page or marks it live.
    try await browser.waitUntil(
      "a live refresh", "(document.getElementById('updated') || {}).textContent.startsWith('live')")
    #expect(try await browser.evaluate("window.marker") == "same page", "the page was reloaded")
  }

  /// The dashboard behind a TLS-terminating proxy, as the README advises off loopback: a browser
  /// on the https page signs in and retries a dead job. First behind a proxy that keeps the
  /// `Host` (matched by host and port, whatever the scheme), then behind one that rewrites it, as
  /// nginx does by default (matched by `--public-url`). Every POST was refused 403 before.
  @Test(
    .enabled(if: TLSProxy.isAvailable, "python3 and openssl make the TLS proxy"),
    arguments: [TLSProxy.HostHandling.keep, .rewrite])
  func signInAndActionsWorkBehindATLSProxy(host: TLSProxy.HostHandling) async throws {
    let sandbox = try Sandbox()
    let jobs = try await SeededJobs.seed(sandbox)
    let token = "correct-horse-battery-staple"
    let proxy = try await TLSProxy(in: sandbox.folder, host: host)
    let publicURL = "https://127.0.0.1:\(proxy.port)"
    let tokenFile = sandbox.path("token")
    try #require(FileManager.default.createFile(atPath: tokenFile, contents: Data(token.utf8)))
    let dashboard = try await DashboardProcess.start(
      sandbox,
      host == .keep
        ? ["--listen", "0.0.0.0:0", "--token", token]
        : ["--listen", "127.0.0.1:0", "--token-file", tokenFile, "--public-url", publicURL])
    proxy.forward(to: dashboard.port)
    let browser = try await DrivenBrowser(
      try #require(URL(string: publicURL + "/")), profile: URL(fileURLWithPath: sandbox.path("chromium")),
      flags: ["--ignore-certificate-errors"])
    try await browser.waitUntil(
      "the sign-in form", "document.querySelector('input[name=\"token\"]') !== null")
    _ = try await browser.evaluate(
      "document.querySelector('input[name=\"token\"]').value = '\(token)', "
        + "document.querySelector('form.sign-in').submit(), 'sent'")
    try await browser.waitUntil(
      "the queues page", "document.querySelector('tr[data-queue=\"outbox\"]') !== null")
    _ = try await browser.evaluate("location.href = '/jobs?queue=outbox&state=dead', 'going'")
    let button = "document.querySelector('form[action=\"/jobs/\(jobs.dead)/retry\"] button')"
    try await browser.waitUntil("the Retry button", "\(button) !== null")
    _ = try await browser.evaluate("\(button).click(), 'clicked'")
    try await browser.waitUntil("the re-queued notice", "document.body.innerText.includes('Job re-queued')")
    #expect(try await sandbox.counts() == counts(ready: 2))
    #expect(try await browser.evaluate("location.protocol") == "https:")
  }
}
