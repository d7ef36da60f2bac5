import Conveyor
import ConveyorDashboard
import ConveyorSQLite
import ConveyorTestSupport
import Foundation
import Testing

/// A queue's stored concurrency limit on the queues page, its jobs page and `/api/queues`. The
/// dashboard here is over the SQLite store itself: the harness's ``InstrumentedJobStore`` does
/// not pass limits on (it answers none), so it cannot show one.
@Suite struct LimitsPageTests {
  let folder: TemporaryFolder
  let store: SQLiteJobStore
  let dashboard: Dashboard
  let clock = SystemJobClock()

  init() throws {
    folder = try TemporaryFolder(prefix: "conveyor-dashboard-limits")
    store = try SQLiteJobStore(path: folder.path("jobs.sqlite"))
    dashboard = try Dashboard(store: store)
  }

  func get(_ target: String) async -> Answer {
    Answer(
      await dashboard.respond(
        to: DashboardRequest(method: "GET", target: target, headers: [("Host", DashboardHarness.host)])))
  }

  @Test func theQueuesPageAndTheAPIShowEachQueuesLimit() async throws {
    let odd = "<b>\"odd\" & 'q'</b>"
    for queue in ["mail", odd] {
      _ = try await store.enqueue([NewJob(payload: Data("{}".utf8))], queue: queue, clock: clock)
    }
    try await store.setLimits(QueueLimits(concurrency: 7), queue: odd)

    let api = await get("/api/queues")
    #expect(api.status == 200)
    let body = try #require(try JSONSerialization.jsonObject(with: api.response.body) as? [String: Any])
    let queues = try #require(body["queues"] as? [[String: Any]])
    let limits = Dictionary(
      uniqueKeysWithValues: queues.map { ($0["name"] as? String ?? "", $0["concurrency"]) })
    #expect(limits[odd] as? Int == 7, "\(queues)")
    #expect(limits["mail"].map { $0 is NSNull } == true, "present and null without a limit: \(queues)")

    let page = await get("/")
    #expect(page.status == 200)
    #expect(page.body.contains(">Limit</th>"))
    #expect(!page.body.contains(odd), "the name is escaped")
    let oddRow = try #require(
      page.body.components(separatedBy: "<tr data-queue=\"&lt;b&gt;").dropFirst().first, "\(page)")
    #expect(oddRow.contains(#"title="At most 7 running at once, across every worker">7</td>"#), "\(oddRow)")
    let mailRow = try #require(page.body.components(separatedBy: #"<tr data-queue="mail""#).dropFirst().first)
    #expect(mailRow.contains(#"data-field="concurrency" title="No concurrency limit"#), "\(mailRow)")
    #expect(mailRow.contains(">—</td>"))

