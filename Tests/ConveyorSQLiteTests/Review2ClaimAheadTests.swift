import ConveyorSQLite
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import Conveyor

/// An item of the second review's claim-ahead tests; `key` is its deduplication key.
private struct R2Item: Queueable {
  var name: String
  var key: String? = nil
  var deduplicationKey: String? { key }
}

/// A queue at concurrency 1 on a manual clock: "quick" waits for `quickGoes`, "slow" opens
/// `slowStarted` and waits for `slowGoes`; every run is logged as "name attempt N".
private final class R2Scenario: Sendable {
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
    path = folder.path("review2-ahead.sqlite")
  }

  func configuration(claimsAhead: Bool = true, maxAttempts: Int? = nil) -> JobQueueConfiguration {
    var configuration = JobQueueConfiguration(
      identifier: "ahead", maxAttempts: maxAttempts, claimsAhead: claimsAhead, autoStart: false,
      clock: clock, log: logs.append)
    configuration.claimAheadStoreCallFloor = .zero
    return configuration
  }

  func queue(_ configuration: JobQueueConfiguration, store: any JobStore) throws -> JobQueue<R2Item> {
    try JobQueue<R2Item>(configuration: configuration, store: store) { [self] item, context in
      await self.handle(item, attempts: context.attempts)
      return .handled
    }
  }

  func handle(_ item: R2Item, attempts: Int) async {
    runs.append("\(item.name) attempt \(attempts)")
    if item.name == "quick" {
      quickStarted.open()
      await quickGoes.wait()
    }
    if item.name == "slow" {
      slowStarted.open()
      await slowGoes.wait()
    }
  }

  func openAll() {
    quickGoes.open()
    slowGoes.open()
  }

  /// Starts `queue` on quick, slow, then `rest`; returns when "slow" runs and, with
  /// `expectHeld`, the job after it is held ahead (running in the store). Returns the IDs in order.
  func runUntilSlow(
    _ queue: JobQueue<R2Item>, store: any JobStore, rest: [R2Item], expectHeld: Bool = true
  ) async throws -> [JobID] {
    try await queue.add(contentsOf: [R2Item(name: "quick"), R2Item(name: "slow")] + rest)
    let ids = try await store.jobs(queue: "ahead", status: .pending, after: nil, limit: 100).map(\.id)
    try #require(ids.count == 2 + rest.count)
    queue.start()
    await quickStarted.wait()
    try await settle()
    quickGoes.open()
    await slowStarted.wait()
    if expectHeld {
      try await eventually("the job after slow is held ahead", timeout: .seconds(30)) {
        try await store.jobs(queue: "ahead", status: .running, after: nil, limit: 10).map(\.id)
          == Array(ids[1...2])
      }
    }
    try await settle()
    return ids
  }

  /// Lets the queue's tasks fall asleep on the manual clock.
  func settle() async throws {
    try await waitUntilAsleep(try await mostAsleep(on: clock, samples: 10), on: clock, timeout: .seconds(30))
  }
}

/// A callback delegate whose readiness the test switches; "slow" completes when `slowGoes` opens.
private final class R2Delegate: JobQueueDelegate, Sendable {
  typealias Item = R2Item
  let scenario: R2Scenario
  let ready = Mutex(true)

  init(_ scenario: R2Scenario) { self.scenario = scenario }

  func queue(
    _ queue: JobQueue<R2Item>, handle item: R2Item, attempts: Int,
    completion: @escaping @Sendable (JobResult) -> Void
  ) async {
    let scenario = scenario
    Task {
      await scenario.handle(item, attempts: attempts)
      completion(.handled)
    }
  }

  func queueFinished(_ queue: JobQueue<R2Item>) async {}

  var isReadyForJobs: Bool { ready.withLock { $0 } }
}

