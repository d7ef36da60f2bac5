import Conveyor
import ConveyorTesting
import Foundation
import Synchronization
import Testing

/// How many `TrackedEmail` items are alive at once.
private enum LiveItems {
  static let count = Atomic<Int>(0)
}

/// Held by a `TrackedEmail` while it lives.
private final class LiveToken: Sendable {
  init() { LiveItems.count.add(1, ordering: .relaxed) }
  deinit { LiveItems.count.subtract(1, ordering: .relaxed) }
}

/// A `SendEmail` payload decoded as an item that counts how many of its kind are alive.
private struct TrackedEmail: Queueable {
  var to: String
  let token = LiveToken()

  enum CodingKeys: String, CodingKey { case to }
}

@Suite("Expecting that jobs were added", .timeLimit(.minutes(5)))
struct ExpectJobTests {
  /// A store holding, in queue "emails", two emails and an image job, none of them started.
  private func storeWithJobs(_ kind: StoreKind) async throws -> TestStore {
    let test = try kind.make()
    let clock = ManualJobClock()
    let emails = try JobQueue<SendEmail>(
      configuration: .init(identifier: "emails", autoStart: false, clock: clock), store: test.store
    ) { _, _ in .handled }
    try await emails.add(SendEmail(to: "ada@example.com", subject: "Welcome"))
    try await emails.add(SendEmail(to: "grace@example.com"), delay: .seconds(60))
    let images = try JobQueue<ResizeImage>(
      configuration: .init(identifier: "emails", autoStart: false, clock: clock), store: test.store
    ) { _, _ in .handled }
    try await images.add(ResizeImage(width: 640))
    return test
  }

  @Test("a matching job is returned decoded, with its record", arguments: StoreKind.allCases)
  func findsTheJob(kind: StoreKind) async throws {
    let test = try await storeWithJobs(kind)
    let found = try await test.store.expectJob(of: SendEmail.self, in: "emails") {
      $0.to == "ada@example.com"
    }
    #expect(found.map(\.item) == [SendEmail(to: "ada@example.com", subject: "Welcome")])
    #expect(found[0].record.id == JobID(1))
    #expect(found[0].record.status == .pending)
    #expect(found[0].record.attempts == 0)
    // Without a condition every job of the type matches; the image job never does.
    let all = try await test.store.expectJob(of: SendEmail.self, in: "emails", count: 2)
    #expect(all.map(\.item.to) == ["ada@example.com", "grace@example.com"])
    try await test.store.expectJob(of: ResizeImage.self, in: "emails", count: 1) { $0.width == 640 }
  }

