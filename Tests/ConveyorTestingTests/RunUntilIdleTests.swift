import Conveyor
import ConveyorTestSupport
import ConveyorTesting
import Foundation
import Testing

/// A delegate that is never ready for jobs: its queue claims none.
private final class UnreadyDelegate: JobQueueDelegate {
  var isReadyForJobs: Bool { false }

  func queue(
    _ queue: JobQueue<SendEmail>, handle item: SendEmail, attempts: Int,
    completion: @escaping @Sendable (JobResult) -> Void
  ) {
    completion(.handled)
  }
}

@Suite("Running a queue until idle on a manual clock", .timeLimit(.minutes(5)))
struct RunUntilIdleTests {
  @Test(
    "a handler that fails twice then succeeds: the job is handled and the clock moved by two backoffs",
    arguments: StoreKind.allCases)
  func retriesWithBackoffRunToTheEnd(kind: StoreKind) async throws {
    let test = try kind.make()
    let clock = ManualJobClock()
    let start = clock.now()
    let attempts = Log<Int>()
    let queue = try emailQueue(test.store, clock: clock) { _, context in
      attempts.append(context.attempts)
      if context.attempts < 3 { throw URLError(.timedOut) }
      return .handled
    }
    try await queue.add(SendEmail(to: "ada@example.com"))
    let run = try await queue.runUntilIdle()
    await queue.shutdown(gracePeriod: .seconds(1))
    #expect(attempts.all == [1, 2, 3])
    #expect(run.clockAdvances == 2)
    #expect(run.timeAdvanced == .seconds(30))
    #expect(clock.now() == start.addingTimeInterval(30))
    #expect(run.counts == JobCounts())
    try await queue.expectNoJob()
  }

  @Test("delayed jobs run in run-date order, the clock moved to each run date", arguments: StoreKind.allCases)
  func delayedJobsRunInOrder(kind: StoreKind) async throws {
    let test = try kind.make()
    let clock = ManualJobClock()
    let start = clock.now()
    let ran = Log<String>()
    let queue = try emailQueue(test.store, clock: clock) { email, _ in
      ran.append("\(email.to) at +\(Int(clock.now().timeIntervalSince(start))) s")
      return .handled
    }
    try await queue.add(SendEmail(to: "later"), delay: .seconds(3600))
    try await queue.add(SendEmail(to: "sooner"), delay: .seconds(60))
    try await queue.add(SendEmail(to: "now"))
    let run = try await queue.runUntilIdle()
    await queue.shutdown(gracePeriod: .seconds(1))
    #expect(ran.all == ["now at +0 s", "sooner at +60 s", "later at +3600 s"])
    #expect(run.clockAdvances == 2)
    #expect(run.timeAdvanced == .seconds(3600))
  }

  @Test("a job that runs out of attempts is left dead and the run ends", arguments: StoreKind.allCases)
  func deadJobsDoNotStopTheRun(kind: StoreKind) async throws {
    let test = try kind.make()
    let clock = ManualJobClock()
    let queue = try emailQueue(test.store, clock: clock, maxAttempts: 2) { _, _ in
      .retry(reason: "mailbox full")
    }
    try await queue.add(SendEmail(to: "ada@example.com"))
    let run = try await queue.runUntilIdle()
    await queue.shutdown(gracePeriod: .seconds(1))
    #expect(run.dead == 1)
    #expect(run.clockAdvances == 1)
    let dead = try await queue.expectJob(status: .dead, count: 1)
    #expect(dead[0].record.lastError?.hasSuffix("mailbox full") == true, "\(dead[0].record)")
    #expect(dead[0].record.attempts == 2)
  }

