import CLibPQBench
import Conveyor
import ConveyorPostgres
import Foundation
import Synchronization

// PostgreSQL store benchmarks: every store figure is compared with a raw libpq baseline doing the
// same work with the fastest correct at-least-once pattern, measured in the same run, on the same
// server. The server comes from CONVEYOR_POSTGRES_URL: run through `Benchmarks/with-postgres.sh`,
// which starts a private throwaway server and stops it afterwards.

/// Runs the PostgreSQL benchmarks against the server in `CONVEYOR_POSTGRES_URL`.
func runPostgresBenchmarks() async throws {
  guard let url = ProcessInfo.processInfo.environment["CONVEYOR_POSTGRES_URL"] else {
    print(
      "\n== PostgreSQL: skipped (no CONVEYOR_POSTGRES_URL; run through Benchmarks/with-postgres.sh, "
        + "which starts a throwaway server) ==")
    return
  }
  let bench = PostgresBench(url: url)
  let only = ProcessInfo.processInfo.environment["CONVEYOR_BENCH_POSTGRES"]
  if only == "hop" { return try await bench.runHop() }
  if only == "drain" { return try await bench.runSingleDrains() }
  if only == "insert100" { return try await bench.runBatchInsert() }
  if only == "percall" { return try await bench.runConcurrentAdds() }
  if only == nil || only == "store" {
    try await bench.runStoreSection()
    try await bench.runConcurrentAdds()
  }
  if only == nil || only == "queue" { try await bench.runQueueSection() }
  if only == nil || only == "backlog" { try await bench.runBacklogSection() }
  if only == nil || only == "latency" { try await bench.runLatencySection() }
  if only == nil || only == "history" { try await bench.runHistorySection() }
}

private struct PostgresBench {
  let url: String
  let singles = 5_000
  let batched = 50_000
  let drainOne = 5_000
  let drainBatched = 50_000

  private static let schemaNumber = Atomic<Int>(0)

  /// A schema name no other measurement of this run uses.
  func newSchema(_ prefix: String) -> String {
    "\(prefix)_\(ProcessInfo.processInfo.processIdentifier)_\(Self.schemaNumber.wrappingAdd(1, ordering: .relaxed).newValue)"
  }

  func drop(_ schema: String) throws {
    try RawConnection(url).exec("DROP SCHEMA IF EXISTS \(schema) CASCADE")
  }

  func openStore(_ schema: String) async throws -> PostgresJobStore {
    try await PostgresJobStore.open(url: url, options: .init(schema: schema))
  }

  /// One cheap store call (`isPaused`) against the same statement through raw libpq: the cost
  /// of a call's trip to the store's thread and back (CONVEYOR_BENCH_POSTGRES=hop).
  func runHop() async throws {
    let schema = newSchema("hop")
    defer { try? drop(schema) }
    let store = try await openStore(schema)
    let raw = try RawConnection(url)
    try raw.prepare("paused", "SELECT coalesce((SELECT paused FROM \(schema).queues WHERE name = $1), false)")
    for _ in 0..<3 {
      let storeTime = try await seconds {
        for _ in 0..<5_000 { _ = try await store.isPaused(queue: "bench") }
      }
      let rawTime = try await seconds {
        for _ in 0..<5_000 { PQclear(try raw.run("paused", [Array("bench".utf8)])) }
      }
      print(
        String(
          format: "isPaused: store %.1f us, raw libpq %.1f us", storeTime / 5_000 * 1e6, rawTime / 5_000 * 1e6
        ))
    }
    await store.close()
  }

  /// Only the row of adds 100 per call, for profiling it alone (CONVEYOR_BENCH_POSTGRES=insert100).
  func runBatchInsert() async throws {
    let (store, raw) = try await interleaved(repeats: 3) {
      try await storeInsert(batched, batch: 100)
    } baseline: {
      try rawInsert(batched, batch: 100)
    }
    Comparison(
      name: "store enqueue, 100 per call", count: batched, seconds: store,
      baselineName: "raw insert, 100 per transaction", baselineSeconds: raw, goal: 0.5
    ).print()
  }

  /// Only the unbatched claim-and-complete rows, at 1 and 4 connections, for profiling them
  /// alone (CONVEYOR_BENCH_POSTGRES=drain).
  func runSingleDrains() async throws {
    section("PostgreSQL claim+complete, 1 per call (best of 3, runs interleaved)")
    for connections in [1, 4] {
      let (store, raw) = try await interleaved(repeats: 3) {
        try await storeDrain(drainOne, batch: 1, connections: connections)
      } baseline: {
        try rawDrain(drainOne, batch: 1, connections: connections)
      }
      Comparison(
        name: "store claim+complete, 1 per call, \(connections) conn", count: drainOne, seconds: store,
        baselineName: "raw, 1 per txn, \(connections) conn", baselineSeconds: raw, goal: 0.7
      ).print()
    }
  }

  // MARK: Store vs raw libpq

