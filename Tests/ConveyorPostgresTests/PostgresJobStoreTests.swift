import Conveyor
import ConveyorPostgres
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import ConveyorPostgres

@Suite("PostgresJobStore", .serialized)
struct PostgresJobStoreTests {
  func open(
    _ schema: String = uniqueSchema(), clock: PostgresJobStore.Clock = .database,
    lockTimeout: Duration = .seconds(5)
  ) async throws -> (PostgresServer, PostgresJobStore) {
    let server = try await PostgresServer.shared()
    let store = try await PostgresJobStore.open(
      url: server.url, options: .init(schema: schema, clock: clock, lockTimeout: lockTimeout))
    return (server, store)
  }

  /// The server's clock, read through a plain connection.
  func serverNow(_ server: PostgresServer) throws -> Date {
    let seconds = try AdminConnection(server.url).scalar(
      "SELECT extract(epoch FROM clock_timestamp())::float8")
    return Date(timeIntervalSince1970: Double(seconds ?? "") ?? 0)
  }

  // MARK: Scheduled jobs that fall due

  // A job that fell due is promoted and claimed in order (a ready job of lower priority waits
  // behind it), and a paused queue claims nothing, due jobs or not. (Written for a claim that
  // skipped the promotion statement unless a job fell due: it measured no faster, and was not
  // kept; the test guards any such change.)
  @Test func aJobThatFellDueIsClaimedBeforeALowerReadyOneAndAPausedQueueClaimsNothing() async throws {
    let (_, store) = try await open(clock: .caller)
    let start = Date(timeIntervalSince1970: 1_700_000_000)
    let lease = Lease(owner: "w", duration: .seconds(60))
    func clock(_ seconds: Double) -> FixedJobClock { FixedJobClock(start.addingTimeInterval(seconds)) }
    let low = try await store.enqueue(
      [NewJob(payload: Data("low".utf8), runAt: start)], queue: "q", clock: clock(0))[0].id
    let soon = try await store.enqueue(
      [NewJob(payload: Data("soon".utf8), priority: 5, runTime: .after(.seconds(10)))], queue: "q",
      clock: clock(0))[0].id
    let other = try await store.enqueue(
      [NewJob(payload: Data("other".utf8), priority: 1, runAt: start)], queue: "q", clock: clock(0))[0].id
    // Before its date the scheduled job waits; the ready ones go by priority.
    let first = try await store.settleAndClaim([], queue: "q", limit: 1, lease: lease, clock: clock(1))
    #expect(first.claimed.map(\.id) == [other])
    // Fallen due: promoted and claimed ahead of the lower ready job.
    let second = try await store.settleAndClaim(
      [JobSettlement(claim: first.claimed[0].claim, action: .complete)], queue: "q", limit: 1, lease: lease,
      clock: clock(11))
    #expect(second.staleSettlements.isEmpty)
    #expect(second.claimed.map(\.id) == [soon], "the job that fell due comes first")
    #expect(!second.paused)
    // Paused: nothing is claimed, with or without a due job, and the flag is reported.
    _ = try await store.enqueue(
      [NewJob(payload: Data("later".utf8), priority: 9, runTime: .after(.seconds(5)))], queue: "q",
      clock: clock(11))
    try await store.setPaused(true, queue: "q")
    for seconds in [12.0, 30.0] {
      let paused = try await store.settleAndClaim(
        [], queue: "q", limit: 5, lease: lease, clock: clock(seconds))
      #expect(paused.claimed.isEmpty && paused.paused, "paused at \(seconds) s")
    }
    try await store.setPaused(false, queue: "q")
    let resumed = try await store.settleAndClaim([], queue: "q", limit: 5, lease: lease, clock: clock(30))
    #expect(resumed.claimed.map { String(decoding: $0.payload, as: UTF8.self) } == ["later", "low"])
    #expect(resumed.claimed.last?.id == low)
    await store.close()
  }

  // MARK: The database's clock

  @Test func aWorkerWhoseClockIsAheadDoesNotRescueALiveLease() async throws {
    let (server, store) = try await open()
    _ = try await store.enqueue([NewJob(payload: Data("a".utf8))], queue: "q", clock: SystemJobClock())
    let before = try serverNow(server)
    // The claiming worker's clock is an hour behind: its lease still runs a minute by the server.
    let late = FixedJobClock(Date().addingTimeInterval(-3_600))
    let batch = try await store.settleAndClaim(
      [], queue: "q", limit: 1, lease: Lease(owner: "w1", duration: .seconds(60)), clock: late)
    let record = try #require(batch.claimed.first)
    let expiry = try #require(record.leaseExpiresAt)
    let after = try serverNow(server)
    #expect(expiry >= before.addingTimeInterval(59) && expiry <= after.addingTimeInterval(61), "\(expiry)")
    // Another worker whose clock is two minutes ahead finds the lease alive.
    let ahead = FixedJobClock(Date().addingTimeInterval(120))
    #expect(try await store.rescueExpiredLeases(queue: "q", clock: ahead) == 0)
    #expect(try await store.counts(queue: "q", clock: ahead).running == 1)
    await store.close()
  }

  @Test func aScheduledJobDoesNotRunEarlyForAWorkerWhoseClockIsAhead() async throws {
    let (_, store) = try await open()
    _ = try await store.enqueue(
      [NewJob(payload: Data("later".utf8), runTime: .after(.seconds(60)))], queue: "q",
      clock: SystemJobClock())
    let ahead = FixedJobClock(Date().addingTimeInterval(600))
    let batch = try await store.settleAndClaim(
      [], queue: "q", limit: 5, lease: Lease(owner: "w", duration: .seconds(60)), clock: ahead)
    #expect(batch.claimed.isEmpty, "not before the server's clock reaches its date")
    #expect(try await store.counts(queue: "q", clock: ahead) == JobCounts(scheduled: 1))
    // nextWake speaks the caller's clock: about a minute from the caller's now.
    let hint = try await store.nextWake(queue: "q", clock: ahead)
    let wait = try #require(hint.nextRun).timeIntervalSince(ahead.now())
    #expect(wait > 50 && wait <= 60, "a minute on the caller's clock: \(wait)")
    await store.close()
  }

  /// A worker whose own clock is an hour ahead neither rescues a live lease nor runs a scheduled
  /// job early (the database clock decides).
  @Test func anOffsetClockNeitherStealsLeasesNorRunsScheduledJobsEarly() async throws {
    let server = try await PostgresServer.shared()
    let store = try await openNamedStore(server, .init(schema: uniqueSchema("rv")))
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

  // MARK: Migrations

  @Test func tenProcessesMigratingAtOnceAllSucceed() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("migrate")
    let stores = try await withThrowingTaskGroup(of: PostgresJobStore.self) { group in
      for _ in 0..<10 {
        group.addTask { try await PostgresJobStore.open(url: server.url, options: .init(schema: schema)) }
      }
      return try await group.reduce(into: []) { $0.append($1) }
    }
    #expect(stores.count == 10)
    let versions = try AdminConnection(server.url).query(
      "SELECT version FROM \(schema).schema_migrations ORDER BY version")
    #expect(versions == (1...PostgresJobStore.schemaVersion).map { [String($0)] }, "migrated once")
    _ = try await stores[3].enqueue([NewJob(payload: Data("x".utf8))], queue: "q", clock: SystemJobClock())
    #expect(try await stores[7].counts(queue: "q", clock: SystemJobClock()).ready == 1)
    for store in stores { await store.close() }
  }

