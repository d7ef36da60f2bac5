import Conveyor
import ConveyorPostgres
import Foundation
import Synchronization
import Testing

#if canImport(Glibc)
  import Glibc
#endif

/// Adversarial review of `PostgresJobStore` (issue 9). Tests marked `// DEFECT:` fail against the
/// code under review; the others document what held.
@Suite("PostgresJobStore review", .serialized)
struct ReviewPostgresTests {
  // MARK: Helpers

  /// A store on the shared server with a fresh schema; the URL names the application so the
  /// store's backends can be found in `pg_stat_activity`.
  func openStore(
    _ server: PostgresServer, schema: String = uniqueSchema("rv"), clock: PostgresJobStore.Clock = .database,
    reconnectTimeout: Duration = .seconds(60), callTimeout: Duration? = .seconds(60)
  ) async throws -> PostgresJobStore {
    try await PostgresJobStore.open(
      url: server.url + "?application_name=\(schema)",
      options: .init(
        schema: schema, clock: clock, reconnectTimeout: reconnectTimeout, callTimeout: callTimeout))
  }

  /// Whether `flag` becomes true within `seconds`.
  final class Flag: Sendable {
    let value = Mutex(false)
    func set() { value.withLock { $0 = true } }
    var isSet: Bool { value.withLock { $0 } }
  }

