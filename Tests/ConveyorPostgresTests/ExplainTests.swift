import Conveyor
import Foundation
import Testing

@testable import ConveyorPostgres

/// The plans of the store's hot statements on a realistic backlog: each uses the index it is
/// written for, and none reads the jobs table from end to end.
///
/// The table holds 300,000 jobs (a big queue of mostly ready jobs with some scheduled, running and
/// dead ones, beside a smaller queue), vacuumed and analyzed as autovacuum leaves a busy table.
/// Each statement is prepared with the store's exact text and explained with the parameter values
/// a worker sends, planned for those values and, for the statements the store prepares, also with
/// the plan made once for every value (a generic plan), which is the one the store's connections
/// use (`plan_cache_mode = force_generic_plan`).
@Suite("PostgresJobStore plans", .serialized)
struct ExplainTests {
  struct Case {
    var name: String
    var prepare: String
    var execute: String
    var indexes: [String]
    /// Whether the store prepares it (listings are planned for their values each time).
    var prepared = true
  }

  @Test func hotStatementsUseTheirIndexesAndNeverScanTheJobsTable() async throws {
    let (schema, store, admin) = try await plansStore()
    let sql = store.sql
    let now = "date_trunc('milliseconds', now())"
    // 270k in 'big': 250k ready, 10k scheduled an hour ahead, 5k running, 5k dead; 30k ready in
    // 'small'. A tenth of the jobs have a deduplication key.
    try await admin.queryOffPool(
      """
      INSERT INTO \(schema).jobs (queue, payload, status, priority, attempts, run_at, created_at, dedup_key,
        lease_owner, lease_expires_at)
      SELECT CASE WHEN i <= 270000 THEN 'big' ELSE 'small' END, '\\x7b7d'::bytea,
        CASE WHEN i <= 250000 OR i > 270000 THEN 'ready' WHEN i <= 260000 THEN 'scheduled'
          WHEN i <= 265000 THEN 'running' ELSE 'dead' END,
        i % 3, 0,
        CASE WHEN i > 250000 AND i <= 260000 THEN \(now) + interval '1 hour' ELSE \(now) - interval '1 day' END,
        \(now), CASE WHEN i % 10 = 0 THEN convert_to('key-' || i, 'UTF8') END,
        CASE WHEN i > 260000 AND i <= 265000 THEN 'w' END,
        CASE WHEN i > 260000 AND i <= 265000 THEN \(now) + interval '1 minute' END
      FROM generate_series(1, 300000) AS i
      """)
    try await admin.queryOffPool("VACUUM ANALYZE \(schema).jobs")

    // EXECUTE takes no subqueries: the 100 IDs of a batch as a literal.
    let ids = "'{\((1...100).map(String.init).joined(separator: ","))}'::int8[]"
    let tokens = "array_fill(1::int8, ARRAY[100])"
    let cases = [
      Case(
        name: "claim", prepare: "(text, int8, text, int8, timestamptz) AS \(sql.claim)",
        execute: "('big', 100, 'w', 60000, NULL)", indexes: ["jobs_ready"]),
      Case(
        name: "claim one", prepare: "(text, int8, text, int8, timestamptz) AS \(sql.claim)",
        execute: "('big', 1, 'w', 60000, NULL)", indexes: ["jobs_ready"]),
      Case(
        name: "promote", prepare: "(text, timestamptz) AS \(sql.promote)", execute: "('big', NULL)",
        indexes: ["jobs_scheduled"]),
      Case(
        name: "settle",
        prepare:
          "(int8[], int8[], int4[], int8[], text[], timestamptz, text, int8[], bytea[]) AS \(sql.settle)",
        execute:
          "(\(ids), \(tokens), array_fill(0, ARRAY[100]), array_fill(NULL::int8, ARRAY[100]), "
          + "array_fill(NULL::text, ARRAY[100]), NULL, 'big', array_fill(NULL::int8, ARRAY[100]), "
          + "array_fill(NULL::bytea, ARRAY[100]))",
        indexes: ["jobs_pkey"]),
      Case(
        name: "complete", prepare: "(int8[], int8[], text, int8[], bytea[], timestamptz) AS \(sql.complete)",
        execute:
          "(\(ids), \(tokens), 'big', array_fill(NULL::int8, ARRAY[100]), array_fill(NULL::bytea, ARRAY[100]), NULL)",
        indexes: ["jobs_pkey"]),
      Case(
        name: "complete without history", prepare: "(int8[], int8[], text) AS \(sql.completeWithoutHistory)",
        execute: "(\(ids), \(tokens), 'big')", indexes: ["jobs_pkey"]),
      Case(
        name: "prune", prepare: "(text, int8, timestamptz, int8) AS \(sql.prune("completed"))",
        execute: "('big', 86400000, NULL, 500)", indexes: ["jobs_finished"], prepared: false),
      Case(
        name: "history", prepare: "(text, int8, int8) AS \(sql.history("completed"))",
        execute: "('big', 5, 100)", indexes: ["jobs_finished"], prepared: false),
      Case(
        name: "heartbeat", prepare: "(int8[], int8[], int8, timestamptz, text) AS \(sql.heartbeat)",
        execute: "(\(ids), \(tokens), 60000, NULL, 'big')", indexes: ["jobs_pkey"]),
      Case(
        name: "rescue", prepare: "(text, timestamptz) AS \(sql.rescue)", execute: "('big', NULL)",
        indexes: ["jobs_status"]),
      Case(
        name: "counts", prepare: "(text, timestamptz) AS \(sql.counts)", execute: "('big', NULL)",
        indexes: ["jobs_ready", "jobs_scheduled", "jobs_status"]),
      Case(
        name: "nextWake", prepare: "(text, timestamptz, int8) AS \(sql.nextWake)",
        execute: "('big', NULL, NULL)",
        indexes: ["jobs_ready", "jobs_scheduled", "jobs_status"]),
      Case(
        name: "list all", prepare: "(text, int8, int8, text[]) AS \(sql.list)",
        execute: "('big', 1000, 100, NULL)", indexes: ["jobs_status"], prepared: false),
      Case(
        name: "list pending", prepare: "(text, int8, int8, text[]) AS \(sql.list)",
        execute: "('big', 1000, 100, ARRAY['ready', 'scheduled'])", indexes: ["jobs_status"], prepared: false),
      // Failed before the fix: the listing walked the primary key in ID order, filtering by queue,
      // so a page of the small queue (whose jobs come after the big one's) read 270,000 rows of
      // the big queue first.
      Case(
        name: "list pending of the small queue", prepare: "(text, int8, int8, text[]) AS \(sql.list)",
        execute: "('small', 0, 100, ARRAY['ready', 'scheduled'])", indexes: ["jobs_status"], prepared: false),
      Case(
        name: "list all of the small queue", prepare: "(text, int8, int8, text[]) AS \(sql.list)",
        execute: "('small', 0, 100, NULL)", indexes: ["jobs_status"], prepared: false),
      Case(
        name: "list running", prepare: "(text, int8, int8, text[]) AS \(sql.list)",
        execute: "('big', 0, 100, ARRAY['running'])", indexes: ["jobs_status"], prepared: false),
      Case(
        name: "list dead", prepare: "(text, int8, int8, text[]) AS \(sql.list)",
        execute: "('big', 0, 100, ARRAY['dead'])", indexes: ["jobs_status"], prepared: false),
      Case(
        name: "duplicates", prepare: "(text, bytea[]) AS \(sql.findDuplicates)",
        execute: "('big', ARRAY[convert_to('key-10', 'UTF8'), convert_to('key-20', 'UTF8')])",
        indexes: ["jobs_dedup"]),
      Case(name: "job", prepare: "(int8) AS \(sql.job)", execute: "(12345)", indexes: ["jobs_pkey"]),
      Case(
        name: "queueNames", prepare: "AS \(sql.queueNames)", execute: "", indexes: ["jobs_status"],
        prepared: false),
    ]
    for (number, test) in cases.enumerated() {
      try admin.query("PREPARE plan_\(number) \(test.prepare)")
      // Planned for the execution's values, and (for a statement the store prepares) once for
      // every value, as the server may plan it after a few executions.
      let modes = test.prepared ? ["force_custom_plan", "force_generic_plan"] : ["force_custom_plan"]
      for mode in modes {
        try admin.query("SET plan_cache_mode = \(mode)")
        let rows = try admin.query("EXPLAIN EXECUTE plan_\(number) \(test.execute)")
        let plan = rows.compactMap { $0.first ?? nil }.joined(separator: "\n")
        #expect(!plan.contains("Seq Scan on jobs"), "\(test.name) (\(mode)) scans the jobs table:\n\(plan)")
        // An index scan without a condition reads the whole index (a merge join did, once).
        let lines = plan.split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) }
        let walks = zip(lines, lines.dropFirst() + [""]).contains { line, next in
          line.contains("Index Scan using jobs_") && !next.hasPrefix("Index Cond:")
        }
        #expect(!walks, "\(test.name) (\(mode)) reads an index from end to end:\n\(plan)")
        for index in test.indexes {
          // "a|b": either index will do (both look each ID up).
          let found = index.split(separator: "|").contains { plan.contains(" \($0) ") }
          #expect(found, "\(test.name) (\(mode)) does not use \(index):\n\(plan)")
        }
      }
    }
    await store.close()
  }

  /// Ordering keys cost a claim nothing, however many jobs wait behind their key's first: with
  /// 100,000 held jobs behind 100,000 dead or running heads, the claim (planned for its values
  /// and once for every value, and run) reads the ready index alone, never a held row, and the
  /// promotion, the next wake and the counts read no held row either. The lookup of a line's
  /// first job (a settlement's promotion) is one seek of `jobs_ordered`.
  @Test func blockedKeysCostAClaimNothing() async throws {
    let (schema, store, admin) = try await plansStore()
    let sql = store.sql
    let now = "date_trunc('milliseconds', now())"
    // Keys 1…100,000: a dead head (even keys) or a running one (odd keys), then a held job each;
    // then 1,000 ready jobs without a key.
    try await admin.queryOffPool(
      """
      INSERT INTO \(schema).jobs (queue, payload, status, run_at, created_at, ordering_key, lease_owner,
        lease_expires_at)
      SELECT 'big', '\\x7b7d'::bytea,
        CASE WHEN i > 200000 THEN 'ready' WHEN i > 100000 THEN 'held' WHEN i % 2 = 0 THEN 'dead' ELSE 'running' END,
        \(now) - interval '1 minute', \(now),
        CASE WHEN i <= 200000 THEN 'key-' || ((i - 1) % 100000 + 1) END,
        CASE WHEN i <= 100000 AND i % 2 = 1 THEN 'w' END,
        CASE WHEN i <= 100000 AND i % 2 = 1 THEN \(now) + interval '1 hour' END
      FROM generate_series(1, 201000) AS i
      """)
    try await admin.queryOffPool("VACUUM ANALYZE \(schema).jobs")
    #expect(
      try await store.counts(queue: "big", clock: SystemJobClock())
        == JobCounts(ready: 1000, running: 50000, dead: 50000, held: 100000))
    // The store's session settings (see `PostgresJobStore.init`).
    try admin.query("SET enable_seqscan = off; SET enable_mergejoin = off")
    let statements = [
      ("claim", "(text, int8, text, int8, timestamptz) AS \(sql.claim)", "('big', 100, 'w', 60000, NULL)"),
      ("promote", "(text, timestamptz) AS \(sql.promote)", "('big', NULL)"),
      ("nextWake", "(text, timestamptz, int8) AS \(sql.nextWake)", "('big', NULL, NULL)"),
    ]
    for (number, (name, prepare, execute)) in statements.enumerated() {
      for (mode, plan) in try analyzedPlans(admin, "blocked_\(number)", prepare: prepare, execute: execute) {
        #expect(!plan.contains("Seq Scan on jobs"), "\(name) (\(mode)) scans the jobs table:\n\(plan)")
        // The next wake reads the running jobs' leases from `jobs_status` (status 'running').
        for index in ["jobs_ordered", "jobs_dedup"] + (name == "nextWake" ? [] : ["jobs_status"]) {
          #expect(!plan.contains(" \(index) "), "\(name) (\(mode)) reads \(index):\n\(plan)")
        }
        if name == "claim" {
          #expect(plan.contains(" jobs_ready "), "the claim reads the ready index:\n\(plan)")
          // Every index or table row the claim read: the 100 it took (and nothing held).
          let read = rowsRead(in: plan) { $0.contains("Index Scan") || $0.contains("Index Only Scan") }
          #expect(read.allSatisfy { $0 <= 100 }, "the claim read more than it took:\n\(plan)")
        }
      }
    }
    // A line's first job: one seek of `jobs_ordered`, for a key with a dead head and a held job.
    try admin.query("SET plan_cache_mode = force_custom_plan")
    let head = try admin.query(
      """
      EXPLAIN (ANALYZE, TIMING OFF, COSTS OFF) SELECT id FROM \(schema).jobs
      WHERE queue = 'big' AND ordering_key = 'key-2' AND status IN (\(SQL.lineStatuses)) ORDER BY id LIMIT 1
      """
    ).compactMap { $0.first ?? nil }.joined(separator: "\n")
    #expect(head.contains(" jobs_ordered "), "the first of a line is found in jobs_ordered:\n\(head)")
    #expect(!head.contains("Seq Scan"), "\(head)")
    await store.close()
  }

  /// Fair shares cost a claim and a turn nothing, however many keys have backlogs: with 100,000
  /// fairness keys of three ready jobs each, 10,000 jobs held by their limit key and 1,000 ready
  /// jobs without a key, the claim reads the ready index's first 100 entries, and each query a
  /// job's turn takes (``SQL/turnHead(_:queue:priority:id:)``, ``SQL/turnLatest(_:queue:priority:runAt:)``,
  /// ``SQL/turnPrevious(_:queue:priority:key:)``, as `take_turn` runs them) reads an entry or two
  /// of its index.
  @Test func fairnessKeysWithBacklogsCostAClaimAndATurnNothing() async throws {
    let (schema, store, admin) = try await plansStore()
    let sql = store.sql
    let now = "date_trunc('milliseconds', now())"
    // Key k's three jobs have turns k, k + 100,000 and k + 200,000 ms after an hour ago.
    try await admin.queryOffPool(
      """
      INSERT INTO \(schema).jobs (queue, payload, status, run_at, created_at, fairness_key, turn, turn_priority)
      SELECT 'big', '\\x7b7d'::bytea, 'ready', \(now) - interval '1 hour', \(now),
        'key-' || ((i - 1) % 100000 + 1), \(now) - interval '1 hour' + i * interval '1 millisecond', 0
      FROM generate_series(1, 300000) AS i
      """)
    try await admin.queryOffPool(
      """
      INSERT INTO \(schema).jobs (queue, payload, status, parked, run_at, created_at, limit_key)
      SELECT 'big', '\\x7b7d'::bytea, CASE WHEN i <= 10000 THEN 'held' ELSE 'ready' END,
        CASE WHEN i <= 10000 THEN true END, \(now) - interval '2 hours', \(now),
        CASE WHEN i <= 10000 THEN 'host-' || (i % 100) END
      FROM generate_series(1, 11000) AS i
      """)
    try await admin.queryOffPool("VACUUM ANALYZE \(schema).jobs")
    // The store's session settings (see `PostgresJobStore.init`).
    try admin.query("SET enable_seqscan = off; SET enable_mergejoin = off")
    for (mode, plan) in try analyzedPlans(
      admin, "fair_claim", prepare: "(text, int8, text, int8, timestamptz) AS \(sql.claim)",
      execute: "('big', 100, 'w', 60000, NULL)")
    {
      #expect(!plan.contains("Seq Scan on jobs"), "the claim (\(mode)) scans the jobs table:\n\(plan)")
      #expect(plan.contains(" jobs_ready "), "the claim (\(mode)) reads the ready index:\n\(plan)")
      let read = rowsRead(in: plan) { $0.contains("Index Scan") || $0.contains("Index Only Scan") }
      #expect(read.allSatisfy { $0 <= 100 }, "the claim (\(mode)) read more than it took:\n\(plan)")
    }
    let turns = [
      (
        "head", SQL.turnHead(schema, queue: "'big'", priority: "0", id: "0"),
        ["jobs_ready", "jobs_parked_place"]
      ),
      ("latest", SQL.turnLatest(schema, queue: "'big'", priority: "0", runAt: "now()"), ["jobs_turns"]),
      (
        "previous", SQL.turnPrevious(schema, queue: "'big'", priority: "0", key: "'key-77'"),
        ["jobs_key_turns"]
      ),
      (
        "previous of a new key", SQL.turnPrevious(schema, queue: "'big'", priority: "0", key: "'new'"),
        ["jobs_key_turns"]
      ),
    ]
    try admin.query("SET plan_cache_mode = force_custom_plan")
    for (name, query, indexes) in turns {
      let plan = try admin.query("EXPLAIN (ANALYZE, TIMING OFF, COSTS OFF) \(query)")
        .compactMap { $0.first ?? nil }.joined(separator: "\n")
      #expect(!plan.contains("Seq Scan on jobs"), "the turn's \(name) scans the jobs table:\n\(plan)")
      for index in indexes {
        #expect(plan.contains(" \(index) "), "the turn's \(name) does not use \(index):\n\(plan)")
      }
      let read = rowsRead(in: plan) { $0.contains("Scan") }
      #expect(read.allSatisfy { $0 <= 1 }, "the turn's \(name) reads more than an entry:\n\(plan)")
    }
    await store.close()
  }

  // Failed before the fix: a prepared settlement's plan made while the statistics said no job was
  // running (a table analyzed before workers claimed) walked every running job of the queue for
  // each settlement, and kept doing so as hundreds ran: a JobQueue with prefetch 96 spent 4 ms in
  // each settlement and ran at a fifth of its speed with the plan made for its values.
  @Test func settlementsAndHeartbeatsLookTheirJobsUpByIDWhateverTheStatisticsSay() async throws {
    let (schema, store, admin) = try await plansStore()
    let sql = store.sql
    try await admin.queryOffPool(
      """
      INSERT INTO \(schema).jobs (queue, payload, status, run_at, created_at)
      SELECT 'q', '\\x7b7d'::bytea, 'ready', now(), now() FROM generate_series(1, 20000)
      """)
    try await admin.queryOffPool("VACUUM ANALYZE \(schema).jobs")
    // Workers claim after the statistics were taken.
    try admin.query(
      "UPDATE \(schema).jobs SET status = 'running', lease_owner = 'w', lease_expires_at = now() WHERE id <= 2000"
    )
    let ids = "'{\((1...100).map(String.init).joined(separator: ","))}'::int8[]"
    let tokens = "array_fill(0::int8, ARRAY[100])"
    let cases = [
      (
        "settle",
        "(int8[], int8[], int4[], int8[], text[], timestamptz, text, int8[], bytea[]) AS \(sql.settle)",
        "(\(ids), \(tokens), array_fill(0, ARRAY[100]), array_fill(NULL::int8, ARRAY[100]), "
          + "array_fill(NULL::text, ARRAY[100]), NULL, 'q', array_fill(NULL::int8, ARRAY[100]), "
          + "array_fill(NULL::bytea, ARRAY[100]))"
      ),
      (
        "complete", "(int8[], int8[], text, int8[], bytea[], timestamptz) AS \(sql.complete)",
        "(\(ids), \(tokens), 'q', array_fill(NULL::int8, ARRAY[100]), array_fill(NULL::bytea, ARRAY[100]), NULL)"
      ),
      (
        "complete without history", "(int8[], int8[], text) AS \(sql.completeWithoutHistory)",
        "(\(ids), \(tokens), 'q')"
      ),
      (
        "heartbeat", "(int8[], int8[], int8, timestamptz, text) AS \(sql.heartbeat)",
        "(\(ids), \(tokens), 60000, NULL, 'q')"
      ),
    ]
    for (number, (name, prepare, execute)) in cases.enumerated() {
      try admin.query("PREPARE stale_\(number) \(prepare)")
      try admin.query("SET plan_cache_mode = force_generic_plan")
      let rows = try admin.query("EXPLAIN EXECUTE stale_\(number) \(execute)")
      let plan = rows.compactMap { $0.first ?? nil }.joined(separator: "\n")
      #expect(!plan.contains("jobs_status"), "\(name) reads the running jobs' index:\n\(plan)")
      #expect(plan.contains("jobs_pkey"), "\(name) does not look its jobs up by ID:\n\(plan)")
    }
    await store.close()
  }

  // Failed before the fix: a settlement of 100 jobs whose plan looked the jobs up by the array of
  // IDs first then scanned all 100 settlements for each job (9,900 rows removed by the join
  // filter, 4 ms): the cost grew with the square of the batch. Then, with hash joins off, the
  // retries of a batch were joined with the settlements the same way (374,750 rows for 500).
  @Test func settlingAndHeartbeatingABatchCostsOneLookupPerJob() async throws {
    let (schema, store, admin) = try await plansStore()
    let sql = store.sql
    try await admin.queryOffPool(
      """
      INSERT INTO \(schema).jobs (queue, payload, status, run_at, created_at, lease_owner, lease_expires_at)
      SELECT 'q', '\\x7b7d'::bytea, CASE WHEN i <= 1000 THEN 'running' ELSE 'ready' END, now(), now(),
        CASE WHEN i <= 1000 THEN 'w' END, CASE WHEN i <= 1000 THEN now() END
      FROM generate_series(1, 50000) AS i
      """)
    try await admin.queryOffPool("VACUUM ANALYZE \(schema).jobs")
    // The store's session settings (see `PostgresJobStore.init`).
    try admin.query(
      "SET plan_cache_mode = force_generic_plan; SET enable_seqscan = off; SET enable_mergejoin = off")
    // EXECUTE takes no subqueries: the arrays as literals.
    let ids = "'{\((1...1000).map(String.init).joined(separator: ","))}'::int8[]"
    let tokens = "array_fill(0::int8, ARRAY[1000])"
    // Half completed, half retried.
    let kinds = "'{\((1...1000).map { String($0 % 2) }.joined(separator: ","))}'::int4[]"
    try admin.query(
      "PREPARE settle_batch (int8[], int8[], int4[], int8[], text[], timestamptz, text, int8[], bytea[]) AS \(sql.settle)"
    )
    try admin.query("PREPARE heartbeat_batch (int8[], int8[], int8, timestamptz, text) AS \(sql.heartbeat)")
    try admin.query(
      "PREPARE complete_batch (int8[], int8[], text, int8[], bytea[], timestamptz) AS \(sql.complete)")
    for (name, execute) in [
      ("heartbeat_batch", "(\(ids), \(tokens), 60000, NULL, 'q')"),
      (
        "complete_batch",
        "(\(ids), \(tokens), 'q', array_fill(NULL::int8, ARRAY[1000]), array_fill(NULL::bytea, ARRAY[1000]), NULL)"
      ),
      (
        "settle_batch",
        "(\(ids), \(tokens), \(kinds), array_fill(1000::int8, ARRAY[1000]), array_fill(NULL::text, ARRAY[1000]), NULL, 'q', "
          + "array_fill(NULL::int8, ARRAY[1000]), array_fill(NULL::bytea, ARRAY[1000]))"
      ),
    ] {
      try admin.query("BEGIN")
      let rows = try admin.query("EXPLAIN (ANALYZE, TIMING OFF) EXECUTE \(name)\(execute)")
      try admin.query("ROLLBACK")
      let plan = rows.compactMap { $0.first ?? nil }.joined(separator: "\n")
      let removed = plan.split(separator: "\n").compactMap { line -> Int? in
        guard let range = line.range(of: "Rows Removed by Join Filter: ") else { return nil }
        return Int(line[range.upperBound...].trimmingCharacters(in: .whitespaces))
      }
      #expect(removed.reduce(0, +) < 10_000, "\(name) compares every job with every settlement:\n\(plan)")
      #expect(plan.contains("rows=1000") || plan.contains("rows=500"), "\(name) found its jobs:\n\(plan)")
    }
    await store.close()
  }

  /// A limited claim, its check for a full queue and the next wake of a queue whose limit was
  /// lowered far below its running jobs read the limit's worth of running jobs, not all of them,
  /// with a rate limit beside it.
  @Test func aLimitLoweredFarBelowTheRunningJobsCostsTheLimitsWorth() async throws {
    // 50,000 running under an hour's lease, then 1,000 ready; with a rate too: its bucket reads
    // the queue's row alone.
    let (store, admin) = try await limitedQueue(
      running: 50_000, ready: 1_000,
      limits: QueueLimits(concurrency: 10, rate: RateLimit(perSecond: 1000, burst: 100)))
    try admin.query("SET enable_seqscan = off; SET enable_mergejoin = off")
    for (number, (name, prepare, execute)) in Self.limitStatements(store.sql).enumerated() {
      // As after `limitLock` took the lock: the limited statements run only then.
      for (mode, plan) in try analyzedPlans(
        admin, "lowered_\(number)", prepare: prepare, execute: execute,
        first: "SELECT set_config('\(SQL.limitLocked)', 'on', true)")
      {
        #expect(!plan.contains("Seq Scan on jobs"), "\(name) (\(mode)) scans the jobs table:\n\(plan)")
        // The counts read `jobs_status` alone (the next wake's earliest lease reads the running
        // rows themselves, a cost of its own not bounded by the limit).
        let read = rowsRead(in: plan) { $0.contains("Index Only Scan using jobs_status ") }
        #expect(!read.isEmpty, "\(name) (\(mode)) reads the running jobs from jobs_status:\n\(plan)")
        #expect(
          read.allSatisfy { $0 <= 10 }, "\(name) (\(mode)) read more running jobs than the limit:\n\(plan)")
      }
    }
    await store.close()
  }

  /// A queue with a rate and no concurrency limit: its limited claim, its check for a full queue
  /// and its next wake count none of its running jobs (there is no limit to count them against).
  @Test func aRateWithoutAConcurrencyLimitCountsNoRunningJob() async throws {
    let (store, admin) = try await limitedQueue(
      running: 5_000, ready: 100, limits: QueueLimits(rate: RateLimit(perSecond: 1000, burst: 100)))
    for (number, (name, prepare, execute)) in Self.limitStatements(store.sql).enumerated() {
      for (mode, plan) in try analyzedPlans(
        admin, "rate_only_\(number)", prepare: prepare, execute: execute,
        first: "SELECT set_config('\(SQL.limitLocked)', 'on', true)")
      {
        let counted = rowsRead(in: plan) { $0.contains("Index Only Scan using jobs_status ") }
        #expect(counted.allSatisfy { $0 <= 1 }, "\(name) (\(mode)) counted the running jobs:\n\(plan)")
      }
    }
    await store.close()
  }

  /// Limits per key cost a claim the same however many keys are full: with 100,000 keys at their
  /// limit (200,000 running jobs, 700,000 parked behind them) and a key whose limit was lowered
  /// far below its 5,000 running jobs, the claim under limits per key (planned for its values and
  /// once for every value, and run) reads the first `100 + SQL.keyWindow` ready jobs, at most a
  /// key's limit of each key's running jobs, and never a parked job. The listing of the keys'
  /// usage reads the running keyed and parked jobs from their own indexes alone.
  @Test func fullKeysCostAKeyLimitedClaimNothing() async throws {
    let (schema, store, admin) = try await plansStore()
    let sql = store.sql
    let now = "date_trunc('milliseconds', now())"
    // Before the parked jobs go in: storing limits makes every parked job ready again.
    try await store.setLimits(
      QueueLimits(keyConcurrency: 2, keyConcurrencyOverrides: ["hot": 3]), queue: "big")
    let running = "'running', 'w', \(now) + interval '1 hour'"
    // Keys 1…100,000: two running jobs each; 'hot': 5,000 (its limit was 3 when they started).
    try await admin.queryOffPool(
      """
      INSERT INTO \(schema).jobs (queue, payload, status, lease_owner, lease_expires_at, run_at, created_at,
        limit_key)
      SELECT 'big', '\\x7b7d'::bytea, \(running), \(now) - interval '1 minute', \(now),
        CASE WHEN i <= 200000 THEN 'key-' || ((i - 1) % 100000 + 1) ELSE 'hot' END
      FROM generate_series(1, 205000) AS i
      """)
    // Seven parked jobs behind each key's running ones.
    try await admin.queryOffPool(
      """
      INSERT INTO \(schema).jobs (queue, payload, status, parked, run_at, created_at, limit_key)
      SELECT 'big', '\\x7b7d'::bytea, 'held', true, \(now) - interval '1 minute', \(now),
        'key-' || ((i - 1) % 100000 + 1)
      FROM generate_series(1, 700000) AS i
      """)
    // 100,000 ready jobs. The first 1,000 in claim order have no key (odd) or a key with no
    // running job (even), but for a job of 'hot' and three of full keys in the claim's window;
    // the other 99,000 are of full keys.
    try await admin.queryOffPool(
      """
      INSERT INTO \(schema).jobs (queue, payload, status, run_at, created_at, limit_key)
      SELECT 'big', '\\x7b7d'::bytea, 'ready', \(now) - interval '1 minute', \(now),
        CASE WHEN i = 5 THEN 'hot' WHEN i IN (10, 20, 30) OR i > 1000 THEN 'key-' || ((i - 1) % 100000 + 1)
          WHEN i % 2 = 1 THEN NULL ELSE 'fresh-' || i END
      FROM generate_series(1, 100000) AS i
      """)
    try await admin.queryOffPool("VACUUM ANALYZE \(schema).jobs")
    // The store's session settings (see `PostgresJobStore.init`).
    try admin.query("SET enable_seqscan = off; SET enable_mergejoin = off")
    // Each index or table scan of a plan with the rows it read in a loop: those it returned and
    // those its filter rejected.
    func scans(in plan: String) -> [(line: Substring, rows: Int)] {
      var scans: [(line: Substring, rows: Int)] = []
      var inScan = false
      for line in plan.split(separator: "\n") {
        let detail = line.trimmingCharacters(in: .whitespaces)
        if line.contains("Scan using") || line.contains("Scan on jobs") {
          scans.append((line, rowsRead(in: String(line)) { _ in true }.first ?? 0))
          inScan = true
        } else if detail.hasPrefix("->") || !detail.contains(":") {
          inScan = false
        } else if inScan, let range = detail.range(of: "Rows Removed by ") {
          let count = detail[range.upperBound...].split(separator: ":").last
          scans[scans.count - 1].rows += Int(count?.trimmingCharacters(in: .whitespaces) ?? "") ?? 0
        }
      }
      return scans
    }
    // As after `limitLock` found limits per key: the claim runs only then.
    for (mode, plan) in try analyzedPlans(
      admin, "full_keys_claim",
      prepare: "(text, int8, text, int8, timestamptz, int8) AS \(sql.keyLimitedClaim)",
      execute: "('big', 100, 'w', 60000, NULL, NULL)",
      first:
        "SELECT set_config('\(SQL.limitLocked)', 'on', true), set_config('\(SQL.keyLimited)', 'on', true)")
    {
      #expect(
        plan.hasPrefix("CTE Scan on claimed (actual rows=100 "), "the claim (\(mode)) took 100 jobs:\n\(plan)"
      )
      #expect(!plan.contains("Seq Scan on jobs"), "the claim (\(mode)) scans the jobs table:\n\(plan)")
      // The index of the queue's running jobs is in the plan (for a queue's own limit), never run.
      let indexes = Set(plan.matches(of: /jobs_[a-z][a-z_]*/).map { String($0.output) })
      #expect(
        indexes == ["jobs_ready", "jobs_key_running", "jobs_pkey", "jobs_status"],
        "the claim (\(mode)) reads other indexes (a parked job?):\n\(plan)")
      // Every index or table row read (a loop's worth), a filter's rejects too: the window of
      // ready jobs, the jobs taken or parked in it.
      let read = scans(in: plan)
      #expect(
        read.allSatisfy { $0.rows <= 100 + SQL.keyWindow },
        "the claim (\(mode)) read past its window:\n\(plan)")
      // Each key's running jobs, up to its limit: 'hot' reads 3 of its 5,000, a full key 2, a new
      // key none (the plan shows a loop's average, one loop a key of the window: 9 rows in 55
      // loops; without the limit, 'hot' alone makes it 91).
      let counted = read.filter { $0.line.contains(" jobs_key_running ") }
      #expect(
        !counted.isEmpty && counted.allSatisfy { $0.rows <= 3 },
        "the claim (\(mode)) counted more running jobs of a key than its limit:\n\(plan)")
    }
    // The keys' usage: by design, every running keyed and parked job, but from their own indexes
    // alone, not the queue's other jobs.
    for (mode, plan) in try analyzedPlans(
      admin, "full_keys_usage", prepare: "(text, int8) AS \(sql.limitKeyUsage)", execute: "('big', 100)")
    {
      #expect(plan.hasPrefix("Limit (actual rows=100 "), "the usage (\(mode)) lists 100 keys:\n\(plan)")
      #expect(!plan.contains("Seq Scan on jobs"), "the usage (\(mode)) scans the jobs table:\n\(plan)")
      let indexes = Set(plan.matches(of: /jobs_[a-z][a-z_]*/).map { String($0.output) })
      // Either index of the parked jobs will do: each holds them alone.
      #expect(
        indexes == ["jobs_key_running", "jobs_parked"]
          || indexes == ["jobs_key_running", "jobs_parked_place"],
        "the usage (\(mode)) reads other indexes:\n\(plan)")
    }
    await store.close()
  }

  /// A store whose queue `big` holds `running` jobs under an hour's lease and `ready` more, under
  /// `limits`, its statistics fresh.
  private func limitedQueue(running: Int, ready: Int, limits: QueueLimits) async throws -> (
    store: PostgresJobStore, admin: AdminConnection
  ) {
    let (schema, store, admin) = try await plansStore()
    let now = "date_trunc('milliseconds', now())"
    try await admin.queryOffPool(
      """
      INSERT INTO \(schema).jobs (queue, payload, status, run_at, created_at, lease_owner, lease_expires_at)
      SELECT 'big', '\\x7b7d'::bytea, CASE WHEN i <= \(running) THEN 'running' ELSE 'ready' END,
        \(now) - interval '1 minute', \(now), CASE WHEN i <= \(running) THEN 'w' END,
        CASE WHEN i <= \(running) THEN \(now) + interval '1 hour' END
      FROM generate_series(1, \(running + ready)) AS i
      """)
    try await store.setLimits(limits, queue: "big")
    try await admin.queryOffPool("VACUUM ANALYZE \(schema).jobs")
    return (store, admin)
  }

  /// The statements of a claim under limits, each with its name, its parameters' types (`PREPARE`)
  /// and its arguments for queue `big` (`EXECUTE`).
  private static func limitStatements(_ sql: SQL) -> [(name: String, prepare: String, execute: String)] {
    [
      (
        "limitedClaim", "(text, int8, text, int8, timestamptz, int8) AS \(sql.limitedClaim)",
        "('big', 100, 'w', 60000, NULL, NULL)"
      ),
      ("limitFull", "(text, int8) AS \(sql.limitFull)", "('big', NULL)"),
      ("nextWake", "(text, timestamptz, int8) AS \(sql.nextWake)", "('big', NULL, NULL)"),
    ]
  }

  /// `EXPLAIN ANALYZE` of `prepare` (prepared as `name`) executed with `execute`, under a custom
  /// and then a generic plan, each in a transaction rolled back after it (`first`, if any, runs
  /// in it before): each mode with its plan's text.
  private func analyzedPlans(
    _ admin: AdminConnection, _ name: String, prepare: String, execute: String, first: String? = nil
  ) throws -> [(mode: String, plan: String)] {
    try admin.query("PREPARE \(name) \(prepare)")
    return try ["force_custom_plan", "force_generic_plan"].map { mode in
      try admin.query("SET plan_cache_mode = \(mode)")
      try admin.query("BEGIN")
      if let first { _ = try admin.query(first) }
      let rows = try admin.query("EXPLAIN (ANALYZE, TIMING OFF, COSTS OFF) EXECUTE \(name) \(execute)")
      try admin.query("ROLLBACK")
      return (mode, rows.compactMap { $0.first ?? nil }.joined(separator: "\n"))
    }
  }

  /// The actual rows of each line of `plan` that `matches`.
  private func rowsRead(in plan: String, where matches: (Substring) -> Bool) -> [Int] {
    plan.split(separator: "\n").filter(matches).compactMap { line in
      guard let range = line.range(of: "rows=", options: .backwards) else { return nil }
      return Int(line[range.upperBound...].prefix { $0.isNumber })
    }
  }

  /// A store in a schema of its own on the shared server, and an admin connection to the server.
  private func plansStore() async throws -> (schema: String, store: PostgresJobStore, admin: AdminConnection)
  {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("plans")
    let store = try await PostgresJobStore.open(url: server.url, options: .init(schema: schema))
    return (schema, store, try AdminConnection(server.url))
  }
}
