import Conveyor
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import ConveyorSQLite

/// A message the review's activity tests enqueue.
private struct Note: Queueable {
  var text: String
}

/// Review of the activity counts on a real SQLite file.
@Suite("Review: SQLite activity counts", .timeLimit(.minutes(2)))
struct ReviewActivitySQLiteTests {
  /// Everything `store` holds for `queue`, summed.
  static func total(_ store: SQLiteJobStore, _ queue: String) async throws -> QueueActivity {
    let minutes = try await store.activity(since: Date().addingTimeInterval(-3600), limit: 1_000)
    return minutes.filter { $0.queue == queue }
      .reduce(into: QueueActivity(queue: queue, minute: Date())) { $0.add($1) }
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
  /// Defect: `JobQueue.runLoop` → `flushActivity(within:)` inherits the loop's cancellation.
  @Test func aShutdownThatCutsAHandlerShortStillHandsOverItsCounts() async throws {
    let folder = try TemporaryFolder()
    let store = try makeStore(folder)
    let entered = Counter()
    let queue = try JobQueue<Note>(
      configuration: JobQueueConfiguration(identifier: "deploy", concurrency: 2), store: store
    ) { item, _ in
      if item.text == "long" {
        entered.increment()
        try await Task.sleep(for: .seconds(120))  // cut short by the shutdown
      }
      return .handled
    }
    let handled = try await queue.add(Note(text: "quick")).id
    try await eventually("the quick job was handled") { try await store.job(handled) == nil }
    try await queue.add(Note(text: "long"))
    try await eventually("the long handler started") { entered.value == 1 }
    // Within a second or so of the start: the periodic flush (every 5 s) has not run yet.
    await queue.shutdown(gracePeriod: .milliseconds(300))

    let total = try await Self.total(store, "deploy")
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
  @Test func aJobInterruptedByAShutdownAndRunAgainIsNotASecondFirstStart() async throws {
    let folder = try TemporaryFolder()
    let store = try makeStore(folder)
    let configuration = JobQueueConfiguration(identifier: "work")
    let entered = Counter()
    let first = try JobQueue<Note>(configuration: configuration, store: store) { _, _ in
      entered.increment()
      try await Task.sleep(for: .seconds(120))  // cut short by the shutdown
      return .handled
    }
    try await first.add(Note(text: "long"))
    try await eventually("the handler started") { entered.value == 1 }
    await first.shutdown(gracePeriod: .milliseconds(300))
    let waiting = try await store.jobs(queue: "work", status: .pending, after: nil, limit: 10)
    #expect(waiting.count == 1 && waiting.first?.attempts == 0, "given back, attempt returned: \(waiting)")
    let before = try await Self.total(store, "work")

    let second = try JobQueue<Note>(configuration: configuration, store: store) { _, _ in .handled }
    await second.waitUntilFinished()
    await second.shutdown(gracePeriod: .seconds(5))

    let after = try await Self.total(store, "work")
    #expect(after.succeeded - before.succeeded == 1, "before \(before), after \(after)")
    #expect(
      after.started - before.started == 0,
      "the job's handler had started before; the second worker counted a first start: before \(before), after \(after)"
    )
  }
}
