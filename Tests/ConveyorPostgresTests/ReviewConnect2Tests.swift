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

/// Second review of `Connection.init(conninfo:…)` (12cc914): `plan(_:)` decides single host or
/// several, and reads `connect_timeout`, from `PQconninfoParse` — the conninfo string alone. libpq
/// itself also takes the connection's options from a service file (`service=`) and from the
/// environment (PGHOST, PGCONNECT_TIMEOUT, …), which `PQconninfoParse` never reads; and the
/// blocking path hands the conninfo to `PQconnectdbParams` as an expanded `dbname`, which libpq
/// takes for a plain database name when it is not a connection string.
///
/// Each test compares the store's connect with `PQconnectdb` (what the store did before
/// da1cfe6). The helpers are ReviewConnectTests'. The four comparisons failed against 12cc914;
/// now the plan reads the options libpq resolved (`PQconninfo` after `PQconnectStart`), and a
/// conninfo libpq cannot parse fails in `PQconnectStart` with libpq's message.
@Suite("Review 2: the PostgreSQL connect's plan", .serialized, .timeLimit(.minutes(3)))
struct ReviewConnect2Tests {
  typealias R = ReviewConnectTests

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
        [review_two]
        host=127.0.0.1,127.0.0.1
        port=\(frozenPort),\(healthy.port)
        user=postgres
        dbname=postgres

        """)
      let conninfo = "service=review_two connect_timeout=2"
      let (before, after) = await R.bothConnects(conninfo, seconds: 30)
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
        [review_frozen]
        host=127.0.0.1
        port=\(frozenPort)
        user=postgres
        dbname=postgres
        connect_timeout=2

        """)
      let conninfo = "service=review_frozen"
      let (before, after) = await R.bothConnects(conninfo, seconds: 10)
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
        [review_timeout]
        user=postgres
        dbname=postgres
        connect_timeout=2

        """)
      let conninfo = "service=review_timeout host=127.0.0.1,127.0.0.1 port=\(frozenPort),\(healthy.port)"
      let (before, after) = await R.bothConnects(conninfo, seconds: 12)
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
    let (before, after) = await R.bothConnects(conninfo, seconds: 30)
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
      let (before, after) = await R.bothConnects(conninfo, seconds: 30)
      #expect(
        before?.description == after?.description,
        "\(conninfo): before \(String(describing: before)), after \(String(describing: after))")
    }
  }
}
