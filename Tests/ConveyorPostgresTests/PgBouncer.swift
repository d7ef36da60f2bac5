import Foundation

#if canImport(Glibc)
  import Glibc
#endif

/// A private PgBouncer from the Debian package (`pgbouncer`), in transaction pooling mode, in
/// front of a test server: on 127.0.0.1, a free port, `trust` authentication, a pool of a few
/// server connections per database. Stopped by ``stop()`` or when the test process exits (a
/// watchdog, as for the servers).
final class PgBouncer: Sendable {
  let folder: String
  let port: Int
  let pid: pid_t

  /// A URL of the `postgres` user's default database through the pooler.
  var url: String { "postgresql://postgres@127.0.0.1:\(port)/postgres" }

  /// The `pgbouncer` executable, if installed.
  static let executable: String? = ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"].first {
    FileManager.default.isExecutableFile(atPath: $0)
  }

  private init(folder: String, port: Int, pid: pid_t) {
    self.folder = folder
    self.port = port
    self.pid = pid
  }

  /// Starts a pooler in front of `front` with `poolSize` server connections per database and
  /// user.
  static func start(before front: PostgresServer, poolSize: Int = 3) async throws -> PgBouncer {
    guard let executable else { throw HarnessError("pgbouncer is not installed (apt-get install pgbouncer)") }
    return try await PostgresServer.onBackgroundThread {
      var template = Array((NSTemporaryDirectory() + "/conveyor-pgbouncer-XXXXXX").utf8CString)
      guard let made = mkdtemp(&template) else { throw HarnessError("mkdtemp failed: \(errno)") }
      let folder = String(cString: made)
      chmod(folder, 0o777)
      for attempt in 1...5 {
        let (socket, port) = try PostgresServer.loopbackSocket(listening: false)
        close(socket)
        let config = """
          [databases]
          postgres = host=127.0.0.1 port=\(front.port) dbname=postgres
          [pgbouncer]
          listen_addr = 127.0.0.1
          listen_port = \(port)
          unix_socket_dir =
          auth_type = trust
          auth_file = \(folder)/users.txt
          pool_mode = transaction
          default_pool_size = \(poolSize)
          max_client_conn = 500
          ignore_startup_parameters = extra_float_digits
          logfile = \(folder)/pgbouncer.log
          pidfile = \(folder)/pgbouncer.pid
          """
        try config.write(toFile: folder + "/pgbouncer.ini", atomically: true, encoding: .utf8)
        try "\"postgres\" \"\"\n".write(toFile: folder + "/users.txt", atomically: true, encoding: .utf8)
        for file in ["pgbouncer.ini", "users.txt"] { chmod(folder + "/" + file, 0o644) }
        // PgBouncer refuses to run as root.
        let arguments =
          getuid() == 0 ? ["-u", "postgres", folder + "/pgbouncer.ini"] : [folder + "/pgbouncer.ini"]
        let pid = try PostgresServer.spawn(
          executable, arguments, output: folder + "/stdout.log", setsid: true)
        let bouncer = PgBouncer(folder: folder, port: port, pid: pid)
        try watch(bouncer)
        // Up once it accepts a connection; a port taken meanwhile makes it exit.
        for _ in 0..<200 {
          if let socket = PostgresServer.connectLoopback(port: port) {
            close(socket)
            return bouncer
          }
          var status: Int32 = 0
          if waitpid(pid, &status, WNOHANG) == pid { break }
          Thread.sleep(forTimeInterval: 0.05)
        }
        bouncer.stop()
        if attempt == 5 {
          let log = (try? String(contentsOfFile: folder + "/pgbouncer.log", encoding: .utf8)) ?? ""
          throw HarnessError("pgbouncer did not start: \(log.suffix(2_000))")
        }
      }
      throw HarnessError("pgbouncer did not start")
    }
  }

  /// Stops the pooler (SIGTERM), ending its clients' connections.
  func stop() {
    kill(pid, SIGTERM)
    var status: Int32 = 0
    _ = waitpid(pid, &status, 0)
  }

  /// Stops the pooler when this test process exits.
  private static func watch(_ bouncer: PgBouncer) throws {
    let script = """
      while kill -0 "$1" 2>/dev/null; do sleep 1; done
      kill -TERM "$2" 2>/dev/null
      sleep 1
      rm -rf "$3"
      """
    _ = try PostgresServer.spawn(
      "/bin/sh", ["-c", script, "watchdog", "\(getpid())", "\(bouncer.pid)", bouncer.folder],
      output: "/dev/null", setsid: true)
  }
}