  @Test(
    "no matching job: the error says what was expected and lists the jobs found",
    arguments: StoreKind.allCases)
  func missingJobListsWhatIsThere(kind: StoreKind) async throws {
    let test = try await storeWithJobs(kind)
    let error = try await #require(throws: JobExpectationError.self) {
      try await test.store.expectJob(of: SendEmail.self, in: "emails") { $0.to == "linus@example.com" }
    }
    #expect(error.matching == 0)
    #expect(error.total == 3)
    #expect(error.found.map(\.id) == [JobID(1), JobID(2), JobID(3)])
    let text = error.description
    #expect(
      text.hasPrefix(#"expected at least one job of SendEmail in queue "emails" matching the condition"#),
      "\(text)")
    #expect(
      text.contains("job 1 pending, run at 2024-01-01T00:00:00.000Z, 0 attempt(s), payload: {"), "\(text)")
    #expect(text.contains("ada@example.com"), "\(text)")
    #expect(text.contains("job 2 pending, run at 2024-01-01T00:01:00.000Z"), "\(text)")
    #expect(text.contains("Not decodable as the expected type:\n  job 3: "), "\(text)")
  }

  @Test("a count that differs fails, naming how many matched")
  func countMismatch() async throws {
    let test = try await storeWithJobs(.inMemory)
    let error = try await #require(throws: JobExpectationError.self) {
      try await test.store.expectJob(of: SendEmail.self, in: "emails", status: .pending, count: 1)
    }
    #expect(error.matching == 2)
    #expect(
      error.description.hasPrefix("expected exactly 1 job of SendEmail with status pending"), "\(error)")
  }

  @Test("a negative count is refused, saying so")
  func negativeCount() async throws {
    let error = try await #require(throws: JobExpectationError.self) {
      try await InMemoryJobStore().expectJob(of: SendEmail.self, in: "emails", count: -1)
    }
    #expect(
      error.description.hasPrefix("expected exactly -1 (a count must be 0 or more) job of SendEmail"),
      "\(error)")
  }

  @Test("expecting no job fails when one matches and passes when none does", arguments: StoreKind.allCases)
  func expectNoJob(kind: StoreKind) async throws {
    let test = try await storeWithJobs(kind)
    try await test.store.expectNoJob(of: SendEmail.self, in: "emails") { $0.to == "linus@example.com" }
    try await test.store.expectNoJob(of: SendEmail.self, in: "emails", status: .dead)
    try await test.store.expectNoJob(of: SendEmail.self, in: "another-queue")
    let error = try await #require(throws: JobExpectationError.self) {
      try await test.store.expectNoJob(of: SendEmail.self, in: "emails") { $0.subject == "Welcome" }
    }
    #expect(error.matching == 1)
    #expect(
      error.description.hasPrefix(#"expected no job of SendEmail in queue "emails" matching"#), "\(error)")
  }

  @Test("an empty queue: the error says handled jobs are deleted")
  func emptyQueue() async throws {
    let error = try await #require(throws: JobExpectationError.self) {
      try await InMemoryJobStore().expectJob(of: SendEmail.self, in: "emails")
    }
    #expect(error.total == 0)
    #expect(error.description.contains("handled jobs are deleted"), "\(error)")
  }

  @Test("more jobs than a page of the store are all looked at; the error lists the first ten")
  func manyJobs() async throws {
    let clock = ManualJobClock()
    let queue = try JobQueue<SendEmail>(
      configuration: .init(identifier: "emails", autoStart: false, clock: clock), store: InMemoryJobStore()
    ) { _, _ in .handled }
    try await queue.add(contentsOf: (1...1_200).map { SendEmail(to: "user\($0)@example.com") })
    let last = try await queue.expectJob(count: 1) { $0.to == "user1200@example.com" }
    #expect(last[0].record.id == JobID(1_200))
    let error = try await #require(throws: JobExpectationError.self) {
      try await queue.expectNoJob { $0.to.hasPrefix("user") }
    }
    #expect(error.matching == 1_200)
    #expect(error.found.count == JobExpectationError.listedJobLimit)
    #expect(error.description.hasSuffix("… and 1190 more"), "\(error)")
  }

  @Test("the error lists each job found on one line, whatever its last error holds")
  func foundJobsOneLineEach() async throws {
    let clock = ManualJobClock()
    let queue = try emailQueue(InMemoryJobStore(), clock: clock) { _, _ in
      .discard(
        reason: "HTTP 410\r\n  job 99 pending, run at 2024-01-01T00:00:00.000Z, 0 attempt(s), payload: {}")
    }
    try await queue.add(SendEmail(to: "ada@example.com"))
    try await queue.runUntilIdle()
    await queue.shutdown(gracePeriod: .seconds(1))
    let error = try await #require(throws: JobExpectationError.self) {
      try await queue.expectNoJob(status: .dead)
    }
    #expect(error.found.count == 1)
    let lines = error.description.split(whereSeparator: \.isNewline)
    #expect(lines.count == 1 + error.found.count, "\(error)")
    #expect(!lines.contains { $0.hasPrefix("  job 99 ") }, "a forged job line: \(error)")
  }

  @Test("a payload of one huge character is cut short in the error, as any long payload is")
  func hugeCharacterIsCutShort() async throws {
    let queue = try JobQueue<SendEmail>(
      configuration: .init(identifier: "emails", autoStart: false, clock: ManualJobClock()),
      store: InMemoryJobStore()
    ) { _, _ in .handled }
    // One character: a letter and a hundred thousand combining accents.
    try await queue.add(SendEmail(to: "a" + String(repeating: "\u{301}", count: 100_000)))
    let error = try await #require(throws: JobExpectationError.self) { try await queue.expectNoJob() }
    let size = error.description.utf8.count
    #expect(size < 10_000, "the description holds \(size) bytes")
  }

  @Test("expecting no job keeps the matching jobs it counts no longer than a page")
  func expectNoJobMemoryIsBounded() async throws {
    let queue = try JobQueue<SendEmail>(
      configuration: .init(identifier: "emails", autoStart: false, clock: ManualJobClock()),
      store: InMemoryJobStore()
    ) { _, _ in .handled }
    try await queue.add(contentsOf: (1...1_500).map { SendEmail(to: "user\($0)@example.com") })
    var mostAlive = 0
    let error = try await #require(throws: JobExpectationError.self) {
      try await queue.store.expectNoJob(of: TrackedEmail.self, in: "emails") { _ in
        mostAlive = max(mostAlive, LiveItems.count.load(ordering: .relaxed))
        return true
      }
    }
    #expect(error.matching == 1_500)
    #expect(mostAlive <= 500, "\(mostAlive) decoded items alive at once: every match is kept")
  }

  @Test("the error shows a job's run date to the millisecond the store keeps", arguments: StoreKind.allCases)
  func runDateMilliseconds(kind: StoreKind) async throws {
    let test = try kind.make()
    let queue = try JobQueue<SendEmail>(
      configuration: .init(identifier: "emails", autoStart: false, clock: ManualJobClock()), store: test.store
    ) { _, _ in .handled }
    try await queue.add(SendEmail(to: "ada@example.com"), delay: .milliseconds(15_123))
    let found = try await queue.expectJob(count: 1)
    #expect(JobStoreTime.milliseconds(found[0].record.runAt) == 1_704_067_215_123)
    let error = try await #require(throws: JobExpectationError.self) { try await queue.expectNoJob() }
    #expect(error.description.contains("run at 2024-01-01T00:00:15.123Z"), "\(error)")
  }
}
