import Conveyor
import ConveyorHTTPServer
import ConveyorNetworking
import ConveyorTestSupport
import Foundation
import Testing

@testable import ConveyorDashboard
@testable import conveyor

/// Random command lines: the tool never traps, exits 0, 1, 2 or 3, never echoes a control
/// character, and leaves a database every later command can open.
@Suite struct FuzzTests {
  static let words = [
    "add", "http", "exec", "status", "list", "retry", "remove", "purge", "pause", "resume", "help", "--help",
    "-h",
    "-H", "--header", "--data", "--key", "--delay", "--priority", "--timeout", "--cwd", "--", "-d", "-q",
    "--status", "--limit", "-n", "--json", "--all", "--until-empty", "GET", "POST", "ready", "dead", "1", "0",
    "-1", "1e308", "http://127.0.0.1:1/x", "HTTP://127.0.0.1:1/y", "X-A: 1", "true",
  ]

  static func randomWord(_ random: inout SeededRandom) -> String {
    if Int.random(in: 0..<3, using: &random) > 0 { return words.randomElement(using: &random)! }
    let alphabet = Array("\r\n\t \u{1B}[2J:=-/é€😀\u{7F}\u{9B}aZ0".unicodeScalars)
    var scalars = String.UnicodeScalarView()
    for _ in 0..<Int.random(in: 0...12, using: &random) {
      scalars.append(
        Int.random(in: 0..<2, using: &random) == 0
          ? alphabet.randomElement(using: &random)!
          : Unicode.Scalar(UInt8.random(in: 1...0x7F, using: &random)))
    }
    return String(scalars)
  }