    // The script reloads the page when a limit changes, comparing the cell with the JSON.
    let script = await get("/static/dashboard.js")
    #expect(script.body.contains(#"queue.concurrency === null ? "—" : String(queue.concurrency)"#))
  }

  @Test func aQueuesJobsPageSaysWhenTheLimitKeepsReadyJobsWaiting() async throws {
    for _ in 0..<3 {
      _ = try await store.enqueue([NewJob(payload: Data("{}".utf8))], queue: "mail", clock: clock)
    }
    var page = await get("/jobs?queue=mail")
    #expect(!page.body.contains("Concurrency limit"), "none set")

    try await store.setLimits(QueueLimits(concurrency: 2), queue: "mail")
    page = await get("/jobs?queue=mail")
    #expect(
      page.body.contains(
        #"<p class="limits" data-field="limits">Concurrency limit: at most 2 running at once, across every worker.</p>"#
      ), "\(page)")

    let lease = Lease(owner: "test", duration: .seconds(600))
    let claimed = try await store.settleAndClaim([], queue: "mail", limit: 3, lease: lease, clock: clock)
    #expect(claimed.claimed.count == 2, "the store claims up to the limit")
    page = await get("/jobs?queue=mail")
    #expect(
      page.body.contains(
        "Concurrency limit: at most 2 running at once, across every worker. Limit reached: 1 ready job waits "
          + "for a place."), "\(page)")
  }

  /// A stored rate on the queue's jobs page, in `/api/queues` (`null` without one) and in
  /// `/metrics` (no sample without one).
  @Test func theJobsPageTheAPIAndTheMetricsShowTheRate() async throws {
    for queue in ["mail", "sms"] {
      _ = try await store.enqueue([NewJob(payload: Data("{}".utf8))], queue: queue, clock: clock)
    }
    try await store.setLimits(
      QueueLimits(concurrency: 2, rate: RateLimit(perSecond: 0.5, burst: 4)), queue: "mail")
    let page = await get("/jobs?queue=mail")
    #expect(
      page.body.contains(
        "Concurrency limit: at most 2 running at once, across every worker. Rate limit: at most 30/min "
          + "(bursts of 4) starting, across every worker.</p>"), "\(page)")
    #expect(!(await get("/jobs?queue=sms")).body.contains("Rate limit"))
    let queuesPage = await get("/").body
    #expect(
      queuesPage.contains(
        #"title="At most 2 running at once, across every worker; at most 30/min (bursts of 4) starting">2</td>"#
      ),
      "the queues page names the rate where it names the limit: \(queuesPage)")

    let api = await get("/api/queues")
    let body = try #require(try JSONSerialization.jsonObject(with: api.response.body) as? [String: Any])
    let queues = try #require(body["queues"] as? [[String: Any]])
    let rates = Dictionary(uniqueKeysWithValues: queues.map { ($0["name"] as? String ?? "", $0["rate"]) })
    let mail = try #require(rates["mail"] as? [String: Any], "\(queues)")
    #expect(mail["perSecond"] as? Double == 0.5 && mail["burst"] as? Int == 4, "\(queues)")
    #expect(rates["sms"].map { $0 is NSNull } == true, "present and null without a rate: \(queues)")

    let metrics = await get("/metrics").body
    #expect(metrics.contains("conveyor_queue_rate_limit_per_second{queue=\"mail\"} 0.5\n"), "\(metrics)")
    #expect(metrics.contains("conveyor_queue_rate_limit_burst{queue=\"mail\"} 4\n"), "\(metrics)")
    #expect(!metrics.contains("rate_limit_per_second{queue=\"sms\"}"), "\(metrics)")
  }

  /// Limits per key on the queue's jobs page, and a job held for its key's limit marked as such in
  /// the list and on its own page.
  @Test func theJobsPageShowsLimitsPerKeyAndWhyAJobIsHeld() async throws {
    try await store.setLimits(
      QueueLimits(keyConcurrency: 1, keyConcurrencyOverrides: ["b": 2]), queue: "mail")
    _ = try await store.enqueue(
      [NewJob(payload: Data("{}".utf8), limitKey: "a"), NewJob(payload: Data("{}".utf8), limitKey: "a")],
      queue: "mail", clock: clock)
    let lease = Lease(owner: "test", duration: .seconds(600))
    let claimed = try await store.settleAndClaim([], queue: "mail", limit: 5, lease: lease, clock: clock)
    #expect(claimed.claimed.count == 1, "one of key a")
    let page = await get("/jobs?queue=mail")
    #expect(
      page.body.contains(
        "Limit per key: at most 1 running at once for each limit key. 1 key has its own limit; jobs held for "
          + "their key&#39;s limit say so (held by the limit of key …).</p>")
        || page.body.contains(
          "Limit per key: at most 1 running at once for each limit key. 1 key has its own limit; jobs held for "
            + "their key's limit say so (held by the limit of key …).</p>"),
      "\(page)")
    #expect(page.body.contains("held by the limit of key <code>a</code>"), "\(page)")
    let job = await get("/jobs/2")
    #expect(job.body.contains("Held by the limit of key <code>a</code>"), "\(job)")
  }

  /// The queue's jobs page lists its keys with a limit: each key's running jobs, limit and held
  /// jobs, the keys holding most first, then those with a limit of their own and no job, escaped;
  /// past 20 keys it says more have a limit.
  @Test func theJobsPageListsEachKeyWithALimit() async throws {
    try await store.setLimits(
      QueueLimits(
        keyConcurrency: 1, keyConcurrencyOverrides: ["<b>idle</b>": 3],
        keyRateOverrides: ["slow": RateLimit(perSecond: 1.0 / 30)]), queue: "mail")
    _ = try await store.enqueue(
      ["a", "a", "a", "b"].map { NewJob(payload: Data("{}".utf8), limitKey: $0) }, queue: "mail", clock: clock
    )
    let lease = Lease(owner: "test", duration: .seconds(600))
    _ = try await store.settleAndClaim([], queue: "mail", limit: 5, lease: lease, clock: clock)
    let page = await get("/jobs?queue=mail")
    let rows = page.body.components(separatedBy: "<tr><td class=\"key\">").dropFirst().map {
      $0.components(separatedBy: "</tr>")[0]
    }
    #expect(
      rows == [
        "a</td><td class=\"count\">1</td><td class=\"count\">1</td><td>—</td><td class=\"count\">2</td>",
        "b</td><td class=\"count\">1</td><td class=\"count\">1</td><td>—</td><td class=\"count\">0</td>",
        "&lt;b&gt;idle&lt;/b&gt;</td><td class=\"count\">0</td><td class=\"count\">3</td><td>—</td><td class=\"count\">0</td>",
        "slow</td><td class=\"count\">0</td><td class=\"count\">1</td><td>2/min</td><td class=\"count\">0</td>",
      ], "\(page)")
    #expect(!page.body.contains("More keys have a limit"), "\(page)")
    _ = try await store.enqueue(
      (0..<25).map { NewJob(payload: Data("{}".utf8), limitKey: "k\($0)") }, queue: "mail", clock: clock)
    _ = try await store.settleAndClaim([], queue: "mail", limit: 30, lease: lease, clock: clock)
    let many = await get("/jobs?queue=mail")
    #expect(many.body.components(separatedBy: "<tr><td class=\"key\">").count == 21, "20 keys listed")
    #expect(many.body.contains("More keys have a limit than are listed"), "\(many)")
    let other = await get("/jobs?queue=none")
    #expect(!other.body.contains("class=\"keys\""), "no table without limits per key")
  }

  /// `/metrics` and `/api/queues` list each stored queue once, by its bytes: two queues whose
  /// names are canonically equivalent (the store keeps them apart) are two queues, each with its
  /// own limit sample. The metrics are compared line by line as bytes (`String`'s `==` would take
  /// the two names for one).
  @Test func canonicallyEquivalentQueueNamesEachKeepTheirLimitSample() async throws {
    let composed = "caf\u{E9}"
    let decomposed = "cafe\u{301}"
    _ = try await store.enqueue([NewJob(payload: Data("{}".utf8))], queue: decomposed, clock: clock)
    try await store.setLimits(QueueLimits(concurrency: 3), queue: composed)
    // Each queue's last hour is its own: 2 jobs succeeded in one, 5 in the other.
    try await store.recordActivity([
      QueueActivity(queue: composed, minute: Date(), succeeded: 2),
      QueueActivity(queue: decomposed, minute: Date(), succeeded: 5),
    ])
    let stored = try await store.queueNames().map { $0.unicodeScalars.map { String($0.value, radix: 16) } }
    #expect(
      stored == [["63", "61", "66", "65", "301"], ["63", "61", "66", "e9"]], "the store lists both: \(stored)"
    )

    let metrics = await get("/metrics")
    let lines = metrics.response.body.split(separator: UInt8(ascii: "\n")).map { Array($0) }
    let limitLine = Array("conveyor_queue_concurrency_limit{queue=\"\(composed)\"} 3".utf8)
    let sampled = lines.contains(limitLine)
    #expect(sampled, "the composed queue's limit has its sample:\n\(metrics.body)")
    for name in [composed, decomposed] {
      let paused = Array("conveyor_queue_paused{queue=\"\(name)\"} 0".utf8)
      let samples = lines.filter { $0 == paused }.count
      #expect(
        samples == 1,
        "one paused sample for \(name.unicodeScalars.map { String($0.value, radix: 16) }):\n\(metrics.body)")
    }
    for (name, succeeded) in [(composed, 2), (decomposed, 5)] {
      let line = Array(
        "conveyor_jobs_finished_last_hour{queue=\"\(name)\",outcome=\"succeeded\"} \(succeeded)".utf8)
      #expect(lines.contains(line), "\(succeeded) succeeded in its own last hour:\n\(metrics.body)")
    }

    let api = await get("/api/queues")
    let body = try #require(try JSONSerialization.jsonObject(with: api.response.body) as? [String: Any])
    let queues = try #require(body["queues"] as? [[String: Any]])
    let names = queues.compactMap {
      ($0["name"] as? String)?.unicodeScalars.map { String($0.value, radix: 16) }
    }
    #expect(
      names == [["63", "61", "66", "65", "301"], ["63", "61", "66", "e9"]], "both queues listed: \(queues)")
  }

  /// The limit's sample escapes the queue's name as the other samples do: a backslash, a quote
  /// and a newline, each escaped once; other text (here a tab and an emoji) as it is.
  @Test func theLimitSampleEscapesTheQueuesName() async throws {
    let name = "a\\b\"c\nd\te😀"
    try await store.setLimits(QueueLimits(concurrency: QueueLimits.maximumConcurrency), queue: name)
    let metrics = await get("/metrics").body
    let label = #"a\\b\"c\nd"# + "\te😀"
    #expect(metrics.contains("conveyor_queue_concurrency_limit{queue=\"\(label)\"} 1000000\n"), "\(metrics)")
    #expect(metrics.contains("conveyor_queue_paused{queue=\"\(label)\"} 0\n"), "\(metrics)")
    try await store.setLimits(QueueLimits(), queue: name)
    let after = await get("/metrics").body
    #expect(!after.contains("a\\\\b"), "no longer listed once the limit is removed: \(after)")
  }
}
