import CSQLiteBench
import Conveyor
import ConveyorSQLite
import Foundation
import Synchronization

// SQLite store benchmarks: every store figure is compared with a raw sqlite3 baseline doing the
// same work with the fastest correct at-least-once pattern, measured in the same run.

/// Runs the SQLite benchmarks.
func runSQLiteBenchmarks() async throws {
  let folder = FileManager.default.temporaryDirectory
    .appendingPathComponent("conveyor-sqlite-bench-\(UUID().uuidString)", isDirectory: true)
  try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
  // Every store and connection is closed when `run` returns, before the folder goes.
  defer { removeBenchmarkFolder(folder) }
  try await runSQLiteBenchmarks(in: folder)
}

private func runSQLiteBenchmarks(in folder: URL) async throws {
  var fileNumber = 0
  func newPath() -> String {
    fileNumber += 1
    return folder.appendingPathComponent("bench-\(fileNumber).sqlite").path
  }

  // CONVEYOR_BENCH_SQLITE=engine runs only the JobQueue section, percall only the one-job-per-call
  // section, full only the one-per-call rows at synchronous=FULL; raw-drain, store-drain,
  // raw-insert, store-insert or hop (one cheap store call) run one loop alone, for a profiler.
  if let only = ProcessInfo.processInfo.environment["CONVEYOR_BENCH_SQLITE"] {
    if only == "engine" || only == "engine-c4" || only == "engine-c1" {
      return try await runEngineBenchmarks(newPath: newPath)
    }
    if only == "percall" {
      try await compareStoreWithRaw(.normal, batches: [1], newPath: newPath)
      try await runEngineBenchmarks(newPath: newPath)
      return try await runOneJobPerCallBenchmarks(newPath: newPath)
    }
    if only == "full" {
      return try await compareStoreWithRaw(.full, batches: [1], newPath: newPath)
    }
    if only == "store-insert" || only == "raw-insert" {
      // CONVEYOR_BENCH_SYNC=full runs them at synchronous=FULL (fewer jobs: each commit syncs).
      let full = ProcessInfo.processInfo.environment["CONVEYOR_BENCH_SYNC"] == "full"
      let count = full ? 4_000 : 20_000
      for _ in 0..<3 {
        let time =
          only == "raw-insert"
          ? try await rawInsert(newPath(), full ? "FULL" : "NORMAL", count, batch: 1)
          : try await storeInsert(newPath(), full ? .full : .normal, count, batch: 1)
        print(String(format: "%@: %.0f/s", only, Double(count) / time))
      }
      return
    }
    if only == "eight" || only == "one" {
      return try await runConcurrentInserts(tasks: only == "eight" ? 8 : 1, newPath: newPath)
    }
    if only == "hop" {
      let store = try SQLiteJobStore(path: newPath())
      for _ in 0..<3 {
        let start = ContinuousClock.now
        for _ in 0..<20_000 { _ = try await store.isPaused(queue: "bench") }
        print(String(format: "isPaused round trip: %.1f us", seconds(since: start) / 20_000 * 1e6))
      }
      return
    }
    let time =
      only == "raw-drain"
      ? try await rawDrain(newPath(), "NORMAL", 5_000, batch: 1)
      : try await storeDrain(newPath(), .normal, 5_000, batch: 1)
    print(String(format: "%@: %.0f/s", only, 5_000 / time))
    return
  }

  // First, while the process is small, so its peak memory is the large queue's.
  try await runLargeQueueBenchmark(path: newPath(), smallPath: newPath())

  for synchronous in [SQLiteJobStore.Synchronous.normal, .full] {
    try await compareStoreWithRaw(synchronous, batches: [1, 100], newPath: newPath)
  }

  try await runEngineBenchmarks(newPath: newPath)
  try await runOneJobPerCallBenchmarks(newPath: newPath)
}

/// Three runs of `tasks` tasks adding one job per call (CONVEYOR_BENCH_SQLITE=eight or one), for
/// a profiler.
private func runConcurrentInserts(tasks: Int, newPath: () -> String) async throws {
  for _ in 0..<3 {
    let time = try await concurrentInsert(path: newPath(), tasks: tasks, count: 16_000)
    print(String(format: "%d tasks: %.0f/s", tasks, 16_000 / time))
  }
}

