import Conveyor
import Foundation
import Testing

/// A view model on the main actor adopting the delegate with plain synchronous methods: no
/// `nonisolated`, no `@preconcurrency`, no `Task { @MainActor in … }`.
@MainActor
final class UploadsViewModel: JobQueueDelegate {
  var handled: [String] = []
  var attemptsSeen: [Int] = []
  var finishedCalls = 0
  var checkedCalls = 0

  func queue(
    _ queue: JobQueue<Request>, handle item: Request, attempts: Int,
    completion: @escaping @Sendable (JobResult) -> Void
  ) {
    // Traps (failing the run) if the queue called this off the main actor. Not `Thread.isMainThread`:
    // on Linux, once the test runner calls `dispatchMain()`, a worker thread drains the main queue.
    MainActor.assertIsolated()
    checkedCalls += 1
    attemptsSeen.append(attempts)
    if item.name == "flaky" && attempts == 1 {
      completion(.retry(after: .zero))
    } else {
      handled.append(item.name)
      // Completing later, from another thread, is allowed too.
      DispatchQueue.global().async { completion(.handled) }
    }
  }

  func queueFinished(_ queue: JobQueue<Request>) {
    MainActor.assertIsolated()
    checkedCalls += 1
    finishedCalls += 1
  }
}

/// Retries each job once, on the main actor, and counts `queueFinished` calls.
@MainActor
final class RetryOnceMainActorDelegate: JobQueueDelegate {
  var attempts: [Int] = []
  var finished = 0
  func queue(
    _ queue: JobQueue<Request>, handle item: Request, attempts: Int,
    completion: @escaping @Sendable (JobResult) -> Void
  ) {
    MainActor.assertIsolated()
    self.attempts.append(attempts)
    completion(attempts < 2 ? .retry(after: .zero) : .handled)
  }
  func queueFinished(_ queue: JobQueue<Request>) {
    MainActor.assertIsolated()
    finished += 1
  }
}

@Suite("Main-actor delegates")
struct MainActorDelegateTests {
  @Test("a @MainActor delegate's methods run on the main actor, retry included")
  @MainActor
  func mainActorDelegate() async throws {
    let model = UploadsViewModel()
    let queue = try JobQueue<Request>(
      configuration: .init(identifier: "main-actor"), store: InMemoryJobStore(), delegate: model)
    try await queue.add(Request(name: "first"))
    try await queue.add(Request(name: "flaky"))
    try await queue.add(Request(name: "last"))
    await queue.waitUntilFinished()
    // `waitUntilFinished` returns after the delegate's `queueFinished` returned.
    #expect(Set(model.handled) == ["first", "flaky", "last"])
    #expect(model.attemptsSeen.sorted() == [1, 1, 1, 2])
    #expect(model.finishedCalls >= 1)
    #expect(model.checkedCalls == model.attemptsSeen.count + model.finishedCalls)
    await queue.shutdown()
  }

  @Test(
    "a @MainActor delegate runs on the main actor, even while the main actor is kept busy between hops",
    .timeLimit(.minutes(10)))
  @MainActor
  func mainActorDelegateWhileBusy() async throws {
    let delegate = RetryOnceMainActorDelegate()
    // Started after the add: a queue started first may report "finished" before the job exists.
    let queue = try JobQueue<Request>(
      configuration: JobQueueConfiguration(identifier: "main", autoStart: false), store: InMemoryJobStore(),
      delegate: delegate)
    try await queue.add(Request(name: "busy"))
    queue.start()
    // Keep the main actor busy in short bursts; the delegate must still get its turns.
    let deadline = Date().addingTimeInterval(120)
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
