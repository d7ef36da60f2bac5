import CLibPQ
import Conveyor
import Foundation
import Synchronization

#if canImport(Glibc)
  import Glibc
#endif

/// A private, throwaway PostgreSQL server for the tests, started from the installed binaries.
///
/// The data folder and the unix socket live in a new temporary folder (owned by the `postgres`
/// user when the tests run as root, since the server refuses to run as root), the server listens
/// on 127.0.0.1 on a free port with `trust` authentication, and durability is off (`fsync=off`)
/// for speed. ``shared()`` starts one server per test process, lazily, stopped when the process
/// exits; a test that restarts or stops its server starts one of its own with ``start()``.
/// A server whose test process died without stopping it is stopped by the next ``start()``.
final class PostgresServer: Sendable {
  let folder: String
  let port: Int
  let binaries: String

  /// A URL for the `postgres` superuser on the server's default database.
  var url: String { "postgresql://postgres@127.0.0.1:\(port)/postgres" }
  var dataFolder: String { folder + "/data" }

  private static let sharedServer = Task { try await PostgresServer.start() }

  /// The service file libpq reads for `service=` (`PGSERVICEFILE`), for the tests that write it.
  static let serviceFile = NSTemporaryDirectory() + "/conveyor-pg-services-\(getpid()).conf"

  /// The server shared by every test of this process.
  static func shared() async throws -> PostgresServer {
    try await sharedServer.value
  }

  private init(folder: String, port: Int, binaries: String) {
    self.folder = folder
    self.port = port
    self.binaries = binaries
  }

  /// Starts a new server; it is stopped by ``stop()`` or when the process exits. `firstPort` is the
  /// port tried first (for the harness's own test); a free one otherwise.
  static func start(firstPort: Int? = nil) async throws -> PostgresServer {
    try await onBackgroundThread { try startBlocking(firstPort: firstPort) }
  }

  private static func startBlocking(firstPort: Int?) throws -> PostgresServer {
    setenv("PGSSLMODE", "disable", 1)
    setenv("PGGSSENCMODE", "disable", 1)
    // Set here, beside the others, before any test connects: a variable set for the first time
    // grows the environment, which a concurrent `getenv` (libpq's, on another test's thread)
    // could be reading. libpq reads the file only for a conninfo naming a `service=`.
    setenv("PGSERVICEFILE", serviceFile, 1)
    stopAbandonedServers()
    let binaries = try findBinaries()
    var template = Array((NSTemporaryDirectory() + "/conveyor-pg-XXXXXX").utf8CString)
    guard let made = mkdtemp(&template) else { throw HarnessError("mkdtemp failed: \(errno)") }
    let folder = String(cString: made)
    try "\(getpid())".write(toFile: folder + "/owner.pid", atomically: true, encoding: .utf8)
    let first = PostgresServer(folder: folder, port: try firstPort ?? freePort(), binaries: binaries)
    if getuid() == 0 { try run("/bin/chown", ["-R", "postgres:postgres", folder]) }
    chmod(folder, 0o755)
    try first.runAsOwner(
      "\(binaries)/initdb",
      [
        "-D", first.dataFolder, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync",
        "--locale=C",
      ])
    try watch(folder)
    // The port was free when chosen, but something else (another test's private server, a
    // client's outgoing connection) may take it before the server binds it; the server then exits
    // at once. Each further try takes a new free port. (Without this, a private server failed to
    // start once in a full run.)
    var server = first
    for attempt in 1...10 {
      do {
        try server.control([
          "start", "-w", "-t", "60", "-l", folder + "/server.log", "-o", server.serverOptions,
        ])
        return server
      } catch {
        let log = (try? String(contentsOfFile: folder + "/server.log", encoding: .utf8)) ?? ""
        guard attempt < 10, log.contains("could not bind") || log.contains("could not create") else {
          throw HarnessError("\(error)\nserver log:\n\(log.suffix(2_000))")
        }
        server = PostgresServer(folder: folder, port: try freePort(), binaries: binaries)
      }
    }
    return server
  }

  var serverOptions: String {
    "-p \(port) -k \(folder) -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off "
      + "-c full_page_writes=off -c max_connections=300 -c shared_buffers=64MB"
  }

  /// Runs `pg_ctl` with `arguments` on this server's data folder.
  func control(_ arguments: [String]) throws {
    try runAsOwner("\(binaries)/pg_ctl", ["-D", dataFolder] + arguments)
  }