/// Seconds for `tasks` tasks, each enqueueing one job per call, to enqueue `count` jobs together
/// into a new store at `path`.
private func concurrentInsert(path: String, tasks: Int, count: Int) async throws -> Double {
  let job = [NewJob(payload: benchPayload, runAt: benchEpoch)]
  let store = try SQLiteJobStore(path: path)
  _ = try await store.enqueue(job, queue: "bench", clock: benchClock)  // the queue's row
  let start = ContinuousClock.now
  try await withThrowingTaskGroup(of: Void.self) { group in
    for _ in 0..<tasks {
      group.addTask {
        for _ in 0..<(count / tasks) { _ = try await store.enqueue(job, queue: "bench", clock: benchClock) }
      }
    }
    try await group.waitForAll()
  }
  let elapsed = seconds(since: start)
  let stored = try await store.counts(queue: "bench", clock: benchClock).ready
  guard stored == count + 1 else { throw BenchmarkFailure("\(stored) jobs stored, expected \(count + 1)") }
  await store.close()
  return elapsed
}

/// One job per call, as a user's first code does it: concurrent adders (group commit), `add`
/// through `JobQueue`, and how soon an idle worker starts a job that was just added.
private func runOneJobPerCallBenchmarks(newPath: () -> String) async throws {
  section("One job per call (synchronous=NORMAL)")
  let count = 16_000
  let (eight, one) = try await interleaved {
    try await concurrentInsert(path: newPath(), tasks: 8, count: count)
  } baseline: {
    try await concurrentInsert(path: newPath(), tasks: 1, count: count)
  }
  Comparison(
    name: "store enqueue, 1 per call, 8 tasks", count: count, seconds: eight,
    baselineName: "store enqueue, 1 per call, 1 task", baselineSeconds: one, goal: 2.0
  ).print()

  /// Seconds for `JobQueue.add` to add `count` items, one per call.
  func queueAdd() async throws -> Double {
    let store = try SQLiteJobStore(path: newPath())
    let configuration = JobQueueConfiguration(identifier: "bench", autoStart: false)
    let queue = try JobQueue<BenchItem>(configuration: configuration, store: store) { _, _ in .handled }
    let item = BenchItem(url: "https://example.com/hook", attempt: 1, body: "hello, world")
    let start = ContinuousClock.now
    for _ in 0..<count { try await queue.add(item) }
    let elapsed = seconds(since: start)
    await queue.shutdown()
    await store.close()
    return elapsed
  }
  let (added, raw) = try await interleaved {
    try await queueAdd()
  } baseline: {
    try await rawInsert(newPath(), "NORMAL", count, batch: 1)
  }
  Comparison(
    name: "JobQueue.add, 1 per call (encodes JSON)", count: count, seconds: added,
    baselineName: "raw insert, 1 per transaction", baselineSeconds: raw, goal: nil
  ).print()

  try await enqueueToStartLatency(path: newPath())
}

/// Prints the time from calling `add` until the handler of an idle worker (default
/// configuration) starts on the job: p50 and p99 of 2,000 jobs added one at a time, each after
/// the previous one was handled and the worker went idle.
private func enqueueToStartLatency(path: String) async throws {
  let samples = 2_000
  let store = try SQLiteJobStore(path: path)
  let added = Mutex(ContinuousClock.now)
  let latencies = Mutex<[Duration]>([])
  let (started, startedContinuation) = AsyncStream.makeStream(of: Void.self)
  let queue = try JobQueue<BenchItem>(configuration: .init(identifier: "bench"), store: store) { _, _ in
    let now = ContinuousClock.now
    latencies.withLock { $0.append(now - added.withLock { $0 }) }
    startedContinuation.yield()
    return .handled
  }
  var iterator = started.makeAsyncIterator()
  let item = BenchItem(url: "https://example.com/hook", attempt: 1, body: "hello, world")
  for _ in 0..<samples {
    // Idle: the worker finished the previous job and the loop went back to waiting.
    try await Task.sleep(for: .milliseconds(2))
    added.withLock { $0 = ContinuousClock.now }
    try await queue.add(item)
    await iterator.next()
  }
  await queue.shutdown()
  await store.close()
  let sorted = latencies.withLock { $0 }.sorted()
  func microseconds(_ percentile: Double) -> Double {
    let value = sorted[min(sorted.count - 1, Int(Double(sorted.count) * percentile))]
    return Double(value.components.seconds) * 1e6 + Double(value.components.attoseconds) / 1e12
  }
  let p50 = microseconds(0.5)
  print(
    String(
      format: "enqueue-to-start latency, idle worker (default configuration), %d jobs: p50 %.0f us, "
        + "p99 %.0f us (goal p50 < 1 ms: %@)", sorted.count, p50, microseconds(0.99),
      p50 < 1_000 ? "met" : "MISSED"))
}

