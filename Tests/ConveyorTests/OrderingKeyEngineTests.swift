import Conveyor
import Foundation
import Synchronization
import Testing

/// Ordering keys through a queue's engine, beyond the stores' conformance checks.
@Suite(.timeLimit(.minutes(2))) struct OrderingKeyEngineTests {
  struct Step: Queueable {
    var name: String
    var orderingKey: String? { "K" }
  }

  /// A handler that outruns its time limit and ignores cancellation still runs: the queue records
  /// its attempt (a retry) at once and the job runs again, and completes, on another slot. The
  /// next job of the key must still wait until the first attempt's handler has returned, or two
  /// jobs of one key run at once, which the guide promises only for leases and for an operator's
  /// cancel or removal.
  @Test func aJobOfAKeyWaitsForAnEarlierJobsHandlerThatOutranItsTimeLimit() async throws {
    let events = Mutex<[String]>([])
    let running = Mutex<Set<String>>([])
    let overlaps = Mutex<[String]>([])
    let release = Mutex<CheckedContinuation<Void, Never>?>(nil)
    let queue = try JobQueue<Step>(
      configuration: .init(
        identifier: "ordered-time-limit", retryPolicy: .fixed(.milliseconds(1)), maxAttempts: 3,
        concurrency: 2, autoStart: false, pollInterval: .milliseconds(20), timeLimit: .milliseconds(100),
        timeLimitGrace: .seconds(30)),
      store: InMemoryJobStore()
    ) { step, context in
      let label = "\(step.name)#\(context.attempts)"
      let others = running.withLock { running in
        defer { running.insert(label) }
        return running
      }
      if !others.isEmpty { overlaps.withLock { $0.append("\(label) beside \(others.sorted())") } }
      events.withLock { $0.append("start \(label)") }
      if step.name == "A" && context.attempts == 1 {
        // Ignores cancellation: returns only when the test lets it.
        await withCheckedContinuation { continuation in release.withLock { $0 = continuation } }
      }
      running.withLock { _ = $0.remove(label) }
      events.withLock { $0.append("end \(label)") }
      return .handled
    }
    try await queue.add(Step(name: "A"))
    try await queue.add(Step(name: "B"))
    #expect(try await queue.count() == JobCounts(ready: 1, held: 1))
    queue.start()
    // Long enough for A to time out, run again and complete, and for B to be taken if it is.
    let deadline = ContinuousClock.now + .seconds(3)
    while ContinuousClock.now < deadline, !events.withLock({ $0.contains("start B#1") }) {
      try await Task.sleep(for: .milliseconds(20))
    }
    let seen = events.withLock { $0 }
    let overlapped = overlaps.withLock { $0 }
    // Let A's first attempt return, then finish.
    while release.withLock({ $0 == nil }) { try await Task.sleep(for: .milliseconds(5)) }
    release.withLock { $0?.resume() }
    await queue.waitUntilFinished()
    await queue.shutdown(gracePeriod: .seconds(5))
    #expect(
      !overlapped.contains { $0.hasPrefix("B#") },
      "B ran while A's first attempt's handler still ran: \(overlapped); events \(seen)")
  }
}
