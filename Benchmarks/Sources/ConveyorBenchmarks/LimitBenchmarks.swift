import Conveyor
import ConveyorPostgres
import ConveyorSQLite
import Foundation

// Limits (the section `limits`): a `JobQueue` at concurrency 4 draining jobs under stored limits
// that allow what the queue would run anyway, so the ratio is the cost of enforcing them, against
// the same drain with no limit stored:
// - a concurrency limit of 4: counting the running jobs in each claim, and on PostgreSQL the
//   claim's lock;
// - a rate of 1,000,000 a second with bursts of 1,000, far above the drain's pace: keeping the
//   rate's bucket in each claim;
// - a limit of 2 per key over 100 limit keys (jobs added round-robin over them): counting each
//   claimed key's running jobs in each claim, and on PostgreSQL the claim's lock and the trigger
//   of each job that stops running. Against the same drain of jobs without limit keys;
// - a rate of 1,000,000 a second per key with bursts of 1,000 over the same 100 keys: keeping each
//   claimed key's bucket in each claim (and on SQLite and PostgreSQL looking for keys due).
// With CONVEYOR_POSTGRES_URL (Benchmarks/with-postgres.sh), on PostgreSQL too.

func runLimitBenchmarks() async throws {
  let files = try BenchmarkFolder("limits")
  defer { withExtendedLifetime(files) {} }  // the files stay until the section ends
  let newPath = files.newPath
  let url = ProcessInfo.processInfo.environment["CONVEYOR_POSTGRES_URL"]
  let schemas = BenchmarkSchemas("limits")
  let newStore = schemas.newStore
  for (title, limits, stored, without) in [
    (
      "Concurrency limits: JobQueue drain c4 under a stored limit of 4", QueueLimits(concurrency: 4),
      "limit 4 stored", "without a limit"
    ),
    (
      "Rate limits: JobQueue drain c4 under a stored rate of 1,000,000/s, bursts of 1,000",
      QueueLimits(rate: RateLimit(perSecond: 1_000_000, burst: 1_000)), "rate stored", "without a rate"
    ),
    (
      "Limits per key: JobQueue drain c4 over 100 limit keys, at most 2 running per key",
      QueueLimits(keyConcurrency: 2), "limit 2 per key, 100 keys", "without limit keys"
    ),
    (
      "Rates per key: JobQueue drain c4 over 100 limit keys, a rate of 1,000,000/s per key, bursts of 1,000",
      QueueLimits(keyRate: RateLimit(perSecond: 1_000_000, burst: 1_000)), "rate per key, 100 keys",
      "without limit keys"
    ),
  ] {
    // Issue 36's goal is for limits per key; rates per key have none yet (measured, not judged).
    let goal: Double? = limits.keyConcurrency != nil ? 0.7 : nil
    section("\(title) (best of 3, interleaved)")
    let count = 20_000
    for (name, makeStore) in [
      ("SQLite", { () async throws -> any JobStore in try SQLiteJobStore(path: newPath()) }),
      ("in-memory", { () async throws -> any JobStore in InMemoryJobStore() }),
    ] {
      let (limited, plain) = try await interleaved(repeats: 3) {
        try await limitedDrain(try await makeStore(), count: count, limits: limits)
      } baseline: {
        try await limitedDrain(try await makeStore(), count: count, limits: QueueLimits())
      }
      Comparison(
        name: "\(name) drain c4, \(stored)", count: count, seconds: limited,
        baselineName: "the same drain \(without)", baselineSeconds: plain, goal: goal
      ).print()
    }
    guard let url else {
      print("(PostgreSQL rows skipped: no CONVEYOR_POSTGRES_URL; run through Benchmarks/with-postgres.sh)")
      continue
    }
    let postgresCount = 5_000
    let (limited, plain) = try await interleaved(repeats: 3) {
      let store = try await newStore(url)
      let seconds = try await limitedDrain(store, count: postgresCount, limits: limits)
      await store.close()
      return seconds
    } baseline: {
      let store = try await newStore(url)
      let seconds = try await limitedDrain(store, count: postgresCount, limits: QueueLimits())
      await store.close()
      return seconds
    }
    Comparison(
      name: "PostgreSQL drain c4, \(stored)", count: postgresCount, seconds: limited,
      baselineName: "the same drain \(without)", baselineSeconds: plain, goal: goal
    ).print()
  }
  try await runFairShareBenchmarks(url: url, newPath: newPath, newStore: newStore)
}

/// Fair shares (in the section `limits`): the jobs of a drain at concurrency 4 carry 100 fairness
/// keys (added round-robin over them), against the same drain of jobs without keys, the add timed
/// too (a job takes its turn as it is added: on SQLite the insert's trigger, three index lookups
/// and an upsert; on PostgreSQL the same, in the add's statement).
func runFairShareBenchmarks(
  url: String?, newPath: @escaping () -> String, newStore: (String) async throws -> PostgresJobStore
)
  async throws
{
  section("Fair shares: JobQueue add + drain c4 over 100 fairness keys (best of 3, interleaved)")
  let count = 20_000
  for (name, makeStore) in [
    ("SQLite", { () async throws -> any JobStore in try SQLiteJobStore(path: newPath()) }),
    ("in-memory", { () async throws -> any JobStore in InMemoryJobStore() }),
  ] {
    let (fair, plain) = try await interleaved(repeats: 3) {
      try await orderedDrain(
        try await makeStore(), count: count, keys: nil, fairnessKeys: 100, timingTheAdd: true)
    } baseline: {
      try await orderedDrain(try await makeStore(), count: count, keys: nil, timingTheAdd: true)
    }
    Comparison(
      name: "\(name) add + drain c4, 100 fairness keys", count: count, seconds: fair,
      baselineName: "the same without fairness keys", baselineSeconds: plain, goal: nil
    ).print()
  }
  guard let url else {
    print("(PostgreSQL rows skipped: no CONVEYOR_POSTGRES_URL; run through Benchmarks/with-postgres.sh)")
    return
  }
  let probe = try await newStore(url)
  let keeps = probe.keepsFairShares
  await probe.close()
  guard keeps else {
    print("(PostgreSQL rows skipped: this build's PostgreSQL store keeps no fair shares)")
    return
  }
  let postgresCount = 5_000
  let (fair, plain) = try await interleaved(repeats: 3) {
    let store = try await newStore(url)
    let seconds = try await orderedDrain(
      store, count: postgresCount, keys: nil, fairnessKeys: 100, timingTheAdd: true)
    await store.close()
    return seconds
  } baseline: {
    let store = try await newStore(url)
    let seconds = try await orderedDrain(store, count: postgresCount, keys: nil, timingTheAdd: true)
    await store.close()
    return seconds
  }
  Comparison(
    name: "PostgreSQL add + drain c4, 100 fairness keys", count: postgresCount, seconds: fair,
    baselineName: "the same without fairness keys", baselineSeconds: plain, goal: nil
  ).print()
}

/// ``orderedDrain`` without ordering keys, under `limits` (none stored when empty); with limits per
/// key, the jobs have 100 limit keys.
private func limitedDrain(_ store: any JobStore, count: Int, limits: QueueLimits) async throws -> Double {
  if !limits.isEmpty { try await store.setLimits(limits, queue: "bench") }
  return try await orderedDrain(store, count: count, keys: nil, limitKeys: limits.hasKeyLimits ? 100 : nil)
}
