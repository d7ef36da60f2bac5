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

/// A connection the server ends while the store is idle (`pg_terminate_backend`, an
/// `idle_session_timeout`, a failover) is replaced before anything is sent, over TLS and not, so
/// the next add succeeds; a healthy connection (one that only got a NOTICE, a WARNING or an
/// ordinary ERROR) is kept.
@Suite("PostgreSQL: connections the server ends while idle", .serialized)
struct IdleConnectionTests {
  // Failed before the fix (`Connection.isHealthy` now looks for the server's close with a
  // peek at the socket; the defect predates version 3, found while probing the reconnect): the
  // store's connection is terminated while idle (`pg_terminate_backend`, a server's idle timeout,
  // a failover) and, a second later, an add fails with `commitUnknown` although nothing could have
  // committed. SerializedConnection promises a connection "the server closed while idle is
  // replaced before anything is sent" (SerializedConnection.swift:14-16), but
  // `Connection.isHealthy` (Connection.swift:201-207) only calls PQconsumeInput, which reads the
  // server's FATAL message and returns 1 without seeing the EOF behind it, so PQstatus stays
  // CONNECTION_OK; the add's statement is then sent on the dead socket, fails as a connection loss
  // outside a transaction (`mayCommit`, Connection.swift:224/250), and the non-idempotent add is
  // reported as possibly committed instead of being run again on a new connection.
  @Test(arguments: [0.2, 1.0])
  func anAddAfterItsIdleConnectionWasTerminatedSucceeds(wait: Double) async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("pg3idle")
    let store = try await openNamedStore(server, .init(schema: schema))
    let admin = try AdminConnection(server.url)
    let clock = SystemJobClock()
    // Twice: the second add prepares the statement the add after the termination runs (an
    // unprepared one fails in PQprepare, which counts as "nothing sent", and is run again).
    _ = try await store.enqueue([textJob()], queue: "i", clock: clock)
    _ = try await store.enqueue([textJob()], queue: "i", clock: clock)
    let killed = try admin.query(
      """
      SELECT pg_terminate_backend(pid) FROM pg_stat_activity
      WHERE application_name = '\(schema)' AND backend_type = 'client backend'
      """)
    #expect(killed.count >= 1)
    try await Task.sleep(for: .seconds(wait))
    do {
      _ = try await store.enqueue([textJob()], queue: "i", clock: clock)
      #expect(try await store.counts(queue: "i", clock: clock).ready == 3)
    } catch {
      Issue.record("an add on a connection terminated while idle \(wait) s before failed: \(error)")
      // The "unknown" commit is known: nothing was added.
      #expect(try await store.counts(queue: "i", clock: clock).ready == 2)
    }
    await store.close()
  }

  // The store's connection is terminated while idle (`pg_terminate_backend`; an idle-session
  // timeout or a failover does the same), then the next add runs. Promised: the connection is
  // replaced before anything is sent, so the add succeeds (SerializedConnection.swift:14-16).
  // With `sslmode=disable` this holds; with SSL (libpq's default `sslmode=prefer` picks it on any
  // server with SSL on) the server sends its FATAL message in a TLS record, then a TLS
  // close_notify alert (`secure_close` in the backend's exit), then closes the socket.
  // PQconsumeInput reads one TLS record (the FATAL) and returns 1; the peek in
  // `Connection.peerClosed` (Connection.swift:208, 215-221) then sees the close_notify's bytes, not
  // end of file, so `isHealthy` says healthy; the add's statement goes out on the dead
  // connection and the non-idempotent add fails with `commitUnknown`.
  @Test(arguments: ["disable", "require"])
  func anAddAfterItsIdleConnectionWasTerminatedSucceeds(sslmode: String) async throws {
    let server = try await PostgresServer.start()
    defer { server.stop() }
    try await server.enableSSL()
    let schema = uniqueSchema("pg4idle")
    let store = try await PostgresJobStore.open(
      url: server.url + "?sslmode=\(sslmode)&application_name=\(schema)", options: .init(schema: schema))
    let admin = try AdminConnection(server.url + "?sslmode=disable")
    let clock = SystemJobClock()
    _ = try await store.enqueue([textJob()], queue: "i", clock: clock)
    _ = try await store.enqueue([textJob()], queue: "i", clock: clock)
    let ssl = try admin.query(
      """
      SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
      WHERE a.application_name = '\(schema)' AND a.backend_type = 'client backend'
      """)
    #expect(!ssl.isEmpty && ssl.allSatisfy { $0.first == (sslmode == "require" ? "t" : "f") })
    let pids = try admin.query(
      """
      SELECT pid FROM pg_stat_activity
      WHERE application_name = '\(schema)' AND backend_type = 'client backend'
      """
    ).compactMap { $0.first ?? nil }
    for pid in pids { try admin.query("SELECT pg_terminate_backend(\(pid))") }
    // The backends are gone, and a second more for their sockets' close to arrive.
    try await waitFor("the terminated backends to exit") {
      try admin.query(
        "SELECT count(*) FROM pg_stat_activity WHERE pid IN (\(pids.joined(separator: ",")))"
      ).first?.first == "0"
    }
    try await Task.sleep(for: .seconds(1))
    do {
      _ = try await store.enqueue([textJob()], queue: "i", clock: clock)
      #expect(try await store.counts(queue: "i", clock: clock).ready == 3)
    } catch {
      Issue.record("sslmode=\(sslmode): an add on a connection terminated while idle failed: \(error)")
      #expect(try await store.counts(queue: "i", clock: clock).ready == 2)
    }
    await store.close()
  }

  // A NOTICE and a WARNING raised by a trigger during the store's statements, and an ordinary
  // ERROR from a failing add: the store keeps its backend (the same pid before and after).
  @Test func noticesAndErrorsKeepTheBackend() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("pg5keep")
    let store = try await PostgresJobStore.open(
      url: server.url + "?sslmode=disable&application_name=\(schema)", options: .init(schema: schema))
    let admin = try AdminConnection(server.url)
    try admin.query(
      """
      CREATE FUNCTION \(schema).chatty() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        RAISE NOTICE 'pg5 notice %', NEW.id;
        RAISE WARNING 'pg5 warning %', NEW.id;
        IF NEW.payload = '\\x626164'::bytea THEN RAISE EXCEPTION 'pg5 rejected'; END IF;
        RETURN NEW;
      END $$;
      CREATE TRIGGER chatty BEFORE INSERT ON \(schema).jobs FOR EACH ROW EXECUTE FUNCTION \(schema).chatty();
      """)
    let clock = SystemJobClock()
    _ = try await store.enqueue([textJob()], queue: "k", clock: clock)
    func backends() throws -> [String] {
      try admin.query(
        """
        SELECT pid FROM pg_stat_activity
        WHERE application_name = '\(schema)' AND backend_type = 'client backend' ORDER BY pid
        """
      ).compactMap { $0.first ?? nil }
    }
    let before = try backends()
    // (Standard error is not captured here: redirecting the process's descriptor 2 while other
    // tests run beside this one is not safe.)
    for _ in 0..<3 {
      _ = try await store.enqueue([textJob(), textJob()], queue: "k", clock: clock)
      _ = try? await store.enqueue([textJob("bad")], queue: "k", clock: clock)
      _ = try await store.enqueue([textJob(key: "a")], queue: "k", clock: clock)
      _ = try await store.counts(queue: "k", clock: clock)
    }
    let after = try backends()
    #expect(before == after, "backends before \(before), after \(after)")
    #expect(try await store.counts(queue: "k", clock: clock).ready == 8)
    await store.close()
  }

  // The server ends the store's idle session itself (idle_session_timeout, 1 s, set for the
  // store's role in its own database): the next add runs on a new connection and succeeds, over
  // TLS and not.
  @Test(arguments: ["disable", "require"])
  func anAddAfterAnIdleSessionTimeoutSucceeds(sslmode: String) async throws {
    let server = try await PostgresServer.start()
    defer { server.stop() }
    try await server.enableSSL()
    let admin = try AdminConnection(server.url + "?sslmode=disable")
    let database = uniqueSchema("pg5idle")
    try admin.query("CREATE DATABASE \(database)")
    try admin.query("ALTER DATABASE \(database) SET idle_session_timeout = '1s'")
    let schema = uniqueSchema("pg5idle")
    let url = "postgresql://postgres@127.0.0.1:\(server.port)/\(database)?sslmode=\(sslmode)"
    let store = try await PostgresJobStore.open(url: url, options: .init(schema: schema))
    let clock = SystemJobClock()
    var failures: [String] = []
    for round in 0..<3 {
      do {
        _ = try await store.enqueue([textJob()], queue: "i", clock: clock)
      } catch {
        failures.append("round \(round): \(error)")
      }
      try await Task.sleep(for: .milliseconds(2500))
    }
    #expect(failures.isEmpty, "sslmode=\(sslmode): \(failures)")
    await store.close()
  }
}
