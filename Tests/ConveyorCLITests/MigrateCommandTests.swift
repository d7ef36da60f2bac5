import Foundation
import Testing

/// `conveyor migrate status|up|sql` and `conveyor --version`.
@Suite struct MigrateCommandTests {
  @Test func versionPrintsTheToolAndSchemaVersions() async throws {
    let sandbox = try Sandbox()
    let outcome = try await sandbox.run(["--version"], withDatabase: false)
    #expect(outcome.status == 0, "\(outcome)")
    #expect(
      outcome.stdout.range(
        of: #"^conveyor \d+\.\d+\.\d+ \(schema: SQLite \d+, PostgreSQL \d+\)\n$"#, options: .regularExpression
      )
        != nil, "\(outcome)")
  }

  /// On an SQLite file: the status reads without creating the file, `up` creates and migrates it,
  /// and the status then says it is up to date (exit codes 1, then 0).
  @Test func anSQLiteFileIsMigratedWhenAskedAndNotBefore() async throws {
    let sandbox = try Sandbox()
    let missing = try await sandbox.run(["migrate", "status", "--json"])
    #expect(missing.status == 1, "\(missing)")
    let before = try missing.object()
    #expect(before["state"] as? String == "missing" && before["databaseVersion"] as? Int == 0, "\(before)")
    #expect(!FileManager.default.fileExists(atPath: sandbox.database), "the status created nothing")
    let up = try await sandbox.run(["migrate", "up"])
    #expect(up.status == 0, "\(up)")
    #expect(up.stdout.hasPrefix("schema migrated from version 0 to "), "\(up)")
    let current = try await sandbox.run(["migrate", "status"])
    #expect(current.status == 0, "\(current)")
    #expect(current.stdout.contains("state     up to date"), "\(current)")
    let again = try await sandbox.run(["migrate", "up"])
    #expect(again.status == 0 && again.stdout.hasSuffix(": up to date\n"), "\(again)")
  }

  /// Without `--database` the status reads the default database's path, as it reads any other:
  /// it creates neither the file nor its folder.
  @Test func theStatusOfTheDefaultDatabaseCreatesNoFolder() async throws {
    let sandbox = try Sandbox()
    let outcome = try await sandbox.run(["migrate", "status", "--json"], withDatabase: false)
    #expect(outcome.status == 1, "\(outcome)")
    #expect(try outcome.object()["state"] as? String == "missing", "\(outcome)")
    // The sandbox's XDG_DATA_HOME: the default database is in its conveyor folder.
    let data = sandbox.path("xdg-data")
    let exists = FileManager.default.fileExists(atPath: data)
    let inside = exists ? try FileManager.default.subpathsOfDirectory(atPath: data) : []
    #expect(!exists, "the status created \(data) holding \(inside)")
  }

  /// The status of a missing file says 'migrate up' creates it: for a path no store can create
  /// (its folder is missing, its folder is a file, a loop of symbolic links) it is an error
  /// instead, as 'migrate up' on it is.
  @Test func theStatusOfAPathNoStoreCanCreateIsAnError() async throws {
    let sandbox = try Sandbox()
    try Data("x".utf8).write(to: URL(fileURLWithPath: sandbox.path("file")))
    try FileManager.default.createSymbolicLink(atPath: sandbox.path("loop1"), withDestinationPath: "loop2")
    try FileManager.default.createSymbolicLink(atPath: sandbox.path("loop2"), withDestinationPath: "loop1")
    for path in [
      sandbox.path("missing/jobs.sqlite"), sandbox.path("file/jobs.sqlite"), sandbox.path("loop1"),
    ] {
      let status = try await sandbox.run(["--database", path, "migrate", "status"], withDatabase: false)
      let up = try await sandbox.run(["--database", path, "migrate", "up"], withDatabase: false)
      #expect(up.status == 3, "\(path): \(up)")
      #expect(status.status == 3, "\(path): the status said \(status); then 'migrate up' said \(up)")
    }
  }

  /// A one-byte file (`echo > notes.txt` makes one) is no database: SQLite's Unix VFS reports a
  /// file of one byte as empty, so the status called it a database with no schema yet and
  /// 'migrate up' (as any command opening it) replaced the file with a new database. Both are
  /// refused (exit 3) and the file kept.
  @Test func aOneByteFileIsRefusedAndKept() async throws {
    let sandbox = try Sandbox()
    let path = sandbox.path("notes.txt")
    try Data("\n".utf8).write(to: URL(fileURLWithPath: path))
    let status = try await sandbox.run(["--database", path, "migrate", "status"], withDatabase: false)
    let up = try await sandbox.run(["--database", path, "migrate", "up"], withDatabase: false)
    let kept = try Data(contentsOf: URL(fileURLWithPath: path))
    #expect(kept == Data("\n".utf8), "the file now holds \(kept.count) bytes; 'migrate up' said \(up)")
    #expect(status.status == 3, "\(status)")
    #expect(up.status == 3, "\(up)")
  }

  @Test func misuseSaysWhatToDoAndChangesNothing() async throws {
    let sandbox = try Sandbox()
    for (arguments, message) in [
      (["migrate"], "missing migrate command (status, up or sql)"),
      (["migrate", "down"], "unknown migrate command \"down\": use status, up or sql"),
      (["migrate", "sql"], "migrate sql is for PostgreSQL"),
      (["migrate", "status", "extra"], "extra"),
      (["migrate", "sql", "--from", "-1"], "--from"),
    ] {
      let outcome = try await sandbox.run(arguments)
      #expect(outcome.status == 2, "\(arguments): \(outcome)")
      #expect(outcome.stderr.contains(message), "\(arguments): \(outcome)")
    }
    #expect(!FileManager.default.fileExists(atPath: sandbox.database))
    let text = sandbox.path("notes.txt")
    try Data("not a database".utf8).write(to: URL(fileURLWithPath: text))
    let refused = try await sandbox.run(["--database", text, "migrate", "status"], withDatabase: false)
    #expect(refused.status == 3 && refused.stderr.contains("not an SQLite database"), "\(refused)")
    #expect(try Data(contentsOf: URL(fileURLWithPath: text)) == Data("not a database".utf8))
  }

  /// On PostgreSQL: the status of a new database, the SQL a database administrator runs with
  /// psql, and the status after it.
  @Test func aPostgreSQLDatabaseIsMigratedByTheSQLItPrints() async throws {
    let sandbox = try Sandbox()
    let server = try await LocalPostgres.start(in: sandbox)
    defer { server.stop() }
    let status = try await sandbox.run(["--database", server.url, "migrate", "status"], withDatabase: false)
    #expect(status.status == 1 && status.stdout.contains("(no schema yet)"), "\(status)")
    let sql = try await sandbox.run(["--database", server.url, "migrate", "sql"], withDatabase: false)
    #expect(
      sql.status == 0 && sql.stdout.hasPrefix("-- Conveyor schema") && sql.stdout.hasSuffix("COMMIT;\n"),
      "\(sql)")
    let script = sandbox.path("migrate.sql")
    try Data(sql.stdout.utf8).write(to: URL(fileURLWithPath: script))
    let psql = try await RunningConveyor(
      executable: URL(fileURLWithPath: (LocalPostgres.binaries ?? "/usr/bin") + "/psql"),
      arguments: ["-v", "ON_ERROR_STOP=1", "-q", "-d", server.url, "-f", script],
      environment: ProcessInfo.processInfo.environment, folder: sandbox.folder
    ).waitForExit(timeout: .seconds(60))
    #expect(psql.status == 0, "\(psql)")
    let after = try await sandbox.run(
      ["--database", server.url, "migrate", "status", "--json"], withDatabase: false)
    #expect(after.status == 0, "\(after)")
    #expect(try after.object()["state"] as? String == "current")
    let nothing = try await sandbox.run(["--database", server.url, "migrate", "sql"], withDatabase: false)
    #expect(
      nothing.status == 0 && nothing.stdout.isEmpty && nothing.stderr.contains("nothing to run"), "\(nothing)"
    )
    // The store opens the migrated database without migrating, and works.
    let added = try await sandbox.run(
      ["--database", server.url, "add", "exec", "--", "true"], withDatabase: false)
    #expect(added.status == 0, "\(added)")
  }
}