  func becomes(_ flag: Flag, within seconds: Double) async -> Bool {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
      if flag.isSet { return true }
      try? await Task.sleep(for: .milliseconds(50))
    }
    return flag.isSet
  }

  /// Makes sure the store's listener is up for `queue` and no notification is pending.
  func primeListener(_ store: PostgresJobStore, queue: String) async throws {
    var live = false
    for _ in 0..<20 where !live {
      let waiter = Task { await store.waitForWork(queue: queue, timeout: .seconds(2)) }
      try await Task.sleep(for: .milliseconds(200))
      try await store.setPaused(false, queue: queue)
      live = await waiter.value
    }
    #expect(live, "the listener hears a resume")
    while await store.waitForWork(queue: queue, timeout: .milliseconds(300)) {}
  }

  // MARK: LISTEN/NOTIFY

  // DEFECT: `requeueDead(_:queue:clock:)` with explicit IDs never sends NOTIFY (the `if let ids`
  // branch returns before `sql.notify`, PostgresJobStore.swift requeueDead), although
  // `waitForWork` promises to wake when a job is "re-queued". Idle workers only find the
  // re-queued job at their next poll.
  @Test func requeueingDeadJobsByIDWakesIdleWorkers() async throws {
    let server = try await PostgresServer.shared()
    let store = try await openStore(server)
    let clock = SystemJobClock()
    let lease = Lease(owner: "w", duration: .seconds(30))
    let id = try await store.enqueue([NewJob(payload: Data("x".utf8))], queue: "rq", clock: clock)[0].id
    let claimed = try await store.settleAndClaim([], queue: "rq", limit: 1, lease: lease, clock: clock)
      .claimed
    #expect(claimed.map(\.id) == [id])
    _ = try await store.settleAndClaim(
      [JobSettlement(claim: claimed[0].claim, action: .kill(error: "boom"))], queue: "rq", limit: 0,
      lease: lease,
      clock: clock)
    try await primeListener(store, queue: "rq")

    let waiter = Task { await store.waitForWork(queue: "rq", timeout: .seconds(4)) }
    try await Task.sleep(for: .milliseconds(300))
    #expect(try await store.requeueDead([id], queue: "rq", clock: clock) == 1)
    #expect(await waiter.value, "re-queueing a dead job by ID wakes the idle worker")

    // The same with `nil` (every dead job) does notify: only the by-ID path is silent.
    let claimedAgain = try await store.settleAndClaim([], queue: "rq", limit: 1, lease: lease, clock: clock)
      .claimed
    _ = try await store.settleAndClaim(
      [JobSettlement(claim: claimedAgain[0].claim, action: .kill(error: "boom"))], queue: "rq", limit: 0,
      lease: lease, clock: clock)
    while await store.waitForWork(queue: "rq", timeout: .milliseconds(300)) {}
    let allWaiter = Task { await store.waitForWork(queue: "rq", timeout: .seconds(4)) }
    try await Task.sleep(for: .milliseconds(300))
    #expect(try await store.requeueDead(nil, queue: "rq", clock: clock) == 1)
    #expect(await allWaiter.value, "re-queueing every dead job wakes the idle worker")
    await store.close()
  }

  // MARK: Unresponsive server

  // DEFECT: a server that stops answering (a network cut without a reset, simulated by SIGSTOP on
  // the store's backend) hangs every call forever: no keepalive, `tcp_user_timeout` or statement
  // timeout is set (Connection.init / SerializedConnection.connected), so the reconnect with
  // backoff promised for "a network cut" never starts; and cancelling the calling task does not
  // end the call either, because `perform` only resumes its continuation when the blocked
  // `PQexecParams` returns (SerializedConnection.perform), which PQcancel cannot make happen.
  @Test func aCallToAServerThatStopsAnsweringEndsAndCancellationEndsIt() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("hang")
    let store = try await openStore(
      server, schema: schema, reconnectTimeout: .seconds(3), callTimeout: .seconds(5))
    _ = try await store.counts(queue: "h", clock: SystemJobClock())
    let admin = try AdminConnection(server.url)
    let pids = try admin.query(
      "SELECT pid FROM pg_stat_activity WHERE application_name = '\(schema)' AND backend_type = 'client backend'"
    )
    #expect(pids.count == 1, "one store connection: \(pids)")
    guard let text = pids.first?.first ?? nil, let pid = Int32(text) else { return }
    kill(pid, SIGSTOP)
    defer { kill(pid, SIGCONT) }

    let finished = Flag()
    let call = Task {
      defer { finished.set() }
      _ = try await store.counts(queue: "h", clock: SystemJobClock())
    }
    let endedOnItsOwn = await becomes(finished, within: 15)
    #expect(endedOnItsOwn, "a call to an unresponsive server fails (or reconnects) instead of hanging")
    call.cancel()
    let endedWhenCancelled = await becomes(finished, within: 5)
    #expect(endedWhenCancelled, "cancelling the calling task ends the call")
    kill(pid, SIGCONT)
    _ = await call.result
    await store.close()
  }

  // MARK: Queues are separate

  // DEFECT: settlements and heartbeats are not scoped to the queue they are sent for: the
  // `settle` and `heartbeat` statements in SQL.swift match on `id` and `claim_token` only (no
  // `queue = $n`). A worker of queue "a" can complete, kill or extend a running job of queue "b";
  // `InMemoryJobStore` (the reference) reports such a settlement stale and leaves the job alone.
  @Test func outcomesAndHeartbeatsSentForAnotherQueueAreStaleAsInTheReferenceStore() async throws {
    let server = try await PostgresServer.shared()
    let clock = ManualJobClock()
    let postgres = try await openStore(server, clock: .caller)
    let memory = InMemoryJobStore()
    let lease = Lease(owner: "w", duration: .seconds(30))
    var outcomes: [String: (stale: Int, heartbeat: Int, counts: JobCounts)] = [:]
    let stores: [(String, any JobStore)] = [("memory", memory), ("postgres", postgres)]
    for (name, store) in stores {
      _ = try await store.enqueue([NewJob(payload: Data("b".utf8))], queue: "b", clock: clock)
      let claim = try await store.settleAndClaim([], queue: "b", limit: 1, lease: lease, clock: clock)
        .claimed[0]
        .claim
      let beat = try await store.heartbeat([claim], queue: "a", lease: lease, clock: clock)
      let batch = try await store.settleAndClaim(
        [JobSettlement(claim: claim, action: .complete)], queue: "a", limit: 0, lease: lease, clock: clock)
      let counts = try await store.counts(queue: "b", clock: clock)
      outcomes[name] = (stale: batch.staleSettlements.count, heartbeat: beat.count, counts: counts)
    }
    let reference = try #require(outcomes["memory"])
    let actual = try #require(outcomes["postgres"])
    #expect(reference.stale == 1 && reference.counts.running == 1, "the reference leaves b's job alone")
    #expect(actual.heartbeat == reference.heartbeat, "a heartbeat sent for queue a does not extend b's job")
    #expect(actual.stale == reference.stale, "a settlement sent for queue a is stale for b's job")
    #expect(actual.counts == reference.counts, "b's job is still running: \(actual.counts)")
    await postgres.close()
  }

  @Test func twoSchemasDoNotInterfere() async throws {
    let server = try await PostgresServer.shared()
    let one = try await openStore(server)
    let two = try await openStore(server)
    let clock = SystemJobClock()
    try await one.setPaused(true, queue: "q")
    _ = try await one.enqueue(
      [NewJob(payload: Data("1".utf8), deduplicationKey: "k")], queue: "q", clock: clock)
    let other = try await two.enqueue(
      [NewJob(payload: Data("2".utf8), deduplicationKey: "k")], queue: "q", clock: clock)
    #expect(other[0].inserted, "dedup is per schema")
    #expect(try await two.isPaused(queue: "q") == false)
    try await primeListener(two, queue: "q")
    let waiter = Task { await two.waitForWork(queue: "q", timeout: .seconds(1)) }
    try await Task.sleep(for: .milliseconds(200))
    _ = try await one.enqueue([NewJob(payload: Data("3".utf8))], queue: "q", clock: clock)
    #expect(await waiter.value == false, "another schema's enqueue does not wake this store")
    let batch = try await two.settleAndClaim(
      [], queue: "q", limit: 10, lease: Lease(owner: "w", duration: .seconds(30)), clock: clock)
    #expect(batch.claimed.map(\.payload) == [Data("2".utf8)])
    await one.close()
    await two.close()
  }

  // MARK: Passwords

  // DEFECT: a password given as a URL query parameter (`?password=…`) is not scrubbed when libpq
  // cannot parse the URL: ConnectionInfo only collects the password of the URL's authority before
  // calling PQconninfoParse, and libpq's message quotes the offending token
  // (`invalid percent-encoded token: "…"`), so the password appears in the error's description.
  @Test func aPasswordInAURLQueryNeverAppearsInAParseError() async throws {
    let secret = "Sw0rdfish%zzTango"
    do {
      _ = try PostgresJobStore(url: "postgresql://app@127.0.0.1:1/app?password=\(secret)")
      Issue.record("the URL was accepted")
    } catch {
      let text = "\(error) \(String(reflecting: error))"
      #expect(!text.contains("Sw0rdfish"), "the password leaked: \(text)")
    }
  }

  @Test func passwordsNeverAppearInConnectionErrors() async throws {
    let server = try await PostgresServer.shared()
    let secret = "Xy7Secret9"
    let urls = [
      "postgresql://app:\(secret)@127.0.0.1:1/app",  // unreachable
      "postgresql://postgres:\(secret)@127.0.0.1:\(server.port)/no_such_db_\(secret)x",  // bad database
      "host=127.0.0.1 port=1 user=app password=\(secret) dbname=app",  // conninfo, unreachable
      "host=127.0.0.1 port=\(server.port) user=nobody_here password='\(secret)' dbname=postgres",  // bad user
      "postgresql://app:%58y7Secret9@127.0.0.1:1/app",  // percent-encoded
      "postgresql://app:\(secret)@127.0.0.1:1/app?sslmode=bogus",
      "postgresql://app:\(secret)@127.0.0.1:notaport/app",
    ]
    for url in urls {
      do {
        let store = try await PostgresJobStore.open(url: url)
        Issue.record("opened \(store.target)")
      } catch {
        let text = "\(error) \(String(reflecting: error))"
        #expect(!text.contains(secret), "leaked for \(url): \(text)")
      }
    }
  }

  // MARK: Order and values compared with the reference store

  /// One scenario on both stores with the same manual clock: the claim order, the stored run
  /// dates (far future, clamped), priorities at the extremes, NUL bytes and a large payload.
  @Test func sameScenarioSameResultsAsTheInMemoryStore() async throws {
    let server = try await PostgresServer.shared()
    let postgres = try await openStore(server, clock: .caller)
    let memory = InMemoryJobStore()
    let big = Data((0..<(8 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 31) })
    func scenario(_ store: any JobStore) async throws -> [String] {
      let clock = ManualJobClock()
      let start = clock.now()
      var log: [String] = []
      let jobs: [NewJob] = [
        NewJob(payload: Data("a\0b".utf8)),
        NewJob(payload: Data("p5".utf8), priority: 5, runTime: .after(.seconds(10))),
        NewJob(payload: Data("old".utf8), runAt: start.addingTimeInterval(-60)),
        NewJob(payload: Data("max".utf8), priority: Int.max),
        NewJob(payload: Data("min".utf8), priority: Int.min),
        NewJob(payload: Data("far".utf8), runAt: .distantFuture),
        NewJob(payload: Data("inf".utf8), runAt: Date(timeIntervalSince1970: .infinity)),
        NewJob(payload: Data("longdelay".utf8), runTime: .after(.seconds(Int64.max))),
        NewJob(payload: Data("k1".utf8), deduplicationKey: "k\0x"),
        NewJob(payload: Data("k2".utf8), deduplicationKey: "k\0y"),
        NewJob(payload: Data("k3".utf8), deduplicationKey: "k\0x"),
        NewJob(payload: big),
      ]
      let results = try await store.enqueue(jobs, queue: "o", clock: clock)
      let ids = results.map(\.id)
      log.append("inserted \(results.map(\.inserted))")
      func name(_ id: JobID) -> String { "\(ids.firstIndex(of: id).map(String.init) ?? "?")" }
      let lease = Lease(owner: "wx", duration: .seconds(30))
      var pending: [JobSettlement] = []
      for step in 0..<12 {
        let batch = try await store.settleAndClaim(pending, queue: "o", limit: 2, lease: lease, clock: clock)
        pending = []
        for (index, job) in batch.claimed.enumerated() {
          log.append(
            "step \(step) claimed \(name(job.id)) attempts \(job.attempts) runAt \(job.runAt.timeIntervalSince(start)) "
              + "payload-ok \(job.payload == jobs[ids.firstIndex(of: job.id)!].payload) owner \(job.leaseOwner ?? "-")"
          )
          let action: JobSettlement.Action =
            switch (step + index) % 4 {
            case 0: .complete
            case 1: .retry(after: .seconds(3), error: "err")
            case 2: .release(error: nil)
            default: .retry(after: .seconds(Int64.max), error: nil)
            }
          pending.append(JobSettlement(claim: job.claim, action: action))
        }
        clock.advance(by: .seconds(2))
      }
      _ = try await store.settleAndClaim(pending, queue: "o", limit: 0, lease: lease, clock: clock)
      let counts = try await store.counts(queue: "o", clock: clock)
      log.append("counts \(counts)")
      for record in try await store.jobs(queue: "o", status: nil, after: nil, limit: 100) {
        log.append(
          "left \(name(record.id)) \(record.status) runAt \(record.runAt.timeIntervalSince1970) "
            + "error \(record.lastError ?? "-") key \(record.deduplicationKey.map { Array($0.utf8) } ?? [])")
      }
      let wake = try await store.nextWake(queue: "o", clock: clock)
      log.append("wake \(wake.nextRun.map { $0.timeIntervalSince(start) } ?? -1)")
      return log
    }
    let reference = try await scenario(memory)
    let actual = try await scenario(postgres)
    let lines = max(reference.count, actual.count)
    for line in 0..<lines {
      let expected = line < reference.count ? reference[line] : "<none>"
      let got = line < actual.count ? actual[line] : "<none>"
      #expect(got == expected, "line \(line)")
    }
    await postgres.close()
  }

  // MARK: Clocks

  /// A worker whose own clock is an hour ahead neither rescues a live lease nor runs a scheduled
  /// job early (the database clock decides).
  @Test func anOffsetClockNeitherStealsLeasesNorRunsScheduledJobsEarly() async throws {
    let server = try await PostgresServer.shared()
    let store = try await openStore(server)
    let ahead = ManualJobClock(start: Date().addingTimeInterval(3600))
    let lease = Lease(owner: "w", duration: .seconds(30))
    _ = try await store.enqueue([NewJob(payload: Data("now".utf8))], queue: "c", clock: SystemJobClock())
    _ = try await store.enqueue(
      [NewJob(payload: Data("later".utf8), runTime: .after(.seconds(600)))], queue: "c", clock: ahead)
    let batch = try await store.settleAndClaim(
      [], queue: "c", limit: 10, lease: lease, clock: SystemJobClock())
    #expect(batch.claimed.map(\.payload) == [Data("now".utf8)])
    #expect(try await store.rescueExpiredLeases(queue: "c", clock: ahead) == 0)
    let again = try await store.settleAndClaim([], queue: "c", limit: 10, lease: lease, clock: ahead)
    #expect(again.claimed.isEmpty)
    let counts = try await store.counts(queue: "c", clock: ahead)
    #expect(counts == JobCounts(ready: 0, scheduled: 1, running: 1, dead: 0))
    await store.close()
  }

  // MARK: The SQL enqueue function

  @Test func theEnqueueFunctionWithHostileTextIsOnlyData() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("fn")
    let store = try await openStore(server, schema: schema)
    let admin = try AdminConnection(server.url)
    let hostile = "x'); DROP TABLE \(schema).jobs; --"
    let quoted = hostile.replacingOccurrences(of: "'", with: "''")
    let id = try admin.scalar("SELECT \(schema).enqueue('fq', 'payload', 0, NULL, '\(quoted)')")
    let same = try await store.enqueue(
      [NewJob(payload: Data("p".utf8), deduplicationKey: hostile)], queue: "fq", clock: SystemJobClock())
    #expect(same[0].inserted == false && "\(same[0].id)" == id, "the function and the store share dedup keys")
    #expect(throws: (any Error).self) { try admin.query("SELECT \(schema).enqueue('\(quoted)', 'p')") }
    try admin.query("BEGIN")
    _ = try admin.scalar("SELECT \(schema).enqueue('fq', 'rolled back')")
    try admin.query("ROLLBACK")
    #expect(try await store.counts(queue: "fq", clock: SystemJobClock()).total == 1)
    await store.close()
  }

  // DEFECT: the SQL `enqueue` function stores any run date the caller passes, `'infinity'` and
  // dates after the year 9999 included (SQL.swift version1, `when_ := date_trunc(…, run_at)`),
  // while every store keeps dates clamped to `JobStoreTime.earliest...latest` ("Later dates (and
  // infinity) are clamped", JobStore.swift). The store then reports run dates no other store can
  // hold (year ~294,000), in listings and in `nextWake`.
  @Test func runDatesFromTheEnqueueFunctionAreClampedLikeTheStores() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("inf")
    let store = try await openStore(server, schema: schema)
    let admin = try AdminConnection(server.url)
    _ = try admin.scalar("SELECT \(schema).enqueue('iq', 'forever', 0, 'infinity')")
    _ = try admin.scalar("SELECT \(schema).enqueue('iq', 'far', 0, '20000-01-01 00:00:00+00')")
    _ = try await store.enqueue(
      [NewJob(payload: Data("store".utf8), runAt: .distantFuture)], queue: "iq", clock: SystemJobClock())
    let records = try await store.jobs(queue: "iq", status: nil, after: nil, limit: 10)
    #expect(records.count == 3)
    for record in records {
      #expect(
        record.runAt <= JobStoreTime.latest,
        "\(String(decoding: record.payload, as: UTF8.self)) runs at \(record.runAt.timeIntervalSince1970)")
    }
    let wake = try await store.nextWake(queue: "iq", clock: SystemJobClock())
    #expect(
      wake.nextRun.map { $0 <= JobStoreTime.latest.addingTimeInterval(60) } == true,
      "\(String(describing: wake))")
    await store.close()
  }

  /// A call that is reconnecting to a stopped server ends promptly when its task is cancelled.
  @Test func cancellingACallThatIsReconnectingEndsIt() async throws {
    let server = try await PostgresServer.start()
    defer { server.stop() }
    let store = try await PostgresJobStore.open(
      url: server.url, options: .init(schema: uniqueSchema("rc"), reconnectTimeout: .seconds(120)))
    _ = try await store.counts(queue: "r", clock: SystemJobClock())
    try server.control(["stop", "-m", "immediate", "-w"])
    let finished = Flag()
    let call = Task {
      defer { finished.set() }
      _ = try await store.counts(queue: "r", clock: SystemJobClock())
    }
    try await Task.sleep(for: .seconds(2))
    #expect(!finished.isSet, "still reconnecting")
    call.cancel()
    #expect(await becomes(finished, within: 3), "cancellation ends the reconnect")
    let result = await call.result
    #expect(throws: (any Error).self) { try result.get() }
    await store.close()
  }

  // MARK: Broken connections mid-transaction

  /// The store's backend is terminated while its settle-and-claim transaction waits for a row
  /// lock: after the reconnect the call completes, and the job is neither stuck nor lost.
  @Test func terminatingTheBackendDuringAClaimTransactionLeavesNothingStuck() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("term")
    let store = try await openStore(server, schema: schema)
    let clock = SystemJobClock()
    let lease = Lease(owner: "w", duration: .seconds(30))
    _ = try await store.enqueue(
      [NewJob(payload: Data("1".utf8)), NewJob(payload: Data("2".utf8))], queue: "t", clock: clock)
    let first = try await store.settleAndClaim([], queue: "t", limit: 1, lease: lease, clock: clock).claimed[
      0]
    let admin = try AdminConnection(server.url)
    try admin.query("BEGIN")
    try admin.query("SELECT id FROM \(schema).jobs WHERE id = \(first.id) FOR UPDATE")
    let call = Task {
      try await store.settleAndClaim(
        [JobSettlement(claim: first.claim, action: .complete)], queue: "t", limit: 1, lease: lease,
        clock: clock)
    }
    try await Task.sleep(for: .milliseconds(500))
    let killer = try AdminConnection(server.url)
    let killed = try killer.query(
      "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '\(schema)' "
        + "AND backend_type = 'client backend'")
    #expect(killed.count == 1)
    try await Task.sleep(for: .milliseconds(300))
    try admin.query("COMMIT")
    let batch = try await call.value
    let counts = try await store.counts(queue: "t", clock: clock)
    // Either the settlement applied and the second job was claimed, or (answer lost) it is
    // reported stale; in no case is a job left neither running nor waiting nor done.
    #expect(counts.total == 1 || counts.total == 2, "\(counts) \(batch)")
    #expect(counts.running == counts.total || counts.ready + counts.running == counts.total)
    await store.close()
  }
}
