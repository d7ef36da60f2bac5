import Conveyor
import ConveyorTesting
import XCTest

/// The helpers from an XCTest case: a thrown error fails the test with its description.
final class XCTestUsageTests: XCTestCase {
  func testRetriedJobRunsToTheEndAndExpectationsHold() async throws {
    let clock = ManualJobClock()
    let store = InMemoryJobStore()
    let queue = try emailQueue(store, clock: clock) { _, context in
      context.attempts == 1 ? .retry : .handled
    }
    try await queue.add(SendEmail(to: "ada@example.com"))
    try await store.expectJob(of: SendEmail.self, in: "emails") { $0.to == "ada@example.com" }
    let run = try await queue.runUntilIdle()
    await queue.shutdown(gracePeriod: .seconds(1))
    XCTAssertEqual(run.timeAdvanced, .seconds(15))
    try await store.expectNoJob(of: SendEmail.self, in: "emails")
    let result = try await runHandler(
      { (_: SendEmail, _: JobContext) in .handled }, on: SendEmail(to: "a@b.c"))
    XCTAssertEqual(result, .handled)
  }

  func testAFailedExpectationThrowsWhatWasFound() async throws {
    let store = InMemoryJobStore()
    let queue = try JobQueue<SendEmail>(
      configuration: .init(identifier: "emails", autoStart: false, clock: ManualJobClock()), store: store
    ) { _, _ in .handled }
    try await queue.add(SendEmail(to: "grace@example.com"))
    do {
      try await store.expectJob(of: SendEmail.self, in: "emails") { $0.to == "ada@example.com" }
      XCTFail("expectJob found a job that is not there")
    } catch let error as JobExpectationError {
      XCTAssertTrue(error.description.contains("grace@example.com"), error.description)
    }
  }
}
