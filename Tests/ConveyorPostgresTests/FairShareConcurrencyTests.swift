import Conveyor
import ConveyorPostgres
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

/// Fair shares under real concurrency: several stores (a connection each, so transactions truly
/// overlap) add jobs of several fairness keys and limit keys, claim, settle (retrying into the
/// ready state, so turns are taken in settlements too), cancel and re-queue at once. Two
/// transactions may give a key's two jobs one turn (a documented tie); nothing else may go wrong.
@Suite("PostgresJobStore fair shares under concurrency", .serialized)
struct FairSharesConcurrencyTests {
  final class Watch: Sendable {
    struct State {
      var running: Set<Int64> = []
      var violations: [String] = []
      var added: Set<Int64> = []
      var adders = 0
    }
    let state = Mutex(State())
  }

  @Test func addersWorkersAndAnOperatorWithFairnessKeysNeitherFailNorLoseJobs() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("fairconc")
    let options = PostgresJobStore.Options(schema: schema)
    var opened: [PostgresJobStore] = []
    for _ in 0..<8 { opened.append(try await PostgresJobStore.open(url: server.url, options: options)) }
    let stores = opened
    try await stores[0].setLimits(QueueLimits(keyConcurrency: 1), queue: "q")
    let watch = Watch()
    watch.state.withLock { $0.adders = 3 }
    let clock = SystemJobClock()
    let deadline = Date().addingTimeInterval(240)
    @Sendable func drained(_ store: PostgresJobStore) async throws -> Bool {
      if Date() > deadline {
        let counts = try await store.counts(queue: "q", clock: clock)
        watch.state.withLock { $0.violations.append("not drained in time: \(counts)") }
        return true
      }
      guard watch.state.withLock({ $0.adders }) == 0 else { return false }
      let counts = try await store.counts(queue: "q", clock: clock)
      return counts.total == 0
    }
    let tenants = (0..<6).map { "tenant-\($0)" }
    let hosts = ["h0", "h1", "h2", nil]
    try await withThrowingTaskGroup(of: Void.self) { group in
      for adder in 0..<3 {
        let store = stores[adder]
        group.addTask {
          defer { watch.state.withLock { $0.adders -= 1 } }
          for n in 0..<80 {
            var batch: [NewJob] = []
            for m in 0..<(1 + n % 3) {
              let tenant = tenants[(n * 7 + m + adder) % tenants.count]
              let delay: RunTime = n % 5 == 0 ? .after(.milliseconds(Int64(10 + n % 30))) : .now
              let dedup = n % 6 == 0 && m == 0 ? "\(adder)-\(n % 4)" : nil
              batch.append(
                NewJob(
                  payload: Data("\(adder)-\(n)-\(m)".utf8), priority: n % 2, runTime: delay,
                  deduplicationKey: dedup, onConflict: n % 12 == 0 ? .replace : .useExisting,
                  limitKey: hosts[(n + m) % hosts.count], fairnessKey: tenant))
            }
            let added = try await store.enqueue(batch, queue: "q", clock: clock)
            watch.state.withLock { $0.added.formUnion(added.map(\.id.rawValue)) }
            try await Task.sleep(for: .milliseconds(Int.random(in: 0...3)))
          }
        }
      }
      for worker in 0..<4 {
        let store = stores[3 + worker]
        group.addTask {
          var settling: [JobSettlement] = []
          while true {
            let batch = try await store.settleAndClaim(
              settling, queue: "q", limit: 1 + worker % 3,
              lease: Lease(owner: "w\(worker)", duration: .seconds(60)),
              clock: clock)
            settling = []
            for record in batch.claimed {
              watch.state.withLock { state in
                if !state.running.insert(record.id.rawValue).inserted {
                  state.violations.append("\(record.id.rawValue) claimed twice at once")
                }
              }
            }
            try await Task.sleep(for: .milliseconds(Int.random(in: 0...2)))
            for record in batch.claimed {
              let roll = Int.random(in: 0..<24)
              let action: JobSettlement.Action =
                record.attempts > 3
                ? .complete
                : roll == 0
                  ? .kill(error: "broken")
                  : roll < 4
                    ? .retry(after: .zero, error: "again")
                    : roll < 6
                      ? .retry(after: .milliseconds(15), error: "later")
                      : roll == 6 ? .release(error: nil) : .complete
              _ = watch.state.withLock { $0.running.remove(record.id.rawValue) }
              settling.append(JobSettlement(claim: record.claim, action: action, keepsHistory: roll % 2 == 0))
            }
            if batch.claimed.isEmpty {
              if try await drained(store) { break }
              try await Task.sleep(for: .milliseconds(3))
            }
          }
        }
      }
      let operatorStore = stores[7]
      group.addTask {
        var round = 0
        while !(try await drained(operatorStore)) {
          round += 1
          if round % 4 == 0 {
            let pending = try await operatorStore.jobs(queue: "q", status: .pending, after: nil, limit: 50)
            if let job = pending.randomElement() {
              _ = try await operatorStore.cancel([job.id], queue: "q", clock: clock)
            }
          }
          _ = try await operatorStore.requeueDead(nil, queue: "q", clock: clock)
          try await Task.sleep(for: .milliseconds(Int.random(in: 3...10)))
        }
      }
      try await group.waitForAll()
    }
    let result = watch.state.withLock { $0 }
    #expect(result.violations.isEmpty, "\(result.violations)")
    // Every job added ended: completed (kept or deleted) or cancelled; none left waiting.
    let left = try await stores[0].counts(queue: "q", clock: clock)
    #expect(left.total == 0, "left: \(left)")
    for store in stores { await store.close() }
  }
}

