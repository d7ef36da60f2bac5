import CLibPQ
import Conveyor
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import ConveyorPostgres

#if canImport(Glibc)
  import Glibc
#endif

/// The store's connect: non-blocking (`PQconnectStart` / `PQconnectPoll` in 50 ms slices), it
/// must give up where libpq's own blocking connect gives up (a server whose answer trickles in, a
/// frozen first host, `connect_timeout` values libpq refuses), follow the plan libpq resolves
/// (hosts and `connect_timeout` from a service file or the environment, conninfo libpq cannot
/// parse), and never show a password in an error. Each comparison runs libpq's own connect beside
/// the store's.
@Suite("PostgreSQL: connecting", .serialized, .timeLimit(.minutes(10)))
struct ConnectTests {
  /// A fake server on 127.0.0.1 that accepts connections, reads the startup packet, then answers
  /// with the header of a 20,000-byte ErrorResponse and drips its body one byte every 20 ms: the
  /// client's socket turns readable every 20 ms, never staying quiet for 50 ms, and the message
  /// never completes (it would take 400 s). Stands for a stalled proxy or a broken middlebox.
  final class DripServer: Sendable {
    let port: Int
    private let listener: Int32
    private let stopped = Atomic<Bool>(false)
    private let ended = Atomic<Bool>(false)

    init() throws {
      (listener, port) = try PostgresServer.loopbackSocket(listening: true)
      let thread = Thread { [self] in serve() }
      thread.name = "drip-server"
      thread.start()
    }

    /// Stops dripping and closes every socket (the client then reads end of file).
    func stop() {
      stopped.store(true, ordering: .releasing)
      for _ in 0..<100 where !ended.load(ordering: .acquiring) { usleep(20_000) }
    }

    private func serve() {
      defer {
        close(listener)
        ended.store(true, ordering: .releasing)
      }
      var clients: [Int32] = []
      defer { for client in clients { close(client) } }
      var tick = 0
      while !stopped.load(ordering: .acquiring) {
        var descriptor = pollfd(fd: listener, events: Int16(POLLIN), revents: 0)
        if poll(&descriptor, 1, 20) > 0 {
          let client = accept(listener, nil, nil)
          if client >= 0 {
            // The startup packet (sslmode and gssencmode are disabled: no negotiation first).
            var buffer = [UInt8](repeating: 0, count: 4096)
            var ready = pollfd(fd: client, events: Int16(POLLIN), revents: 0)
            if poll(&ready, 1, 2000) > 0 { _ = recv(client, &buffer, buffer.count, 0) }
            // 'E', length 20,000 (big-endian, counting itself): valid, below libpq's 30,000.
            let header: [UInt8] = [UInt8(ascii: "E"), 0x00, 0x00, 0x4E, 0x20]
            _ = send(client, header, header.count, Int32(MSG_NOSIGNAL))
            clients.append(client)
          }
        }
        tick += 1
        for client in clients {
          var byte = UInt8(ascii: "M")
          _ = send(client, &byte, 1, Int32(MSG_NOSIGNAL))
        }
      }
    }
  }

  enum Outcome: Sendable, CustomStringConvertible {
    case connected
    case failed(String)

    var description: String {
      switch self {
      case .connected: "connected"
      case .failed(let message): "failed: \(message)"
      }
    }
  }

  final class Slot: Sendable {
    let mutex = Mutex<Outcome?>(nil)
    func withLock<R>(_ body: (inout Outcome?) -> R) -> R { mutex.withLock { body(&$0) } }
  }

  /// Runs `Connection.init` on a thread of its own; the result lands in the mutex when it ends.
  static func connectOnThread(
    _ conninfo: String, deadline: ContinuousClock.Instant? = nil,
    isCancelled: @escaping @Sendable () -> Bool = { false }
  ) -> Slot {
    let box = Slot()
    let thread = Thread {
      let outcome: Outcome
      do {
        _ = try Connection(
          conninfo: conninfo, scrubber: Scrubber(secrets: []), deadline: deadline, isCancelled: isCancelled)
        outcome = .connected
      } catch let error as PostgresError {
        outcome = .failed(error.message)
      } catch {
        outcome = .failed("\(error)")
      }
      box.withLock { $0 = outcome }
    }
    thread.start()
    return box
  }

