import Conveyor
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import ConveyorPostgres

/// Reading a schema's version without changing it, migrating at a chosen moment, and the SQL a
/// database administrator reviews: what `conveyor migrate status|up|sql` run.
@Suite("PostgreSQL: schema status and migration SQL")
struct SchemaMigrationTests {
  /// Whether the schema `schema` exists in the database.
  func schemaExists(_ schema: String, _ admin: AdminConnection) throws -> Bool {
    try admin.scalar("SELECT to_regnamespace('\(schema)') IS NOT NULL") == "t"
  }

  @Test func theStatusOfAMissingSchemaIsVersionZeroAndCreatesNothing() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("status")
    let status = try await PostgresJobStore.schemaStatus(url: server.url, options: .init(schema: schema))
    #expect(status == PostgresSchemaStatus(schema: schema, databaseVersion: 0))
    #expect(status.pending == Array(1...PostgresJobStore.schemaVersion))
    #expect(try !schemaExists(schema, AdminConnection(server.url)), "the status created nothing")
  }

  @Test func theStatusFollowsTheSchemaFromAnOldVersionToThisBuilds() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("statusv3")
    try createSchema(SQL(schema: schema), atVersion: 3, with: AdminConnection(server.url))
    let options = PostgresJobStore.Options(schema: schema)
    let old = try await PostgresJobStore.schemaStatus(url: server.url, options: options)
    #expect(
      old.databaseVersion == 3 && old.pending == Array(4...PostgresJobStore.schemaVersion)
        && !old.isNewerThanBuild)
    let (before, after) = try await PostgresJobStore.migrate(url: server.url, options: options)
    #expect(before == old)
    #expect(after.databaseVersion == PostgresJobStore.schemaVersion && after.pending.isEmpty)
    let again = try await PostgresJobStore.migrate(url: server.url, options: options)
    #expect(again.before == after && again.after == after, "nothing left to apply")
  }

  @Test func aNewerSchemaIsReportedAndMigratingLeavesItUntouched() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("statusnew")
    let admin = try AdminConnection(server.url)
    try createSchema(SQL(schema: schema), atVersion: PostgresJobStore.schemaVersion, with: admin)
    let newer = PostgresJobStore.schemaVersion + 1
    try admin.query("INSERT INTO \(schema).schema_migrations (version) VALUES (\(newer))")
    let options = PostgresJobStore.Options(schema: schema)
    let status = try await PostgresJobStore.schemaStatus(url: server.url, options: options)
    #expect(status.databaseVersion == newer && status.isNewerThanBuild && status.pending.isEmpty)
    await #expect {
      _ = try await PostgresJobStore.migrate(url: server.url, options: options)
    } throws: { ($0 as? PostgresError)?.code == .newerSchema }
    #expect(try admin.scalar("SELECT max(version) FROM \(schema).schema_migrations") == String(newer))
  }

  /// The SQL from version 0, run by hand as a database administrator would, makes a schema a
  /// store opens without migrating and uses.
  @Test func theMigrationSQLFromNothingMakesASchemaAStoreUses() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("sqlfrom0")
    let admin = try AdminConnection(server.url)
    let script = try PostgresJobStore.migrationSQL(schema: schema, from: 0)
    #expect(script.hasPrefix("-- Conveyor schema") && script.hasSuffix("COMMIT;\n"))
    try admin.query(script)
    let versions = try admin.query("SELECT version FROM \(schema).schema_migrations ORDER BY version")
    #expect(versions == (1...PostgresJobStore.schemaVersion).map { [String($0)] })
    let store = try await PostgresJobStore.open(url: server.url, options: .init(schema: schema))
    let clock = SystemJobClock()
    _ = try await store.enqueue([NewJob(payload: Data("{}".utf8))], queue: "q", clock: clock)
    let claimed = try await store.settleAndClaim(
      [], queue: "q", limit: 1, lease: Lease(owner: "w", duration: .seconds(60)), clock: clock)
    #expect(claimed.claimed.count == 1)
    await store.close()
    let count = try admin.scalar("SELECT count(*) FROM \(schema).schema_migrations")
    #expect(count == String(PostgresJobStore.schemaVersion), "the store applied nothing more")
  }

  @Test func theMigrationSQLFromAnOldVersionKeepsEveryJob() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("sqlfrom3")
    let admin = try AdminConnection(server.url)
    try createSchema(SQL(schema: schema), atVersion: 3, with: admin)
    try admin.query(
      """
      INSERT INTO \(schema).jobs (queue, payload, status, run_at, created_at)
      VALUES ('q', '\\x7b7d', 'ready', now(), now()), ('q', '\\x7b7d', 'dead', now(), now())
      """)
    try admin.query(try PostgresJobStore.migrationSQL(schema: schema, from: 3))
    let status = try await PostgresJobStore.schemaStatus(url: server.url, options: .init(schema: schema))
    #expect(status.databaseVersion == PostgresJobStore.schemaVersion)
    #expect(try admin.scalar("SELECT count(*) FROM \(schema).jobs") == "2")
  }

  /// A script made for another version than the database's stops before changing anything.
  @Test func theMigrationSQLForAnotherVersionChangesNothing() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("sqlwrong")
    let admin = try AdminConnection(server.url)
    try createSchema(SQL(schema: schema), atVersion: 3, with: admin)
    #expect(throws: (any Error).self) {
      try admin.query(try PostgresJobStore.migrationSQL(schema: schema, from: 2))
    }
    try admin.query("ROLLBACK")
    #expect(try admin.scalar("SELECT max(version) FROM \(schema).schema_migrations") == "3")
    let status = try await PostgresJobStore.schemaStatus(url: server.url, options: .init(schema: schema))
    #expect(status.databaseVersion == 3)
  }

  /// A status call running in a task of its own, and whether it has ended.
  final class StatusCall: Sendable {
    let ended = Atomic<Bool>(false)
    let task: Task<PostgresSchemaStatus, any Error>

    init(url: String, options: PostgresJobStore.Options) {
      task = Task { try await PostgresJobStore.schemaStatus(url: url, options: options) }
      let call = self
      Task { [task] in
        _ = await task.result
        call.ended.store(true, ordering: .relaxed)
      }
    }

    /// Waits until the call ends, or `guardTime` (a hang guard) passes; returns whether it ended.
    func waitForEnd(guardTime: Duration = .seconds(60)) async throws -> Bool {
      let start = ContinuousClock.now
      while !ended.load(ordering: .relaxed), ContinuousClock.now - start < guardTime {
        try await Task.sleep(for: .milliseconds(100))
      }
      return ended.load(ordering: .relaxed)
    }
  }

  /// Sessions waiting for a lock on the migrations table of `schema`.
  func sessionsWaitingForTheMigrationsTable(_ schema: String, _ admin: AdminConnection) throws -> Int {
    Int(
      try admin.scalar(
        """
        SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE NOT l.granted AND n.nspname = '\(schema)' AND c.relname = 'schema_migrations'
        """) ?? "") ?? 0
  }

  /// Another session holds a lock on the migrations table (`LOCK TABLE`, `VACUUM FULL`, a DBA's
  /// `ALTER TABLE`): the status gives up as the options' lockTimeout and callTimeout say, as a
  /// store's calls and its opening do, instead of waiting for as long as the lock is held.
  @Test func theStatusGivesUpOnALockedMigrationsTableAsItsOptionsSay() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("statuslock")
    let admin = try AdminConnection(server.url)
    try createSchema(SQL(schema: schema), atVersion: PostgresJobStore.schemaVersion, with: admin)
    let locker = try AdminConnection(server.url)
    try locker.query("BEGIN")
    try locker.query("LOCK TABLE \(schema).schema_migrations IN ACCESS EXCLUSIVE MODE")
    let call = StatusCall(
      url: server.url,
      options: .init(schema: schema, lockTimeout: .milliseconds(200), callTimeout: .seconds(1)))
    // 200 ms of lockTimeout, 1 s of callTimeout: a minute is a hang guard.
    let ended = try await call.waitForEnd()
    let waiting = try sessionsWaitingForTheMigrationsTable(schema, admin)
    try locker.query("ROLLBACK")
    _ = await call.task.result
    #expect(ended, "the status still waited after a minute; sessions waiting for the lock: \(waiting)")
  }

  /// Cancelling the task of a status that waits (here for a lock another session holds, with
  /// no timeout) ends it, as cancelling an opening does.
  @Test func cancellingAStatusThatWaitsEndsIt() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("statuscancel")
    let admin = try AdminConnection(server.url)
    try createSchema(SQL(schema: schema), atVersion: PostgresJobStore.schemaVersion, with: admin)
    let locker = try AdminConnection(server.url)
    try locker.query("BEGIN")
    try locker.query("LOCK TABLE \(schema).schema_migrations IN ACCESS EXCLUSIVE MODE")
    let call = StatusCall(
      url: server.url, options: .init(schema: schema, lockTimeout: .zero, callTimeout: nil))
    try await waitFor("the status to wait for the lock") {
      try sessionsWaitingForTheMigrationsTable(schema, admin) == 1
    }
    call.task.cancel()
    let ended = try await call.waitForEnd()
    let waiting = try sessionsWaitingForTheMigrationsTable(schema, admin)
    try locker.query("ROLLBACK")
    let result = await call.task.result
    #expect(ended, "a minute after the cancellation, sessions still waiting for the lock: \(waiting)")
    #expect(throws: CancellationError.self) { try result.get() }
  }

  /// Processes migrating at once (a deployment running `conveyor migrate up` on every host): one
  /// applies the migrations; the others wait for it under the migration lock, find nothing left
  /// to apply, and report no change.
  @Test func onlyTheMigrationThatAppliesTheVersionsReportsAChange() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("migrateonce")
    let admin = try AdminConnection(server.url)
    let key = "hashtextextended('conveyor.migrate:' || '\(schema)', 0)"
    let waiting = """
      SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
        AND classid::int8 = ((\(key)) >> 32) & 4294967295 AND objid::int8 = (\(key)) & 4294967295
      """
    // The migration lock, held while the calls start, so that they all wait for it.
    try admin.query("SELECT pg_advisory_lock(\(key))")
    let options = PostgresJobStore.Options(schema: schema)
    let calls = (0..<3).map { _ in
      Task { try await PostgresJobStore.migrate(url: server.url, options: options) }
    }
    let start = ContinuousClock.now
    while try admin.scalar(waiting) != "3", ContinuousClock.now - start < .seconds(120) {
      try await Task.sleep(for: .milliseconds(100))
    }
    let waited = try admin.scalar(waiting)
    try admin.query("SELECT pg_advisory_unlock(\(key))")
    var reported: [String] = []
    for call in calls {
      let (before, after) = try await call.value
      reported.append("\(before.databaseVersion) -> \(after.databaseVersion)")
    }
    #expect(waited == "3", "calls waiting for the migration lock: \(waited ?? "none")")
    let changes = reported.filter {
      $0 != "\(PostgresJobStore.schemaVersion) -> \(PostgresJobStore.schemaVersion)"
    }
    #expect(changes.count == 1, "the calls reported \(reported)")
  }

  /// The documentation of ``PostgresJobStore/schemaStatus(url:options:)`` and
  /// ``PostgresJobStore/migrationSQL(schema:from:)`` says an invalid schema name fails with
  /// ``PostgresError/Code/invalidSchemaName`` (it said `invalidOptions`, which the code never
  /// threw for a name), before connecting.
  @Test func anInvalidSchemaNameIsRefusedWithTheDocumentedCode() async throws {
    #expect {
      _ = try PostgresJobStore.migrationSQL(schema: "Bad", from: 0)
    } throws: { ($0 as? PostgresError)?.code == .invalidSchemaName }
    await #expect {
      _ = try await PostgresJobStore.schemaStatus(
        url: "postgresql://127.0.0.1:1/x", options: .init(schema: "Bad"))
    } throws: { ($0 as? PostgresError)?.code == .invalidSchemaName }
    await #expect {
      _ = try await PostgresJobStore.migrate(url: "postgresql://127.0.0.1:1/x", options: .init(schema: "Bad"))
    } throws: { ($0 as? PostgresError)?.code == .invalidSchemaName }
  }

  @Test func theMigrationSQLRefusesVersionsAndSchemaNamesItCannotUse() throws {
    for version in [-1, PostgresJobStore.schemaVersion + 1, Int.max, Int.min] {
      #expect {
        _ = try PostgresJobStore.migrationSQL(from: version)
      } throws: { ($0 as? PostgresError)?.code == .invalidOptions }
    }
    #expect(try PostgresJobStore.migrationSQL(from: PostgresJobStore.schemaVersion).isEmpty)
    for schema in ["", "a\"b", "a;DROP TABLE x", String(repeating: "s", count: 200), "a\0b"] {
      #expect(throws: PostgresError.self) { _ = try PostgresJobStore.migrationSQL(schema: schema, from: 0) }
    }
  }

  /// `migrationSQL(from: 13)`, run by hand, brings a schema at 13 to the version the store
  /// writes: the fair-shares columns exist, and the store then has nothing to apply.
  @Test func theMigrationSQLFromVersion13AddsFairShares() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("sqlfrom13")
    let admin = try AdminConnection(server.url)
    try createSchema(SQL(schema: schema), atVersion: 13, with: admin)
    let script = try PostgresJobStore.migrationSQL(schema: schema, from: 13)
    #expect(!script.isEmpty, "the script from 13 is empty")
    if !script.isEmpty { try admin.query(script) }
    let column = try admin.scalar(
      "SELECT count(*) FROM information_schema.columns WHERE table_schema = '\(schema)' AND column_name = 'fairness_key'"
    )
    #expect(column == "1", "jobs.fairness_key after the script")
  }

  /// A schema a store of this build opened (and migrated) is not newer than this build.
  @Test func aSchemaThisBuildMigratedIsNotNewerThanIt() async throws {
    let server = try await PostgresServer.shared()
    let options = PostgresJobStore.Options(schema: uniqueSchema("status14"))
    let store = try await PostgresJobStore.open(url: server.url, options: options)
    await store.close()
    let status = try await PostgresJobStore.schemaStatus(url: server.url, options: options)
    #expect(!status.isNewerThanBuild && status.pending.isEmpty, "\(status)")
  }
}
