import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import Conveyor

struct Request: Queueable, Hashable {
  var name: String
  var key: String? = nil
  var deduplicationKey: String? { key }
}

/// The seed library's delegate, answering `.retry` the first time it sees "retry-once".
final class SeedDelegate: JobQueueDelegate {
  let handled = Log<String>()
  let attemptsSeen = Log<String>()
  let finishedCount = Mutex(0)

  func queue(
    _ queue: JobQueue<Request>, handle item: Request, attempts: Int,
    completion: @escaping @Sendable (JobResult) -> Void
  ) {
    attemptsSeen.append("\(item.name)#\(attempts)")
    DispatchQueue.global().async {
      if item.name == "retry-once" && attempts == 1 {
        completion(.retry)
      } else {
        self.handled.append(item.name)
        completion(.handled)
        completion(.retry)  // a second call is ignored
      }
    }
  }

  func queueFinished(_ queue: JobQueue<Request>) {
    finishedCount.withLock { $0 += 1 }
  }
}

/// A queue whose handler records each item's name and handles it.
func recordingQueue(
  _ configuration: JobQueueConfiguration, store: any JobStore
) throws -> (JobQueue<Request>, Log<String>) {
  let handled = Log<String>()
  let queue = try JobQueue<Request>(configuration: configuration, store: store) { item, _ in
    handled.append(item.name)
    return .handled
  }
  return (queue, handled)
}

@Suite("JobQueue")
struct JobQueueTests {
  let clock = ManualJobClock()

  func configuration(
    _ identifier: String = "jobs", concurrency: Int = 1, autoStart: Bool = true,
    retry: RetryPolicy = .fixed(.seconds(15)), maxAttempts: Int? = nil, lease: Duration = .seconds(60)
  ) -> JobQueueConfiguration {
    JobQueueConfiguration(
      identifier: identifier, retryPolicy: retry, maxAttempts: maxAttempts, concurrency: concurrency,
      autoStart: autoStart, leaseDuration: lease, clock: clock)
  }

  @Test("the seed scenario: api-requests, start, retry after 30 s, pause, resume, finished")
  func seedScenario() async throws {
    let store = InMemoryJobStore()
    let delegate = SeedDelegate()
    let queue = try JobQueue<Request>(
      configuration: configuration("api-requests", autoStart: false, retry: .fixed(.seconds(30))),
      store: store, delegate: delegate)
    let events = EventRecorder(queue.events)
    #expect(queue.state == .stopped)
    for name in ["first", "retry-once", "third"] { try await queue.add(Request(name: name)) }
    try await Task.sleep(for: .milliseconds(20))
    #expect(delegate.handled.all.isEmpty, "nothing runs before start()")

    queue.start()
    try await eventually("first and third handled") { delegate.handled.all == ["first", "third"] }
    #expect(delegate.attemptsSeen.all == ["first#1", "retry-once#1", "third#1"], "handled in order")
    try await eventually("idle while the retry waits") { queue.state == .idle }
    #expect(try await queue.count().withoutHistory == JobCounts(scheduled: 1))

    clock.advance(by: .seconds(29))
    try await Task.sleep(for: .milliseconds(30))
    #expect(delegate.handled.count == 2, "not before the 30 s interval")

    try await queue.pause()
    #expect(queue.state == .paused)
    clock.advance(by: .seconds(2))
    try await Task.sleep(for: .milliseconds(50))
    #expect(delegate.handled.count == 2, "a paused queue runs no retries")
    #expect(try await store.isPaused(queue: "api-requests"), "the pause is stored")

    try await queue.resume()
    try await eventually("retried item handled") { delegate.handled.all == ["first", "third", "retry-once"] }
    #expect(delegate.attemptsSeen.all.last == "retry-once#2", "attempt count raised")
    try await eventually("queueFinished") { delegate.finishedCount.withLock { $0 } >= 1 }
    #expect(try await queue.count().total == 0)
    #expect(events.events.contains(.stateChanged(.running)))
    #expect(events.events.contains(.stateChanged(.paused)))
    try await events.wait(for: "finished event") { $0.contains(.finished) }
    await queue.shutdown()
    #expect(queue.state == .stopped)
  }

  @Test("start() starts an idle queue that was created stopped")
  func startStartsIdleQueue() async throws {
    let (queue, handled) = try recordingQueue(configuration(autoStart: false), store: InMemoryJobStore())
    queue.start()
    try await eventually("idle") { queue.state == .idle }
    try await queue.add(Request(name: "a"))
    try await eventually("handled") { handled.all == ["a"] }
    await queue.waitUntilFinished()
    await queue.shutdown()
  }

  @Test("a job waiting for its retry never blocks a ready one")
  func retryDoesNotBlock() async throws {
    let handled = Log<String>()
    let queue = try JobQueue<Request>(configuration: configuration(), store: InMemoryJobStore()) {
      item, ctx in
      if item.name == "flaky" && ctx.attempts == 1 { return .retry }
      handled.append(item.name)
      return .handled
    }
    try await queue.add(Request(name: "flaky"))
    for index in 0..<5 { try await queue.add(Request(name: "ready-\(index)")) }
    try await eventually("all ready handled") { handled.count == 5 }
    #expect(handled.all == (0..<5).map { "ready-\($0)" })
    clock.advance(by: .seconds(15))
    try await eventually("flaky handled after its interval") { handled.all.last == "flaky" }
    await queue.shutdown()
  }