  /// Ends every client session but the one asking (`pg_terminate_backend`), then waits half a
  /// second for the closes to reach the clients: their idle connections are gone, and their next
  /// call reconnects. For a private server (``start()``) only: on the shared one it would end
  /// other tests' sessions.
  func terminateClientSessions() async throws {
    try AdminConnection(url).query(
      """
      SELECT pg_terminate_backend(pid) FROM pg_stat_activity
      WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()
      """)
    try await Task.sleep(for: .milliseconds(500))
  }

  /// Restarts the server (`pg_ctl restart -m fast`), terminating every connection.
  func restart() async throws {
    try await Self.onBackgroundThread {
      try self.control([
        "restart", "-m", "fast", "-w", "-t", "60", "-l", self.folder + "/server.log", "-o",
        self.serverOptions,
      ])
    }
  }

  /// The postmaster's process id.
  func postmaster() throws -> pid_t {
    let text = try String(contentsOfFile: dataFolder + "/postmaster.pid", encoding: .utf8)
    guard let line = text.split(separator: "\n").first, let pid = pid_t(line) else {
      throw HarnessError("no postmaster.pid in \(dataFolder)")
    }
    return pid
  }

  /// The postmaster and all its children (the backends): what freezing the server whole stops.
  func processes() throws -> [pid_t] {
    let postmaster = try postmaster()
    let children = try Self.capture("/usr/bin/pgrep", ["-P", "\(postmaster)"])
    return [postmaster] + children.split(separator: "\n").compactMap { pid_t($0) }
  }

  /// Freezes the server whole (SIGSTOP to the postmaster and its backends), as a paused virtual
  /// machine or a host whose packets are dropped: connections made stay open and get no answer,
  /// new ones get no answer either.
  func freeze() throws -> Freeze { Freeze(try processes()) }

  /// Freezes only the postmaster: connections already made go on working, new connections (and
  /// cancel requests) wait in its listen backlog.
  func freezePostmaster() throws -> Freeze { Freeze([try postmaster()]) }

  /// Stops the server and deletes its folder.
  func stop() {
    _ = try? control(["stop", "-m", "immediate", "-w"])
    try? FileManager.default.removeItem(atPath: folder)
  }

  private func runAsOwner(_ executable: String, _ arguments: [String]) throws {
    if getuid() == 0 {
      let runuser = ["/usr/sbin/runuser", "/sbin/runuser", "/usr/bin/runuser"].first {
        FileManager.default.isExecutableFile(atPath: $0)
      }
      if let runuser {
        try Self.run(runuser, ["-u", "postgres", "--", executable] + arguments)
      } else {
        let command = ([executable] + arguments).map {
          "'\($0.replacingOccurrences(of: "'", with: "'\\''"))'"
        }
        try Self.run("/bin/su", ["postgres", "-s", "/bin/sh", "-c", command.joined(separator: " ")])
      }
    } else {
      try Self.run(executable, arguments)
    }
  }

  /// The folder holding `initdb`, `pg_ctl` and `postgres`: `pg_config --bindir`, else the newest
  /// `/usr/lib/postgresql/<version>/bin` (Debian keeps the server binaries there).
  static func findBinaries() throws -> String {
    var candidates: [String] = []
    if let output = try? capture("/usr/bin/env", ["pg_config", "--bindir"]) {
      candidates.append(output.trimmingCharacters(in: .whitespacesAndNewlines))
    }
    let versions = (try? FileManager.default.contentsOfDirectory(atPath: "/usr/lib/postgresql")) ?? []
    candidates += versions.sorted { (Int($0) ?? 0) > (Int($1) ?? 0) }.map { "/usr/lib/postgresql/\($0)/bin" }
    for folder in candidates
    where ["initdb", "pg_ctl", "postgres"].allSatisfy({
      FileManager.default.isExecutableFile(atPath: "\(folder)/\($0)")
    }) {
      return folder
    }
    throw HarnessError(
      "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in \(candidates); install the `postgresql` package"
    )
  }

  private static func freePort() throws -> Int {
    let (descriptor, port) = try loopbackSocket(listening: false)
    close(descriptor)
    return port
  }

