import Conveyor
import ConveyorSQLite
import Foundation

// Ordering keys (the section `ordering`): a `JobQueue` at concurrency 4 draining 20,000 jobs
// spread over 1,000 ordering keys (20 a key, one at a time each, in order), against the same
// drain of jobs without keys, on SQLite and in memory.

func runOrderingBenchmarks() async throws {
  let files = try BenchmarkFolder("ordering")
  defer { withExtendedLifetime(files) {} }  // the files stay until the section ends
  let newPath = files.newPath
  section("Ordering keys: JobQueue drain c4, 20,000 jobs on 1,000 keys (best of 3, interleaved)")
  let count = 20_000
  let keys = 1_000
  let (storeKeyed, storePlain) = try await interleaved(repeats: 3) {
    try await orderedStoreDrain(try SQLiteJobStore(path: newPath()), count: count, keys: keys)
  } baseline: {
    try await orderedStoreDrain(try SQLiteJobStore(path: newPath()), count: count, keys: nil)
  }
  Comparison(
    name: "SQLite store claim+complete 4 per call, 1,000 keys", count: count, seconds: storeKeyed,
    baselineName: "the same jobs without keys", baselineSeconds: storePlain, goal: nil
  ).print()
  let (sqliteKeyed, sqlitePlain) = try await interleaved(repeats: 3) {
    try await orderedDrain(try SQLiteJobStore(path: newPath()), count: count, keys: keys)
  } baseline: {
    try await orderedDrain(try SQLiteJobStore(path: newPath()), count: count, keys: nil)
  }
  Comparison(
    name: "SQLite drain c4, 1,000 ordering keys", count: count, seconds: sqliteKeyed,
    baselineName: "the same jobs without keys", baselineSeconds: sqlitePlain, goal: 0.7
  ).print()
  // Held jobs join the claim index when their turn comes, during the drain; jobs without a key
  // join it when added. The add and the drain together compare the whole of both.
  let (wholeKeyed, wholePlain) = try await interleaved(repeats: 3) {
    try await orderedDrain(try SQLiteJobStore(path: newPath()), count: count, keys: keys, timingTheAdd: true)
  } baseline: {
    try await orderedDrain(try SQLiteJobStore(path: newPath()), count: count, keys: nil, timingTheAdd: true)
  }
  Comparison(
    name: "SQLite add + drain c4, 1,000 ordering keys", count: count, seconds: wholeKeyed,
    baselineName: "the same jobs without keys", baselineSeconds: wholePlain, goal: nil
  ).print()
  let (memoryKeyed, memoryPlain) = try await interleaved(repeats: 3) {
    try await orderedDrain(InMemoryJobStore(), count: count, keys: keys)
  } baseline: {
    try await orderedDrain(InMemoryJobStore(), count: count, keys: nil)
  }
  Comparison(
    name: "in-memory drain c4, 1,000 ordering keys", count: count, seconds: memoryKeyed,
    baselineName: "the same jobs without keys", baselineSeconds: memoryPlain, goal: 0.7
  ).print()
}

/// Adds `count` jobs to queue "bench" of `store`, job `i` with the ordering key `i % keys`
/// (none when `keys` is nil).
func addOrdered(
  _ store: any JobStore, count: Int, keys: Int?, limitKeys: Int? = nil, fairnessKeys: Int? = nil
) async throws {
  let payload = try JSONEncoder().encode(BenchItem(url: "https://example.com/o", attempt: 1, body: "hi"))
  for batch in stride(from: 0, to: count, by: 1_000) {
    let jobs = (batch..<batch + 1_000).map { index in
      NewJob(
        payload: payload, runAt: benchEpoch, orderingKey: keys.map { "key-\(index % $0)" },
        limitKey: limitKeys.map { "host-\(index % $0)" },
        fairnessKey: fairnessKeys.map { "tenant-\(index % $0)" })
    }
    _ = try await store.enqueue(jobs, queue: "bench", clock: benchClock)
  }
}

/// Seconds for one caller to claim and complete `count` jobs (added by ``addOrdered``), four per
/// call, each call completing the four before: the store's own cost, without a queue's loop.
func orderedStoreDrain(_ store: any JobStore, count: Int, keys: Int?) async throws -> Double {
  try await addOrdered(store, count: count, keys: keys)
  let lease = Lease(owner: "bench", duration: .seconds(60))
  let start = ContinuousClock.now
  var settling: [JobSettlement] = []
  var handled = 0
  while true {
    let batch = try await store.settleAndClaim(
      settling, queue: "bench", limit: 4, lease: lease, clock: SystemJobClock())
    handled += batch.claimed.count
    if batch.claimed.isEmpty { break }
    settling = batch.claimed.map { JobSettlement(claim: $0.claim, action: .complete) }
  }
  let elapsed = seconds(since: start)
  guard handled == count else { throw BenchmarkFailure("the store drain handled \(handled) of \(count)") }
  return elapsed
}

/// Seconds for a `JobQueue` at concurrency 4 (no-op handler) to drain `count` new jobs of queue
/// "bench" of `store`, job `i` with the ordering key `i % keys` (none when `keys` is nil).
/// With `timingTheAdd`, the seconds include adding the jobs (1,000 per call); with a
/// `concurrencyLimit`, the queue's stored limit is set to it first.
func orderedDrain(
  _ store: any JobStore, count: Int, keys: Int?, limitKeys: Int? = nil, fairnessKeys: Int? = nil,
  timingTheAdd: Bool = false
) async throws -> Double {
  let added = ContinuousClock.now
  try await addOrdered(store, count: count, keys: keys, limitKeys: limitKeys, fairnessKeys: fairnessKeys)
  let configuration = JobQueueConfiguration(identifier: "bench", concurrency: 4, autoStart: false)
  let queue = try JobQueue<BenchItem>(configuration: configuration, store: store) { _, _ in .handled }
  let start = ContinuousClock.now
  queue.start()
  await queue.waitUntilFinished()
  let elapsed = seconds(since: timingTheAdd ? added : start)
  await queue.shutdown(gracePeriod: .seconds(5))
  let left = try await store.counts(queue: "bench", clock: benchClock)
  guard left.unfinished == 0 else { throw BenchmarkFailure("the drain left \(left)") }
  return elapsed
}