  @Test("thrown errors retry by policy and are recorded; maxAttempts makes the job dead")
  func thrownErrorsAndDeadJobs() async throws {
    struct Boom: Error, CustomStringConvertible { var description: String { "boom" } }
    let attempts = Log<Int>()
    let queue = try JobQueue<Request>(
      configuration: configuration(retry: .fixed(.seconds(10)), maxAttempts: 3), store: InMemoryJobStore()
    ) { _, ctx in
      attempts.append(ctx.attempts)
      throw Boom()
    }
    let events = EventRecorder(queue.events)
    let id = try await queue.add(Request(name: "doomed")).id
    try await eventually("first attempt") { attempts.count == 1 }
    try await events.wait(for: "retry scheduled") {
      $0.contains { if case .retryScheduled = $0 { true } else { false } }
    }
    let pending = try await queue.jobs(in: .pending)
    #expect(pending.first?.lastError == "boom", "the error is recorded")
    #expect(pending.first?.runAt == clock.now().addingTimeInterval(10), "retry after the fixed interval")
    clock.advance(by: .seconds(10))
    try await eventually("second attempt") { attempts.count == 2 }
    try await eventually("second retry recorded") { try await queue.count().scheduled == 1 }
    clock.advance(by: .seconds(10))
    try await events.wait(for: "died") { $0.contains { if case .died(id, _) = $0 { true } else { false } } }
    #expect(attempts.all == [1, 2, 3])
    let dead = try await queue.jobs(in: .dead)
    #expect(dead.map(\.id) == [id])
    #expect(dead.first?.lastError?.contains("gave up after 3 attempt(s): boom") == true)
    #expect(try queue.item(of: dead[0]) == Request(name: "doomed"), "a dead job keeps its item")

    #expect(try await queue.requeueDead() == 1)
    try await eventually("re-queued job runs again") { attempts.count == 4 }
    #expect(attempts.all.last == 1, "attempts reset by re-queueing")
    clock.advance(by: .seconds(10))
    try await eventually("second attempt after requeue") { attempts.count == 5 }
    // The retry must be recorded before the clock moves, or it is scheduled 10 s after the move.
    try await eventually("second retry after requeue recorded") { try await queue.count().scheduled == 1 }
    clock.advance(by: .seconds(10))
    try await eventually("dead again") { try await queue.count().dead == 1 }
    #expect(try await queue.purgeDead() == 1)
    #expect(try await queue.count().total == 0)
    await queue.shutdown()
  }

  @Test("retry(after:) overrides the policy; discard makes the job dead with its reason")
  func resultOverrides() async throws {
    let seen = Log<String>()
    let queue = try JobQueue<Request>(
      configuration: configuration(retry: .fixed(.seconds(1000))), store: InMemoryJobStore()
    ) {
      item, ctx in
      seen.append("\(item.name)#\(ctx.attempts)")
      switch item.name {
      case "later": return ctx.attempts == 1 ? .retry(after: .seconds(5), reason: "busy") : .handled
      default: return .discard(reason: "not wanted")
      }
    }
    try await queue.add(Request(name: "later"))
    try await queue.add(Request(name: "drop"))
    try await eventually("both tried") { seen.count == 2 }
    try await eventually("drop is dead") { try await queue.count().dead == 1 }
    #expect(try await queue.jobs(in: .dead).first?.lastError == "not wanted")
    #expect(try await queue.jobs(in: .pending).first?.lastError == "busy")
    clock.advance(by: .seconds(5))
    try await eventually("later handled after 5 s, not 1000 s") { seen.all.contains("later#2") }
    await queue.shutdown()
  }

  @Test("retry policies: fixed, exponential with cap and deterministic jitter, custom")
  func retryPolicies() {
    #expect(RetryPolicy.fixed(.seconds(30)).delay(afterAttempt: 7) == .seconds(30))
    let noJitter = RetryPolicy.exponential(
      initial: .seconds(1), multiplier: 2, maximum: .seconds(10), jitter: 0)
    #expect((1...6).map { noJitter.delay(afterAttempt: $0) } == [1, 2, 4, 8, 10, 10].map { .seconds($0) })
    let halfJitter = RetryPolicy.exponential(
      initial: .seconds(4), multiplier: 3, maximum: .seconds(100), jitter: 0.5, random: { 0.5 })
    #expect(halfJitter.delay(afterAttempt: 1) == .seconds(3), "4 s shortened by 0.5 × 0.5")
    #expect(halfJitter.delay(afterAttempt: 2) == .seconds(9), "12 s shortened by a quarter")
    #expect(halfJitter.delay(afterAttempt: 9) == .seconds(75), "capped at 100 s, then jittered")
    let custom = RetryPolicy.custom { .seconds($0 * 10) }
    #expect(custom.delay(afterAttempt: 3) == .seconds(30))
  }

