import Conveyor
import Foundation

struct NoOpJob: Queueable {
  var index: Int
}

/// In-memory store: a no-op drain through JobQueue against a bare TaskGroup doing the same no-op
/// work, so the ratio is the engine's own overhead (claims, settlements, events, state).
func runQueueBenchmarks() async throws {
  section("JobQueue engine, in-memory store")
  let count = 50_000
  let items = (0..<count).map { NoOpJob(index: $0) }
  // CONVEYOR_BENCH_QUEUE=c4 runs only the concurrency-4 drain, for profiling it alone.
  let onlyC4 = ProcessInfo.processInfo.environment["CONVEYOR_BENCH_QUEUE"] == "c4"
  for concurrency in onlyC4 ? [4] : [1, 4] {
    let baseline = try await best {
      try await withThrowingTaskGroup(of: Void.self) { group in
        var next = 0
        for _ in 0..<concurrency where next < count {
          let item = items[next]
          next += 1
          group.addTask { _ = item.index }
        }
        while try await group.next() != nil {
          if next < count {
            let item = items[next]
            next += 1
            group.addTask { _ = item.index }
          }
        }
      }
    }
    var payloads = [Data]()
    payloads.reserveCapacity(count)
    let encoder = JSONEncoder()
    for item in items { payloads.append(try encoder.encode(item)) }
    func drain(prefetch: Int, claimsAhead: Bool = true) async throws -> Double {
      var fastest = Double.infinity
      for _ in 0..<3 {
        let store = InMemoryJobStore()
        let now = Date()
        _ = try await store.enqueue(
          payloads.map { NewJob(payload: $0, runAt: now) }, queue: "bench", clock: benchClock)
        fastest = min(
          fastest,
          try await seconds {
            let queue = try JobQueue<NoOpJob>(
              configuration: .init(
                identifier: "bench", concurrency: concurrency, prefetch: prefetch, claimsAhead: claimsAhead),
              store: store
            ) { _, _ in .handled }
            await queue.waitUntilFinished()
            await queue.shutdown()
          })
      }
      return fastest
    }
    // The engine decodes each payload before calling the handler; this baseline does that too, so
    // the ratio against it shows the engine's own cost apart from JSON decoding.
    let decodingBaseline = try await best {
      try await withThrowingTaskGroup(of: Void.self) { group in
        let decoder = JSONDecoder()
        var next = 0
        func add() {
          let payload = payloads[next]
          next += 1
          group.addTask { _ = try decoder.decode(NoOpJob.self, from: payload) }
        }
        for _ in 0..<concurrency where next < count { add() }
        while try await group.next() != nil { if next < count { add() } }
      }
    }
    let measured = try await drain(prefetch: 0)
    let withoutClaimingAhead = try await drain(prefetch: 0, claimsAhead: false)
    if onlyC4 {
      print("JobQueue drain, no-op, concurrency 4: \(Int(Double(count) / measured))/s")
      continue
    }
    Comparison(
      name: "JobQueue drain, no-op, concurrency \(concurrency)", count: count, seconds: measured,
      baselineName: "TaskGroup decoding JSON, width \(concurrency)", baselineSeconds: decodingBaseline,
      goal: nil
    ).print()
    Comparison(
      name: "JobQueue drain, no-op, concurrency \(concurrency)", count: count, seconds: measured,
      baselineName: "the same, claimsAhead false", baselineSeconds: withoutClaimingAhead, goal: nil
    ).print()
    let prefetched = try await drain(prefetch: 32)
    Comparison(
      name: "JobQueue drain, no-op, concurrency \(concurrency), prefetch 32", count: count,
      seconds: prefetched,
      baselineName: "bare TaskGroup, width \(concurrency)", baselineSeconds: baseline,
      goal: nil
    ).print()
    Comparison(
      name: "JobQueue drain, no-op, concurrency \(concurrency)", count: count, seconds: measured,
      baselineName: "bare TaskGroup, width \(concurrency)", baselineSeconds: baseline,
      goal: concurrency == 4 ? 0.5 : nil
    ).print()
  }
}