/// An adversarial review's tests of claiming ahead. Each comment describes the promise and the
/// defect the review found with it (since fixed, in the past tense only where edited later);
/// `withKnownIssue` marks the gaps the README lists instead.
@Suite("Review 2: claiming ahead")
struct Review2ClaimAheadTests {
  // MARK: Defects

  /// Promise 5 (nothing else changes; activity counts): a job claimed ahead and handed back when
  /// its 50 ms hold ends is never counted as started when it finally runs (its claim token is 2),
  /// so every hold that ends undercounts the dashboard's starts during ordinary running, not only
  /// at shutdown as documented for `prefetch`.
  @Test(.timeLimit(.minutes(2)))
  func aJobHandedBackAfterItsHoldIsCountedAsStartedWhenItRuns() async throws {
    for claimsAhead in [false, true] {
      let scenario = try R2Scenario()
      defer { scenario.openAll() }
      let store = try SQLiteJobStore(path: scenario.path)
      let queue = try scenario.queue(scenario.configuration(claimsAhead: claimsAhead), store: store)
      let ids = try await scenario.runUntilSlow(
        queue, store: store, rest: [R2Item(name: "next")], expectHeld: claimsAhead)
      if claimsAhead {
        scenario.clock.advance(by: .milliseconds(50))
        try await eventually("handed back", timeout: .seconds(30)) {
          try await store.job(ids[2])?.status == .pending
        }
      }
      scenario.slowGoes.open()
      await queue.waitUntilFinished()
      await queue.shutdown(gracePeriod: .seconds(5))
      #expect(scenario.runs.all == ["quick attempt 1", "slow attempt 1", "next attempt 1"])
      let minutes = try await store.activity(since: Date(timeIntervalSince1970: 0), limit: 1_000)
      let total = minutes.reduce(into: QueueActivity(queue: "ahead", minute: Date())) { $0.add($1) }
      #expect(total.succeeded == 3, "claimsAhead \(claimsAhead): \(total)")
      #expect(total.started == 3, "claimsAhead \(claimsAhead): three jobs started once each: \(total)")
    }
  }