  @Test("configuration is validated with errors that say what to do")
  func validation() throws {
    for bad in ["", "has space", "slash/name", String(repeating: "x", count: 129), "émoji"] {
      #expect(throws: JobQueueError.invalidIdentifier(bad)) {
        try JobQueue<Request>(configuration: .init(identifier: bad), store: InMemoryJobStore()) { _, _ in
          .handled
        }
      }
    }
    #expect(JobQueueError.invalidIdentifier("a b").description.contains("A-Z, a-z, 0-9"))
    var config = JobQueueConfiguration(identifier: "ok.name_1-2")
    try config.validate()
    config.concurrency = 0
    #expect(throws: JobQueueError.self) { try config.validate() }
    config.concurrency = 1
    config.maxAttempts = 0
    #expect(throws: JobQueueError.self) { try config.validate() }
    #expect(JobQueueConfiguration(identifier: "x").retryPolicy.delay(afterAttempt: 1) == .seconds(15))
    #expect(JobQueueConfiguration(identifier: "x").leaseDuration == .seconds(60))
    #expect(JobQueueConfiguration(identifier: "x").concurrency == 1)
  }

  @Test("a retention period out of range is refused, however many days it names")
  func retentionOutOfRange() throws {
    var configuration = JobQueueConfiguration(identifier: "history", autoStart: false)
    // 2^57 + 1 days is far more than 100 years; 86 400 times it wraps around Int64 to one day.
    for days in [0, -1, 36_501, Int.max, Int.min, (1 << 57) + 1] {
      configuration.retention.completed = .days(days)
      #expect(throws: JobQueueError.self, "\(days) days") { try configuration.validate() }
    }
    configuration.retention.completed = .days(36_500)
    try configuration.validate()
  }

  @Test("a time limit out of range is refused with what is allowed, and nothing is stored")
  func timeLimitsOutOfRange() async throws {
    let store = InMemoryJobStore()
    var configuration = JobQueueConfiguration(identifier: "limits", autoStart: false)
    for bad: Duration in [
      .zero, .microseconds(999), .seconds(-1), .seconds(7 * 86_400 + 1), .seconds(Int64.max),
    ] {
      configuration.timeLimit = bad
      #expect(throws: JobQueueError.self) { try configuration.validate() }
    }
    configuration.timeLimit = .seconds(7 * 86_400)
    try configuration.validate()
    configuration.timeLimitGrace = .seconds(-1)
    #expect(throws: JobQueueError.self) { try configuration.validate() }
    configuration.timeLimitGrace = .zero
    let queue = try JobQueue<Request>(configuration: configuration, store: store) { _, _ in .handled }
    for bad: Duration in [.zero, .seconds(-5), .seconds(8 * 86_400), .seconds(Int64.max)] {
      await #expect(throws: JobQueueError.self) { try await queue.add(Request(name: "a"), timeLimit: bad) }
      await #expect(throws: JobQueueError.self) {
        try await queue.add(contentsOf: [Request(name: "a")], timeLimit: bad)
      }
      await #expect(throws: JobQueueError.self) {
        try await queue.add(Request(name: "a"), runAt: Date(), timeLimit: bad)
      }
    }
    do {
      try await queue.add(Request(name: "a"), timeLimit: .zero)
    } catch {
      #expect("\(error)".contains("between 1 ms and 7 days"), "\(error)")
    }
    #expect(try await queue.count().total == 0, "nothing stored")
    let added = try await queue.add(Request(name: "a"), timeLimit: .milliseconds(1))
    #expect(try await store.job(added.id)?.timeLimit == .milliseconds(1))
  }

  /// `waitUntilFinished` returns "when the store holds no waiting or running job": a handler
  /// past its time limit whose attempt is recorded (here its job is dead) holds no job, only its
  /// worker slot. Waiting for it makes a handler that never returns, the very hang time limits
  /// are for, hang every caller of `waitUntilFinished` (and `.finished`, `queueFinished`) too.
  @Test("waitUntilFinished returns while a handler past its time limit is stuck, its job recorded")
  func waitUntilFinishedDoesNotWaitForAStuckHandler() async throws {
    var configuration = configuration("stuck-finish", autoStart: false, maxAttempts: 1)
    configuration.timeLimit = .seconds(10)
    configuration.timeLimitGrace = .seconds(10)
    let release = Gate()
    let started = Log<String>()
    let queue = try JobQueue<Request>(configuration: configuration, store: InMemoryJobStore()) { item, _ in
      started.append(item.name)
      await release.wait()  // ignores cancellation
      return .handled
    }
    let recorder = EventRecorder(queue.events)
    let stuck = try await queue.add(Request(name: "stuck")).id
    queue.start()
    try await eventually("the handler started") { started.all == ["stuck"] }
    clock.advance(by: .seconds(10))  // the limit
    try await recorder.wait(for: "the attempt recorded: the job is dead") { events in
      events.contains { if case .died(stuck, _) = $0 { true } else { false } }
    }
    #expect(try await queue.count() == JobCounts(dead: 1), "no waiting or running job is left")
    let returned = Mutex(false)
    let waiter = Task {
      await queue.waitUntilFinished()
      returned.withLock { $0 = true }
    }
    let finished = await eventually(timeout: .seconds(20)) { returned.withLock { $0 } }
    #expect(finished, "waitUntilFinished returned while the stuck handler still holds its slot")
    release.open()
    await waiter.value
    await queue.shutdown()
  }

  /// `.stuck` says a handler "ignores cancellation": its grace must run from when it was
  /// cancelled. When the limit's cancellation comes late on the queue's clock (a stalled or
  /// suspended machine; a test clock moved in one step), a handler that honours cancellation at
  /// once, with a short clean-up, must not be reported stuck, logged as an error and counted.
  @Test("a handler that honours a late-delivered cancellation promptly is not reported stuck")
  func lateCancellationGetsItsGrace() async throws {
    var configuration = configuration("late-cancel", autoStart: false, maxAttempts: 1)
    configuration.timeLimit = .seconds(10)
    configuration.timeLimitGrace = .seconds(10)
    let steps = Log<String>()
    let queue = try JobQueue<Request>(configuration: configuration, store: InMemoryJobStore()) { _, _ in
      steps.append("started")
      do {
        try await Task.sleep(for: .seconds(600))
      } catch {
        // Cancelled: a short clean-up (closing a connection), then it returns.
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
          DispatchQueue.global().asyncAfter(deadline: .now() + 0.05) { continuation.resume() }
        }
        steps.append("returned after its cancellation")
      }
      return .handled
    }
    let recorder = EventRecorder(queue.events)
    let id = try await queue.add(Request(name: "slow")).id
    queue.start()
    try await eventually("the handler started") { steps.all == ["started"] }
    clock.advance(by: .seconds(30))  // the limit and its grace pass before anything could run
    try await recorder.wait(for: "the attempt recorded as timed out") { events in
      events.contains { if case .died(id, _) = $0 { true } else { false } }
    }
    try await eventually("the handler returned") { steps.all.count == 2 }
    await queue.waitUntilFinished()  // the worker let its slot go
    await queue.shutdown()
    let stuck = recorder.events.filter { if case .stuck = $0 { true } else { false } }
    #expect(stuck.isEmpty, "a handler that returned promptly once cancelled was reported stuck: \(stuck)")
  }

  /// A handler that hangs by blocking its thread (a lock taken twice, a semaphore never
  /// signalled: the deadlocks the time limits guide names) holds a thread of Swift's cooperative
  /// pool. With as many such handlers as the pool has threads, the limit's timer task cannot run
  /// before they return; what they return then, long past their limit, must still not be recorded.
  @Test("a result returned past the limit is not recorded, even when blocked handlers held every pool thread")
  func resultPastTheLimitIsNotRecordedWhenThePoolWasBlocked() async throws {
    let jobs = max(2, ProcessInfo.processInfo.activeProcessorCount)
    let store = InMemoryJobStore()
    var configuration = JobQueueConfiguration(
      identifier: "blocked", maxAttempts: 1, concurrency: jobs, autoStart: false)
    configuration.timeLimit = .milliseconds(100)
    let hang = DispatchSemaphore(value: 0)
    let queue = try JobQueue<Request>(configuration: configuration, store: store) { _, _ in
      hang.wait()  // blocks its thread, as a deadlocked handler does
      return .handled
    }
    try await queue.add(contentsOf: (0..<jobs).map { Request(name: "j\($0)") })
    // Released from a thread of its own, outside the blocked pool, well past the limit.
    let releaser = Thread {
      Thread.sleep(forTimeInterval: 2)
      for _ in 0..<jobs { hang.signal() }
    }
    queue.start()
    releaser.start()
    await queue.waitUntilFinished()
    await queue.shutdown()
    let records = try await store.jobs(queue: "blocked", status: nil, after: nil, limit: jobs)
    let timedOut = records.filter { $0.status == .dead && $0.lastError?.contains("timed out") == true }
    #expect(
      timedOut.count == jobs,
      "every attempt ran 2 s past its 0.1 s limit and is recorded as timed out, not as what it returned: \(records)"
    )
  }

  @Test("delayed jobs wait; higher priority runs first")
  func delayAndPriority() async throws {
    let (queue, handled) = try recordingQueue(configuration(autoStart: false), store: InMemoryJobStore())
    try await queue.add(Request(name: "delayed"), delay: .seconds(60))
    try await queue.add(Request(name: "normal"))
    try await queue.add(Request(name: "urgent"), priority: 10)
    try await queue.add(Request(name: "low"), priority: -5)
    queue.start()
    try await eventually("ready ones handled") { handled.count == 3 }
    #expect(handled.all == ["urgent", "normal", "low"])
    clock.advance(by: .seconds(60))
    try await eventually("delayed handled") { handled.count == 4 }
    await queue.shutdown()
  }

  @Test("concurrency N runs N at once and never one job twice")
  func concurrency() async throws {
    let running = Mutex((now: 0, peak: 0))
    let handled = Log<String>()
    let queue = try JobQueue<Request>(configuration: configuration(concurrency: 4), store: InMemoryJobStore())
    {
      item, _ in
      running.withLock {
        $0.now += 1
        $0.peak = max($0.peak, $0.now)
      }
      try await Task.sleep(for: .milliseconds(5))
      running.withLock { $0.now -= 1 }
      handled.append(item.name)
      return .handled
    }
    try await queue.add(contentsOf: (0..<200).map { Request(name: "j\($0)") })
    await queue.waitUntilFinished()
    #expect(handled.count == 200)
    #expect(Set(handled.all).count == 200, "no job handled twice")
    #expect(running.withLock { $0.peak } == 4, "four at once, never more")
    await queue.shutdown()
  }

  @Test("removing or clearing while a job runs neither loses nor double-handles another")
  func removeWhileRunning() async throws {
    let gate = Gate()
    let handled = Log<String>()
    let queue = try JobQueue<Request>(configuration: configuration(), store: InMemoryJobStore()) { item, _ in
      if item.name == "blocker" { await gate.wait() }
      handled.append(item.name)
      return .handled
    }
    let blocker = try await queue.add(Request(name: "blocker")).id
    let doomed = try await queue.add(Request(name: "doomed")).id
    try await queue.add(Request(name: "keeper"))
    try await eventually("blocker running") { queue.state == .running }
    #expect(try await queue.remove(doomed))
    #expect(try await queue.remove(blocker), "a running job can be removed")
    gate.open()
    await queue.waitUntilFinished()
    #expect(handled.all == ["blocker", "keeper"], "the removed pending job never ran; the rest ran once")

    let gate2 = Gate()
    let queue2 = try JobQueue<Request>(configuration: configuration("second"), store: InMemoryJobStore()) {
      item, _ in
      await gate2.wait()
      handled.append(item.name)
      return .handled
    }
    try await queue2.add(contentsOf: [Request(name: "running"), Request(name: "p1"), Request(name: "p2")])
    try await eventually("running") { queue2.state == .running }
    #expect(try await queue2.clear() == 2, "clear deletes the pending jobs")
    gate2.open()
    await queue2.waitUntilFinished()
    #expect(handled.all.suffix(1) == ["running"], "the running job finished once")
    await queue.shutdown()
    await queue2.shutdown()
  }

  @Test("an undecodable payload becomes a dead job with the decode error; the rest go on")
  func undecodable() async throws {
    let store = InMemoryJobStore()
    _ = try await store.enqueue(
      [NewJob(payload: Data(#"{"unexpected":1}"#.utf8), runAt: clock.now())], queue: "jobs", now: clock.now())
    let handled = Log<String>()
    let queue = try JobQueue<Request>(configuration: configuration(), store: store) { item, _ in
      handled.append(item.name)
      return .handled
    }
    try await queue.add(Request(name: "fine"))
    try await eventually("fine handled") { handled.all == ["fine"] }
    try await eventually("dead") { try await queue.count().dead == 1 }
    let dead = try await queue.jobs(in: .dead)
    #expect(dead.first?.lastError?.contains("undecodable payload") == true)
    #expect(dead.first?.payload == Data(#"{"unexpected":1}"#.utf8), "the payload is kept as it was")
    await queue.shutdown()
  }

  /// A job with fields the queue's own decoder handles and fields it hands to `JSONDecoder`.
  struct MixedJob: Queueable, Equatable {
    var name: String
    var count: Int
    var at: Date
    var ratio: Float
    var link: URL?
    var blob: Data?
  }

  @Test("a worker gets what JSONDecoder gives: the same values, and its error for a bad payload")
  func workersDecodeAsJSONDecoderDoes() async throws {
    let store = InMemoryJobStore()
    let plain = MixedJob(name: "plain", count: -3, at: Date(timeIntervalSince1970: 1.5), ratio: 0.1)
    let special = MixedJob(
      name: "special\u{1F600}", count: Int.max, at: Date(timeIntervalSince1970: -2), ratio: 3.25,
      link: URL(string: "https://example.com/a?b=c"), blob: Data([0, 1, 255]))
    let bad = Data(#"{"name":"x","count":1.5,"at":0,"ratio":1}"#.utf8)
    let expectedError = String(
      describing: try #require(throws: (any Error).self) {
        try JSONDecoder().decode(MixedJob.self, from: bad)
      })
    _ = try await store.enqueue([NewJob(payload: bad, runAt: clock.now())], queue: "jobs", now: clock.now())
    let handled = Log<MixedJob>()
    let queue = try JobQueue<MixedJob>(configuration: configuration(), store: store) { item, _ in
      handled.append(item)
      return .handled
    }
    try await queue.add(contentsOf: [plain, special])
    try await eventually("both handled") { handled.all.count == 2 }
    #expect(handled.all == [plain, special])
    try await eventually("dead") { try await queue.count().dead == 1 }
    let dead = try await queue.jobs(in: .dead)
    #expect(dead.first?.lastError?.contains(expectedError) == true, "\(dead.first?.lastError ?? "nil")")
    await queue.shutdown()
  }

  @Test("a slow handler that heartbeats keeps its job; a vanished worker's job is handed out again")
  func leases() async throws {
    let store = InMemoryJobStore()
    let gate = Gate()
    let seenA = Log<JobID>()
    let seenB = Log<JobID>()
    let queueA = try JobQueue<Request>(configuration: configuration(lease: .seconds(30)), store: store) {
      _, ctx in
      seenA.append(ctx.id)
      await gate.wait()
      return .handled
    }
    let queueB = try JobQueue<Request>(
      configuration: configuration(autoStart: false, lease: .seconds(30)), store: store
    ) { _, ctx in
      seenB.append(ctx.id)
      return .handled
    }
    let id = try await queueA.add(Request(name: "slow")).id
    try await eventually("A started it") { seenA.count == 1 }
    queueB.start()
    // Every loop of both queues asleep on the clock (A's heartbeat among them): each step below
    // waits for as many again before it advances, so a loop slow to sleep again on a loaded
    // machine never misses a step (its deadline would be counted from a later time).
    let asleep = try await mostAsleep(on: clock)
    // Move time past two leases in steps: A heartbeats every 10 s, so its lease never has less
    // than 20 s left, and B (which rescues expired leases) never gets the job.
    for _ in 0..<12 {
      clock.advance(by: .seconds(5))
      try await eventually("A heartbeated in time") {
        let running = try await store.jobs(queue: "jobs", status: .running, after: nil, limit: 1)
        guard let expiry = running.first?.leaseExpiresAt else { return false }
        return expiry.timeIntervalSince(clock.now()) >= 20
      }
      try await waitUntilAsleep(asleep, on: clock)
    }
    #expect(seenB.count == 0, "a job whose lease is heartbeated is not handed out again")
    gate.open()
    try await eventually("done") { try await store.counts(queue: "jobs", now: clock.now()).total == 0 }
    #expect(seenA.all + seenB.all == [id])
    await queueA.shutdown()

    // A worker that vanished: its claim is never settled nor heartbeated.
    let ghost = try await store.enqueue(
      [NewJob(payload: try JSONEncoder().encode(Request(name: "orphan")), runAt: clock.now())], queue: "jobs",
      now: clock.now())[0].id
    let batch = try await store.settleAndClaim(
      [], queue: "jobs", limit: 1,
      lease: Lease(owner: "ghost", duration: .seconds(30)), now: clock.now())
    #expect(batch.claimed.map(\.id) == [ghost])
    clock.advance(by: .seconds(29))
    try await Task.sleep(for: .milliseconds(30))
    #expect(!seenB.all.contains(ghost), "not before the lease ends")
    clock.advance(by: .seconds(31))
    try await eventually("rescued and handled by B") { seenB.all.contains(ghost) }
    await queueB.shutdown()
  }

  @Test("events report enqueued, started, succeeded, retry scheduled, died, finished and state")
  func events() async throws {
    let queue = try JobQueue<Request>(configuration: configuration(maxAttempts: 1), store: InMemoryJobStore())
    {
      item, _ in item.name == "ok" ? .handled : .retry
    }
    let events = EventRecorder(queue.events)
    let ok = try await queue.add(Request(name: "ok")).id
    let bad = try await queue.add(Request(name: "bad")).id
    await queue.waitUntilFinished()
    try await events.wait(for: "finished") { $0.contains(.finished) }
    let all = events.events
    #expect(all.contains(.enqueued(ok)) && all.contains(.enqueued(bad)))
    #expect(all.contains(.started(ok, attempt: 1)) && all.contains(.succeeded(ok)))
    #expect(
      all.contains {
        if case .died(bad, let reason) = $0 { reason.contains("gave up after 1") } else { false }
      })
    #expect(all.contains(.stateChanged(.running)) && all.contains(.stateChanged(.idle)))
    let started = all.firstIndex(of: .started(ok, attempt: 1))
    let succeeded = all.firstIndex(of: .succeeded(ok))
    #expect(started != nil && succeeded != nil && started! < succeeded!)
    await queue.shutdown()
  }

  @Test("a deduplication key collapses items while one is waiting")
  func deduplication() async throws {
    let queue = try JobQueue<Request>(
      configuration: configuration(autoStart: false), store: InMemoryJobStore()
    ) {
      _, _ in .handled
    }
    let first = try await queue.add(Request(name: "a", key: "user-1"))
    let second = try await queue.add(Request(name: "b", key: "user-1"))
    let other = try await queue.add(Request(name: "c", key: "user-2"))
    #expect(first.inserted && !second.inserted && other.inserted, "add says whether it stored the item")
    #expect(first.id == second.id && first.id != other.id)
    #expect(try await queue.count().ready == 2)
    queue.start()
    await queue.waitUntilFinished()
    let again = try await queue.add(Request(name: "d", key: "user-1"))
    #expect(again.inserted && again.id != first.id, "a handled key is free again")
    await queue.shutdown()
  }

  @Test("an item whose key matches a running job is stored and runs after it, with its newer data")
  func deduplicationAgainstARunningJob() async throws {
    let gate = Gate()
    let handled = Log<String>()
    let queue = try JobQueue<Request>(configuration: configuration(), store: InMemoryJobStore()) { item, _ in
      if item.name == "old" { await gate.wait() }
      handled.append(item.name)
      return .handled
    }
    let old = try await queue.add(Request(name: "old", key: "profile-7"))
    try await eventually("the old job runs") { queue.state == .running }
    let new = try await queue.add(Request(name: "new", key: "profile-7"))
    #expect(new.inserted && new.id != old.id, "stored, not matched to the running job")
    let duplicate = try await queue.add(Request(name: "newer", key: "profile-7"))
    #expect(!duplicate.inserted && duplicate.id == new.id, "the waiting job deduplicates")
    gate.open()
    await queue.waitUntilFinished()
    #expect(handled.all == ["old", "new"], "the newer item runs after the running one")
    await queue.shutdown()
  }

  @Test("pause is obeyed by every worker on the store; in-flight jobs finish")
  func pauseAcrossWorkers() async throws {
    let store = InMemoryJobStore()
    let gate = Gate()
    let handled = Log<String>()
    let a = try JobQueue<Request>(configuration: configuration(), store: store) { item, _ in
      if item.name == "first" { await gate.wait() }
      handled.append(item.name)
      return .handled
    }
    try await a.add(Request(name: "first"))
    try await eventually("first running") { a.state == .running }
    try await a.pause()
    try await a.add(Request(name: "second"))
    gate.open()
    try await eventually("in-flight job finished") { handled.all == ["first"] }
    let b = try JobQueue<Request>(configuration: configuration(), store: store) { item, _ in
      handled.append("b:" + item.name)
      return .handled
    }
    clock.advance(by: .seconds(5))
    try await Task.sleep(for: .milliseconds(50))
    #expect(handled.all == ["first"], "no worker claims while the store says paused")
    try await b.resume()
    try await eventually("second handled after resume") { handled.count == 2 }
    await a.shutdown()
    await b.shutdown()
  }

  @Test("shutdown lets running handlers finish and gives back claimed jobs that never started")
  func gracefulShutdown() async throws {
    let store = InMemoryJobStore()
    let gate = Gate()
    let handled = Log<String>()
    var config = configuration()
    config.prefetch = 5
    let queue = try JobQueue<Request>(configuration: config, store: store) { item, _ in
      await gate.wait()
      handled.append(item.name)
      return .handled
    }
    try await queue.add(contentsOf: (0..<6).map { Request(name: "j\($0)") })
    try await eventually("running") { queue.state == .running }
    let shutdown = Task { await queue.shutdown(gracePeriod: .seconds(10)) }
    try await eventually("shutdown has begun") { queue.isStopping }  // before j0 can finish
    gate.open()
    await shutdown.value
    #expect(handled.all == ["j0"], "only the started job ran")
    let counts = try await store.counts(queue: "jobs", now: clock.now())
    #expect(counts == JobCounts(ready: 5, completed: 1), "the other five are pending again: \(counts)")
    let records = try await store.jobs(queue: "jobs", status: .pending, after: nil, limit: 10)
    #expect(records.allSatisfy { $0.attempts == 0 }, "given back without counting an attempt")
  }

  @Test("a handler that ignores the grace period is cancelled and its job given back, attempt unused")
  func shutdownCancelsAfterGrace() async throws {
    let store = InMemoryJobStore()
    let queue = try JobQueue<Request>(configuration: configuration(), store: store) { _, _ in
      try await Task.sleep(for: .seconds(600))
      return .handled
    }
    try await queue.add(Request(name: "stuck"))
    try await eventually("running") { queue.state == .running }
    await queue.shutdown(gracePeriod: .milliseconds(50))
    let record = try await store.jobs(queue: "jobs", status: nil, after: nil, limit: 1).first
    #expect(record?.status == .pending && record?.lastError == "interrupted by shutdown")
    #expect(record?.attempts == 0, "a shutdown is not an attempt")
  }

  /// A time limit frees the job at once, whatever the handler does: a shutdown whose grace ran
  /// out ends the queue's loop, but a limit that passes afterwards must still hand the job over
  /// (given back, as the shutdown rule says), not leave it running under this process's lease,
  /// heart-beaten, for as long as the handler ignores cancellation.
  @Test(
    "a time limit passing after a shutdown's grace ran out frees the job at once, not when the handler returns"
  )
  func timeLimitAfterShutdownGraceFreesTheJob() async throws {
    let store = InMemoryJobStore()
    var configuration = configuration(maxAttempts: 1)
    configuration.timeLimit = .seconds(10)
    configuration.timeLimitGrace = .seconds(10)
    let release = Gate()
    let cancelled = Mutex(false)
    let queue = try JobQueue<Request>(configuration: configuration, store: store) { _, _ in
      // Ignores cancellation, but says when it came.
      await withTaskCancellationHandler {
        await release.wait()
      } onCancel: {
        cancelled.withLock { $0 = true }
      }
      return .handled
    }
    let id = try await queue.add(Request(name: "stuck")).id
    try await eventually("running") { queue.state == .running }
    let shutdown = Task { await queue.shutdown(gracePeriod: .milliseconds(50)) }
    try await eventually("the grace ran out: the handler was cancelled") { cancelled.withLock { $0 } }
    clock.advance(by: .seconds(10))  // the limit
    var freed = true
    do {
      try await eventually("the job leaves the running state", timeout: .seconds(20)) {
        try await store.job(id)?.status != .running
      }
    } catch {
      freed = false
    }
    let record = try await store.job(id)
    #expect(
      freed,
      "the job left the running state when its limit passed, while the handler still runs: \(String(describing: record))"
    )
    release.open()
    await shutdown.value
  }

  @Test(
    "shutdown is not a crash: a job interrupted on its last allowed attempt runs again after a restart",
    arguments: [1, 3])
  func shutdownOnTheLastAttempt(maxAttempts: Int) async throws {
    let store = InMemoryJobStore()
    let attempts = Log<Int>()
    // Attempts before the last one fail; the last one is interrupted by a shutdown.
    let first = try JobQueue<Request>(
      configuration: configuration(retry: .fixed(.zero), maxAttempts: maxAttempts), store: store
    ) { _, context in
      attempts.append(context.attempts)
      if context.attempts < maxAttempts { return .retry(after: .zero) }
      try await Task.sleep(for: .seconds(600))
      return .handled
    }
    try await first.add(Request(name: "report"))
    try await eventually("last attempt running") {
      attempts.all.last == maxAttempts && first.state == .running
    }
    await first.shutdown(gracePeriod: .milliseconds(20))
    let handled = Log<Int>()
    let second = try JobQueue<Request>(
      configuration: configuration(maxAttempts: maxAttempts), store: store
    ) { _, context in
      handled.append(context.attempts)
      return .handled
    }
    await second.waitUntilFinished()
    #expect(handled.all == [maxAttempts], "run again as attempt \(maxAttempts), not declared dead")
    #expect(
      try await store.counts(queue: "jobs", now: clock.now()) == JobCounts(completed: 1), "handled, not dead")
    await second.shutdown()
  }

  @Test("a stored job survives the queue: a new queue on the same store handles it")
  func restartPicksUp() async throws {
    let store = InMemoryJobStore()
    let first = try JobQueue<Request>(configuration: configuration(autoStart: false), store: store) { _, _ in
      .handled
    }
    try await first.add(Request(name: "later"))
    let handled = Log<String>()
    let second = try JobQueue<Request>(configuration: configuration(), store: store) { item, _ in
      handled.append(item.name)
      return .handled
    }
    await second.waitUntilFinished()
    #expect(handled.all == ["later"])
    await second.shutdown()
  }
}