/// The store against the raw baseline: enqueue, and claim + complete, `batch` jobs per call for
/// each of `batches`.
private func compareStoreWithRaw(
  _ synchronous: SQLiteJobStore.Synchronous, batches: [Int], newPath: () -> String
) async throws {
  let mode = synchronous.rawValue
  section("SQLite store vs raw sqlite3, synchronous=\(mode) (best of 5, runs interleaved)")
  for batch in batches {
    let count = (synchronous == .normal ? 20_000 : 2_000) * (batch == 1 ? 1 : 5)
    // Enqueue, `batch` jobs per transaction.
    var (store, raw) = try await interleaved {
      try await storeInsert(newPath(), synchronous, count, batch: batch)
    } baseline: {
      try await rawInsert(newPath(), mode, count, batch: batch)
    }
    Comparison(
      name: "store enqueue, \(batch) per call (\(mode))", count: count, seconds: store,
      baselineName: "raw insert, \(batch) per transaction", baselineSeconds: raw, goal: batch == 1 ? 0.8 : 0.5
    ).print()

    // Claim and complete, `batch` jobs per transaction (completing the previous, claiming the next).
    (store, raw) = try await interleaved {
      try await storeDrain(newPath(), synchronous, count, batch: batch)
    } baseline: {
      try await rawDrain(newPath(), mode, count, batch: batch)
    }
    Comparison(
      name: "store claim+complete, \(batch) per call (\(mode))", count: count, seconds: store,
      baselineName: "raw claim+complete, \(batch) per txn", baselineSeconds: raw, goal: batch == 1 ? nil : 0.5
    ).print()
  }
}

/// Seconds to insert `count` jobs through the raw API, `batch` per transaction.
private func rawInsert(_ path: String, _ synchronous: String, _ count: Int, batch: Int) async throws -> Double
{
  let raw = try await RawQueue.open(path: path, synchronous: synchronous)
  let start = ContinuousClock.now
  try raw.insert(count: count, perTransaction: batch)
  return seconds(since: start)
}

/// Seconds to enqueue `count` jobs through the store, `batch` per call.
private func storeInsert(_ path: String, _ synchronous: SQLiteJobStore.Synchronous, _ count: Int, batch: Int)
  async throws -> Double
{
  let store = try SQLiteJobStore(path: path, options: .init(synchronous: synchronous))
  let jobs = Array(repeating: NewJob(payload: benchPayload, runAt: benchEpoch), count: batch)
  let start = ContinuousClock.now
  for _ in 0..<(count / batch) { _ = try await store.enqueue(jobs, queue: "bench", clock: benchClock) }
  return seconds(since: start)
}

/// Seconds to claim and complete `count` jobs through the raw API, `batch` per transaction.
private func rawDrain(_ path: String, _ synchronous: String, _ count: Int, batch: Int) async throws -> Double
{
  let raw = try await RawQueue.open(path: path, synchronous: synchronous)
  try raw.insert(count: count, perTransaction: 1_000)
  let start = ContinuousClock.now
  try raw.drain(batch: batch, expected: count)
  return seconds(since: start)
}

/// Seconds to claim and complete `count` jobs through the store, `batch` per call.
private func storeDrain(_ path: String, _ synchronous: SQLiteJobStore.Synchronous, _ count: Int, batch: Int)
  async throws -> Double
{
  let store = try await filledStore(path, synchronous: synchronous, count: count)
  let start = ContinuousClock.now
  try await drainStore(store, batch: batch, expected: count)
  return seconds(since: start)
}

/// The item the engine benchmarks drain.
struct BenchItem: Queueable {
  var url: String
  var attempt: Int
  var body: String
}

