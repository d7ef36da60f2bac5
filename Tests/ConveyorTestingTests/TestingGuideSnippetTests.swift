// The examples of the "Testing your jobs" guide
// (Sources/ConveyorTesting/ConveyorTesting.docc/TestingYourJobs.md), verbatim between the markers,
// so they compile and run. Example 1 is the top of this file, imports included.

// TestingYourJobs.md example 1 begins
import Conveyor
import ConveyorTesting
import Foundation
import Testing

struct SendWelcomeEmail: Queueable {
  var to: String
}

protocol MailServer: Sendable {
  func send(to address: String) async throws
}

/// The handler under test: an address without "@" can never work, a server error is retried by
/// the queue's policy, and the sixth attempt gives up.
func welcomeHandler(server: any MailServer) -> JobQueue<SendWelcomeEmail>.Handler {
  { job, context in
    guard job.to.contains("@") else { return .discard(reason: "not an address: \(job.to)") }
    if context.attempts > 5 { return .discard(reason: "gave up after \(context.attempts - 1) failures") }
    try await server.send(to: job.to)  // a thrown error: retry after the policy's delay
    return .handled
  }
}

/// A server that refuses the first `refusals` emails, then takes them.
actor FakeMailServer: MailServer {
  var refusals: Int
  var delivered: [String] = []

  init(refusals: Int) { self.refusals = refusals }

  func send(to address: String) throws {
    if refusals > 0 {
      refusals -= 1
      throw URLError(.cannotConnectToHost)
    }
    delivered.append(address)
  }
}

@Test func aWelcomeEmailIsRetriedUntilTheServerTakesIt() async throws {
  let server = FakeMailServer(refusals: 2)
  let clock = ManualJobClock()
  let store = InMemoryJobStore()
  let queue = try JobQueue<SendWelcomeEmail>(
    configuration: .init(
      identifier: "welcome", retryPolicy: .fixed(.seconds(30)), autoStart: false, clock: clock),
    store: store, handler: welcomeHandler(server: server))

  try await queue.add(SendWelcomeEmail(to: "ada@example.com"))
  try await store.expectJob(of: SendWelcomeEmail.self, in: "welcome") { $0.to == "ada@example.com" }

  queue.start()  // after the check: a started queue may have handled (and deleted) the job already
  let run = try await queue.runUntilIdle()
  #expect(run.timeAdvanced == .seconds(60))  // two 30 s retries, in no real time
  #expect(run.dead == 0)
  #expect(await server.delivered == ["ada@example.com"])
  try await queue.expectNoJob()  // handled jobs are deleted
  await queue.shutdown()
}
// TestingYourJobs.md example 1 ends

// TestingYourJobs.md example 2 begins
@Test func anAddressWithoutAnAtSignIsDiscarded() async throws {
  let handler = welcomeHandler(server: FakeMailServer(refusals: 0))
  let result = try await runHandler(handler, on: SendWelcomeEmail(to: "nobody"))
  #expect(result == .discard(reason: "not an address: nobody"))
}

@Test func theSixthAttemptGivesUp() async throws {
  let handler = welcomeHandler(server: FakeMailServer(refusals: 0))
  let result = try await runHandler(handler, on: SendWelcomeEmail(to: "ada@example.com"), attempt: 6)
  #expect(result == .discard(reason: "gave up after 5 failures"))
}

@Test func aRefusedEmailThrowsSoTheQueueRetriesIt() async throws {
  let handler = welcomeHandler(server: FakeMailServer(refusals: 1))
  await #expect(throws: URLError.self) {
    try await runHandler(handler, on: SendWelcomeEmail(to: "ada@example.com"))
  }
}
// TestingYourJobs.md example 2 ends

// TestingYourJobs.md example 3 begins
@Test func aMailboxThatNeverAnswersEndsDead() async throws {
  let server = FakeMailServer(refusals: .max)
  let clock = ManualJobClock()
  let queue = try JobQueue<SendWelcomeEmail>(
    configuration: .init(
      identifier: "welcome", retryPolicy: .exponential(initial: .seconds(1), maximum: .seconds(60)),
      clock: clock),
    store: InMemoryJobStore(), handler: welcomeHandler(server: server))
  try await queue.add(SendWelcomeEmail(to: "ada@example.com"))

  let run = try await queue.runUntilIdle(maxAdvances: 10)
  #expect(run.clockAdvances == 5)  // five failures, then the sixth attempt gives up
  let dead = try await queue.expectJob(status: .dead, count: 1)
  #expect(dead[0].record.lastError == "gave up after 5 failures")
  await queue.shutdown()
}
// TestingYourJobs.md example 3 ends
