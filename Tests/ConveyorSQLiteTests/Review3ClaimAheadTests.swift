import ConveyorSQLite
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import Conveyor

/// An item of the second review's claim-ahead tests; `key` is its deduplication key.
private struct R3Item: Queueable {
  var name: String
  var key: String? = nil
  var deduplicationKey: String? { key }
}

/// A queue at concurrency 1 on a manual clock: "quick" waits for `quickGoes`, "slow" opens
/// `slowStarted` and waits for `slowGoes`; every run is logged as "name attempt N".
private final class R3Scenario: Sendable {
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
    path = folder.path("review3-ahead.sqlite")
  }

  func configuration(claimsAhead: Bool = true, maxAttempts: Int? = nil) -> JobQueueConfiguration {
    var configuration = JobQueueConfiguration(
      identifier: "ahead", maxAttempts: maxAttempts, claimsAhead: claimsAhead, autoStart: false,
      clock: clock, log: logs.append)
    configuration.claimAheadStoreCallFloor = .zero
    return configuration
  }

  func queue(_ configuration: JobQueueConfiguration, store: any JobStore) throws -> JobQueue<R3Item> {
    try JobQueue<R3Item>(configuration: configuration, store: store) { [self] item, context in
      await self.handle(item, attempts: context.attempts)
      return .handled
    }
  }

  func handle(_ item: R3Item, attempts: Int) async {
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
    _ queue: JobQueue<R3Item>, store: any JobStore, rest: [R3Item], expectHeld: Bool = true
  ) async throws -> [JobID] {
    try await queue.add(contentsOf: [R3Item(name: "quick"), R3Item(name: "slow")] + rest)
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
    var mostAsleep = 0
    for _ in 0..<10 {
      mostAsleep = max(mostAsleep, clock.sleeping)
      try await Task.sleep(for: .milliseconds(20))
    }
    let asleep = mostAsleep
    try await eventually("the loop asleep", timeout: .seconds(30)) { self.clock.sleeping >= asleep }
  }
}

/// Lets whatever remains run (moving the manual clock) until the store holds nothing, bounded.
private func r3Drain(_ scenario: R3Scenario, _ sqlite: SQLiteJobStore) async {
  _ = try? await eventually("the store empty", timeout: .seconds(10)) {
    scenario.clock.advance(by: .milliseconds(100))
    return try await sqlite.counts(queue: "ahead", now: scenario.clock.now()) == JobCounts()
  }
}

/// The activity total of a store.
private func r3Total(_ store: SQLiteJobStore, queue: String) async throws -> QueueActivity {
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
    let first = try JobQueue<R3Item>(configuration: JobQueueConfiguration(identifier: "act"), store: store) {
      item, context in
      runs.append("\(item.name) attempt \(context.attempts)")
      blocked.set()
      try await Task.sleep(for: .seconds(60))
      return .handled
    }
    let id = try await first.add(R3Item(name: "job")).id
    try await eventually("started", timeout: .seconds(10)) { blocked.value }
    await first.shutdown(gracePeriod: .milliseconds(200))
    let record = try await store.job(id)
    #expect(record?.attempts == 0)
    #expect(record?.lastError != nil)
    let second = try JobQueue<R3Item>(configuration: JobQueueConfiguration(identifier: "act"), store: store) {
      item, context in
      runs.append("\(item.name) attempt \(context.attempts)")
      return runs.all.count < 3 ? .discard(reason: "") : .handled
    }
    try await eventually("dead", timeout: .seconds(10)) { try await store.job(id)?.status == .dead }
    #expect(try await second.requeueDead() == 1)
    try await eventually("done", timeout: .seconds(10)) { try await store.job(id) == nil }
    await second.shutdown(gracePeriod: .seconds(5))
    #expect(runs.all == ["job attempt 1", "job attempt 1", "job attempt 1"])
    let total = try await r3Total(store, queue: "act")
    #expect(total.started == 1, "one job, first started once: \(total)")
  }

  /// Guard: jobs prefetched and handed back unstarted at shutdown are counted once each when a
  /// later queue runs them.
  @Test(.timeLimit(.minutes(2)))
  func prefetchedJobsHandedBackAtShutdownAreCountedOnce() async throws {
    let scenario = try R3Scenario()
    defer { scenario.openAll() }
    let sqlite = try SQLiteJobStore(path: scenario.path)
    var configuration = scenario.configuration(claimsAhead: false)
    configuration.prefetch = 2
    let queue = try scenario.queue(configuration, store: sqlite)
    try await queue.add(contentsOf: ["slow", "a", "b"].map { R3Item(name: $0) })
    queue.start()
    await scenario.slowStarted.wait()
    try await eventually("a and b prefetched", timeout: .seconds(10)) {
      try await sqlite.jobs(queue: "ahead", status: .running, after: nil, limit: 10).count == 3
    }
    let stopping = Task { await queue.shutdown(gracePeriod: .seconds(30)) }
    try await eventually("handed back", timeout: .seconds(10)) {
      try await sqlite.jobs(queue: "ahead", status: .pending, after: nil, limit: 10).count == 2
    }
    scenario.slowGoes.open()
    await stopping.value
    let later = try scenario.queue(configuration, store: sqlite)
    later.start()
    await r3Drain(scenario, sqlite)
    await later.shutdown(gracePeriod: .seconds(5))
    #expect(scenario.runs.all == ["slow attempt 1", "a attempt 1", "b attempt 1"])
    let total = try await r3Total(sqlite, queue: "ahead")
    #expect(total.started == 3, "\(total)")
  }
}