/// Counts handled jobs and reports when a sample is done.
private final class SampleCounter: Sendable {
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

/// Seconds for a `JobQueue` worker (concurrency 4, prefetch 96, no-op handler) to handle `sample`
/// jobs of `store`, whatever else it holds; the queue is shut down afterwards.
private func queueDrainSample(_ store: SQLiteJobStore, sample: Int) async throws -> Double {
  let counter = SampleCounter(target: sample)
  let configuration = JobQueueConfiguration(
    identifier: "bench", concurrency: 4, prefetch: 96, autoStart: false)
  let queue = try JobQueue<BenchItem>(configuration: configuration, store: store) { _, _ in
    counter.count()
    return .handled
  }
  let start = ContinuousClock.now
  queue.start()
  for await _ in counter.stream { break }
  let elapsed = seconds(since: start)
  await queue.shutdown(gracePeriod: .seconds(5))
  return elapsed
}

/// `JobQueue` on `SQLiteJobStore` with a no-op handler, against the raw loops.
private func runEngineBenchmarks(newPath: () -> String) async throws {
  section("JobQueue on SQLiteJobStore (no-op handler, synchronous=NORMAL)")
  let count = 20_000

  /// Seconds for a `JobQueue` with a no-op handler to drain `count` jobs.
  func drainQueue(concurrency: Int, prefetch: Int, claimsAhead: Bool = false) async throws -> Double {
    let store = try SQLiteJobStore(path: newPath())
    let payloads = try (0..<1_000).map {
      NewJob(
        payload: try JSONEncoder().encode(
          BenchItem(url: "https://example.com/\($0)", attempt: 1, body: "hi")),
        runAt: benchEpoch)
    }
    for _ in 0..<(count / 1_000) { _ = try await store.enqueue(payloads, queue: "bench", clock: benchClock) }
    let configuration = JobQueueConfiguration(
      identifier: "bench", concurrency: concurrency, prefetch: prefetch, claimsAhead: claimsAhead,
      autoStart: false)
    let queue = try JobQueue<BenchItem>(configuration: configuration, store: store) { _, _ in .handled }
    let start = ContinuousClock.now
    queue.start()
    await queue.waitUntilFinished()
    let elapsed = seconds(since: start)
    await queue.shutdown(gracePeriod: .seconds(5))
    let left = try await store.counts(queue: "bench", clock: benchClock).unfinished
    guard left == 0 else { throw BenchmarkFailure("\(left) jobs left") }
    return elapsed
  }

  // CONVEYOR_BENCH_SQLITE=engine-c4 (or engine-c1): only the drain at concurrency 4 (or 1), for a
  // profiler.
  let only = ProcessInfo.processInfo.environment["CONVEYOR_BENCH_SQLITE"]
  if only == "engine-c4" || only == "engine-c1" {
    let concurrency = only == "engine-c4" ? 4 : 1
    for _ in 0..<3 {
      let time = try await drainQueue(concurrency: concurrency, prefetch: 0)
      print(String(format: "concurrency %d: %.0f/s", concurrency, Double(count) / time))
    }
    return
  }
  let (one, rawOne) = try await interleaved {
    try await drainQueue(concurrency: 1, prefetch: 0)
  } baseline: {
    try await rawDrain(newPath(), "NORMAL", count, batch: 1)
  }
  Comparison(
    name: "JobQueue drain, concurrency 1", count: count, seconds: one,
    baselineName: "raw claim+complete, 1 per txn", baselineSeconds: rawOne, goal: 0.7
  ).print()
  // Claiming ahead is opt-in (it gives up deduplication, clear() and an attempt for the job it
  // holds): what it buys, against the default in the same run.
  let (ahead, oneDefault) = try await interleaved {
    try await drainQueue(concurrency: 1, prefetch: 0, claimsAhead: true)
  } baseline: {
    try await drainQueue(concurrency: 1, prefetch: 0)
  }
  Comparison(
    name: "JobQueue drain, concurrency 1, claimsAhead true", count: count, seconds: ahead,
    baselineName: "the same by default (claimsAhead false)", baselineSeconds: oneDefault, goal: nil
  ).print()
  let (onePrefetched, rawOneAgain) = try await interleaved {
    try await drainQueue(concurrency: 1, prefetch: 1)
  } baseline: {
    try await rawDrain(newPath(), "NORMAL", count, batch: 1)
  }
  Comparison(
    name: "JobQueue drain, concurrency 1, prefetch 1", count: count, seconds: onePrefetched,
    baselineName: "raw claim+complete, 1 per txn", baselineSeconds: rawOneAgain, goal: nil
  ).print()
  let (four, oneAgain) = try await interleaved {
    try await drainQueue(concurrency: 4, prefetch: 0)
  } baseline: {
    try await drainQueue(concurrency: 1, prefetch: 0)
  }
  Comparison(
    name: "JobQueue drain, concurrency 4", count: count, seconds: four,
    baselineName: "JobQueue drain, concurrency 1", baselineSeconds: oneAgain, goal: 1.0
  ).print()
  let (batched, rawBatch) = try await interleaved {
    try await drainQueue(concurrency: 4, prefetch: 96)
  } baseline: {
    try await rawDrain(newPath(), "NORMAL", count, batch: 100)
  }
  Comparison(
    name: "JobQueue drain, concurrency 4, prefetch 96", count: count, seconds: batched,
    baselineName: "raw claim+complete, 100 per txn", baselineSeconds: rawBatch, goal: 0.5
  ).print()
}

/// Peak memory and drain speed with 1,000,000 pending jobs, against the same drain at 10,000.
private func runLargeQueueBenchmark(path: String, smallPath: String) async throws {
  section("SQLite store with 1,000,000 pending jobs")
  let total = 1_000_000
  let sample = 10_000
  let store = try SQLiteJobStore(path: path)
  let jobs = Array(repeating: NewJob(payload: benchPayload, runAt: benchEpoch), count: 1_000)
  let fill = try await seconds {
    for _ in 0..<(total / 1_000) { _ = try await store.enqueue(jobs, queue: "bench", clock: benchClock) }
  }
  print(String(format: "filled %d jobs in %.1f s (%.0f/s, 1000 per call)", total, fill, Double(total) / fill))
  let fillPeak = peakMemoryKB()
  resetPeakMemory()
  // Three samples of 10k from the 1M queue, against three fresh 10k queues; best of each. First
  // through the store's claim loop, then through a JobQueue worker.
  var largeDrain = Double.infinity
  var smallDrain = Double.infinity
  var largeQueueDrain = Double.infinity
  var smallQueueDrain = Double.infinity
  for round in 0..<3 {
    largeDrain = min(
      largeDrain, try await seconds { try await drainStore(store, batch: 100, expected: sample) })
    let small = try await filledStore(smallPath + "-\(round)", synchronous: .normal, count: sample)
    smallDrain = min(
      smallDrain, try await seconds { try await drainStore(small, batch: 100, expected: sample) })
    largeQueueDrain = min(largeQueueDrain, try await queueDrainSample(store, sample: sample))
    let smallForQueue = try await filledStore(smallPath + "-q\(round)", synchronous: .normal, count: sample)
    smallQueueDrain = min(smallQueueDrain, try await queueDrainSample(smallForQueue, sample: sample))
  }
  var counts = JobCounts()
  let countTime = try await seconds { counts = try await store.counts(queue: "bench", clock: benchClock) }
  let wakeTime = try await seconds { _ = try await store.nextWake(queue: "bench", clock: benchClock) }
  print(
    String(
      format: "with %d pending: counts() %.1f ms, nextWake() %.2f ms", counts.unfinished,
      countTime * 1000, wakeTime * 1000))
  var listed = 0
  var after: JobID?
  while listed < 50_000 {
    let page = try await store.jobs(queue: "bench", status: .pending, after: after, limit: 1_000)
    guard let last = page.last else { break }
    listed += page.count
    after = last.id
  }
  let peak = peakMemoryKB()
  Comparison(
    name: "drain 10k of 1M pending, 100 per call", count: sample, seconds: largeDrain,
    baselineName: "drain 10k of 10k pending", baselineSeconds: smallDrain, goal: 0.8
  ).print()
  Comparison(
    name: "JobQueue drain 10k of 1M pending (c4, p96)", count: sample, seconds: largeQueueDrain,
    baselineName: "JobQueue drain 10k of 10k pending", baselineSeconds: smallQueueDrain, goal: 0.8
  ).print()
  print(
    String(
      format: "peak RSS (VmHWM) with 1M pending while draining 60k, counting, listing %d: %.1f MB "
        + "(goal < 64 MB: %@; peak while filling: %.1f MB); %d left",
      listed, Double(peak) / 1024, peak < 64 * 1024 ? "met" : "MISSED", Double(fillPeak) / 1024,
      counts.unfinished))
}

let benchEpoch = Date(timeIntervalSince1970: 1_700_000_000)
/// The store calls' clock: the system clock (every benchmark job's run date, `benchEpoch`, is past).
let benchClock = SystemJobClock()
/// A small JSON-like payload, typical of a queued request.
let benchPayload = Data(#"{"url":"https://example.com/hook","attempt":1,"body":"hello, world"}"#.utf8)

private func filledStore(_ path: String, synchronous: SQLiteJobStore.Synchronous, count: Int) async throws
  -> SQLiteJobStore
{
  let store = try SQLiteJobStore(path: path, options: .init(synchronous: synchronous))
  let jobs = Array(repeating: NewJob(payload: benchPayload, runAt: benchEpoch), count: 1_000)
  var left = count
  while left > 0 {
    _ = try await store.enqueue(Array(jobs.prefix(left)), queue: "bench", clock: benchClock)
    left -= min(left, 1_000)
  }
  return store
}

/// Claims and completes `expected` jobs, `batch` per call, completing each batch with the next claim.
private func drainStore(_ store: SQLiteJobStore, batch: Int, expected: Int) async throws {
  let lease = Lease(owner: "bench", duration: .seconds(3_600))
  var settlements: [JobSettlement] = []
  var handled = 0
  while handled < expected {
    let claimed = try await store.settleAndClaim(
      settlements, queue: "bench", limit: batch, lease: lease, clock: benchClock
    ).claimed
    if claimed.isEmpty { break }
    handled += claimed.count
    settlements = claimed.map { JobSettlement(claim: $0.claim, action: .complete) }
  }
  _ = try await store.settleAndClaim(settlements, queue: "bench", limit: 0, lease: lease, clock: benchClock)
  guard handled == expected else { throw BenchmarkFailure("drained \(handled) of \(expected)") }
}

struct BenchmarkFailure: Error, CustomStringConvertible {
  var description: String
  init(_ description: String) { self.description = description }
}

/// Runs `sql` on the Conveyor database at `path` (made by the store if missing) with the raw API.
func execOnSQLiteFile(_ path: String, _ sql: String) async throws {
  let raw = try await RawQueue.open(path: path, synchronous: "NORMAL")
  try raw.exec(sql)
}

/// Removes the folder; a queue shutting down may still be closing its store, so try twice.
private func removeBenchmarkFolder(_ folder: URL) {
  for attempt in 1...2 {
    do {
      try FileManager.default.removeItem(at: folder)
      return
    } catch {
      if attempt == 2 { print("could not remove \(folder.path): \(error)") }
      Thread.sleep(forTimeInterval: 0.5)
    }
  }
}

/// Resets the kernel's peak-RSS counter (Linux: writing 5 to /proc/self/clear_refs).
private func resetPeakMemory() {
  #if os(Linux)
    do { try "5".write(toFile: "/proc/self/clear_refs", atomically: false, encoding: .utf8) } catch {
      print("could not reset VmHWM: \(error)")
    }
  #endif
}

/// Peak resident memory in KiB (VmHWM), or 0 where /proc is not available.
private func peakMemoryKB() -> Int {
  guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8) else { return 0 }
  for line in status.split(separator: "\n") where line.hasPrefix("VmHWM:") {
    return Int(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "") ?? 0
  }
  return 0
}

// MARK: - Raw baseline

/// The same schema and work through the sqlite3 C API with no wrapper, as a C program would do
/// it: the file is created by `SQLiteJobStore` (so the schema is exactly the store's, version 2),
/// then opened directly; statements are prepared once, strings and the payload are bound from
/// buffers that live as long as the connection (no copy, no allocation per call), and each
/// transaction does what the store guarantees and nothing more: an enqueue inserts a ready job
/// stamped with the current time; a claim transaction completes the previous batch (fenced by
/// claim token), checks the stored pause flag, promotes due scheduled jobs, selects the ready
/// jobs (`SELECT … LIMIT n`) with the columns a handler receives, and claims them by id.
private final class RawQueue {
  let db: OpaquePointer
  private var statements: [String: OpaquePointer] = [:]
  private let queueName = strdup("bench")!
  private let owner = strdup("raw")!
  private let payload: UnsafeMutableRawBufferPointer

