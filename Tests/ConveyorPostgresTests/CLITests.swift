import Foundation
import Testing

#if canImport(Glibc)
  import Glibc
#endif

/// `conveyor` against a PostgreSQL URL: the same commands as on SQLite.
@Suite("conveyor on PostgreSQL")
struct CLITests {
  /// Runs `conveyor` with `arguments`; returns its exit status and output.
  func conveyor(_ arguments: [String], environment: [String: String] = [:]) async throws -> (Int32, String) {
    let executable = URL(fileURLWithPath: try workerExecutable()).deletingLastPathComponent()
      .appendingPathComponent("conveyor").path
    return try await PostgresServer.onBackgroundThread {
      let output = NSTemporaryDirectory() + "/conveyor-cli-\(UUID().uuidString)"
      defer { try? FileManager.default.removeItem(atPath: output) }
      let variables = ProcessInfo.processInfo.environment.merging(environment) { $1 }
      let pid = try PostgresServer.spawn(executable, arguments, output: output, environment: variables)
      var status: Int32 = 0
      while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
      let text = (try? String(contentsOfFile: output, encoding: .utf8)) ?? ""
      return ((status >> 8) & 0xff, text)
    }
  }

  @Test func addWorkStatusListPauseAndResumeWorkAgainstAPostgresURL() async throws {
    let server = try await PostgresServer.shared()
    // A password in the URL (the server trusts every connection) must never be printed.
    let url = "postgresql://postgres:Sekr1t-PW@127.0.0.1:\(server.port)/postgres"
    let folder = try makeFolder()
    defer { try? FileManager.default.removeItem(atPath: folder) }
    for number in 0..<6 {
      let (status, output) = try await conveyor(
        [
          "--database", url, "--queue", "cli", "add", "exec", "--", "/bin/sh", "-c",
          "echo \(number) >> \(folder)/out",
        ])
      #expect(status == 0, "\(output)")
    }
    let (statusCode, status) = try await conveyor(["-d", url, "-q", "cli", "status", "--json"])
    #expect(statusCode == 0 && status.contains("\"ready\":6"), "\(status)")
    #expect(!status.contains("Sekr1t"), "no password in status: \(status)")
    #expect(status.contains("127.0.0.1"), "\(status)")
    let (pauseCode, _) = try await conveyor(["-d", url, "-q", "cli", "pause"])
    #expect(pauseCode == 0)
    let (_, paused) = try await conveyor(["-d", url, "-q", "cli", "status"])
    #expect(paused.contains("(paused)"), "\(paused)")
    let (resumeCode, _) = try await conveyor(["-d", url, "-q", "cli", "resume"])
    #expect(resumeCode == 0)
    let (listCode, list) = try await conveyor(["-d", url, "-q", "cli", "list"])
    #expect(listCode == 0 && list.split(separator: "\n").count >= 6, "\(list)")
    // Two workers share the queue; CONVEYOR_DATABASE works like --database.
    async let first = conveyor(
      ["-q", "cli", "work", "--until-empty", "--json"], environment: ["CONVEYOR_DATABASE": url])
    async let second = conveyor(["-d", url, "-q", "cli", "work", "--until-empty", "--json"])
    let results = try await [first, second]
    for (code, output) in results {
      #expect(code == 0, "\(output)")
      #expect(!output.contains("Sekr1t"))
    }
    let lines = try String(contentsOfFile: folder + "/out", encoding: .utf8).split(separator: "\n")
    #expect(lines.sorted() == (0..<6).map { "\($0)" }, "every command ran once: \(lines)")
    let (_, after) = try await conveyor(["-d", url, "-q", "cli", "status", "--json"])
    #expect(after.contains("\"ready\":0") && after.contains("\"running\":0"), "\(after)")
  }

  /// `schedule add|pause|resume|remove` and `schedules` against a PostgreSQL URL, in a queue of
  /// their own.
  @Test func schedulesAreStoredListedPausedAndRemovedOnAPostgresURL() async throws {
    let server = try await PostgresServer.shared()
    let url = "postgresql://postgres@127.0.0.1:\(server.port)/postgres"
    let queue = "sched-\(UInt32.random(in: 0...UInt32.max))"
    let (added, addOutput) = try await conveyor([
      "-d", url, "-q", queue, "schedule", "add", "nightly", "--cron", "0 3 * * *", "--time-zone",
      "Europe/Berlin",
      "--key", "nightly", "--unique", "running", "exec", "--", "/bin/true",
    ])
    #expect(added == 0 && addOutput.contains("schedule nightly created in queue \(queue)"), "\(addOutput)")
    let (listed, list) = try await conveyor(["-d", url, "-q", queue, "schedules", "--json"])
    #expect(
      listed == 0 && list.contains(#""name":"nightly""#) && list.contains(#""unique":"running""#), "\(list)")
    let (paused, _) = try await conveyor(["-d", url, "-q", queue, "schedule", "pause", "nightly"])
    let (_, state) = try await conveyor(["-d", url, "-q", queue, "schedules", "--json"])
    #expect(paused == 0 && state.contains(#""state":"paused""#), "\(state)")
    let (resumed, _) = try await conveyor(["-d", url, "-q", queue, "schedule", "resume", "nightly"])
    #expect(resumed == 0)
    let (removed, _) = try await conveyor(["-d", url, "-q", queue, "schedule", "remove", "nightly"])
    let (gone, absent) = try await conveyor(["-d", url, "-q", queue, "schedule", "remove", "nightly"])
    #expect(
      removed == 0 && gone == 1 && absent.contains("no schedule nightly in queue \(queue)"), "\(absent)")
  }

  @Test func anUnreachableServerIsADatabaseErrorWithoutThePassword() async throws {
    let (code, output) = try await conveyor(
      ["-d", "postgresql://me:Sekr1t-PW@127.0.0.1:1/app?connect_timeout=2", "status"])
    #expect(code == 3, "\(output)")
    #expect(output.contains("PostgreSQL") && !output.contains("Sekr1t"), "\(output)")
  }

  /// libpq prints the notices a server sends while a connection starts to standard error unless
  /// a notice receiver is set; the store set its receiver (which drops them) only once connected,
  /// so a database whose stored setting no longer applies (here a default tablespace that does not
  /// exist) printed a WARNING from the library on every connection, into the output of `conveyor`
  /// (and of any application using the store).
  @Test func warningsWhileAConnectionStartsAreNotPrinted() async throws {
    let server = try await PostgresServer.shared()
    let database = uniqueSchema("notices")
    let admin = try AdminConnection(server.url)
    try admin.query("CREATE DATABASE \(database)")
    try admin.query("ALTER DATABASE \(database) SET default_tablespace = 'no_such_tablespace'")
    let url = "postgresql://postgres@127.0.0.1:\(server.port)/\(database)"
    let (code, output) = try await conveyor(["-d", url, "-q", "notices", "status"])
    #expect(code == 0, "\(output)")
    #expect(!output.contains("default_tablespace") && !output.contains("WARNING"), "\(output)")
    try admin.query("DROP DATABASE \(database) WITH (FORCE)")
  }
}
