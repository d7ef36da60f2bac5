import Conveyor
import ConveyorTestSupport
import ConveyorTesting
import Foundation
import Synchronization
import Testing

/// An item whose `note` is not encoded: a worker decoding the stored job sees the default.
private struct Note: Queueable {
  var text: String
  var note = "unset"

  enum CodingKeys: String, CodingKey { case text }
}

/// An item that fails to decode from its own JSON.
private struct OneWay: Queueable {
  var text: String

  init(text: String) { self.text = text }
  init(from decoder: any Decoder) throws {
    throw DecodingError.dataCorrupted(.init(codingPath: [], debugDescription: "OneWay cannot be decoded"))
  }
  func encode(to encoder: any Encoder) throws {
    var container = encoder.singleValueContainer()
    try container.encode(text)
  }
}

/// A handler's decisions: retry the first attempts, give up on the fifth or on a bad address.
private let deliver: JobQueue<SendEmail>.Handler = { email, context in
  guard email.to.contains("@") else { return .discard(reason: "no address: \(email.to)") }
  if context.attempts >= 5 { return .discard(reason: "gave up after \(context.attempts) attempts") }
  if email.subject.isEmpty { throw URLError(.badServerResponse) }
  return context.attempts < 3 ? .retry(after: .seconds(10), reason: "greylisted") : .handled
}

/// A delegate that completes later, from another task.
private final class LaterDelegate: JobQueueDelegate {
  let seenQueue = Mutex<String?>(nil)

  func queue(
    _ queue: JobQueue<SendEmail>, handle item: SendEmail, attempts: Int,
    completion: @escaping @Sendable (JobResult) -> Void
  ) {
    seenQueue.withLock { $0 = queue.configuration.identifier }
    Task {
      try await Task.sleep(for: .milliseconds(10))
      completion(attempts == 1 ? .retry : .handled)
      completion(.discard(reason: "a second call is ignored"))
    }
  }
}

/// A delegate that never calls its completion, or is not ready for jobs.
private final class SilentDelegate: JobQueueDelegate {
  let ready: Bool
  init(ready: Bool) { self.ready = ready }
  var isReadyForJobs: Bool { ready }
  func queue(
    _ queue: JobQueue<SendEmail>, handle item: SendEmail, attempts: Int,
    completion: @escaping @Sendable (JobResult) -> Void
  ) {}
}

/// A delegate whose call waits for a gate before it calls its completion (work done inside the
/// call, as an `async` implementation or a busy actor would).
private final class StalledDelegate: JobQueueDelegate {
  let gate = Gate()

  func queue(
    _ queue: JobQueue<SendEmail>, handle item: SendEmail, attempts: Int,
    completion: @escaping @Sendable (JobResult) -> Void
  ) async {
    await gate.wait()
    completion(.handled)
  }
}