  /// Creates the file through the store (its schema) and opens it with the raw API.
  static func open(path: String, synchronous: String) async throws -> RawQueue {
    let store = try SQLiteJobStore(path: path)
    await store.close()
    return try RawQueue(path: path, synchronous: synchronous)
  }

  private init(path: String, synchronous: String) throws {
    var handle: OpaquePointer?
    guard sqlite3_open(path, &handle) == SQLITE_OK, let handle else { throw BenchmarkFailure("open \(path)") }
    db = handle
    payload = .allocate(byteCount: benchPayload.count, alignment: 1)
    payload.copyBytes(from: benchPayload)
    try exec("PRAGMA journal_mode = WAL; PRAGMA synchronous = \(synchronous); PRAGMA busy_timeout = 5000")
    try exec("INSERT OR IGNORE INTO queues (name) VALUES ('bench')")
  }

  deinit {
    for statement in statements.values { sqlite3_finalize(statement) }
    sqlite3_close(db)
    free(queueName)
    free(owner)
    payload.deallocate()
  }

  func exec(_ sql: String) throws {
    guard sqlite3_exec(db, sql, nil, nil, nil) == SQLITE_OK else {
      throw BenchmarkFailure(String(cString: sqlite3_errmsg(db)))
    }
  }

  func statement(_ sql: String) throws -> OpaquePointer {
    if let statement = statements[sql] { return statement }
    var statement: OpaquePointer?
    guard sqlite3_prepare_v3(db, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &statement, nil) == SQLITE_OK,
      let statement
    else {
      throw BenchmarkFailure(String(cString: sqlite3_errmsg(db)))
    }
    statements[sql] = statement
    return statement
  }

