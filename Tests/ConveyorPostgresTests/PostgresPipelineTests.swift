import Conveyor
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import ConveyorPostgres

/// The store's one-round-trip claim: statements sent together (libpq's pipeline mode) run as one
/// transaction, fail as one at whatever position, and leave the connection usable; a cancelled
/// call stops the statement it waits in; a pause stops it; ten thousand settlements fit in one;
/// its generic plans use their indexes on a big queue; the watchdog aborts no call that finishes in
/// time.
@Suite("PostgreSQL pipelines", .serialized)
struct PostgresPipelineTests {
  // Failed before the fix: prepared statements were found by `String` equality, which takes
  // canonically equivalent texts (a precomposed and a decomposed "é") for one, so the second text
  // ran the first one's statement (the same defect as in the SQLite store's statement cache).
  @Test func textsThatDifferOnlyInTheirUnicodeFormGetStatementsOfTheirOwn() async throws {
    let server = try await PostgresServer.shared()
    let connection = try Connection(conninfo: server.url, scrubber: Scrubber(secrets: []))
    let composed = "SELECT '\u{e9}' || $1::text"
    let decomposed = "SELECT 'e\u{301}' || $1::text"
    #expect(composed == decomposed, "Swift calls them equal")
    let first = try connection.execute(composed, [.text("!")]).text(0, 0)
    let second = try connection.execute(decomposed, [.text("!")]).text(0, 0)
    #expect(first.map { Array($0.utf8) } == Array("\u{e9}!".utf8))
    #expect(
      second.map { Array($0.utf8) } == Array("e\u{301}!".utf8),
      "the decomposed text ran the other's statement")
  }

  @Test func aFailingStatementRollsBackTheWholePipelineAndTheConnectionStaysUsable() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("pipe")
    let connection = try Connection(conninfo: server.url, scrubber: Scrubber(secrets: []))
    try connection.executeScript("CREATE SCHEMA \(schema); CREATE TABLE \(schema).t (v int8)")
    let insert = "INSERT INTO \(schema).t VALUES ($1)"
    #expect {
      _ = try connection.pipeline([
        (insert, [.int64(1)]),
        ("SELECT 1 / $1::int8", [.int64(0)]),
        (insert, [.int64(2)]),
      ])
    } throws: { ($0 as? PostgresError)?.sqlState == "22012" }
    let count = "SELECT count(*)::int8 FROM \(schema).t WHERE v > $1"
    #expect(try connection.execute(count, [.int64(0)]).int64(0, 0) == 0, "the first insert was rolled back")
    #expect(connection.isHealthy, "the connection left pipeline mode and is idle")

    let results = try connection.pipeline([
      (insert, [.int64(1)]),
      (insert, [.int64(2)]),
      ("SELECT sum(v)::int8 FROM \(schema).t WHERE v > $1", [.int64(0)]),
    ])
    #expect(results.count == 3)
    #expect(results[2].int64(0, 0) == 3, "each statement sees the ones before it")
    #expect(try connection.execute(count, [.int64(0)]).int64(0, 0) == 2, "committed at the end")
    try connection.executeScript("DROP SCHEMA \(schema) CASCADE")
  }

  @Test func cancellingAClaimThatWaitsForALockStopsItAndCommitsNothing() async throws {
    let server = try await PostgresServer.shared()
    let store = try await PostgresJobStore.open(
      url: server.url, options: .init(schema: uniqueSchema(), lockTimeout: .seconds(600)))
    let schema = store.options.schema
    let clock = SystemJobClock()
    let lease = Lease(owner: "w", duration: .seconds(60))
    _ = try await store.enqueue([NewJob(payload: Data("{}".utf8))], queue: "q", clock: clock)
    let job = try #require(
      try await store.settleAndClaim([], queue: "q", limit: 1, lease: lease, clock: clock).claimed.first)
    // Another connection holds the job's row, so the settlement waits for its lock (up to 600 s).
    let holder = try AdminConnection(server.url)
    try holder.query("BEGIN")
    try holder.query("SELECT * FROM \(schema).jobs WHERE id = \(job.id.rawValue) FOR UPDATE")
    let settlement = JobSettlement(claim: job.claim, action: .complete)
    let call = Task {
      try await store.settleAndClaim([settlement], queue: "q", limit: 1, lease: lease, clock: clock)
    }
    try await Task.sleep(for: .milliseconds(300))
    call.cancel()
    await #expect(throws: CancellationError.self) { try await call.value }
    try holder.query("ROLLBACK")
    #expect(try await store.counts(queue: "q", clock: clock).running == 1, "nothing was settled")
    // The store still works, and the settlement applies now.
    let batch = try await store.settleAndClaim([settlement], queue: "q", limit: 1, lease: lease, clock: clock)
    #expect(batch.staleSettlements.isEmpty)
    #expect(try await store.counts(queue: "q", clock: clock) == JobCounts(completed: 1))
    await store.close()
  }

  struct Item: Queueable { var number: Int }

  let lease = Lease(owner: "w", duration: .seconds(600))
  let clock = SystemJobClock()

  func open(
    _ schema: String? = nil, lockTimeout: Duration = .seconds(5), callTimeout: Duration? = .seconds(60)
  )
    async throws -> (PostgresServer, PostgresJobStore)
  {
    let server = try await PostgresServer.shared()
    let schema = schema ?? uniqueSchema("rpipe")
    // Named after the schema, so a test finds its own backends among the other tests' ones.
    let store = try await PostgresJobStore.open(
      url: server.url + "?application_name=\(schema)",
      options: .init(schema: schema, lockTimeout: lockTimeout, callTimeout: callTimeout))
    return (server, store)
  }

  func add(_ count: Int, to store: PostgresJobStore, queue: String = "q", runTime: RunTime = .now)
    async throws
  {
    _ = try await store.enqueue(
      (0..<count).map { NewJob(payload: Data("{\"number\":\($0)}".utf8), runTime: runTime) }, queue: queue,
      clock: clock)
  }

  /// Waits (up to 20 s) until a backend of the store using `schema` (its `application_name`)
  /// waits for a lock. (Any backend, before: on the shared server that was at times another test's,
  /// whose call then broke.)
  func waitForLockWaiter(_ admin: AdminConnection, schema: String) async throws -> String {
    for _ in 0..<200 {
      if let pid = try admin.scalar(
        """
        SELECT pid FROM pg_stat_activity
        WHERE wait_event_type = 'Lock' AND application_name = '\(schema)' LIMIT 1
        """)
      {
        return pid
      }
      try await Task.sleep(for: .milliseconds(100))
    }
    throw HarnessError("no backend waits for a lock")
  }

  // MARK: Failures at each position of the pipeline

  // The settlement (first statement) times out on a row lock: nothing after it runs.
  @Test func aSettlementThatTimesOutRollsBackPromotionAndClaim() async throws {
    let (server, store) = try await open(lockTimeout: .milliseconds(300))
    let schema = store.options.schema
    try await add(2, to: store)
    let job = try #require(
      try await store.settleAndClaim([], queue: "q", limit: 1, lease: lease, clock: clock).claimed.first)
    // A scheduled job that falls due: a promotion that committed would make it ready.
    _ = try await store.enqueue(
      [NewJob(payload: Data("{}".utf8), runTime: .after(.milliseconds(1)))], queue: "q", clock: clock)
    try await Task.sleep(for: .milliseconds(50))
    let holder = try AdminConnection(server.url)
    try holder.query("BEGIN")
    try holder.query("SELECT 1 FROM \(schema).jobs WHERE id = \(job.id.rawValue) FOR UPDATE")
    await #expect(throws: PostgresError.self) {
      _ = try await store.settleAndClaim(
        [JobSettlement(claim: job.claim, action: .complete)], queue: "q", limit: 5, lease: lease, clock: clock
      )
    }
    try holder.query("ROLLBACK")
    let admin = try AdminConnection(server.url)
    let statuses = try admin.query(
      "SELECT status, count(*) FROM \(schema).jobs GROUP BY status ORDER BY status")
    #expect(
      statuses.map { "\($0[0]!)=\($0[1]!)" } == ["ready=1", "running=1", "scheduled=1"],
      "nothing committed: \(statuses)")
    // The store works after the failure, and the settlement applies once.
    let batch = try await store.settleAndClaim(
      [JobSettlement(claim: job.claim, action: .complete)], queue: "q", limit: 5, lease: lease, clock: clock)
    #expect(batch.staleSettlements.isEmpty)
    #expect(batch.claimed.count == 2)
    await store.close()
  }

  // The promotion (after settle and notify) times out on the queues table: the settlement
  // before it is rolled back.
  @Test func aPromotionThatTimesOutRollsBackTheSettlementBeforeIt() async throws {
    let (server, store) = try await open(lockTimeout: .milliseconds(300))
    let schema = store.options.schema
    try await add(2, to: store)
    let job = try #require(
      try await store.settleAndClaim([], queue: "q", limit: 1, lease: lease, clock: clock).claimed.first)
    let holder = try AdminConnection(server.url)
    try holder.query("BEGIN")
    try holder.query("LOCK TABLE \(schema).queues IN ACCESS EXCLUSIVE MODE")
    await #expect(throws: PostgresError.self) {
      _ = try await store.settleAndClaim(
        [JobSettlement(claim: job.claim, action: .retry(after: .zero, error: "boom"))], queue: "q", limit: 5,
        lease: lease, clock: clock)
    }
    try holder.query("ROLLBACK")
    let record = try #require(try await store.job(job.id))
    #expect(record.status == .running && record.lastError == nil, "the retry was rolled back: \(record)")
    #expect(try await store.counts(queue: "q", clock: clock) == JobCounts(ready: 1, running: 1))
    await store.close()
  }

  // Cancelled while the promotion waits for the queues table: nothing commits.
  @Test func cancellingWhileThePromotionWaitsCommitsNothing() async throws {
    let (server, store) = try await open(lockTimeout: .seconds(600))
    let schema = store.options.schema
    try await add(2, to: store)
    let job = try #require(
      try await store.settleAndClaim([], queue: "q", limit: 1, lease: lease, clock: clock).claimed.first)
    let holder = try AdminConnection(server.url)
    try holder.query("BEGIN")
    try holder.query("LOCK TABLE \(schema).queues IN ACCESS EXCLUSIVE MODE")
    let settlement = JobSettlement(claim: job.claim, action: .complete)
    let call = Task {
      try await store.settleAndClaim([settlement], queue: "q", limit: 1, lease: lease, clock: clock)
    }
    _ = try await waitForLockWaiter(holder, schema: schema)
    call.cancel()
    await #expect(throws: CancellationError.self) { try await call.value }
    try holder.query("ROLLBACK")
    #expect(try await store.counts(queue: "q", clock: clock) == JobCounts(ready: 1, running: 1))
    let batch = try await store.settleAndClaim([settlement], queue: "q", limit: 1, lease: lease, clock: clock)
    #expect(batch.staleSettlements.isEmpty && batch.claimed.count == 1)
    await store.close()
  }

  // The backend is terminated while the settlement waits for a row lock: the settlement
  // applies exactly once (applied, or reported stale after a rerun), and a job is claimed.
  @Test func aBackendTerminatedMidPipelineAppliesTheSettlementOnce() async throws {
    let (server, store) = try await open(lockTimeout: .seconds(600))
    let schema = store.options.schema
    try await add(3, to: store)
    let job = try #require(
      try await store.settleAndClaim([], queue: "q", limit: 1, lease: lease, clock: clock).claimed.first)
    let holder = try AdminConnection(server.url)
    try holder.query("BEGIN")
    try holder.query("SELECT 1 FROM \(schema).jobs WHERE id = \(job.id.rawValue) FOR UPDATE")
    let call = Task {
      try await store.settleAndClaim(
        [JobSettlement(claim: job.claim, action: .retry(after: .zero, error: "again"))], queue: "q", limit: 1,
        lease: lease, clock: clock)
    }
    let first = try await waitForLockWaiter(holder, schema: schema)
    // (On this server a backend waiting for a row lock outlives pg_terminate_backend until the
    // lock is released, pipelined or not; the call then either finishes or runs again.)
    let killer = try AdminConnection(server.url)
    try killer.query("SELECT pg_terminate_backend(\(first))")
    try await Task.sleep(for: .milliseconds(300))
    try holder.query("ROLLBACK")
    let batch = try await call.value
    #expect(batch.claimed.count == 1)
    let record = try #require(try await store.job(job.id))
    #expect(record.lastError == "again" && record.attempts == 1, "\(record)")
    await store.close()
  }

  // A statement invalidated by a column type change fails at the claim, after the
  // settlement ran: the rerun applies the settlement once.
  @Test func aStalePreparedClaimAfterASettlementRerunsTheWholePipelineOnce() async throws {
    let (server, store) = try await open()
    let schema = store.options.schema
    try await add(3, to: store)
    let first = try await store.settleAndClaim([], queue: "q", limit: 1, lease: lease, clock: clock)
    let job = try #require(first.claimed.first)
    try AdminConnection(server.url).query("ALTER TABLE \(schema).jobs ALTER COLUMN last_error TYPE varchar")
    let batch = try await store.settleAndClaim(
      [JobSettlement(claim: job.claim, action: .retry(after: .seconds(3600), error: "e"))], queue: "q",
      limit: 1,
      lease: lease, clock: clock)
    #expect(batch.staleSettlements.isEmpty, "the settlement applied (the failed run was rolled back)")
    #expect(batch.claimed.count == 1)
    #expect(try await store.counts(queue: "q", clock: clock) == JobCounts(ready: 1, scheduled: 1, running: 1))
    await store.close()
  }

  // MARK: Pause

  // Two stores claim one job at a time while the queue is paused: once `setPaused(true)`
  // returned, a claim started after it takes nothing and reports paused; no job is claimed twice;
  // after the resume every job is claimed exactly once.
  @Test func aPauseStopsEveryWorkerAndAResumeRestartsThem() async throws {
    let (server, first) = try await open()
    let second = try await PostgresJobStore.open(
      url: server.url, options: .init(schema: first.options.schema))
    try await add(300, to: first)
    let pausedAt = Atomic<Bool>(false)
    let resumed = Atomic<Bool>(false)
    let violations = Mutex<[String]>([])
    let claimedIDs = Mutex<[Int64]>([])
    let lease = self.lease
    let clock = self.clock
    let worker: @Sendable (PostgresJobStore, String) async throws -> Void = { store, name in
      var previous: JobRecord?
      var emptyAfterResume = 0
      while emptyAfterResume < 3 {
        let afterPause = pausedAt.load(ordering: .sequentiallyConsistent)
        let batch = try await store.settleAndClaim(
          previous.map { [JobSettlement(claim: $0.claim, action: .complete)] } ?? [], queue: "q", limit: 1,
          lease: lease, clock: clock)
        // Read after the call: a resume begun during it may have let it claim.
        let afterResume = resumed.load(ordering: .sequentiallyConsistent)
        if !batch.staleSettlements.isEmpty { violations.withLock { $0.append("\(name): stale \(batch)") } }
        if afterPause && !afterResume && !batch.claimed.isEmpty {
          violations.withLock {
            $0.append("\(name) claimed \(batch.claimed.map(\.id)) after the pause returned")
          }
        }
        if afterPause && !afterResume && !batch.paused {
          violations.withLock { $0.append("\(name): not reported paused after the pause returned") }
        }
        claimedIDs.withLock { $0 += batch.claimed.map(\.id.rawValue) }
        previous = batch.claimed.first
        if afterResume && batch.claimed.isEmpty && !batch.paused { emptyAfterResume += 1 }
        if afterPause && !afterResume { try await Task.sleep(for: .milliseconds(5)) }
      }
    }
    let workers = [Task { try await worker(first, "first") }, Task { try await worker(second, "second") }]
    try await Task.sleep(for: .milliseconds(200))
    try await first.setPaused(true, queue: "q")
    pausedAt.store(true, ordering: .sequentiallyConsistent)
    try await Task.sleep(for: .milliseconds(500))
    resumed.store(true, ordering: .sequentiallyConsistent)  // before the resume begins
    try await second.setPaused(false, queue: "q")
    for worker in workers { try await worker.value }
    let ids = claimedIDs.withLock { $0 }
    #expect(violations.withLock { $0 }.isEmpty, "\(violations.withLock { $0 })")
    #expect(ids.count == Set(ids).count, "a job was claimed twice")
    #expect(Set(ids).count == 300, "every job was claimed once: \(Set(ids).count)")
    #expect(try await first.counts(queue: "q", clock: clock) == JobCounts(completed: 300))
    await first.close()
    await second.close()
  }

  // Failed before the fix: a JobQueue on a paused PostgreSQL queue with a ready job spins: the claim reports
  // paused, then `nextWake` (which never reads the pause flag: `WakeHint.paused` stays false)
  // clears the engine's paused state, a ready job is due, so the loop claims again at once.
  @Test func anIdleQueueOnAPausedQueueDoesNotSpinAndStaysPaused() async throws {
    let (_, store) = try await open()
    try await store.setPaused(true, queue: "paused")
    try await add(1, to: store, queue: "paused")
    let instrumented = InstrumentedJobStore(store)
    let states = Mutex<Set<JobQueueState>>([])
    let jobQueue = try JobQueue<Item>(
      configuration: JobQueueConfiguration(identifier: "paused", pollInterval: .seconds(30)),
      store: instrumented
    ) { _, _ in
      Issue.record("a job started on a paused queue")
      return .handled
    }
    // Once the queue has learnt of the pause, sample the published state while the loop runs.
    try await eventually("the queue reports the pause") { jobQueue.state == .paused }
    instrumented.resetCalls()
    for _ in 0..<40 {
      try await Task.sleep(for: .milliseconds(25))
      let state = jobQueue.state
      states.withLock { _ = $0.insert(state) }
    }
    let calls = instrumented.calls
    await jobQueue.shutdown(gracePeriod: .seconds(1))
    // With a 30 s poll, an idle paused queue asks the store a handful of times in a second.
    #expect(
      calls["settleAndClaim", default: 0] + calls["nextWake", default: 0] < 50,
      "store calls in 1 s on a paused, idle queue: \(calls)")
    #expect(!states.withLock { $0 }.contains(.idle), "published states: \(states.withLock { $0 })")
    #expect(try await store.counts(queue: "paused", clock: clock).ready == 1)
    await store.close()
  }

  // MARK: Sizes

  // 10,000 settlements (completes, retries, releases, kills) in one pipelined call.
  @Test func tenThousandSettlementsInOneCall() async throws {
    let (_, store) = try await open()
    try await add(10_005, to: store)
    let claimed = try await store.settleAndClaim([], queue: "q", limit: 10_000, lease: lease, clock: clock)
      .claimed
    #expect(claimed.count == 10_000)
    let settlements = claimed.enumerated().map { index, job -> JobSettlement in
      let action: JobSettlement.Action =
        switch index % 4 {
        case 0: .complete
        case 1: .retry(after: .seconds(3600), error: String(repeating: "x", count: 100))
        case 2: .release(error: nil)
        default: .kill(error: "dead")
        }
      return JobSettlement(claim: job.claim, action: action)
    }
    let batch = try await store.settleAndClaim(settlements, queue: "q", limit: 10, lease: lease, clock: clock)
    #expect(batch.staleSettlements.isEmpty, "\(batch.staleSettlements.count) stale")
    #expect(batch.claimed.count == 10)
    // Ready after: 5 never claimed + 2,500 released - 10 claimed now.
    #expect(
      try await store.counts(queue: "q", clock: clock)
        == JobCounts(ready: 2_495, scheduled: 2_500, running: 10, dead: 2_500, completed: 2_500))
    await store.close()
  }

  // MARK: Generic plans

  // Failed before the fix: the hot statements are prepared and keep the server's generic plan, which is made
  // once (after five executions) and kept until an ANALYZE invalidates it. Made while the queue
  // was small, the claim's generic plan looks the picked IDs up with a Seq Scan on jobs
  // (`id = ANY($3)` as a filter), promote and rescue scan the table twice, nextWake scans it for
  // the scheduled and running dates: on 200,000 jobs every claim reads the whole table.
  @Test func genericPlansMadeOnASmallQueueStillUseTheirIndexesOnABigOne() async throws {
    let (server, store) = try await open()
    let schema = store.options.schema
    let admin = try AdminConnection(server.url)
    try await add(40, to: store)
    // The statistics stay those of this ANALYZE: an autovacuum's ANALYZE during the rounds below
    // (seen once in a loaded CI run: a `complete` plan made for 80 rows) would change the plans
    // this test looks at from run to run.
    try await admin.queryOffPool("ALTER TABLE \(schema).jobs SET (autovacuum_enabled = false)")
    try await admin.queryOffPool("VACUUM ANALYZE \(schema).jobs")
    // A worker's first calls on the small queue: more than five, so the server settles on a plan.
    var previous: [JobRecord] = []
    for round in 0..<16 {
      let batch = try await store.settleAndClaim(
        // Completions alone take their own statement (even rounds); a retry among them takes the
        // general one (odd rounds).
        previous.enumerated().map { index, job in
          JobSettlement(
            claim: job.claim,
            action: round % 2 == 0 || index == 0 ? .complete : .retry(after: .zero, error: nil))
        }, queue: "q", limit: 2,
        lease: lease,
        clock: clock)
      previous = batch.claimed
      _ = try await store.heartbeat(previous.map(\.claim), queue: "q", lease: lease, clock: clock)
      _ = try await store.nextWake(queue: "q", clock: clock)
      _ = try await store.rescueExpiredLeases(queue: "q", clock: clock)
    }
    // The backlog grows (no ANALYZE since).
    try await admin.queryOffPool(
      """
      INSERT INTO \(schema).jobs (queue, payload, status, run_at, created_at)
      SELECT 'q', '\\x7b7d'::bytea, CASE WHEN i % 20 = 0 THEN 'scheduled' ELSE 'ready' END,
        CASE WHEN i % 20 = 0 THEN now() + interval '1 hour' ELSE now() END, now()
      FROM generate_series(1, 200000) AS i
      """)
    let sql = store.sql
    let statements: [(String, String, String)] = [
      ("claim", sql.claim, "('q', 2::int8, 'w', 600000::int8, NULL::timestamptz)"),
      ("promote", sql.promote, "('q', NULL::timestamptz)"),
      ("rescue", sql.rescue, "('q', NULL::timestamptz)"),
      ("nextWake", sql.nextWake, "('q', NULL::timestamptz, NULL::int8)"),
      (
        "settle", sql.settle,
        "('{1,2}'::int8[], '{1,1}'::int8[], '{0,1}'::int4[], '{NULL,10}'::int8[], '{NULL,NULL}'::text[], "
          + "NULL::timestamptz, 'q', '{NULL,NULL}'::int8[], '{NULL,NULL}'::bytea[])"
      ),
      (
        "complete", sql.complete,
        "('{1,2}'::int8[], '{1,1}'::int8[], 'q', '{NULL,NULL}'::int8[], '{NULL,NULL}'::bytea[], NULL::timestamptz)"
      ),
      (
        "heartbeat", sql.heartbeat, "('{1,2}'::int8[], '{1,1}'::int8[], 600000::int8, NULL::timestamptz, 'q')"
      ),
    ]
    let plans = try await store.connection.perform(idempotent: true) { db -> [(String, String)] in
      let prepared = try db.execute("SELECT name, statement FROM pg_prepared_statements", prepared: false)
      var plans: [(String, String)] = []
      for (label, text, arguments) in statements {
        guard
          let row = (0..<prepared.count).first(where: { prepared.text($0, 1) == text }),
          let name = prepared.text(row, 0)
        else {
          plans.append((label, "not prepared"))
          continue
        }
        let rows = try db.execute("EXPLAIN EXECUTE \(name)\(arguments)", prepared: false)
        plans.append((label, (0..<rows.count).compactMap { rows.text($0, 0) }.joined(separator: "\n")))
      }
      return plans
    }
    for (label, plan) in plans {
      #expect(plan != "not prepared", "\(label) was not prepared")
      #expect(
        !plan.contains("Seq Scan on jobs"),
        "\(label) (plan kept from the small queue) scans the jobs table:\n\(plan)")
      let lines = plan.split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) }
      let walks = zip(lines, lines.dropFirst() + [""]).contains { line, next in
        line.contains("Index Scan using jobs_") && !next.hasPrefix("Index Cond:")
      }
      #expect(!walks, "\(label) (plan kept from the small queue) reads an index from end to end:\n\(plan)")
    }
    await store.close()
  }

  // MARK: Watchdog

  // Calls that finish close to the call timeout, each followed at once by another, are never
  // aborted by a late tick: the connection (its backend) stays the same.
  @Test func callsThatFinishNearTheTimeoutAreNeverAborted() async throws {
    // A second of margin between the call and its timeout, so a loaded machine cannot make the
    // call itself run out of time; the watchdog still ticks ten times per timeout.
    let (_, store) = try await open(callTimeout: .seconds(2))
    let pid = { () async throws -> Int64 in
      try await store.connection.perform(idempotent: true) { db in
        try db.execute("SELECT pg_backend_pid()::int8", prepared: false).int64(0, 0)
      }
    }
    let backend = try await pid()
    for round in 0..<4 {
      // Finishes well before the deadline, then quick calls start at once.
      try await store.connection.perform(idempotent: true) { db in
        _ = try db.execute("SELECT pg_sleep(0.9)", prepared: false)
      }
      for _ in 0..<20 { _ = try await store.counts(queue: "q", clock: clock) }
      #expect(
        try await pid() == backend, "round \(round): the connection was aborted after its call finished")
    }
    await store.close()
  }

  // The store, its connection and its watchdog are freed with the store.
  @Test func theSerializedConnectionIsFreedWithTheStore() async throws {
    weak var weakConnection: SerializedConnection?
    do {
      let (_, store) = try await open(callTimeout: .milliseconds(100))
      weakConnection = store.connection
      _ = try await store.counts(queue: "q", clock: clock)
      await store.close()
    }
    for _ in 0..<500 where weakConnection != nil { try await Task.sleep(for: .milliseconds(20)) }
    #expect(weakConnection == nil, "the connection (and its repeating watchdog) outlived the store")
  }

  /// The store's backend is terminated while its settle-and-claim transaction waits for a row
  /// lock: after the reconnect the call completes, and the job is neither stuck nor lost.
  @Test func terminatingTheBackendDuringAClaimTransactionLeavesNothingStuck() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("term")
    let store = try await openNamedStore(server, .init(schema: schema))
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
