import Conveyor
import ConveyorPostgres
import ConveyorSQLite
import Foundation

// Concurrency limits (the section `limits`): a `JobQueue` at concurrency 4 draining jobs under a
// stored concurrency limit of 4 (so the limit allows what the queue would run anyway, and the
// ratio is the cost of enforcing it: counting the running jobs in each claim, and on PostgreSQL
// the claim's lock and second round trip), against the same drain with no limit stored. With
// CONVEYOR_POSTGRES_URL (Benchmarks/with-postgres.sh), on PostgreSQL too.

func runLimitBenchmarks() async throws {
  let folder = FileManager.default.temporaryDirectory.appendingPathComponent("conveyor-limits-\(UUID())")
  try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
  defer { try? FileManager.default.removeItem(at: folder) }
  var next = 0
  func newPath() -> String {
    next += 1
    return folder.appendingPathComponent("l\(next).sqlite").path
  }
  section("Concurrency limits: JobQueue drain c4 under a stored limit of 4 (best of 3, interleaved)")
  let count = 20_000
  let (sqliteLimited, sqlitePlain) = try await interleaved(repeats: 3) {
    try await orderedDrain(try SQLiteJobStore(path: newPath()), count: count, keys: nil, concurrencyLimit: 4)
  } baseline: {
    try await orderedDrain(try SQLiteJobStore(path: newPath()), count: count, keys: nil)
  }
  Comparison(
    name: "SQLite drain c4, limit 4 stored", count: count, seconds: sqliteLimited,
    baselineName: "the same drain without a limit", baselineSeconds: sqlitePlain, goal: nil
  ).print()
  let (memoryLimited, memoryPlain) = try await interleaved(repeats: 3) {
    try await orderedDrain(InMemoryJobStore(), count: count, keys: nil, concurrencyLimit: 4)
  } baseline: {
    try await orderedDrain(InMemoryJobStore(), count: count, keys: nil)
  }
  Comparison(
    name: "in-memory drain c4, limit 4 stored", count: count, seconds: memoryLimited,
    baselineName: "the same drain without a limit", baselineSeconds: memoryPlain, goal: nil
  ).print()
  guard let url = ProcessInfo.processInfo.environment["CONVEYOR_POSTGRES_URL"] else {
    print("(PostgreSQL rows skipped: no CONVEYOR_POSTGRES_URL; run through Benchmarks/with-postgres.sh)")
    try await runRateBenchmarks(postgres: nil, sqlite: newPath)
    return
  }
  let postgresCount = 5_000
  var schemaNumber = 0
  func newStore() async throws -> PostgresJobStore {
    schemaNumber += 1
    let schema = "limits_\(ProcessInfo.processInfo.processIdentifier)_\(schemaNumber)"
    return try await PostgresJobStore.open(url: url, options: .init(schema: schema))
  }
  let (postgresLimited, postgresPlain) = try await interleaved(repeats: 3) {
    let store = try await newStore()
    let seconds = try await orderedDrain(store, count: postgresCount, keys: nil, concurrencyLimit: 4)
    await store.close()
    return seconds
  } baseline: {
    let store = try await newStore()
    let seconds = try await orderedDrain(store, count: postgresCount, keys: nil)
    await store.close()
    return seconds
  }
  Comparison(
    name: "PostgreSQL drain c4, limit 4 stored", count: postgresCount, seconds: postgresLimited,
    baselineName: "the same drain without a limit", baselineSeconds: postgresPlain, goal: nil
  ).print()
  try await runRateBenchmarks(postgres: newStore, sqlite: newPath)
}

/// A rate far above the drain's pace (it never makes a worker wait): what keeping the bucket costs
/// each claim, against the same drain without a rate, on every store.
func runRateBenchmarks(
  postgres newStore: (() async throws -> PostgresJobStore)?, sqlite newPath: () -> String
) async throws {
  section(
    "Rate limits: JobQueue drain c4 under a stored rate of 1,000,000/s, bursts of 1,000 (best of 3, interleaved)"
  )
  let rate = RateLimit(perSecond: 1_000_000, burst: 1_000)
  let count = 20_000
  let (sqliteRated, sqlitePlain) = try await interleaved(repeats: 3) {
    try await orderedDrain(try SQLiteJobStore(path: newPath()), count: count, keys: nil, rate: rate)
  } baseline: {
    try await orderedDrain(try SQLiteJobStore(path: newPath()), count: count, keys: nil)
  }
  Comparison(
    name: "SQLite drain c4, rate stored", count: count, seconds: sqliteRated,
    baselineName: "the same drain without a rate", baselineSeconds: sqlitePlain, goal: nil
  ).print()
  let (memoryRated, memoryPlain) = try await interleaved(repeats: 3) {
    try await orderedDrain(InMemoryJobStore(), count: count, keys: nil, rate: rate)
  } baseline: {
    try await orderedDrain(InMemoryJobStore(), count: count, keys: nil)
  }
  Comparison(
    name: "in-memory drain c4, rate stored", count: count, seconds: memoryRated,
    baselineName: "the same drain without a rate", baselineSeconds: memoryPlain, goal: nil
  ).print()
  guard let newStore else { return }
  let postgresCount = 5_000
  let (postgresRated, postgresPlain) = try await interleaved(repeats: 3) {
    let store = try await newStore()
    let seconds = try await orderedDrain(store, count: postgresCount, keys: nil, rate: rate)
    await store.close()
    return seconds
  } baseline: {
    let store = try await newStore()
    let seconds = try await orderedDrain(store, count: postgresCount, keys: nil)
    await store.close()
    return seconds
  }
  Comparison(
    name: "PostgreSQL drain c4, rate stored", count: postgresCount, seconds: postgresRated,
    baselineName: "the same drain without a rate", baselineSeconds: postgresPlain, goal: nil
  ).print()
}