/// A store that fails its first `failures` claims and `rescueFailures` rescues, to test that the
/// worker loop survives storage errors without losing or repeating jobs.
func flakyStore(failures: Int, rescueFailures: Int = 0) -> InstrumentedJobStore {
  let store = InstrumentedJobStore()
  store.fail("settleAndClaim", times: failures)
  store.fail("rescue", times: rescueFailures)
  return store
}

@Suite("JobQueue under failure")
struct JobQueueFailureTests {
  @Test("storage errors are logged and retried; no job is lost or handled twice")
  func storageErrors() async throws {
    let store = flakyStore(failures: 3)
    let logged = Log<LogRecord>()
    let handled = Log<String>()
    var configuration = JobQueueConfiguration(identifier: "flaky", concurrency: 2, autoStart: false)
    configuration.log = { logged.append($0) }
    let queue = try JobQueue<Request>(configuration: configuration, store: store) { item, _ in
      handled.append(item.name)
      return .handled
    }
    try await queue.add(contentsOf: (0..<20).map { Request(name: "job-\($0)") })
    queue.start()
    await queue.waitUntilFinished()
    #expect(handled.all.sorted() == (0..<20).map { "job-\($0)" }.sorted(), "every job handled exactly once")
    let warnings = logged.all.filter {
      $0.level == .warning && $0.message.contains("disk I/O error (injected)")
    }
    #expect(warnings.count >= 1, "store errors are logged")
    #expect(logged.all.allSatisfy { $0.metadata["queue"] == "flaky" })
    await queue.shutdown()
  }

