import CSQLite
import Conveyor
import ConveyorTestSupport
import Foundation
import Testing

@testable import ConveyorSQLite

/// A database written by the previous release (schema version 1) is migrated when opened, with
/// every job kept.
@Suite("SQLite schema migration")
struct MigrationTests {
  /// Version 1's schema, as the previous release wrote it.
  static let version1 = """
    CREATE TABLE jobs (
      id INTEGER PRIMARY KEY AUTOINCREMENT, queue TEXT NOT NULL, payload BLOB NOT NULL,
      status TEXT NOT NULL CHECK (status IN ('pending', 'running', 'dead')),
      priority INTEGER NOT NULL DEFAULT 0, attempts INTEGER NOT NULL DEFAULT 0, run_at INTEGER NOT NULL,
      created_at INTEGER NOT NULL, last_error TEXT, dedup_key TEXT, lease_owner TEXT, lease_expires_at INTEGER
    );
    CREATE INDEX jobs_ready ON jobs (queue, priority DESC, run_at, id) WHERE status = 'pending';
    CREATE INDEX jobs_dedup ON jobs (queue, dedup_key)
      WHERE dedup_key IS NOT NULL AND status IN ('pending', 'running');
    CREATE INDEX jobs_lease ON jobs (queue, lease_expires_at) WHERE status = 'running';
    CREATE INDEX jobs_dead ON jobs (queue, id) WHERE status = 'dead';
    CREATE TABLE queues (name TEXT PRIMARY KEY, paused INTEGER NOT NULL DEFAULT 1) WITHOUT ROWID;
    PRAGMA application_id = 1131312761;
    PRAGMA user_version = 1;
    """

  struct SQLFailure: Error { var description: String }

  func execute(_ path: String, _ sql: String) throws {
    var db: OpaquePointer?
    guard sqlite3_open(path, &db) == SQLITE_OK else { throw SQLFailure(description: "open") }
    defer { sqlite3_close(db) }
    // A store just let go may still be closing its connection on its own thread.
    sqlite3_busy_timeout(db, 30_000)
    var message: UnsafeMutablePointer<CChar>?
    guard sqlite3_exec(db, sql, nil, nil, &message) == SQLITE_OK else {
      throw SQLFailure(description: message.map { String(cString: $0) } ?? "exec failed")
    }
  }