  /// A schema the release of 2026-12-05 made (version 3: its migrations, which this build keeps
  /// as they were) is migrated when a store opens it, in one transaction, with every job kept.
  @Test func aVersion3SchemaIsMigratedWithEveryJobAndItsPlaceKept() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("v3")
    let admin = try AdminConnection(server.url)
    try createSchema(SQL(schema: schema), atVersion: 3, with: admin)
    try admin.query(
      """
      BEGIN;
      INSERT INTO \(schema).jobs (id, queue, payload, status, priority, attempts, run_at, created_at,
        last_error, dedup_key, lease_owner, lease_expires_at, claim_token) VALUES
      (1, 'mail', '\\x7b7d', 'ready', 0, 0, '2026-12-05 10:00:00+00', '2026-12-05 10:00:00+00', NULL, 'k', NULL, NULL, 0),
      (2, 'mail', '\\x7b7d', 'ready', 0, 2, '2026-12-05 10:00:00+00', '2026-12-05 10:00:00+00', 'boom', NULL, NULL, NULL, 2),
      (3, 'mail', '\\x7b7d', 'running', 0, 1, '2026-12-05 10:00:00+00', '2026-12-05 10:00:00+00', NULL, NULL, 'w:1',
        '2026-12-05 10:00:30+00', 4),
      (4, 'other', '\\x7b7d', 'dead', 0, 3, '2026-12-05 10:00:00+00', '2026-12-05 10:00:00+00', 'fatal', NULL, NULL, NULL, 3),
      (5, E'bad\\rname', '\\x7b7d', 'dead', 0, 1, '2026-12-05 10:00:00+00', '2026-12-05 10:00:00+00', NULL, NULL, NULL, NULL, 1);
      SELECT setval(pg_get_serial_sequence('\(schema).jobs', 'id'), 41);
      INSERT INTO \(schema).queues VALUES ('other', true) ON CONFLICT (name) DO UPDATE SET paused = true;
      COMMIT
      """)
    let store = try await PostgresJobStore.open(
      url: server.url, options: .init(schema: schema, clock: .caller))
    let versions = try admin.query("SELECT version FROM \(schema).schema_migrations ORDER BY version")
    #expect(versions == (1...PostgresJobStore.schemaVersion).map { [String($0)] })
    let now = FixedJobClock(Date(timeIntervalSince1970: 1_796_464_800))  // 2026-12-05 10:00 UTC
    let mail = try await store.jobs(queue: "mail", status: nil, after: nil, limit: 10)
    #expect(mail.map(\.id.rawValue) == [1, 2, 3])
    #expect(mail.map(\.claimToken) == [0, 2, 4] && mail[1].lastError == "boom" && mail[1].attempts == 2)
    #expect(try await store.counts(queue: "mail", clock: now) == JobCounts(ready: 2, running: 1))
    #expect(try await store.counts(queue: "other", clock: now) == JobCounts(dead: 1))
    #expect(try await store.isPaused(queue: "other"))
    // The ready jobs keep their order; a job retried with no delay now goes behind them.
    let lease = Lease(owner: "new", duration: .seconds(60))
    let first = try await store.settleAndClaim([], queue: "mail", limit: 1, lease: lease, clock: now)
    #expect(first.claimed.map(\.id.rawValue) == [1])
    let retried = JobSettlement(claim: first.claimed[0].claim, action: .retry(after: .zero, error: nil))
    let next = try await store.settleAndClaim([retried], queue: "mail", limit: 2, lease: lease, clock: now)
    #expect(next.claimed.map(\.id.rawValue) == [2, 1])
    // A queue name with a control character, stored before, is kept; a new one is refused.
    #expect(try await store.job(JobID(5))?.queue == "bad\rname")
    #expect(throws: HarnessError.self) {
      try admin.query(
        """
        INSERT INTO \(schema).jobs (queue, payload, status, run_at, created_at)
        VALUES (E'new\\nname', '\\x7b7d', 'ready', now(), now())
        """)
    }
    // The job a version 3 worker held runs again after its lease; new IDs follow the old ones.
    #expect(
      try await store.rescueExpiredLeases(
        queue: "mail", clock: FixedJobClock(now.now().addingTimeInterval(31))) == 1)
    let new = try await store.enqueue([NewJob(payload: Data("{}".utf8))], queue: "mail", clock: now)
    #expect((new.first?.id.rawValue ?? 0) > 41, "after the old IDs (the refused insert took one)")
    await store.close()
  }

  /// A schema at version 4 (the release of 2026-12-06) gains per-job time limits when a store
  /// opens it, with every job kept and each keeping the queue's limit.
  @Test func aVersion4SchemaGainsTimeLimitsWithEveryJobKept() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("v4")
    let admin = try AdminConnection(server.url)
    try createSchema(SQL(schema: schema), atVersion: 4, with: admin)
    try admin.query(
      """
      INSERT INTO \(schema).jobs (queue, payload, status, attempts, run_at, created_at, lease_owner,
        lease_expires_at, claim_token) VALUES
      ('mail', '\\x7b7d', 'ready', 0, now(), now(), NULL, NULL, 0),
      ('mail', '\\x7b7d', 'running', 1, now(), now(), 'w:1', now() + interval '30 seconds', 1),
      ('mail', '\\x7b7d', 'dead', 3, now(), now(), NULL, NULL, 3)
      """)
    let store = try await PostgresJobStore.open(url: server.url, options: .init(schema: schema))
    let versions = try admin.query("SELECT version FROM \(schema).schema_migrations ORDER BY version")
    #expect(versions == (1...PostgresJobStore.schemaVersion).map { [String($0)] })
    let mail = try await store.jobs(queue: "mail", status: nil, after: nil, limit: 10)
    #expect(mail.map(\.status) == [.pending, .running, .dead])
    #expect(mail.allSatisfy { $0.timeLimit == nil }, "jobs stored before keep the queue's limit")
    let new = try await store.enqueue(
      [NewJob(payload: Data("{}".utf8), timeLimit: .milliseconds(1_500))], queue: "mail",
      clock: SystemJobClock())
    #expect(try await store.job(new[0].id)?.timeLimit == .milliseconds(1_500))
    await store.close()
  }

  /// A schema at version 5 (the release of 2026-12-06, time limits) gains the history of finished
  /// jobs when a store opens it, with every job kept: a dead job counts as finished when migrated,
  /// and a job's last error starts its list of errors.
  @Test func aVersion5SchemaGainsTheHistoryWithEveryJobKept() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("v5")
    let admin = try AdminConnection(server.url)
    try createSchema(SQL(schema: schema), atVersion: 5, with: admin)
    try admin.query(
      """
      INSERT INTO \(schema).jobs (queue, payload, status, attempts, run_at, created_at, last_error,
        dedup_key, lease_owner, lease_expires_at, claim_token, time_limit_ms) VALUES
      ('mail', '\\x7b7d', 'ready', 1, now(), now(), 'flaky', 'k', NULL, NULL, 1, NULL),
      ('mail', '\\x7b7d', 'running', 1, now(), now(), NULL, NULL, 'w:1', now() + interval '30 seconds', 1, NULL),
      ('mail', '\\x7b7d', 'dead', 3, now(), now(), 'fatal', NULL, NULL, NULL, 3, NULL),
      ('mail', '\\x7b7d', 'scheduled', 0, now() + interval '1 hour', now(), NULL, NULL, NULL, NULL, 0, 2500)
      """)
    let before = Date()
    let store = try await PostgresJobStore.open(url: server.url, options: .init(schema: schema))
    let versions = try admin.query("SELECT version FROM \(schema).schema_migrations ORDER BY version")
    #expect(versions == (1...PostgresJobStore.schemaVersion).map { [String($0)] })
    let mail = try await store.jobs(queue: "mail", status: nil, after: nil, limit: 10)
    #expect(mail.map(\.status) == [.pending, .running, .dead, .pending])
    #expect(mail[0].errors == ["flaky"] && mail[0].deduplicationKey == "k")
    #expect(mail[1].finishedAt == nil && mail[1].errors.isEmpty)
    #expect(
      mail[2].errors == ["fatal"] && (mail[2].finishedAt ?? .distantPast) >= before.addingTimeInterval(-5))
    #expect(mail[3].timeLimit == .milliseconds(2_500))
    let pruned = try await store.prune(
      queue: "mail", status: .dead, olderThan: .seconds(86_400), limit: 10, clock: SystemJobClock())
    #expect(pruned == 0, "a migrated dead job is as old as the migration")
    let duplicate = try await store.enqueue(
      [NewJob(payload: Data("{}".utf8), deduplicationKey: "k")], queue: "mail", clock: SystemJobClock())
    #expect(duplicate.first == EnqueueResult(id: mail[0].id, inserted: false))
    let settled = try await store.settleAndClaim(
      [JobSettlement(claim: mail[1].claim, action: .complete, output: Data("1".utf8))], queue: "mail",
      limit: 0, lease: Lease(owner: "w:2", duration: .seconds(60)), clock: SystemJobClock())
    #expect(settled.staleSettlements.isEmpty)
    let completed = try await store.job(mail[1].id)
    #expect(completed?.status == .completed && completed?.output == Data("1".utf8))
    await store.close()
  }

  /// A schema at version 6 (the release of 2026-12-06, history) gains the index of keyed running
  /// and completed jobs when a store opens it, with every job kept; the wider deduplication
  /// scopes then see the jobs stored before.
  @Test func aVersion6SchemaGainsTheKeyedIndexWithEveryJobKept() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("v6")
    let admin = try AdminConnection(server.url)
    try createSchema(SQL(schema: schema), atVersion: 6, with: admin)
    try admin.query(
      """
      INSERT INTO \(schema).jobs (queue, payload, status, attempts, run_at, created_at, dedup_key,
        lease_owner, lease_expires_at, claim_token, finished_at) VALUES
      ('mail', '\\x7b7d', 'running', 1, now(), now(), 'r', 'w:1', now() + interval '30 seconds', 1, NULL),
      ('mail', '\\x7b7d', 'completed', 1, now(), now(), 'c', NULL, NULL, 1, now() - interval '10 minutes'),
      ('mail', '\\x7b7d', 'ready', 0, now(), now(), NULL, NULL, NULL, 0, NULL)
      """)
    let store = try await PostgresJobStore.open(url: server.url, options: .init(schema: schema))
    let versions = try admin.query("SELECT version FROM \(schema).schema_migrations ORDER BY version")
    #expect(versions == (1...PostgresJobStore.schemaVersion).map { [String($0)] })
    let index = try admin.query(
      "SELECT count(*) FROM pg_indexes WHERE schemaname = '\(schema.replacingOccurrences(of: "\"", with: ""))' AND indexname = 'jobs_keyed'"
    )
    #expect(index == [["1"]])
    let mail = try await store.jobs(queue: "mail", status: nil, after: nil, limit: 10)
    #expect(mail.map(\.status) == [.running, .completed, .pending])
    let found = try await store.addScopedProbes(queue: "mail", clock: SystemJobClock())
    #expect(found.map(\.outcome) == [.existing, .existing, .inserted])
    #expect(found[0].id == mail[0].id && found[1].id == mail[1].id)
    await store.close()
  }

  /// A schema at version 7 (the release of 2026-12-06, deduplication scopes) gains the schedules
  /// table when a store opens it, with every job kept, and schedules then fire into it.
  @Test func aVersion7SchemaGainsTheSchedulesTableWithEveryJobKept() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("v7")
    let admin = try AdminConnection(server.url)
    try createSchema(SQL(schema: schema), atVersion: 7, with: admin)
    try admin.query(
      """
      INSERT INTO \(schema).jobs (queue, payload, status, attempts, run_at, created_at, claim_token) VALUES
      ('mail', '\\x7b7d', 'ready', 0, now(), now(), 0),
      ('mail', '\\x7b7d', 'scheduled', 0, now() + interval '1 hour', now(), 0)
      """)
    let store = try await PostgresJobStore.open(
      url: server.url, options: .init(schema: schema, clock: .caller))
    let versions = try admin.query("SELECT version FROM \(schema).schema_migrations ORDER BY version")
    #expect(versions == (1...PostgresJobStore.schemaVersion).map { [String($0)] })
    let before = try await store.jobs(queue: "mail", status: nil, after: nil, limit: 10)
    #expect(before.count == 2)
    let start = FixedJobClock(Date(timeIntervalSince1970: 1_700_000_000))
    let schedule = try ScheduleDefinition(
      name: "tick", timing: try ScheduleTiming(every: .seconds(100)), payload: Data("{}".utf8))
    _ = try await store.saveSchedules([schedule], queue: "mail", origin: .added, clock: start)
    let fired = try await store.fireDueSchedules(
      queue: "mail", clock: FixedJobClock(Date(timeIntervalSince1970: 1_700_000_100)))
    #expect(fired.added.count == 1)
    #expect(try await store.jobs(queue: "mail", status: nil, after: nil, limit: 10).count == 3)
    await store.close()
  }

  /// A schema at version 8 (the release of 2026-12-06, schedules) gains ordering keys when a
  /// store opens it, with every job kept as it was (none held, none with a key); the held status,
  /// the line index and the rebuilt deduplication index are in place, and ordering works on it.
  @Test func aVersion8SchemaGainsOrderingKeysWithEveryJobKept() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("v8")
    let admin = try AdminConnection(server.url)
    try createSchema(SQL(schema: schema), atVersion: 8, with: admin)
    try admin.query(
      """
      INSERT INTO \(schema).jobs (queue, payload, status, attempts, run_at, created_at, dedup_key,
        lease_owner, lease_expires_at, claim_token, finished_at) VALUES
      ('mail', '\\x7b7d', 'ready', 0, now(), now(), 'w', NULL, NULL, 0, NULL),
      ('mail', '\\x7b7d', 'scheduled', 0, now() + interval '1 hour', now(), NULL, NULL, NULL, 0, NULL),
      ('mail', '\\x7b7d', 'running', 1, now(), now(), NULL, 'w:1', now() + interval '30 seconds', 1, NULL),
      ('mail', '\\x7b7d', 'dead', 3, now(), now(), NULL, NULL, NULL, 3, now()),
      ('mail', '\\x7b7d', 'completed', 1, now(), now(), NULL, NULL, NULL, 1, now())
      """)
    let store = try await PostgresJobStore.open(url: server.url, options: .init(schema: schema))
    let versions = try admin.query("SELECT version FROM \(schema).schema_migrations ORDER BY version")
    #expect(versions == (1...PostgresJobStore.schemaVersion).map { [String($0)] })
    let bare = schema.replacingOccurrences(of: "\"", with: "")
    let indexes = try admin.query(
      """
      SELECT indexname FROM pg_indexes WHERE schemaname = '\(bare)'
        AND indexname IN ('jobs_ordered', 'jobs_dedup') ORDER BY indexname
      """)
    #expect(indexes == [["jobs_dedup"], ["jobs_ordered"]])
    let dedupIndex = try admin.query(
      "SELECT indexdef FROM pg_indexes WHERE schemaname = '\(bare)' AND indexname = 'jobs_dedup'")
    #expect(dedupIndex.first?.first??.contains("held") == true, "\(dedupIndex)")
    let jobs = try await store.jobs(queue: "mail", status: nil, after: nil, limit: 10)
    #expect(jobs.map(\.status) == [.pending, .pending, .running, .dead, .completed])
    #expect(jobs.allSatisfy { !$0.isHeld && $0.orderingKey == nil })
    let clock = SystemJobClock()
    #expect(
      try await store.counts(queue: "mail", clock: clock)
        == JobCounts(
          ready: 1, scheduled: 1, running: 1, dead: 1, completed: 1))
    let added = try await store.enqueue(
      [
        NewJob(payload: Data("a1".utf8), orderingKey: "K"),
        NewJob(payload: Data("a2".utf8), deduplicationKey: "d", orderingKey: "K"),
      ], queue: "mail", clock: clock)
    #expect(try await store.job(added[0].id)?.isHeld == false)
    #expect(try await store.job(added[1].id)?.isHeld == true)
    let again = try await store.enqueue(
      [NewJob(payload: Data("a2".utf8), deduplicationKey: "d", orderingKey: "K")], queue: "mail", clock: clock
    )
    #expect(again.map(\.id) == [added[1].id] && again.map(\.inserted) == [false])
    // An application's own transaction counts a held job as waiting too.
    let id = try admin.query("SELECT \(schema).enqueue('mail', '{}'::text, dedup_key => 'd')")
    #expect(id == [[String(added[1].id.rawValue)]])
    await store.close()
  }

  /// A schema at version 9 (the release of 2026-12-07, ordering keys) gains the queues' stored
  /// limits when a store opens it, none set, with every job and pause flag kept; limits then work.
  @Test func aVersion9SchemaGainsQueueLimitsWithEveryJobAndPauseKept() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("v9")
    let admin = try AdminConnection(server.url)
    try createSchema(SQL(schema: schema), atVersion: 9, with: admin)
    try admin.query(
      """
      INSERT INTO \(schema).queues (name, paused) VALUES ('mail', true);
      INSERT INTO \(schema).jobs (queue, payload, status, attempts, run_at, created_at, claim_token, ordering_key)
      VALUES
      ('sms', '\\x7b7d', 'ready', 0, now(), now(), 0, NULL),
      ('sms', '\\x7b7d', 'ready', 0, now(), now(), 0, NULL),
      ('mail', '\\x7b7d', 'ready', 0, now(), now(), 0, 'k'),
      ('mail', '\\x7b7d', 'held', 0, now(), now(), 0, 'k')
      """)
    let before = try admin.query("SELECT \(Self.version9Columns) FROM \(schema).jobs ORDER BY id")
    let store = try await PostgresJobStore.open(url: server.url, options: .init(schema: schema))
    let versions = try admin.query("SELECT version FROM \(schema).schema_migrations ORDER BY version")
    #expect(versions == (1...PostgresJobStore.schemaVersion).map { [String($0)] })
    #expect(
      try admin.query("SELECT \(Self.version9Columns) FROM \(schema).jobs ORDER BY id") == before,
      "every job as it was")
    #expect(try await store.isPaused(queue: "mail"), "the pause flag is kept")
    let none = try await store.limits(queue: "sms")
    #expect(none.isEmpty)
    try await store.setLimits(QueueLimits(concurrency: 1), queue: "sms")
    let batch = try await store.settleAndClaim(
      [], queue: "sms", limit: 5, lease: Lease(owner: "w", duration: .seconds(60)), clock: SystemJobClock())
    #expect(batch.claimed.count == 1, "one of two under the limit set after the migration")
    await store.close()
  }

  /// A schema at version 10 (the release of 2026-12-07, concurrency limits) gains the queues'
  /// stored rates when a store opens it, none set, with every job, pause flag and concurrency
  /// limit kept; rates then work.
  @Test func aVersion10SchemaGainsRateLimitsWithEveryJobPauseAndLimitKept() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("v10")
    let admin = try AdminConnection(server.url)
    try createSchema(SQL(schema: schema), atVersion: 10, with: admin)
    try admin.query(
      """
      INSERT INTO \(schema).queues (name, paused, concurrency) VALUES ('mail', true, 3);
      INSERT INTO \(schema).jobs (queue, payload, status, attempts, run_at, created_at, claim_token, ordering_key)
      VALUES
      ('sms', '\\x7b7d', 'ready', 0, now(), now(), 0, NULL),
      ('sms', '\\x7b7d', 'ready', 0, now(), now(), 0, NULL),
      ('sms', '\\x7b7d', 'ready', 0, now(), now(), 0, NULL),
      ('mail', '\\x7b7d', 'ready', 0, now(), now(), 0, 'k'),
      ('mail', '\\x7b7d', 'held', 0, now(), now(), 0, 'k')
      """)
    let before = try admin.query("SELECT \(Self.version9Columns) FROM \(schema).jobs ORDER BY id")
    let store = try await PostgresJobStore.open(url: server.url, options: .init(schema: schema))
    let versions = try admin.query("SELECT version FROM \(schema).schema_migrations ORDER BY version")
    #expect(versions == (1...PostgresJobStore.schemaVersion).map { [String($0)] })
    #expect(
      try admin.query("SELECT \(Self.version9Columns) FROM \(schema).jobs ORDER BY id") == before,
      "every job as it was")
    #expect(try await store.isPaused(queue: "mail"), "the pause flag is kept")
    let mail = try await store.limits(queue: "mail")
    #expect(mail == QueueLimits(concurrency: 3), "the concurrency is kept, no rate: \(mail)")
    #expect(try await store.limits(queue: "sms").isEmpty)
    try await store.setLimits(QueueLimits(rate: RateLimit(perSecond: 0.5, burst: 2)), queue: "sms")
    let batch = try await store.settleAndClaim(
      [], queue: "sms", limit: 5, lease: Lease(owner: "w", duration: .seconds(60)), clock: SystemJobClock())
    #expect(batch.claimed.count == 2, "the burst of the rate set after the migration")
    #expect(batch.nextStart != nil, "the bucket is empty")
    await store.close()
  }

  /// The columns of a version 9 to 11 job, for comparing a job before and after a migration.
  static let version9Columns = """
    id, queue, payload, status, priority, attempts, run_at, created_at, last_error, dedup_key, lease_owner,
    lease_expires_at, claim_token, seq, time_limit_ms, finished_at, errors, run_ms, output, ordering_key
    """

  /// A schema at version 11 (the release of 2026-12-07, rate limits) gains limits per key when a
  /// store opens it, none set, with every job, pause flag and limit kept; limits per key then
  /// work, and the jobs stored before have no limit key.
  @Test func aVersion11SchemaGainsLimitsPerKeyWithEveryJobPauseAndLimitKept() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("v11")
    let admin = try AdminConnection(server.url)
    try createSchema(SQL(schema: schema), atVersion: 11, with: admin)
    try admin.query(
      """
      INSERT INTO \(schema).queues (name, paused, concurrency, rate, burst) VALUES ('mail', true, 3, 2.5, 4);
      INSERT INTO \(schema).jobs (queue, payload, status, attempts, run_at, created_at, claim_token, ordering_key)
      VALUES
      ('sms', '\\x7b7d', 'ready', 0, now(), now(), 0, NULL),
      ('mail', '\\x7b7d', 'ready', 0, now(), now(), 0, 'k'),
      ('mail', '\\x7b7d', 'held', 0, now(), now(), 0, 'k')
      """)
    let before = try admin.query("SELECT \(Self.version9Columns) FROM \(schema).jobs ORDER BY id")
    let store = try await PostgresJobStore.open(url: server.url, options: .init(schema: schema))
    let versions = try admin.query("SELECT version FROM \(schema).schema_migrations ORDER BY version")
    #expect(versions == (1...PostgresJobStore.schemaVersion).map { [String($0)] })
    #expect(
      try admin.query("SELECT \(Self.version9Columns) FROM \(schema).jobs ORDER BY id") == before,
      "every job as it was")
    #expect(try await store.isPaused(queue: "mail"), "the pause flag is kept")
    let mail = try await store.limits(queue: "mail")
    #expect(mail == QueueLimits(concurrency: 3, rate: RateLimit(perSecond: 2.5, burst: 4)), "kept: \(mail)")
    #expect(try await store.job(JobID(1))?.limitKey == nil, "a job stored before has no limit key")
    try await store.setLimits(QueueLimits(keyConcurrency: 1), queue: "sms")
    let added = try await store.enqueue(
      [NewJob(payload: Data("{}".utf8), limitKey: "h"), NewJob(payload: Data("{}".utf8), limitKey: "h")],
      queue: "sms", clock: SystemJobClock())
    let batch = try await store.settleAndClaim(
      [], queue: "sms", limit: 5, lease: Lease(owner: "w", duration: .seconds(60)), clock: SystemJobClock())
    #expect(batch.claimed.map(\.id) == [JobID(1), added[0].id], "the old job and one of key h")
    #expect(try await store.job(added[1].id)?.isHeldByLimit == true, "the second of key h is held")
    await store.close()
  }

  /// A store sends a claim's release of keys due (`SQL.releaseDueKeys`) only for queues it knows
  /// to have rates per key. Another process's store learns it from its first claim of the queue,
  /// and releases the held jobs by its next: its next wake is due at the key's next start, and two
  /// claims then take the held job. Without rates per key, its claims send no release.
  @Test func aStoreLearnsOfRatesPerKeySetElsewhereFromItsFirstClaim() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("rated")
    let setter = try await PostgresJobStore.open(
      url: server.url, options: .init(schema: schema, clock: .caller))
    let other = try await PostgresJobStore.open(
      url: server.url, options: .init(schema: schema, clock: .caller))
    let lease = Lease(owner: "w", duration: .seconds(60))
    let t0 = Date(timeIntervalSince1970: 1_700_000_000)
    func at(_ seconds: Double) -> FixedJobClock { FixedJobClock(t0.addingTimeInterval(seconds)) }
    _ = try await other.settleAndClaim([], queue: "q", limit: 1, lease: lease, clock: at(0))
    #expect(other.keyRatedQueues.withLock { $0.isEmpty }, "no rate per key: no release sent")
    try await setter.setLimits(QueueLimits(keyRate: RateLimit(perSecond: 1)), queue: "q")
    _ = try await setter.enqueue(
      [
        NewJob(payload: Data("1".utf8), runAt: t0, limitKey: "k"),
        NewJob(payload: Data("2".utf8), runAt: t0, limitKey: "k"),
      ],
      queue: "q", clock: at(0))
    let first = try await setter.settleAndClaim([], queue: "q", limit: 5, lease: lease, clock: at(1))
    #expect(first.claimed.count == 1, "one start; the other held")
    let wake = try await other.nextWake(queue: "q", clock: at(1.5))
    #expect(wake.nextRun == t0.addingTimeInterval(2), "due at the key's next start: \(wake)")
    var taken = 0
    for _ in 0..<2 where taken == 0 {
      taken = try await other.settleAndClaim([], queue: "q", limit: 5, lease: lease, clock: at(2)).claimed
        .count
    }
    #expect(taken == 1, "the held job runs by the other store's second claim")
    #expect(other.keyRatedQueues.withLock { $0.contains(ExactText("q")) }, "learned from its claim")
    await setter.close()
    await other.close()
  }

  /// A schema at version 12 (the release of 2026-12-07, limits per key) gains rates per key when a
  /// store opens it, none set, with every job (held ones too), pause flag and limit kept; rates per
  /// key then work on it.
  @Test func aVersion12SchemaGainsRatesPerKeyWithEveryJobAndLimitKept() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("v12")
    let admin = try AdminConnection(server.url)
    try createSchema(SQL(schema: schema), atVersion: 12, with: admin)
    try admin.query(
      """
      INSERT INTO \(schema).queues (name, paused, concurrency, key_concurrency) VALUES ('mail', true, 3, 1);
      INSERT INTO \(schema).key_limits (queue, key, concurrency) VALUES ('mail', 'wide', 5);
      INSERT INTO \(schema).jobs (queue, payload, status, attempts, run_at, created_at, claim_token, limit_key, parked,
        lease_owner, lease_expires_at)
      VALUES
      ('mail', '\\x7b7d', 'running', 1, now(), now(), 1, 'h', NULL, 'w', now() + interval '1 hour'),
      ('mail', '\\x7b7d', 'held', 0, now(), now(), 0, 'h', true, NULL, NULL),
      ('sms', '\\x7b7d', 'ready', 0, now(), now(), 0, 'h', NULL, NULL, NULL)
      """)
    let columns = "\(Self.version9Columns), limit_key, parked"
    let before = try admin.query("SELECT \(columns) FROM \(schema).jobs ORDER BY id")
    let store = try await PostgresJobStore.open(url: server.url, options: .init(schema: schema))
    let versions = try admin.query("SELECT version FROM \(schema).schema_migrations ORDER BY version")
    #expect(versions == (1...PostgresJobStore.schemaVersion).map { [String($0)] })
    #expect(
      try admin.query("SELECT \(columns) FROM \(schema).jobs ORDER BY id") == before, "every job as it was")
    #expect(try await store.isPaused(queue: "mail"), "the pause flag is kept")
    let mail = try await store.limits(queue: "mail")
    #expect(
      mail == QueueLimits(concurrency: 3, keyConcurrency: 1, keyConcurrencyOverrides: ["wide": 5]),
      "kept: \(mail)")
    try await store.setLimits(QueueLimits(keyRate: RateLimit(perSecond: 0.001)), queue: "sms")
    let added = try await store.enqueue(
      [NewJob(payload: Data("{}".utf8), limitKey: "h")], queue: "sms", clock: SystemJobClock())
    let batch = try await store.settleAndClaim(
      [], queue: "sms", limit: 5, lease: Lease(owner: "w", duration: .seconds(60)), clock: SystemJobClock())
    #expect(batch.claimed.map(\.id) == [JobID(3)], "the old job takes key h's one start")
    #expect(try await store.job(added[0].id)?.isHeldByLimit == true, "the new one is held by the rate")
    await store.close()
  }

  /// A version 5 schema's last errors were stored whole (nothing bounded them then): the list of
  /// errors a migrated job starts with keeps each within `JobHistory.maximumErrorBytes`, as every
  /// error recorded since.
  @Test func aVersion5JobsLongLastErrorIsBoundedInItsHistory() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("v5long")
    let admin = try AdminConnection(server.url)
    try createSchema(SQL(schema: schema), atVersion: 5, with: admin)
    // 6000 "é": 12000 bytes of UTF-8.
    try admin.query(
      """
      INSERT INTO \(schema).jobs (queue, payload, status, attempts, run_at, created_at, last_error, claim_token)
      VALUES ('mail', '\\x7b7d', 'dead', 3, now(), now(), repeat('é', 6000), 3)
      """)
    let store = try await PostgresJobStore.open(url: server.url, options: .init(schema: schema))
    let dead = try await store.jobs(queue: "mail", status: .dead, after: nil, limit: 10)
    #expect(dead.count == 1)
    let bytes = dead.first?.errors.first?.utf8.count ?? .max
    #expect(bytes <= JobHistory.maximumErrorBytes, "the migrated error keeps \(bytes) bytes")
    #expect(dead.first?.errors.first?.hasSuffix("…") == true)
    await store.close()
  }

  /// A waiting job stored before queue names were checked (version 3), in a queue whose name has
  /// a control character, can still be cancelled by its ID, as it could be when a cancel deleted
  /// it. The name check refuses any change of such a row, so it is deleted, as before.
  @Test func aJobOfAQueueNamedBeforeNamesWereCheckedCanBeCancelled() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("v3cancel")
    let admin = try AdminConnection(server.url)
    try createSchema(SQL(schema: schema), atVersion: 3, with: admin)
    try admin.query(
      """
      INSERT INTO \(schema).jobs (id, queue, payload, status, run_at, created_at)
      VALUES (7, E'bad\\rname', '\\x7b7d', 'ready', now(), now())
      """)
    let store = try await PostgresJobStore.open(url: server.url, options: .init(schema: schema))
    let results = try await store.cancel([JobID(7)], queue: nil, clock: SystemJobClock())
    #expect(results == [.cancelledWaiting])
    #expect(try await store.job(JobID(7)) == nil, "deleted: it never runs")
    #expect(try await store.cancel([JobID(7)], queue: nil, clock: SystemJobClock()) == [.notFound])
    await store.close()
  }

  /// A schema of version 3 is migrated to 4 while an application's transaction that added a job
  /// with `conveyor.enqueue` is still open: the migration (each of its statements bounded by
  /// `callTimeout`, at least 30 s) waits for it, instead of failing the opening after the
  /// `lockTimeout` meant for row locks.
  @Test func aMigrationWaitsForAnApplicationsOpenTransactionLongerThanTheLockTimeout() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("migwriter")
    let admin = try AdminConnection(server.url)
    try createSchema(SQL(schema: schema), atVersion: 3, with: admin)
    let writer = try AdminConnection(server.url)
    try writer.query("BEGIN")
    try writer.query("SELECT \(schema).enqueue('mail', '{}'::text)")
    nonisolated(unsafe) let unsafeWriter = writer
    Thread {
      Thread.sleep(forTimeInterval: 3)
      _ = try? unsafeWriter.query("COMMIT")
    }.start()
    do {
      let store = try await PostgresJobStore.open(
        url: server.url, options: .init(schema: schema, lockTimeout: .seconds(1)))
      #expect(try await store.counts(queue: "mail", clock: SystemJobClock()).ready == 1)
      await store.close()
    } catch {
      Issue.record("the migration failed instead of waiting for the application's transaction: \(error)")
    }
  }

  /// A `lockTimeout` under a millisecond is accepted (a queue's lease is checked against it as the
  /// bound of every lock wait) but sent as `0ms`, which PostgreSQL reads as no limit: a statement
  /// blocked by another session's row lock then waits for as long as that session holds it, and a
  /// worker can lose the lease of a job it still runs.
  @Test func aLockTimeoutUnderAMillisecondStillBoundsALockWait() async throws {
    // The job is added through a store of its own: with a lock wait of a millisecond, any wait
    // (another commit's notification lock on a busy server) fails a call.
    let (server, adder) = try await open()
    let schema = adder.options.schema
    let clock = SystemJobClock()
    let id = try await adder.enqueue([NewJob(payload: Data("x".utf8))], queue: "q", clock: clock)[0].id
    await adder.close()
    let (_, store) = try await open(schema, lockTimeout: .microseconds(500))
    let locker = try AdminConnection(server.url)
    try locker.query("BEGIN")
    try locker.query("SELECT 1 FROM \(schema).jobs WHERE id = \(id.rawValue) FOR UPDATE")
    let ended = Mutex(false)
    let removal = Task {
      defer { ended.withLock { $0 = true } }
      return try await store.remove([id], queue: "q")
    }
    // The row lock stays held (a minute at most): only the lock timeout can end the call here.
    let endedInTime = await eventually(timeout: .seconds(20)) { ended.withLock { $0 } }
    #expect(endedInTime, "the removal waited for the row lock with no limit")
    try locker.query("ROLLBACK")
    _ = await removal.result
    await store.close()
  }

  @Test func aLeaseShorterThanTwiceTheLockTimeoutIsRefusedNamingLockTimeout() async throws {
    let (_, store) = try await open(lockTimeout: .seconds(5))
    struct Item: Queueable { var n: Int }
    #expect {
      _ = try JobQueue<Item>(
        configuration: .init(identifier: "q", autoStart: false, leaseDuration: .seconds(9)), store: store
      ) { _, _ in .handled }
    } throws: { error in
      let text = String(describing: error)
      return text.contains("PostgresJobStore.Options.lockTimeout") && !text.contains("SQLite")
    }
    await store.close()
  }

  @Test func aNewerSchemaIsRefusedAndLeftUntouched() async throws {
    let (server, store) = try await open()
    let schema = store.options.schema
    _ = try await store.enqueue([NewJob(payload: Data("keep".utf8))], queue: "q", clock: SystemJobClock())
    await store.close()
    let admin = try AdminConnection(server.url)
    try admin.query(
      "INSERT INTO \(schema).schema_migrations (version) VALUES (\(PostgresJobStore.schemaVersion + 1))")
    let snapshot = """
      SELECT (SELECT string_agg(version::text, ',' ORDER BY version) FROM \(schema).schema_migrations),
        (SELECT string_agg(id || ':' || status || ':' || encode(payload, 'escape'), ',') FROM \(schema).jobs),
        (SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = '\(schema)'),
        (SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = '\(schema)')
      """
    let before = try admin.query(snapshot)
    #expect(throws: PostgresError.self) {
      _ = try PostgresJobStore(url: server.url, options: .init(schema: schema))
    }
    do {
      _ = try PostgresJobStore(url: server.url, options: .init(schema: schema))
    } catch let error as PostgresError {
      #expect(error.code == .newerSchema)
      #expect(error.description.contains("version \(PostgresJobStore.schemaVersion + 1)"), "\(error)")
    }
    #expect(try admin.query(snapshot) == before, "untouched")
  }

  @Test func aSchemaNameThatIsNotAPlainIdentifierIsRefused() async throws {
    let server = try await PostgresServer.shared()
    for name in [
      "", "Upper", "a-b", "x\"; DROP TABLE y; --", "1abc", "pg_catalog", String(repeating: "a", count: 51),
    ] {
      #expect {
        _ = try PostgresJobStore(url: server.url, options: .init(schema: name))
      } throws: { ($0 as? PostgresError)?.code == .invalidSchemaName }
    }
  }

  /// Timeouts that would make every call fail, or that the server refuses, are refused when the
  /// store opens, with the option's name. Before, a `callTimeout` of zero ended every statement
  /// within 10 ms ("the server did not answer"), and a negative `lockTimeout` failed the first
  /// connection with the server's "invalid value for parameter".
  @Test func timeoutsThatCannotWorkAreRefusedByName() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("options")
    let refused: [(PostgresJobStore.Options, String)] = [
      (.init(schema: schema, callTimeout: .zero), "callTimeout"),
      (.init(schema: schema, callTimeout: .milliseconds(-5)), "callTimeout"),
      (.init(schema: schema, callTimeout: .milliseconds(99)), "callTimeout"),
      (.init(schema: schema, lockTimeout: .milliseconds(-1)), "lockTimeout"),
      (.init(schema: schema, lockTimeout: .seconds(Int64.max)), "lockTimeout"),
      (.init(schema: schema, reconnectTimeout: .seconds(-1)), "reconnectTimeout"),
    ]
    for (options, name) in refused {
      #expect {
        _ = try PostgresJobStore(url: server.url, options: options)
      } throws: { error in
        guard let error = error as? PostgresError else { return false }
        return error.code == .invalidOptions && error.message.contains(name)
      }
    }
    // The limits themselves are allowed.
    let limits = try PostgresJobStore(
      url: server.url,
      options: .init(
        schema: schema, reconnectTimeout: .zero, lockTimeout: .zero, callTimeout: .milliseconds(100)))
    await limits.close()
    // And a reconnectTimeout of zero still lets a call open its connection once (it failed every
    // call at once: "the server did not complete the connection within -0.0 s"). (The default
    // callTimeout: a loaded machine can take longer than 100 ms to answer.)
    let store = try PostgresJobStore(url: server.url, options: .init(schema: schema, reconnectTimeout: .zero))
    #expect(try await store.counts(queue: "q", clock: SystemJobClock()).total == 0)
    await store.close()
  }

  /// A call that `callTimeout` ends says so, with the option's name: the store closes the
  /// connection of a call that got no answer in time, and reported what libpq then said ("server
  /// closed the connection unexpectedly … check that the server is running"), which sent a
  /// reader looking at a server that was up and only busy (a CI run, whose loaded machine took
  /// more than a test's 2 s `callTimeout` to migrate a schema, failed that way).
  @Test func aCallEndedByCallTimeoutSaysSo() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("calltimeout")
    let store = try await PostgresJobStore.open(
      url: server.url,
      options: .init(schema: schema, reconnectTimeout: .zero, lockTimeout: .zero, callTimeout: .seconds(1)))
    // Another session holds the jobs table; without a lock timeout the store's call waits for it.
    let holder = try AdminConnection(server.url)
    try holder.query("BEGIN")
    try holder.query("LOCK TABLE \(schema).jobs IN ACCESS EXCLUSIVE MODE")
    defer { _ = try? holder.query("ROLLBACK") }
    do {
      _ = try await store.counts(queue: "q", clock: SystemJobClock())
      Issue.record("a call blocked on a lock returned; callTimeout (1 s) should have ended it")
    } catch let error as PostgresError {
      #expect(error.code == .timedOut, "code \(error.code): \(error)")
      #expect(error.description.contains("callTimeout"), "\(error)")
      #expect(!error.description.contains("Check that the server is running"), "\(error)")
    }
    try holder.query("ROLLBACK")
    // The store goes on with a new connection. (A few tries: on a loaded machine one call can
    // outlast the second of callTimeout too, and this store does not try again.)
    var answered = false
    for _ in 0..<10 where !answered {
      answered = (try? await store.counts(queue: "q", clock: SystemJobClock()).total) == 0
    }
    #expect(answered, "the store answered no call after the lock was released")
    await store.close()
  }

  // MARK: Enqueue inside the application's transaction

  @Test func theEnqueueFunctionAddsAJobOnlyWhenTheTransactionCommits() async throws {
    let (server, store) = try await open()
    let schema = store.options.schema
    let app = try AdminConnection(server.url)
    try app.query("BEGIN")
    let rolledBack = try app.scalar("SELECT \(schema).enqueue('mail', '{\"number\":1}')")
    #expect(rolledBack != nil)
    try app.query("ROLLBACK")
    #expect(try await store.counts(queue: "mail", clock: SystemJobClock()).total == 0, "rolled back: no job")
    try app.query("BEGIN")
    let id = try #require(try app.scalar("SELECT \(schema).enqueue('mail', '{\"number\":2}', 5)"))
    let same = try app.scalar("SELECT \(schema).enqueue('mail', '{\"number\":3}'::text, 0, NULL, 'k')")
    let duplicate = try app.scalar("SELECT \(schema).enqueue('mail', '{\"number\":4}'::text, 0, NULL, 'k')")
    #expect(same == duplicate, "a waiting job's key deduplicates")
    #expect(
      try await store.counts(queue: "mail", clock: SystemJobClock()).total == 0, "not visible before commit")
    try app.query("COMMIT")
    let batch = try await store.settleAndClaim(
      [], queue: "mail", limit: 5, lease: Lease(owner: "w", duration: .seconds(60)), clock: SystemJobClock())
    #expect(batch.claimed.map(\.id.description) == [id, same!], "committed: both jobs, by priority")
    #expect(batch.claimed.first.map { String(decoding: $0.payload, as: UTF8.self) } == "{\"number\":2}")
    #expect(throws: HarnessError.self) { try app.query("SELECT \(schema).enqueue('bad name!', 'x')") }
    await store.close()
  }

  @Test func theEnqueueFunctionWithHostileTextIsOnlyData() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("fn")
    let store = try await openNamedStore(server, .init(schema: schema))
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

  // Failed before the fix: the SQL `enqueue` function stores any run date the caller passes, `'infinity'` and
  // dates after the year 9999 included (SQL.swift version1, `when_ := date_trunc(…, run_at)`),
  // while every store keeps dates clamped to `JobStoreTime.earliest...latest` ("Later dates (and
  // infinity) are clamped", JobStore.swift). The store then reports run dates no other store can
  // hold (year ~294,000), in listings and in `nextWake`.
  @Test func runDatesFromTheEnqueueFunctionAreClampedLikeTheStores() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("inf")
    let store = try await openNamedStore(server, .init(schema: schema))
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

  // MARK: Wake-ups

  @Test func anEnqueueWakesAWaitingStoreThroughNotify() async throws {
    let (server, store) = try await open()
    let other = try await PostgresJobStore.open(url: server.url, options: store.options)
    // The first wait starts the listener; the queue's loop waits over and over the same way.
    let notified = Atomic<Bool>(false)
    let woken = Task {
      if await store.waitForWork(queue: "q", timeout: .seconds(600)) {
        notified.store(true, ordering: .sequentiallyConsistent)
      }
    }
    // Enqueue until the listener (which starts with the first wait) has heard one.
    for _ in 0..<200 where !notified.load(ordering: .sequentiallyConsistent) {
      _ = try await other.enqueue([NewJob(payload: Data("a".utf8))], queue: "q", clock: SystemJobClock())
      try await Task.sleep(for: .milliseconds(100))
    }
    woken.cancel()
    let heard = notified.load(ordering: .sequentiallyConsistent)
    #expect(heard, "a notification arrived (the wait allowed 600 s)")
    await store.close()
    await other.close()
  }

  @Test func anIdleQueueStartsAJobAddedElsewhereWithoutWaitingForItsPoll() async throws {
    let (server, store) = try await open()
    let producer = try await PostgresJobStore.open(url: server.url, options: store.options)
    struct Item: Queueable { var number: Int }
    let handled = Mutex<[Int]>([])
    let (stream, continuation) = AsyncStream.makeStream(of: Int.self)
    // Polling every 10 minutes: only a notification can start the job within the test.
    let configuration = JobQueueConfiguration(identifier: "wake", pollInterval: .seconds(600))
    let queue = try JobQueue<Item>(configuration: configuration, store: store) { item, _ in
      handled.withLock { $0.append(item.number) }
      continuation.yield(item.number)
      return .handled
    }
    try await Task.sleep(for: .milliseconds(300))  // let the idle loop settle into its wait
    _ = try await producer.enqueue(
      [NewJob(payload: try JSONEncoder().encode(Item(number: 7)))], queue: "wake", clock: SystemJobClock())
    var iterator = stream.makeAsyncIterator()
    let first = await iterator.next()
    #expect(first == 7)
    await queue.shutdown(gracePeriod: .seconds(5))
    await store.close()
    await producer.close()
  }

  // MARK: Errors and cancellation

  @Test func aPasswordNeverAppearsInAnError() async throws {
    let secret = "pa55-w0rd-XYZ"
    for url in [
      "postgresql://someone:\(secret)@127.0.0.1:1/app?connect_timeout=2",
      "postgresql://someone:\(secret)@127.0.0.1:1/app?sslmode=bogus%zz",
      "host=127.0.0.1 port=1 password=\(secret) connect_timeout=2",
      "host=127.0.0.1 password='\(secret)' port=notaport",
    ] {
      do {
        _ = try PostgresJobStore(url: url)
        Issue.record("connected to \(url)?")
      } catch let error as PostgresError {
        #expect(!error.description.contains(secret), "\(error.description)")
        #expect(!error.debugDescription.contains(secret), "\(error.debugDescription)")
        #expect(!String(describing: error).contains(secret))
      }
    }
  }

  @Test func cancellingTheCallingTaskCancelsTheRunningStatement() async throws {
    let (server, store) = try await open(lockTimeout: .seconds(600))
    let schema = store.options.schema
    try await store.setPaused(false, queue: "q")
    // Another connection holds the queue's row, so setPaused waits for its lock (up to 600 s).
    let holder = try AdminConnection(server.url)
    try holder.query("BEGIN")
    try holder.query("SELECT * FROM \(schema).queues WHERE name = 'q' FOR UPDATE")
    let call = Task { try await store.setPaused(true, queue: "q") }
    try await Task.sleep(for: .milliseconds(300))
    call.cancel()
    await #expect(throws: CancellationError.self) { try await call.value }
    try holder.query("ROLLBACK")
    // The store still works, on the same connection or a new one.
    try await store.setPaused(true, queue: "q")
    #expect(try await store.isPaused(queue: "q"))
    await store.close()
  }

  @Test func aClosedStoreThrowsClosed() async throws {
    let (_, store) = try await open()
    await store.close()
    await #expect {
      _ = try await store.counts(queue: "q", clock: SystemJobClock())
    } throws: { ($0 as? PostgresError)?.code == .closed }
  }

  // MARK: Queues, schemas and keys kept apart

  @Test func twoSchemasDoNotInterfere() async throws {
    let server = try await PostgresServer.shared()
    let one = try await openNamedStore(server, .init(schema: uniqueSchema("rv")))
    let two = try await openNamedStore(server, .init(schema: uniqueSchema("rv")))
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

  /// Keys of odd content, equivalent variants, in one batch and across calls; a key too long for
  /// the index is refused with a clear error.
  @Test func oddAndLongKeysWork() async throws {
    let store = try await openCallerClockStore()
    var generator = SystemRandomNumberGenerator()
    let alphabet = Array("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
    let long = String((0..<6000).map { _ in alphabet.randomElement(using: &generator)! })
    let keys = [
      "caf\u{E9}", "cafe\u{301}", "", "\0", "a\0b", "a\u{FFFD}b", "a\u{323}\u{307}", "a\u{307}\u{323}",
      "\u{AC00}", "\u{1100}\u{1161}", "K", "\u{212A}", "\u{10FFFF}",
    ]
    let clock = FixedJobClock(epoch)
    let first = try await store.enqueue(
      (keys + keys.reversed()).map { NewJob(payload: Data($0.utf8), runAt: epoch, deduplicationKey: $0) },
      queue: "q", clock: clock)
    #expect(first.prefix(keys.count).allSatisfy { $0.inserted })
    #expect(Array(first.suffix(keys.count).map(\.id)) == first.prefix(keys.count).map(\.id).reversed())
    #expect(Set(first.map(\.id)).count == keys.count)
    let listed = try await store.jobs(queue: "q", status: nil, after: nil, limit: 100)
    #expect(listed.map { $0.deduplicationKey.map { Array($0.utf8) } } == keys.map { Array($0.utf8) })
    // A key too long for PostgreSQL's index (SQLite and the in-memory store take any length) is
    // refused with an error that says what to do, and nothing of the add is stored (a documented
    // limit of `NewJob.deduplicationKey`; the error was PostgreSQL's own before).
    let before = try await store.counts(queue: "q", clock: clock)
    do {
      _ = try await store.enqueue(
        [
          NewJob(payload: Data("short".utf8), runAt: epoch),
          NewJob(payload: Data("long".utf8), runAt: epoch, deduplicationKey: long),
        ], queue: "q", clock: clock)
      Issue.record("a 6000-character random key was taken; update the documented limit")
    } catch let error as PostgresError {
      #expect(error.description.contains("deduplication key of 6000 bytes is too long"), "\(error)")
      #expect(error.description.contains("use a shorter key"), "\(error)")
    }
    #expect(try await store.counts(queue: "q", clock: clock) == before, "nothing of the add was stored")
    await store.close()
  }

  // MARK: Deduplication scopes across connections

  /// `.waitingOrRunning` keeps at most one job of a key waiting or running while a worker on
  /// another connection hands the job back and claims it again: every add meanwhile finds it,
  /// whether it is running or waiting at that moment.
  @Test func waitingOrRunningFindsAJobHandedBackWhileTheAddLooks() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("wr")
    let adder = try await openNamedStore(server, .init(schema: schema))
    let worker = try await openNamedStore(server, .init(schema: schema))
    let clock = SystemJobClock()
    func add() async throws -> EnqueueResult {
      try await adder.enqueue(
        [NewJob(payload: Data("{}".utf8), deduplicationKey: "k", deduplicationScope: .waitingOrRunning)],
        queue: "q", clock: clock)[0]
    }
    let first = try await add()
    #expect(first.outcome == .inserted)
    let lease = Lease(owner: "w", duration: .seconds(60))
    let stop = Atomic<Bool>(false)
    // The worker claims the job and hands it back, over and over: running, waiting, running...
    let cycles = Task {
      var cycles = 0
      while !stop.load(ordering: .relaxed) {
        let batch = try await worker.settleAndClaim([], queue: "q", limit: 1, lease: lease, clock: clock)
        _ = try await worker.settleAndClaim(
          batch.claimed.map { JobSettlement(claim: $0.claim, action: .release(error: nil)) }, queue: "q",
          limit: 0, lease: lease, clock: clock)
        cycles += 1
      }
      return cycles
    }
    // The window is one round trip of the add: many tries, ending at the first job stored.
    var inserted: [JobID] = []
    var tries = 0
    while inserted.isEmpty && tries < 10_000 {
      let result = try await add()
      if result.outcome == .inserted { inserted.append(result.id) }
      tries += 1
    }
    stop.store(true, ordering: .relaxed)
    let ran = try await cycles.value
    let jobs = try await adder.jobs(queue: "q", status: nil, after: nil, limit: 100)
    #expect(
      inserted.isEmpty,
      "add \(tries) stored a second job of the key beside the one waiting or running (\(ran) claim cycles)")
    #expect(jobs.count == 1, "jobs of the key: \(jobs.map { ($0.id, $0.status) })")
    await adder.close()
    await worker.close()
  }

  /// A replace whose update a trigger drops (a `BEFORE UPDATE` trigger returning NULL) fails
  /// with an error that says so, as an insert whose row a trigger drops does, instead of looking
  /// for the waiting job and updating it again and again until the call times out.
  @Test func aReplaceWhoseUpdateATriggerDropsFailsWithAClearError() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("rt")
    let store = try await openNamedStore(
      server, .init(schema: schema, reconnectTimeout: .zero, callTimeout: .seconds(3)))
    let clock = SystemJobClock()
    func replace(_ text: String) -> NewJob {
      NewJob(payload: Data(text.utf8), deduplicationKey: "k", onConflict: .replace)
    }
    let first = try await store.enqueue([replace("a")], queue: "q", clock: clock)[0]
    #expect(first.outcome == .inserted)
    try AdminConnection(server.url).query(
      """
      CREATE FUNCTION \(schema).keep() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        IF NEW.payload <> OLD.payload THEN RETURN NULL; END IF;
        RETURN NEW;
      END $$;
      CREATE TRIGGER keep BEFORE UPDATE ON \(schema).jobs FOR EACH ROW EXECUTE FUNCTION \(schema).keep();
      """)
    let call = Task { try await store.enqueue([replace("b")], queue: "q", clock: clock) }
    let ended = Task {
      try? await Task.sleep(for: .seconds(30))
      call.cancel()
    }
    do {
      let results = try await call.value
      Issue.record("the dropped replace was reported as \(results)")
    } catch {
      #expect(
        "\(error)".contains("not updated") || "\(error)".contains("trigger"),
        "the error does not say the replace was dropped: \(error)")
    }
    ended.cancel()
    #expect(try await store.job(first.id).map { String(decoding: $0.payload, as: UTF8.self) } == "a")
    await store.close()
  }

  /// Replaces racing a worker on another connection that claims and completes the key's job:
  /// a claimed job keeps the payload it was claimed with, and every add is kept (it replaced a
  /// waiting job or stored a new one): the last add's payload is the one left waiting.
  @Test func aReplaceNeverChangesAClaimedJobAndNeverLosesTheAdd() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("rc")
    let adder = try await openNamedStore(server, .init(schema: schema))
    let worker = try await openNamedStore(server, .init(schema: schema))
    let clock = SystemJobClock()
    let lease = Lease(owner: "w", duration: .seconds(60))
    let stop = Atomic<Bool>(false)
    let claims = Task { () -> [(JobID, Data)] in
      var claimed: [(JobID, Data)] = []
      var settling: [JobSettlement] = []
      while !stop.load(ordering: .relaxed) {
        let batch = try await worker.settleAndClaim(
          settling, queue: "q", limit: 1, lease: lease, clock: clock)
        claimed += batch.claimed.map { ($0.id, $0.payload) }
        settling = batch.claimed.map { JobSettlement(claim: $0.claim, action: .complete) }
      }
      _ = try await worker.settleAndClaim(settling, queue: "q", limit: 0, lease: lease, clock: clock)
      return claimed
    }
    var outcomes: [EnqueueOutcome] = []
    for add in 0..<1_500 {
      let result = try await adder.enqueue(
        [NewJob(payload: Data("\(add)".utf8), deduplicationKey: "k", onConflict: .replace)], queue: "q",
        clock: clock)[0]
      outcomes.append(result.outcome)
    }
    stop.store(true, ordering: .relaxed)
    let claimed = try await claims.value
    for (id, payload) in claimed {
      let stored = try await adder.job(id)
      #expect(stored?.payload == payload, "job \(id) was claimed with one payload and completed with another")
    }
    let waiting = try await adder.jobs(queue: "q", status: .pending, after: nil, limit: 10)
    let last = waiting.last.map { String(decoding: $0.payload, as: UTF8.self) }
    let lastClaimed = claimed.last.map { String(decoding: $0.1, as: UTF8.self) }
    #expect(
      last == "1499" || (waiting.isEmpty && lastClaimed == "1499"),
      "the last add: \(String(describing: last))")
    #expect(outcomes.allSatisfy { $0 != .existing }, "an add was dropped")
    #expect(claimed.count > 1, "the worker claimed \(claimed.count) jobs")
    await adder.close()
    await worker.close()
  }
}
