import Foundation
import LoopbackHTTPServer
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// Inputs an attacker (or an unlucky user) controls: the database path, what a server answers,
/// what is typed on the command line. Each is refused with a clear error or handled safely.
@Suite struct HostileInputTests {
  // MARK: 1. the database path

  @Test func aFIFOAsTheDatabaseIsRefusedBeforeSQLiteOpensIt() async throws {
    let sandbox = try Sandbox()
    let path = sandbox.path("pipe.sqlite")
    try #require(mkfifo(path, 0o600) == 0)
    let outcome = try await sandbox.run(
      ["--database", path, "status"], withDatabase: false, timeout: .seconds(10))
    #expect(outcome.status == 3, "\(outcome)")
    #expect(outcome.stderr.contains("\(path): this is not a regular file"), "\(outcome)")
    #expect(outcome.stderr.contains("pass the path of a database file"), "\(outcome)")
    for suffix in ["-journal", "-wal", "-shm"] {
      #expect(!FileManager.default.fileExists(atPath: path + suffix), "\(suffix) left beside the FIFO")
    }
  }

  @Test func aDeviceAsTheDatabaseIsRefusedAndNeverWritten() async throws {
    let sandbox = try Sandbox()
    // A character device node for /dev/null's driver (1, 3) inside the sandbox, so that a store
    // that writes to it leaves its journal in the sandbox; creating it needs root. A symbolic
    // link to it is refused too.
    let device = sandbox.path("device.sqlite")
    let link = sandbox.path("link.sqlite")
    guard mknod(device, S_IFCHR | 0o600, (1 << 8) | 3) == 0 else { return }
    try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: device)
    for path in [device, link] {
      let outcome = try await sandbox.run(
        ["--database", path, "add", "exec", "--", "true"], withDatabase: false, timeout: .seconds(10))
      #expect(outcome.status == 3, "\(outcome)")
      #expect(outcome.stderr.contains("\(path): this is not a regular file"), "\(outcome)")
      #expect(outcome.stdout.isEmpty)
    }
    #expect(!FileManager.default.fileExists(atPath: device + "-journal"))
    #expect(!FileManager.default.fileExists(atPath: link + "-journal"))
  }

  /// Names SQLite reads as something else than a file, and one-character names, which crashed
  /// (SIGILL in Foundation's path splitting): each is a file in the folder the command runs in.
  @Test func oddDatabaseNamesAreFilesInTheCurrentFolder() async throws {
    let sandbox = try Sandbox()
    for name in ["x", "-", ":memory:", "é"] {
      let added = try await sandbox.run(
        ["--database", name, "add", "exec", "--", "true"], withDatabase: false, directory: sandbox.folder)
      #expect(added.status == 0, "\(name): \(added)")
      // Another process sees the job: it is in the file, not in memory.
      let status = try await sandbox.run(
        ["--database", name, "status", "--json"], withDatabase: false, directory: sandbox.folder)
      #expect(status.status == 0, "\(name): \(status)")
      #expect((try? status.object()["counts"] as? [String: Int]) == allCounts(ready: 1), "\(name): \(status)")
      #expect(FileManager.default.fileExists(atPath: sandbox.path(name)), "\(name) is a file")
    }
    let fromEnvironment = try await sandbox.run(
      ["status"], withDatabase: false, extraEnvironment: ["CONVEYOR_DATABASE": "q"], directory: sandbox.folder
    )
    #expect(fromEnvironment.status == 0, "\(fromEnvironment)")
    #expect(FileManager.default.fileExists(atPath: sandbox.path("q")))
  }

  /// Long paths the system takes: a 600-byte path in folders that exist and are writable (SQLite's
  /// own limit is 512 bytes), and a 253-byte name (its `-wal` file's name would pass the file
  /// system's 255). Each is opened, or refused with an error that says the path is too long; it
  /// was "unable to open database file", telling the user to check that the folder exists and is
  /// writable (and the 253-byte name was left behind as a database file).
  @Test func aLongDatabasePathIsOpenedOrRefusedAsTooLong() async throws {
    let sandbox = try Sandbox()
    let deep = (0..<6).reduce(sandbox.folder.path) { folder, _ in
      folder + "/" + String(repeating: "d", count: 100)
    }
    try FileManager.default.createDirectory(atPath: deep, withIntermediateDirectories: true)
    for path in [deep + "/jobs.sqlite", sandbox.path(String(repeating: "n", count: 253))] {
      let outcome = try await sandbox.run(
        ["--database", path, "add", "exec", "--", "true"], withDatabase: false, directory: sandbox.folder)
      #expect(
        outcome.status == 0 || outcome.stderr.lowercased().contains("too long"),
        "\(path.utf8.count) bytes: \(outcome)")
    }
  }

  /// A symbolic link to a database file that does not exist yet (a link made to a data volume
  /// before the first run): SQLite would create the file it names; the store is opened there, or
  /// the error says the link's target is missing. It was "unable to open database file".
  @Test func aSymbolicLinkToANewDatabaseFileIsOpenedOrExplained() async throws {
    let sandbox = try Sandbox()
    let target = sandbox.path("target.sqlite")
    let link = sandbox.path("link.sqlite")
    try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: target)
    let outcome = try await sandbox.run(
      ["--database", link, "add", "exec", "--", "true"], withDatabase: false, directory: sandbox.folder)
    #expect(
      outcome.status == 0 || outcome.stderr.contains("symbolic link"), "\(outcome)")
  }

  /// Database strings that are neither a path nor a PostgreSQL connection this tool accepts: each
  /// is refused with the accepted forms, its password never shown, no file made of it.
  static let nearMisses = [
    "postgress://alice:SECRET-PW@db.example/app",
    "POSTGRES:/alice:SECRET-PW@db.example/app",
    "pgsql://alice:SECRET-PW@db.example/app",
    "HOST=db.example password=SECRET-PW dbname=app",
    "hots=db.example password=SECRET-PW",
    "jobs.sqlite password=SECRET-PW",
    "alice:SECRET-PW@db.example",
    "file:jobs.sqlite?mode=memory&password=SECRET-PW",
  ]

  @Test(arguments: nearMisses)
  func aDatabaseStringThatIsNearlyRightIsRefusedWithoutShowingItsPassword(text: String) async throws {
    let sandbox = try Sandbox()
    for (arguments, environment) in [
      (["--database", text, "status"], [String: String]()), (["status"], ["CONVEYOR_DATABASE": text]),
    ] {
      let outcome = try await sandbox.run(
        arguments, withDatabase: false, extraEnvironment: environment, directory: sandbox.folder)
      #expect(outcome.status == 2, "\(outcome)")
      #expect(outcome.stderr.contains("postgres://"), "names the accepted forms: \(outcome)")
      #expect(!outcome.stderr.contains("SECRET-PW") && !outcome.stdout.contains("SECRET-PW"), "\(outcome)")
    }
    let made = try FileManager.default.contentsOfDirectory(atPath: sandbox.folder.path)
    #expect(!made.contains { $0.contains("SECRET") || $0.contains("=") || $0.contains("@") }, "\(made)")
  }

  /// A libpq connection string and an upper-case scheme reach PostgreSQL (here a port nothing
  /// listens on: the connection error), never an SQLite file named after them.
  @Test func connectionStringsAndUpperCaseSchemesGoToPostgreSQL() async throws {
    let sandbox = try Sandbox()
    for text in [
      "host=127.0.0.1 port=1 dbname=app user=alice password=SECRET-PW connect_timeout=5",
      "POSTGRES://alice:SECRET-PW@127.0.0.1:1/app?connect_timeout=5",
      "PostgreSQL://alice:SECRET-PW@127.0.0.1:1/app?connect_timeout=5",
    ] {
      let outcome = try await sandbox.run(
        ["status"], withDatabase: false, extraEnvironment: ["CONVEYOR_DATABASE": text],
        directory: sandbox.folder)
      #expect(outcome.status == 3, "\(outcome)")
      #expect(outcome.stderr.contains("PostgreSQL"), "\(outcome)")
      #expect(!outcome.stderr.contains("SECRET-PW") && !outcome.stdout.contains("SECRET-PW"), "\(outcome)")
    }
    #expect(
      try FileManager.default.contentsOfDirectory(atPath: sandbox.folder.path).allSatisfy {
        $0.hasSuffix(".stdout") || $0.hasSuffix(".stderr")
      })
  }

  /// A libpq connection string reaches the shared server: the job is there for a worker using the
  /// URL form, and no local file is made (one named after the string got the jobs).
  @Test(.enabled(if: LocalPostgres.binaries != nil, "the PostgreSQL server is not installed"))
  func aConnectionStringReachesTheSharedServer() async throws {
    let sandbox = try Sandbox()
    let server = try await LocalPostgres.start(in: sandbox)
    defer { server.stop() }
    let before = Set(try FileManager.default.contentsOfDirectory(atPath: sandbox.folder.path))
    let conninfo = "host=127.0.0.1 port=\(server.port) user=postgres dbname=postgres"
    let added = try await sandbox.run(
      ["--database", conninfo, "add", "exec", "--", "true"], withDatabase: false, directory: sandbox.folder)
    #expect(added.status == 0, "\(added)")
    let status = try await sandbox.run(["--database", server.url, "status", "--json"], withDatabase: false)
    #expect((try? status.object()["counts"] as? [String: Int]) == allCounts(ready: 1), "\(status)")
    let made = Set(try FileManager.default.contentsOfDirectory(atPath: sandbox.folder.path)).subtracting(
      before)
    #expect(made.allSatisfy { $0.hasSuffix(".stdout") || $0.hasSuffix(".stderr") }, "\(made)")
  }

  /// A password given on the command line is visible to every user of the machine (`ps`): the
  /// tool says so, once, and names the safe ways; from the environment it says nothing.
  @Test func aPasswordOnTheCommandLineIsWarnedOfOnce() async throws {
    let sandbox = try Sandbox()
    let url = "postgresql://alice:SECRET-PW@127.0.0.1:1/app?connect_timeout=5"
    let given = try await sandbox.run(["--database", url, "status"], withDatabase: false)
    #expect(given.status == 3, "\(given)")
    #expect(given.stderr.components(separatedBy: "password is on the command line").count == 2, "\(given)")
    #expect(given.stderr.contains("CONVEYOR_DATABASE") && given.stderr.contains("PGPASSFILE"), "\(given)")
    #expect(!given.stderr.contains("SECRET-PW"), "\(given)")
    let fromEnvironment = try await sandbox.run(
      ["status"], withDatabase: false, extraEnvironment: ["CONVEYOR_DATABASE": url])
    #expect(fromEnvironment.status == 3, "\(fromEnvironment)")
    #expect(!fromEnvironment.stderr.contains("warning"), "\(fromEnvironment)")
    let withoutPassword = try await sandbox.run(
      ["--database", "postgresql://alice@127.0.0.1:1/app?connect_timeout=5", "status"], withDatabase: false)
    #expect(!withoutPassword.stderr.contains("warning"), "\(withoutPassword)")
  }

  /// libpq reads a backslash in an unquoted value as an escape (`password=se\ cret` is the password
  /// "se cret"): such a string is a valid connection string, so it goes to PostgreSQL (here a port
  /// nothing listens on), and no part of its password is shown. A password with an unescaped space
  /// is not valid, and the refusal does not quote the password's second word either.
  @Test func aPasswordWithASpaceInAConnectionStringIsNeverShown() async throws {
    let sandbox = try Sandbox()
    let escaped = #"host=127.0.0.1 port=1 dbname=app user=alice password=SECRET\ PW-TAIL connect_timeout=5"#
    let outcome = try await sandbox.run(
      ["status"], withDatabase: false, extraEnvironment: ["CONVEYOR_DATABASE": escaped],
      directory: sandbox.folder)
    #expect(outcome.status == 3, "a valid libpq string goes to PostgreSQL: \(outcome)")
    #expect(!outcome.stderr.contains("PW-TAIL") && !outcome.stdout.contains("PW-TAIL"), "\(outcome)")
    let unescaped = "host=127.0.0.1 port=1 dbname=app user=alice password=SECRET PW-TAIL"
    let refused = try await sandbox.run(
      ["status"], withDatabase: false, extraEnvironment: ["CONVEYOR_DATABASE": unescaped],
      directory: sandbox.folder)
    #expect(refused.status == 2 || refused.status == 3, "\(refused)")
    #expect(!refused.stderr.contains("PW-TAIL") && !refused.stdout.contains("PW-TAIL"), "\(refused)")
  }

  /// A password libpq reads from the command line in another spelling: a URL query key
  /// percent-encoded (`pass%77ord=`, which libpq decodes), or a URL password holding a space
  /// (libpq takes `user:pass word@`). Each is on the command line all the same, and is warned of.
  @Test(arguments: [
    "postgresql://alice@127.0.0.1:1/app?pass%77ord=SECRET-PW&connect_timeout=5",
    "postgresql://alice:SECRET PW@127.0.0.1:1/app?connect_timeout=5",
  ])
  func aPasswordOnTheCommandLineIsWarnedOfWhateverItsSpelling(url: String) async throws {
    let sandbox = try Sandbox()
    let given = try await sandbox.run(["--database", url, "status"], withDatabase: false)
    #expect(given.status == 3, "\(given)")
    #expect(given.stderr.components(separatedBy: "password is on the command line").count == 2, "\(given)")
    #expect(!given.stderr.contains("SECRET"), "\(given)")
  }

  /// Only the last `--database` is used, but every one given is on the command line: a password
  /// in an earlier one is warned of too (it was not).
  @Test func aPasswordInAnyDatabaseOptionIsWarnedOf() async throws {
    let sandbox = try Sandbox()
    let outcome = try await sandbox.run(
      ["-d", "postgresql://alice:SECRET-PW@127.0.0.1:1/app", "-d", sandbox.database, "status"],
      withDatabase: false)
    #expect(outcome.status == 0, "\(outcome)")
    #expect(
      outcome.stderr.components(separatedBy: "password is on the command line").count == 2, "\(outcome)")
    #expect(!outcome.stderr.contains("SECRET"), "\(outcome)")
  }

  // Failed before the fix: `conveyor status` prints the database path as given, raw: an ESC sequence recolours
  // the terminal and a newline fakes a line of output. Every other user-visible string goes
  // through printable(). Promise (issue 8): control characters are escaped in everything
  // `conveyor` prints. Where: CLI.status in Sources/conveyor/CLI.swift,
  // `output("database  \(store.path)")`.
  @Test func statusEscapesControlCharactersInTheDatabasePath() async throws {
    let sandbox = try Sandbox()
    let path = sandbox.path("x\u{1B}[31mred\nqueue     forged.sqlite")
    let outcome = try await sandbox.run(["--database", path, "status"], withDatabase: false)
    #expect(outcome.status == 0, "\(outcome)")
    #expect(!outcome.stdout.contains("\u{1B}"), "raw ESC in: \(outcome.stdout.debugDescription)")
    #expect(
      outcome.lines.filter { $0.hasPrefix("queue ") }.count == 1,
      "a forged line: \(outcome.stdout.debugDescription)")
  }

  // MARK: 2. credentials on redirects

  @Test func credentialsAreNotSentToAnotherOriginOnARedirect() async throws {
    let sandbox = try Sandbox()
    let elsewhere = try LoopbackHTTPServer { _, _ in .ok() }
    defer { elsewhere.stop() }
    let origin = try LoopbackHTTPServer { request, _ in
      request.path == "/same"
        ? .status(307, "", headers: [("Location", "/landed")])
        : request.path == "/landed"
          ? .ok() : .status(307, "", headers: [("Location", elsewhere.url("/landed").absoluteString)])
    }
    defer { origin.stop() }
    for path in ["/away", "/same"] {
      try await sandbox.add([
        "http", "POST", origin.url(path).absoluteString, "-H", "Authorization: Bearer s3cret",
        "-H", "Cookie: session=s3cret", "-H", "Proxy-Authorization: Basic s3cret", "-H", "X-Trace: kept",
        "--data", "x",
      ])
    }
    let work = try await sandbox.run(["work", "--until-empty"])
    #expect(work.status == 0, "\(work)")
    let away = try #require(elsewhere.requests.first)
    #expect(away.header("Authorization") == nil)
    #expect(away.header("Cookie") == nil)
    #expect(away.header("Proxy-Authorization") == nil)
    #expect(away.header("X-Trace") == "kept")
    // A redirect within the origin keeps them.
    let same = try #require(origin.requests.first { $0.path == "/landed" })
    #expect(same.header("Authorization") == "Bearer s3cret")
    #expect(same.header("Cookie") == "session=s3cret")
  }

  // Failed before the fix: credentials in the URL's userinfo reach another origin: the job's server answers
  // `302 Location: //127.0.0.1:<other port>/...` (scheme-relative), swift-corelibs-foundation
  // keeps user:password from the original URL, and libcurl sends them as Basic credentials to
  // the other server. Promise (`add http --help`, issue 8): "A redirect to another host drops
  // Authorization, Cookie and Proxy-Authorization". Where: NetworkSession.redirect(_:from:)
  // (Sources/ConveyorNetworking/NetworkSession.swift) strips headers only, not URL userinfo.
  @Test func userinfoCredentialsAreNotSentToAnotherOriginOnARedirect() async throws {
    let sandbox = try Sandbox()
    let elsewhere = try LoopbackHTTPServer { _, _ in .ok() }
    defer { elsewhere.stop() }
    let origin = try LoopbackHTTPServer { _, _ in
      .status(302, "", headers: [("Location", "//127.0.0.1:\(elsewhere.port)/landed")])
    }
    defer { origin.stop() }
    try await sandbox.add(["http", "GET", "http://user:s3cret@127.0.0.1:\(origin.port)/start"])
    let outcome = try await sandbox.run(["work", "--until-empty", "--max-attempts", "1"])
    #expect(outcome.stdout.contains("1 delivered"), "\(outcome)")
    let landed = try #require(elsewhere.requests.first)
    #expect(
      landed.header("authorization") == nil, "sent to another origin: \(landed.header("authorization") ?? "")"
    )
  }

  // MARK: 3. a 401 asking for credentials

  @Test func a401WithWWWAuthenticateIsDeadAtOnce() async throws {
    let sandbox = try Sandbox()
    let server = try LoopbackHTTPServer { _, _ in
      .status(401, "who are you", headers: [("WWW-Authenticate", #"Basic realm="api""#)])
    }
    defer { server.stop() }
    try await sandbox.add(["http", "GET", server.url("/private").absoluteString, "--timeout", "2"])
    let work = try await sandbox.run(["work", "--until-empty", "--json"], timeout: .seconds(15))
    #expect(work.status == 1, "\(work)")
    let died = try #require(try work.objects().first { $0["event"] as? String == "died" })
    #expect((died["error"] as? String)?.contains("HTTP 401") == true, "\(died)")
    #expect(server.requests.count == 1)
  }

  // MARK: 4, 5, 6, 10. requests that are not what they seem

  struct Refusal: CustomTestStringConvertible, Sendable {
    var arguments: [String]
    var message: String
    var testDescription: String { arguments.map { printableForTest($0) }.joined(separator: " ") }
  }

  static let refusals: [Refusal] = [
    Refusal(arguments: ["GET\r\nX-Injected: 1", "http://127.0.0.1:9/"], message: "is not an HTTP method"),
    Refusal(arguments: ["GÉT", "http://127.0.0.1:9/"], message: "is not an HTTP method"),
    Refusal(
      arguments: ["GET", "http://127.0.0.1:9/", "-H", "X-A: a\r\nX-Injected: 1"],
      message: "control characters"),
    Refusal(
      arguments: ["GET", "http://127.0.0.1:9/", "-H", "X-A: a\u{1B}[2J"], message: "control characters"),
    Refusal(
      arguments: ["GET", "http://127.0.0.1:9/", "-H", "X\r\nY: 1"], message: "must look like 'Name: value'"),
    Refusal(
      arguments: ["POST", "http://127.0.0.1:9/", "-H", "Content-Length: 0", "--data", "abc"],
      message: "cannot be given"),
    Refusal(
      arguments: ["POST", "http://127.0.0.1:9/", "-H", "Transfer-Encoding: chunked"],
      message: "cannot be given"),
    Refusal(
      arguments: ["GET", "http://127.0.0.1:9/", "-H", "Host: evil.example"], message: "cannot be given"),
    Refusal(arguments: ["GET", "http://127.0.0.1:99999/"], message: "a port is 1...65535"),
    Refusal(arguments: ["GET", "http://127.0.0.1:9/", "--data", "x"], message: "cannot have a body"),
    Refusal(arguments: ["GET", "ftp://127.0.0.1/"], message: "is not an http:// or https:// URL"),
  ]

  @Test(arguments: refusals)
  func aRequestThatIsNotWhatItSeemsIsRefusedAtAdd(refusal: Refusal) async throws {
    let sandbox = try Sandbox()
    let outcome = try await sandbox.run(["add", "http"] + refusal.arguments)
    #expect(outcome.status == 2, "\(outcome)")
    #expect(outcome.stderr.contains(refusal.message), "\(outcome)")
    #expect(!outcome.stderr.contains("\r") && !outcome.stderr.contains("\u{1B}"), "\(outcome)")
    #expect(outcome.stdout.isEmpty)
  }

  @Test func anUpperCaseSchemeIsDeliveredAndRepeatedHeadersKeepEveryValue() async throws {
    let sandbox = try Sandbox()
    let server = try LoopbackHTTPServer { _, _ in .ok() }
    defer { server.stop() }
    try await sandbox.add([
      "http", "POST", "HTTP://127.0.0.1:\(server.port)/upper", "-H", "X-A: 1", "-H", "x-a: 2", "-H",
      "Cookie: a=1",
      "-H", "Cookie: b=2", "--data", "x",
    ])
    let work = try await sandbox.run(["work", "--until-empty"])
    #expect(work.status == 0, "\(work)")
    let request = try #require(server.requests.first)
    #expect(request.path == "/upper")
    #expect(request.header("X-A") == "1, 2")
    #expect(request.header("Cookie") == "a=1; b=2")
  }

  // MARK: 7. control characters from a server, a command or a payload

  @Test func controlCharactersFromAServerAreEscapedInWorkAndList() async throws {
    let sandbox = try Sandbox()
    let hostile = "\u{1B}[2J\u{1B}]0;owned\u{07}\njob 99: done\r\u{9B}31m"
    let server = try LoopbackHTTPServer { _, _ in .status(404, hostile) }
    defer { server.stop() }
    try await sandbox.add(["http", "GET", server.url("/x").absoluteString])
    try await sandbox.add(["exec", "--", "sh", "-c", "printf '\\033[31mred\\njob 98: done\\n'; exit 127"])
    let work = try await sandbox.run(["work", "--until-empty"])
    #expect(work.status == 1, "\(work)")
    let list = try await sandbox.succeed(["list"])
    for text in [work.stdout, list.stdout] {
      #expect(
        !text.unicodeScalars.contains { $0.value == 0x1B || $0.value == 0x9B || $0.value == 0x07 }, "\(text)")
      #expect(!text.contains("\r"))
      #expect(
        !text.split(separator: "\n").contains { $0.hasPrefix("job 99") || $0.hasPrefix("job 98") }, "\(text)")
    }
    #expect(list.stdout.contains(#"\u{1B}[2J"#), "\(list)")
    let json = try await sandbox.succeed(["list", "--json"]).stdout
    #expect(
      !json.unicodeScalars.contains { $0.value < 0x20 && $0 != "\n" || (0x7F...0x9F).contains($0.value) })
    let errors = try json.split(separator: "\n").map { try jsonObject(String($0)) }.compactMap {
      $0["lastError"] as? String
    }
    #expect(errors.contains { $0.contains(hostile) }, "the JSON keeps the text exactly: \(json)")
  }

  // MARK: 8. options after a subcommand

  @Test func curlsDashDAfterTheCommandIsAUsageErrorAndCreatesNothing() async throws {
    let sandbox = try Sandbox()
    let outcome = try await sandbox.run(
      ["add", "http", "POST", "http://127.0.0.1:9/", "-d", #"{"a":1}"#], directory: sandbox.folder)
    #expect(outcome.status == 2, "\(outcome)")
    #expect(outcome.stderr.contains("-d is not an option of conveyor add http"), "\(outcome)")
    #expect(outcome.stderr.contains("use --data"), "\(outcome)")
    #expect(!FileManager.default.fileExists(atPath: sandbox.path(#"{"a":1}"#)))
    #expect(!FileManager.default.fileExists(atPath: sandbox.database))
    // Options may follow the operands.
    try await sandbox.add(["http", "POST", "http://127.0.0.1:9/", "--data", #"{"a":1}"#, "--delay", "60"])
    #expect(try await sandbox.counts() == counts(scheduled: 1))
  }

  // Options after the command belong to it; misplaced or unknown ones are usage errors;
  // hostile header names/values and methods are refused before anything is stored. (A NUL cannot
  // be tested here: argv truncates at it.)
  @Test(arguments: [
    ["status", "--queue", "x"], ["list", "-d", "x.sqlite"], ["work", "--until-empty=yes"],
    ["list", "--status", "ready\u{1B}[2J"], ["remove", "--", "1"], ["retry", "0"],
    ["add", "--key", "k", "http"],
    ["add", "http", "GET", "http://127.0.0.1:1/", "-H", "X-A\u{2028}B: v"],
    ["add", "http", "GET", "http://127.0.0.1:1/", "-H", "X: a\u{85}b"],
    ["add", "http", "GET", "http://127.0.0.1:0/"],
    ["add", "http", "HEAD", "http://127.0.0.1:1/", "--data", "x"],
    ["add", "http", "POST", "http://127.0.0.1:1/", "-H", "host: evil"],
  ])
  func misplacedOrHostileWordsAreUsageErrors(_ words: [String]) async throws {
    let sandbox = try Sandbox()
    let outcome = try await sandbox.run(words)
    #expect(outcome.status == 2, "\(words.debugDescription): \(outcome)")
    #expect(!outcome.stderr.contains("\u{1B}") && !outcome.stderr.contains("\u{0}"), "\(outcome)")
    #expect(
      !FileManager.default.fileExists(atPath: sandbox.database),
      "\(words.debugDescription) created the database")
  }

  // MARK: 14. no traps

  @Test func aDataFileTooLargeIsRefusedWithoutReadingIt() async throws {
    let sandbox = try Sandbox()
    let big = sandbox.path("big.bin")
    try #require(FileManager.default.createFile(atPath: big, contents: nil))
    try #require(truncate(big, 1_600_000_000) == 0)  // sparse: no disk used
    let outcome = try await sandbox.run(["add", "http", "POST", "http://127.0.0.1:9/", "--data-file", big])
    #expect(outcome.status == 2, "\(outcome)")
    #expect(outcome.stderr.contains("is larger than 64 MiB"), "\(outcome)")
  }

  @Test func aFullStandardOutputAfterAddReportsTheJobIDAndExitsOne() async throws {
    let sandbox = try Sandbox()
    guard let full = FileHandle(forWritingAtPath: "/dev/full") else { return }
    defer { closeQuietly(full) }
    let outcome = try await sandbox.run(["add", "exec", "--", "true"], standardOutput: full)
    #expect(outcome.status == 1, "\(outcome)")
    #expect(outcome.stderr.contains("job 1 was added, but its ID could not be written"), "\(outcome)")
    let status = try await sandbox.run(["status"], standardOutput: full)
    #expect(status.status == 1, "\(status)")
    #expect(status.stderr.contains("could not write to standard output"), "\(status)")
    #expect(try await sandbox.counts() == counts(ready: 1))
  }

  // MARK: 15. the store is closed on exit

  @Test func theDatabaseIsOneSelfContainedFileAfterEachCommand() async throws {
    let sandbox = try Sandbox()
    try await sandbox.add(["exec", "--", "true"])
    #expect(try await sandbox.run(["work", "--until-empty"]).status == 0)
    for suffix in ["-wal", "-shm"] {
      #expect(!FileManager.default.fileExists(atPath: sandbox.database + suffix), "\(suffix) left behind")
    }
  }

  // MARK: 16. --cwd

  @Test func aMissingWorkingDirectoryMakesTheJobDeadAtOnce() async throws {
    let sandbox = try Sandbox()
    try await sandbox.add(["exec", "--cwd", sandbox.path("nowhere"), "--", "true"])
    let work = try await sandbox.run(["work", "--until-empty", "--json"])
    #expect(work.status == 1, "\(work)")
    let events = try work.objects()
    #expect(!events.contains { $0["event"] as? String == "retry_scheduled" }, "\(work)")
    #expect(events.contains { ($0["error"] as? String)?.contains("does not exist") == true }, "\(work)")
  }

  @Test func aFileAsWorkingDirectoryIsRefusedAtAdd() async throws {
    let sandbox = try Sandbox()
    let file = sandbox.path("notes.txt")
    try #require(FileManager.default.createFile(atPath: file, contents: Data("x".utf8)))
    for given in [file, "notes.txt"] {
      let outcome = try await sandbox.run(
        ["add", "exec", "--cwd", given, "--", "true"], directory: sandbox.folder)
      #expect(outcome.status == 2, "\(outcome)")
      #expect(outcome.stderr.contains("\(file)\" is a file, not a folder"), "\(outcome)")
      #expect(outcome.stdout.isEmpty)
    }
    #expect(!FileManager.default.fileExists(atPath: sandbox.database), "nothing was stored")
  }

  @Test func aWorkingDirectoryChangedAfterAddIsReportedAsItIs() async throws {
    let sandbox = try Sandbox()
    let replaced = sandbox.folder.appendingPathComponent("replaced")
    let removed = sandbox.folder.appendingPathComponent("removed")
    for folder in [replaced, removed] {
      try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
      try await sandbox.add(["exec", "--cwd", folder.path, "--", "true"])
      try FileManager.default.removeItem(at: folder)
    }
    try #require(FileManager.default.createFile(atPath: replaced.path, contents: Data("x".utf8)))
    let work = try await sandbox.run(["work", "--until-empty", "--json"])
    #expect(work.status == 1, "\(work)")
    let errors = try work.objects().compactMap { $0["error"] as? String }
    #expect(errors.contains("the working directory \(replaced.path) is a file, not a folder"), "\(work)")
    #expect(errors.contains("the working directory \(removed.path) does not exist"), "\(work)")
  }

  @Test func aRelativeWorkingDirectoryIsTakenFromWhereTheJobWasAdded() async throws {
    let sandbox = try Sandbox()
    let here = sandbox.folder.appendingPathComponent("here")
    try FileManager.default.createDirectory(
      at: here.appendingPathComponent("sub"), withIntermediateDirectories: true)
    try await sandbox.succeed(["add", "exec", "--cwd", "sub", "--", "touch", "marker"], directory: here)
    let work = try await sandbox.run(["work", "--until-empty"], directory: sandbox.folder)
    #expect(work.status == 0, "\(work)")
    #expect(FileManager.default.fileExists(atPath: here.appendingPathComponent("sub/marker").path))
  }

  // MARK: 17. help

  @Test func eachCommandHasItsOwnHelp() async throws {
    let sandbox = try Sandbox()
    for (arguments, expected) in [
      (["add", "http", "--help"], "Usage: conveyor add http [options] METHOD URL"),
      (["add", "http", "POST", "-h"], "--data-file PATH"), (["work", "--help"], "--until-empty"),
      (["list", "--help"], "--status STATUS"), (["help", "retry"], "Usage: conveyor retry"),
      (["add", "--help"], "Usage: conveyor add exec"),
    ] {
      let outcome = try await sandbox.run(arguments, withDatabase: false)
      #expect(outcome.status == 0, "\(arguments): \(outcome)")
      #expect(outcome.stdout.contains(expected), "\(arguments): \(outcome)")
    }
    let overview = try await sandbox.run(["--help"], withDatabase: false)
    for command in [
      "add http", "add exec", "work", "status", "list", "retry", "remove", "purge", "pause", "resume", "demo",
    ] {
      #expect(overview.stdout.contains("\n  \(command) "), "\(command) missing from --help")
    }
    #expect(!FileManager.default.fileExists(atPath: sandbox.path("xdg-data/conveyor/conveyor.sqlite")))
  }

  // MARK: 11. bounded memory

  @Test func hugeCommandOutputAndResponseBodiesAreNotHeldInMemory() async throws {
    let time = URL(fileURLWithPath: "/usr/bin/time")
    guard FileManager.default.isExecutableFile(atPath: time.path) else { return }  // GNU time measures
    let sandbox = try Sandbox()
    let body = Data(repeating: 0x65, count: 200_000_000)
    let server = try LoopbackHTTPServer { _, _ in LoopbackReply(status: 500, body: body) }
    defer { server.stop() }
    try await sandbox.add(["exec", "--", "sh", "-c", "head -c 300000000 /dev/zero; exit 1"])
    try await sandbox.add(["http", "GET", server.url("/huge").absoluteString])
    let report = sandbox.path("rss.txt")
    let running = try RunningConveyor(
      executable: time,
      arguments: [
        "-f", "%M", "-o", report, try ConveyorBinary.required().path, "--database", sandbox.database, "work",
        "--until-empty", "--max-attempts", "1",
      ], environment: ProcessInfo.processInfo.environment, folder: sandbox.folder)
    let outcome = try await running.waitForExit(timeout: .seconds(60))
    #expect(outcome.stdout.contains("2 dead"), "\(outcome)")
    let text = String(decoding: FileManager.default.contents(atPath: report) ?? Data(), as: UTF8.self)
    let kilobytes = try #require(text.split(separator: "\n").compactMap { Int($0) }.last, "\(text)")
    // The worker itself needs about 40 MB; holding either whole would take 200 to 300 MB more.
    // Beside two builds, the HTTP body's chunks queued up in FoundationNetworking ahead of the
    // delegate that drops them (156 MB at the peak; under 120 MB on a quiet machine): the bound
    // tells a body held whole from that backlog.
    #expect(kilobytes < 200_000, "peak resident memory \(kilobytes) KB")
  }

  // A known gap (README, "Known gaps"): the body of a redirect response is not bounded: swift-corelibs-foundation keeps the
  // whole body of every 3xx in memory (`lastRedirectBody`), re-copying it on every chunk, so a
  // 302 with a large body is never got past: the worker burns CPU and memory until the job's
  // deadline. A client that bounded response bodies would drop it and reach the redirect's
  // target (here in a second or two). Promise (issue 8, HTTPDelivery): bounded memory for
  // response bodies, "only the first reasonBodyLimit bytes of a response body are kept; the rest
  // is received and dropped". Where: NetworkSession/TaskRouter rely on `keepingAtMost` applied to
  // didReceive(data:), which never sees 3xx bodies; nothing limits them.
  @Test func aRedirectWithAHugeBodyIsFollowedWithoutHoldingTheBody() async throws {
    let time = URL(fileURLWithPath: "/usr/bin/time")
    guard FileManager.default.isExecutableFile(atPath: time.path) else { return }
    let sandbox = try Sandbox()
    let size = 64 << 20
    let server = try StreamingServer { path, send in
      if path == "/done" {
        _ = send(Data("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok".utf8))
        return
      }
      guard
        send(
          Data(
            "HTTP/1.1 302 Found\r\nLocation: /done\r\nContent-Length: \(size)\r\nConnection: close\r\n\r\n"
              .utf8))
      else { return }
      let chunk = Data(repeating: 0x78, count: 1 << 20)
      for _ in 0..<(size >> 20) where send(chunk) {}
    }
    defer { server.stop() }
    try await sandbox.add(["http", "--timeout", "15", "GET", "http://127.0.0.1:\(server.port)/big"])
    let report = sandbox.path("rss.txt")
    let running = try RunningConveyor(
      executable: time,
      arguments: [
        "-f", "%M", "-o", report, try ConveyorBinary.required().path, "--database", sandbox.database, "work",
        "--until-empty", "--max-attempts", "1",
      ], environment: ProcessInfo.processInfo.environment, folder: sandbox.folder)
    let outcome = try await running.waitForExit(timeout: .seconds(90))
    // The whole-request deadline bounds the time; what Foundation holds meanwhile is not bounded.
    withKnownIssue("swift-corelibs-foundation buffers every 3xx body whole", isIntermittent: true) {
      #expect(outcome.stdout.contains("1 delivered"), "\(outcome)")
      let text = String(decoding: FileManager.default.contents(atPath: report) ?? Data(), as: UTF8.self)
      if let kilobytes = text.split(separator: "\n").compactMap({ Int($0) }).last {
        #expect(kilobytes < 60_000, "peak resident memory \(kilobytes) KB")
      }
    }
  }

  /// `list` reads the start of each payload, never a whole one: listing jobs with 10 MB bodies
  /// takes about what listing small ones does (it took 16 MB more per listed job).
  @Test func listReadsOnlyTheStartOfEachPayload() async throws {
    let time = URL(fileURLWithPath: "/usr/bin/time")
    guard FileManager.default.isExecutableFile(atPath: time.path) else { return }  // GNU time measures
    let sandbox = try Sandbox()
    let body = sandbox.path("body.bin")
    try #require(
      FileManager.default.createFile(atPath: body, contents: Data(repeating: 0x61, count: 10 << 20)))
    for index in 0..<8 {
      try await sandbox.add([
        "http", "POST", "http://127.0.0.1:9/upload/\(index)?token=T", "--data-file", body,
      ])
    }
    let report = sandbox.path("rss.txt")
    let running = try RunningConveyor(
      executable: time,
      arguments: [
        "-f", "%M", "-o", report, try ConveyorBinary.required().path, "--database", sandbox.database, "list",
      ], environment: ProcessInfo.processInfo.environment, folder: sandbox.folder)
    let outcome = try await running.waitForExit(timeout: .seconds(60))
    #expect(outcome.status == 0, "\(outcome)")
    for index in 0..<8 {
      #expect(outcome.stdout.contains("http POST http://127.0.0.1:9/upload/\(index)?…"), "\(outcome)")
    }
    let text = String(decoding: FileManager.default.contents(atPath: report) ?? Data(), as: UTF8.self)
    let kilobytes = try #require(text.split(separator: "\n").compactMap { Int($0) }.last, "\(text)")
    // The tool itself needs about 36 MB (37 MB measured with these jobs); the eight payloads are
    // 110 MB of JSON, and listing them took 170 MB.
    #expect(kilobytes < 80_000, "peak resident memory \(kilobytes) KB")
  }

  /// A job added by this build whose summary does not fit in the 16 KiB `list` reads first is
  /// still not read whole: a URL longer than that (a long query string), or a `--key` longer than
  /// that (stored before the job's kind, being smaller than a large body). The start says what
  /// the job is. Two such jobs with 48 MB bodies took `list` to 160 MB, as if each were a job
  /// stored by an older build.
  @Test func listReadsOnlyTheStartOfAPayloadWhoseURLOrKeyIsLong() async throws {
    let time = URL(fileURLWithPath: "/usr/bin/time")
    guard FileManager.default.isExecutableFile(atPath: time.path) else { return }  // GNU time measures
    let sandbox = try Sandbox()
    let body = sandbox.path("body.bin")
    try #require(
      FileManager.default.createFile(atPath: body, contents: Data(repeating: 0x61, count: 48 << 20)))
    let long = String(repeating: "x", count: 20_000)
    // Two adds of 64 MB of JSON each: minutes, not the default 20 s, for a loaded machine (one
    // was killed after 20 s beside two builds).
    for words in [
      ["http", "POST", "http://127.0.0.1:9/upload/0?q=\(long)", "--data-file", body],
      ["http", "POST", "http://127.0.0.1:9/upload/1", "--key", long, "--data-file", body],
    ] {
      let added = try await sandbox.run(["add"] + words, timeout: .seconds(180))
      #expect(added.status == 0, "\(added.status) \(added.stderr)")
    }
    let report = sandbox.path("rss.txt")
    let running = try RunningConveyor(
      executable: time,
      arguments: [
        "-f", "%M", "-o", report, try ConveyorBinary.required().path, "--database", sandbox.database, "list",
      ], environment: ProcessInfo.processInfo.environment, folder: sandbox.folder)
    let outcome = try await running.waitForExit(timeout: .seconds(60))
    #expect(outcome.status == 0, "\(outcome)")
    #expect(
      outcome.lines.filter { $0.contains("http POST http://127.0.0.1:9/upload/") }.count == 2, "\(outcome)")
    let text = String(decoding: FileManager.default.contents(atPath: report) ?? Data(), as: UTF8.self)
    let kilobytes = try #require(text.split(separator: "\n").compactMap { Int($0) }.last, "\(text)")
    // The tool itself needs about 36 MB; each payload is 64 MB of JSON.
    #expect(kilobytes < 80_000, "peak resident memory \(kilobytes) KB")
  }

  /// `list` reads and shows the start of each last error (an application's handler can record
  /// one of any size), marking the cut.
  @Test func listShowsTheStartOfALongError() async throws {
    let sandbox = try Sandbox()
    try await sandbox.add(["exec", "--", "true"])
    try DashboardTests.executeSQL(
      sandbox, "UPDATE jobs SET status = 'dead', last_error = 'E' || hex(zeroblob(100000)) WHERE id = 1;")
    let listed = try await sandbox.run(["list"])
    #expect(listed.status == 0, "\(listed)")
    let line = try #require(listed.lines.first { $0.contains("last error: E") }, "\(listed)")
    // `CLI.listedError` (16,384) scalars of it.
    #expect(line.hasSuffix("0…") && line.unicodeScalars.count < 16_384 + 40, "\(line.count)")
  }

  // MARK: 13. a command dies with its worker

  @Test func aCommandAndItsChildrenDieWhenTheWorkerIsKilled() async throws {
    let sandbox = try Sandbox()
    let child = sandbox.path("child.pid")
    let grandchild = sandbox.path("grandchild.pid")
    try await sandbox.add([
      "exec", "--timeout", "600", "--", "sh", "-c",
      "sleep 300 & echo $! > '\(grandchild)'; echo $$ > '\(child)'; wait",
    ])
    let worker = try sandbox.start(["work"])
    var pids: [pid_t] = []
    try await worker.waitUntil("the command to start") {
      pids = [child, grandchild].compactMap(readPID)
      return pids.count == 2
    }
    defer { for pid in pids { kill(pid, SIGKILL) } }
    worker.signal(SIGKILL)
    _ = try await worker.waitForExit()
    let deadline = ContinuousClock.now + .seconds(15)
    while pids.contains(where: isAlive), ContinuousClock.now < deadline {
      try await Task.sleep(for: .milliseconds(20))
    }
    #expect(
      !pids.contains(where: isAlive), "still running after the worker was killed: \(pids.filter(isAlive))")
  }

  // Failed before the fix: a command that leaves the worker's process group (setsid, as daemons and many
  // wrappers do) keeps running after the worker is SIGKILLed. The supervisor only kills its own
  // process group (`kill(0, SIGKILL)`), never the command's PID, so the command itself (not even a
  // grandchild) escapes. Promise (issue 8, ChildProcess docs): "the command does not outlive the
  // worker, even one killed with SIGKILL". Where: ChildProcess.supervise in
  // Sources/conveyor/ChildProcess.swift (the SIGUSR1 handler).
  @Test func aCommandThatCallsSetsidDiesWhenTheWorkerIsKilled() async throws {
    guard FileManager.default.isExecutableFile(atPath: "/usr/bin/setsid") else { return }
    let sandbox = try Sandbox()
    let pidFile = sandbox.path("command.pid")
    // `exec setsid sleep`: the command's own process becomes a session leader; util-linux setsid
    // does not fork when the caller is not a process-group leader (the supervisor is).
    try await sandbox.add(["exec", "--", "sh", "-c", "echo $$ > '\(pidFile)'; exec setsid sleep 300"])
    let worker = try sandbox.start(["work"])
    var pid: pid_t = 0
    try await worker.waitUntil("the command to start") {
      pid = readPID(pidFile) ?? 0
      return pid > 0 && commandLine(of: pid).hasPrefix("sleep")
    }
    defer { kill(pid, SIGKILL) }
    worker.signal(SIGKILL)
    _ = try await worker.waitForExit()
    let deadline = ContinuousClock.now + .seconds(15)
    while isAlive(pid), ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(50)) }
    #expect(!isAlive(pid), "command \(pid) (\(commandLine(of: pid))) outlived the SIGKILLed worker")
  }

  // Failed before the fix: the same escape defeats `add exec --timeout`: SIGTERM and then SIGKILL go to the
  // supervisor's process group only; the job is recorded as timed out and retried (here: dead)
  // while the command keeps running, so a retry runs it twice at once. Promise (`add exec
  // --help`): "--timeout S  seconds before it is stopped and retried". Where: ChildProcess
  // .stop(after:) / signalGroup signal `-pid` only.
  @Test func aTimedOutCommandThatCallsSetsidIsStopped() async throws {
    guard FileManager.default.isExecutableFile(atPath: "/usr/bin/setsid") else { return }
    let sandbox = try Sandbox()
    let pidFile = sandbox.path("command.pid")
    // 5 s, not 1: under a full test run on two cores, starting the shell once took longer than
    // a 1 s timeout, which stopped it before it wrote its pid.
    try await sandbox.add([
      "exec", "--timeout", "5", "--", "sh", "-c", "echo $$ > '\(pidFile)'; exec setsid sleep 300",
    ])
    let outcome = try await sandbox.run(
      ["work", "--until-empty", "--max-attempts", "1"], timeout: .seconds(60))
    let pid = readPID(pidFile) ?? 0
    defer { if pid > 0 { kill(pid, SIGKILL) } }
    #expect(outcome.stdout.contains("timed out"), "\(outcome)")
    #expect(pid > 0)
    #expect(!isAlive(pid), "command \(pid) (\(commandLine(of: pid))) still runs after its job timed out")
  }

  // MARK: 18. --until-empty and --until-idle

  @Test func untilIdleStopsWhenNothingIsReadyAndLeavesScheduledJobs() async throws {
    let sandbox = try Sandbox()
    try await sandbox.add(["exec", "--", "true"])
    try await sandbox.add(["exec", "--delay", "3600", "--", "true"])
    let work = try await sandbox.run(["work", "--until-idle"])
    #expect(work.status == 0, "\(work)")
    #expect(work.stdout.contains("done: 1 delivered"), "\(work)")
    #expect(try await sandbox.counts() == counts(scheduled: 1))
    // A paused queue: nothing can run, so it stops at once and says why.
    try await sandbox.add(["exec", "--", "true"])
    try await sandbox.succeed(["pause"])
    let paused = try await sandbox.run(["work", "--until-idle"])
    #expect(paused.status == 0, "\(paused)")
    #expect(paused.stderr.contains("is paused"), "\(paused)")
    #expect(try await sandbox.counts() == counts(ready: 1, scheduled: 1))
  }

  @Test func untilEmptySaysWhatItWaitsFor() async throws {
    let sandbox = try Sandbox()
    try await sandbox.add(["exec", "--delay", "3600", "--", "true"])
    let scheduled = try sandbox.start(["work", "--until-empty"])
    try await scheduled.waitUntil("a note about the scheduled job") {
      scheduled.stderr.contains("waiting for 1 scheduled job(s) (the next at ")
    }
    scheduled.signal(SIGTERM)
    #expect(try await scheduled.waitForExit().status == 0)
    try await sandbox.add(["exec", "--", "true"])
    try await sandbox.succeed(["pause"])
    let paused = try sandbox.start(["work", "--until-empty"])
    try await paused.waitUntil("a note about the pause") {
      paused.stderr.contains("is paused; --until-empty waits until 'conveyor resume'")
    }
    paused.signal(SIGTERM)
    #expect(try await paused.waitForExit().status == 0)
  }

  // MARK: 19. consistent exit codes and status words

  @Test func retryOfUnknownIDsExitsOneAndListTakesTheWordsStatusPrints() async throws {
    let sandbox = try Sandbox()
    try await sandbox.add(["exec", "--", "true"])
    try await sandbox.add(["exec", "--delay", "3600", "--", "true"])
    let retry = try await sandbox.run(["retry", "77"])
    #expect(retry.status == 1, "\(retry)")
    #expect(retry.stderr.contains("not found"), "\(retry)")
    #expect(try await sandbox.listed(["--status", "ready"]).map { $0["id"] as? Int } == [1])
    #expect(try await sandbox.listed(["--status", "scheduled"]).map { $0["id"] as? Int } == [2])
    #expect(try await sandbox.listed(["--status", "pending"]).count == 2)
    let table = try await sandbox.succeed(["list"]).stdout
    #expect(table.contains("ready") && table.contains("scheduled"), "\(table)")
  }
}