  func runStoreSection() async throws {
    section("PostgreSQL store vs raw libpq (best of 3, runs interleaved)")

    var (store, raw) = try await interleaved(repeats: 3) {
      try await storeInsert(singles, batch: 1)
    } baseline: {
      try rawInsert(singles, batch: 1)
    }
    Comparison(
      name: "store enqueue, 1 per call", count: singles, seconds: store,
      baselineName: "raw insert, 1 per transaction", baselineSeconds: raw, goal: 0.7
    ).print()
    // The same, against a baseline that also sends the NOTIFY every add must send.
    (store, raw) = try await interleaved(repeats: 3) {
      try await storeInsert(singles, batch: 1)
    } baseline: {
      try rawInsert(singles, batch: 1, notify: true)
    }
    Comparison(
      name: "store enqueue, 1 per call", count: singles, seconds: store,
      baselineName: "raw insert + NOTIFY, 1 per txn", baselineSeconds: raw, goal: 0.7
    ).print()

    try await runBatchInsert()

    var storeTimes: [Int: Double] = [:]
    var rawTimes: [Int: Double] = [:]
    for connections in [1, 4] {
      (store, raw) = try await interleaved(repeats: 3) {
        try await storeDrain(drainOne, batch: 1, connections: connections)
      } baseline: {
        try rawDrain(drainOne, batch: 1, connections: connections)
      }
      storeTimes[connections] = store
      rawTimes[connections] = raw
      Comparison(
        name: "store claim+complete, 1 per call, \(connections) conn", count: drainOne, seconds: store,
        baselineName: "raw, 1 per txn, \(connections) conn", baselineSeconds: raw, goal: 0.7
      ).print()
    }
    Comparison(
      name: "store claim+complete 1 per call, 4 conn", count: drainOne, seconds: storeTimes[4]!,
      baselineName: "the same, 1 conn", baselineSeconds: storeTimes[1]!, goal: 1.0
    ).print()
    Comparison(
      name: "raw claim+complete 1 per txn, 4 conn", count: drainOne, seconds: rawTimes[4]!,
      baselineName: "the same, 1 conn", baselineSeconds: rawTimes[1]!, goal: nil
    ).print()

    for connections in [1, 4] {
      (store, raw) = try await interleaved(repeats: 3) {
        try await storeDrain(drainBatched, batch: 100, connections: connections)
      } baseline: {
        try rawDrain(drainBatched, batch: 100, connections: connections)
      }
      storeTimes[connections] = store
      rawTimes[connections] = raw
      Comparison(
        name: "store claim+complete, 100 per call, \(connections) conn", count: drainBatched, seconds: store,
        baselineName: "raw, 100 per txn, \(connections) conn", baselineSeconds: raw, goal: 0.5
      ).print()
    }
    Comparison(
      name: "store claim+complete 100 per call, 4 conn", count: drainBatched, seconds: storeTimes[4]!,
      baselineName: "the same, 1 conn", baselineSeconds: storeTimes[1]!, goal: 1.0
    ).print()
  }

  /// Eight tasks adding one job per call to one store against one task doing the same: the adds
  /// that arrive while one is under way are committed as one group. The row names the server's
  /// `fsync` and `synchronous_commit`: with them on (`POSTGRES_OPTIONS="-c fsync=on -c
  /// synchronous_commit=on"`), every commit waits for the disk, which is what grouping saves
  /// (CONVEYOR_BENCH_POSTGRES=percall).
  func runConcurrentAdds() async throws {
    let raw = try RawConnection(url)
    let fsync = try raw.text("SHOW fsync")
    let synchronous = try raw.text("SHOW synchronous_commit")
    section(
      "PostgreSQL: concurrent adds, one job per call (fsync=\(fsync), synchronous_commit=\(synchronous))")
    let count = 4_000
    let (eight, one) = try await interleaved(repeats: 3) {
      try await storeInsert(count, batch: 1, tasks: 8)
    } baseline: {
      try await storeInsert(count, batch: 1, tasks: 1)
    }
    Comparison(
      name: "8 tasks, 1 per call (fsync=\(fsync))", count: count, seconds: eight,
      baselineName: "1 task, 1 per call", baselineSeconds: one, goal: fsync == "on" ? 2 : nil
    ).print()
  }

  /// Seconds to insert `count` jobs with raw libpq, `batch` per transaction.
  func rawInsert(_ count: Int, batch: Int, notify: Bool = false) throws -> Double {
    let schema = newSchema("raw")
    defer { try? drop(schema) }
    let raw = try RawQueue(url: url, schema: schema, create: true)
    let start = ContinuousClock.now
    try raw.insert(count: count, perTransaction: batch, notify: notify)
    return seconds(since: start)
  }

