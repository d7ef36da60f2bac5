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
}
