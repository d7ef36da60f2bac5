import Conveyor
import ConveyorPostgres
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

// The examples of the "Running on PostgreSQL" guide
// (Sources/ConveyorPostgres/ConveyorPostgres.docc/RunningOnPostgreSQL.md) and of the module's
// landing page (ConveyorPostgres.md), verbatim between the markers, run against the tests' private
// server; the SQL example runs through a plain libpq connection.

private struct Email: Queueable {
  var to: String
  var body: String
}

/// The examples' `mailer`: records what it sends.
private final class Mailer: Sendable {
  let sent = Mutex<[String]>([])
  func send(_ email: Email) async throws { sent.withLock { $0.append("\(email.to): \(email.body)") } }
}

private let mailer = Mailer()

// RunningOnPostgreSQL.md example 1 begins
/// Opens the shared store for a worker that may start before its database (as containers
/// often do), and handles the emails queue.
private func startEmailWorker(databaseURL: String) async throws -> JobQueue<Email> {
  let store = try await PostgresJobStore.open(
    url: databaseURL, options: .init(startupWait: .seconds(60))
  ) { error in
    print("waiting for the database: \(error)")
  }
  return try JobQueue<Email>(configuration: .init(identifier: "emails"), store: store) { email, _ in
    try await mailer.send(email)
    return .handled
  }
}
// RunningOnPostgreSQL.md example 1 ends

// RunningOnPostgreSQL.md example 2 begins
/// Opens the store through PgBouncer in transaction mode, listening straight to the server.
private func openThroughPgBouncer(bouncerURL: String, serverURL: String) async throws -> PostgresJobStore {
  try await PostgresJobStore.open(
    url: bouncerURL, options: .init(pooling: .transaction(listenURL: serverURL)))
}
// RunningOnPostgreSQL.md example 2 ends

/// The landing page's example. Compiled, not run: it connects to `db.internal`.
private func landingPageExample() async throws {
  // ConveyorPostgres.md example begins
  let store = try await PostgresJobStore.open(url: "postgres://worker@db.internal/app")
  let queue = try JobQueue<Email>(configuration: .init(identifier: "emails"), store: store) { email, _ in
    try await mailer.send(email)
    return .handled
  }
  try await queue.add(Email(to: "ada@example.com", body: "Hello"))
  // ConveyorPostgres.md example ends
  await queue.shutdown()
}

@Suite("Guide snippets: PostgreSQL", .timeLimit(.minutes(10)))
struct PostgresGuideSnippetTests {
  @Test func theWorkerHandlesAJobEnqueuedInsideAnApplicationsTransaction() async throws {
    let server = try await PostgresServer.shared()
    // A database of its own, so that the example's default schema and queue are its alone.
    let database = "guide_\(UInt64.random(in: 0...UInt64.max) % 1_000_000_000)"
    try AdminConnection(server.url).query("CREATE DATABASE \(database)")
    let url = "postgresql://postgres@127.0.0.1:\(server.port)/\(database)"
    let worker = try await startEmailWorker(databaseURL: url)
    let admin = try AdminConnection(url)
    try admin.query("CREATE TABLE accounts (id int PRIMARY KEY, email text)")
    try admin.query("INSERT INTO accounts VALUES (42, 'old@example.com')")
    // The guide's SQL example, verbatim.
    try admin.query(
      """
      BEGIN;
      UPDATE accounts SET email = 'ada@example.com' WHERE id = 42;
      SELECT conveyor.enqueue('emails', '{"to":"ada@example.com","body":"Hello"}');
      COMMIT;
      """)
    try await eventually("the worker sent the email", timeout: .seconds(240)) {
      mailer.sent.withLock { $0 }.contains("ada@example.com: Hello")
    }
    #expect(try admin.scalar("SELECT email FROM accounts WHERE id = 42") == "ada@example.com")
    await worker.shutdown()
  }

  @Test(.enabled(if: PgBouncer.executable != nil, "needs pgbouncer (apt-get install pgbouncer)"))
  func aStoreOpensThroughPgBouncerInTransactionMode() async throws {
    let server = try await PostgresServer.shared()
    let bouncer = try await PgBouncer.start(before: server, poolSize: 2)
    defer { bouncer.stop() }
    let store = try await openThroughPgBouncer(bouncerURL: bouncer.url, serverURL: server.url)
    let queue = "guide-bouncer-\(UInt64.random(in: 0...UInt64.max) % 1_000_000_000)"
    _ = try await store.enqueue([NewJob(payload: Data("{}".utf8))], queue: queue, now: Date())
    #expect(try await store.counts(queue: queue, now: Date()) == JobCounts(ready: 1))
    await store.close()
  }
}
