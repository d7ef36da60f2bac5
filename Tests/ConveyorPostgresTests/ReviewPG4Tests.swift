import CLibPQ
import Conveyor
import Foundation
import Synchronization
import Testing

@testable import ConveyorPostgres

/// Adversarial review of the listing of queues from their jobs (`SQL.queueNames`) and of the
/// peek at the socket in `Connection.isHealthy`.
@Suite("ReviewPG4: queue listing and idle connections", .serialized)
struct ReviewPG4Tests {
  func job(_ text: String = "x", key: String? = nil) -> NewJob {
    NewJob(payload: Data(text.utf8), priority: 0, runTime: .now, deduplicationKey: key)
  }

  // MARK: Idle connections closed by the server

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
    _ = try await store.enqueue([job()], queue: "i", clock: clock)
    _ = try await store.enqueue([job()], queue: "i", clock: clock)
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
      _ = try await store.enqueue([job()], queue: "i", clock: clock)
      #expect(try await store.counts(queue: "i", clock: clock).ready == 3)
    } catch {
      Issue.record("sslmode=\(sslmode): an add on a connection terminated while idle failed: \(error)")
      #expect(try await store.counts(queue: "i", clock: clock).ready == 2)
    }
    await store.close()
  }

  // MARK: Queue names

  /// Fills a schema with queues reached every way (store adds, `enqueue()`, a raw INSERT, jobs of
  /// every status, a deleted queues table, paused empty queues, names needing C ordering) and
  /// checks `queueNames()` against the byte-sorted expectation. `database` nil: the shared
  /// server's C database; else a new database of that ICU locale.
  func checkQueueNames(icuLocale: String?) async throws {
    let server = try await PostgresServer.shared()
    var url = server.url
    if let icuLocale {
      let admin = try AdminConnection(server.url)
      let name = uniqueSchema("pg4db")
      try admin.query(
        "CREATE DATABASE \(name) TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE '\(icuLocale)' ENCODING 'UTF8'"
      )
      url = "postgresql://postgres@127.0.0.1:\(server.port)/\(name)"
    }
    let schema = uniqueSchema("pg4names")
    let store = try await PostgresJobStore.open(url: url, options: .init(schema: schema))
    let admin = try AdminConnection(url)
    let clock = SystemJobClock()
    let byStore = [
      "B", "a", "é", "a_b", "a-b", "a.b", "Z", "b", "ä", "a b", "A", "_", "-", ".", "0", "~", "ÿ", "a\u{301}",
    ]
    for queue in byStore { _ = try await store.enqueue([job()], queue: queue, clock: clock) }
    try admin.query("SELECT \"\(schema)\".enqueue('via-fn', 'p')")
    try admin.query(
      """
      INSERT INTO "\(schema)".jobs (queue, payload, status, run_at, created_at)
      SELECT 'raw.' || i, '\\x00', 'ready', now(), now() FROM generate_series(1000, 2999) i
      """)
    // Jobs of every status: one queue of running, one of dead, one of scheduled only.
    _ = try await store.enqueue([job()], queue: "run", clock: clock)
    _ = try await store.enqueue([job()], queue: "dead", clock: clock)
    _ = try await store.enqueue(
      [NewJob(payload: Data(), priority: 0, runTime: .after(.seconds(3600)), deduplicationKey: nil)],
      queue: "later", clock: clock)
    try admin.query(
      "UPDATE \"\(schema)\".jobs SET status = 'running', lease_owner = 'w', lease_expires_at = now() + interval '1 hour' WHERE queue = 'run'"
    )
    try admin.query("UPDATE \"\(schema)\".jobs SET status = 'dead' WHERE queue = 'dead'")
    // A paused empty queue is listed; one paused then resumed is not; a removed queue is not.
    try await store.setPaused(true, queue: "paused")
    try await store.setPaused(true, queue: "resumed")
    try await store.setPaused(false, queue: "resumed")
    _ = try await store.enqueue([job()], queue: "gone", clock: clock)
    _ = try await store.clear(queue: "gone", statuses: Set(JobStatus.allCases))
    try admin.query("DELETE FROM \"\(schema)\".queues WHERE NOT paused")
    try admin.query("ANALYZE \"\(schema)\".jobs")

    var expected = Set(byStore + ["via-fn", "run", "dead", "later", "paused"])
    for i in 1000...2999 { expected.insert("raw.\(i)") }
    let sorted = expected.sorted { Array($0.utf8).lexicographicallyPrecedes(Array($1.utf8)) }
    let listed = try await store.queueNames()
    #expect(listed.count == sorted.count)
    #expect(listed == sorted)
    if listed != sorted {
      Issue.record(
        "missing \(Set(sorted).subtracting(listed).sorted()), extra \(Set(listed).subtracting(sorted).sorted()), first differences \(Array(zip(listed, sorted).filter { $0 != $1 }.prefix(5)))"
      )
    }
    await store.close()
  }

  @Test func queueNamesInACDatabase() async throws { try await checkQueueNames(icuLocale: nil) }
  @Test func queueNamesInAnICUDatabase() async throws { try await checkQueueNames(icuLocale: "en-US") }
}