  func step(_ statement: OpaquePointer) throws -> Bool {
    switch sqlite3_step(statement) {
    case SQLITE_ROW: return true
    case SQLITE_DONE: return false
    default: throw BenchmarkFailure(String(cString: sqlite3_errmsg(db)))
    }
  }

  /// Milliseconds since 1970 from the system clock, as the store stamps jobs.
  private func nowMillis() -> Int64 {
    var time = timespec()
    clock_gettime(CLOCK_REALTIME, &time)
    return Int64(time.tv_sec) * 1000 + Int64(time.tv_nsec) / 1_000_000
  }

  /// Inserts `count` jobs, `perTransaction` per transaction, reading each new job's ID: one row
  /// per statement alone, and one multi-row `INSERT … RETURNING id` per 32 jobs in a batch (as
  /// the store does for jobs without keys).
  func insert(count: Int, perTransaction: Int) throws {
    let begin = try statement("BEGIN IMMEDIATE")
    let commit = try statement("COMMIT")
    let columns = "INSERT INTO jobs (queue, payload, status, priority, run_at, created_at, dedup_key) "
    // Prepared once each: one row, and 2 to 32 rows with their IDs returned.
    let single = try statement(columns + "VALUES (?, ?, ?, ?, ?, ?, ?)")
    let multi = try (0...32).map { rows in
      rows < 2
        ? single
        : try statement(
          columns + "VALUES (?, ?, ?, ?, ?, ?, ?)"
            + String(repeating: ", (?, ?, ?, ?, ?, ?, ?)", count: rows - 1) + " RETURNING id")
    }
    let ready = strdup("ready")!
    defer { free(ready) }
    let runAt = Int64(benchEpoch.timeIntervalSince1970 * 1000)
    var done = 0
    while done < count {
      _ = try step(begin)
      sqlite3_reset(begin)
      let now = nowMillis()
      var left = min(perTransaction, count - done)
      while left > 0 {
        let rows = left == 1 ? 1 : min(left, 32)
        let insert = multi[rows]
        for row in 0..<Int32(rows) {
          sqlite3_bind_text(insert, row * 7 + 1, queueName, 5, bench_sqlite_static())
          sqlite3_bind_blob(
            insert, row * 7 + 2, payload.baseAddress, Int32(payload.count), bench_sqlite_static())
          sqlite3_bind_text(insert, row * 7 + 3, ready, 5, bench_sqlite_static())
          sqlite3_bind_int64(insert, row * 7 + 4, 0)
          sqlite3_bind_int64(insert, row * 7 + 5, runAt)
          sqlite3_bind_int64(insert, row * 7 + 6, now)
          sqlite3_bind_null(insert, row * 7 + 7)
        }
        if rows == 1 {
          _ = try step(insert)
          _ = sqlite3_last_insert_rowid(db)
        } else {
          var returned = 0
          while try step(insert) {
            _ = sqlite3_column_int64(insert, 0)
            returned += 1
          }
          guard returned == rows else { throw BenchmarkFailure("\(returned) of \(rows) rows inserted") }
        }
        sqlite3_reset(insert)
        left -= rows
        done += rows
      }
      _ = try step(commit)
      sqlite3_reset(commit)
    }
  }