  @Test func aVersion1DatabaseIsMigratedWithEveryJobKept() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("old.sqlite")
    let t = 1_700_000_000_000
    try execute(
      path,
      Self.version1 + """
        INSERT INTO jobs VALUES (1, 'mail', x'7b7d', 'pending', 0, 0, \(t), \(t), NULL, 'k', NULL, NULL);
        INSERT INTO jobs VALUES (2, 'mail', x'7b7d', 'pending', 5, 2, \(t + 86_400_000_000), \(t), 'boom', NULL, NULL, NULL);
        INSERT INTO jobs VALUES (3, 'mail', x'7b7d', 'running', 0, 1, \(t), \(t), NULL, NULL, 'gone:1', \(t + 60_000));
        INSERT INTO jobs VALUES (4, 'mail', x'7b7d', 'dead', 0, 3, \(t), \(t), 'fatal', 'k', NULL, NULL);
        INSERT INTO jobs VALUES (5, 'other', x'7b7d', 'pending', 0, 0, \(t), \(t), NULL, NULL, NULL, NULL);
        INSERT INTO queues VALUES ('paused-queue', 1);
        DELETE FROM jobs WHERE id = 5;
        UPDATE sqlite_sequence SET seq = 41 WHERE name = 'jobs';
        """)
    let store = try SQLiteJobStore(path: path)
    let now = FixedJobClock(Date(timeIntervalSince1970: 1_700_000_100))
    let jobs = try await store.jobs(queue: "mail", status: nil, after: nil, limit: 10)
    #expect(jobs.map(\.id.rawValue) == [1, 2, 3, 4])
    #expect(jobs.map(\.status) == [.pending, .pending, .running, .dead])
    #expect(jobs[1].lastError == "boom" && jobs[1].attempts == 2 && jobs[1].priority == 5)
    #expect(jobs[3].deduplicationKey == "k" && jobs[3].lastError == "fatal")
    #expect(
      try await store.counts(queue: "mail", clock: now)
        == JobCounts(ready: 1, scheduled: 1, running: 1, dead: 1))
    #expect(try await store.queueNames() == ["mail", "paused-queue"])
    #expect(try await store.isPaused(queue: "paused-queue"))
    // The waiting job still holds its key; new IDs continue after the old counter (no reuse).
    let dup = try await store.enqueue(
      [NewJob(payload: Data("{}".utf8), deduplicationKey: "k")], queue: "mail", clock: now)
    #expect(dup == [EnqueueResult(id: JobID(1), inserted: false)])
    let new = try await store.enqueue([NewJob(payload: Data("{}".utf8))], queue: "mail", clock: now)
    #expect(new.first?.id == JobID(42))
    // The due jobs are claimed in order; the job a version 1 worker held runs again after its lease.
    let claimed = try await store.settleAndClaim(
      [], queue: "mail", limit: 5, lease: Lease(owner: "new", duration: .seconds(60)), clock: now)
    #expect(claimed.claimed.map(\.id.rawValue) == [1, 42])
    let later = FixedJobClock(Date(timeIntervalSince1970: 1_700_000_061))
    #expect(try await store.rescueExpiredLeases(queue: "mail", clock: later) == 1)
    // Opening again does nothing more.
    let again = try SQLiteJobStore(path: path)
    #expect(try await again.counts(queue: "mail", clock: later).total == 5)
  }

  /// Version 2's schema, as the release before the activity table wrote it.
  static let version2 = """
    CREATE TABLE jobs (
      id INTEGER PRIMARY KEY AUTOINCREMENT, queue TEXT NOT NULL, payload BLOB NOT NULL,
      status TEXT NOT NULL CHECK (status IN ('ready', 'scheduled', 'running', 'dead')),
      priority INTEGER NOT NULL DEFAULT 0, attempts INTEGER NOT NULL DEFAULT 0, run_at INTEGER NOT NULL,
      created_at INTEGER NOT NULL, last_error TEXT, dedup_key TEXT, lease_owner TEXT, lease_expires_at INTEGER,
      claim_token INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX jobs_ready ON jobs (queue, priority DESC, run_at, id) WHERE status = 'ready';
    CREATE INDEX jobs_scheduled ON jobs (queue, run_at) WHERE status = 'scheduled';
    CREATE INDEX jobs_dedup ON jobs (queue, dedup_key)
      WHERE dedup_key IS NOT NULL AND status IN ('ready', 'scheduled');
    CREATE INDEX jobs_running ON jobs (queue, id) WHERE status = 'running';
    CREATE INDEX jobs_dead ON jobs (queue, id) WHERE status = 'dead';
    CREATE TABLE queues (name TEXT PRIMARY KEY, paused INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;
    PRAGMA application_id = 1131312761;
    PRAGMA user_version = 2;
    """

  @Test func aVersion2DatabaseGainsTheActivityTableWithEveryJobKept() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("v2.sqlite")
    let t = 1_700_000_000_000
    try execute(
      path,
      Self.version2 + """
        INSERT INTO jobs VALUES (1, 'mail', x'7b7d', 'ready', 2, 0, \(t), \(t), NULL, 'k', NULL, NULL, 0);
        INSERT INTO jobs VALUES (2, 'mail', x'7b7d', 'scheduled', 0, 1, \(t + 60_000), \(t), 'boom', NULL, NULL, NULL, 1);
        INSERT INTO jobs VALUES (3, 'mail', x'7b7d', 'running', 0, 1, \(t), \(t), NULL, NULL, 'w:1', \(t + 60_000), 4);
        INSERT INTO jobs VALUES (4, 'other', x'7b7d', 'dead', 0, 3, \(t), \(t), 'fatal', NULL, NULL, NULL, 3);
        INSERT INTO queues VALUES ('mail', 0), ('other', 1);
        """)
    let store = try SQLiteJobStore(path: path)
    let now = FixedJobClock(Date(timeIntervalSince1970: 1_700_000_010))
    let version = try await store.connection.perform { db in
      try db.scalar("SELECT user_version FROM pragma_user_version") ?? 0
    }
    #expect(version == SQLiteJobStore.schemaVersion)
    let mail = try await store.jobs(queue: "mail", status: nil, after: nil, limit: 10)
    #expect(mail.map(\.id.rawValue) == [1, 2, 3])
    #expect(mail.map(\.claimToken) == [0, 1, 4] && mail[1].lastError == "boom" && mail[0].priority == 2)
    #expect(
      try await store.counts(queue: "mail", clock: now) == JobCounts(ready: 1, scheduled: 1, running: 1))
    #expect(try await store.counts(queue: "other", clock: now) == JobCounts(dead: 1))
    #expect(try await store.isPaused(queue: "other"))
    #expect(
      try await store.oldestReadyRunDate(queue: "mail", clock: now)
        == Date(timeIntervalSince1970: 1_700_000_000))
    // The new table works.
    let minute = Date()
    try await store.recordActivity([QueueActivity(queue: "mail", minute: minute, succeeded: 2)])
    #expect(try await store.activity(since: minute, limit: 10).map(\.succeeded) == [2])
    // New IDs continue after the old ones.
    let new = try await store.enqueue([NewJob(payload: Data("{}".utf8))], queue: "mail", clock: now)
    #expect(new.first?.id == JobID(5))
  }

  /// Version 3's schema, as the release of 2026-12-05 wrote it (version 2 and the activity table).
  static let version3 =
    version2.replacingOccurrences(of: "PRAGMA user_version = 2;", with: "")
      + """
      CREATE TABLE activity (
        queue TEXT NOT NULL, minute INTEGER NOT NULL, succeeded INTEGER NOT NULL DEFAULT 0,
        retried INTEGER NOT NULL DEFAULT 0, died INTEGER NOT NULL DEFAULT 0, started INTEGER NOT NULL DEFAULT 0,
        wait_total_ms INTEGER NOT NULL DEFAULT 0, wait_max_ms INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (queue, minute)
      ) WITHOUT ROWID;
      CREATE INDEX activity_minute ON activity (minute);
      PRAGMA user_version = 3;
      """

  @Test func aVersion3DatabaseIsMigratedWithEveryJobAndItsPlaceKept() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("v3.sqlite")
    let t = 1_700_000_000_000
    try execute(
      path,
      Self.version3 + """
        INSERT INTO jobs VALUES (1, 'mail', x'7b7d', 'ready', 0, 0, \(t), \(t), NULL, 'k', NULL, NULL, 0);
        INSERT INTO jobs VALUES (2, 'mail', x'7b7d', 'ready', 0, 2, \(t), \(t), 'boom', NULL, NULL, NULL, 2);
        INSERT INTO jobs VALUES (3, 'mail', x'7b7d', 'running', 0, 1, \(t), \(t), NULL, NULL, 'w:1', \(t + 60_000), 4);
        INSERT INTO jobs VALUES (4, 'mail', x'7b7d', 'scheduled', 0, 0, \(t + 3_600_000), \(t), NULL, NULL, NULL, NULL, 0);
        INSERT INTO jobs VALUES (5, 'other', x'7b7d', 'dead', 0, 3, \(t), \(t), 'fatal', NULL, NULL, NULL, 3);
        INSERT INTO queues VALUES ('mail', 0), ('other', 1);
        INSERT INTO activity VALUES ('mail', \(t), 7, 1, 0, 8, 10, 5);
        DELETE FROM jobs WHERE id = 5;
        INSERT INTO jobs VALUES (6, 'other', x'7b7d', 'dead', 0, 3, \(t), \(t), 'fatal', NULL, NULL, NULL, 3);
        """)
    let store = try SQLiteJobStore(path: path)
    let version = try await store.connection.perform { db in
      try db.scalar("SELECT user_version FROM pragma_user_version") ?? 0
    }
    #expect(version == SQLiteJobStore.schemaVersion)
    let now = FixedJobClock(Date(timeIntervalSince1970: 1_700_000_000))
    let mail = try await store.jobs(queue: "mail", status: nil, after: nil, limit: 10)
    #expect(mail.map(\.id.rawValue) == [1, 2, 3, 4])
    #expect(mail.map(\.claimToken) == [0, 2, 4, 0] && mail[1].lastError == "boom" && mail[1].attempts == 2)
    #expect(
      try await store.counts(queue: "mail", clock: now) == JobCounts(ready: 2, scheduled: 1, running: 1))
    #expect(try await store.counts(queue: "other", clock: now) == JobCounts(dead: 1))
    #expect(try await store.isPaused(queue: "other"))
    #expect(
      try await store.activity(since: Date(timeIntervalSince1970: 1_700_000_000), limit: 10).map(\.succeeded)
        == [7])
    // The ready jobs keep their order; a job retried with no delay now goes behind them.
    let lease = Lease(owner: "new", duration: .seconds(60))
    let first = try await store.settleAndClaim([], queue: "mail", limit: 1, lease: lease, clock: now)
    #expect(first.claimed.map(\.id.rawValue) == [1])
    let retried = JobSettlement(claim: first.claimed[0].claim, action: .retry(after: .zero, error: nil))
    let next = try await store.settleAndClaim([retried], queue: "mail", limit: 2, lease: lease, clock: now)
    #expect(next.claimed.map(\.id.rawValue) == [2, 1])
    // The claim reads the new index.
    let plan = try await store.connection.perform { db -> String in
      var details: [String] = []
      try db.query("EXPLAIN QUERY PLAN \(SQL.selectReady)", .text("mail"), .integer(1)) {
        details.append($0.text(3) ?? "")
      }
      return details.joined(separator: "; ")
    }
    #expect(plan.contains("jobs_ready") && !plan.contains("TEMP B-TREE"), "\(plan)")
    // New IDs continue after the old ones, and opening again changes nothing.
    let new = try await store.enqueue([NewJob(payload: Data("{}".utf8))], queue: "mail", clock: now)
    #expect(new.first?.id == JobID(7))
    let again = try SQLiteJobStore(path: path)
    #expect(try await again.counts(queue: "mail", clock: now).total == 5)
  }

  /// Version 4's schema: version 3 and its migration to 4, as the release of 2026-12-06 wrote it.
  static let version4 =
    version3.replacingOccurrences(of: "PRAGMA user_version = 3;", with: "") + SQL.migrate3to4

  @Test func aVersion4DatabaseGainsTimeLimitsWithEveryJobKept() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("v4.sqlite")
    let t = 1_700_000_000_000
    try execute(
      path,
      Self.version4 + """
        INSERT INTO jobs VALUES (1, 'mail', x'7b7d', 'ready', 0, 0, \(t), \(t), NULL, 'k', NULL, NULL, 0, 0);
        INSERT INTO jobs VALUES (2, 'mail', x'7b7d', 'running', 0, 1, \(t), \(t), NULL, NULL, 'w:1', \(t + 60_000), 4, 0);
        INSERT INTO jobs VALUES (3, 'mail', x'7b7d', 'dead', 0, 3, \(t), \(t), 'fatal', NULL, NULL, NULL, 3, 0);
        INSERT INTO queues VALUES ('mail', 0, 0);
        """)
    let store = try SQLiteJobStore(path: path)
    let version = try await store.connection.perform { db in
      try db.scalar("SELECT user_version FROM pragma_user_version") ?? 0
    }
    #expect(version == SQLiteJobStore.schemaVersion)
    let now = FixedJobClock(Date(timeIntervalSince1970: 1_700_000_000))
    let mail = try await store.jobs(queue: "mail", status: nil, after: nil, limit: 10)
    #expect(mail.map(\.id.rawValue) == [1, 2, 3])
    #expect(mail.allSatisfy { $0.timeLimit == nil }, "jobs stored before keep the queue's limit")
    #expect(try await store.counts(queue: "mail", clock: now) == JobCounts(ready: 1, running: 1, dead: 1))
    let new = try await store.enqueue(
      [NewJob(payload: Data("{}".utf8), timeLimit: .seconds(5))], queue: "mail", clock: now)
    #expect(try await store.job(new[0].id)?.timeLimit == .seconds(5))
  }

  /// Version 5's schema: version 4 and its migration to 5, as the release of 2026-12-06 wrote it.
  static let version5 =
    version4.replacingOccurrences(of: "PRAGMA user_version = 4;", with: "") + SQL.migrate4to5

  @Test func aVersion5DatabaseGainsTheHistoryWithEveryJobKept() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("v5.sqlite")
    let t = 1_700_000_000_000
    // IDs up to 40 were used (the counter), jobs 1 to 4 are left: one waiting with an error of an
    // earlier attempt, one running, one dead, one waiting with a time limit.
    try execute(
      path,
      Self.version5 + """
        INSERT INTO jobs VALUES (1, 'mail', x'7b7d', 'ready', 0, 1, \(t), \(t), 'flaky', 'k', NULL, NULL, 1, 0, NULL);
        INSERT INTO jobs VALUES (2, 'mail', x'7b7d', 'running', 0, 1, \(t), \(t), NULL, NULL, 'w:1', \(t + 60_000), 4, 0, NULL);
        INSERT INTO jobs VALUES (3, 'mail', x'7b7d', 'dead', 0, 3, \(t), \(t), 'fatal', NULL, NULL, NULL, 3, 0, NULL);
        INSERT INTO jobs VALUES (4, 'mail', x'7b7d', 'scheduled', 5, 0, \(t + 9_000), \(t), NULL, NULL, NULL, NULL, 0, 0, 2500);
        INSERT INTO queues VALUES ('mail', 0, 0);
        UPDATE sqlite_sequence SET seq = 40 WHERE name = 'jobs';
        """)
    let before = Date()
    let store = try SQLiteJobStore(path: path)
    let version = try await store.connection.perform { db in
      try db.scalar("SELECT user_version FROM pragma_user_version") ?? 0
    }
    #expect(version == SQLiteJobStore.schemaVersion)
    let now = FixedJobClock(Date(timeIntervalSince1970: 1_700_000_000))
    let mail = try await store.jobs(queue: "mail", status: nil, after: nil, limit: 10)
    #expect(mail.map(\.id.rawValue) == [1, 2, 3, 4])
    #expect(mail.map(\.status) == [.pending, .running, .dead, .pending])
    #expect(mail[0].errors == ["flaky"] && mail[0].lastError == "flaky" && mail[0].deduplicationKey == "k")
    #expect(mail[1].leaseOwner == "w:1" && mail[1].claimToken == 4 && mail[1].finishedAt == nil)
    // The dead job counts as finished when it was migrated: no retention prunes it at once.
    #expect(
      mail[2].errors == ["fatal"] && (mail[2].finishedAt ?? .distantPast) >= before.addingTimeInterval(-1))
    #expect(mail[3].timeLimit == .milliseconds(2_500) && mail[3].priority == 5)
    let pruned = try await store.prune(
      queue: "mail", status: .dead, olderThan: .seconds(86_400), limit: 10, clock: SystemJobClock())
    #expect(pruned == 0)
    #expect(
      try await store.counts(queue: "mail", clock: now)
        == JobCounts(ready: 1, scheduled: 1, running: 1, dead: 1))
    // The counter is carried over: a new job takes 41, not 5.
    let new = try await store.enqueue([NewJob(payload: Data("{}".utf8))], queue: "mail", clock: now)
    #expect(new.first?.id == JobID(41))
    // The deduplication key still holds, and the running job's claim still settles, kept as
    // history.
    let duplicate = try await store.enqueue(
      [NewJob(payload: Data("{}".utf8), deduplicationKey: "k")], queue: "mail", clock: now)
    #expect(duplicate.first == EnqueueResult(id: JobID(1), inserted: false))
    let settled = try await store.settleAndClaim(
      [JobSettlement(claim: mail[1].claim, action: .complete)], queue: "mail", limit: 0,
      lease: Lease(owner: "w:2", duration: .seconds(60)), clock: now)
    #expect(settled.staleSettlements.isEmpty)
    #expect(try await store.job(mail[1].id)?.status == .completed)
  }

  /// A version 6 database (the release of 2026-12-06, history) gains the index of keyed running
  /// and completed jobs, with every job kept; the wider deduplication scopes then see the jobs
  /// stored before. The file is made by this build and taken back to version 6's schema, which
  /// differs from version 10's by that index, the schedules table and the queues' limits.
  @Test func aVersion6DatabaseGainsTheKeyedIndexWithEveryJobKept() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("v6.sqlite")
    let t = 1_700_000_000_000
    try createVersion13(path)
    try execute(
      path,
      """
      DROP INDEX jobs_keyed;
      DROP TABLE schedules;
      ALTER TABLE queues DROP COLUMN concurrency;
      \(Self.dropVersion12)
      \(Self.dropRateColumns)
      PRAGMA user_version = 6;
      INSERT INTO queues (name) VALUES ('mail');
      INSERT INTO jobs (queue, payload, status, attempts, run_at, created_at, dedup_key, lease_owner,
        lease_expires_at, claim_token, finished_at) VALUES
      ('mail', x'7b7d', 'running', 1, \(t), \(t), 'r', 'w:1', \(t + 60_000), 1, NULL),
      ('mail', x'7b7d', 'completed', 1, \(t), \(t), 'c', NULL, NULL, 1, \(t - 600_000)),
      ('mail', x'7b7d', 'ready', 0, \(t), \(t), NULL, NULL, NULL, 0, NULL);
      """)
    let store = try SQLiteJobStore(path: path)
    let (version, index) = try await store.connection.perform { db in
      (
        try db.scalar("SELECT user_version FROM pragma_user_version") ?? 0,
        try db.scalar("SELECT count(*) FROM sqlite_master WHERE name = 'jobs_keyed'") ?? 0
      )
    }
    #expect(version == SQLiteJobStore.schemaVersion && index == 1)
    let mail = try await store.jobs(queue: "mail", status: nil, after: nil, limit: 10)
    #expect(mail.map(\.status) == [.running, .completed, .pending])
    let now = FixedJobClock(Date(timeIntervalSince1970: 1_700_000_000))
    let found = try await store.addScopedProbes(queue: "mail", clock: now)
    #expect(found.map(\.outcome) == [.existing, .existing, .inserted])
    #expect(found[0].id == mail[0].id && found[1].id == mail[1].id)
  }

  /// A version 7 database (the release of 2026-12-06, deduplication scopes) gains the schedules
  /// table with every job kept, and schedules then fire into it. The file is made by this build
  /// and taken back to version 7's schema, which differs from version 8's by that table alone.
  @Test func aVersion7DatabaseGainsTheSchedulesTableWithEveryJobKept() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("v7.sqlite")
    let t = 1_700_000_000_000
    try createVersion13(path)
    try execute(
      path,
      """
      DROP TABLE schedules;
      ALTER TABLE queues DROP COLUMN concurrency;
      \(Self.dropVersion12)
      \(Self.dropRateColumns)
      PRAGMA user_version = 7;
      INSERT INTO queues (name) VALUES ('mail');
      INSERT INTO jobs (queue, payload, status, attempts, run_at, created_at, claim_token) VALUES
      ('mail', x'7b7d', 'ready', 0, \(t), \(t), 0),
      ('mail', x'7b7d', 'scheduled', 0, \(t + 60_000), \(t), 0);
      """)
    let store = try SQLiteJobStore(path: path)
    let version = try await store.connection.perform { db in
      try db.scalar("SELECT user_version FROM pragma_user_version") ?? 0
    }
    #expect(version == SQLiteJobStore.schemaVersion)
    let before = try await store.jobs(queue: "mail", status: nil, after: nil, limit: 10)
    #expect(before.map(\.id) == [JobID(1), JobID(2)])
    let start = FixedJobClock(Date(timeIntervalSince1970: 1_700_000_000))
    let schedule = try ScheduleDefinition(
      name: "tick", timing: try ScheduleTiming(every: .seconds(100)), payload: Data("{}".utf8))
    _ = try await store.saveSchedules([schedule], queue: "mail", origin: .added, clock: start)
    let fired = try await store.fireDueSchedules(
      queue: "mail", clock: FixedJobClock(Date(timeIntervalSince1970: 1_700_000_100)))
    #expect(fired.added == [JobID(3)])
  }

  /// A version 8 database (the release of 2026-12-06, schedules) is rebuilt with the held state
  /// and the ordering-key column, every job kept as it was (status, lease, key, history, output)
  /// and the ID counter carried over; ordering keys then work on it.
  @Test func aVersion8DatabaseIsRebuiltForOrderingKeysWithEveryJobKept() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("v8.sqlite")
    let t = 1_700_000_000_000
    try execute(
      path,
      """
      \(SQL.tablesVersion6)
      \(SQL.indexesVersion7)
      \(SQL.queuesTableVersion4)
      \(SQL.activityTable)
      \(SQL.schedulesTable)
      PRAGMA application_id = \(SQLiteJobStore.applicationID);
      PRAGMA user_version = 8;
      INSERT INTO queues (name) VALUES ('mail');
      INSERT INTO jobs (id, queue, payload, status, priority, attempts, run_at, created_at, last_error, dedup_key,
        lease_owner, lease_expires_at, claim_token, seq, time_limit_ms, finished_at, errors, run_ms, output) VALUES
      (1, 'mail', x'7b7d', 'ready', 3, 0, \(t), \(t), NULL, 'k', NULL, NULL, 0, 0, NULL, NULL, NULL, NULL, NULL),
      (2, 'mail', x'7b7d', 'scheduled', 0, 1, \(t + 60_000), \(t), 'e', NULL, NULL, NULL, 1, 2, 2500, NULL,
        '["e"]', 12, NULL),
      (3, 'mail', x'7b7d', 'running', 0, 1, \(t), \(t), NULL, NULL, 'w:1', \(t + 60_000), 4, 0, NULL, NULL, NULL,
        NULL, NULL),
      (4, 'mail', x'7b7d', 'dead', 0, 3, \(t), \(t), 'fatal', NULL, NULL, NULL, 3, 0, NULL, \(t), '["fatal"]', 5,
        NULL),
      (40, 'mail', x'7b7d', 'completed', 0, 1, \(t), \(t), NULL, 'c', NULL, NULL, 1, 0, NULL, \(t), NULL, 7,
        x'7b2278223a317d');
      """)
    let before = try readRows(path)
    let store = try SQLiteJobStore(path: path)
    let (version, indexes) = try await store.connection.perform { db in
      (
        try db.scalar("SELECT user_version FROM pragma_user_version") ?? 0,
        try db.scalar("SELECT count(*) FROM sqlite_master WHERE name IN ('jobs_line', 'jobs_held')") ?? 0
      )
    }
    #expect(version == SQLiteJobStore.schemaVersion && indexes == 2)
    await store.close()
    #expect(try readRows(path) == before, "every column of every job as it was")
    let reopened = try SQLiteJobStore(path: path)
    let mail = try await reopened.jobs(queue: "mail", status: nil, after: nil, limit: 10)
    #expect(mail.map(\.status) == [.pending, .pending, .running, .dead, .completed])
    #expect(mail.allSatisfy { $0.orderingKey == nil && !$0.isHeld })
    #expect(mail[2].leaseOwner == "w:1" && mail[2].claimToken == 4)
    let now = FixedJobClock(Date(timeIntervalSince1970: 1_700_000_000))
    let added = try await reopened.enqueue(
      [
        NewJob(payload: Data("{}".utf8), orderingKey: "order-1"),
        NewJob(payload: Data("{}".utf8), orderingKey: "order-1"),
      ], queue: "mail", clock: now)
    #expect(added.map(\.id) == [JobID(41), JobID(42)], "the counter is carried over")
    #expect(try await reopened.job(JobID(42))?.isHeld == true)
    let duplicate = try await reopened.enqueue(
      [NewJob(payload: Data("{}".utf8), deduplicationKey: "k")], queue: "mail", clock: now)
    #expect(duplicate.first == EnqueueResult(id: JobID(1), inserted: false), "keys still deduplicate")
  }

  /// Writes a version 13 database at `path`: this build's schema without what version 14 adds.
  func createVersion13(_ path: String) throws {
    let schema = SQL.schema.replacingOccurrences(of: SQL.version14, with: "")
      .replacingOccurrences(
        of: "PRAGMA user_version = \(SQLiteJobStore.schemaVersion);", with: "PRAGMA user_version = 13;")
    try execute(path, "PRAGMA journal_mode = WAL;\n" + schema)
  }

  /// A version 13 database (the release of 2026-12-07, rates per key) gains fair shares with every
  /// job, its place, and the jobs a key's limit holds kept; no job has a fairness key, so the claim
  /// order is the run date's as before, and fair shares then work on it.
  @Test func aVersion13DatabaseGainsFairSharesWithEveryJobAndPlaceKept() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("v13.sqlite")
    let t = 1_700_000_000_000
    try createVersion13(path)
    try execute(
      path,
      """
      INSERT INTO queues (name, paused, key_concurrency) VALUES ('mail', 0, 1);
      INSERT INTO jobs (queue, payload, status, attempts, run_at, created_at, claim_token, limit_key, parked,
        lease_owner, lease_expires_at, seq) VALUES
      ('mail', x'7b7d', 'running', 1, \(t), \(t), 1, 'h', NULL, 'w', \(t + 60_000), 0),
      ('mail', x'7b7d', 'held', 0, \(t), \(t), 0, 'h', 1, NULL, NULL, 0),
      ('mail', x'7b7d', 'ready', 0, \(t + 5), \(t), 0, NULL, NULL, NULL, NULL, 0),
      ('mail', x'7b7d', 'ready', 0, \(t + 1), \(t), 0, NULL, NULL, NULL, NULL, 3),
      ('mail', x'7b7d', 'ready', 0, \(t + 1), \(t), 0, NULL, NULL, NULL, NULL, 1);
      """)
    let before = try readRows(path)
    let store = try SQLiteJobStore(path: path)
    let version = try await store.connection.perform { db in
      try db.scalar("SELECT user_version FROM pragma_user_version") ?? 0
    }
    #expect(version == SQLiteJobStore.schemaVersion)
    await store.close()
    #expect(try readRows(path) == before, "every column of every job as it was")
    let reopened = try SQLiteJobStore(path: path)
    #expect(try await reopened.job(JobID(2))?.isHeldByLimit == true, "the held job is still held")
    #expect(try await reopened.job(JobID(3))?.fairnessKey == nil, "a job stored before has no fairness key")
    let now = FixedJobClock(Date(timeIntervalSince1970: 1_700_000_000))
    let lease = Lease(owner: "w", duration: .seconds(60))
    let first = try await reopened.settleAndClaim([], queue: "mail", limit: 5, lease: lease, clock: now)
    #expect(first.claimed.map(\.id) == [JobID(5), JobID(4), JobID(3)], "by run date and place, as before")
    _ = try await reopened.enqueue(
      [
        NewJob(payload: Data("a".utf8), fairnessKey: "A"), NewJob(payload: Data("a".utf8), fairnessKey: "A"),
        NewJob(payload: Data("b".utf8), fairnessKey: "B"),
      ], queue: "mail", clock: now)
    let fair = try await reopened.settleAndClaim([], queue: "mail", limit: 5, lease: lease, clock: now)
    #expect(
      fair.claimed.map(\.id) == [JobID(6), JobID(8), JobID(7)], "then by turns: \(fair.claimed.map(\.id))")
    // The held job of key h still waits for h's running job, and then runs.
    let running = try #require(try await reopened.job(JobID(1)))
    let next = try await reopened.settleAndClaim(
      [JobSettlement(claim: running.claim, action: .complete)], queue: "mail", limit: 5, lease: lease,
      clock: now)
    #expect(next.claimed.map(\.id) == [JobID(2)], "h's held job runs when h's running one ends")
  }

  /// Takes a version 13 database back to version 12's: no rates per key.
  static let dropVersion13 = """
    DROP TABLE key_rates; DROP TABLE key_buckets;
    ALTER TABLE queues DROP COLUMN key_rate; ALTER TABLE queues DROP COLUMN key_burst;
    """

  /// A version 12 database (the release of 2026-12-07, limits per key) gains rates per key, none
  /// set, with every job, held job, pause flag and limit kept; rates per key then work on it. The
  /// file is made by this build and taken back to version 12's schema, which differs from version
  /// 13's by what ``dropVersion13`` drops.
  @Test func aVersion12DatabaseGainsRatesPerKeyWithEveryJobAndLimitKept() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("v12.sqlite")
    let t = 1_700_000_000_000
    try createVersion13(path)
    try execute(
      path,
      """
      \(Self.dropVersion13)
      PRAGMA user_version = 12;
      INSERT INTO queues (name, paused, concurrency, rate, burst, key_concurrency) VALUES ('mail', 1, 3, 2.5, 4, 1);
      INSERT INTO key_limits (queue, key, concurrency) VALUES ('mail', 'wide', 5);
      INSERT INTO jobs (queue, payload, status, attempts, run_at, created_at, claim_token, limit_key, parked,
        lease_owner, lease_expires_at) VALUES
      ('mail', x'7b7d', 'running', 1, \(t), \(t), 1, 'h', NULL, 'w', \(t + 60_000)),
      ('mail', x'7b7d', 'held', 0, \(t), \(t), 0, 'h', 1, NULL, NULL),
      ('sms', x'7b7d', 'ready', 0, \(t), \(t), 0, 'h', NULL, NULL, NULL);
      """)
    let before = try readRows(path)
    let store = try SQLiteJobStore(path: path)
    let version = try await store.connection.perform { db in
      try db.scalar("SELECT user_version FROM pragma_user_version") ?? 0
    }
    #expect(version == SQLiteJobStore.schemaVersion)
    await store.close()
    #expect(try readRows(path) == before, "every column of every job as it was")
    let reopened = try SQLiteJobStore(path: path)
    #expect(try await reopened.isPaused(queue: "mail"), "the pause flag is kept")
    let mailLimits = try await reopened.limits(queue: "mail")
    #expect(
      mailLimits
        == QueueLimits(
          concurrency: 3, rate: RateLimit(perSecond: 2.5, burst: 4), keyConcurrency: 1,
          keyConcurrencyOverrides: ["wide": 5]), "the limits are kept, no rate per key: \(mailLimits)")
    #expect(try await reopened.job(JobID(2))?.isHeldByLimit == true, "the held job is still held")
    try await reopened.setLimits(QueueLimits(keyRate: RateLimit(perSecond: 0.001)), queue: "sms")
    let now = FixedJobClock(Date(timeIntervalSince1970: 1_700_000_000))
    _ = try await reopened.enqueue(
      [NewJob(payload: Data("{}".utf8), limitKey: "h")], queue: "sms", clock: now)
    let batch = try await reopened.settleAndClaim(
      [], queue: "sms", limit: 5, lease: Lease(owner: "w", duration: .seconds(60)), clock: now)
    #expect(
      batch.claimed.map(\.id) == [JobID(3)], "the old job takes key h's one start: \(batch.claimed.map(\.id))"
    )
    #expect(try await reopened.job(JobID(4))?.isHeldByLimit == true, "the new one is held by the rate")
  }

  /// Takes a version 13 database back to version 11's: no limits per key.
  static let dropVersion12 = """
    \(dropVersion13)
    DROP TRIGGER jobs_key_stopped; DROP TRIGGER jobs_key_deleted; DROP TRIGGER jobs_unparked;
    DROP INDEX jobs_key_running; DROP INDEX jobs_parked; DROP TABLE key_limits;
    ALTER TABLE jobs DROP COLUMN limit_key; ALTER TABLE jobs DROP COLUMN parked;
    ALTER TABLE queues DROP COLUMN key_concurrency;
    """

  /// A version 11 database (the release of 2026-12-07, rate limits) gains limits per key, none
  /// set, with every job, pause flag and limit kept; limits per key then work on it, and the jobs
  /// stored before have no limit key. The file is made by this build and taken back to version
  /// 11's schema, which differs from version 12's by what ``dropVersion12`` drops.
  @Test func aVersion11DatabaseGainsLimitsPerKeyWithEveryJobPauseAndLimitKept() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("v11.sqlite")
    let t = 1_700_000_000_000
    try createVersion13(path)
    try execute(
      path,
      """
      \(Self.dropVersion12)
      PRAGMA user_version = 11;
      INSERT INTO queues (name, paused, concurrency, rate, burst) VALUES ('mail', 1, 3, 2.5, 4), ('sms', 0, NULL, NULL, NULL);
      INSERT INTO jobs (queue, payload, status, attempts, run_at, created_at, claim_token, ordering_key, line) VALUES
      ('mail', x'7b7d', 'ready', 0, \(t), \(t), 0, 'k', 1),
      ('mail', x'7b7d', 'held', 0, \(t), \(t), 0, 'k', 1),
      ('sms', x'7b7d', 'running', 1, \(t), \(t), 1, NULL, 0),
      ('sms', x'7b7d', 'ready', 0, \(t), \(t), 0, NULL, 0);
      """)
    let before = try readRows(path)
    let store = try SQLiteJobStore(path: path)
    let version = try await store.connection.perform { db in
      try db.scalar("SELECT user_version FROM pragma_user_version") ?? 0
    }
    #expect(version == SQLiteJobStore.schemaVersion)
    await store.close()
    #expect(try readRows(path) == before, "every column of every job as it was")
    let reopened = try SQLiteJobStore(path: path)
    #expect(try await reopened.isPaused(queue: "mail"), "the pause flag is kept")
    let mailLimits = try await reopened.limits(queue: "mail")
    #expect(
      mailLimits == QueueLimits(concurrency: 3, rate: RateLimit(perSecond: 2.5, burst: 4)),
      "the limits are kept, none per key: \(mailLimits)")
    #expect(try await reopened.job(JobID(3))?.limitKey == nil, "a job stored before has no limit key")
    try await reopened.setLimits(QueueLimits(keyConcurrency: 1), queue: "sms")
    let now = FixedJobClock(Date(timeIntervalSince1970: 1_700_000_000))
    _ = try await reopened.enqueue(
      [NewJob(payload: Data("{}".utf8), limitKey: "h"), NewJob(payload: Data("{}".utf8), limitKey: "h")],
      queue: "sms", clock: now)
    let batch = try await reopened.settleAndClaim(
      [], queue: "sms", limit: 5, lease: Lease(owner: "w", duration: .seconds(60)), clock: now)
    #expect(
      batch.claimed.map(\.id) == [JobID(4), JobID(5)],
      "the old job and one of key h: \(batch.claimed.map(\.id))")
    #expect(try await reopened.job(JobID(6))?.isHeldByLimit == true, "the second of key h is held")
    #expect(
      try await reopened.job(JobID(2))?.isHeld == true, "the held job of the ordering key is still held")
  }

  /// Takes a version 11 queues table back to version 10's.
  static let dropRateColumns = """
    ALTER TABLE queues DROP COLUMN rate; ALTER TABLE queues DROP COLUMN burst;
    ALTER TABLE queues DROP COLUMN rate_time;
    """

  /// A version 10 database (the release of 2026-12-07, concurrency limits) gains the queues'
  /// stored rates, none set, with every job, pause flag and concurrency limit kept; rates then
  /// work on it. The file is made by this build and taken back to version 10's schema, which
  /// differs from version 11's by the queues' three rate columns alone.
  @Test func aVersion10DatabaseGainsRateLimitsWithEveryJobPauseAndLimitKept() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("v10.sqlite")
    let t = 1_700_000_000_000
    try createVersion13(path)
    try execute(
      path,
      """
      \(Self.dropVersion12)
      \(Self.dropRateColumns)
      PRAGMA user_version = 10;
      INSERT INTO queues (name, paused, concurrency) VALUES ('mail', 1, 3), ('sms', 0, NULL);
      INSERT INTO jobs (queue, payload, status, attempts, run_at, created_at, claim_token, ordering_key, line) VALUES
      ('mail', x'7b7d', 'ready', 0, \(t), \(t), 0, 'k', 1),
      ('mail', x'7b7d', 'held', 0, \(t), \(t), 0, 'k', 1),
      ('sms', x'7b7d', 'ready', 0, \(t), \(t), 0, NULL, 0),
      ('sms', x'7b7d', 'ready', 0, \(t), \(t), 0, NULL, 0),
      ('sms', x'7b7d', 'ready', 0, \(t), \(t), 0, NULL, 0);
      """)
    let before = try readRows(path)
    let store = try SQLiteJobStore(path: path)
    let version = try await store.connection.perform { db in
      try db.scalar("SELECT user_version FROM pragma_user_version") ?? 0
    }
    #expect(version == SQLiteJobStore.schemaVersion)
    await store.close()
    #expect(try readRows(path) == before, "every column of every job as it was")
    let reopened = try SQLiteJobStore(path: path)
    #expect(try await reopened.isPaused(queue: "mail"), "the pause flag is kept")
    let mailLimits = try await reopened.limits(queue: "mail")
    #expect(mailLimits == QueueLimits(concurrency: 3), "the concurrency is kept, no rate: \(mailLimits)")
    #expect(try await reopened.limits(queue: "sms").isEmpty, "no limits set")
    try await reopened.setLimits(QueueLimits(rate: RateLimit(perSecond: 1, burst: 2)), queue: "sms")
    let now = FixedJobClock(Date(timeIntervalSince1970: 1_700_000_000))
    let batch = try await reopened.settleAndClaim(
      [], queue: "sms", limit: 5, lease: Lease(owner: "w", duration: .seconds(60)), clock: now)
    #expect(batch.claimed.map(\.id) == [JobID(3), JobID(4)], "the burst of the rate set after the migration")
    #expect(try await reopened.job(JobID(2))?.isHeld == true, "the held job is still held")
  }

  /// A version 9 database (the release of 2026-12-07, ordering keys) gains the queues' stored
  /// limits, none set, with every job and the pause flags kept; limits then work on it. The file is
  /// made by this build and taken back to version 9's schema, which differs from version 10's by
  /// the queues' concurrency column alone.
  @Test func aVersion9DatabaseGainsQueueLimitsWithEveryJobAndPauseKept() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("v9.sqlite")
    let t = 1_700_000_000_000
    try createVersion13(path)
    try execute(
      path,
      """
      ALTER TABLE queues DROP COLUMN concurrency;
      \(Self.dropVersion12)
      \(Self.dropRateColumns)
      PRAGMA user_version = 9;
      INSERT INTO queues (name, paused) VALUES ('mail', 1), ('sms', 0);
      INSERT INTO jobs (queue, payload, status, attempts, run_at, created_at, claim_token, ordering_key, line) VALUES
      ('mail', x'7b7d', 'ready', 0, \(t), \(t), 0, 'k', 1),
      ('mail', x'7b7d', 'held', 0, \(t), \(t), 0, 'k', 1),
      ('sms', x'7b7d', 'ready', 0, \(t), \(t), 0, NULL, 0),
      ('sms', x'7b7d', 'ready', 0, \(t), \(t), 0, NULL, 0);
      """)
    let before = try readRows(path)
    let store = try SQLiteJobStore(path: path)
    let version = try await store.connection.perform { db in
      try db.scalar("SELECT user_version FROM pragma_user_version") ?? 0
    }
    #expect(version == SQLiteJobStore.schemaVersion)
    await store.close()
    #expect(try readRows(path) == before, "every column of every job as it was")
    let reopened = try SQLiteJobStore(path: path)
    #expect(try await reopened.isPaused(queue: "mail"), "the pause flag is kept")
    let mailLimits = try await reopened.limits(queue: "mail")
    let smsLimits = try await reopened.limits(queue: "sms")
    #expect(mailLimits.isEmpty && smsLimits.isEmpty, "no limits set")
    try await reopened.setLimits(QueueLimits(concurrency: 1), queue: "sms")
    let now = FixedJobClock(Date(timeIntervalSince1970: 1_700_000_000))
    let batch = try await reopened.settleAndClaim(
      [], queue: "sms", limit: 5, lease: Lease(owner: "w", duration: .seconds(60)), clock: now)
    #expect(batch.claimed.map(\.id) == [JobID(3)], "one of two under the limit set after the migration")
    #expect(try await reopened.job(JobID(2))?.isHeld == true, "the held job is still held")
  }

  /// Every column of every job, as text, in ID order (read with the SQLite library alone).
  private func readRows(_ path: String) throws -> [String] {
    var db: OpaquePointer?
    guard sqlite3_open(path, &db) == SQLITE_OK else { throw SQLFailure(description: "open") }
    defer { sqlite3_close(db) }
    sqlite3_busy_timeout(db, 30_000)
    let sql = """
      SELECT id, queue, hex(payload), status, priority, attempts, run_at, created_at, last_error, dedup_key,
        lease_owner, lease_expires_at, claim_token, seq, time_limit_ms, finished_at, errors, run_ms, hex(output)
      FROM jobs ORDER BY id
      """
    var statement: OpaquePointer?
    guard sqlite3_prepare_v2(db, sql, -1, &statement, nil) == SQLITE_OK else {
      throw SQLFailure(description: String(cString: sqlite3_errmsg(db)))
    }
    defer { sqlite3_finalize(statement) }
    var rows: [String] = []
    while sqlite3_step(statement) == SQLITE_ROW {
      rows.append(
        (0..<19).map { column in
          sqlite3_column_text(statement, Int32(column)).map { String(cString: $0) } ?? "NULL"
        }.joined(separator: "|"))
    }
    return rows
  }

  /// A version 5 database's last errors were stored whole (nothing bounded them then): the list
  /// of errors a migrated job starts with keeps each within ``JobHistory/maximumErrorBytes``, as
  /// every error recorded since.
  @Test func aVersion5JobsLongLastErrorIsBoundedInItsHistory() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("v5-long.sqlite")
    let t = 1_700_000_000_000
    // 6000 "é": 12000 bytes of UTF-8.
    let long = "replace(hex(zeroblob(6000)), '00', 'é')"
    try execute(
      path,
      Self.version5 + """
        INSERT INTO jobs VALUES (1, 'mail', x'7b7d', 'dead', 0, 3, \(t), \(t), \(long), NULL, NULL, NULL, 3, 0, NULL);
        INSERT INTO jobs VALUES (2, 'mail', x'7b7d', 'ready', 0, 1, \(t), \(t), \(long), NULL, NULL, NULL, 1, 0, NULL);
        """)
    let store = try SQLiteJobStore(path: path)
    let mail = try await store.jobs(queue: "mail", status: nil, after: nil, limit: 10)
    #expect(mail.count == 2)
    for record in mail {
      #expect(record.errors.count == 1)
      let bytes = record.errors.first?.utf8.count ?? .max
      #expect(bytes <= JobHistory.maximumErrorBytes, "job \(record.id)'s error keeps \(bytes) bytes")
      #expect(record.errors.first?.hasSuffix("…") == true)
    }
  }
}
