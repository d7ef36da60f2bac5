import Conveyor
import ConveyorPostgres
import ConveyorSQLite
import Foundation
import Synchronization

// Workflows (the section `workflows`):
// - throughput: runs of a five-step workflow (each step returns a small value, its result stored
//   before the next) through a `WorkflowQueue` at concurrency 4, against the same five steps as
//   five chained plain jobs through a `JobQueue` at concurrency 4 (each job's handler adds the
//   next, the fifth ends the chain). Both add their first jobs up front and are timed from the
//   workers' start to the last completion. Goal (issue 37): >= 0.7x on SQLite and PostgreSQL.
// - resume after a lost worker: a run is claimed by a worker that vanishes (as after SIGKILL,
//   its lease of 1 s is left to lapse) while a queue with the default settings runs; the time
//   from the lease's end to the run's next step starting elsewhere.
// With CONVEYOR_POSTGRES_URL (Benchmarks/with-postgres.sh), on PostgreSQL too.

private struct Chain: Workflow {
  let name = "chain"
  func run(_ input: Int, context: WorkflowContext) async throws -> Int {
    var value = input
    for step in 1...5 {
      let current = value
      value = try await context.step("step \(step)") { current + step }
    }
    return value
  }
}

private struct ChainLink: Queueable {
  var value: Int
  var step: Int
}

func runWorkflowBenchmarks() async throws {
  let files = try BenchmarkFolder("workflows")
  defer { withExtendedLifetime(files) {} }  // the files stay until the section ends
  let newPath = files.newPath
  let url = ProcessInfo.processInfo.environment["CONVEYOR_POSTGRES_URL"]
  let schemas = BenchmarkSchemas("workflows")
  let newStore = schemas.newStore
  var stores: [(String, Int, () async throws -> any JobStore)] = [
    ("SQLite", 2_000, { try SQLiteJobStore(path: newPath()) }),
    ("in-memory", 2_000, { InMemoryJobStore() }),
  ]
  if let url { stores.append(("PostgreSQL", 500, { try await newStore(url) })) }

  section("Workflows: five-step runs vs five chained jobs, c4 (best of 3, interleaved)")
  for (name, count, makeStore) in stores {
    let (workflow, chained) = try await interleaved(repeats: 3) {
      try await workflowDrain(try await makeStore(), runs: count)
    } baseline: {
      try await chainedDrain(try await makeStore(), chains: count)
    }
    Comparison(
      name: "\(name) 5-step workflow runs", count: count, seconds: workflow,
      baselineName: "5 chained plain jobs", baselineSeconds: chained, goal: name == "in-memory" ? nil : 0.7
    ).print()
  }
  if url == nil {
    print("(PostgreSQL rows skipped: no CONVEYOR_POSTGRES_URL; run through Benchmarks/with-postgres.sh)")
  }

  // The lease's end is counted from the claim call's return; the store starts the lease as it
  // commits, a little earlier, so a prompt resumption shows as a few milliseconds below zero.
  section("Workflows: resume after a lost worker (lease 1 s, default poll of 1 s; median of 3)")
  for (name, _, makeStore) in stores {
    var delays: [Double] = []
    for _ in 0..<3 { delays.append(try await resumeDelay(try await makeStore())) }
    let median = delays.sorted()[1]
    print(
      String(
        format: "%-48@ the next step started %+.0f ms from the lease's end (runs: %@ ms)",
        "\(name) run resumed" as NSString, median * 1_000,
        delays.map { String(format: "%.0f", $0 * 1_000) }.joined(separator: ", ") as NSString))
  }
}

private func closing(_ store: any JobStore) async {
  if let store = store as? PostgresJobStore { await store.close() }
  if let store = store as? SQLiteJobStore { await store.close() }
}

/// Adds `runs` runs of ``Chain`` and times the drain at concurrency 4.
private func workflowDrain(_ store: any JobStore, runs: Int) async throws -> Double {
  var configuration = JobQueueConfiguration(identifier: "bench", concurrency: 4, autoStart: false)
  configuration.maxAttempts = nil
  let queue = try WorkflowQueue(configuration: configuration, store: store, workflows: [Chain()])
  for input in 0..<runs { try await queue.add(Chain(), input: input) }
  let start = ContinuousClock.now
  queue.jobs.start()
  try await waitUntilDrained(store)
  let elapsed = seconds(since: start)
  await queue.jobs.shutdown(gracePeriod: .seconds(5))
  await closing(store)
  return elapsed
}

/// Adds `chains` first links and times the drain of five links each at concurrency 4.
private func chainedDrain(_ store: any JobStore, chains: Int) async throws -> Double {
  let configuration = JobQueueConfiguration(identifier: "bench", concurrency: 4, autoStart: false)
  // The handler adds the next link through the queue it runs in: built after it, reached through a box.
  let box = Mutex<JobQueue<ChainLink>?>(nil)
  let chained = try JobQueue<ChainLink>(configuration: configuration, store: store) { link, _ in
    if link.step < 5, let queue = box.withLock({ $0 }) {
      try await queue.add(ChainLink(value: link.value + link.step, step: link.step + 1))
    }
    return .handled
  }
  box.withLock { $0 = chained }
  try await chained.add(contentsOf: (0..<chains).map { ChainLink(value: $0, step: 1) })
  let start = ContinuousClock.now
  chained.start()
  try await waitUntilDrained(store)
  let elapsed = seconds(since: start)
  await chained.shutdown(gracePeriod: .seconds(5))
  box.withLock { $0 = nil }
  await closing(store)
  return elapsed
}

/// Polls every 2 ms until queue "bench" holds no unfinished job.
private func waitUntilDrained(_ store: any JobStore) async throws {
  let clock = SystemJobClock()
  while try await store.counts(queue: "bench", clock: clock).unfinished > 0 {
    try await Task.sleep(for: .milliseconds(2))
  }
}

/// One run claimed by a worker that vanishes with a 1 s lease; seconds from the lease's end to
/// the run's first step starting in a running queue.
private func resumeDelay(_ store: any JobStore) async throws -> Double {
  let started = Mutex<ContinuousClock.Instant?>(nil)
  struct Once: Workflow {
    let name = "once"
    let started: @Sendable () -> Void
    func run(_ input: Int, context: WorkflowContext) async throws -> Int {
      try await context.step("work") {
        started()
        return input
      }
    }
  }
  let workflow = Once { started.withLock { $0 = $0 ?? .now } }
  var configuration = JobQueueConfiguration(identifier: "bench", autoStart: false)
  configuration.maxAttempts = nil
  let queue = try WorkflowQueue(configuration: configuration, store: store, workflows: [workflow])
  try await queue.add(workflow, input: 1)
  let lost = try await store.settleAndClaim(
    [], queue: "bench", limit: 1, lease: Lease(owner: "vanished", duration: .seconds(1)),
    clock: SystemJobClock())
  let leaseEnd = ContinuousClock.now + .seconds(1)
  guard lost.claimed.count == 1 else { throw BenchmarkFailure("the vanishing worker claimed nothing") }
  queue.jobs.start()
  try await waitUntilDrained(store)
  await queue.jobs.shutdown(gracePeriod: .seconds(5))
  await closing(store)
  guard let start = started.withLock({ $0 }) else { throw BenchmarkFailure("the run never resumed") }
  let delay = start - leaseEnd
  return Double(delay.components.seconds) + Double(delay.components.attoseconds) / 1e18
}