  /// A TCP socket bound to a free port of 127.0.0.1 (listening, with a backlog of 16, when
  /// `listening`), and the port.
  static func loopbackSocket(listening: Bool) throws -> (descriptor: Int32, port: Int) {
    let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard descriptor >= 0 else { throw HarnessError("socket failed") }
    var yes: Int32 = 1
    setsockopt(descriptor, SOL_SOCKET, SO_REUSEADDR, &yes, socklen_t(MemoryLayout<Int32>.size))
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = 0
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafeMutablePointer(to: &address) {
      $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer in
        bind(descriptor, pointer, length) == 0 && getsockname(descriptor, pointer, &length) == 0
      }
    }
    guard bound, !listening || listen(descriptor, 16) == 0 else {
      close(descriptor)
      throw HarnessError("bind/listen on 127.0.0.1 failed: errno \(errno)")
    }
    return (descriptor, Int(UInt16(bigEndian: address.sin_port)))
  }

  /// A TCP socket connected to `port` of 127.0.0.1, or nil when the connect fails: the server
  /// side of the tests' proxies.
  static func connectLoopback(port: Int) -> Int32? {
    let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard descriptor >= 0 else { return nil }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = UInt16(port).bigEndian
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    let connected = withUnsafePointer(to: &address) {
      $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
        connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
      }
    }
    guard connected == 0 else {
      close(descriptor)
      return nil
    }
    return descriptor
  }

  /// The tests' proxies: accepts connections on `listener` until it is shut down, connects each
  /// to `port` of 127.0.0.1 (a client whose server cannot be reached is shut down) and hands both
  /// sockets to `forward`, which returns false to stop accepting.
  static func acceptProxied(
    on listener: Int32, to port: Int, _ forward: (_ client: Int32, _ server: Int32) -> Bool
  ) {
    while true {
      let client = accept(listener, nil, nil)
      if client < 0 {
        if errno == EINTR { continue }
        return
      }
      guard let server = connectLoopback(port: port) else {
        shutdown(client, Int32(SHUT_RDWR))
        continue
      }
      guard forward(client, server) else { return }
    }
  }

  /// Sends every byte of `bytes` to `socket`; false when the socket fails first.
  static func sendAll(_ socket: Int32, _ bytes: UnsafeRawBufferPointer) -> Bool {
    var offset = 0
    while offset < bytes.count {
      let sent = send(socket, bytes.baseAddress! + offset, bytes.count - offset, Int32(MSG_NOSIGNAL))
      if sent < 0 && errno == EINTR { continue }
      if sent <= 0 { return false }
      offset += sent
    }
    return true
  }

  /// Stops servers left by test processes that died (their owner pid is gone).
  private static func stopAbandonedServers() {
    let temporary = NSTemporaryDirectory()
    let entries = (try? FileManager.default.contentsOfDirectory(atPath: temporary)) ?? []
    for entry in entries where entry.hasPrefix("conveyor-pg-") {
      let folder = temporary + "/" + entry
      guard let owner = try? String(contentsOfFile: folder + "/owner.pid", encoding: .utf8),
        let pid = Int32(owner.trimmingCharacters(in: .whitespacesAndNewlines)), kill(pid, 0) != 0
      else { continue }
      killPostmaster(folder)
      try? FileManager.default.removeItem(atPath: folder)
    }
  }

  /// Sends SIGQUIT (immediate shutdown) to the postmaster of the data folder in `folder`.
  static func killPostmaster(_ folder: String) {
    guard let text = try? String(contentsOfFile: folder + "/data/postmaster.pid", encoding: .utf8),
      let line = text.split(separator: "\n").first, let pid = Int32(line)
    else { return }
    kill(pid, SIGQUIT)
  }

  /// Starts the watchdog of the server in `folder`: it polls this process once a second and,
  /// when it is gone, sends the postmaster SIGQUIT (immediate shutdown) and deletes the folder.
  /// It runs in its own session, so a signal to the test's process group does not stop it first.
  private static func watch(_ folder: String) throws {
    let script = """
      while kill -0 "$1" 2>/dev/null; do sleep 1; done
      pid=$(head -n 1 "$2/data/postmaster.pid" 2>/dev/null) && kill -QUIT "$pid" 2>/dev/null
      for _ in 1 2 3 4 5 6 7 8 9 10; do [ -e "$2/data/postmaster.pid" ] || break; sleep 0.5; done
      rm -rf "$2"
      """
    _ = try spawn(
      "/bin/sh", ["-c", script, "watchdog", "\(getpid())", folder], output: "/dev/null", setsid: true)
  }

  /// Runs a program to its end with posix_spawn and waitpid (Foundation's `Process` did not
  /// always see `pg_ctl`'s exit here); its output goes to a file, not a pipe, since a server that
  /// `pg_ctl` starts could keep a pipe open.
  @discardableResult
  static func run(_ executable: String, _ arguments: [String]) throws -> String {
    let outputPath = NSTemporaryDirectory() + "/conveyor-pg-output-\(UUID().uuidString)"
    defer { try? FileManager.default.removeItem(atPath: outputPath) }
    let pid = try spawn(executable, arguments, output: outputPath, setsid: false)
    var status: Int32 = 0
    while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
    let text = (try? String(contentsOfFile: outputPath, encoding: .utf8)) ?? ""
    // WIFEXITED && WEXITSTATUS == 0
    guard status & 0x7f == 0 && (status >> 8) & 0xff == 0 else {
      throw HarnessError("\(executable) \(arguments.joined(separator: " ")) failed (\(status)): \(text)")
    }
    return text
  }

  /// Starts `executable` with standard input from /dev/null, standard output and error into
  /// `output`, and every other descriptor closed; `environment` replaces this process's.
  static func spawn(
    _ executable: String, _ arguments: [String], output: String, setsid: Bool = false,
    environment: [String: String]? = nil
  ) throws -> pid_t {
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
    posix_spawn_file_actions_addopen(&actions, 1, output, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
    posix_spawn_file_actions_adddup2(&actions, 1, 2)
    guard addCloseFrom(&actions, 3) == 0 else {
      throw HarnessError("cannot close descriptors for \(executable)")
    }
    var attributes = posix_spawnattr_t()
    posix_spawnattr_init(&attributes)
    defer { posix_spawnattr_destroy(&attributes) }
    // The child starts with no signal blocked and every signal at its default: the spawning
    // thread may block some (the test runner's threads do), and a pooler started with SIGTERM
    // blocked never stops. 0x80 is POSIX_SPAWN_SETSID, whose macro needs _GNU_SOURCE.
    var none = sigset_t()
    sigemptyset(&none)
    posix_spawnattr_setsigmask(&attributes, &none)
    var defaults = sigset_t()
    sigemptyset(&defaults)
    for signal in [SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGPIPE] { sigaddset(&defaults, signal) }
    posix_spawnattr_setsigdefault(&attributes, &defaults)
    let flags = Int32(POSIX_SPAWN_SETSIGMASK) | Int32(POSIX_SPAWN_SETSIGDEF) | (setsid ? 0x80 : 0)
    posix_spawnattr_setflags(&attributes, Int16(flags))
    let argv = ([executable] + arguments).map { strdup($0) } + [nil]
    defer { for pointer in argv { free(pointer) } }
    let envp = environment.map { $0.map { strdup("\($0.key)=\($0.value)") } + [nil] }
    defer { for pointer in envp ?? [] { free(pointer) } }
    var pid: pid_t = 0
    let spawned =
      envp.map { posix_spawn(&pid, executable, &actions, &attributes, argv, $0) }
      ?? posix_spawn(&pid, executable, &actions, &attributes, argv, environ)
    guard spawned == 0 else { throw HarnessError("cannot start \(executable): \(spawned)") }
    return pid
  }

  /// glibc's `posix_spawn_file_actions_addclosefrom_np` (2.34), looked up at run time because
  /// its declaration needs `_GNU_SOURCE`.
  private static let addCloseFrom:
    @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32 = {
      guard
        let symbol = dlsym(nil, "posix_spawn_file_actions_addclosefrom_np")  // nil: RTLD_DEFAULT
      else {
        fatalError("glibc 2.34 or later is needed (posix_spawn_file_actions_addclosefrom_np)")
      }
      return unsafeBitCast(
        symbol, to: (@convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32).self)
    }()

  static func capture(_ executable: String, _ arguments: [String]) throws -> String {
    try run(executable, arguments)
  }

  static func onBackgroundThread<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    // Not a dispatch thread: on Linux those are the cooperative pool's, and initdb or a server's
    // start would hold one for seconds.
    try await onOwnThread(name: "test-postgres-server", body)
  }
}

