import Conveyor
import ConveyorSQLite
import Foundation

// The history of finished jobs on SQLite: the drain and the single add with 1,000,000 completed
// jobs kept, against the same on an empty history; and pruning a million completed jobs while a
// worker claims (each claim's latency, p50 and p99, against the same claims without pruning).

func runHistoryBenchmarks() async throws {
  let files = try BenchmarkFolder("history")
  defer { withExtendedLifetime(files) {} }  // the files stay until the section ends
  let newPath = files.newPath
  section("SQLite store with 1,000,000 completed jobs kept as history")
  let kept = 1_000_000
  let historyPath = newPath()
  let fill = try await seconds { try await fillHistory(historyPath, completed: kept) }
  print(String(format: "made %d completed jobs in %.1f s", kept, fill))
  let history = try SQLiteJobStore(path: historyPath)
  let count = 20_000

  // The store alone: claim and complete one per call (the claim-latency loop, timed whole).
  let (storeFull, storeEmpty) = try await interleaved(repeats: 3) {
    try await claimLatencies(history, claims: count).total
  } baseline: {
    try await claimLatencies(try SQLiteJobStore(path: newPath()), claims: count).total
  }
  Comparison(
    name: "store claim+complete 1 per call, 1M kept", count: count, seconds: storeFull,
    baselineName: "the same, empty history", baselineSeconds: storeEmpty, goal: nil
  ).print()
  for concurrency in [1, 4] {
    let (full, empty) = try await interleaved(repeats: 3) {
      try await historyDrain(history, count: count, concurrency: concurrency)
    } baseline: {
      try await historyDrain(try SQLiteJobStore(path: newPath()), count: count, concurrency: concurrency)
    }
    Comparison(
      name: "JobQueue drain c\(concurrency), 1M completed kept", count: count, seconds: full,
      baselineName: "the same, empty history", baselineSeconds: empty, goal: 0.95
    ).print()
  }
  let adds = 5_000
  let (addFull, addEmpty) = try await interleaved(repeats: 3) {
    try await addOneByOne(history, count: adds)
  } baseline: {
    try await addOneByOne(try SQLiteJobStore(path: newPath()), count: adds)
  }
  Comparison(
    name: "enqueue 1 per call, 1M completed kept", count: adds, seconds: addFull,
    baselineName: "the same, empty history", baselineSeconds: addEmpty, goal: 0.95
  ).print()

  // Pruning: a worker's claims (one job per call, completing the previous one) with and without
  // a pruner deleting the million completed jobs in batches of 500 beside it.
  section("Pruning 1,000,000 completed jobs while a worker claims (SQLite)")
  let pruneStore = try SQLiteJobStore(path: historyPath)
  let quiet = try await claimLatencies(pruneStore, claims: 4_000)
  let (busy, pruned, pruneTime) = try await claimLatenciesWhilePruning(pruneStore, claims: 4_000)
  printPruningLatencies(quiet: quiet, busy: busy, pruned: pruned, seconds: pruneTime)
}

/// Seconds for a `JobQueue` at `concurrency` (no-op handler) to drain `count` new jobs of queue
/// "bench" of `store`.
func historyDrain(_ store: any JobStore, count: Int, concurrency: Int) async throws -> Double {
  let payload = try JSONEncoder().encode(BenchItem(url: "https://example.com/h", attempt: 1, body: "hi"))
  let jobs = Array(repeating: NewJob(payload: payload, runAt: benchEpoch), count: 1_000)
  for _ in 0..<(count / 1_000) { _ = try await store.enqueue(jobs, queue: "bench", clock: benchClock) }
  let configuration = JobQueueConfiguration(identifier: "bench", concurrency: concurrency, autoStart: false)
  let queue = try JobQueue<BenchItem>(configuration: configuration, store: store) { _, _ in .handled }
  let start = ContinuousClock.now
  queue.start()
  await queue.waitUntilFinished()
  let elapsed = seconds(since: start)
  await queue.shutdown(gracePeriod: .seconds(5))
  return elapsed
}

