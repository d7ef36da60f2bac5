import CLibPQ
import Conveyor
import Foundation
import Testing

@testable import ConveyorPostgres

/// Every insert wakes the workers and its queue is listed: the store's own adds wake them from
/// their insert statement (the trigger skips the store's sessions since schema version 3), every
/// other insert (`enqueue()`, an application's own `INSERT`) through the trigger; `queueNames()`
/// reads the queues from the jobs.
@Suite("PostgreSQL inserts wake workers")
struct InsertWakeTests {
  /// Whether a notification with `payload` reaches `listener` within `seconds`. The listener runs
  /// a statement between looks, so the server delivers what is pending at its end.
  func heard(_ payload: String, on listener: AdminConnection, within seconds: Double = 20) async throws
    -> Bool
  {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
      try listener.query("SELECT 1")
      _ = PQconsumeInput(listener.handle)
      var found = false
      while let notification = PQnotifies(listener.handle) {
        if String(cString: notification.pointee.extra) == payload { found = true }
        PQfreemem(notification)
      }
      if found { return true }
      try await Task.sleep(for: .milliseconds(20))
    }
    return false
  }

  /// Adds through the store, then through an application's session, and checks the wake-up of
  /// each and that its queue is listed.
  func checkEveryInsertWakes(_ store: PostgresJobStore, url: String) async throws {
    let schema = store.options.schema
    let listener = try AdminConnection(url)
    try listener.query("LISTEN \"\(schema).jobs\"")
    // The first add to a new queue and the next one: both wake.
    for round in 1...2 {
      _ = try await store.enqueue(
        [NewJob(payload: Data("x".utf8))], queue: "by-store", clock: SystemJobClock())
      #expect(try await heard("by-store", on: listener), "the store's add \(round) woke the workers")
    }
    // Batches: of like jobs (one array of payloads), and of jobs with keys (the general statement).
    _ = try await store.enqueue(
      [NewJob(payload: Data("a".utf8)), NewJob(payload: Data("b".utf8))], queue: "by-batch",
      clock: SystemJobClock())
    #expect(try await heard("by-batch", on: listener), "the store's batch of like jobs woke the workers")
    _ = try await store.enqueue(
      [NewJob(payload: Data("a".utf8), deduplicationKey: "a"), NewJob(payload: Data("b".utf8))],
      queue: "by-keyed-batch", clock: SystemJobClock())
    #expect(try await heard("by-keyed-batch", on: listener), "the store's batch with a key woke the workers")
    let app = try AdminConnection(url)
    try app.query("SELECT \(schema).enqueue('by-function', 'x')")
    #expect(try await heard("by-function", on: listener), "enqueue() woke the workers")
    try app.query(
      """
      INSERT INTO \(schema).jobs (queue, payload, status, run_at, created_at)
      VALUES ('by-insert', '\\x7b7d', 'ready', now(), now())
      """)
    #expect(try await heard("by-insert", on: listener), "an application's INSERT woke the workers")
    let names = Set(try await store.queueNames())
    #expect(names.isSuperset(of: ["by-store", "by-function", "by-insert"]), "listed: \(names)")
    let counts = try await store.counts(queue: "by-store", clock: SystemJobClock())
    #expect(counts.ready == 2)
  }

  @Test func theStoresAddsAndEveryOtherInsertWakeWorkersAndTheirQueuesAreListed() async throws {
    let server = try await PostgresServer.shared()
    let store = try await PostgresJobStore.open(url: server.url, options: .init(schema: uniqueSchema("wake")))
    try await checkEveryInsertWakes(store, url: server.url)
    await store.close()
  }

  // A database made by a build of schema version 2 (its trigger fired for the store's inserts too)
  // is migrated on open, and every insert still wakes the workers, once.
  @Test func aVersionTwoSchemaIsMigratedAndItsInsertsStillWake() async throws {
    let server = try await PostgresServer.shared()
    let name = uniqueSchema("v2")
    let sql = SQL(schema: name)
    let admin = try AdminConnection(server.url)
    try createSchema(sql, atVersion: 2, with: admin)
    try admin.query(
      """
      INSERT INTO \(sql.schema).jobs (queue, payload, status, run_at, created_at)
      VALUES ('old', '\\x7b7d', 'ready', now(), now())
      """)
    let store = try await PostgresJobStore.open(url: server.url, options: .init(schema: name))
    let versions = try admin.query("SELECT version FROM \(sql.schema).schema_migrations ORDER BY version")
    #expect(versions.map { $0.first ?? nil } == (1...PostgresJobStore.schemaVersion).map { String($0) })
    try await checkEveryInsertWakes(store, url: server.url)
    #expect(try await store.counts(queue: "old", clock: SystemJobClock()).ready == 1, "the old job kept")
    #expect(try await store.queueNames().contains("old"))
    await store.close()
  }
}

/// Creates `sql`'s schema as a build of schema version `version` left it: its migrations up to
/// that version, recorded, in one transaction.
func createSchema(_ sql: SQL, atVersion version: Int, with admin: AdminConnection) throws {
  try admin.query("BEGIN")
  try admin.query(sql.migrationTable)
  for index in 0..<version {
    try admin.query(sql.migrations[index])
    try admin.query("INSERT INTO \(sql.schema).schema_migrations (version) VALUES (\(index + 1))")
  }
  try admin.query("COMMIT")
}