  /// Promise 5 (deduplication): a job claimed ahead has not started (it has read nothing), yet
  /// it stops holding its deduplication key; a duplicate added meanwhile is stored, and when the
  /// held job is handed back the store holds two waiting jobs with one key, and both run.
  /// With `claimsAhead` false the duplicate is refused.
  @Test(.timeLimit(.minutes(2)))
  func aDuplicateOfAJobHeldAheadIsNotStoredTwice() async throws {
    for claimsAhead in [false, true] {
      let scenario = try R2Scenario()
      defer { scenario.openAll() }
      let store = try SQLiteJobStore(path: scenario.path)
      let queue = try scenario.queue(scenario.configuration(claimsAhead: claimsAhead), store: store)
      let ids = try await scenario.runUntilSlow(
        queue, store: store, rest: [R2Item(name: "next", key: "k")], expectHeld: claimsAhead)
      let duplicate = try await queue.add(R2Item(name: "duplicate", key: "k"))
      // Known gap (README, "Known gaps": a job claimed ahead counts as running for
      // deduplication, and one handed back does not merge with a waiting duplicate).
      withKnownIssue("a job claimed ahead counts as running for deduplication") {
        #expect(
          !duplicate.inserted, "claimsAhead \(claimsAhead): a waiting, unstarted job holds the key")
      } when: {
        claimsAhead
      }
      if claimsAhead {
        scenario.clock.advance(by: .milliseconds(50))
        try await eventually("handed back", timeout: .seconds(30)) {
          try await store.job(ids[2])?.status == .pending
        }
        let waiting = try await store.jobs(queue: "ahead", status: .pending, after: nil, limit: 10)
        withKnownIssue("a job handed back does not merge with a waiting duplicate") {
          #expect(
            waiting.filter { $0.deduplicationKey == "k" }.count <= 1,
            "one waiting job per key: \(waiting.map(\.id))")
        }
      }
      scenario.slowGoes.open()
      await queue.waitUntilFinished()
      await queue.shutdown(gracePeriod: .seconds(5))
      let runs = scenario.runs.all
      withKnownIssue("both jobs of the key run") {
        #expect(
          runs.filter { $0.hasPrefix("next") || $0.hasPrefix("duplicate") }.count == 1,
          "claimsAhead \(claimsAhead): runs \(runs)")
      } when: {
        claimsAhead
      }
    }
  }

  /// Promise 5 (clear): `clear()` deletes every waiting job. A job claimed ahead is waiting for a
  /// slot, never started, but the store lists it as running: it survives the clear and runs.
  /// With `claimsAhead` false the same sequence deletes it.
  @Test(.timeLimit(.minutes(2)))
  func clearDeletesAJobHeldAheadThatNeverStarted() async throws {
    for claimsAhead in [false, true] {
      let scenario = try R2Scenario()
      defer { scenario.openAll() }
      let store = try SQLiteJobStore(path: scenario.path)
      let queue = try scenario.queue(scenario.configuration(claimsAhead: claimsAhead), store: store)
      _ = try await scenario.runUntilSlow(
        queue, store: store, rest: [R2Item(name: "next")], expectHeld: claimsAhead)
      try await queue.clear()
      scenario.slowGoes.open()
      await queue.waitUntilFinished()
      await queue.shutdown(gracePeriod: .seconds(5))
      let runs = scenario.runs.all
      // Known gap (README, "Known gaps"): a job claimed ahead counts as running for clear().
      withKnownIssue("a job claimed ahead counts as running for clear()") {
        #expect(
          !runs.contains("next attempt 1"),
          "claimsAhead \(claimsAhead): a job cleared before it started ran: \(runs)")
      } when: {
        claimsAhead
      }
    }
  }

  /// Promise 2: with no handler (a delegate not ready for jobs), a job claimed ahead is handed
  /// back at once, the loop woken. Nothing wakes the loop when the delegate stops being ready: it
  /// is handed back only when the 50 ms hold ends (never, on a clock that does not move).
  @Test(.timeLimit(.minutes(2)))
  func aDelegateThatStopsTakingJobsHandsBackTheJobHeldAheadWhenItsHoldEnds() async throws {
    let scenario = try R2Scenario()
    defer { scenario.openAll() }
    let store = try SQLiteJobStore(path: scenario.path)
    let delegate = R2Delegate(scenario)
    let queue = try JobQueue<R2Item>(
      configuration: scenario.configuration(), store: store, delegate: delegate)
    let ids = try await scenario.runUntilSlow(queue, store: store, rest: [R2Item(name: "next")])
    delegate.ready.withLock { $0 = false }
    // Nothing tells the queue that a delegate stopped taking jobs (a weak reference that empties
    // sends no signal): the job goes back when its hold ends, at the latest (the fix documents
    // this bound instead of "at once").
    scenario.clock.advance(by: QueueState.aheadHold)
    let handedBack =
      (try? await eventually("handed back", timeout: .seconds(30)) {
        try await store.job(ids[2])?.status == .pending
      }) != nil
    #expect(
      handedBack,
      "30 s after the delegate stopped taking jobs and its hold ended, the job held ahead is still held")
    scenario.slowGoes.open()
    delegate.ready.withLock { $0 = true }
    await queue.shutdown(gracePeriod: .seconds(5))
    withExtendedLifetime(delegate) {}
  }

  // MARK: Guards

  /// Promise 3 with a failing hand-back: "slow" ends while the loop's hand-back is in flight (its
  /// worker ends), then that call fails. The outcome and the release are kept and recorded, the
  /// loop claims again, every job runs once in FIFO order and the queue finishes.
  @Test(.timeLimit(.minutes(2)))
  func aWorkerEndingDuringAHandBackThatFailsLeavesNoStall() async throws {
    let scenario = try R2Scenario()
    defer { scenario.openAll() }
    let entered = Gate()
    let goes = Gate()
    defer { goes.open() }
    let failed = Mutex(false)
    let sqlite = try SQLiteJobStore(path: scenario.path)
    let store = HookedStore(sqlite) { settlements, limit in
      guard isHandBack(settlements, limit), !failed.withLock({ $0 }) else { return false }
      entered.open()
      await goes.wait()
      failed.withLock { $0 = true }
      return true
    }
    let queue = try scenario.queue(scenario.configuration(), store: store)
    let ids = try await scenario.runUntilSlow(
      queue, store: store, rest: [R2Item(name: "c"), R2Item(name: "d")])
    scenario.clock.advance(by: .milliseconds(50))
    await entered.wait()
    scenario.slowGoes.open()
    try await eventually("slow's worker ended", timeout: .seconds(30)) { queue.state == .idle }
    goes.open()
    // Backoff waits run on the manual clock: move it a little at a time (well inside the lease).
    let done = Task {
      await queue.waitUntilFinished()
    }
    var finished = false
    for _ in 0..<50 where !finished {
      scenario.clock.advance(by: .milliseconds(100))
      try await Task.sleep(for: .milliseconds(40))
      let counts = try await sqlite.counts(queue: "ahead", now: scenario.clock.now())
      finished = scenario.runs.all.count == 4 && counts == JobCounts()
    }
    done.cancel()
    await queue.shutdown(gracePeriod: .seconds(5))
    #expect(failed.withLock { $0 }, "the hand-back failed once")
    #expect(scenario.runs.all == ["quick attempt 1", "slow attempt 1", "c attempt 1", "d attempt 1"])
    #expect(try await sqlite.counts(queue: "ahead", now: scenario.clock.now()) == JobCounts())
    _ = ids
  }

  /// Pause hands back the held job, the paused queue does not spin (no store calls while the
  /// manual clock stands still), and resume runs the rest in order; waitUntilFinished returns.
  @Test(.timeLimit(.minutes(2)))
  func aPausedQueueWithAHandedBackJobIsQuietAndResumesInOrder() async throws {
    let scenario = try R2Scenario()
    defer { scenario.openAll() }
    let sqlite = try SQLiteJobStore(path: scenario.path)
    let store = InstrumentedJobStore(sqlite)
    let queue = try scenario.queue(scenario.configuration(), store: store)
    let ids = try await scenario.runUntilSlow(
      queue, store: store, rest: [R2Item(name: "next"), R2Item(name: "last")])
    try await queue.pause()
    try await eventually("handed back", timeout: .seconds(30)) {
      try await sqlite.job(ids[2])?.status == .pending
    }
    try await scenario.settle()
    store.resetCalls()
    try await Task.sleep(for: .milliseconds(500))
    let calls = store.calls
    #expect(
      (calls["nextWake"] ?? 0) + (calls["settleAndClaim"] ?? 0) <= 2, "store calls while paused: \(calls)")
    scenario.slowGoes.open()
    try await eventually("slow recorded", timeout: .seconds(30)) {
      scenario.clock.advance(by: .seconds(1))
      return try await sqlite.job(ids[1]) == nil
    }
    #expect(queue.state == .paused)
    #expect(!scenario.runs.all.contains("next attempt 1"))
    try await queue.resume()
    await queue.waitUntilFinished()
    await queue.shutdown(gracePeriod: .seconds(5))
    #expect(
      scenario.runs.all == ["quick attempt 1", "slow attempt 1", "next attempt 1", "last attempt 1"])
  }
}

