import Conveyor
import ConveyorTestSupport
import Foundation
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
    #expect(old.databaseVersion == 3 && old.pending == [4] && !old.isNewerThanBuild)
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
}