/// Seconds to add `count` jobs to queue "adds" of `store`, one per call.
func addOneByOne(_ store: any JobStore, count: Int) async throws -> Double {
  let job = NewJob(payload: benchPayload, runAt: benchEpoch)
  let start = ContinuousClock.now
  for _ in 0..<count { _ = try await store.enqueue([job], queue: "adds", clock: benchClock) }
  return seconds(since: start)
}

/// Latencies in milliseconds.
struct Latencies {
  var p50: Double
  var p99: Double
  var max: Double
  /// All the samples together, in seconds.
  var total: Double

  init(_ samples: [Double]) {
    total = samples.reduce(0, +) / 1_000
    let sorted = samples.sorted()
    func at(_ fraction: Double) -> Double {
      sorted[min(sorted.count - 1, Int(Double(sorted.count) * fraction))]
    }
    p50 = at(0.5)
    p99 = at(0.99)
    max = sorted.last ?? 0
  }
}

/// Adds `claims` jobs to queue "claims" of `store`, then claims them one per call, completing
/// each with the next claim; the latency of each call.
func claimLatencies(_ store: any JobStore, claims: Int) async throws -> Latencies {
  let jobs = Array(repeating: NewJob(payload: benchPayload, runAt: benchEpoch), count: 1_000)
  for _ in 0..<(claims / 1_000) { _ = try await store.enqueue(jobs, queue: "claims", clock: benchClock) }
  let lease = Lease(owner: "bench", duration: .seconds(3_600))
  var samples: [Double] = []
  var settlements: [JobSettlement] = []
  while true {
    let start = ContinuousClock.now
    let claimed = try await store.settleAndClaim(
      settlements, queue: "claims", limit: 1, lease: lease, clock: benchClock
    ).claimed
    samples.append(seconds(since: start) * 1_000)
    guard let job = claimed.first else { break }
    settlements = [JobSettlement(claim: job.claim, action: .complete)]
  }
  return Latencies(samples)
}

/// Prints the claim latencies without and with pruning, and the pruning's pace.
func printPruningLatencies(quiet: Latencies, busy: Latencies, pruned: Int, seconds: Double) {
  print(
    String(
      format: "claim latency without pruning: p50 %.2f ms, p99 %.2f ms, max %.2f ms", quiet.p50, quiet.p99,
      quiet.max))
  print(
    String(
      format:
        "claim latency while pruning:   p50 %.2f ms, p99 %.2f ms, max %.2f ms (%d pruned in %.1f s, %.0f/s)",
      busy.p50, busy.p99, busy.max, pruned, seconds, Double(pruned) / seconds))
}

/// `claimLatencies` while a queue purges the completed jobs of queue "bench" (as its pruner does);
/// the latencies, how many were pruned, and how long pruning took.
private func claimLatenciesWhilePruning(_ store: SQLiteJobStore, claims: Int) async throws
  -> (Latencies, Int, Double)
{
  // A queue's own pruning (batches of 500, each followed by a rest as long as it took).
  let queue = try JobQueue<BenchItem>(
    configuration: JobQueueConfiguration(identifier: "bench", autoStart: false), store: store
  ) { _, _ in .handled }
  let pruner = Task { () async throws -> (Int, Double) in
    let start = ContinuousClock.now
    let deleted = try await queue.purge(.completed)
    return (deleted, seconds(since: start))
  }
  let latencies = try await claimLatencies(store, claims: claims)
  let (deleted, time) = try await pruner.value
  return (latencies, deleted, time)
}

/// Makes a store at `path` holding `completed` completed jobs of queue "bench" (finished over the
/// last day), written with one SQL statement.
private func fillHistory(_ path: String, completed: Int) async throws {
  let now = Int64(Date().timeIntervalSince1970 * 1000)
  try await execOnSQLiteFile(
    path,
    """
    WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < \(completed))
    INSERT INTO jobs (queue, payload, status, priority, attempts, run_at, created_at, finished_at, run_ms)
    SELECT 'bench', CAST('{"url":"https://example.com/hook","attempt":1,"body":"hello, world"}' AS BLOB),
      'completed', 0, 1, \(now - 86_400_000) + i, \(now - 86_400_000) + i, \(now - 86_400_000) + i * 80, 3
    FROM n;
    """)
}