/// Lets whatever remains run (moving the manual clock) until the store holds nothing, bounded.
private func r2Drain(_ scenario: R2Scenario, _ sqlite: SQLiteJobStore) async {
  _ = try? await eventually("the store empty", timeout: .seconds(30)) {
    scenario.clock.advance(by: .milliseconds(100))
    return try await sqlite.counts(queue: "ahead", now: scenario.clock.now()) == JobCounts()
  }
}

/// The activity total of a store.
private func r2Total(_ store: SQLiteJobStore, queue: String) async throws -> QueueActivity {
  let minutes = try await store.activity(since: Date(timeIntervalSince1970: 0), limit: 1_000)
  return minutes.reduce(into: QueueActivity(queue: queue, minute: Date())) { $0.add($1) }
}

@Suite("Review 3: claiming ahead")
struct Review3ClaimAheadTests {
  // MARK: Activity

  /// Guard: a handler cut short by a shutdown, run again later by another queue, is counted
  /// once; the job discarded and re-queued (attempts reset) is not counted again.
  @Test(.timeLimit(.minutes(2)))
  func interruptedThenRequeuedJobIsCountedOnce() async throws {
    let folder = try TemporaryFolder()
    let store = try SQLiteJobStore(path: folder.path("act.sqlite"))
    let runs = Log<String>()
    let blocked = Flag()
    let first = try JobQueue<R2Item>(configuration: JobQueueConfiguration(identifier: "act"), store: store) {
      item, context in
      runs.append("\(item.name) attempt \(context.attempts)")
      blocked.set()
      try await Task.sleep(for: .seconds(60))
      return .handled
    }
    let id = try await first.add(R2Item(name: "job")).id
    try await eventually("started", timeout: .seconds(30)) { blocked.value }
    await first.shutdown(gracePeriod: .milliseconds(200))
    let record = try await store.job(id)
    #expect(record?.attempts == 0)
    #expect(record?.lastError != nil)
    let second = try JobQueue<R2Item>(configuration: JobQueueConfiguration(identifier: "act"), store: store) {
      item, context in
      runs.append("\(item.name) attempt \(context.attempts)")
      return runs.all.count < 3 ? .discard(reason: "") : .handled
    }
    try await eventually("dead", timeout: .seconds(30)) { try await store.job(id)?.status == .dead }
    #expect(try await second.requeueDead() == 1)
    try await eventually("done", timeout: .seconds(30)) { try await store.job(id) == nil }
    await second.shutdown(gracePeriod: .seconds(5))
    #expect(runs.all == ["job attempt 1", "job attempt 1", "job attempt 1"])
    let total = try await r2Total(store, queue: "act")
    #expect(total.started == 1, "one job, first started once: \(total)")
  }

