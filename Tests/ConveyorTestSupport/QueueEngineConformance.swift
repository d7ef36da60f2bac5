import Conveyor
import Foundation
import Synchronization

/// What a `JobQueue` does on top of a store, checked on every store: each check runs real queues
/// on the real clock against the store it is given (empty), as ``JobStoreConformance`` does for
/// the store alone.
///
/// ```swift
/// @Test(arguments: QueueEngineConformance.checks)
/// func engine(_ check: JobStoreCheck) async throws {
///   try await check.run(makeStore())
/// }
/// ```
public enum QueueEngineConformance {
  /// The item the checks add: a name.
  struct Named: Queueable, Hashable {
    var name: String
  }

  /// The handled names, in order, across every queue of a check.
  final class Runs: Sendable {
    private let names = Mutex<[String]>([])
    func append(_ name: String) { names.withLock { $0.append(name) } }
    var all: [String] { names.withLock { $0 } }
  }

  static func configuration(
    _ identifier: String = "engine", lease: Duration = .seconds(60),
    pollInterval: Duration = .milliseconds(50)
  ) -> JobQueueConfiguration {
    JobQueueConfiguration(
      identifier: identifier, retryPolicy: .fixed(.seconds(60)), leaseDuration: lease,
      pollInterval: pollInterval)
  }

  static func expect(_ condition: Bool, _ message: @autoclosure () -> String, line: UInt = #line) throws {
    if !condition { throw ConformanceFailure(description: "line \(line): \(message())") }
  }

  /// Waits (a minute at most, a hang guard) until `condition` holds; throws saying `what` did not
  /// happen.
  public static func waitFor(
    _ what: String, line: UInt = #line, _ condition: @Sendable () async throws -> Bool
  ) async throws {
    let deadline = ContinuousClock.now + .seconds(60)
    while try await !condition() {
      try expect(ContinuousClock.now < deadline, "waited a minute for \(what)", line: line)
      try await Task.sleep(for: .milliseconds(5))
    }
  }

  /// Waits until a job of queue `engine` is running in `store`: a claim reached the store (its
  /// answer may still be on its way back).
  static func waitUntilRunning(_ store: any JobStore, line: UInt = #line) async throws {
    try await waitFor("the claim to reach the store", line: line) {
      try await !store.jobs(queue: "engine", status: .running, after: nil, limit: 1).isEmpty
    }
  }

  static func payload(_ name: String) throws -> Data { try JSONEncoder().encode(Named(name: name)) }

  static func check(_ name: String, _ body: @escaping @Sendable (any JobStore) async throws -> Void)
    -> JobStoreCheck
  {
    JobStoreCheck(name: name, run: body)
  }