  /// Seconds to enqueue `count` jobs through the store, `batch` per call, from `tasks` tasks at once
  /// (each making its share of the calls).
  func storeInsert(_ count: Int, batch: Int, tasks: Int = 1) async throws -> Double {
    let schema = newSchema("store")
    defer { try? drop(schema) }
    let store = try await openStore(schema)
    defer { Task { await store.close() } }
    let jobs = Array(repeating: NewJob(payload: benchPayload, runAt: benchEpoch), count: batch)
    let calls = count / batch / tasks
    let start = ContinuousClock.now
    try await withThrowingTaskGroup(of: Void.self) { group in
      for _ in 0..<tasks {
        group.addTask {
          for _ in 0..<calls { _ = try await store.enqueue(jobs, queue: "bench", clock: benchClock) }
        }
      }
      try await group.waitForAll()
    }
    return seconds(since: start)
  }

  /// Seconds for `connections` raw connections, each on a thread, to claim and complete `count`
  /// jobs, `batch` per transaction.
  func rawDrain(_ count: Int, batch: Int, connections: Int) throws -> Double {
    let schema = newSchema("raw")
    defer { try? drop(schema) }
    try RawQueue(url: url, schema: schema, create: true).insert(count: count, perTransaction: 1_000)
    let queues = try (0..<connections).map { _ in try RawQueue(url: url, schema: schema, create: false) }
    let start = ContinuousClock.now
    let handled = try onThreads(queues) { try $0.drain(batch: batch) }
    let elapsed = seconds(since: start)
    guard handled.reduce(0, +) == count else { throw BenchmarkFailure("raw drained \(handled) of \(count)") }
    return elapsed
  }

  /// Seconds for `connections` stores (one connection each) to claim and complete `count` jobs,
  /// `batch` per call.
  func storeDrain(_ count: Int, batch: Int, connections: Int) async throws -> Double {
    let schema = newSchema("store")
    defer { try? drop(schema) }
    let filler = try await openStore(schema)
    try await fill(filler, count: count)
    await filler.close()
    var stores: [PostgresJobStore] = []
    for _ in 0..<connections { stores.append(try await openStore(schema)) }
    let start = ContinuousClock.now
    let handled = try await withThrowingTaskGroup(of: Int.self) { group in
      for store in stores { group.addTask { try await drainPostgresStore(store, batch: batch) } }
      return try await group.reduce(0, +)
    }
    let elapsed = seconds(since: start)
    for store in stores { await store.close() }
    guard handled == count else { throw BenchmarkFailure("store drained \(handled) of \(count)") }
    return elapsed
  }

  func fill(_ store: PostgresJobStore, count: Int) async throws {
    let jobs = Array(repeating: NewJob(payload: benchPayload, runAt: benchEpoch), count: 1_000)
    var left = count
    while left > 0 {
      _ = try await store.enqueue(Array(jobs.prefix(left)), queue: "bench", clock: benchClock)
      left -= min(left, 1_000)
    }
  }

  // MARK: History

  /// The drain and the single add with 1,000,000 completed jobs kept, against the same on an
  /// empty history; claim latency while a queue purges them (CONVEYOR_BENCH_POSTGRES=history).
  func runHistorySection() async throws {
    section("PostgreSQL with 1,000,000 completed jobs kept as history (best of 3, interleaved)")
    let kept = newSchema("history")
    defer { try? drop(kept) }
    let store = try await openStore(kept)
    let fill = try await seconds {
      let raw = try RawConnection(url)
      try raw.exec(
        """
        INSERT INTO \(kept).jobs (queue, payload, status, attempts, run_at, created_at, finished_at, run_ms)
        SELECT 'bench', '\\x7b7d'::bytea, 'completed', 1, now(), now(), now() - i * interval '80 ms', 3
        FROM generate_series(1, 1000000) AS i
        """)
      try raw.exec("VACUUM ANALYZE \(kept).jobs")
      // Write the million rows out now, as a server that has held them a while has: otherwise
      // the checkpoint their WAL starts writes them during the measured rounds.
      try raw.exec("CHECKPOINT")
    }
    print(String(format: "made 1000000 completed jobs in %.1f s", fill))
    // Each round on the kept table starts as each baseline round does, on a new schema: on a
    // store opened for it (no connection or listener kept from an earlier round), with the dead
    // rows of the earlier rounds vacuumed away (the baseline's table has none; a claim would
    // otherwise step over every dead index entry of the rounds before, which autovacuum, after a
    // minute, removes in a running system), untimed.
    func keptStore() async throws -> PostgresJobStore {
      try RawConnection(url).exec("VACUUM \(kept).jobs")
      return try await openStore(kept)
    }
    for concurrency in [1, 4] {
      let count = concurrency == 1 ? drainOne : drainOne * 2
      let (full, empty) = try await interleaved(repeats: 3) {
        let round = try await keptStore()
        let time = try await historyDrain(round, count: count, concurrency: concurrency)
        await round.close()
        return time
      } baseline: {
        let schema = newSchema("empty")
        defer { try? drop(schema) }
        let fresh = try await openStore(schema)
        let time = try await historyDrain(fresh, count: count, concurrency: concurrency)
        await fresh.close()
        return time
      }
      Comparison(
        name: "JobQueue drain c\(concurrency), 1M completed kept", count: count, seconds: full,
        baselineName: "the same, empty history", baselineSeconds: empty, goal: 0.95
      ).print()
    }
    let (addFull, addEmpty) = try await interleaved(repeats: 3) {
      let round = try await keptStore()
      let time = try await addOneByOne(round, count: 2_000)
      await round.close()
      return time
    } baseline: {
      let schema = newSchema("emptyadds")
      defer { try? drop(schema) }
      let fresh = try await openStore(schema)
      let time = try await addOneByOne(fresh, count: 2_000)
      await fresh.close()
      return time
    }
    Comparison(
      name: "enqueue 1 per call, 1M completed kept", count: 2_000, seconds: addFull,
      baselineName: "the same, empty history", baselineSeconds: addEmpty, goal: 0.95
    ).print()
    // Claim latency (one job per call, completing the previous) without and with a queue
    // purging the million completed jobs beside it, on its own connection.
    let quiet = try await claimLatencies(store, claims: 3_000)
    let prunerStore = try await openStore(kept)
    let purger = try JobQueue<PostgresBenchItem>(
      configuration: JobQueueConfiguration(identifier: "bench", autoStart: false), store: prunerStore
    ) { _, _ in .handled }
    let pruning = Task { () async throws -> (Int, Double) in
      let start = ContinuousClock.now
      let deleted = try await purger.purge(.completed)
      return (deleted, seconds(since: start))
    }
    let busy = try await claimLatencies(store, claims: 3_000)
    let (pruned, pruneTime) = try await pruning.value
    printPruningLatencies(quiet: quiet, busy: busy, pruned: pruned, seconds: pruneTime)
    await prunerStore.close()
    await store.close()
  }