struct HarnessError: Error, CustomStringConvertible {
  var description: String
  init(_ description: String) { self.description = description }
}

/// A plain libpq connection for the tests' own SQL (text results), outside any store.
final class AdminConnection {
  let handle: OpaquePointer

  init(_ url: String) throws {
    guard let handle = PQconnectdb(url), PQstatus(handle) == CONNECTION_OK else {
      throw HarnessError("cannot connect to \(url)")
    }
    self.handle = handle
  }

  deinit { PQfinish(handle) }

  /// Runs `sql` (one statement, or several without results) and returns the rows as text.
  @discardableResult
  func query(_ sql: String) throws -> [[String?]] {
    guard let result = PQexec(handle, sql) else { throw HarnessError("no result for \(sql)") }
    defer { PQclear(result) }
    let status = PQresultStatus(result)
    guard status == PGRES_TUPLES_OK || status == PGRES_COMMAND_OK else {
      throw HarnessError("\(sql): \(String(cString: PQresultErrorMessage(result)))")
    }
    return (0..<PQntuples(result)).map { row in
      (0..<PQnfields(result)).map { column in
        PQgetisnull(result, row, column) == 1 ? nil : String(cString: PQgetvalue(result, row, column))
      }
    }
  }

  /// Runs `sql` as ``query(_:)`` does, on a thread outside Swift's cooperative pool: for
  /// statements that take seconds (filling a table, `VACUUM`), which would otherwise hold one of
  /// the pool's few threads and stall every other test's tasks meanwhile.
  @discardableResult
  func queryOffPool(_ sql: String) async throws -> [[String?]] {
    // Used by one caller at a time, as `query` is: the caller awaits the result.
    nonisolated(unsafe) let connection = self
    return try await onOwnThread(name: "test-admin-query") { try connection.query(sql) }
  }