/// Two adds that each replace two waiting jobs of one fairness key, moving one up a priority and
/// one down, in opposite orders: ordinary traffic, which must not deadlock. (A deadlock is broken
/// by the server after its `deadlock_timeout` and the store runs the losing call again, so it is
/// seen in the server's log, not as an error.)
@Suite("PostgresJobStore fair shares: replacing adds", .serialized)
struct FairSharesReplaceDeadlockTests {
  @Test func twoAddsReplacingJobsOfOneKeyAcrossPrioritiesDoNotDeadlock() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("fairdeadlock")
    var options = PostgresJobStore.Options(schema: schema, clock: .caller)
    options.claimDelayCounted = nil
    let setup = try await PostgresJobStore.open(url: server.url, options: options)
    let first = try await PostgresJobStore.open(url: server.url, options: options)
    let second = try await PostgresJobStore.open(url: server.url, options: options)
    let clock = FixedJobClock(Date(timeIntervalSince1970: 1_800_000_000))
    func job(_ text: String, _ dedup: String, priority: Int, replace: Bool = false) -> NewJob {
      NewJob(
        payload: Data(text.utf8), priority: priority, deduplicationKey: dedup,
        onConflict: replace ? .replace : .useExisting, fairnessKey: "K")
    }
    _ = try await setup.enqueue(
      [
        job("x1", "x1", priority: 0), job("x2", "x2", priority: 1), job("z1", "z1", priority: 1),
        job("z2", "z2", priority: 0),
      ],
      queue: "q", clock: clock)
    let log = server.folder + "/server.log"
    // A deadlock of this test's statements: the server's report names the schema in its context.
    func deadlocks() -> [String] {
      let text = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
      return text.components(separatedBy: "deadlock detected").dropFirst().map { String($0.prefix(2_000)) }
        .filter { $0.contains(schema) }
    }
    let deadlocksBefore = deadlocks().count
    // An operator's transaction holds x2's row a moment (as a cancel or a claim would), so the
    // first add has taken its first replacement's locks when the second add starts.
    let admin = try AdminConnection(server.url)
    try admin.query("BEGIN")
    try admin.query("SELECT id FROM \(schema).jobs WHERE dedup_key = convert_to('x2', 'UTF8') FOR UPDATE")
    let started = ContinuousClock.now
    async let a = first.enqueue(
      [job("x1'", "x1", priority: 1, replace: true), job("x2'", "x2", priority: 0, replace: true)],
      queue: "q", clock: clock)
    try await Task.sleep(for: .milliseconds(400))
    async let b = second.enqueue(
      [job("z1'", "z1", priority: 0, replace: true), job("z2'", "z2", priority: 1, replace: true)],
      queue: "q", clock: clock)
    try await Task.sleep(for: .milliseconds(400))
    try admin.query("COMMIT")
    let (resultA, resultB) = try await (a, b)
    let elapsed = ContinuousClock.now - started
    #expect(
      resultA.map(\.outcome) == [.replaced, .replaced] && resultB.map(\.outcome) == [.replaced, .replaced])
    try await Task.sleep(for: .milliseconds(200))
    let found = deadlocks().dropFirst(deadlocksBefore)
    #expect(found.isEmpty, "deadlocks: \(found.count) in \(elapsed); the server's log:\n\(found.last ?? "")")
    for store in [setup, first, second] { await store.close() }
  }
}
