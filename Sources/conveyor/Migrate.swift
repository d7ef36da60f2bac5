import Conveyor
import ConveyorPostgres
import ConveyorSQLite
import Foundation

/// `conveyor migrate status|up|sql`: the database's schema version against this build's, applying
/// the migrations at a chosen moment, and the SQL for a database administrator to review.
enum Migrate {
  static let specs = [
    CommandSpec(
      name: "migrate status", operands: "", summary: "the schema version of the database and of this build",
      options: [OptionSpec(names: ["--json"], value: nil, help: "as one JSON object")],
      details: """
        Reads the version without changing anything (a missing SQLite file stays missing). Exit code 0
        when the database is up to date, 1 when migrations are pending or the database is newer than
        this build.
        """),
    CommandSpec(
      name: "migrate up", operands: "", summary: "apply the migrations the database lacks", options: [],
      details: """
        What opening the database does anyway, at a moment you choose (a deployment step before new
        workers start): in one transaction, every job kept. Other processes opening the database wait
        for it. A database newer than this build is refused and left untouched.
        """),
    CommandSpec(
      name: "migrate sql", operands: "", summary: "print the SQL 'migrate up' would run (PostgreSQL)",
      options: [
        OptionSpec(
          names: ["--from"], value: "VERSION",
          help: "the version to migrate from, without connecting (default: the database's)")
      ],
      details: """
        One transaction that takes the migration lock, checks the version and applies each missing
        migration: review it, or run it with 'psql -v ON_ERROR_STOP=1 -f'. SQLite files migrate
        when they are opened ('migrate up').
        """),
  ]

  static func run(_ subcommand: String, _ arguments: inout Arguments, _ context: CLI.Context) async throws
    -> Int32
  {
    switch subcommand {
    case "status": return try await status(&arguments, context)
    case "up": return try await up(&arguments, context)
    default: return try await sql(&arguments, context)
    }
  }

  /// The version of the database and of this build, read without writing.
  struct Status: Encodable {
    var database: String
    var schema: String?
    var databaseVersion: Int
    var buildVersion: Int
    var pending: [Int]
    /// `current`, `behind` (migrations pending), `newer` (than this build) or `missing` (an
    /// SQLite file not created yet).
    var state: String

    init(database: String, schema: String?, version: Int, build: Int, pending: [Int], exists: Bool = true) {
      self.database = database
      self.schema = schema
      databaseVersion = version
      buildVersion = build
      self.pending = pending
      state = !exists ? "missing" : version > build ? "newer" : pending.isEmpty ? "current" : "behind"
    }
  }

  static func readStatus(_ context: CLI.Context) async throws -> Status {
    switch context.database {
    case .postgres(let text):
      let status = try await PostgresJobStore.schemaStatus(url: text)
      return Status(
        database: Secrets.scrub(text), schema: status.schema, version: status.databaseVersion,
        build: status.buildVersion, pending: status.pending)
    case .sqlite(let path):
      let status = try SQLiteJobStore.schemaStatus(path: path)
      return Status(
        database: Secrets.scrub(path), schema: nil, version: status.databaseVersion,
        build: status.buildVersion,
        pending: status.pending, exists: status.exists)
    case nil:
      // The default database's folder is made when it is first opened: missing, it is no error.
      let path = try SQLiteJobStore.defaultDatabaseURLWithoutCreating(name: "conveyor").path
      guard FileManager.default.fileExists(atPath: path) else {
        return Status(
          database: path, schema: nil, version: 0, build: Int(SQLiteJobStore.schemaVersion),
          pending: Array(1...Int(SQLiteJobStore.schemaVersion)), exists: false)
      }
      let status = try SQLiteJobStore.schemaStatus(path: path)
      return Status(
        database: path, schema: nil, version: status.databaseVersion, build: status.buildVersion,
        pending: status.pending, exists: status.exists)
    }
  }

  static func status(_ arguments: inout Arguments, _ context: CLI.Context) async throws -> Int32 {
    let json = arguments.flag("--json")
    try arguments.finish()
    let status = try await readStatus(context)
    if json {
      try printJSON(status)
    } else {
      output("database  \(printable(status.database))")
      if let schema = status.schema { output("schema    \(schema)") }
      output("version   \(status.databaseVersion)\(status.databaseVersion == 0 ? " (no schema yet)" : "")")
      output("build     \(status.buildVersion)")
      switch status.state {
      case "missing":
        output(
          "state     no database file yet: opening it (or 'conveyor migrate up') creates it at version "
            + "\(status.buildVersion)")
      case "newer":
        output("state     newer than this build: upgrade conveyor to use it (it is left untouched)")
      case "behind":
        output(
          "state     \(status.pending.count) migration(s) pending (\(status.pending.map(String.init).joined(separator: ", "))): "
            + "'conveyor migrate up' applies them, as opening the database does")
      default:
        output("state     up to date")
      }
    }
    return status.state == "current" ? ExitCode.success.rawValue : ExitCode.failure.rawValue
  }

  static func up(_ arguments: inout Arguments, _ context: CLI.Context) async throws -> Int32 {
    try arguments.finish()
    let before: Int
    let after: Int
    switch context.database {
    case .postgres(let text):
      let result = try await PostgresJobStore.migrate(url: text)
      (before, after) = (result.before.databaseVersion, result.after.databaseVersion)
    case .sqlite, nil:
      before = try await readStatus(context).databaseVersion
      // Opening migrates, in one transaction; the path checks are the store's.
      _ = try context.openStore()
      after = try await readStatus(context).databaseVersion
    }
    if before == after {
      output("schema at version \(after): up to date")
    } else {
      output("schema migrated from version \(before) to \(after)")
    }
    return ExitCode.success.rawValue
  }

  static func sql(_ arguments: inout Arguments, _ context: CLI.Context) async throws -> Int32 {
    let from = try arguments.integer("--from", in: 0...PostgresJobStore.schemaVersion)
    try arguments.finish()
    guard case .postgres(let text) = context.database else {
      throw UsageError(
        description:
          "migrate sql is for PostgreSQL (--database postgres://...); an SQLite file migrates when it is "
          + "opened: run 'conveyor migrate up'")
    }
    let version: Int
    if let from {
      version = from
    } else {
      let status = try await PostgresJobStore.schemaStatus(url: text)
      guard !status.isNewerThanBuild else {
        throw DatabaseError(
          description: "the schema \"\(status.schema)\" is at version \(status.databaseVersion), newer than "
            + "this build's \(status.buildVersion): there is nothing this build can run on it")
      }
      version = status.databaseVersion
    }
    let script = try PostgresJobStore.migrationSQL(from: version)
    if script.isEmpty {
      printError("conveyor: the schema is at version \(version), this build's: nothing to run")
    } else {
      output(script.hasSuffix("\n") ? String(script.dropLast()) : script)
    }
    return ExitCode.success.rawValue
  }
}