  @Test("a handler that always retries stops at maxAdvances, and the error lists the job left")
  func advanceLimit() async throws {
    let clock = ManualJobClock()
    let queue = try emailQueue(InMemoryJobStore(), clock: clock) { _, _ in .retry(reason: "still down") }
    try await queue.add(SendEmail(to: "ada@example.com"))
    let error = try await #require(throws: QueueNotIdleError.self) {
      try await queue.runUntilIdle(maxAdvances: 3)
    }
    await queue.shutdown(gracePeriod: .seconds(1))
    #expect(error.reason == .advanceLimitReached(3))
    #expect(error.counts == JobCounts(scheduled: 1))
    #expect(error.remaining.map(\.attempts) == [4])
    // The text the guide (TestingYourJobs.md) shows, up to the payload, whose keys' order may vary.
    let expected = """
      expected queue "emails" to become idle, but jobs were still scheduled after 3 clock advance(s) \
      (maxAdvances). Clock: 2024-01-01T00:00:45.000Z. Found 0 ready, 1 scheduled, 0 running, 0 dead:
        job 1 scheduled for 2024-01-01T00:01:00.000Z, 4 attempt(s), last error: still down, payload: {
      """
    #expect(error.description.hasPrefix(expected), "\(error)")
    #expect(error.description.contains(#""to":"ada@example.com""#), "\(error)")
  }

  @Test("a run date past the horizon stops the run without moving the clock there")
  func horizon() async throws {
    let clock = ManualJobClock()
    let start = clock.now()
    let queue = try emailQueue(InMemoryJobStore(), clock: clock) { _, _ in .handled }
    try await queue.add(SendEmail(to: "soon"), delay: .seconds(60))
    try await queue.add(SendEmail(to: "tomorrow"), delay: .seconds(86_400))
    let horizon = start.addingTimeInterval(3600)
    let error = try await #require(throws: QueueNotIdleError.self) {
      try await queue.runUntilIdle(until: horizon)
    }
    await queue.shutdown(gracePeriod: .seconds(1))
    #expect(error.reason == .horizonReached(horizon))
    #expect(clock.now() == start.addingTimeInterval(60), "moved to the first job's date only")
    #expect(error.description.contains("lies after the horizon"), "\(error)")
    try await queue.expectJob(count: 1) { $0.to == "tomorrow" }
    try await queue.expectNoJob { $0.to == "soon" }
  }

  @Test(
    "a job held by another worker's lease: the run stops after its timeout and names the holder",
    arguments: StoreKind.allCases)
  func jobRunningElsewhere(kind: StoreKind) async throws {
    let test = try kind.make()
    let clock = ManualJobClock()
    let gate = Gate()
    defer { gate.open() }
    let holderStarted = Counter()
    let holder = try emailQueue(test.store, clock: clock) { _, _ in
      holderStarted.increment()
      await gate.wait()
      return .handled
    }
    try await holder.add(SendEmail(to: "held"))
    try await eventually("the other worker started the job") { holderStarted.value == 1 }
    let worker = try emailQueue(test.store, clock: clock) { _, _ in .handled }
    let error = try await #require(throws: QueueNotIdleError.self) {
      try await worker.runUntilIdle(timeout: .milliseconds(500))
    }
    #expect(error.reason == .timedOut(.milliseconds(500)))
    #expect(error.counts == JobCounts(running: 1))
    #expect(error.description.contains("job 1 running, lease held by "), "\(error)")
    // Once the other worker finishes, the run ends.
    gate.open()
    let run = try await worker.runUntilIdle()
    #expect(run.counts == JobCounts())
    #expect(holderStarted.value == 1)
    await worker.shutdown(gracePeriod: .seconds(1))
    await holder.shutdown(gracePeriod: .seconds(1))
  }

  @Test(
    "jobs another queue instance added are run, though the worker's poll waits for the clock",
    arguments: StoreKind.allCases)
  func jobsAddedElsewhere(kind: StoreKind) async throws {
    let test = try kind.make()
    let clock = ManualJobClock()
    let handled = Log<String>()
    let worker = try emailQueue(test.store, clock: clock) { email, _ in
      handled.append(email.to)
      return .handled
    }
    // The worker's loop sleeps until its next poll, a second of the manual clock away.
    try await waitUntilAsleep(try await mostAsleep(on: clock), on: clock)
    let producer = try JobQueue<SendEmail>(
      configuration: .init(identifier: "emails", autoStart: false, clock: clock), store: test.store
    ) { _, _ in .handled }
    try await producer.add(SendEmail(to: "from elsewhere"))
    let run = try await worker.runUntilIdle(timeout: .seconds(30))
    await worker.shutdown(gracePeriod: .seconds(1))
    #expect(handled.all == ["from elsewhere"])
    #expect(run.clockAdvances == 0)
  }

  // Failed before the guard (the run looked at the store again and again without pause, and never
  // returned): a store reporting a running job's lease while its counts show none running.
  @Test("a store whose answers disagree makes the run stop after its timeout, not spin")
  func disagreeingStoreIsBounded() async throws {
    let clock = ManualJobClock()
    let queue = try emailQueue(PhantomLeaseStore(), clock: clock) { _, _ in .handled }
    try await queue.add(SendEmail(to: "ada@example.com"))
    // The job is handled first (on a loaded machine, later than the run's 300 ms): then only the
    // phantom lease is left for the run to give up on.
    let deadline = ContinuousClock.now + .seconds(60)
    while try await queue.count() != JobCounts(), ContinuousClock.now < deadline {
      try await Task.sleep(for: .milliseconds(5))
    }
    let error = try await #require(throws: QueueNotIdleError.self) {
      try await queue.runUntilIdle(timeout: .milliseconds(300))
    }
    await queue.shutdown(gracePeriod: .seconds(1))
    #expect(error.reason == .timedOut(.milliseconds(300)))
    #expect(error.counts == JobCounts())
  }

  // A clock started between two milliseconds (`ManualJobClock(start: Date())` does, one run in two
  // on average): stores keep run dates in whole milliseconds, rounded to the nearest, so a job is
  // ready once the clock is within half a millisecond of its date.
  @Test(
    "a clock started between two milliseconds is moved by the retry backoffs, not a millisecond more each",
    arguments: StoreKind.allCases)
  func clockBetweenMilliseconds(kind: StoreKind) async throws {
    let test = try kind.make()
    let clock = ManualJobClock(start: Date(timeIntervalSince1970: 1_704_067_200.0007))
    let start = clock.now()
    let queue = try emailQueue(test.store, clock: clock) { _, context in
      if context.attempts < 3 { throw URLError(.timedOut) }
      return .handled
    }
    try await queue.add(SendEmail(to: "ada@example.com"))
    let run = try await queue.runUntilIdle()
    await queue.shutdown(gracePeriod: .seconds(1))
    #expect(run.clockAdvances == 2)
    #expect(run.timeAdvanced == .seconds(30), "two 15 s backoffs")
    #expect(clock.now().timeIntervalSince(start) <= 30.0005, "moved past the second run date")
  }

  @Test(
    "a job delayed by a minute runs when the horizon is a minute away, on a clock started between milliseconds"
  )
  func horizonOnAClockBetweenMilliseconds() async throws {
    let clock = ManualJobClock(start: Date(timeIntervalSince1970: 1_704_067_200.0007))
    let handled = Log<String>()
    let queue = try emailQueue(InMemoryJobStore(), clock: clock) { email, _ in
      handled.append(email.to)
      return .handled
    }
    try await queue.add(SendEmail(to: "in a minute"), delay: .seconds(60))
    let horizon = clock.now().addingTimeInterval(60)
    do {
      try await queue.runUntilIdle(until: horizon)
    } catch {
      Issue.record("the run stopped: \(error)")
    }
    await queue.shutdown(gracePeriod: .seconds(1))
    #expect(handled.all == ["in a minute"])
    #expect(clock.now() <= horizon, "the clock is never moved past the horizon")
  }

  @Test("the clock is never moved past the horizon, on a clock started between milliseconds")
  func clockStaysWithinTheHorizon() async throws {
    let clock = ManualJobClock(start: Date(timeIntervalSince1970: 1_704_067_200.0007))
    let handled = Log<String>()
    let queue = try emailQueue(InMemoryJobStore(), clock: clock) { email, _ in
      handled.append(email.to)
      return .handled
    }
    try await queue.add(SendEmail(to: "in a minute"), delay: .seconds(60))
    // The job's run date (rounded to the millisecond by the store) lies before the horizon.
    let horizon = clock.now().addingTimeInterval(60.0005)
    let runAt = try #require(try await queue.jobs().first?.runAt)
    #expect(runAt <= horizon)
    try await queue.runUntilIdle(until: horizon)
    await queue.shutdown(gracePeriod: .seconds(1))
    #expect(handled.all == ["in a minute"])
    #expect(
      clock.now() <= horizon,
      "moved to \(clock.now().timeIntervalSince1970), past the horizon \(horizon.timeIntervalSince1970)")
  }

  @Test("the error lists a ready job as ready, as its counts do, on a clock started between milliseconds")
  func listingAgreesWithCounts() async throws {
    let clock = ManualJobClock(start: Date(timeIntervalSince1970: 1_704_067_200.0007))
    let queue = try emailQueue(InMemoryJobStore(), clock: clock) { _, _ in .handled }
    try await queue.pause()
    try await queue.add(SendEmail(to: "ada@example.com"))
    let error = try await #require(throws: QueueNotIdleError.self) { try await queue.runUntilIdle() }
    await queue.shutdown(gracePeriod: .seconds(1))
    #expect(error.reason == .paused)
    #expect(error.counts == JobCounts(ready: 1))
    #expect(error.description.contains("job 1 ready"), "\(error)")
  }

  /// An event of an order: the order's events run one at a time, in the order added.
  struct OrderEvent: Queueable {
    var order: String
    var orderingKey: String? { order }
  }

  @Test("the error lists a job held behind an earlier job of its ordering key as held, and counts it")
  func heldJobsAreListedAsHeld() async throws {
    let clock = ManualJobClock()
    let queue = try JobQueue<OrderEvent>(
      configuration: .init(identifier: "orders", clock: clock), store: InMemoryJobStore()
    ) { _, _ in .handled }
    try await queue.pause()
    try await queue.add(OrderEvent(order: "A-17"))
    try await queue.add(OrderEvent(order: "A-17"))
    let error = try await #require(throws: QueueNotIdleError.self) { try await queue.runUntilIdle() }
    await queue.shutdown(gracePeriod: .seconds(1))
    #expect(error.reason == .paused)
    #expect(error.counts == JobCounts(ready: 1, held: 1))
    #expect(error.remaining.map(\.isHeld) == [false, true])
    #expect(error.description.contains("job 1 ready"), "\(error)")
    #expect(!error.description.contains("job 2 ready"), "a held job listed as ready: \(error)")
    #expect(error.description.contains("1 held"), "the counts leave the held job out: \(error)")
  }

  @Test("a paused queue is refused before the clock is moved to a scheduled job")
  func pausedQueueKeepsTheClock() async throws {
    let clock = ManualJobClock()
    let start = clock.now()
    let queue = try emailQueue(InMemoryJobStore(), clock: clock) { _, _ in .handled }
    try await queue.pause()
    try await queue.add(SendEmail(to: "ada@example.com"), delay: .seconds(3600))
    let error = try await #require(throws: QueueNotIdleError.self) { try await queue.runUntilIdle() }
    await queue.shutdown(gracePeriod: .seconds(1))
    #expect(error.reason == .paused)
    #expect(clock.now() == start, "refused, yet the clock was moved to the job's run date")
  }

  @Test("the error lists each job left on one line, whatever its last error holds")
  func remainingJobsOneLineEach() async throws {
    let clock = ManualJobClock()
    let queue = try emailQueue(InMemoryJobStore(), clock: clock) { _, _ in
      // A server's answer, as an error description often carries it.
      .retry(reason: "HTTP 503\r\n  job 99 dead, 1 attempt(s), payload: {\"to\":\"forged@example.com\"}")
    }
    try await queue.add(SendEmail(to: "ada@example.com"))
    let error = try await #require(throws: QueueNotIdleError.self) {
      try await queue.runUntilIdle(maxAdvances: 0)
    }
    await queue.shutdown(gracePeriod: .seconds(1))
    #expect(error.remaining.count == 1)
    let lines = error.description.split(whereSeparator: \.isNewline)
    #expect(lines.count == 1 + error.remaining.count, "\(error)")
    #expect(!lines.contains { $0.hasPrefix("  job 99 ") }, "a forged job line: \(error)")
  }

  @Test("a delegate-form queue whose delegate is not ready for jobs is refused, saying so")
  func delegateNotReadyIsNamed() async throws {
    let delegate = UnreadyDelegate()
    let queue = try JobQueue<SendEmail>(
      configuration: .init(identifier: "emails", clock: ManualJobClock()), store: InMemoryJobStore(),
      delegate: delegate)
    try await queue.add(SendEmail(to: "ada@example.com"))
    let error = try await #require(throws: QueueNotIdleError.self) {
      try await queue.runUntilIdle(timeout: .seconds(1))
    }
    await queue.shutdown(gracePeriod: .seconds(1))
    withExtendedLifetime(delegate) {}
    #expect(error.counts == JobCounts(ready: 1))
    #expect(error.description.contains("isReadyForJobs"), "\(error)")
  }

  @Test("a paused queue, a stopped queue and a queue on the system clock are refused with what to do")
  func refusals() async throws {
    let clock = ManualJobClock()
    let store = InMemoryJobStore()
    let paused = try emailQueue(store, clock: clock, identifier: "paused") { _, _ in .handled }
    try await paused.pause()
    try await paused.add(SendEmail(to: "ada@example.com"))
    let pausedError = try await #require(throws: QueueNotIdleError.self) { try await paused.runUntilIdle() }
    #expect(pausedError.reason == .paused)
    #expect(pausedError.description.contains("call resume() first"), "\(pausedError)")
    await paused.shutdown(gracePeriod: .seconds(1))

    let stopped = try JobQueue<SendEmail>(
      configuration: .init(identifier: "stopped", autoStart: false, clock: clock), store: store
    ) { _, _ in .handled }
    try await stopped.add(SendEmail(to: "ada@example.com"))
    let stoppedError = try await #require(throws: QueueNotIdleError.self) { try await stopped.runUntilIdle() }
    #expect(stoppedError.reason == .stopped)
    #expect(stoppedError.description.contains("call start() first"), "\(stoppedError)")

    let system = try JobQueue<SendEmail>(
      configuration: .init(identifier: "system", autoStart: false), store: store
    ) { _, _ in .handled }
    let systemError = try await #require(throws: QueueNotIdleError.self) { try await system.runUntilIdle() }
    #expect(systemError.reason == .clockNotManual)
    #expect(systemError.description.contains("configuration.clock = ManualJobClock()"), "\(systemError)")
  }
}
