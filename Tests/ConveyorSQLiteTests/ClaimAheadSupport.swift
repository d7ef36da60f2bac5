import ConveyorSQLite
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import Conveyor

/// An item of the claim-ahead tests; `key` is its deduplication key.
struct AheadItem: Queueable {
  var name: String
  var key: String? = nil
  var deduplicationKey: String? { key }
}

/// A queue at concurrency 1 on a manual clock: "quick" waits for `quickGoes`, "slow" opens
/// `slowStarted` and waits for `slowGoes`; every run is logged as "name attempt N".
final class ClaimAheadScenario: Sendable {
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
    path = folder.path("ahead.sqlite")
  }

  /// A configuration of the scenario's queue; `claimsAhead` nil leaves the library's default.
  func configuration(
    maxAttempts: Int? = nil, claimsAhead: Bool? = true, lease: Duration = .seconds(60),
    log: Bool = true
  ) -> JobQueueConfiguration {
    var configuration = JobQueueConfiguration(
      identifier: "ahead", maxAttempts: maxAttempts, autoStart: false,
      leaseDuration: lease, clock: clock, log: log ? logs.append : nil)
    if let claimsAhead { configuration.claimsAhead = claimsAhead }
    // Store calls take no time on this clock: count them as worth overlapping.
    configuration.claimAheadStoreCallFloor = .zero
    return configuration
  }

  /// A queue whose handler is ``handle(_:attempts:tag:)``.
  func queue(_ configuration: JobQueueConfiguration, store: any JobStore, tag: String = "") throws
    -> JobQueue<AheadItem>
  {
    try JobQueue<AheadItem>(configuration: configuration, store: store) { [self] item, context in
      await handle(item, attempts: context.attempts, tag: tag)
      return .handled
    }
  }

  /// Logs the run as "`tag`name attempt N"; "quick" and "slow" wait for their gates.
  func handle(_ item: AheadItem, attempts: Int, tag: String = "") async {
    runs.append("\(tag)\(item.name) attempt \(attempts)")
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
    _ queue: JobQueue<AheadItem>, store: any JobStore, rest: [AheadItem], expectHeld: Bool = true
  ) async throws -> [JobID] {
    try await queue.add(contentsOf: [AheadItem(name: "quick"), AheadItem(name: "slow")] + rest)
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
    // The worker woke the loop to time the hold: let it fall asleep again before the test moves
    // the clock (a wait is computed relative to the clock's reading).
    try await settle()
    return ids
  }

  /// Starts `queue` on quick, slow, then jobs named `rest` (see
  /// ``runUntilSlow(_:store:rest:expectHeld:)``).
  func runUntilHeld(_ queue: JobQueue<AheadItem>, store: any JobStore, rest: [String]) async throws -> [JobID]
  {
    try await runUntilSlow(queue, store: store, rest: rest.map { AheadItem(name: $0) })
  }

  /// Lets the queue's tasks fall asleep on the manual clock.
  func settle() async throws {
    try await waitUntilAsleep(try await mostAsleep(on: clock, samples: 10), on: clock, timeout: .seconds(30))
  }

  /// Lets whatever remains run (moving the manual clock) until `store` holds nothing, bounded.
  func drain(_ store: SQLiteJobStore) async {
    _ = try? await eventually("the store empty", timeout: .seconds(30)) {
      clock.advance(by: .milliseconds(100))
      return try await store.counts(queue: "ahead", now: clock.now()) == JobCounts()
    }
  }
}

/// A callback delegate whose readiness the test switches; it runs each job through the
/// scenario's ``ClaimAheadScenario/handle(_:attempts:tag:)``.
final class SwitchableDelegate: JobQueueDelegate, Sendable {
  typealias Item = AheadItem
  let scenario: ClaimAheadScenario
  let ready = Mutex(true)

  init(_ scenario: ClaimAheadScenario) { self.scenario = scenario }

  func queue(
    _ queue: JobQueue<AheadItem>, handle item: AheadItem, attempts: Int,
    completion: @escaping @Sendable (JobResult) -> Void
  ) async {
    let scenario = scenario
    Task {
      await scenario.handle(item, attempts: attempts)
      completion(.handled)
    }
  }

  func queueFinished(_ queue: JobQueue<AheadItem>) async {}

  var isReadyForJobs: Bool { ready.withLock { $0 } }
}