  /// Guard: jobs prefetched and handed back unstarted at shutdown are counted once each when a
  /// later queue runs them.
  @Test(.timeLimit(.minutes(2)))
  func prefetchedJobsHandedBackAtShutdownAreCountedOnce() async throws {
    let scenario = try R2Scenario()
    defer { scenario.openAll() }
    let sqlite = try SQLiteJobStore(path: scenario.path)
    var configuration = scenario.configuration(claimsAhead: false)
    configuration.prefetch = 2
    let queue = try scenario.queue(configuration, store: sqlite)
    try await queue.add(contentsOf: ["slow", "a", "b"].map { R2Item(name: $0) })
    queue.start()
    await scenario.slowStarted.wait()
    try await eventually("a and b prefetched", timeout: .seconds(30)) {
      try await sqlite.jobs(queue: "ahead", status: .running, after: nil, limit: 10).count == 3
    }
    let stopping = Task { await queue.shutdown(gracePeriod: .seconds(30)) }
    try await eventually("handed back", timeout: .seconds(30)) {
      try await sqlite.jobs(queue: "ahead", status: .pending, after: nil, limit: 10).count == 2
    }
    scenario.slowGoes.open()
    await stopping.value
    let later = try scenario.queue(configuration, store: sqlite)
    later.start()
    await r2Drain(scenario, sqlite)
    await later.shutdown(gracePeriod: .seconds(5))
    #expect(scenario.runs.all == ["slow attempt 1", "a attempt 1", "b attempt 1"])
    let total = try await r2Total(sqlite, queue: "ahead")
    #expect(total.started == 3, "\(total)")
  }
}