  /// libpq's own blocking connect (`PQconnectdb`, as the store did before), on a thread of its own.
  static func libpqConnectOnThread(_ conninfo: String) -> Slot {
    let box = Slot()
    let thread = Thread {
      let handle = PQconnectdb(conninfo)
      defer { PQfinish(handle) }
      let outcome: Outcome =
        PQstatus(handle) == CONNECTION_OK
        ? .connected : .failed(Connection.trimmed(String(cString: PQerrorMessage(handle))))
      box.withLock { $0 = outcome }
    }
    thread.start()
    return box
  }

  /// libpq's own blocking connect (`before`, what the store did before) and the store's
  /// `Connection` (`after`) to `conninfo`, side by side on threads of their own; nil for one that
  /// had not ended after `seconds`.
  static func bothConnects(_ conninfo: String, seconds: Int64) async -> (before: Outcome?, after: Outcome?) {
    let before = libpqConnectOnThread(conninfo)
    let after = connectOnThread(conninfo)
    return (await wait(before, seconds: seconds), await wait(after, seconds: seconds))
  }

  static func wait(_ box: Slot, seconds: Int64) async -> Outcome? {
    let deadline = ContinuousClock.now + .seconds(seconds)
    while ContinuousClock.now < deadline {
      if let outcome = box.withLock({ $0 }) { return outcome }
      try? await Task.sleep(for: .milliseconds(50))
    }
    return box.withLock { $0 }
  }

  // MARK: - A server whose answer trickles in

  /// Baseline: libpq's blocking connect gives up on the dripping server after `connect_timeout`
  /// (its deadline is absolute, however often the socket turns readable).
  @Test func libpqItselfGivesUpOnADrippingServerAfterConnectTimeout() async throws {
    let server = try DripServer()
    defer { server.stop() }
    let box = Self.libpqConnectOnThread(
      "host=127.0.0.1 port=\(server.port) user=u dbname=d sslmode=disable gssencmode=disable connect_timeout=2"
    )
    let outcome = await Self.wait(box, seconds: 20)
    #expect(outcome != nil, "PQconnectdb had not given up after 20 s (connect_timeout=2)")
    if case .failed(let message) = outcome { #expect(message.contains("timeout expired"), "\(message)") }
  }

  /// The store's connect looks at its give-up time (and at cancellation) only when `poll` waited
  /// its whole 50 ms slice for nothing: a socket that turns readable more often than that (a byte
  /// every 20 ms) keeps the loop going forever, past `connect_timeout`.
  @Test func connectGivesUpOnADrippingServerAfterConnectTimeout() async throws {
    let server = try DripServer()
    defer { server.stop() }
    let box = Self.connectOnThread(
      "host=127.0.0.1 port=\(server.port) user=u dbname=d sslmode=disable gssencmode=disable connect_timeout=2"
    )
    let outcome = await Self.wait(box, seconds: 20)
    #expect(
      outcome != nil,
      "Connection(conninfo:) had not given up after 20 s on a server that drips its answer (connect_timeout=2)"
    )
  }

  /// The same for the caller's deadline (the store's reconnect deadline).
  @Test func connectGivesUpOnADrippingServerAtTheDeadline() async throws {
    let server = try DripServer()
    defer { server.stop() }
    let box = Self.connectOnThread(
      "host=127.0.0.1 port=\(server.port) user=u dbname=d sslmode=disable gssencmode=disable",
      deadline: .now + .seconds(1))
    let outcome = await Self.wait(box, seconds: 20)
    #expect(outcome != nil, "Connection(conninfo:) had not given up 20 s after a 1 s deadline")
  }

  /// And cancellation, promised to end the connect within about 50 ms.
  @Test func cancellingAConnectToADrippingServerEndsIt() async throws {
    let server = try DripServer()
    defer { server.stop() }
    let cancelled = Atomic<Bool>(false)
    let box = Self.connectOnThread(
      "host=127.0.0.1 port=\(server.port) user=u dbname=d sslmode=disable gssencmode=disable",
      isCancelled: { cancelled.load(ordering: .acquiring) })
    try await Task.sleep(for: .milliseconds(500))
    cancelled.store(true, ordering: .releasing)
    let outcome = await Self.wait(box, seconds: 10)
    #expect(outcome != nil, "a cancelled Connection(conninfo:) had not ended 10 s after the cancellation")
  }

