import Foundation

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// A private, throwaway PostgreSQL server for the tool's tests that need one (a connection string
/// reaching a real server, a dashboard whose server goes down), started from the installed
/// binaries on 127.0.0.1 with `trust` authentication, its folder in the test's sandbox.
///
/// A lean cousin of `Tests/ConveyorPostgresTests/PostgresServer.swift`, which this test target
/// cannot import (test targets share code only through a library target).
final class LocalPostgres: Sendable {
  /// The folder holding `initdb`, `pg_ctl` and `postgres`, if installed.
  static let binaries: String? = {
    let versions = (try? FileManager.default.contentsOfDirectory(atPath: "/usr/lib/postgresql")) ?? []
    let candidates =
      versions.sorted { (Int($0) ?? 0) > (Int($1) ?? 0) }.map { "/usr/lib/postgresql/\($0)/bin" }
      + ["/usr/local/bin", "/usr/bin"]
    return candidates.first { folder in
      ["initdb", "pg_ctl", "postgres"].allSatisfy {
        FileManager.default.isExecutableFile(atPath: "\(folder)/\($0)")
      }
    }
  }()

  let folder: String
  let port: Int
  private let binaries: String

  /// `postgresql://postgres@127.0.0.1:PORT/postgres`.
  var url: String { "postgresql://postgres@127.0.0.1:\(port)/postgres" }

  private init(folder: String, port: Int, binaries: String) {
    self.folder = folder
    self.port = port
    self.binaries = binaries
  }

  /// Makes a data folder in `sandbox` and starts a server on a free port.
  static func start(in sandbox: Sandbox) async throws -> LocalPostgres {
    guard let binaries else { throw HarnessError(description: "the PostgreSQL server is not installed") }
    let folder = sandbox.path("postgres-\(UUID().uuidString.prefix(8))")
    let parent = sandbox.folder.path
    return try await onThreadThrowing {
      try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
      if getuid() == 0 { try run("/bin/chown", ["-R", "postgres:postgres", folder]) }
      chmod(parent, 0o755)
      var server = LocalPostgres(folder: folder, port: try freePort(), binaries: binaries)
      try server.asOwner(
        "\(binaries)/initdb",
        ["-D", folder + "/data", "-U", "postgres", "-A", "trust", "--no-sync", "--locale=C"])
      // The port was free when chosen; another process may take it first, and the server exits.
      for attempt in 1...5 {
        do {
          try server.asOwner(
            "\(binaries)/pg_ctl",
            [
              "-D", folder + "/data", "start", "-w", "-t", "60", "-l", folder + "/server.log", "-o",
              "-p \(server.port) -k \(folder) -c listen_addresses=127.0.0.1 -c fsync=off",
            ])
          return server
        } catch {
          guard attempt < 5 else { throw error }
          server = LocalPostgres(folder: folder, port: try freePort(), binaries: binaries)
        }
      }
      return server
    }
  }

  /// Starts the server again after ``stop()``, on the same port.
  func startAgain() async throws {
    try await onThreadThrowing { [self] in
      try asOwner(
        "\(binaries)/pg_ctl",
        [
          "-D", folder + "/data", "start", "-w", "-t", "60", "-l", folder + "/server.log", "-o",
          "-p \(port) -k \(folder) -c listen_addresses=127.0.0.1 -c fsync=off",
        ])
    }
  }

  /// Stops the server at once (an immediate shutdown, as `pg_ctl stop -m immediate` asks for):
  /// clients' connections break and new ones are refused, as when a database server goes down.
  /// Returns once the server removed its lock file (10 s at most). The signal is sent directly:
  /// `pg_ctl` through `runuser` cost two programs' start on a thread of the cooperative pool,
  /// which the tests' `defer` blocks run on.
  func stop() {
    let lockFile = folder + "/data/postmaster.pid"
    guard let text = try? String(contentsOfFile: lockFile, encoding: .utf8),
      let pid = text.split(separator: "\n").first.flatMap({ pid_t($0) }), pid > 0
    else { return }
    kill(pid, SIGQUIT)
    for _ in 0..<1_000 where FileManager.default.fileExists(atPath: lockFile) { usleep(10_000) }
  }

  deinit { stop() }

  private func asOwner(_ executable: String, _ arguments: [String]) throws {
    if getuid() == 0 {
      try Self.run("/usr/sbin/runuser", ["-u", "postgres", "--", executable] + arguments)
    } else {
      try Self.run(executable, arguments)
    }
  }

  /// Runs a program to its end with `posix_spawn` and `waitpid`, its output to a file (a server
  /// `pg_ctl` starts keeps the output open, so a pipe would never end).
  private static func run(_ executable: String, _ arguments: [String]) throws {
    let output = NSTemporaryDirectory() + "/conveyor-cli-pg-\(UUID().uuidString)"
    defer { unlink(output) }
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
    posix_spawn_file_actions_addopen(&actions, 1, output, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
    posix_spawn_file_actions_adddup2(&actions, 1, 2)
    let words = [executable] + arguments
    var pointers = words.map { strdup($0) } + [nil]
    defer { for pointer in pointers { free(pointer) } }
    var pid: pid_t = 0
    let spawned = posix_spawn(&pid, executable, &actions, nil, &pointers, environ)
    guard spawned == 0 else { throw HarnessError(description: "cannot run \(executable): \(spawned)") }
    var status: Int32 = 0
    while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
    guard status & 0x7f == 0 && (status >> 8) & 0xff == 0 else {
      let text = String(decoding: FileManager.default.contents(atPath: output) ?? Data(), as: UTF8.self)
      throw HarnessError(description: "\(words.joined(separator: " ")) failed (\(status)): \(text)")
    }
  }

  private static func freePort() throws -> Int {
    let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard descriptor >= 0 else { throw HarnessError(description: "socket failed") }
    defer { close(descriptor) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafeMutablePointer(to: &address) {
      $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
        bind(descriptor, $0, length) == 0 && getsockname(descriptor, $0, &length) == 0
      }
    }
    guard bound else { throw HarnessError(description: "no free port") }
    return Int(UInt16(bigEndian: address.sin_port))
  }
}

/// Runs a blocking, throwing call on its own thread, keeping Swift's cooperative pool free.
func onThreadThrowing<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
  try await withCheckedThrowingContinuation { continuation in
    Thread { continuation.resume(with: Result { try body() }) }.start()
  }
}