  // MARK: JobQueue

  func runQueueSection() async throws {
    section("JobQueue on PostgresJobStore, no-op handler (best of 3, runs interleaved)")
    var (queue, raw) = try await interleaved(repeats: 3) {
      try await queueDrain(drainOne, workers: 1, concurrency: 1, prefetch: 0)
    } baseline: {
      try rawDrain(drainOne, batch: 1, connections: 1)
    }
    Comparison(
      name: "JobQueue drain, 1 worker, concurrency 1", count: drainOne, seconds: queue,
      baselineName: "raw, 1 per txn, 1 conn", baselineSeconds: raw, goal: 0.7
    ).print()
    (queue, raw) = try await interleaved(repeats: 3) {
      try await queueDrain(drainOne, workers: 4, concurrency: 1, prefetch: 0)
    } baseline: {
      try rawDrain(drainOne, batch: 1, connections: 4)
    }
    Comparison(
      name: "JobQueue drain, 4 workers, concurrency 1", count: drainOne, seconds: queue,
      baselineName: "raw, 1 per txn, 4 conn", baselineSeconds: raw, goal: 0.7
    ).print()
    (queue, raw) = try await interleaved(repeats: 3) {
      try await queueDrain(drainBatched, workers: 4, concurrency: 4, prefetch: 96)
    } baseline: {
      try rawDrain(drainBatched, batch: 100, connections: 4)
    }
    Comparison(
      name: "JobQueue drain, 4 workers, c4, prefetch 96", count: drainBatched, seconds: queue,
      baselineName: "raw, 100 per txn, 4 conn", baselineSeconds: raw, goal: 0.5
    ).print()
  }

  /// Seconds for `workers` queues, each on a store of its own (as separate processes would be),
  /// to handle `count` jobs.
  func queueDrain(_ count: Int, workers: Int, concurrency: Int, prefetch: Int) async throws -> Double {
    let schema = newSchema("queue")
    defer { try? drop(schema) }
    let filler = try await openStore(schema)
    let payloads = try (0..<1_000).map {
      NewJob(payload: try JSONEncoder().encode(PostgresBenchItem(number: $0)), runAt: benchEpoch)
    }
    var left = count
    while left > 0 {
      _ = try await filler.enqueue(Array(payloads.prefix(left)), queue: "bench", clock: benchClock)
      left -= min(left, 1_000)
    }
    await filler.close()
    let counter = HandledCounter(target: count)
    var stores: [PostgresJobStore] = []
    var queues: [JobQueue<PostgresBenchItem>] = []
    for _ in 0..<workers {
      let store = try await openStore(schema)
      stores.append(store)
      let configuration = JobQueueConfiguration(
        identifier: "bench", concurrency: concurrency, prefetch: prefetch, autoStart: false)
      queues.append(
        try JobQueue<PostgresBenchItem>(configuration: configuration, store: store) { _, _ in
          counter.count()
          return .handled
        })
    }
    let start = ContinuousClock.now
    for queue in queues { queue.start() }
    for await _ in counter.stream { break }
    let elapsed = seconds(since: start)
    for queue in queues { await queue.shutdown(gracePeriod: .seconds(5)) }
    for store in stores { await store.close() }
    return elapsed
  }

  // MARK: 1M backlog