  // MARK: - Several hosts, the first one frozen

  /// libpq applies `connect_timeout` per host (address): `PQconnectdb` gives up on a frozen first
  /// host after it and connects to the second. The store's first non-blocking connect applied it
  /// once to the whole attempt, and failed without ever trying the second host; a conninfo
  /// naming several hosts now goes through libpq's own connect.
  @Test func aFrozenFirstHostFallsThroughToTheSecondAfterConnectTimeout() async throws {
    let healthy = try await PostgresServer.shared()
    let frozenServer = try await PostgresServer.start()
    defer { frozenServer.stop() }
    let frozen = try frozenServer.freeze()
    defer { frozen.thaw() }
    let conninfo =
      "host=127.0.0.1,127.0.0.1 port=\(frozenServer.port),\(healthy.port) user=postgres dbname=postgres "
      + "connect_timeout=2"

    // Baseline: libpq's blocking connect (what the store did before).
    let (before, after) = await Self.bothConnects(conninfo, seconds: 30)
    frozen.thaw()
    #expect(before?.description == "connected", "PQconnectdb: \(String(describing: before))")
    #expect(after?.description == "connected", "Connection(conninfo:): \(String(describing: after))")
  }

  // MARK: - connect_timeout values libpq rejects

  /// libpq rejects a `connect_timeout` that is not an integer ("invalid integer value … for
  /// connection option "connect_timeout""); `PQconnectPoll` never parses it, and the store's own
  /// reading ignores it and connects (giving up after 30 s instead). A typo such as `5s` is no
  /// longer reported.
  @Test(arguments: ["abc", "5s", "2.5"])
  func aConnectTimeoutLibpqRejectsIsStillRejected(_ value: String) async throws {
    let server = try await PostgresServer.shared()
    let conninfo = "host=127.0.0.1 port=\(server.port) user=postgres dbname=postgres connect_timeout=\(value)"
    let (before, after) = await Self.bothConnects(conninfo, seconds: 30)
    #expect(
      before?.description.contains("invalid integer value") == true,
      "PQconnectdb: \(String(describing: before))")
    #expect(
      after?.description == before?.description,
      "Connection(conninfo:): \(String(describing: after)); PQconnectdb: \(String(describing: before))")
  }

  // MARK: - Healthy servers connect as before (sanity, expected to pass)

  @Test func healthyServersConnectAsBefore() async throws {
    let server = try await PostgresServer.shared()
    let conninfos = [
      server.url,
      server.url + "?connect_timeout=0",
      server.url + "?connect_timeout=-5",
      server.url + "?connect_timeout=%201%20",
      "host=\(server.folder) port=\(server.port) user=postgres dbname=postgres",
      "host=127.0.0.1,127.0.0.1 port=1,\(server.port) user=postgres dbname=postgres",
    ]
    for conninfo in conninfos {
      let (before, after) = await Self.bothConnects(conninfo, seconds: 30)
      #expect(
        before?.description == after?.description,
        "\(conninfo): before \(String(describing: before)), after \(String(describing: after))")
    }
    let failing = [
      "host=127.0.0.1 port=\(server.port) user=postgres dbname=no_such_database",
      "host=127.0.0.1 port=\(server.port) user=no_such_user dbname=postgres",
      "host=127.0.0.1 port=1 user=postgres dbname=postgres",
      "host=localhost port=1 user=postgres dbname=postgres",
    ]
    for conninfo in failing {
      let (before, after) = await Self.bothConnects(conninfo, seconds: 30)
      #expect(
        before?.description == after?.description,
        "\(conninfo): before \(String(describing: before)), after \(String(describing: after))")
    }
  }

  @Test func sslModesConnectAsBefore() async throws {
    let server = try await PostgresServer.start()
    defer { server.stop() }
    try await server.enableSSL()
    for mode in ["disable", "allow", "prefer", "require", "verify-ca"] {
      let conninfo = server.url + "?sslmode=\(mode)"
      let (before, after) = await Self.bothConnects(conninfo, seconds: 30)
      #expect(
        before?.description == after?.description,
        "\(conninfo): before \(String(describing: before)), after \(String(describing: after))")
    }
  }

  // MARK: - The connect's plan, from what libpq resolved (commit 12cc914)

  // `plan(_:)` decided single host or several, and read `connect_timeout`, from
  // `PQconninfoParse`: the conninfo string alone. libpq itself also takes the connection's options
  // from a service file (`service=`) and from the environment (PGHOST, PGCONNECT_TIMEOUT, …), which
  // `PQconninfoParse` never reads; and the blocking path handed the conninfo to `PQconnectdbParams`
  // as an expanded `dbname`, which libpq takes for a plain database name when it is not a
  // connection string. Each test compares the store's connect with `PQconnectdb`; the four
  // comparisons failed before the fix (the plan now reads the options libpq resolved, `PQconninfo`
  // after `PQconnectStart`, and a conninfo libpq cannot parse fails in `PQconnectStart` with
  // libpq's message).

  /// The service file libpq reads for `service=` (PGSERVICEFILE, set when the first server
  /// starts; read only when a service is named, so no other test sees it). Each test rewrites it.
  static var serviceFile: String { PostgresServer.serviceFile }

  static func writeServices(_ text: String) throws {
    try text.write(toFile: serviceFile, atomically: true, encoding: .utf8)
  }

  /// A server of its own, frozen whole (SIGSTOP); `body` runs with its port; thawed and stopped
  /// afterwards.
  static func withFrozenServer(_ body: (Int) async throws -> Void) async throws {
    let server = try await PostgresServer.start()
    defer { server.stop() }
    let frozen = try server.freeze()
    defer { frozen.thaw() }
    try await body(server.port)
  }

  // MARK: - Hosts named by a service file

  /// The service names two hosts, the first frozen; the conninfo says `connect_timeout=2`.
  /// `PQconnectdb` gives up on the first host after 2 s and connects to the second. `plan` sees
  /// no `host` in the string, takes the non-blocking path, applies the 2 s to the whole attempt
  /// (`PQconnectPoll` never moves on from a host that does not answer) and fails.
  @Test func aServiceNamingSeveralHostsFallsThroughLikePQconnectdb() async throws {
    let healthy = try await PostgresServer.shared()
    try await Self.withFrozenServer { frozenPort in
      try Self.writeServices(
        """
        [svc_two]
        host=127.0.0.1,127.0.0.1
        port=\(frozenPort),\(healthy.port)
        user=postgres
        dbname=postgres

        """)
      let conninfo = "service=svc_two connect_timeout=2"
      let (before, after) = await Self.bothConnects(conninfo, seconds: 30)
      #expect(before?.description == "connected", "PQconnectdb: \(String(describing: before))")
      #expect(after?.description == "connected", "Connection(conninfo:): \(String(describing: after))")
    }
  }

  // MARK: - connect_timeout given by a service file

  /// The service sets `connect_timeout=2` for a frozen server. `PQconnectdb` gives up after 2 s;
  /// `plan` does not see the value and the store waits 30 s.
  @Test func aServicesConnectTimeoutIsHonoured() async throws {
    try await Self.withFrozenServer { frozenPort in
      try Self.writeServices(
        """
        [svc_frozen]
        host=127.0.0.1
        port=\(frozenPort)
        user=postgres
        dbname=postgres
        connect_timeout=2

        """)
      let conninfo = "service=svc_frozen"
      let (before, after) = await Self.bothConnects(conninfo, seconds: 10)
      #expect(before != nil, "PQconnectdb had not given up 10 s after connect_timeout=2")
      #expect(
        after != nil,
        "Connection(conninfo:) had not given up 10 s after the service's connect_timeout=2 (PQconnectdb: \(String(describing: before)))"
      )
    }
  }

  /// The blocking path (several hosts in the conninfo) passes `connect_timeout=30` in the keyword
  /// array; a service file (like PGCONNECT_TIMEOUT) fills only options left unset, so its
  /// `connect_timeout=2` is lost: the frozen first host holds the connect 30 s instead of 2 s.
  @Test func theBlockingPathKeepsAServicesConnectTimeout() async throws {
    let healthy = try await PostgresServer.shared()
    try await Self.withFrozenServer { frozenPort in
      try Self.writeServices(
        """
        [svc_timeout]
        user=postgres
        dbname=postgres
        connect_timeout=2

        """)
      let conninfo = "service=svc_timeout host=127.0.0.1,127.0.0.1 port=\(frozenPort),\(healthy.port)"
      let (before, after) = await Self.bothConnects(conninfo, seconds: 12)
      #expect(before?.description == "connected", "PQconnectdb: \(String(describing: before))")
      #expect(
        after?.description == "connected",
        "Connection(conninfo:) after 12 s (the service says connect_timeout=2): \(String(describing: after))")
    }
  }

  // MARK: - A conninfo libpq cannot parse

  /// A conninfo that is neither `key=value` pairs nor a URL — a bare word, a URL with a typo —
  /// is refused by `PQconnectdb` ("missing "=" after …"). The blocking path passes it as an
  /// expanded `dbname`; libpq takes it for a plain database name and connects to the default
  /// server (PGHOST or the default socket, port 5432) with it: a different error here, a
  /// connection to the wrong database where a server listens at the defaults.
  @Test(arguments: ["postgres", "postgresql:/127.0.0.1/postgres"])
  func aConninfoLibpqCannotParseIsRefusedAsByPQconnectdb(_ conninfo: String) async throws {
    let (before, after) = await Self.bothConnects(conninfo, seconds: 30)
    #expect(
      before?.description.contains("missing \"=\"") == true, "PQconnectdb: \(String(describing: before))")
    #expect(
      after?.description == before?.description,
      "Connection(conninfo:): \(String(describing: after)); PQconnectdb: \(String(describing: before))")
  }

  // MARK: - Sanity (expected to pass)

  /// Several hosts in URL form, and quoted key=value values, through the blocking path.
  @Test func severalHostsInURLAndQuotedFormsConnectAsBefore() async throws {
    let server = try await PostgresServer.shared()
    let conninfos = [
      "postgresql://postgres@127.0.0.1:1,127.0.0.1:\(server.port)/postgres",
      "postgresql://postgres@127.0.0.1:1,127.0.0.1:\(server.port)/postgres?application_name=a%20b",
      "host='127.0.0.1,127.0.0.1' port='1,\(server.port)' user=postgres dbname='postgres' application_name='it\\'s'",
      "host=127.0.0.1,127.0.0.1 port=1,\(server.port) user=postgres dbname=no_such_database",
    ]
    for conninfo in conninfos {
      let (before, after) = await Self.bothConnects(conninfo, seconds: 30)
      #expect(
        before?.description == after?.description,
        "\(conninfo): before \(String(describing: before)), after \(String(describing: after))")
    }
  }

  // MARK: - Passwords

  // Failed before the fix: a password given as a URL query parameter (`?password=…`) is not scrubbed when libpq
  // cannot parse the URL: ConnectionInfo only collects the password of the URL's authority before
  // calling PQconninfoParse, and libpq's message quotes the offending token
  // (`invalid percent-encoded token: "…"`), so the password appears in the error's description.
  @Test func aPasswordInAURLQueryNeverAppearsInAParseError() async throws {
    let secret = "Sw0rdfish%zzTango"
    do {
      _ = try PostgresJobStore(url: "postgresql://app@127.0.0.1:1/app?password=\(secret)")
      Issue.record("the URL was accepted")
    } catch {
      let text = "\(error) \(String(reflecting: error))"
      #expect(!text.contains("Sw0rdfish"), "the password leaked: \(text)")
    }
  }

  @Test func passwordsNeverAppearInConnectionErrors() async throws {
    let server = try await PostgresServer.shared()
    let secret = "Xy7Secret9"
    let urls = [
      "postgresql://app:\(secret)@127.0.0.1:1/app",  // unreachable
      "postgresql://postgres:\(secret)@127.0.0.1:\(server.port)/no_such_db_\(secret)x",  // bad database
      "host=127.0.0.1 port=1 user=app password=\(secret) dbname=app",  // conninfo, unreachable
      "host=127.0.0.1 port=\(server.port) user=nobody_here password='\(secret)' dbname=postgres",  // bad user
      "postgresql://app:%58y7Secret9@127.0.0.1:1/app",  // percent-encoded
      "postgresql://app:\(secret)@127.0.0.1:1/app?sslmode=bogus",
      "postgresql://app:\(secret)@127.0.0.1:notaport/app",
    ]
    for url in urls {
      do {
        let store = try await PostgresJobStore.open(url: url)
        Issue.record("opened \(store.target)")
      } catch {
        let text = "\(error) \(String(reflecting: error))"
        #expect(!text.contains(secret), "leaked for \(url): \(text)")
      }
    }
  }
}