  /// Claims `batch` jobs per transaction, completing the previous batch in the same transaction.
  func drain(batch: Int, expected: Int) throws {
    let begin = try statement("BEGIN IMMEDIATE")
    let commit = try statement("COMMIT")
    // Completed jobs are kept as history, as the store keeps them.
    let complete = try statement(
      """
      UPDATE jobs SET status = 'completed', finished_at = ?4, lease_owner = NULL, lease_expires_at = NULL
      WHERE id = ?1 AND queue = ?2 AND status = 'running' AND claim_token = ?3
      """)
    let paused = try statement("SELECT 1 FROM queues WHERE name = ? AND paused = 1")
    let promote = try statement(
      "UPDATE jobs SET status = 'ready' WHERE queue = ? AND status = 'scheduled' AND run_at <= ?")
    let select = try statement(
      "SELECT id, payload, attempts, created_at, last_error, claim_token FROM jobs "
        + "WHERE queue = ? AND status = 'ready' ORDER BY priority DESC, run_at, seq, id LIMIT ?")
    let claim = try statement(
      "UPDATE jobs SET status = 'running', "
        + "attempts = CASE WHEN attempts < 9223372036854775807 THEN attempts + 1 ELSE attempts END, "
        + "claim_token = claim_token + 1, lease_owner = ?, lease_expires_at = ? WHERE id = ?")
    var previous: [(id: Int64, token: Int64)] = []
    var claimed: [(id: Int64, token: Int64)] = []
    previous.reserveCapacity(batch)
    claimed.reserveCapacity(batch)
    var handled = 0
    while true {
      _ = try step(begin)
      sqlite3_reset(begin)
      let now = nowMillis()
      for job in previous {
        sqlite3_bind_int64(complete, 1, job.id)
        sqlite3_bind_text(complete, 2, queueName, 5, bench_sqlite_static())
        sqlite3_bind_int64(complete, 3, job.token)
        sqlite3_bind_int64(complete, 4, now)
        _ = try step(complete)
        sqlite3_reset(complete)
        guard sqlite3_changes(db) == 1 else { throw BenchmarkFailure("stale completion") }
      }
      sqlite3_bind_text(paused, 1, queueName, 5, bench_sqlite_static())
      guard try !step(paused) else { throw BenchmarkFailure("paused") }
      sqlite3_reset(paused)
      sqlite3_bind_text(promote, 1, queueName, 5, bench_sqlite_static())
      sqlite3_bind_int64(promote, 2, now)
      _ = try step(promote)
      sqlite3_reset(promote)
      claimed.removeAll(keepingCapacity: true)
      sqlite3_bind_text(select, 1, queueName, 5, bench_sqlite_static())
      sqlite3_bind_int64(select, 2, Int64(batch))
      while try step(select) {
        let bytes = Int(sqlite3_column_bytes(select, 1))
        _ = Data(bytes: sqlite3_column_blob(select, 1), count: bytes)  // the handler's payload
        _ = sqlite3_column_int64(select, 2)
        _ = sqlite3_column_int64(select, 3)
        _ = sqlite3_column_text(select, 4)
        claimed.append((sqlite3_column_int64(select, 0), sqlite3_column_int64(select, 5) + 1))
      }
      sqlite3_reset(select)
      for job in claimed {
        sqlite3_bind_text(claim, 1, owner, 3, bench_sqlite_static())
        sqlite3_bind_int64(claim, 2, now + 3_600_000)
        sqlite3_bind_int64(claim, 3, job.id)
        _ = try step(claim)
        sqlite3_reset(claim)
        guard sqlite3_changes(db) == 1 else { throw BenchmarkFailure("claim lost") }
      }
      _ = try step(commit)
      sqlite3_reset(commit)
      handled += claimed.count
      swap(&previous, &claimed)
      if previous.isEmpty { break }
    }
    guard handled == expected else { throw BenchmarkFailure("raw drained \(handled) of \(expected)") }
  }
}