  func runBacklogSection() async throws {
    section("PostgreSQL store with 1,000,000 pending jobs")
    let total = 1_000_000
    let sample = 10_000
    let schema = newSchema("backlog")
    defer { try? drop(schema) }
    let store = try await openStore(schema)
    let admin = try RawConnection(url)
    let fill = try await seconds {
      // Through SQL, as a backlog builds up: the same rows the store's insert writes.
      try admin.exec(
        """
        INSERT INTO \(schema).jobs (queue, payload, status, priority, run_at, created_at)
        SELECT 'bench', convert_to('\(String(decoding: benchPayload, as: UTF8.self))', 'UTF8'), 'ready', 0,
          '2023-11-14 22:13:20+00', now()
        FROM generate_series(1, \(total))
        """)
      try admin.exec("VACUUM ANALYZE \(schema).jobs")
    }
    print(String(format: "filled %d jobs in %.1f s (one INSERT … SELECT, then VACUUM ANALYZE)", total, fill))
    var large = Double.infinity
    var small = Double.infinity
    for _ in 0..<3 {
      large = min(large, try await seconds { try await drainSample(store, sample) })
      let smallSchema = newSchema("small")
      let smallStore = try await openStore(smallSchema)
      try await self.fill(smallStore, count: sample)
      small = min(small, try await seconds { try await drainSample(smallStore, sample) })
      await smallStore.close()
      try drop(smallSchema)
    }
    var counts = JobCounts()
    let countTime = try await seconds { counts = try await store.counts(queue: "bench", clock: benchClock) }
    let wakeTime = try await seconds { _ = try await store.nextWake(queue: "bench", clock: benchClock) }
    let listTime = try await seconds {
      _ = try await store.jobs(queue: "bench", status: .pending, after: nil, limit: 100)
    }
    print(
      String(
        format: "with %d pending: counts() %.1f ms, nextWake() %.2f ms, first page of 100 pending %.2f ms",
        counts.unfinished, countTime * 1000, wakeTime * 1000, listTime * 1000))
    Comparison(
      name: "claim+complete 10k of 1M pending, 100 per call", count: sample, seconds: large,
      baselineName: "10k of 10k pending", baselineSeconds: small, goal: 0.8
    ).print()
    await store.close()
  }

  /// Claims and completes `count` jobs of `store`, 100 per call.
  func drainSample(_ store: PostgresJobStore, _ count: Int) async throws {
    let handled = try await drainPostgresStore(store, batch: 100, limit: count)
    guard handled == count else { throw BenchmarkFailure("drained \(handled) of \(count)") }
  }

  // MARK: Latency

  func runLatencySection() async throws {
    section("PostgreSQL enqueue-to-start latency of an idle worker (NOTIFY; polling every 10 s)")
    let schema = newSchema("latency")
    defer { try? drop(schema) }
    let workerStore = try await openStore(schema)
    let producer = try await openStore(schema)
    let started = Mutex<[Int: ContinuousClock.Instant]>([:])
    let (stream, continuation) = AsyncStream.makeStream(of: Int.self)
    let configuration = JobQueueConfiguration(identifier: "latency", pollInterval: .seconds(10))
    let queue = try JobQueue<PostgresBenchItem>(configuration: configuration, store: workerStore) { item, _ in
      let now = ContinuousClock.now
      started.withLock { $0[item.number] = now }
      continuation.yield(item.number)
      return .handled
    }
    var iterator = stream.makeAsyncIterator()
    // Warm up until the worker's listener hears enqueues (it starts with the queue's first wait).
    var warm = false
    for number in -50..<0 where !warm {
      try await Task.sleep(for: .milliseconds(200))
      _ = try await producer.enqueue(
        [NewJob(payload: try JSONEncoder().encode(PostgresBenchItem(number: number)))], queue: "latency",
        clock: benchClock)
      let begin = ContinuousClock.now
      _ = await iterator.next()
      warm = ContinuousClock.now - begin < .seconds(1)
    }
    var latencies: [Double] = []
    for number in 0..<200 {
      try await Task.sleep(for: .milliseconds(20))  // the worker is idle again, waiting
      let payload = try JSONEncoder().encode(PostgresBenchItem(number: number))
      let begin = ContinuousClock.now
      _ = try await producer.enqueue([NewJob(payload: payload)], queue: "latency", clock: benchClock)
      guard await iterator.next() == number, let start = started.withLock({ $0[number] }) else {
        throw BenchmarkFailure("job \(number) did not start")
      }
      latencies.append(
        Double((start - begin).components.attoseconds) / 1e15 + Double((start - begin).components.seconds)
          * 1000)
    }
    latencies.sort()
    let p50 = latencies[latencies.count / 2]
    let p99 = latencies[latencies.count * 99 / 100]
    print(
      String(
        format:
          "enqueue-to-start, %d jobs one at a time: p50 %.2f ms (goal < 5: %@), p99 %.2f ms (goal < 20: %@), "
          + "max %.2f ms", latencies.count, p50, p50 < 5 ? "met" : "MISSED", p99, p99 < 20 ? "met" : "MISSED",
        latencies.last!))
    await queue.shutdown(gracePeriod: .seconds(5))
    await workerStore.close()
    await producer.close()
  }
}

private struct PostgresBenchItem: Queueable { var number: Int }

