import ConveyorTestSupport
import Foundation
import Testing

/// Mistakes a person makes, answered with an exit code and a message naming the fix.
@Suite struct ErrorTests {
  struct Mistake: CustomTestStringConvertible, Sendable {
    var arguments: [String]
    var message: String
    var testDescription: String { arguments.joined(separator: " ") }
  }

  static let mistakes: [Mistake] = [
    Mistake(arguments: ["frobnicate"], message: #"unknown command "frobnicate""#),
    Mistake(arguments: ["add", "exec", "echo", "hello"], message: "put the command after --"),
    Mistake(arguments: ["add", "exec", "--"], message: "missing the command after --"),
    Mistake(arguments: ["add", "mail", "x"], message: #"unknown job kind "mail": use http or exec"#),
    Mistake(
      arguments: ["add", "http", "GET", "example.com/x"], message: "is not an http:// or https:// URL"),
    Mistake(
      arguments: ["add", "http", "GET", "ftp://example.com/x"], message: "is not an http:// or https:// URL"),
    Mistake(
      arguments: ["add", "http", "GET", "http://127.0.0.1/", "-H", "Accept"],
      message: #"header "Accept" must look like 'Name: value'"#),
    Mistake(
      arguments: ["add", "http", "GET", "http://127.0.0.1/", "-H", "Bad Name: x"],
      message: #"header "Bad Name: x" must look like 'Name: value'"#),
    Mistake(
      arguments: ["add", "http", "POST", "http://127.0.0.1/", "--data", "a", "--data-file", "/dev/null"],
      message: "use --data or --data-file, not both"),
    Mistake(
      arguments: ["add", "http", "POST", "http://127.0.0.1/", "--data-file", "/nonexistent/body.json"],
      message: #"cannot read --data-file "/nonexistent/body.json""#),
    Mistake(
      arguments: ["work", "--concurrency", "0"],
      message: #"--concurrency must be a whole number in 1...1000, got "0""#),
    Mistake(
      arguments: ["work", "--lease", "soon"], message: #"--lease must be a number of seconds, got "soon""#),
    Mistake(
      arguments: ["work", "--lease", "0"], message: #"--lease must be a number of seconds above 0, got "0""#),
    Mistake(
      arguments: ["add", "exec", "--timeout", "0", "--", "true"],
      message: #"--timeout must be a number of seconds above 0, got "0""#),
    Mistake(
      arguments: ["add", "exec", "--delay", "-1", "--", "true"],
      message: "--delay must be a number of seconds"),
    Mistake(
      arguments: ["add", "exec", "--delay", "1e300", "--", "true"],
      message: "--delay must be a number of seconds"),
    Mistake(
      arguments: ["work", "--forever"],
      message: #"unknown option "--forever" for conveyor work; run 'conveyor work --help'"#),
    Mistake(arguments: ["--queue", "bad name", "status"], message: #"invalid queue identifier "bad name""#),
    Mistake(
      arguments: ["list", "--status", "sleeping"],
      message: #"--status must be ready, scheduled, held, pending, running, dead, completed or cancelled"#),
    Mistake(arguments: ["retry", "abc"], message: #""abc" is not a job ID (a positive whole number)"#),
    Mistake(arguments: ["remove", "12x"], message: #""12x" is not a job ID (a positive whole number)"#),
    Mistake(arguments: ["retry"], message: "name dead job IDs to retry, or --all"),
    Mistake(arguments: ["retry", "--all", "3"], message: "name job IDs or use --all, not both"),
    Mistake(arguments: ["remove"], message: "name the job IDs to remove"),
    Mistake(
      arguments: ["status", "--database"],
      message: "--database is not an option of conveyor status: --database goes before the command"),
    Mistake(arguments: ["--queue"], message: "--queue needs a value"),
    Mistake(arguments: ["--database", "", "status"], message: "--database needs a file path"),
  ]

  @Test(arguments: mistakes)
  func aUsageMistakeExitsTwoWithAHint(mistake: Mistake) async throws {
    let sandbox = try Sandbox()
    let outcome = try await sandbox.run(mistake.arguments)
    #expect(outcome.status == 2, "\(outcome)")
    #expect(outcome.stdout.isEmpty)
    #expect(outcome.stderr.hasPrefix("conveyor: "))
    #expect(outcome.stderr.contains(mistake.message), "\(outcome)")
    #expect(!FileManager.default.fileExists(atPath: sandbox.database), "a usage mistake created the database")
  }

  @Test func anUnreachablePostgresDatabaseExitsThreeWithoutThePassword() async throws {
    let sandbox = try Sandbox()
    // Port 1 on loopback: nothing listens there, so the connection is refused at once.
    for url in ["postgres://app:s3cret-pw@127.0.0.1:1/jobs", "postgresql://user:s3cret-pw@localhost:1/jobs"] {
      let outcome = try await sandbox.run(["--database", url, "status"], withDatabase: false)
      #expect(outcome.status == 3, "\(outcome)")
      #expect(outcome.stderr.contains("Check that the server is running"), "\(outcome)")
      #expect(!outcome.stderr.contains("s3cret-pw") && !outcome.stdout.contains("s3cret-pw"), "\(outcome)")
    }
  }

  @Test func aFolderAsTheDatabaseExitsThreeNamingAFileToUse() async throws {
    let sandbox = try Sandbox()
    let outcome = try await sandbox.run(["--database", sandbox.folder.path, "status"], withDatabase: false)
    #expect(outcome.status == 3, "\(outcome)")
    #expect(
      outcome.stderr.contains("\(sandbox.folder.path) is a folder; pass the path of a database file in it"))
    #expect(outcome.stderr.contains(sandbox.path("conveyor.sqlite")))
  }

  @Test func helpPrintsUsage() async throws {
    let sandbox = try Sandbox()
    for arguments in [["help"], ["--help"], []] {
      let outcome = try await sandbox.run(arguments, withDatabase: false)
      #expect(outcome.status == 0, "\(outcome)")
      #expect(outcome.stdout.contains("Usage: conveyor [--database PATH|URL]"))
      #expect(outcome.stdout.contains("Exit codes:"))
    }
  }

  @Test func aFileThatIsNotADatabaseIsLeftUntouchedAndExitsThree() async throws {
    let sandbox = try Sandbox()
    var generator = SeededRandom(seed: 42)
    let bytes = Data((0..<8192).map { _ in UInt8(truncatingIfNeeded: generator.next()) })
    try bytes.write(to: URL(fileURLWithPath: sandbox.database))

    let outcome = try await sandbox.run(["status"])
    #expect(outcome.status == 3, "\(outcome)")
    #expect(outcome.stderr.contains("\(sandbox.database): this file is not an SQLite database"))
    #expect(outcome.stderr.contains("left untouched"))
    #expect(FileManager.default.contents(atPath: sandbox.database) == bytes)
    #expect(!FileManager.default.fileExists(atPath: sandbox.database + "-wal"))
    #expect(!FileManager.default.fileExists(atPath: sandbox.database + "-shm"))
  }

  @Test func anotherApplicationsSQLiteDatabaseIsLeftUntouchedAndExitsThree() async throws {
    let sandbox = try Sandbox()
    let bytes = foreignSQLiteDatabase()
    try bytes.write(to: URL(fileURLWithPath: sandbox.database))

    for arguments in [["status"], ["add", "exec", "--", "true"], ["work", "--until-empty"]] {
      let outcome = try await sandbox.run(arguments)
      #expect(outcome.status == 3, "\(outcome)")
      #expect(outcome.stderr.contains("this is another application's SQLite database"), "\(outcome)")
      #expect(outcome.stderr.contains("choose another path for Conveyor"))
      #expect(FileManager.default.contents(atPath: sandbox.database) == bytes)
    }
  }

  /// An empty SQLite database (one page, no tables) whose header says it belongs to another
  /// application (`PRAGMA application_id`), written byte by byte so the test needs no SQLite.
  private func foreignSQLiteDatabase() -> Data {
    let pageSize = 4096
    var page = [UInt8](repeating: 0, count: pageSize)
    func put(_ value: UInt32, at offset: Int) {
      for index in 0..<4 { page[offset + index] = UInt8(truncatingIfNeeded: value >> (24 - 8 * index)) }
    }
    page.replaceSubrange(0..<16, with: Array("SQLite format 3\0".utf8))
    page[16] = 0x10  // page size 4096, big-endian
    page[17] = 0x00
    page[18] = 1  // file format write version: legacy
    page[19] = 1  // read version
    page[21] = 64  // maximum embedded payload fraction
    page[22] = 32  // minimum embedded payload fraction
    page[23] = 32  // leaf payload fraction
    put(1, at: 24)  // file change counter
    put(1, at: 28)  // database size in pages
    put(1, at: 40)  // schema cookie
    put(4, at: 44)  // schema format
    put(1, at: 56)  // text encoding: UTF-8
    put(0x4241_4E4B, at: 68)  // application_id: "BANK"
    put(1, at: 92)  // version-valid-for
    put(3_045_000, at: 96)  // SQLite version that wrote it
    page[100] = 0x0D  // page 1 is an empty table b-tree leaf
    page[105] = 0x10  // its cell content area starts at 4096
    return Data(page)
  }
}