  @Test("an attempt that outran its limit during a shutdown, whose record failed, is recorded once")
  func anOutrunAttemptWhoseRecordFailedIsSentOnce() async throws {
    let clock = ManualJobClock()
    let store = InstrumentedJobStore()
    var configuration = JobQueueConfiguration(
      identifier: "outran", maxAttempts: 3, autoStart: false, clock: clock)
    configuration.timeLimit = .seconds(10)
    let started = Gate()
    let release = Gate()
    defer { release.open() }
    let queue = try JobQueue<Request>(configuration: configuration, store: store) { _, _ in
      started.open()
      await release.wait()  // ignores cancellation
      return .handled
    }
    let id = try await queue.add(Request(name: "slow")).id
    queue.start()
    await started.wait()
    let stopping = Task { await queue.shutdown(gracePeriod: .seconds(3_600)) }
    try await eventually("shutdown began") { queue.isStopping }
    // The limit passes while the queue stops: the worker records the attempt itself, and that
    // call fails.
    store.fail("settleAndClaim", times: 1)
    clock.advance(by: .seconds(10))
    try await eventually("the failed record was tried") {
      store.settlementsSent.contains { $0.contains { $0.id == id } }
    }
    release.open()
    await stopping.value
    for sent in store.settlementsSent {
      let claims = sent.map(\.claim)
      #expect(Set(claims).count == claims.count, "a call carried a claim twice: \(claims)")
    }
    let record = try await store.job(id)
    #expect(
      record?.status == .pending && record?.errors.count == 1, "retried once: \(String(describing: record))")
  }

  @Test("log records never carry payloads")
  func logsHaveNoPayloads() async throws {
    let logged = Log<LogRecord>()
    var configuration = JobQueueConfiguration(identifier: "private", maxAttempts: 1)
    configuration.log = { logged.append($0) }
    let queue = try JobQueue<Request>(configuration: configuration, store: InMemoryJobStore()) { _, _ in
      .discard(reason: "rejected")
    }
    try await queue.add(Request(name: "secret-token-123"))
    await queue.waitUntilFinished()
    await queue.shutdown()
    #expect(!logged.all.isEmpty)
    for record in logged.all {
      #expect(!record.message.contains("secret-token-123"))
      #expect(!record.metadata.values.contains { $0.contains("secret-token-123") })
    }
  }

  @Test("a released delegate stops the queue from claiming; jobs stay stored")
  func releasedDelegate() async throws {
    let store = InMemoryJobStore()
    var delegate: SeedDelegate? = SeedDelegate()
    let queue = try JobQueue<Request>(
      configuration: .init(identifier: "weak", autoStart: false), store: store, delegate: delegate!)
    delegate = nil
    try await queue.add(Request(name: "kept"))
    queue.start()
    try await Task.sleep(for: .milliseconds(50))
    #expect(try await queue.count() == JobCounts(ready: 1), "nothing claimed without a delegate")
    await queue.shutdown()
  }
}