/// Counts handled jobs and reports when `target` is reached.
private final class HandledCounter: Sendable {
  let handled = Atomic<Int>(0)
  let target: Int
  let done: AsyncStream<Void>.Continuation
  let stream: AsyncStream<Void>

  init(target: Int) {
    self.target = target
    (stream, done) = AsyncStream.makeStream(of: Void.self)
  }

  func count() {
    if handled.wrappingAdd(1, ordering: .relaxed).newValue == target { done.yield() }
  }
}

/// Claims and completes jobs, `batch` per call, completing each batch with the next claim, until
/// the queue is empty or `limit` jobs are done; returns how many.
private func drainPostgresStore(_ store: PostgresJobStore, batch size: Int, limit: Int = .max) async throws
  -> Int
{
  let lease = Lease(owner: "bench", duration: .seconds(3_600))
  var settlements: [JobSettlement] = []
  var handled = 0
  while handled < limit {
    let batch = try await store.settleAndClaim(
      settlements, queue: "bench", limit: min(size, limit - handled), lease: lease, clock: benchClock)
    guard batch.staleSettlements.isEmpty else { throw BenchmarkFailure("stale completions") }
    settlements = batch.claimed.map { JobSettlement(claim: $0.claim, action: .complete) }
    if batch.claimed.isEmpty { break }
    handled += batch.claimed.count
  }
  if !settlements.isEmpty {
    let final = try await store.settleAndClaim(
      settlements, queue: "bench", limit: 0, lease: lease, clock: benchClock)
    guard final.staleSettlements.isEmpty else { throw BenchmarkFailure("stale completions") }
  }
  return handled
}

/// The raw queues of one drain and what each thread got.
private final class ThreadResults: @unchecked Sendable {
  // Safe without a lock: thread `i` alone writes `results[i]`, before `group.leave()`; the
  // caller reads them after `group.wait()`. `queues` is only read.
  let queues: [RawQueue]
  var results: [Result<Int, any Error>?]
  init(_ queues: [RawQueue]) {
    self.queues = queues
    results = Array(repeating: nil, count: queues.count)
  }
}

/// Runs `body` on each queue on a thread of its own, all at once; returns the results in order.
private func onThreads(_ queues: [RawQueue], _ body: @escaping @Sendable (RawQueue) throws -> Int) throws
  -> [Int]
{
  let box = ThreadResults(queues)
  let group = DispatchGroup()
  for index in queues.indices {
    group.enter()
    let thread = Thread {
      box.results[index] = Result { try body(box.queues[index]) }
      group.leave()
    }
    thread.start()
  }
  group.wait()
  return try box.results.map { try $0!.get() }
}

// MARK: - Raw baseline

/// One libpq connection with the few calls the baseline needs; parameters and results in binary.
private final class RawConnection {
  let handle: OpaquePointer

  init(_ url: String) throws {
    guard let handle = PQconnectdb(url), PQstatus(handle) == CONNECTION_OK else {
      throw BenchmarkFailure("cannot connect to the benchmark server")
    }
    self.handle = handle
    try exec("SET client_min_messages = warning")  // no NOTICE for each dropped schema
  }

  deinit { PQfinish(handle) }

  var error: String { String(cString: PQerrorMessage(handle)) }

  /// Runs a script without parameters.
  func exec(_ sql: String) throws {
    let result = PQexec(handle, sql)
    defer { PQclear(result) }
    let status = PQresultStatus(result)
    guard status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK else { throw BenchmarkFailure(error) }
  }

  /// The first column of the first row of `sql`, as text.
  func text(_ sql: String) throws -> String {
    let result = PQexec(handle, sql)
    defer { PQclear(result) }
    guard PQresultStatus(result) == PGRES_TUPLES_OK, PQntuples(result) > 0 else {
      throw BenchmarkFailure(error)
    }
    return String(cString: PQgetvalue(result, 0, 0))
  }

  func prepare(_ name: String, _ sql: String) throws {
    let result = PQprepare(handle, name, sql, 0, nil)
    defer { PQclear(result) }
    guard PQresultStatus(result) == PGRES_COMMAND_OK else { throw BenchmarkFailure("\(name): \(error)") }
  }

  /// Sends a prepared statement with binary parameters (nil is NULL) without waiting.
  func send(_ name: String, _ parameters: [[UInt8]?]) throws {
    let sent = withParameters(parameters) { values, lengths, formats in
      PQsendQueryPrepared(handle, name, Int32(parameters.count), values, lengths, formats, 1)
    }
    guard sent == 1 else { throw BenchmarkFailure("send \(name): \(error)") }
  }

  /// Whether raw connections wait for answers by polling the socket, yielding the processor,
  /// instead of sleeping in libpq (`CONVEYOR_BENCH_PG_RAW_WAIT=spin`): a baseline that keeps its
  /// processor awake, as the store's lone caller does while it waits for its answer.
  static let spins = ProcessInfo.processInfo.environment["CONVEYOR_BENCH_PG_RAW_WAIT"] == "spin"