/// Control characters shown escaped in test names.
func printableForTest(_ text: String) -> String {
  text.unicodeScalars.map { $0.value < 0x20 ? $0.escaped(asASCII: true) : String($0) }.joined()
}

/// Closes a handle the test opened; a failure only leaks a descriptor in the test process.
func closeQuietly(_ handle: FileHandle) {
  do { try handle.close() } catch { print("could not close a file: \(error)") }
}

/// Whether a process runs (a zombie, killed and waiting to be reaped, does not).
func isAlive(_ pid: pid_t) -> Bool {
  guard kill(pid, 0) == 0 else { return false }
  guard let stat = FileManager.default.contents(atPath: "/proc/\(pid)/stat") else { return true }
  let text = String(decoding: stat, as: UTF8.self)
  guard let close = text.lastIndex(of: ")") else { return true }
  return !text[text.index(after: close)...].trimmingCharacters(in: .whitespaces).hasPrefix("Z")
}

/// The process ID written to `path`, if any.
private func readPID(_ path: String) -> pid_t? {
  (FileManager.default.contents(atPath: path)).flatMap {
    pid_t(String(decoding: $0, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines))
  }
}

/// The command line of a running process (empty once it is gone or a zombie).
private func commandLine(of pid: pid_t) -> String {
  let data = FileManager.default.contents(atPath: "/proc/\(pid)/cmdline") ?? Data()
  return String(decoding: data.map { $0 == 0 ? 0x20 : $0 }, as: UTF8.self)
}