@Suite("JobQueue pause across instances")
struct JobQueuePauseAcrossInstancesTests {
  @Test("a queue notices a pause and a resume stored by another instance (another process)")
  func pauseAndResumeFromElsewhere() async throws {
    let clock = ManualJobClock()
    let store = InMemoryJobStore()
    let handled = Log<String>()
    let worker = try JobQueue<Request>(
      configuration: .init(identifier: "shared", clock: clock), store: store
    ) { item, _ in
      handled.append(item.name)
      return .handled
    }
    let control = try JobQueue<Request>(
      configuration: .init(identifier: "shared", autoStart: false, clock: clock), store: store
    ) { _, _ in .handled }
    try await control.pause()
    clock.advance(by: .seconds(1))  // the worker's next look at the store
    try await eventually("worker sees the stored pause") { worker.state == .paused }
    try await control.add(Request(name: "while-paused"))
    clock.advance(by: .seconds(1))
    try await Task.sleep(for: .milliseconds(30))
    #expect(handled.all.isEmpty, "nothing runs while the store says paused")
    try await control.resume()
    clock.advance(by: .seconds(1))
    try await eventually("worker sees the resume and runs the job") { handled.all == ["while-paused"] }
    #expect(worker.state != .paused)
    await worker.shutdown()
  }
}

