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

/// The activity counts (starts, outcomes, waits) a queue hands to a real SQLite file, whatever
/// stops or interrupts it, and the oldest ready job.
@Suite("SQLite activity and oldest ready job")
struct SQLiteActivityTests {
  @Test func activityIsRecordedAndReadOnARealFile() async throws {
    let folder = try TemporaryFolder()
    try await ActivityChecks.recordAndRead(try makeStore(folder))
    // Kept in the file: a second store on it reads the same minutes.
    let reopened = try makeStore(folder)
    #expect(try await reopened.activity(since: Date().addingTimeInterval(-3600), limit: 100).count == 4)
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
  @Test(.timeLimit(.minutes(10))) func theMetricsHookReportsTheOldestReadyAge() async throws {
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

  /// A shutdown whose grace period runs out (a long handler is cut short) is an ordinary deploy.
  /// The loop task is cancelled then, and `runLoop` calls `flushActivity(within:)` from that
  /// cancelled task: the task group's children inherit the cancellation, `SerializedConnection`
  /// `perform` throws `CancellationError` before it starts (`Task.checkCancellation()`), the counts
  /// are put back into the tally of a queue that has stopped, and are lost: not the "last few
  /// seconds of a crash" but whatever the queue counted since its last periodic flush, on every
  /// shutdown that had to cut a handler short. (`finalFlush` runs in an unstructured task for
  /// exactly this reason; the activity flush does not.)
  ///
  /// Failed before the fix: `JobQueue.runLoop` → `flushActivity(within:)` inherited the loop's
  /// cancellation.
  @Test(.timeLimit(.minutes(10))) func aShutdownThatCutsAHandlerShortStillHandsOverItsCounts() async throws {
    let folder = try TemporaryFolder()
    let store = try makeStore(folder)
    let entered = Counter()
    let queue = try JobQueue<Task12>(
      configuration: JobQueueConfiguration(identifier: "deploy", concurrency: 2), store: store
    ) { item, _ in
      if item.text == "long" {
        entered.increment()
        try await Task.sleep(for: .seconds(120))  // cut short by the shutdown
      }
      return .handled
    }
    let handled = try await queue.add(Task12(text: "quick")).id
    try await eventually("the quick job was handled") { try await store.job(handled)?.status == .completed }
    try await queue.add(Task12(text: "long"))
    try await eventually("the long handler started") { entered.value == 1 }
    // Within a second or so of the start: the periodic flush (every 5 s) has not run yet.
    await queue.shutdown(gracePeriod: .milliseconds(300))

    let total = try await activityTotal(store, queue: "deploy")
    #expect(total.succeeded == 1, "the quick job's success was handed over at shutdown: \(total)")
    #expect(total.started == 2, "both first starts were handed over at shutdown: \(total)")
  }

  /// `QueueActivity.started` is "jobs whose handler started for the first time". A shutdown that
  /// cuts a handler short gives the job its attempt back (`SQL.release`: `attempts - 1`, and the
  /// old run date), so when a worker runs it again its attempt is 1 once more and
  /// `JobQueue.countStart(of:)` (`record.attempts == 1`) counts a second first start, with a
  /// "wait from enqueue" that includes the whole first run and the downtime. One job, one
  /// success, two first starts: every deploy that interrupts long jobs inflates the started count
  /// and the mean and longest waits on the dashboard.
  ///
  /// Measured on the second worker's own contribution, so the loss of the first worker's counts
  /// (the test above) does not hide it.
  @Test(.timeLimit(.minutes(10))) func aJobInterruptedByAShutdownAndRunAgainIsNotASecondFirstStart()
    async throws
  {
    let folder = try TemporaryFolder()
    let store = try makeStore(folder)
    let configuration = JobQueueConfiguration(identifier: "work")
    let entered = Counter()
    let first = try JobQueue<Task12>(configuration: configuration, store: store) { _, _ in
      entered.increment()
      try await Task.sleep(for: .seconds(120))  // cut short by the shutdown
      return .handled
    }
    try await first.add(Task12(text: "long"))
    try await eventually("the handler started") { entered.value == 1 }
    await first.shutdown(gracePeriod: .milliseconds(300))
    let waiting = try await store.jobs(queue: "work", status: .pending, after: nil, limit: 10)
    #expect(waiting.count == 1 && waiting.first?.attempts == 0, "given back, attempt returned: \(waiting)")
    let before = try await activityTotal(store, queue: "work")

    let second = try JobQueue<Task12>(configuration: configuration, store: store) { _, _ in .handled }
    await second.waitUntilFinished()
    await second.shutdown(gracePeriod: .seconds(5))

    let after = try await activityTotal(store, queue: "work")
    #expect(after.succeeded - before.succeeded == 1, "before \(before), after \(after)")
    #expect(
      after.started - before.started == 0,
      "the job's handler had started before; the second worker counted a first start: before \(before), after \(after)"
    )
  }

  /// A handler cut short by a shutdown, run again later by another queue, is counted
  /// once; the job discarded and re-queued (attempts reset) is not counted again.
  @Test(.timeLimit(.minutes(10)))
  func interruptedThenRequeuedJobIsCountedOnce() async throws {
    let folder = try TemporaryFolder()
    let store = try SQLiteJobStore(path: folder.path("act.sqlite"))
    let runs = Log<String>()
    let blocked = Flag()
    let first = try JobQueue<AheadItem>(configuration: JobQueueConfiguration(identifier: "act"), store: store)
    {
      item, context in
      runs.append("\(item.name) attempt \(context.attempts)")
      blocked.set()
      try await Task.sleep(for: .seconds(60))
      return .handled
    }
    let id = try await first.add(AheadItem(name: "job")).id
    try await eventually("started") { blocked.value }
    await first.shutdown(gracePeriod: .milliseconds(200))
    let record = try await store.job(id)
    #expect(record?.attempts == 0)
    #expect(record?.lastError != nil)
    let second = try JobQueue<AheadItem>(
      configuration: JobQueueConfiguration(identifier: "act"), store: store
    ) {
      item, context in
      runs.append("\(item.name) attempt \(context.attempts)")
      return runs.all.count < 3 ? .discard(reason: "") : .handled
    }
    try await eventually("dead") { try await store.job(id)?.status == .dead }
    #expect(try await second.requeueDead() == 1)
    try await eventually("done") { try await store.job(id)?.status == .completed }
    await second.shutdown(gracePeriod: .seconds(5))
    #expect(runs.all == ["job attempt 1", "job attempt 1", "job attempt 1"])
    let total = try await activityTotal(store, queue: "act")
    #expect(total.started == 1, "one job, first started once: \(total)")
  }

  /// Jobs prefetched and handed back unstarted at shutdown are counted once each when a
  /// later queue runs them.
  @Test(.timeLimit(.minutes(10)))
  func prefetchedJobsHandedBackAtShutdownAreCountedOnce() async throws {
    let scenario = try ClaimAheadScenario()
    defer { scenario.openAll() }
    let sqlite = try SQLiteJobStore(path: scenario.path)
    var configuration = scenario.configuration(claimsAhead: false)
    configuration.prefetch = 2
    let queue = try scenario.queue(configuration, store: sqlite)
    try await queue.add(contentsOf: ["slow", "a", "b"].map { AheadItem(name: $0) })
    queue.start()
    await scenario.slowStarted.wait()
    try await eventually("a and b prefetched", timeout: .seconds(30)) {
      try await sqlite.jobs(queue: "ahead", status: .running, after: nil, limit: 10).count == 3
    }
    let stopping = Task { await queue.shutdown(gracePeriod: .seconds(30)) }
    try await eventually("handed back", timeout: .seconds(30)) {
      try await sqlite.jobs(queue: "ahead", status: .pending, after: nil, limit: 10).count == 2
    }
    scenario.slowGoes.open()
    await stopping.value
    let later = try scenario.queue(configuration, store: sqlite)
    later.start()
    await scenario.drain(sqlite)
    await later.shutdown(gracePeriod: .seconds(5))
    #expect(scenario.runs.all == ["slow attempt 1", "a attempt 1", "b attempt 1"])
    let total = try await activityTotal(sqlite, queue: "ahead")
    #expect(total.started == 3, "\(total)")
  }

  /// `activity(since:limit:)` is "sorted by queue and then minute": the rows were sorted with
  /// `String`'s `<`, which takes two canonically equivalent names for one, so the minutes of two
  /// queues interleaved (and the queues came in `String` order, not the bytes' order). (Failed
  /// before the fix.)
  @Test func activityOfEquivalentNamesIsNotInterleaved() async throws {
    let folder = try TemporaryFolder()
    let store = try makeStore(folder)
    let composed = "caf\u{E9}"
    let decomposed = "cafe\u{301}"
    let m1 = QueueActivity.minute(containing: Date().addingTimeInterval(-600))
    let m2 = m1.addingTimeInterval(60)
    let m3 = m1.addingTimeInterval(120)
    try await store.recordActivity([
      QueueActivity(queue: composed, minute: m1, succeeded: 1),
      QueueActivity(queue: decomposed, minute: m2, succeeded: 2),
      QueueActivity(queue: composed, minute: m3, succeeded: 3),
    ])
    let rows = try await store.activity(since: m1, limit: 10)
    let order = rows.map { scalarsInHex($0.queue) }
    // Byte order: "cafe\u{301}" (…65 CC 81) before "caf\u{E9}" (…C3 A9); each queue's minutes together.
    #expect(
      order == [scalarsInHex(decomposed), scalarsInHex(composed), scalarsInHex(composed)],
      "rows: \(rows.map { (scalarsInHex($0.queue), $0.succeeded) })")
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