  /// With ``spins``, polls until libpq has a whole result to return (`PQgetResult` then does
  /// not sleep); without, returns at once.
  func awaitResult() {
    guard Self.spins else { return }
    while PQisBusy(handle) == 1 {
      guard PQconsumeInput(handle) == 1 else { return }
      if PQisBusy(handle) == 1 { sched_yield() }
    }
  }

  /// `PQgetResult`, after ``awaitResult()``.
  func nextResult() -> OpaquePointer? {
    awaitResult()
    return PQgetResult(handle)
  }

  /// Runs a prepared statement and returns its result (freed by the caller with PQclear).
  func run(_ name: String, _ parameters: [[UInt8]?]) throws -> OpaquePointer {
    let result: OpaquePointer?
    if Self.spins {
      try send(name, parameters)
      result = nextResult()
      while let extra = nextResult() { PQclear(extra) }
    } else {
      result = withParameters(parameters) { values, lengths, formats in
        PQexecPrepared(handle, name, Int32(parameters.count), values, lengths, formats, 1)
      }
    }
    guard let result else { throw BenchmarkFailure("\(name): \(error)") }
    let status = PQresultStatus(result)
    guard status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK else {
      PQclear(result)
      throw BenchmarkFailure("\(name): \(error)")
    }
    return result
  }

  private func withParameters<R>(
    _ parameters: [[UInt8]?],
    _ body: (UnsafePointer<UnsafePointer<CChar>?>, UnsafePointer<Int32>, UnsafePointer<Int32>) -> R
  ) -> R {
    let lengths = parameters.map { Int32($0?.count ?? 0) }
    let formats = [Int32](repeating: 1, count: parameters.count)
    // One buffer for every value; NULLs stay NULL pointers.
    let joined = parameters.reduce(into: [UInt8]()) { $0 += $1 ?? [] } + [0]
    return joined.withUnsafeBufferPointer { buffer in
      buffer.baseAddress!.withMemoryRebound(to: CChar.self, capacity: buffer.count) { base in
        var offset = 0
        let pointers: [UnsafePointer<CChar>?] = parameters.map { value in
          guard let value else { return nil }
          defer { offset += value.count }
          return base + offset
        }
        return pointers.withUnsafeBufferPointer { values in
          body(values.baseAddress!, lengths, formats)
        }
      }
    }
  }
}

/// The baseline queue: a table with the columns an at-least-once queue needs, a partial index of
/// ready jobs in claim order, and indexes for lease expiry and deduplication (as the store keeps).
/// Claims are `FOR UPDATE SKIP LOCKED` with a fencing token; completions delete only the current
/// claim. Each drain transaction (BEGIN, the previous batch's completion, the next claim, COMMIT) is
/// sent pipelined: one round trip. Inserts are one prepared statement per transaction.
private final class RawQueue {
  let connection: RawConnection

  init(url: String, schema: String, create: Bool) throws {
    connection = try RawConnection(url)
    if create {
      try connection.exec(
        """
        CREATE SCHEMA \(schema);
        CREATE TABLE \(schema).jobs (
          id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, queue text NOT NULL, payload bytea NOT NULL,
          status text NOT NULL, priority bigint NOT NULL DEFAULT 0, attempts bigint NOT NULL DEFAULT 0,
          run_at timestamptz NOT NULL, created_at timestamptz NOT NULL, dedup_key bytea, lease_owner text,
          lease_expires_at timestamptz, claim_token bigint NOT NULL DEFAULT 0, finished_at timestamptz);
        CREATE INDEX ON \(schema).jobs (queue, priority DESC, run_at, id) WHERE status = 'ready';
        CREATE INDEX ON \(schema).jobs (queue, lease_expires_at) WHERE status = 'running';
        CREATE INDEX ON \(schema).jobs (queue, dedup_key) WHERE dedup_key IS NOT NULL AND status = 'ready';
        """)
    }
    try connection.prepare(
      "insert",
      """
      INSERT INTO \(schema).jobs (queue, payload, status, priority, run_at, created_at)
      VALUES ($1, $2, 'ready', 0, $3, now()) RETURNING id
      """)
    // The same insert with the wake-up the store must send with every add (`NOTIFY` on the
    // queue's channel, delivered at commit): the work the store's contract asks for.
    try connection.prepare(
      "insert_notify",
      """
      WITH i AS (
        INSERT INTO \(schema).jobs (queue, payload, status, priority, run_at, created_at)
        VALUES ($1, $2, 'ready', 0, $3, now()) RETURNING id)
      SELECT i.id, pg_notify('\(schema).jobs', $1) FROM i
      """)
    try connection.prepare(
      "insert_many",
      """
      INSERT INTO \(schema).jobs (queue, payload, status, priority, run_at, created_at)
      SELECT $1, p, 'ready', 0, $3, now() FROM unnest($2::bytea[]) AS p RETURNING id
      """)
    try connection.prepare("begin", "BEGIN")
    try connection.prepare("commit", "COMMIT")
    try connection.prepare(
      "complete",
      """
      UPDATE \(schema).jobs j SET status = 'completed', finished_at = now(), lease_owner = NULL,
        lease_expires_at = NULL
      FROM unnest($1::int8[], $2::int8[]) AS s(id, token)
      WHERE j.id = s.id AND j.claim_token = s.token AND j.status = 'running'
      """)
    try connection.prepare(
      "claim",
      """
      WITH picked AS MATERIALIZED (
        SELECT id FROM \(schema).jobs WHERE queue = $1 AND status = 'ready'
        ORDER BY priority DESC, run_at, id LIMIT $2 FOR UPDATE SKIP LOCKED)
      UPDATE \(schema).jobs j SET status = 'running', attempts = j.attempts + 1,
        claim_token = j.claim_token + 1, lease_owner = $3, lease_expires_at = now() + interval '1 hour'
      FROM picked WHERE j.id = picked.id
      RETURNING j.id, j.payload, j.attempts, j.claim_token
      """)
  }