/// A delegate that never calls its completion.
final class SilentDelegate: JobQueueDelegate {
  let calls = Log<String>()

  func queue(
    _ queue: JobQueue<Request>, handle item: Request, attempts: Int,
    completion: @escaping @Sendable (JobResult) -> Void
  ) {
    calls.append(item.name)
  }
}

/// A delegate that holds each job's completion until the test calls ``complete(_:with:)``.
final class HoldingDelegate: JobQueueDelegate {
  let calls = Log<String>()
  private let completions = Mutex<[String: @Sendable (JobResult) -> Void]>([:])

  func queue(
    _ queue: JobQueue<Request>, handle item: Request, attempts: Int,
    completion: @escaping @Sendable (JobResult) -> Void
  ) {
    completions.withLock { $0[item.name] = completion }
    calls.append(item.name)
  }

  /// Calls the completion held for `name`, if any.
  func complete(_ name: String, with result: JobResult = .handled) {
    completions.withLock { $0.removeValue(forKey: name) }?(result)
  }
}

@Suite("JobQueue edge cases")
struct JobQueueEdgeCaseTests {
  /// A delegate cannot see cancellation (its call has no task): one that has not completed at its
  /// time limit is a handler that ignores cancellation, and must keep its slot and be reported
  /// stuck as a closure handler is; otherwise the queue runs more jobs at once than its
  /// concurrency allows while the delegate's work goes on, and nobody hears of it.
  @Test("a delegate that has not completed past its time limit keeps its slot and is reported stuck")
  func delegatePastItsTimeLimitKeepsItsSlot() async throws {
    let clock = ManualJobClock()
    let delegate = HoldingDelegate()
    var configuration = JobQueueConfiguration(
      identifier: "delegate-limit", maxAttempts: 1, autoStart: false, clock: clock)
    configuration.timeLimit = .seconds(10)
    configuration.timeLimitGrace = .seconds(10)
    let queue = try JobQueue<Request>(
      configuration: configuration, store: InMemoryJobStore(), delegate: delegate)
    let recorder = EventRecorder(queue.events)
    let stuck = try await queue.add(Request(name: "stuck")).id
    try await queue.add(Request(name: "next"))
    queue.start()
    try await eventually("the delegate was called") { delegate.calls.all == ["stuck"] }
    clock.advance(by: .seconds(10))  // the limit
    try await recorder.wait(for: "the attempt recorded as timed out") { events in
      events.contains { if case .died(stuck, _) = $0 { true } else { false } }
    }
    clock.advance(by: .seconds(10))  // the grace
    try await eventually("reported stuck, or the next job started") {
      delegate.calls.all.contains("next")
        || recorder.events.contains { if case .stuck(stuck, _) = $0 { true } else { false } }
    }
    #expect(delegate.calls.all == ["stuck"], "the only slot is still the stuck delegate's")
    #expect(
      recorder.events.contains { if case .stuck(stuck, _) = $0 { true } else { false } },
      "reported stuck: \(recorder.events)")
    delegate.complete("stuck")
    try await eventually("the next job ran once the delegate completed") {
      delegate.calls.all.contains("next")
    }
    delegate.complete("next")
    await queue.waitUntilFinished()
    await queue.shutdown()
  }

  @Test("a job whose worker died during its last allowed attempt becomes dead, not handed out forever")
  func abandonedJobsRespectMaxAttempts() async throws {
    let clock = ManualJobClock()
    let store = InMemoryJobStore()
    let handled = Log<String>()
    _ = try await store.enqueue(
      [NewJob(payload: try JSONEncoder().encode(Request(name: "poison")), runAt: clock.now())],
      queue: "crashy", now: clock.now())
    // A worker claims it (attempt 1 of 1) and dies.
    _ = try await store.settleAndClaim(
      [], queue: "crashy", limit: 1,
      lease: Lease(owner: "dead-worker", duration: .seconds(10)), now: clock.now())
    let queue = try JobQueue<Request>(
      configuration: .init(identifier: "crashy", maxAttempts: 1, leaseDuration: .seconds(10), clock: clock),
      store: store
    ) { item, _ in
      handled.append(item.name)
      return .handled
    }
    clock.advance(by: .seconds(11))
    try await eventually("dead") { try await queue.count().dead == 1 }
    #expect(handled.all.isEmpty, "the handler is not called past maxAttempts")
    let dead = try await queue.jobs(in: .dead)
    #expect(dead.first?.lastError?.contains("worker stopped") == true)
    await queue.shutdown()
  }

  @Test("with prefetch and a short lease, held jobs stay leased: none is handled twice")
  func prefetchKeepsLeases() async throws {
    let handled = Log<String>()
    let queue = try JobQueue<Request>(
      configuration: .init(identifier: "prefetch", prefetch: 4, leaseDuration: .milliseconds(900)),
      store: InMemoryJobStore()
    ) { item, _ in
      try await Task.sleep(for: .milliseconds(150))  // 8 jobs: longer than the lease in all
      handled.append(item.name)
      return .handled
    }
    try await queue.add(contentsOf: (0..<8).map { Request(name: "j\($0)") })
    await queue.waitUntilFinished()
    #expect(handled.all == (0..<8).map { "j\($0)" }, "each job once, in order")
    await queue.shutdown()
  }

  @Test("a failing lease rescue loses no recorded outcome")
  func rescueFailuresLoseNothing() async throws {
    let store = flakyStore(failures: 0, rescueFailures: 3)
    let handled = Log<String>()
    let queue = try JobQueue<Request>(
      configuration: .init(identifier: "rescue", concurrency: 2, leaseDuration: .milliseconds(60)),
      store: store
    ) { item, _ in
      try await Task.sleep(for: .milliseconds(15))
      handled.append(item.name)
      return .handled
    }
    try await queue.add(contentsOf: (0..<10).map { Request(name: "j\($0)") })
    await queue.waitUntilFinished()
    // Every job handled and recorded. With a 60 ms lease a loaded machine can let one lapse, and
    // its job then runs again (at least once, as promised), so a name may appear twice.
    #expect(Set(handled.all) == Set((0..<10).map { "j\($0)" }), "each job handled: \(handled.all)")
    #expect(
      try await store.counts(queue: "rescue", clock: SystemJobClock()).total == 0, "every outcome recorded")
    await queue.shutdown()
  }

  @Test("waitUntilFinished returns when its task is cancelled")
  func waitIsCancellable() async throws {
    let queue = try JobQueue<Request>(
      configuration: .init(identifier: "never", autoStart: false), store: InMemoryJobStore()
    ) { _, _ in .handled }
    try await queue.add(Request(name: "waits"))
    let waiter = Task { await queue.waitUntilFinished() }
    try await Task.sleep(for: .milliseconds(20))
    waiter.cancel()
    try await eventually("the waiter returned") { await waiter.value == () }
  }

  /// With `maxAttempts` 1 the interrupted attempt is the last allowed one: an interruption by
  /// shutdown is not the job's failure, so it is retried, not dead, as for a closure handler.
  @Test(
    "shutdown ends a delegate call that never completes; its job is retried",
    arguments: [nil, 1] as [Int?])
  func silentDelegateShutdown(maxAttempts: Int?) async throws {
    let store = InMemoryJobStore()
    let delegate = SilentDelegate()
    let queue = try JobQueue<Request>(
      configuration: .init(identifier: "silent", maxAttempts: maxAttempts), store: store, delegate: delegate)
    try await queue.add(Request(name: "stuck"))
    try await eventually("called") { delegate.calls.count == 1 }
    await queue.shutdown(gracePeriod: .milliseconds(50))
    let record = try await store.jobs(queue: "silent", status: nil, after: nil, limit: 1).first
    #expect(record?.status == .pending && record?.lastError == "interrupted by shutdown")
  }
}