  /// Every check.
  public static let checks: [JobStoreCheck] =
    [
      check("a restarted queue runs the vanished worker's job before the jobs added after it") { store in
        let clock = SystemJobClock()
        _ = try await store.enqueue([NewJob(payload: try payload("a"))], queue: "engine", clock: clock)
        // A worker claims it and vanishes (its lease is left to lapse); jobs are added meanwhile.
        let lost = try await store.settleAndClaim(
          [], queue: "engine", limit: 1, lease: Lease(owner: "vanished", duration: .milliseconds(50)),
          clock: clock)
        try expect(lost.claimed.count == 1, "claimed by the vanished worker")
        _ = try await store.enqueue(
          [NewJob(payload: try payload("b")), NewJob(payload: try payload("c"))], queue: "engine",
          clock: clock)
        try await Task.sleep(for: .milliseconds(120))
        let runs = Runs()
        let queue = try JobQueue<Named>(configuration: configuration(), store: store) { item, _ in
          runs.append(item.name)
          return .handled
        }
        await queue.waitUntilFinished()
        await queue.shutdown()
        try expect(runs.all == ["a", "b", "c"], "the rescued job first: \(runs.all)")
      },
      check("a job retried with no delay runs after the jobs that waited: A1, B1, C1, A2") { store in
        let runs = Runs()
        var configuration = configuration()
        configuration.autoStart = false
        let queue = try JobQueue<Named>(configuration: configuration, store: store) { item, context in
          runs.append("\(item.name)\(context.attempts)")
          return item.name == "a" && context.attempts == 1 ? .retry(after: .zero) : .handled
        }
        try await queue.add(contentsOf: ["a", "b", "c"].map { Named(name: $0) })
        queue.start()
        await queue.waitUntilFinished()
        await queue.shutdown()
        try expect(runs.all == ["a1", "b1", "c1", "a2"], "order: \(runs.all)")
      },
      check("a claim answered after its lease lapsed is handed back unstarted, never run twice") { store in
        // Queue `late` hears of its claim only once queue `other` (another process, on the same
        // store) rescued the job and ran it: its answer is held until then, however long a loaded
        // machine takes (a fixed delay let the answer arrive before the rescue).
        let delayed = InstrumentedJobStore(store)
        let takenOver = Gate()
        delayed.holdNextClaimAnswer(until: takenOver)
        let runs = Runs()
        let handler: JobQueue<Named>.Handler = { item, _ in
          runs.append(item.name)
          return .handled
        }
        let lateLogs = Runs()
        var lateConfiguration = configuration(lease: .milliseconds(1_500))
        lateConfiguration.autoStart = false
        lateConfiguration.log = { lateLogs.append($0.message) }
        let late = try JobQueue<Named>(configuration: lateConfiguration, store: delayed, handler: handler)
        try await late.add(Named(name: "x"))
        late.start()
        try await waitUntilRunning(store)
        let other = try JobQueue<Named>(
          configuration: configuration(lease: .milliseconds(1_500)), store: store, handler: handler)
        try await waitFor("the other queue to run the job") { runs.all == ["x"] }
        takenOver.open()
        try await waitFor("the late queue to hand its claim back") {
          lateLogs.all.contains { $0.contains("handed back 1 claimed job(s) unstarted") }
        }
        await other.waitUntilFinished()
        await late.shutdown()
        await other.shutdown()
        try expect(runs.all == ["x"], "the handler ran once: \(runs.all)")
        let counts = try await store.counts(queue: "engine", clock: SystemJobClock())
        try expect(counts.total == 0, "the job is done: \(counts)")
      },
      // A claim counts an attempt when it is made. One answered after its lease lapsed is handed
      // back, which gives the attempt back, unless another worker rescued the job first: a store
      // cannot tell that claim from one whose worker crashed while running the job, so the attempt
      // stays counted (documented on `JobQueueConfiguration.maxAttempts`). With one attempt allowed
      // the job is then dead without running; the rescuing worker's log and the dead job's error say
      // why.
      check("a claim answered after another worker took the job over counts as a lost attempt") { store in
        let delayed = InstrumentedJobStore(store)
        let takenOver = Gate()
        delayed.holdNextClaimAnswer(until: takenOver)
        let runs = Runs()
        let handler: JobQueue<Named>.Handler = { item, context in
          runs.append("\(item.name)\(context.attempts)")
          return .handled
        }
        let lateLogs = Runs()
        var lateConfiguration = configuration(lease: .milliseconds(1_500))
        lateConfiguration.autoStart = false
        lateConfiguration.maxAttempts = 1
        lateConfiguration.log = { lateLogs.append($0.message) }
        let late = try JobQueue<Named>(configuration: lateConfiguration, store: delayed, handler: handler)
        try await late.add(Named(name: "x"))
        late.start()
        try await waitUntilRunning(store)
        var otherConfiguration = configuration(lease: .milliseconds(1_500))
        otherConfiguration.maxAttempts = 1
        let other = try JobQueue<Named>(configuration: otherConfiguration, store: store, handler: handler)
        // The other queue rescues the lapsed claim, whose one attempt is used: the job is dead.
        try await waitFor("the other queue to rescue the job") {
          try await !store.jobs(queue: "engine", status: .dead, after: nil, limit: 1).isEmpty
        }
        takenOver.open()
        try await waitFor("the late queue to hand its claim back") {
          lateLogs.all.contains { $0.contains("handed back 1 claimed job(s) unstarted") }
        }
        await late.shutdown()
        await other.shutdown()
        let dead = try await store.jobs(queue: "engine", status: .dead, after: nil, limit: 5)
        try expect(runs.all.isEmpty, "never run: \(runs.all)")
        try expect(
          dead.count == 1 && dead[0].lastError?.contains("the worker stopped") == true,
          "dead, the lost claim counted: \(dead.map { $0.lastError ?? "" })")
      },
      check("a claim answered late, before its lease lapsed, is handed back with its attempt") { store in
        let delayed = InstrumentedJobStore(store)
        // Two thirds of the lease gone when the answer arrives: too little left for a heartbeat.
        delayed.delayClaimAnswers([.milliseconds(700)])
        let attempts = Mutex<[Int]>([])
        let logs = Runs()
        var configuration = configuration(lease: .milliseconds(900))
        configuration.log = { logs.append($0.message) }
        let queue = try JobQueue<Named>(configuration: configuration, store: delayed) { _, context in
          attempts.withLock { $0.append(context.attempts) }
          return .handled
        }
        try await queue.add(Named(name: "x"))
        await queue.waitUntilFinished()
        await queue.shutdown()
        try expect(
          attempts.withLock { $0 } == [1], "ran once, as its first attempt: \(attempts.withLock { $0 })")
        try expect(
          logs.all.contains { $0.contains("handed back 1 claimed job(s) unstarted") }, "said so: \(logs.all)")
      },
    ] + timeLimitChecks + cancelChecks + historyChecks + deduplicationChecks + scheduleChecks + orderingChecks
    + deadHeadChecks + limitChecks + workflowChecks
}