  static func int64(_ value: Int64) -> [UInt8] { withUnsafeBytes(of: value.bigEndian) { Array($0) } }
  static func int32(_ value: Int32) -> [UInt8] { withUnsafeBytes(of: value.bigEndian) { Array($0) } }
  static let epoch = int64((Int64(benchEpoch.timeIntervalSince1970) - 946_684_800) * 1_000_000)

  /// A binary one-dimensional array of int8 (OID 20) or bytea (OID 17) elements.
  static func array(_ oid: Int32, _ elements: [[UInt8]]) -> [UInt8] {
    var bytes = int32(1) + int32(0) + int32(oid) + int32(Int32(elements.count)) + int32(1)
    for element in elements { bytes += int32(Int32(element.count)) + element }
    return bytes
  }

  func insert(count: Int, perTransaction: Int, notify: Bool = false) throws {
    let queue = Array("bench".utf8)
    let payload = Array(benchPayload)
    var done = 0
    while done < count {
      let now = min(perTransaction, count - done)
      if now == 1 {
        PQclear(try connection.run(notify ? "insert_notify" : "insert", [queue, payload, Self.epoch]))
      } else {
        let payloads = Self.array(17, Array(repeating: payload, count: now))
        PQclear(try connection.run("insert_many", [queue, payloads, Self.epoch]))
      }
      done += now
    }
  }

  /// Claims `batch` jobs per transaction, completing the previous batch in the same transaction,
  /// until none is left; returns how many it handled.
  func drain(batch: Int) throws -> Int {
    let handle = connection.handle
    guard PQenterPipelineMode(handle) == 1 else { throw BenchmarkFailure("pipeline mode") }
    defer { PQexitPipelineMode(handle) }
    let queue = Array("bench".utf8)
    let owner = Array("raw".utf8)
    let limit = Self.int64(Int64(batch))
    var previous: [(id: Int64, token: Int64)] = []
    var handled = 0
    while true {
      try connection.send("begin", [])
      if !previous.isEmpty {
        try connection.send(
          "complete",
          [
            Self.array(20, previous.map { Self.int64($0.id) }),
            Self.array(20, previous.map { Self.int64($0.token) }),
          ])
      }
      try connection.send("claim", [queue, limit, owner])
      try connection.send("commit", [])
      guard PQpipelineSync(handle) == 1 else { throw BenchmarkFailure("sync: \(connection.error)") }
      // The results, in order: BEGIN, [the completion], the claim, COMMIT, then the sync.
      let statements = previous.isEmpty ? 3 : 4
      var claimed: [(id: Int64, token: Int64)] = []
      for index in 0..<statements {
        while let result = connection.nextResult() {
          defer { PQclear(result) }
          let status = PQresultStatus(result)
          guard status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK else {
            throw BenchmarkFailure("drain: \(String(cString: PQresultErrorMessage(result)))")
          }
          if index == 1 && !previous.isEmpty {
            guard Int(String(cString: PQcmdTuples(result))) == previous.count else {
              throw BenchmarkFailure("stale completion")
            }
          }
          if index == statements - 2 {
            for row in 0..<PQntuples(result) {
              let id = Self.read(result, row, 0)
              _ = Data(bytes: PQgetvalue(result, row, 1), count: Int(PQgetlength(result, row, 1)))
              _ = Self.read(result, row, 2)
              claimed.append((id, Self.read(result, row, 3)))
            }
          }
        }
      }
      guard let sync = connection.nextResult(), PQresultStatus(sync) == PGRES_PIPELINE_SYNC else {
        throw BenchmarkFailure("no pipeline sync")
      }
      PQclear(sync)
      handled += claimed.count
      previous = claimed
      if claimed.isEmpty { return handled }
    }
  }

  static func read(_ result: OpaquePointer, _ row: Int32, _ column: Int32) -> Int64 {
    var value: Int64 = 0
    withUnsafeMutableBytes(of: &value) {
      $0.copyMemory(from: UnsafeRawBufferPointer(start: PQgetvalue(result, row, column), count: 8))
    }
    return Int64(bigEndian: value)
  }
}
