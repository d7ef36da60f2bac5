import Conveyor
import Foundation
import Synchronization
import Testing

@testable import ConveyorPostgres

/// Ordering keys under real concurrency: several stores (a connection each, so transactions
/// truly overlap, which one store's serialized connection never does) add, claim, settle,
/// cancel, remove and re-queue jobs of a few keys at once.
@Suite("PostgresJobStore ordering keys under concurrency", .serialized)
struct OrderingConcurrencyTests {
  /// What the workers saw, shared under its lock.
  final class Watch: Sendable {
    struct State {
      /// The job of each key a worker runs now.
      var running: [String: Int64] = [:]
      /// The IDs claimed, per key, in claim order.
      var claimed: [String: [Int64]] = [:]
      var violations: [String] = []
      var added: [Int64] = []
      /// Jobs the operator cancelled while they ran, or removed.
      var ended: Set<Int64> = []
      /// The adders still adding.
      var adders = 0
    }
    let state = Mutex(State())
  }

  /// Whether any line has no first job that may run, or more than one: the committed state must
  /// never show either. Returns the offending lines.
  static func brokenLines(_ admin: AdminConnection, schema: String) throws -> [[String?]] {
    try admin.query(
      """
      SELECT queue, ordering_key, first, free, free_first FROM (
        SELECT queue, ordering_key, min(id) AS first, count(*) FILTER (WHERE status <> 'held') AS free,
          min(id) FILTER (WHERE status <> 'held') AS free_first
        FROM \(schema).jobs WHERE ordering_key IS NOT NULL AND status IN (\(SQL.lineStatuses))
        GROUP BY queue, ordering_key
      ) AS lines WHERE free <> 1 OR free_first <> first
      """)
  }

