import Conveyor
import Synchronization

/// Where a database's Conveyor schema stands against this build: what `conveyor migrate status`
/// shows.
public struct PostgresSchemaStatus: Sendable, Hashable {
  /// The schema's name (``PostgresJobStore/Options/schema``).
  public var schema: String
  /// The version the database is at; 0 when it holds no Conveyor schema yet.
  public var databaseVersion: Int
  /// The version this build writes and reads (``PostgresJobStore/schemaVersion``).
  public var buildVersion: Int

  /// Creates a status.
  public init(schema: String, databaseVersion: Int, buildVersion: Int = PostgresJobStore.schemaVersion) {
    self.schema = schema
    self.databaseVersion = databaseVersion
    self.buildVersion = buildVersion
  }

  /// The versions opening a store (or ``PostgresJobStore/migrate(url:options:)``) would apply,
  /// in order; empty when the database is up to date, or newer than this build.
  public var pending: [Int] {
    databaseVersion < buildVersion ? Array((databaseVersion + 1)...buildVersion) : []
  }

  /// Whether the database is at a version newer than this build knows: this build refuses to open
  /// it and leaves it untouched.
  public var isNewerThanBuild: Bool { databaseVersion > buildVersion }
}

extension PostgresJobStore {
  /// Reads the version of the schema ``Options/schema`` without changing anything: no schema,
  /// table or row is created, and no lock is taken.
  ///
  /// - Throws: ``PostgresError`` when the server cannot be reached or the statements fail; an
  ///   invalid schema name fails with ``PostgresError/Code/invalidOptions`` before connecting.
  public static func schemaStatus(url: String, options: Options = .init()) async throws
    -> PostgresSchemaStatus
  {
    try validate(schema: options.schema)
    let info = try ConnectionInfo(url)
    let sql = SQL(schema: options.schema)
    let cancelled = Atomic<Bool>(false)
    let version = try await withTaskCancellationHandler {
      try await onOwnThread(name: "conveyor-postgres-status") { () throws -> Int64 in
        let connection = try Connection(
          conninfo: url, scrubber: info.scrubber, isCancelled: { cancelled.load(ordering: .relaxed) })
        guard try connection.execute(sql.migrationTableExists, prepared: false).bool(0, 0) else { return 0 }
        return try connection.execute(sql.currentVersion, prepared: false).int64(0, 0)
      }
    } onCancel: {
      cancelled.store(true, ordering: .relaxed)
    }
    return PostgresSchemaStatus(schema: options.schema, databaseVersion: Int(clamping: version))
  }

  /// Applies the migrations the database lacks, as opening a store does (in one transaction,
  /// under a lock that makes other processes wait), and returns the status before and after. A
  /// database newer than this build is refused and left untouched.
  ///
  /// Use it where the schema must change at a chosen moment, say a deployment step run before
  /// the new workers start: `conveyor migrate up` runs it.
  public static func migrate(url: String, options: Options = .init()) async throws -> (
    before: PostgresSchemaStatus, after: PostgresSchemaStatus
  ) {
    let before = try await schemaStatus(url: url, options: options)
    let store = try await open(url: url, options: options)
    await store.close()
    return (before, try await schemaStatus(url: url, options: options))
  }

  /// The SQL that brings the schema `schema` from version `version` to this build's
  /// (``schemaVersion``), as opening a store runs it: one transaction that takes the migration
  /// lock, checks the version, runs each missing migration and records it. For a database
  /// administrator to review, or to run with `psql -v ON_ERROR_STOP=1 -1 -f`. Empty when there is
  /// nothing to run.
  ///
  /// - Throws: ``PostgresError/Code/invalidOptions`` for an invalid schema name, or a version
  ///   below 0 or above this build's.
  public static func migrationSQL(schema: String = "conveyor", from version: Int) throws -> String {
    try validate(schema: schema)
    guard (0...schemaVersion).contains(version) else {
      throw PostgresError(
        code: .invalidOptions,
        message: "schema version \(version) is not one this build migrates from: give 0 (no schema yet) "
          + "to \(schemaVersion)")
    }
    guard version < schemaVersion else { return "" }
    let sql = SQL(schema: schema)
    let literal = "'" + schema.replacingOccurrences(of: "'", with: "''") + "'"
    var script = [
      "-- Conveyor schema \(sql.schema): from version \(version) to \(schemaVersion).",
      "BEGIN;",
      SQL.migrationLock.replacingOccurrences(of: "$1", with: literal) + ";",
      sql.migrationTable.trimmingCharacters(in: .whitespacesAndNewlines),
      // Stops the script (ON_ERROR_STOP) when the database is not at the version it was made for.
      """
      DO $conveyor$ BEGIN
        IF (SELECT coalesce(max(version), 0) FROM \(sql.schema).schema_migrations) <> \(version) THEN
          RAISE EXCEPTION 'the schema is not at version \(version): run conveyor migrate status';
        END IF;
      END $conveyor$;
      """,
    ]
    for index in version..<schemaVersion {
      script.append("-- Version \(index + 1).")
      script.append(sql.migrations[index].trimmingCharacters(in: .whitespacesAndNewlines))
      script.append(sql.recordVersion.replacingOccurrences(of: "$1", with: String(index + 1)) + ";")
    }
    script.append("COMMIT;")
    return script.joined(separator: "\n") + "\n"
  }
}
