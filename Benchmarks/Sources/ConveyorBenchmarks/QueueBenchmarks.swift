import Conveyor
import Foundation

struct NoOpJob: Queueable {
  var index: Int
}

/// A job shaped like a typical one: strings, numbers, a date, an optional, an array, a nested value.
struct TypicalJob: Queueable, Equatable {
  struct Recipient: Codable, Equatable {
    var name: String
    var address: String
  }
  var id: Int
  var kind: String
  var recipients: [Recipient]
  var attempts: Int?
  var createdAt: Date
  var urgent: Bool
  var weight: Double
}

/// Decoding payloads: a queue's own decoder (through `JobQueue.item(of:)`, what a worker uses)
/// against Foundation's JSONDecoder on the same payloads.
func runDecodeBenchmark() async throws {
  let count = 50_000
  let encoder = JSONEncoder()
  var records: [JobRecord] = []
  for index in 0..<count {
    let job = TypicalJob(
      id: index, kind: "welcome-email",
      recipients: [.init(name: "Ada \(index)", address: "ada\(index)@example.com")],
      attempts: index % 2 == 0 ? nil : index, createdAt: Date(timeIntervalSince1970: Double(index)),
      urgent: index % 3 == 0, weight: Double(index) / 7)
    records.append(
      JobRecord(
        id: JobID(Int64(index + 1)), queue: "bench", payload: try encoder.encode(job), status: .pending,
        priority: 0, attempts: 0, runAt: Date(), createdAt: Date(), deduplicationKey: nil))
  }
  let queue = try JobQueue<TypicalJob>(
    configuration: .init(identifier: "decode-bench"), store: InMemoryJobStore()
  ) { _, _ in .handled }
  let decoder = JSONDecoder()
  let foundation = try await best {
    for record in records { _ = try decoder.decode(TypicalJob.self, from: record.payload) }
  }
  let own = try await best {
    for record in records { _ = try queue.item(of: record) }
  }
  // Not a timing check: the two must agree, or the comparison means nothing.
  for record in records.prefix(100) {
    guard try queue.item(of: record) == decoder.decode(TypicalJob.self, from: record.payload) else {
      fatalError(
        "the queue's decoder and JSONDecoder disagree on \(String(decoding: record.payload, as: UTF8.self))")
    }
  }
  await queue.shutdown()
  Comparison(
    name: "decode a typical job, JobQueue.item(of:)", count: count, seconds: own,
    baselineName: "JSONDecoder", baselineSeconds: foundation, goal: nil
  ).print()
}

/// In-memory store: a no-op drain through JobQueue against a bare TaskGroup doing the same no-op
/// work, so the ratio is the engine's own overhead (claims, settlements, events, state).
func runQueueBenchmarks() async throws {
  section("JobQueue engine, in-memory store")
  if ProcessInfo.processInfo.environment["CONVEYOR_BENCH_QUEUE"] != "c4" { try await runDecodeBenchmark() }
  let count = 50_000
  let items = (0..<count).map { NoOpJob(index: $0) }
  // CONVEYOR_BENCH_QUEUE=c4 runs only the concurrency-4 drain, for profiling it alone (10 pairs,
  // or CONVEYOR_BENCH_PAIRS of them).
  let onlyC4 = ProcessInfo.processInfo.environment["CONVEYOR_BENCH_QUEUE"] == "c4"
  for concurrency in onlyC4 ? [4] : [1, 4] {
    /// One drain of the items through a bare TaskGroup that keeps `concurrency` no-op tasks going.
    func bareDrain() async throws -> Double {
      try await seconds {
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
    }
    var baseline = Double.infinity
    for _ in 0..<3 { baseline = min(baseline, try await bareDrain()) }
    var payloads = [Data]()
    payloads.reserveCapacity(count)
    let encoder = JSONEncoder()
    for item in items { payloads.append(try encoder.encode(item)) }
    func drain(prefetch: Int, claimsAhead: Bool = false, repeats: Int = 3) async throws -> Double {
      var fastest = Double.infinity
      for _ in 0..<repeats {
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
    if onlyC4 {
      // Each drain's rate, and a bare drain's beside it, to see how they spread.
      let pairs = ProcessInfo.processInfo.environment["CONVEYOR_BENCH_PAIRS"].flatMap { Int($0) } ?? 10
      for _ in 0..<pairs {
        let queue = try await drain(prefetch: 0, repeats: 1)
        let bare = try await bareDrain()
        print(
          "JobQueue drain, no-op, concurrency 4: \(Int(Double(count) / queue))/s, bare \(Int(Double(count) / bare))/s"
        )
      }
      continue
    }
    // The engine decodes each payload before calling the handler. This baseline decodes with
    // Foundation's JSONDecoder, as the engine did until its own payload decoder (which falls back
    // to JSONDecoder for anything unusual) replaced it on the hot path.
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
    let claimingAhead = try await drain(prefetch: 0, claimsAhead: true)
    Comparison(
      name: "JobQueue drain, no-op, concurrency \(concurrency)", count: count, seconds: measured,
      baselineName: "TaskGroup + JSONDecoder, width \(concurrency)", baselineSeconds: decodingBaseline,
      goal: nil
    ).print()
    Comparison(
      name: "JobQueue drain, no-op, concurrency \(concurrency), claimsAhead true", count: count,
      seconds: claimingAhead,
      baselineName: "the same by default (claimsAhead false)", baselineSeconds: measured, goal: nil
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
      goal: nil
    ).print()
    // The goal's figure: both drains swing by up to 2x from run to run on this machine (the bare
    // TaskGroup most, with how its threads happen to hand off), so the best of each, measured at
    // different moments, compares luck. Seven pairs run back to back (baseline, then queue), and
    // the median of the seven ratios is the figure; the range shows the spread.
    var ratios: [Double] = []
    for _ in 0..<7 {
      let bare = try await bareDrain()
      ratios.append(bare / (try await drain(prefetch: 0, repeats: 1)))
    }
    ratios.sort()
    let median = ratios[ratios.count / 2]
    let goal = concurrency == 4 ? 0.5 : nil
    print(
      String(
        format: "%-48@ median of 7 paired ratios %.2fx (%.2f-%.2fx)%@",
        "JobQueue drain / bare TaskGroup, conc. \(concurrency)" as NSString, median, ratios[0],
        ratios[ratios.count - 1],
        goal.map { String(format: " (goal >= %.2fx: %@)", $0, median >= $0 ? "met" : "MISSED") } ?? ""))
  }
}