  /// Three adders, four workers (completing with and without history, retrying, killing) and an
  /// operator (cancelling and removing held jobs, re-queueing dead ones) on five keys: no line is
  /// ever left without a runnable first job or with two, no two jobs of a key run at once, each
  /// key's jobs are claimed in the order they were added, and every job ends.
  @Test func addersWorkersAndAnOperatorNeverBreakALine() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("ordering")
    let options = PostgresJobStore.Options(schema: schema)
    var opened: [PostgresJobStore] = []
    for _ in 0..<8 { opened.append(try await PostgresJobStore.open(url: server.url, options: options)) }
    let stores = opened
    let url = server.url
    let watch = Watch()
    let keys = (0..<5).map { "key-\($0)" }
    watch.state.withLock { $0.adders = 3 }
    let clock = SystemJobClock()
    // About 2 s alone; a whole-suite run on a loaded machine took over 90 s.
    let deadline = Date().addingTimeInterval(300)
    /// Whether every adder finished and no job is left to run (or it is too late).
    @Sendable func drained(_ store: PostgresJobStore) async throws -> Bool {
      if Date() > deadline {
        let counts = try await store.counts(queue: "q", clock: clock)
        var left: [String] = []
        for status in [JobStatus.pending, .running, .dead] {
          left += try await store.jobs(queue: "q", status: status, after: nil, limit: 10).map {
            "\($0.id) \($0.status)\($0.isHeld ? " held" : "") \($0.orderingKey ?? "-")"
          }
        }
        watch.state.withLock { $0.violations.append("not drained in time: \(counts), first left: \(left)") }
        return true
      }
      guard watch.state.withLock({ $0.adders }) == 0 else { return false }
      return try await store.counts(queue: "q", clock: clock).total == 0
    }
    try await withThrowingTaskGroup(of: Void.self) { group in
      for adder in 0..<3 {
        let store = stores[adder]
        group.addTask {
          defer { watch.state.withLock { $0.adders -= 1 } }
          for n in 0..<60 {
            let key = keys[(n + adder) % keys.count]
            var batch = [NewJob(payload: Data("\(adder)-\(n)".utf8), orderingKey: key)]
            if n % 5 == 0 { batch.append(NewJob(payload: Data("\(adder)-\(n)b".utf8), orderingKey: key)) }
            if n % 7 == 0 { batch.append(NewJob(payload: Data("\(adder)-\(n)c".utf8), orderingKey: keys[0])) }
            let added = try await store.enqueue(batch, queue: "q", clock: clock)
            watch.state.withLock { $0.added += added.map(\.id.rawValue) }
            try await Task.sleep(for: .milliseconds(Int.random(in: 0...4)))
          }
        }
      }
      for worker in 0..<4 {
        let store = stores[3 + worker]
        group.addTask {
          var settling: [JobSettlement] = []
          while true {
            let batch = try await store.settleAndClaim(
              settling, queue: "q", limit: 2, lease: Lease(owner: "w\(worker)", duration: .seconds(60)),
              clock: clock)
            settling = []
            for record in batch.claimed {
              let key = record.orderingKey ?? "?"
              watch.state.withLock { state in
                if let other = state.running[key] {
                  state.violations.append("\(record.id.rawValue) of \(key) claimed while \(other) ran")
                }
                state.running[key] = record.id.rawValue
                state.claimed[key, default: []].append(record.id.rawValue)
              }
            }
            try await Task.sleep(for: .milliseconds(Int.random(in: 0...3)))
            for record in batch.claimed {
              let roll = Int.random(in: 0..<20)
              let action: JobSettlement.Action =
                roll == 0
                ? .kill(error: "broken") : roll == 1 ? .retry(after: .zero, error: "again") : .complete
              let key = record.orderingKey ?? "?"
              // Marked done before the call that carries it: the next job of the key may be
              // claimed once it commits.
              watch.state.withLock { state in
                if state.running[key] == record.id.rawValue { state.running[key] = nil }
              }
              settling.append(JobSettlement(claim: record.claim, action: action, keepsHistory: roll % 2 == 0))
            }
            if batch.claimed.isEmpty {
              if try await drained(store) { break }
              try await Task.sleep(for: .milliseconds(5))
            }
          }
        }
      }
      let operatorStore = stores[7]
      group.addTask {
        var round = 0
        while !(try await drained(operatorStore)) {
          round += 1
          let pending = try await operatorStore.jobs(queue: "q", status: .pending, after: nil, limit: 50)
          if let held = pending.filter(\.isHeld).randomElement() {
            if round % 2 == 0 {
              let result = try await operatorStore.cancel([held.id], queue: "q", clock: clock)
              if result == [.cancelledRunning] {
                _ = watch.state.withLock { $0.ended.insert(held.id.rawValue) }
              }
            } else {
              // Removed whatever it became meanwhile: its worker, if any, then finds it gone.
              _ = watch.state.withLock { $0.ended.insert(held.id.rawValue) }
              _ = try await operatorStore.remove([held.id], queue: "q")
            }
          }
          if round % 3 == 0 {
            _ = try await operatorStore.prune(
              queue: "q", status: .dead, olderThan: .zero, limit: 1, clock: clock)
          }
          _ = try await operatorStore.requeueDead(nil, queue: "q", clock: clock)
          try await Task.sleep(for: .milliseconds(Int.random(in: 5...15)))
        }
      }
      group.addTask {
        let admin = try AdminConnection(url)
        while !(try await drained(operatorStore)) {
          let broken = try Self.brokenLines(admin, schema: schema)
          if !broken.isEmpty { watch.state.withLock { $0.violations.append("broken lines: \(broken)") } }
          try await Task.sleep(for: .milliseconds(10))
        }
      }
      try await group.waitForAll()
    }
    let result = watch.state.withLock { $0 }
    // A job cancelled or removed while it ran let the next one start: not a violation.
    // So did one whose claim's answer came back after the next one's was recorded.
    let violations = result.violations.filter { violation in
      !result.ended.contains { violation.hasSuffix("while \($0) ran") || violation.hasPrefix("\($0) of ") }
    }
    #expect(violations.isEmpty, "\(violations)")
    // A job cancelled or removed as it was claimed may be recorded after the next one of its
    // key (the operator's cancel let that one run before the claim's answer came back).
    for (key, ids) in result.claimed {
      let kept = ids.filter { !result.ended.contains($0) }
      #expect(kept == kept.sorted(), "\(key) claimed out of order: \(ids), ended: \(result.ended.sorted())")
    }
    // Each adder: 60 jobs, a second one every fifth (12), a job of key-0 every seventh (9).
    let expected = 243
    #expect(result.added.count == expected)
    #expect(try Self.brokenLines(try AdminConnection(url), schema: schema).isEmpty)
    for store in stores { await store.close() }
  }

  /// An add that replaces a waiting job (`.replace`) with an ordering key, and a cancel, a removal
  /// or a clear of that job, at once: ordinary traffic, which must not deadlock. The add takes its line's lock, then
  /// (its deduplication key's lock granted) locks the waiting job's row to replace it; the cancel
  /// locks the job's row, then its line's lock to promote the next job.
  @Test(arguments: ["cancel", "remove", "clear"])
  func aReplacingAddAndAnOperatorDeletingTheReplacedJobDoNotDeadlock(_ operation: String) async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("orderdeadlock")
    let options = PostgresJobStore.Options(schema: schema, lockTimeout: .zero)
    let adder = try await PostgresJobStore.open(url: server.url, options: options)
    let canceller = try await PostgresJobStore.open(url: server.url, options: options)
    let clock = SystemJobClock()
    let admin = try AdminConnection(server.url)
    // A deduplication key whose lock comes after the line's in lock-key order: the add holds the
    // line's lock while it waits for the deduplication key's (which the test holds a moment).
    let dedup = try (0..<32).map { "d\($0)" }.first { key in
      try admin.scalar(
        "SELECT \(schema).dedup_lock_key('q', convert_to('\(key)', 'UTF8')) > \(schema).order_lock_key('q', 'K')"
      )
        == "t"
    }!
    let waiting = try expectOne(
      try await adder.enqueue(
        [NewJob(payload: Data("x".utf8), deduplicationKey: dedup, orderingKey: "K")], queue: "q", clock: clock
      ))
    let gate = try AdminConnection(server.url)
    try gate.query(
      "SELECT pg_advisory_lock(\(schema).dedup_lock_key('q', convert_to('\(dedup)', 'UTF8')))")
    let watcher = try AdminConnection(server.url)
    func lockWaiters() throws -> String? {
      try watcher.scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%\(schema)%'")
    }
    let adding = Task {
      try await adder.enqueue(
        [NewJob(payload: Data("x2".utf8), deduplicationKey: dedup, onConflict: .replace, orderingKey: "K")],
        queue: "q", clock: clock)
    }
    try await waitFor("the add to hold the line's lock and wait") { try lockWaiters() == "1" }
    let cancelling = Task {
      switch operation {
      case "cancel": _ = try await canceller.cancel([waiting.id], queue: "q", clock: clock)
      case "remove": _ = try await canceller.remove([waiting.id], queue: "q")
      default: _ = try await canceller.clear(queue: "q", statuses: [.pending])
      }
    }
    try await waitFor("the \(operation) to wait for the line's lock") { try lockWaiters() == "2" }
    try gate.query(
      "SELECT pg_advisory_unlock(\(schema).dedup_lock_key('q', convert_to('\(dedup)', 'UTF8')))")
    let added = await adding.result
    let cancelled = await cancelling.result
    var failures: [String] = []
    if case .failure(let error) = added { failures.append("the add failed: \(error)") }
    if case .failure(let error) = cancelled { failures.append("the \(operation) failed: \(error)") }
    #expect(failures.isEmpty, "\(failures)")
    await adder.close()
    await canceller.close()
  }

  private func expectOne<Element>(_ elements: [Element]) throws -> Element {
    guard elements.count == 1, let only = elements.first else { throw HarnessError("not one: \(elements)") }
    return only
  }

  /// A head killed releasing its key on one store, racing adds of the same key on another store
  /// over the same schema: no add is left held with no head before it.
  @Test func aHeadDyingReleasingItsKeyWhileAnotherStoreAddsToItLeavesNoAddWithoutAHead() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema()
    let a = try await PostgresJobStore.open(url: server.url, options: .init(schema: schema))
    let b = try await PostgresJobStore.open(url: server.url, options: .init(schema: schema))
    let clock = SystemJobClock()
    let lease = Lease(owner: "w", duration: .seconds(60))
    var problems: [String] = []
    for round in 0..<150 {
      let key = "k\(round % 3)"
      _ = try await a.enqueue(
        [NewJob(payload: Data("h\(round)".utf8), orderingKey: key)], queue: "q", clock: clock)
      let heads = try await a.settleAndClaim([], queue: "q", limit: 10, lease: lease, clock: clock).claimed
      guard let head = heads.first(where: { $0.orderingKey == key }) else {
        problems.append("round \(round): no head claimed")
        continue
      }
      var kill = JobSettlement(claim: head.claim, action: .kill(error: "x"))
      kill.releasesOrderingKey = true
      async let killed = a.settleAndClaim([kill], queue: "q", limit: 0, lease: lease, clock: clock)
      async let added = b.enqueue(
        [NewJob(payload: Data("n\(round)".utf8), orderingKey: key)], queue: "q", clock: clock)
      _ = try await killed
      let next = try await added[0]
      let record = try await a.job(next.id)
      if record?.isHeld == true { problems.append("round \(round): \(next.id) held with no head") }
      // Drain: complete whatever runs.
      while true {
        let batch = try await a.settleAndClaim([], queue: "q", limit: 10, lease: lease, clock: clock)
        if batch.claimed.isEmpty { break }
        _ = try await a.settleAndClaim(
          batch.claimed.map { JobSettlement(claim: $0.claim, action: .complete) }, queue: "q", limit: 0,
          lease: lease, clock: clock)
      }
      let counts = try await a.counts(queue: "q", clock: clock)
      if counts.held > 0 { problems.append("round \(round): \(counts.held) held left: \(counts)") }
    }
    await a.close()
    await b.close()
    #expect(problems.isEmpty, "\(problems.prefix(5))")
  }
}
