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
}
