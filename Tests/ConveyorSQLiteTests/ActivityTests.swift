import CSQLite
import Conveyor
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import ConveyorSQLite

/// A message the activity tests enqueue.
private struct Task12: Queueable {
  var text: String
}

@Suite("SQLite activity and oldest ready job")
struct SQLiteActivityTests {
  @Test func activityIsRecordedAndReadOnARealFile() async throws {
    let folder = try TemporaryFolder()
    try await ActivityChecks.recordAndRead(try makeStore(folder))
    // Kept in the file: a second store on it reads the same minutes.
    let reopened = try makeStore(folder)
    #expect(try await reopened.activity(since: Date().addingTimeInterval(-3600), limit: 100).count == 3)
  }

  @Test func equivalentQueueNamesKeepTheirOwnCounts() async throws {
    let folder = try TemporaryFolder()
    try await ActivityChecks.equivalentNamesKeepTheirOwnCounts(try makeStore(folder))
  }

  @Test func theOldestReadyJobIsFoundAcrossPriorityLevels() async throws {
    let folder = try TemporaryFolder()
    try await ActivityChecks.oldestReady(try makeStore(folder))
  }

  /// The oldest ready job is found by a few seeks, however many ready jobs the queue holds: the
  /// virtual-machine steps of the search stay far below one per job.
  @Test func findingTheOldestReadyJobDoesNotReadEveryReadyJob() async throws {
    let folder = try TemporaryFolder()
    let store = try makeStore(folder)
    let jobs = (0..<20_000).map { NewJob(payload: payload("\($0)"), priority: $0 % 3, runAt: epoch) }
    _ = try await store.enqueue(jobs, queue: "big", now: epoch.addingTimeInterval(1))
    try await store.connection.perform { db in
      for sql in [ActivitySQL.firstReady, ActivitySQL.firstReadyBelow] {
        _ = sqlite3_stmt_status(try db.statement(sql).handle, SQLITE_STMTSTATUS_VM_STEP, 1)
      }
    }
    #expect(try await store.oldestReadyRunDate(queue: "big", clock: FixedJobClock(epoch)) == epoch)
    let used = try await store.connection.perform { db -> Int32 in
      try [ActivitySQL.firstReady, ActivitySQL.firstReadyBelow].reduce(0) {
        $0 + sqlite3_stmt_status(try db.statement($1).handle, SQLITE_STMTSTATUS_VM_STEP, 0)
      }
    }
    #expect(used < 1_000, "the search took \(used) steps for 20,000 ready jobs")
  }

  /// A queue counts its starts and outcomes in memory and gives them to the store when it stops.
  @Test func aQueueRecordsItsActivityWhenItStops() async throws {
    let folder = try TemporaryFolder()
    let store = try makeStore(folder)
    let configuration = JobQueueConfiguration(
      identifier: "work", retryPolicy: .fixed(.milliseconds(1)), maxAttempts: 2, concurrency: 2)
    let queue = try JobQueue<Task12>(configuration: configuration, store: store) { item, _ in
      if item.text == "fails" { throw TestFailure("no") }
      return .handled
    }
    try await queue.add(contentsOf: (0..<10).map { Task12(text: "ok \($0)") } + [Task12(text: "fails")])
    await queue.waitUntilFinished()
    await queue.shutdown(gracePeriod: .seconds(5))
    let minutes = try await store.activity(since: Date().addingTimeInterval(-3600), limit: 100)
    #expect(minutes.allSatisfy { $0.queue == "work" })
    let total = minutes.reduce(into: QueueActivity(queue: "work", minute: Date())) { $0.add($1) }
    #expect(total.succeeded == 10 && total.retried == 1 && total.died == 1, "\(total)")
    #expect(total.started == 11, "first starts only: \(total)")
    #expect(total.waitMillisecondsMax >= 0 && total.waitMillisecondsTotal >= 0)
  }

  /// The metrics hook's oldest-ready gauge: a job whose run date was 90 s ago has waited 90 s.
  @Test(.timeLimit(.minutes(1))) func theMetricsHookReportsTheOldestReadyAge() async throws {
    let folder = try TemporaryFolder()
    let store = try makeStore(folder)
    let queue = try JobQueue<Task12>(
      configuration: JobQueueConfiguration(identifier: "metered", autoStart: false), store: store
    ) { _, _ in .handled }
    try await queue.add(Task12(text: "late"), runAt: Date().addingTimeInterval(-90))
    let gauges = GaugeRecorder()
    let reporting = Task { await queue.reportMetrics(to: gauges, depthInterval: .milliseconds(10)) }
    try await eventually("the oldest-ready gauge") {
      gauges.values.withLock { $0["conveyor_queue_oldest_ready_age_seconds"] } != nil
    }
    let age = try #require(gauges.values.withLock { $0["conveyor_queue_oldest_ready_age_seconds"] })
    #expect(age >= 89 && age < 150, "age \(age)")
    reporting.cancel()
    await queue.shutdown()
  }
}

/// Keeps each gauge's last value by label.
private final class GaugeRecorder: JobMetricsFactory {
  let values = Mutex<[String: Double]>([:])

  struct Gauge: JobMetricsGauge, JobMetricsCounter, JobMetricsTimer {
    let label: String
    let owner: GaugeRecorder
    func record(_ value: Double) { owner.values.withLock { $0[label] = value } }
    func increment(by amount: Int64) {}
    func recordNanoseconds(_ duration: Int64) {}
  }

  func makeCounter(label: String, dimensions: [(String, String)]) -> any JobMetricsCounter {
    Gauge(label: label, owner: self)
  }
  func makeGauge(label: String, dimensions: [(String, String)]) -> any JobMetricsGauge {
    Gauge(label: label, owner: self)
  }
  func makeTimer(label: String, dimensions: [(String, String)]) -> any JobMetricsTimer {
    Gauge(label: label, owner: self)
  }
}
