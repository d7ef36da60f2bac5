import Conveyor
import ConveyorSQLite
import Foundation
import Testing

/// The queues page's "Last hour" charts and oldest-ready age, from real jobs run by a real worker
/// process: the dashboard is another process and reads what the worker left in the store.
@Suite(.timeLimit(.minutes(10))) struct DashboardActivityTests {
  /// Adds `count` exec jobs running `command` to `queue`.
  static func add(_ sandbox: Sandbox, queue: String, count: Int, _ command: [String]) async throws {
    for _ in 0..<count {
      try await sandbox.succeed(["--queue", queue, "add", "exec", "--"] + command)
    }
  }

  @Test func aWorkersJobsShowAsThroughputAndWaitAndAReadyJobHasAnAge() async throws {
    let sandbox = try Sandbox()
    try await Self.add(sandbox, queue: "charts", count: 3, ["true"])
    try await Self.add(sandbox, queue: "charts", count: 1, ["sh", "-c", "exit 3"])
    let work = try await sandbox.run(["--queue", "charts", "work", "--until-empty", "--max-attempts", "1"])
    #expect(work.status == 1, "one job died: \(work)")
    let dashboard = try await DashboardProcess.start(sandbox)

    // The queue holds only the dead job; its row and its charts are there, with the worker's counts.
    var page = try await dashboard.get("/")
    #expect(page.status == 200)
    let row = try #require(Self.section(page.body, #"<div class="activity-row" data-chart-queue="charts">"#))
    #expect(row.contains(#"data-finished="4""#), "3 succeeded and 1 died in the last hour:\n\(row)")
    #expect(row.contains(#"data-started="4""#), "4 first starts measured:\n\(row)")
    // The jobs ran in one minute or, across a minute's turn, in two: a bar for each, 3 in all.
    let bars = Self.succeededPerBar(row)
    #expect(
      bars.reduce(0, +) == 3 && (1...2).contains(bars.count), "3 successes in one or two minutes:\n\(row)")
    #expect(
      row.components(separatedBy: #"<rect class="ok""#).count - 1 == bars.count,
      "a green bar a minute:\n\(row)")
    #expect(row.contains(#"<rect class="died""#))
    #expect(row.contains("4 finished: 3 succeeded, 0 retried, 1 died"))
    #expect(row.contains("Wait to start: mean "))
    // No job is ready: no age.
    #expect(page.body.contains(#"<td class="count" data-field="oldest">—</td>"#), "\(page.body)")

    // A job that waits: the age shows, on the page, in /api/queues and in /metrics.
    try await Self.add(sandbox, queue: "charts", count: 1, ["true"])
    page = try await dashboard.get("/")
    let age = try #require(
      page.body.range(of: #"data-field="oldest">[0-9.]+ (ms|s|min)</td>"#, options: .regularExpression),
      "an age in the oldest-ready cell:\n\(page.body)")
    _ = age
    let api = try await dashboard.get("/api/queues")
    #expect(api.body.contains(#""oldestReadyAge":"#), "\(api.body)")
    let metrics = try await dashboard.get("/metrics")
    #expect(metrics.status == 200)
    #expect(
      metrics.body.range(
        of: #"conveyor_queue_oldest_ready_age_seconds\{queue="charts"\} [0-9]+\.[0-9]{3}\n"#,
        options: .regularExpression) != nil, "\(metrics.body)")
    #expect(
      metrics.body.contains("conveyor_jobs_finished_last_hour{queue=\"charts\",outcome=\"succeeded\"} 3\n"))
    #expect(metrics.body.contains("conveyor_jobs_finished_last_hour{queue=\"charts\",outcome=\"died\"} 1\n"))
    #expect(metrics.body.contains("conveyor_job_wait_seconds_last_hour{queue=\"charts\",stat=\"max\"} "))

    // The fragment the live script swaps in: the same section, alone.
    let fragment = try await dashboard.get("/api/activity")
    #expect(fragment.status == 200 && fragment.headers["content-type"]?.hasPrefix("text/html") == true)
    #expect(
      fragment.body.hasPrefix(#"<section id="activity""#) && fragment.body.contains(#"data-finished="4""#))
    #expect(!fragment.body.contains("<script"))
  }

  /// A queue whose every job was handled still shows, for its chart.
  @Test func aQueueWithNoJobsLeftIsListedForItsActivity() async throws {
    let sandbox = try Sandbox()
    try await Self.add(sandbox, queue: "done", count: 2, ["true"])
    _ = try await sandbox.succeed(["--queue", "done", "work", "--until-empty"])
    let dashboard = try await DashboardProcess.start(sandbox)
    let page = try await dashboard.get("/")
    #expect(page.body.contains(#"<tr data-queue="done" data-key="done">"#), "\(page.body)")
    #expect(Self.section(page.body, #"data-chart-queue="done">"#)?.contains(#"data-finished="2""#) == true)
  }

  /// A chart whose jobs succeeded in two minutes (a worker that ran across a minute's turn) has a
  /// bar for each, and ``succeededPerBar(_:)`` reads both: the tests above count successes by
  /// the bars' labels, not by assuming that a quick worker's jobs share one minute. A minute in
  /// which a job only died (the failing job of the test above, run after the minute turned) has a
  /// bar without a green part, and ``succeededPerBar(_:)`` leaves it out.
  @Test func jobsOnBothSidesOfAMinutesTurnMakeTwoBars() async throws {
    let sandbox = try Sandbox()
    _ = try await sandbox.succeed(["--queue", "turn", "add", "exec", "--", "true"])
    let store = try SQLiteJobStore(path: sandbox.database)
    let now = Date()
    try await store.recordActivity([
      QueueActivity(queue: "turn", minute: now.addingTimeInterval(-120), died: 1),
      QueueActivity(queue: "turn", minute: now.addingTimeInterval(-60), succeeded: 2),
      QueueActivity(queue: "turn", minute: now, succeeded: 1),
    ])
    let dashboard = try await DashboardProcess.start(sandbox)
    let page = try await dashboard.get("/")
    let row = try #require(Self.section(page.body, #"data-chart-queue="turn">"#))
    #expect(Self.succeededPerBar(row) == [2, 1], "\(row)")
    #expect(row.components(separatedBy: #"<rect class="ok""#).count - 1 == 2)
  }

  /// A worker whose clock is ahead of the dashboard's (another host, a clock stepped forward and
  /// back) leaves minutes that are still in the future for the dashboard: workers key their
  /// counts by their own clock's minute (`ActivityTally`). `/metrics` calls its totals "the last
  /// hour", but summed every stored minute from an hour ago on, future ones included
  /// (`Dashboard.metrics()`: `activity[queue.name]` was everything `activity(since:limit:)`
  /// returned, unbounded above). The page's chart drops those minutes
  /// (`DashboardCharts.row` keeps the 60 slots only), so the chart and `/metrics` disagree, and a
  /// minute two hours ahead is reported as "finished in the last hour" for the next three hours.
  @Test func metricsOfTheLastHourLeaveOutMinutesThatHaveNotHappenedYet() async throws {
    let sandbox = try Sandbox()
    _ = try await sandbox.succeed(["--queue", "skew", "add", "exec", "--", "true"])
    let store = try SQLiteJobStore(path: sandbox.database)
    try await store.recordActivity([
      QueueActivity(queue: "skew", minute: Date(), succeeded: 1),
      // A worker whose clock runs two hours ahead.
      QueueActivity(queue: "skew", minute: Date().addingTimeInterval(7_200), succeeded: 5),
    ])
    let dashboard = try await DashboardProcess.start(sandbox)
    let page = try await dashboard.get("/")
    #expect(page.body.contains(#"data-finished="1""#), "the chart counts this hour's minute only")
    let metrics = try await dashboard.get("/metrics")
    #expect(
      metrics.body.contains("conveyor_jobs_finished_last_hour{queue=\"skew\",outcome=\"succeeded\"} 1\n"),
      "\(metrics.body.split(separator: "\n").filter { $0.contains("finished_last_hour{") })")
  }

  /// The successes of each bar of a throughput chart that has any (a green part), oldest first,
  /// from the bars' labels (`HH:MM UTC: N succeeded, …`).
  static func succeededPerBar(_ row: String) -> [Int] {
    row.components(separatedBy: "<g><title>").dropFirst().compactMap { bar -> Int? in
      guard let label = bar.components(separatedBy: "</title>").first,
        let range = label.range(of: #"UTC: [0-9]+ succeeded"#, options: .regularExpression),
        let succeeded = Int(label[range].dropFirst(5).prefix { $0.isNumber }), succeeded > 0
      else { return nil }
      return succeeded
    }
  }

  /// The text from `start` to the end of its `</div>`.
  static func section(_ page: String, _ start: String) -> String? {
    guard let from = page.range(of: start),
      let end = page.range(of: "</div>", range: from.upperBound..<page.endIndex)
    else { return nil }
    return String(page[from.lowerBound..<end.upperBound])
  }
}
