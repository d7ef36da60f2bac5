import ConveyorSQLite
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import Conveyor

/// An item of the review's claim-ahead tests.
private struct Task1: Queueable {
  var name: String
}

/// A queue at concurrency 1 on a manual clock: "quick" waits for `quickGoes`, "slow" opens
/// `slowStarted` and waits for `slowGoes`; every run is logged as "name attempt N".
private final class Scenario: Sendable {
  let folder: TemporaryFolder
  let path: String
  let clock = ManualJobClock()
  let runs = Log<String>()
  let logs = Log<LogRecord>()
  let quickStarted = Gate()
  let quickGoes = Gate()
  let slowStarted = Gate()
  let slowGoes = Gate()

  init() throws {
    folder = try TemporaryFolder()
    path = folder.path("review-ahead.sqlite")
  }

  func configuration(
    maxAttempts: Int? = nil, claimsAhead: Bool = true, lease: Duration = .seconds(60),
    log: Bool = true
  ) -> JobQueueConfiguration {
    var configuration = JobQueueConfiguration(
      identifier: "ahead", maxAttempts: maxAttempts, claimsAhead: claimsAhead, autoStart: false,
      leaseDuration: lease, clock: clock, log: log ? logs.append : nil)
    configuration.claimAheadStoreCallFloor = .zero
    return configuration
  }

  func queue(_ configuration: JobQueueConfiguration, store: any JobStore, tag: String = "") throws
    -> JobQueue<Task1>
  {
    try JobQueue<Task1>(configuration: configuration, store: store) { [self] item, context in
      runs.append("\(tag)\(item.name) attempt \(context.attempts)")
      if item.name == "quick" {
        quickStarted.open()
        await quickGoes.wait()
      }
      if item.name == "slow" {
        slowStarted.open()
        await slowGoes.wait()
      }
      return .handled
    }
  }

  func openAll() {
    quickGoes.open()
    slowGoes.open()
  }

  /// Starts `queue` on jobs quick, slow, then `rest`; returns when "slow" runs and the job after
  /// it is held ahead (running in the store). Returns the IDs in order.
  func runUntilHeld(_ queue: JobQueue<Task1>, store: any JobStore, rest: [String]) async throws -> [JobID] {
    try await queue.add(
      contentsOf: ([Task1(name: "quick"), Task1(name: "slow")] + rest.map { Task1(name: $0) }))
    let ids = try await store.jobs(queue: "ahead", status: .pending, after: nil, limit: 100).map(\.id)
    try #require(ids.count == 2 + rest.count)
    queue.start()
    await quickStarted.wait()
    try await settle()
    quickGoes.open()
    await slowStarted.wait()
    try await eventually("the job after slow is held ahead", timeout: .seconds(30)) {
      try await store.jobs(queue: "ahead", status: .running, after: nil, limit: 10).map(\.id)
        == Array(ids[1...2])
    }
    // The worker woke the loop to time the hold: let it fall asleep again before the test moves
    // the clock (a wait is computed relative to the clock's reading).
    try await settle()
    return ids
  }

  /// Lets the queue's tasks fall asleep on the manual clock (as the existing claim-ahead test does).
  func settle() async throws {
    try await waitUntilAsleep(try await mostAsleep(on: clock, samples: 10), on: clock, timeout: .seconds(30))
  }
}

/// An adversarial review's tests of claiming ahead. Each comment describes the promise and the
/// defect the review found with it (since fixed, in the past tense only where edited later);
/// `withKnownIssue` marks the gaps the README lists instead.
@Suite("Review: claiming ahead")
struct ReviewClaimAheadTests {
  // MARK: Defects