  /// The first column of the first row.
  func scalar(_ sql: String) throws -> String? {
    try query(sql).first?.first ?? nil
  }
}

/// A schema name no other test uses.
func uniqueSchema(_ prefix: String = "t") -> String {
  "\(prefix)_\(UInt64.random(in: 0...UInt64.max) % 1_000_000_000_000)"
}

extension RunTime {
  /// Run times at the edges a store must store as the other statements do: now, zero and negative
  /// delays, delays past any date, the distant past and future, dates no store can hold, infinities,
  /// and dates an hour around `now` (one with a fraction of a millisecond).
  static func edgeCases(around now: Date) -> [RunTime] {
    [
      .now, .after(.zero), .after(.milliseconds(-5000)), .after(.seconds(3600)), .after(.milliseconds(1)),
      .after(.seconds(Int64.max)), .after(JobStoreTime.longestDelay), .at(.distantPast), .at(.distantFuture),
      .at(Date(timeIntervalSince1970: -1e15)), .at(Date(timeIntervalSince1970: 1e15)),
      .at(Date(timeIntervalSince1970: .infinity)), .at(Date(timeIntervalSince1970: -.infinity)),
      .at(now.addingTimeInterval(-3600)), .at(now.addingTimeInterval(3600.0004)), .at(now),
    ]
  }
}

/// Waits (up to 30 s) for `condition`; a condition that throws counts as not yet met.
func waitFor(_ what: String, _ condition: () throws -> Bool) async throws {
  let deadline = Date().addingTimeInterval(30)
  while Date() < deadline {
    if (try? condition()) == true { return }
    try await Task.sleep(for: .milliseconds(50))
  }
  throw HarnessError("timed out waiting for \(what)")
}

extension PostgresServer {
  /// Turns SSL on (a self-signed certificate the server itself writes into its data folder, with
  /// `COPY … TO PROGRAM`, so it is the server's user's) and waits until it serves it. For a
  /// private server of one test (``start()``), not the shared one.
  func enableSSL() async throws {
    let admin = try AdminConnection(url + "?sslmode=disable")
    try admin.query(
      """
      COPY (SELECT 1) TO PROGRAM 'openssl req -x509 -newkey rsa:2048 -nodes -keyout server.key \
      -out server.crt -days 2 -subj /CN=localhost >/dev/null 2>&1 && chmod 600 server.key'
      """)
    try admin.query("ALTER SYSTEM SET ssl = on")
    try admin.query("SELECT pg_reload_conf()")
    try await waitFor("the server to accept SSL") {
      let probe = try AdminConnection(url + "?sslmode=require")
      return try probe.query("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").first?.first == "t"
    }
  }
}

/// Processes stopped with SIGSTOP until ``thaw()``, which a test calls where it needs to and in a
/// `defer` (thawing twice is harmless).
final class Freeze: Sendable {
  let pids: [pid_t]

  init(_ pids: [pid_t]) {
    self.pids = pids
    for pid in pids { kill(pid, SIGSTOP) }
  }

  /// Resumes every frozen process (SIGCONT).
  func thaw() {
    for pid in pids { kill(pid, SIGCONT) }
  }
}