  @Test func randomCommandLinesNeverTrap() async throws {
    let sandbox = try Sandbox()
    var random = SeededRandom(seed: 8)
    var added = 0
    for _ in 0..<150 {
      var arguments = (0..<Int.random(in: 1...7, using: &random)).map { _ in Self.randomWord(&random) }
      if Int.random(in: 0..<2, using: &random) == 0 { arguments.insert(contentsOf: ["add", "http"], at: 0) }
      let outcome = try await sandbox.run(arguments)
      #expect((0...3).contains(outcome.status), "conveyor \(arguments.debugDescription): \(outcome)")
      for text in [outcome.stdout, outcome.stderr] {
        #expect(
          !text.unicodeScalars.contains { $0 == "\u{1B}" || $0 == "\u{9B}" || $0 == "\r" }, "\(arguments)")
      }
      if arguments.first == "add", outcome.status == 0 { added += 1 }
    }
    let status = try await sandbox.run(["status", "--json"])
    #expect(status.status == 0, "\(status)")
    let pending = try await sandbox.listed(["--status", "pending", "--limit", "1000"])
    #expect(pending.count <= added)
  }

  /// Paths a user might pass, or an attacker might plant in `CONVEYOR_DATABASE`: the tool opens
  /// them or refuses them with exit 2 or 3, never traps (a one-character name crashed it).
  static let hostilePaths = [
    "-", ".", "..", "/", "q", "é", "😀", "x/", "x//", "./", "a/b/c", "-d", "--", "~", "$HOME", "*", "x y",
    "/dev/null", "/dev/zero", "/dev/full", "/dev/stdin", "/nonexistent/jobs.sqlite", ":memory:", "::",
    String(repeating: "n", count: 300), String(repeating: "d/", count: 3000) + "x", "é/ü", "a\u{301}/b",
  ]

  @Test func randomAndHostileDatabasePathsNeverTrap() async throws {
    let sandbox = try Sandbox()
    var random = SeededRandom(seed: 32)
    var paths = Self.hostilePaths
    for _ in 0..<40 {
      let alphabet = Array("/.-~:@=é😀 aZ0".unicodeScalars)
      var scalars = String.UnicodeScalarView()
      for _ in 0..<Int.random(in: 1...6, using: &random) {
        scalars.append(alphabet.randomElement(using: &random)!)
      }
      paths.append(String(scalars))
    }
    for path in paths {
      for (arguments, environment) in [
        (["--database", path, "status"], [String: String]()), (["status"], ["CONVEYOR_DATABASE": path]),
      ] {
        let outcome = try await sandbox.run(
          arguments, withDatabase: false, extraEnvironment: environment, directory: sandbox.folder)
        #expect((0...3).contains(outcome.status), "\(path.debugDescription): \(outcome)")
        #expect(!outcome.stderr.contains("Fatal error") && !outcome.stderr.contains("crashed"), "\(outcome)")
      }
    }
  }

  /// Database strings built from the pieces of URLs, connection strings and paths, each with a
  /// password in it: whatever the tool makes of them (a file, a server, a refusal), the password
  /// is never printed, and no file is named after it.
  @Test func randomDatabaseStringsNeverShowTheirPassword() async throws {
    let sandbox = try Sandbox()
    var random = SeededRandom(seed: 10)
    let heads = [
      "", " ", "postgres://", "POSTGRES://", "PostgreSQL://", "postgress://", "postgres:/", "pg://", "file:",
      "host=127.0.0.1 ", "HOST=h ", "x=1 ", "jobs.sqlite ", "./", "/tmp/", "dbname=app ",
    ]
    let secrets = [
      "alice:SECRETPW@127.0.0.1:1/app", "password=SECRETPW", "password = 'SECRETPW x'", "?password=SECRETPW",
      "user=alice password=SECRETPW port=1", "alice:SECRETPW@",
    ]
    let tails = ["", " dbname=x", "&sslmode=disable", "?connect_timeout=2", " connect_timeout=2", "/db"]
    for _ in 0..<60 {
      let text =
        heads.randomElement(using: &random)! + secrets.randomElement(using: &random)!
        + tails.randomElement(using: &random)!
      let outcome = try await sandbox.run(
        ["status"], withDatabase: false,
        extraEnvironment: ["CONVEYOR_DATABASE": text, "PGCONNECT_TIMEOUT": "2"],
        timeout: .seconds(30), directory: sandbox.folder)
      #expect((0...3).contains(outcome.status), "\(text): \(outcome)")
      #expect(!(outcome.stdout + outcome.stderr).contains("SECRETPW"), "\(text): \(outcome)")
    }
    let names = try FileManager.default.subpathsOfDirectory(atPath: sandbox.folder.path)
    #expect(!names.contains { $0.contains("SECRETPW") }, "\(names)")
  }

  /// The scrubbing every message goes through, on random text: a password after `password=` or
  /// between `user:` and `@` never survives it, and text without either is left as it was.
  @Test func scrubbingMasksEveryPasswordShapeAndNothingElse() {
    var random = SeededRandom(seed: 11)
    let pieces = [
      "postgres://", "u", ":", "@", "/", " ", "=", "'", "&", "?", "host", "db", "é", "PASSWORD", "password",
      "\\", "x",
    ]
    for _ in 0..<2000 {
      let text = (0..<Int.random(in: 0...12, using: &random)).map { _ in pieces.randomElement(using: &random)!
      }
      .joined()
      let scrubbed = Secrets.scrub(text)
      #expect(Secrets.scrub(scrubbed) == scrubbed, "scrubbing is stable: \(text.debugDescription)")
      if !text.contains("@") && !text.lowercased().contains("password") {
        #expect(scrubbed == text, "\(text.debugDescription)")
      }
    }
    for text in [
      "postgres://alice:S3CR3T@h/db", "alice:S3CR3T@h", "password=S3CR3T", "PASSWORD = 'S3 CR3T' host=h",
      "x?password=S3CR3T&a=1", "conveyor: \"postgres://a:S3CR3T@h\" failed",
    ] {
      #expect(!Secrets.scrub(text).contains("S3CR3T"), "\(text)")
    }
  }

  /// The scanner that reads a listing's summary from the start of a payload, fed every prefix of
  /// real payloads and random bytes: it never traps, and on a whole payload it says what
  /// Foundation's decoder reads.
  @Test func summariesFromAnyPrefixOfAPayloadNeverTrap() throws {
    let request = OutboxJob(
      kind: .http(
        HTTPRequest(
          method: "POST",
          url: try #require(URL(string: "https://alice:pw@api.example/orders/%C3%A9?token=T")),
          headers: ["X-A": "1"], body: Data(repeating: 0x22, count: 3000))),
      key: "k")
    let command = OutboxJob(
      kind: .exec(
        ShellCommand(
          arguments: ["sh", "-c", "echo \"hi\" \u{1F600}\\n"], workingDirectory: "/tmp", timeout: 3)),
      key: nil)
    for job in [request, command] {
      let payload = try #require(PayloadPrefix.summaryMembersFirst(try JSONEncoder().encode(job)))
      // Stored this way, the same job to a decoder, with its summary in its first bytes.
      #expect(try JSONDecoder().decode(OutboxJob.self, from: payload) == job)
      #expect(OutboxJob.summary(ofStart: payload.prefix(600), payloadSize: payload.count) == job.summary)
      #expect(OutboxJob.summary(ofStart: payload, payloadSize: payload.count) == job.summary)
      for length in 0...payload.count {
        _ = OutboxJob.summary(ofStart: payload.prefix(length), payloadSize: payload.count)
      }
      let cut = OutboxJob.summary(ofStart: payload.prefix(200), payloadSize: payload.count)
      #expect(cut == job.summary || cut?.hasSuffix("…") == true, "\(String(describing: cut))")
    }
    var random = SeededRandom(seed: 12)
    let pieces =
      Array(#"{}[]",:\u00"kind""http""exec""_0""method""url""arguments"1truenull "#.utf8).map { [$0] }
      + [Array(#"{"kind":{"exec":{"_0":{"arguments":["#.utf8), Array(#"\ud83d\ude00"#.utf8), [0xFF], [0]]
    for _ in 0..<3000 {
      var bytes: [UInt8] = []
      for _ in 0..<Int.random(in: 0...30, using: &random) { bytes += pieces.randomElement(using: &random)! }
      _ = OutboxJob.summary(
        ofStart: Data(bytes), payloadSize: bytes.count + Int.random(in: 0...1, using: &random))
    }
    let deep = Data((String(repeating: "[", count: 100_000)).utf8)
    #expect(OutboxJob.summary(ofStart: deep, payloadSize: deep.count) == nil)
    #expect(PayloadPrefix.summaryMembersFirst(deep) == nil)
    // Reordering random JSON documents keeps their value.
    for _ in 0..<500 {
      let value = Self.randomJSON(&random, depth: 0)
      let data = try JSONSerialization.data(withJSONObject: value, options: [.fragmentsAllowed])
      let reordered = try #require(
        PayloadPrefix.summaryMembersFirst(data), "\(String(decoding: data, as: UTF8.self))")
      let again = try JSONSerialization.jsonObject(with: reordered, options: [.fragmentsAllowed])
      #expect(
        try JSONSerialization.data(withJSONObject: again, options: [.sortedKeys, .fragmentsAllowed])
          == JSONSerialization.data(withJSONObject: value, options: [.sortedKeys, .fragmentsAllowed]))
    }
  }

  static func randomJSON(_ random: inout SeededRandom, depth: Int) -> Any {
    switch Int.random(in: 0..<(depth > 3 ? 3 : 5), using: &random) {
    case 0: return ["", "é\"\\", "a,b}", "\u{1F600}"].randomElement(using: &random)!
    case 1: return Int.random(in: -1000...1000, using: &random)
    case 2: return [true, false].randomElement(using: &random)!
    case 3:
      return (0..<Int.random(in: 0...4, using: &random)).map { _ in randomJSON(&random, depth: depth + 1) }
    default:
      var object: [String: Any] = [:]
      for index in 0..<Int.random(in: 0...4, using: &random) {
        object["k\(index)\(["", "\"", "}"].randomElement(using: &random)!)"] = randomJSON(
          &random, depth: depth + 1)
      }
      return object
    }
  }

  /// Random `Host` and `Origin` pairs against a loopback dashboard on port 8080 whose public URL is
  /// `https://dash.example.test`: a page is served only to its own names (421 otherwise), and an
  /// action only from its own origin, by host and port, or the public URL (403 otherwise).
  @Test func hostAndOriginPairsAreJudgedByHostAndPort() async throws {
    let dashboard = try Dashboard(
      store: InMemoryJobStore(),
      configuration: DashboardCommand.configuration(
        token: nil, publicOrigin: try DashboardCommand.publicOrigin("https://dash.example.test"),
        database: "memory", host: "127.0.0.1", port: 8080))
    let names = [
      "127.0.0.1", "localhost", "LocalHost", "[::1]", "::1", "evil.example", "dash.example.test",
      "DASH.example.test", "127.0.0.1.evil", "", "a@b", "[::1", "h/x",
    ]
    let ports = ["", ":80", ":443", ":8080", ":08080", ":0", ":65536", ":x", ":-1", ":", ":123456"]
    let schemes = ["http://", "https://", "HTTPS://", "ftp://", "", "//"]
    var random = SeededRandom(seed: 21)
    /// `name:port` as a browser would mean it, or nil for a malformed pair.
    func endpoint(_ name: String, _ port: String, defaultPort: Int) -> String? {
      var bare = name.lowercased()
      if bare.hasPrefix("[") {
        guard bare.hasSuffix("]") else { return nil }
        bare = String(bare.dropFirst().dropLast())
      } else if bare.contains(":") {
        return nil
      }
      guard !bare.isEmpty, !bare.contains("/"), !bare.contains("@") else { return nil }
      guard !port.isEmpty else { return "\(bare):\(defaultPort)" }
      guard port.count <= 6, let number = Int(port.dropFirst()), (1...65_535).contains(number) else {
        return nil
      }
      return "\(bare):\(number)"
    }
    for _ in 0..<3000 {
      let hostName = names.randomElement(using: &random)!
      let hostPort = ports.randomElement(using: &random)!
      let scheme = schemes.randomElement(using: &random)!
      let originName = names.randomElement(using: &random)!
      let originPort = ports.randomElement(using: &random)!
      let host = hostName + hostPort
      let origin = scheme + originName + originPort
      let hostAt = endpoint(hostName, hostPort, defaultPort: 80)
      let hostAllowed =
        ["127.0.0.1:8080", "localhost:8080", "::1:8080"].contains(hostAt ?? "")
        || endpoint(hostName, hostPort, defaultPort: 443) == "dash.example.test:443"
      let page = await dashboard.respond(
        to: DashboardRequest(method: "GET", target: "/", headers: [("Host", host)]))
      #expect(page.status == (hostAllowed ? 200 : 421), "Host \(host.debugDescription): \(page.status)")
      guard hostAllowed else { continue }
      let lowered = scheme.lowercased()
      let defaultPort = lowered == "https://" ? 443 : 80
      let originAt =
        lowered == "http://" || lowered == "https://"
        ? endpoint(originName, originPort, defaultPort: defaultPort) : nil
      let hostAsSeen = endpoint(hostName, hostPort, defaultPort: defaultPort)
      let sameOrigin =
        originAt != nil
        && (originAt == hostAsSeen || (lowered == "https://" && originAt == "dash.example.test:443"))
      let post = await dashboard.respond(
        to: DashboardRequest(
          method: "POST", target: "/queues/pause",
          headers: [
            ("Host", host), ("Origin", origin), ("Content-Type", "application/x-www-form-urlencoded"),
          ],
          body: Data("csrf=\(dashboard.formToken)&queue=q".utf8)))
      #expect(
        post.status == (sameOrigin ? 303 : 403),
        "Host \(host.debugDescription), Origin \(origin.debugDescription): \(post.status)")
    }
  }

  /// Queue names with control characters and markup (an application's own INSERT can store any):
  /// each row of the queues page carries the key `/api/queues` gives for it, in printable ASCII,
  /// so the live script matches them (a browser rewrites CR and NUL in the name's attribute).
  @Test func queueNamesWithControlCharactersGetMatchingKeys() async throws {
    let store = InMemoryJobStore()
    var random = SeededRandom(seed: 6)
    let alphabet = Array("\r\n\0\t\u{2028}\u{1B}\"'<>&%+ é😀aZ".unicodeScalars)
    var names: Set<String> = []
    while names.count < 40 {
      var scalars = String.UnicodeScalarView()
      for _ in 0..<Int.random(in: 1...6, using: &random) {
        scalars.append(alphabet.randomElement(using: &random)!)
      }
      names.insert(String(scalars))
    }
    for name in names {
      _ = try await store.enqueue([NewJob(payload: Data("{}".utf8))], queue: name, clock: SystemJobClock())
    }
    let dashboard = try Dashboard(
      store: store,
      configuration: DashboardCommand.configuration(
        token: nil, database: "memory", host: "127.0.0.1", port: 8080))
    let host = [("Host", "127.0.0.1:8080")]
    let page = await dashboard.respond(to: DashboardRequest(method: "GET", target: "/", headers: host))
    let api = await dashboard.respond(
      to: DashboardRequest(method: "GET", target: "/api/queues", headers: host))
    let html = String(decoding: page.body, as: UTF8.self)
    let queues = try #require(
      try jsonObject(String(decoding: api.body, as: UTF8.self))["queues"] as? [[String: Any]])
    #expect(queues.count == names.count)
    for queue in queues {
      let key = try #require(queue["key"] as? String)
      #expect(key.unicodeScalars.allSatisfy { (0x21...0x7E).contains($0.value) && $0 != "\"" }, "\(key)")
      #expect(html.contains("data-key=\"\(key)\""), "\(key)")
    }
    #expect(!html.contains("<>") && !html.contains("\"'<"), "names are escaped")
  }
}