@Suite("Running one job's handler inline", .timeLimit(.minutes(5)))
struct RunHandlerTests {
  @Test("the handler's decision for each attempt comes back as its JobResult")
  func decisionsByAttempt() async throws {
    let email = SendEmail(to: "ada@example.com")
    #expect(try await runHandler(deliver, on: email) == .retry(after: .seconds(10), reason: "greylisted"))
    #expect(try await runHandler(deliver, on: email, attempt: 3) == .handled)
    #expect(
      try await runHandler(deliver, on: email, attempt: 5) == .discard(reason: "gave up after 5 attempts"))
    #expect(
      try await runHandler(deliver, on: SendEmail(to: "nobody")) == .discard(reason: "no address: nobody"))
  }

  @Test("a thrown error reaches the caller, as the queue would record it")
  func thrownError() async throws {
    await #expect(throws: URLError.self) {
      try await runHandler(deliver, on: SendEmail(to: "a@b.c", subject: ""))
    }
  }

  @Test("the handler sees a realistic context: job 1 of queue tests, the attempt, the last error")
  func context() async throws {
    let seen = Mutex<JobContext?>(nil)
    let before = Date()
    let result = try await runHandler(
      { (_: SendEmail, context: JobContext) in
        seen.withLock { $0 = context }
        return .handled
      }, on: SendEmail(to: "a@b.c"), attempt: 2, lastError: "timed out")
    #expect(result == .handled)
    let context = try #require(seen.withLock { $0 })
    #expect(context.id == JobID(1))
    #expect(context.queue == "tests")
    #expect(context.attempts == 2)
    #expect(context.lastError == "timed out")
    #expect(context.createdAt >= before)

    let given = JobContext(id: JobID(42), queue: "emails", attempts: 7, createdAt: before)
    _ = try await runHandler(
      { (_: SendEmail, context: JobContext) in
        seen.withLock { $0 = context }
        return .handled
      }, on: SendEmail(to: "a@b.c"), context: given)
    #expect(seen.withLock { $0 } == given)
  }

  @Test("the item goes through JSON as a stored job does: a property not encoded arrives as its default")
  func itemRoundTrip() async throws {
    let seen = Mutex<String?>(nil)
    _ = try await runHandler(
      { (note: Note, _: JobContext) in
        seen.withLock { $0 = note.note }
        return .handled
      }, on: Note(text: "hi", note: "set by the test"))
    #expect(seen.withLock { $0 } == "unset")

    let error = try await #require(throws: HandlerRunError.self) {
      try await runHandler({ (_: OneWay, _: JobContext) in .handled }, on: OneWay(text: "x"))
    }
    #expect(error.description.contains("does not decode from its own JSON"), "\(error)")
    #expect(error.description.contains("OneWay cannot be decoded"), "\(error)")
  }

  @Test("an attempt below 1 is refused")
  func attemptZero() async throws {
    let error = try await #require(throws: HandlerRunError.self) {
      try await runHandler(deliver, on: SendEmail(to: "a@b.c"), attempt: 0)
    }
    #expect(error.description == "attempt must be at least 1 (1 is the first attempt), not 0")
  }

  @Test("a delegate's first completion is returned, also when it comes after the call")
  func delegateCompletion() async throws {
    let delegate = LaterDelegate()
    #expect(try await runHandler(delegate, on: SendEmail(to: "a@b.c")) == .retry)
    #expect(try await runHandler(delegate, on: SendEmail(to: "a@b.c"), attempt: 2) == .handled)
    #expect(delegate.seenQueue.withLock { $0 } == "tests")
  }

  @Test("a delegate that never completes, or is not ready for jobs, gets an error saying so")
  func delegateRefusals() async throws {
    let silent = try await #require(throws: HandlerRunError.self) {
      try await runHandler(
        SilentDelegate(ready: true), on: SendEmail(to: "a@b.c"), timeout: .milliseconds(100))
    }
    #expect(silent.description.contains("did not within"), "\(silent)")
    let unready = try await #require(throws: HandlerRunError.self) {
      try await runHandler(SilentDelegate(ready: false), on: SendEmail(to: "a@b.c"))
    }
    #expect(unready.description.contains("isReadyForJobs is false"), "\(unready)")
  }

  @Test("a delegate whose call does not return within the timeout gets the timeout's error")
  func stalledDelegateTimesOut() async throws {
    let delegate = StalledDelegate()
    defer { delegate.gate.open() }
    let outcome = Log<String>()
    let run = Task {
      do {
        let result = try await runHandler(delegate, on: SendEmail(to: "a@b.c"), timeout: .milliseconds(100))
        outcome.append("returned \(result)")
      } catch {
        outcome.append(String(describing: error))
      }
    }
    // A hang guard, six hundred times the timeout: runHandler should give up after a tenth of a second.
    let ended = await eventually(timeout: .seconds(60)) { outcome.count > 0 }
    delegate.gate.open()
    await run.value
    #expect(ended, "runHandler was still waiting for the delegate's call long after its timeout")
    #expect(outcome.all.first?.contains("did not within") == true, "\(outcome.all)")
  }

  @Test("a cancelled call on a delegate stops waiting for its completion")
  func cancelledDelegateRunEnds() async throws {
    let outcome = Log<String>()
    let run = Task {
      do {
        let result = try await runHandler(
          SilentDelegate(ready: true), on: SendEmail(to: "a@b.c"), timeout: .seconds(600))
        outcome.append("returned \(result)")
      } catch {
        outcome.append(String(describing: error))
      }
    }
    // Cancelled while it waits for the completion (or before it began): either way it should end.
    run.cancel()
    // A hang guard, a tenth of the delegate's timeout: a cancelled run should end at once.
    let ended = await eventually(timeout: .seconds(60)) { outcome.count > 0 }
    #expect(ended, "runHandler went on waiting for the delegate's completion after its task was cancelled")
  }
}
