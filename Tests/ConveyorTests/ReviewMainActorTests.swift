import Conveyor
import Foundation
import Testing

// Review of issue 10's main-actor delegates on the core JobQueue: held probes.

struct ReviewJob: Queueable {
  var n: Int
}

@MainActor
final class ReviewMainDelegate: JobQueueDelegate {
  var attempts: [Int] = []
  var finished = 0
  func queue(
    _ queue: JobQueue<ReviewJob>, handle item: ReviewJob, attempts: Int,
    completion: @escaping @Sendable (JobResult) -> Void
  ) {
    MainActor.assertIsolated()
    self.attempts.append(attempts)
    completion(attempts < 2 ? .retry(after: .zero) : .handled)
  }
  func queueFinished(_ queue: JobQueue<ReviewJob>) {
    MainActor.assertIsolated()
    finished += 1
  }
}

@Suite("main-actor delegates: review", .timeLimit(.minutes(2)))
@MainActor
struct ReviewMainActorTests {
  @Test("a @MainActor delegate runs on the main actor, even while the main actor is kept busy between hops")
  func mainActorDelegateWhileBusy() async throws {
    let delegate = ReviewMainDelegate()
    // Started after the add: a queue started first may report "finished" before the job exists.
    let queue = try JobQueue<ReviewJob>(
      configuration: JobQueueConfiguration(identifier: "main", autoStart: false), store: InMemoryJobStore(),
      delegate: delegate)
    try await queue.add(ReviewJob(n: 1))
    queue.start()
    // Keep the main actor busy in short bursts; the delegate must still get its turns.
    let deadline = Date().addingTimeInterval(30)
    while delegate.finished == 0, Date() < deadline {
      let busyUntil = Date().addingTimeInterval(0.05)
      while Date() < busyUntil {}
      await Task.yield()
    }
    #expect(delegate.finished == 1)
    #expect(delegate.attempts == [1, 2])
    await queue.shutdown(gracePeriod: .zero)
  }
}