  /// Promise 1: a held job that has not started within 50 ms while every slot is busy is handed
  /// back for any worker to take. During a shutdown's grace period it is not: it stays held (and
  /// heartbeated) until the running handler ends, however long that takes.
  @Test(.timeLimit(.minutes(2)))
  func aJobHeldAheadIsHandedBackDuringAShutdownGracePeriod() async throws {
    let scenario = try Scenario()
    defer { scenario.openAll() }
    let store = try SQLiteJobStore(path: scenario.path)
    let first = try scenario.queue(scenario.configuration(), store: store)
    let ids = try await scenario.runUntilHeld(first, store: store, rest: ["next"])
    let stopping = Task { await first.shutdown(gracePeriod: .seconds(60)) }
    try await eventually("shutdown began", timeout: .seconds(30)) { first.isStopping }
    // 50 ms and then some (the stopping loop turns every poll interval of this clock).
    for _ in 0..<5 {
      scenario.clock.advance(by: .seconds(1))
      try await Task.sleep(for: .milliseconds(50))
    }
    var status: JobStatus? = nil
    let deadline = ContinuousClock.now + .seconds(30)
    while ContinuousClock.now < deadline {
      status = try await store.job(ids[2])?.status
      if status == .pending { break }
      try await Task.sleep(for: .milliseconds(10))
    }
    #expect(
      status == .pending,
      "5 s of the queue's clock after its claim, with the only slot busy, the job held ahead is still \(String(describing: status))"
    )
    #expect(try await store.job(ids[1])?.status == .running, "slow still runs")
    scenario.slowGoes.open()
    await stopping.value
  }

  /// Promise 2: a job claimed ahead is handed back at once when the queue is paused. (Found by
  /// the review: `pause()` set the flag without waking the loop, which slept until the 50 ms hold
  /// ended, so the pause handed nothing back sooner than the hold would have anyway.)
  @Test(.timeLimit(.minutes(2)))
  func pausingHandsBackAJobHeldAheadAtOnce() async throws {
    let scenario = try Scenario()
    defer { scenario.openAll() }
    let store = try SQLiteJobStore(path: scenario.path)
    let first = try scenario.queue(scenario.configuration(), store: store)
    let ids = try await scenario.runUntilHeld(first, store: store, rest: ["next"])
    try await first.pause()
    #expect(first.state == .paused)
    var status: JobStatus? = nil
    let deadline = ContinuousClock.now + .seconds(30)
    while ContinuousClock.now < deadline {
      status = try await store.job(ids[2])?.status
      if status == .pending { break }
      try await Task.sleep(for: .milliseconds(10))
    }
    #expect(
      status == .pending, "30 s after pause() the job held ahead is still \(String(describing: status))")
    // An extra wake-up changes nothing once the pause has handed it back.
    first.wake.signal()
    try await eventually("handed back once the loop turns", timeout: .seconds(30)) {
      try await store.job(ids[2])?.status == .pending
    }
    scenario.slowGoes.open()
    await first.shutdown(gracePeriod: .seconds(5))
  }

  /// Promise 4 (FIFO at concurrency 1): the loop takes the held job out of the buffer and then
  /// records its release; if the running job ends while that store call is in flight, its worker
  /// claims the job after the held one, which then runs out of order. (The store call is held
  /// open by a hook to make the window deterministic; in production it is the length of one
  /// transaction.)
  @Test(.timeLimit(.minutes(2)))
  func aHandBackRacingTheWorkersClaimKeepsFIFOAtConcurrencyOne() async throws {
    let scenario = try Scenario()
    defer { scenario.openAll() }
    let handBackEntered = Gate()
    let handBackGoes = Gate()
    defer { handBackGoes.open() }
    let sqlite = try SQLiteJobStore(path: scenario.path)
    let store = HookedStore(sqlite) { settlements, limit in
      if isHandBack(settlements, limit) {
        handBackEntered.open()
        await handBackGoes.wait()
      }
      return false
    }
    let first = try scenario.queue(scenario.configuration(), store: store)
    let ids = try await scenario.runUntilHeld(first, store: store, rest: ["c", "d"])
    scenario.clock.advance(by: .milliseconds(50))
    await handBackEntered.wait()
    // "slow" ends while the release of "c" is in flight.
    scenario.slowGoes.open()
    _ = await eventually(timeout: .seconds(2)) { scenario.runs.all.contains("d attempt 1") }
    handBackGoes.open()
    await first.waitUntilFinished()
    await first.shutdown(gracePeriod: .seconds(5))
    #expect(
      scenario.runs.all == ["quick attempt 1", "slow attempt 1", "c attempt 1", "d attempt 1"],
      "order at concurrency 1")
    #expect(try await sqlite.counts(queue: "ahead", now: Date()) == JobCounts())
    _ = ids
  }

  /// Promise 4 (attempts, maxAttempts, lease rescue): a job claimed ahead never started; if its
  /// worker vanishes, the rescue must not count that claim as a lost attempt. With maxAttempts 1
  /// the held job is killed as "the worker stopped during the last one" without ever running.
  /// (Before the change, prefetch 0 claimed only jobs that started at once.)
  @Test(.timeLimit(.minutes(2)))
  func aJobHeldAheadByAVanishedWorkerIsNotKilledWithoutRunning() async throws {
    let scenario = try Scenario()
    defer { scenario.openAll() }
    let firstStore = HookedStore(try SQLiteJobStore(path: scenario.path))
    let secondStore = try SQLiteJobStore(path: scenario.path)
    let first = try scenario.queue(
      scenario.configuration(maxAttempts: 1, lease: .seconds(10)), store: firstStore, tag: "first ")
    // With one attempt allowed, nothing is claimed ahead (the fix): "next" stays pending while
    // "slow" runs.
    try await first.add(contentsOf: ["quick", "slow", "next"].map { Task1(name: $0) })
    let ids = try await firstStore.jobs(queue: "ahead", status: .pending, after: nil, limit: 10).map(\.id)
    try #require(ids.count == 3)
    first.start()
    await scenario.quickStarted.wait()
    try await scenario.settle()
    scenario.quickGoes.open()
    await scenario.slowStarted.wait()
    try await scenario.settle()
    #expect(try await firstStore.job(ids[2])?.status == .pending, "not claimed ahead")
    // The first process vanishes (as the store sees it: no heartbeat, no settlement lands).
    firstStore.dead.withLock { $0 = true }
    scenario.clock.advance(by: .seconds(11))
    let second = try scenario.queue(
      scenario.configuration(maxAttempts: 1, lease: .seconds(10), log: false), store: secondStore,
      tag: "second ")
    second.start()
    try await eventually("both rescued jobs are dealt with", timeout: .seconds(20)) {
      let counts = try await secondStore.counts(queue: "ahead", now: scenario.clock.now())
      return counts.running == 0 && counts.ready == 0 && counts.scheduled == 0
    }
    let next = try await secondStore.job(ids[2])
    #expect(
      next?.status != .dead,
      "a job that never ran died: \(String(describing: next?.lastError))")
    #expect(scenario.runs.all.contains("second next attempt 1"), "runs: \(scenario.runs.all)")
    scenario.slowGoes.open()
    await second.shutdown(gracePeriod: .seconds(5))
    await first.shutdown(gracePeriod: .milliseconds(100))
  }

  /// Documented: not the in-memory store (its calls are under 10 µs). A worker's first claim has
  /// no measured store call yet and claims ahead anyway, on every new worker.
  @Test(.timeLimit(.minutes(2)))
  func theInMemoryStoreNeverClaimsAhead() async throws {
    let clock = ManualJobClock()
    let store = InMemoryJobStore()
    let seen = Log<JobStatus?>()
    let ids = Mutex<[JobID]>([])
    // Default floor (10 µs): on this clock every store call takes 0, so nothing is "slow".
    let configuration = JobQueueConfiguration(identifier: "mem", autoStart: false, clock: clock)
    let queue = try JobQueue<Task1>(configuration: configuration, store: store) { item, _ in
      if item.name == "b" {
        let c = ids.withLock { $0[2] }
        seen.append(try await store.job(c)?.status)
      }
      return .handled
    }
    try await queue.add(contentsOf: [Task1(name: "a"), Task1(name: "b"), Task1(name: "c")])
    let all = try await store.jobs(queue: "mem", status: .pending, after: nil, limit: 10).map(\.id)
    ids.withLock { $0 = all }
    queue.start()
    await queue.waitUntilFinished()
    await queue.shutdown(gracePeriod: .seconds(5))
    #expect(seen.all == [.pending], "while b ran, c was \(seen.all)")
  }

  // MARK: Guards

  /// claimsAhead false: the job after "slow" is never claimed while slow runs.
  @Test(.timeLimit(.minutes(2)))
  func claimsAheadFalseNeverHoldsAJob() async throws {
    let scenario = try Scenario()
    defer { scenario.openAll() }
    let store = try SQLiteJobStore(path: scenario.path)
    let first = try scenario.queue(scenario.configuration(claimsAhead: false), store: store)
    try await first.add(contentsOf: [Task1(name: "quick"), Task1(name: "slow"), Task1(name: "next")])
    let ids = try await store.jobs(queue: "ahead", status: .pending, after: nil, limit: 10).map(\.id)
    first.start()
    scenario.quickGoes.open()
    await scenario.slowStarted.wait()
    try await Task.sleep(for: .milliseconds(200))
    #expect(try await store.job(ids[2])?.status == .pending)
    scenario.slowGoes.open()
    await first.waitUntilFinished()
    await first.shutdown(gracePeriod: .seconds(5))
  }

  /// A job of 1 ms or more (by the queue's clock) is never followed by a claim ahead.
  @Test(.timeLimit(.minutes(2)))
  func aLongJobIsNotFollowedByAClaimAhead() async throws {
    let clock = ManualJobClock()
    let folder = try TemporaryFolder()
    let store = try SQLiteJobStore(path: folder.path("long.sqlite"))
    let slowStarted = Gate()
    let slowGoes = Gate()
    defer { slowGoes.open() }
    var configuration = JobQueueConfiguration(identifier: "long", autoStart: false, clock: clock)
    configuration.claimAheadStoreCallFloor = .zero
    let queue = try JobQueue<Task1>(configuration: configuration, store: store) { item, _ in
      if item.name == "long" { clock.advance(by: .milliseconds(1)) }
      if item.name == "slow" {
        slowStarted.open()
        await slowGoes.wait()
      }
      return .handled
    }
    try await queue.add(contentsOf: [Task1(name: "long"), Task1(name: "slow"), Task1(name: "next")])
    let ids = try await store.jobs(queue: "long", status: .pending, after: nil, limit: 10).map(\.id)
    queue.start()
    await slowStarted.wait()
    try await Task.sleep(for: .milliseconds(200))
    #expect(try await store.job(ids[2])?.status == .pending)
    slowGoes.open()
    await queue.waitUntilFinished()
    await queue.shutdown(gracePeriod: .seconds(5))
  }

  /// A job handed back (hold over) keeps attempt 0 and later runs as attempt 1 under
  /// maxAttempts 2, in FIFO order, on the same queue.
  @Test(.timeLimit(.minutes(2)))
  func aHandedBackJobKeepsItsAttemptAndRunsLater() async throws {
    let scenario = try Scenario()
    defer { scenario.openAll() }
    let store = try SQLiteJobStore(path: scenario.path)
    let first = try scenario.queue(scenario.configuration(maxAttempts: 2), store: store)
    let ids = try await scenario.runUntilHeld(first, store: store, rest: ["next", "last"])
    scenario.clock.advance(by: .milliseconds(50))
    try await eventually("handed back", timeout: .seconds(30)) {
      try await store.job(ids[2])?.status == .pending
    }
    #expect(try await store.job(ids[2])?.attempts == 0)
    scenario.slowGoes.open()
    await first.waitUntilFinished()
    await first.shutdown(gracePeriod: .seconds(5))
    #expect(
      scenario.runs.all == ["quick attempt 1", "slow attempt 1", "next attempt 1", "last attempt 1"])
    #expect(try await store.counts(queue: "ahead", now: Date()) == JobCounts())
  }

  /// A failed hand-back is tried again: the job does not stay held.
  @Test(.timeLimit(.minutes(2)))
  func aFailedHandBackIsRetried() async throws {
    let scenario = try Scenario()
    defer { scenario.openAll() }
    let sqlite = try SQLiteJobStore(path: scenario.path)
    let store = InstrumentedJobStore(sqlite)
    let first = try scenario.queue(scenario.configuration(), store: store)
    let ids = try await scenario.runUntilHeld(first, store: store, rest: ["next"])
    store.fail("settleAndClaim", times: 1)
    scenario.clock.advance(by: .milliseconds(50))
    try await eventually("the failed release was tried", timeout: .seconds(30)) {
      scenario.logs.all.contains { $0.message.hasPrefix("store error") }
    }
    for _ in 0..<10 {
      scenario.clock.advance(by: .milliseconds(200))
      try await Task.sleep(for: .milliseconds(20))
    }
    try await eventually("handed back after the failure", timeout: .seconds(30)) {
      try await sqlite.job(ids[2])?.status == .pending
    }
    #expect(try await sqlite.job(ids[2])?.attempts == 0)
    scenario.slowGoes.open()
    await first.waitUntilFinished()
    await first.shutdown(gracePeriod: .seconds(5))
  }

  /// Shutdown gives a held job back with its attempt (once the running handler ends).
  @Test(.timeLimit(.minutes(2)))
  func shutdownGivesBackAHeldJob() async throws {
    let scenario = try Scenario()
    defer { scenario.openAll() }
    let store = try SQLiteJobStore(path: scenario.path)
    let first = try scenario.queue(scenario.configuration(), store: store)
    let ids = try await scenario.runUntilHeld(first, store: store, rest: ["next"])
    let stopping = Task { await first.shutdown(gracePeriod: .seconds(60)) }
    try await eventually("shutdown began", timeout: .seconds(30)) { first.isStopping }
    scenario.slowGoes.open()
    await stopping.value
    let next = try await store.job(ids[2])
    #expect(next?.status == .pending)
    #expect(next?.attempts == 0)
    #expect(!scenario.runs.all.contains { $0.hasPrefix("next") })
  }
}
