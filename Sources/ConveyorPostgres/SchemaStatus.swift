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
  /// table or row is created.
  ///
  /// It connects as the opening does (``Options/startupWait``); each statement gets
  /// ``Options/callTimeout`` (at least 30 s), and a wait for a lock on the migrations table
  /// (another session's `LOCK TABLE`, say) ``Options/lockTimeout``. Cancelling the calling task
  /// ends it with `CancellationError`.
  ///
  /// - Throws: ``PostgresError``: ``PostgresError/Code/invalidSchemaName`` or
  ///   ``PostgresError/Code/invalidOptions`` before connecting, or the connection's and the
  ///   statements' failures.
  public static func schemaStatus(url: String, options: Options = .init()) async throws
    -> PostgresSchemaStatus
  {
    try validate(schema: options.schema)
    try validate(options)
    let info = try ConnectionInfo(url)
    let sql = SQL(schema: options.schema)
    let version = try await onOwnThreadCancellably(name: "conveyor-postgres-status") { isCancelled -> Int64 in
      try onOpeningConnection(
        url: url, info: info, options: options, lockTimeout: options.lockTimeout,
        purpose: "reading the schema's version", isCancelled: isCancelled, onWait: nil
      ) { connection, restartDeadline -> Int64 in
        restartDeadline()
        guard try connection.execute(sql.migrationTableExists, prepared: false).bool(0, 0) else { return 0 }
        restartDeadline()
        return try connection.execute(sql.currentVersion, prepared: false).int64(0, 0)
      }
    }
    return PostgresSchemaStatus(schema: options.schema, databaseVersion: Int(clamping: version))
  }

  /// Applies the migrations the database lacks, as opening a store does (in one transaction,
  /// under a lock that makes other processes wait), and returns the version it found once it
  /// held that lock and the version it left. A process that waited for another's migration
  /// finds nothing to apply: its two versions are the same. A database newer than this build is
  /// refused and left untouched.
  ///
  /// Use it where the schema must change at a chosen moment, say a deployment step run before
  /// the new workers start: `conveyor migrate up` runs it. It connects, times out and is
  /// cancelled as opening a store is.
  public static func migrate(url: String, options: Options = .init()) async throws -> (
    before: PostgresSchemaStatus, after: PostgresSchemaStatus
  ) {
    try validate(schema: options.schema)
    try validate(options)
    let info = try ConnectionInfo(url)
    let sql = SQL(schema: options.schema)
    let (from, to) = try await onOwnThreadCancellably(name: "conveyor-postgres-migrate") { isCancelled in
      try onOpeningConnection(
        url: url, info: info, options: options, lockTimeout: .zero, isCancelled: isCancelled, onWait: nil
      ) { connection, restartDeadline in
        try Migrations.apply(
          sql, schemaName: options.schema, on: connection, beforeEachStatement: restartDeadline)
      }
    }
    return (
      PostgresSchemaStatus(schema: options.schema, databaseVersion: from),
      PostgresSchemaStatus(schema: options.schema, databaseVersion: to)
    )
  }

  /// Runs `body` on a thread of its own; cancelling the calling task makes the closure `body` is
  /// given return true.
  private static func onOwnThreadCancellably<T: Sendable>(
    name: String, _ body: @escaping @Sendable (_ isCancelled: @escaping @Sendable () -> Bool) throws -> T
  ) async throws -> T {
    let cancelled = Atomic<Bool>(false)
    return try await withTaskCancellationHandler {
      try await onOwnThread(name: name) { try body { cancelled.load(ordering: .relaxed) } }
    } onCancel: {
      cancelled.store(true, ordering: .relaxed)
    }
  }

  /// The SQL that brings the schema `schema` from version `version` to this build's
  /// (``schemaVersion``), as opening a store runs it: one transaction that takes the migration
  /// lock, checks the version, runs each missing migration and records it. For a database
  /// administrator to review, or to run with `psql -v ON_ERROR_STOP=1 -f` as the role the workers
  /// use (the tables belong to the role that creates them). Empty when there is nothing to run.
  ///
  /// - Throws: ``PostgresError/Code/invalidSchemaName`` for an invalid schema name, and
  ///   ``PostgresError/Code/invalidOptions`` for a version below 0 or above this build's.
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
