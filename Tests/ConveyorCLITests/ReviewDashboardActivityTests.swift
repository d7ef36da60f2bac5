import Conveyor
import ConveyorSQLite
import Foundation
import Testing

/// Review of the dashboard's "last hour" figures when a worker's clock is ahead of the
/// dashboard's: workers key their counts by their own clock's minute (`ActivityTally`), so a
/// worker whose clock is ahead (another host, a clock stepped forward and back) leaves minutes
/// that are still in the future for the dashboard.
@Suite(.timeLimit(.minutes(3))) struct ReviewDashboardActivityTests {
  /// `/metrics` calls its totals "the last hour", but sums every stored minute from an hour ago
  /// on, future ones included (`Dashboard.metrics()`: `activity[queue.name]` is everything
  /// `activity(since:limit:)` returned, unbounded above). The page's chart drops those minutes
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
}
