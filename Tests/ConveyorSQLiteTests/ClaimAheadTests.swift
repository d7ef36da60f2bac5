import ConveyorSQLite
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import Conveyor

/// An item of the claim-ahead tests.
private struct Step: Queueable {
  var name: String
}

/// A worker at `prefetch` 0 that has just run a short job claims one job ahead; the job it holds
/// must go back to the queue when the job running takes long, for any worker to take. A manual
/// clock makes every handler "short" (its time does not move while one runs) and lets the test
/// end the hold when it chooses.
@Suite("Claiming ahead on SQLiteJobStore")
struct ClaimAheadTests {
  @Test(.timeLimit(.minutes(2)))
  func aJobClaimedAheadOfALongOneIsHandedBackForAnotherWorker() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("ahead.sqlite")
    let firstStore = try SQLiteJobStore(path: path)
    let secondStore = try SQLiteJobStore(path: path)
    let clock = ManualJobClock()
    let logs = Log<LogRecord>()
    let runs = Log<String>()
    let quickStarted = Gate()
    let quickGoes = Gate()
    let slowStarted = Gate()
    let release = Gate()
    func configuration(log: (@Sendable (LogRecord) -> Void)?) -> JobQueueConfiguration {
      var configuration = JobQueueConfiguration(identifier: "ahead", autoStart: false, clock: clock, log: log)
      // Store calls take no time on this clock: count them as worth overlapping.
      configuration.claimAheadStoreCallFloor = .zero
      return configuration
    }
    let first = try JobQueue<Step>(configuration: configuration(log: logs.append), store: firstStore) {
      step, context in
      runs.append("first \(step.name) attempt \(context.attempts)")
      if step.name == "quick" {
        quickStarted.open()
        await quickGoes.wait()
      }
      if step.name == "slow" {
        slowStarted.open()
        await release.wait()
      }
      return .handled
    }
    // Opened in any case, so a failed expectation cannot leave the handler (and the test) waiting.
    defer {
      quickGoes.open()
      release.open()
    }
    try await first.add(contentsOf: [Step(name: "quick"), Step(name: "slow"), Step(name: "next")])
    let ids = try await firstStore.jobs(queue: "ahead", status: .pending, after: nil, limit: 10).map(\.id)
    try #require(ids.count == 3)
    first.start()
    // "quick" runs while the queue's loop falls asleep (until its next poll, which this clock
    // never reaches): the worker must wake it to time the hold of the job it claims ahead.
    await quickStarted.wait()
    try await waitUntilAsleep(try await mostAsleep(on: clock, samples: 15), on: clock, timeout: .seconds(30))
    quickGoes.open()
    await slowStarted.wait()

    // "quick" was short, so its worker claimed "slow" and "next" together: both are held.
    try await eventually("the worker holds the job after the slow one", timeout: .seconds(30)) {
      try await firstStore.jobs(queue: "ahead", status: .running, after: nil, limit: 10).map(\.id)
        == Array(ids[1...])
    }
    clock.advance(by: .milliseconds(50))
    try await eventually("the job claimed ahead is handed back", timeout: .seconds(30)) {
      let next = try await firstStore.job(ids[2])
      return next?.status == .pending
    }
    let handedBack = try #require(try await firstStore.job(ids[2]))
    #expect(handedBack.attempts == 0, "its claim's attempt is given back")
    #expect(logs.all.contains { $0.message.hasPrefix("handed back 1 claimed job(s)") })

    let second = try JobQueue<Step>(configuration: configuration(log: nil), store: secondStore) {
      step, context in
      runs.append("second \(step.name) attempt \(context.attempts)")
      return .handled
    }
    second.start()
    try await eventually("the second worker runs it while the slow job still runs", timeout: .seconds(30)) {
      runs.all.contains("second next attempt 1")
    }
    release.open()
    await first.waitUntilFinished()
    await first.shutdown(gracePeriod: .seconds(5))
    await second.shutdown(gracePeriod: .seconds(5))
    #expect(runs.all.sorted() == ["first quick attempt 1", "first slow attempt 1", "second next attempt 1"])
    #expect(try await firstStore.counts(queue: "ahead", now: Date()) == JobCounts())
  }
}

/// On a store whose calls cost less than handing an outcome to the loop (the in-memory store), a
/// worker whose jobs are short claims a batch: its own next job and `QueueState.batchedAheadJobs`
/// more, their outcomes recorded with its next claim, or by the loop once the hold passed.
@Suite("Claiming ahead on a cheap store")
struct BatchedClaimAheadTests {
  /// A queue on the in-memory store, with a real clock, whose every store call counts as cheap.
  fileprivate func queue(
    _ store: any JobStore, concurrency: Int = 1,
    handler: @escaping @Sendable (Step, JobContext) async throws -> JobResult
  ) throws -> JobQueue<Step> {
    var configuration = JobQueueConfiguration(
      identifier: "batch", concurrency: concurrency, autoStart: false, pollInterval: .seconds(3_600))
    // Every call that took any time counts as cheap, however slow the build or the machine.
    configuration.claimAheadStoreCallFloor = .seconds(1)
    // And every job that took under a minute as short, however loaded the machine.
    configuration.claimAheadJobCeiling = .seconds(60)
    return try JobQueue<Step>(configuration: configuration, store: store, handler: handler)
  }

  @Test(.timeLimit(.minutes(2)))
  func aWorkerOfShortJobsClaimsSeveralPerCall() async throws {
    let limits = Log<Int>()
    let store = HookedStore(InMemoryJobStore()) { _, limit in
      limits.append(limit)
      return false
    }
    let handled = Counter()
    let queue = try queue(store) { _, _ in
      handled.increment()
      return .handled
    }
    try await queue.add(contentsOf: (0..<200).map { Step(name: "\($0)") })
    queue.start()
    await queue.waitUntilFinished()
    await queue.shutdown()
    #expect(handled.value == 200)
    #expect(try await store.counts(queue: "batch", clock: SystemJobClock()).unfinished == 0)
    let calls = limits.all
    #expect(calls.contains(1 + QueueState.batchedAheadJobs), "claim limits: \(calls)")
    // One call per job without batches; one per batch with them (and the loop's few).
    #expect(calls.count < 120, "\(calls.count) store calls for 200 jobs")
  }

  /// The outcomes of a batch's short jobs are recorded while a later job of the batch runs on,
  /// though the queue's poll interval is an hour: the loop records them once the hold passed.
  @Test(.timeLimit(.minutes(3)))
  func theOutcomesOfABatchAreRecordedWhileALaterJobOfItRunsOn() async throws {
    let store = InMemoryJobStore()
    let slowStarted = Gate()
    let release = Gate()
    let queue = try queue(store) { step, _ in
      if step.name == "slow" {
        slowStarted.open()
        await release.wait()
      }
      return .handled
    }
    defer { release.open() }
    // The loop claims the first; the worker's batch brings the three after it, "slow" last.
    try await queue.add(contentsOf: ["a", "b", "c", "slow", "d", "e"].map { Step(name: $0) })
    queue.start()
    await slowStarted.wait()
    // a, b and c are done (the in-memory store deletes a completed job); slow runs; d and e wait.
    try await eventually("the outcomes of a, b and c recorded", timeout: .seconds(90)) {
      let counts = try await store.counts(queue: "batch", clock: SystemJobClock())
      return counts.unfinished == 3
    }
    release.open()
    await queue.waitUntilFinished()
    await queue.shutdown()
    #expect(try await store.counts(queue: "batch", clock: SystemJobClock()).unfinished == 0)
  }
}
