import CLibPQ
import Conveyor
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import ConveyorPostgres

/// Every insert wakes the workers and its queue is listed: the store's own adds wake them from
/// their insert statement (the trigger skips the store's sessions since schema version 3), every
/// other insert (`enqueue()`, an application's own `INSERT`) through the trigger; `queueNames()`
/// reads the queues from the jobs, whatever the database's collation and whatever became of the
/// queue's row, and a schema in use keeps waking through its migration.
@Suite("PostgreSQL inserts wake workers", .serialized)
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

  /// Every notification payload on the listener's channel received so far (after a round trip,
  /// so what the server holds for it is delivered).
  func drain(_ listener: AdminConnection) throws -> [String] {
    try listener.query("SELECT 1")
    _ = PQconsumeInput(listener.handle)
    var payloads: [String] = []
    while let notification = PQnotifies(listener.handle) {
      payloads.append(String(cString: notification.pointee.extra))
      PQfreemem(notification)
    }
    return payloads
  }

  /// The notifications that arrive until `expected` came (or 10 s passed), then for 300 ms more
  /// (to catch extra ones).
  func collect(_ listener: AdminConnection, expected: Int) async throws -> [String] {
    var payloads: [String] = []
    let deadline = Date().addingTimeInterval(10)
    while payloads.count < expected && Date() < deadline {
      payloads += try drain(listener)
      if payloads.count < expected { try await Task.sleep(for: .milliseconds(20)) }
    }
    try await Task.sleep(for: .milliseconds(300))
    payloads += try drain(listener)
    return payloads
  }

  func listen(_ server: PostgresServer, schema: String) throws -> AdminConnection {
    let listener = try AdminConnection(server.url)
    try listener.query("LISTEN \"\(schema).jobs\"")
    return listener
  }

  // MARK: Queues listed from their jobs

  // Failed before the fix (queues are now listed from their jobs, so nothing depends on
  // the store registering them): the store remembered, per instance, that it registered a queue
  // (`registeredQueues`, PostgresJobStore.swift:96-98, "its rows are never deleted") and never
  // registers it again; before version 3 the trigger registered it on every insert. A queue row
  // an administrator deleted (or lost to a restore/failover, or a schema recreated under a running
  // store) is therefore never put back by the store's adds, and `queueNames()` (and the
  // dashboard) stop listing a queue that holds jobs, while `enqueue()` and an application's INSERT
  // (through the trigger) still would put it back.
  @Test func aQueueWhoseRowAnAdministratorDeletedIsStillListed() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("pg3reg")
    let store = try await openNamedStore(server, .init(schema: schema))
    let admin = try AdminConnection(server.url)
    let clock = SystemJobClock()
    _ = try await store.enqueue([textJob()], queue: "reg", clock: clock)
    #expect(try await store.queueNames().contains("reg"))
    try admin.query("DELETE FROM \"\(schema)\".queues WHERE name = 'reg'")
    // One job, and a batch, to the queue whose row is gone.
    _ = try await store.enqueue([textJob()], queue: "reg", clock: clock)
    _ = try await store.enqueue([textJob(), textJob()], queue: "reg", clock: clock)
    let names = try await store.queueNames()
    #expect(names.contains("reg"), "queueNames() lists a queue holding 4 jobs: \(names)")
    // A second store instance (a restarted process) lists it too.
    let fresh = try await openNamedStore(server, .init(schema: schema))
    _ = try await fresh.enqueue([textJob()], queue: "reg", clock: clock)
    #expect(try await store.queueNames().contains("reg"), "listed after a fresh store's add")
    await fresh.close()
    await store.close()
  }

  // A first add that fails (a constraint refuses one of its jobs) commits nothing, wakes nobody
  // and leaves the queue unlisted; the next add is listed and wakes once.
  @Test func aFailedFirstAddLeavesNothingAndTheNextAddIsListed() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("pg3fail")
    let store = try await openNamedStore(server, .init(schema: schema))
    let admin = try AdminConnection(server.url)
    let listener = try listen(server, schema: schema)
    let clock = SystemJobClock()
    try admin.query(
      "ALTER TABLE \"\(schema)\".jobs ADD CONSTRAINT no_bad CHECK (payload <> '\\x626164'::bytea)")
    await #expect(throws: (any Error).self) {
      _ = try await store.enqueue([textJob("bad")], queue: "fq", clock: clock)
    }
    await #expect(throws: (any Error).self) {
      _ = try await store.enqueue([textJob("ok"), textJob("bad")], queue: "fq", clock: clock)
    }
    await #expect(throws: (any Error).self) {
      _ = try await store.enqueue(
        [textJob("ok", key: "k"), textJob("bad", key: "m")], queue: "fq", clock: clock)
    }
    #expect(try await collect(listener, expected: 0) == [], "no wake-up for rolled-back adds")
    #expect(try admin.scalar("SELECT count(*) FROM \"\(schema)\".queues") == "0")
    #expect(try admin.scalar("SELECT count(*) FROM \"\(schema)\".jobs") == "0")
    _ = try await store.enqueue([textJob("ok")], queue: "fq", clock: clock)
    #expect(try await collect(listener, expected: 1) == ["fq"])
    #expect(try await store.queueNames() == ["fq"])
    await store.close()
  }

  // A first add whose connection is killed while it waits (commit unknown), then one that is
  // cancelled, add nothing; the next add succeeds and its queue is listed.
  @Test func aKilledOrCancelledFirstAddAddsNothingAndTheNextAddIsListed() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("pg3kill")
    let store = try await openNamedStore(server, .init(schema: schema))
    let admin = try AdminConnection(server.url)
    let locker = try AdminConnection(server.url)
    let clock = SystemJobClock()
    // Touch the store once so its connection exists.
    _ = try await store.queueNames()
    try locker.query("BEGIN")
    try locker.query("LOCK TABLE \"\(schema)\".jobs IN ACCESS EXCLUSIVE MODE")
    let add = Task { try await store.enqueue([textJob()], queue: "kq", clock: clock) }
    // Wait until the add is blocked on the lock, then kill its backend.
    var killed = false
    for _ in 0..<200 where !killed {
      try await Task.sleep(for: .milliseconds(20))
      let pids = try admin.query(
        """
        SELECT pid FROM pg_stat_activity WHERE application_name = '\(schema)' AND wait_event_type = 'Lock'
        """)
      for row in pids {
        if let pid = row[0] {
          try admin.query("SELECT pg_terminate_backend(\(pid))")
          killed = true
        }
      }
    }
    #expect(killed)
    let outcome = await add.result
    try locker.query("ROLLBACK")
    if case .success = outcome { Issue.record("the killed add reported success") }
    // A cancelled add.
    try locker.query("BEGIN")
    try locker.query("LOCK TABLE \"\(schema)\".jobs IN ACCESS EXCLUSIVE MODE")
    let cancelled = Task { try await store.enqueue([textJob(), textJob()], queue: "kq", clock: clock) }
    try await Task.sleep(for: .milliseconds(500))
    cancelled.cancel()
    let cancelledOutcome = await cancelled.result
    try locker.query("ROLLBACK")
    if case .success = cancelledOutcome { Issue.record("the cancelled add reported success") }
    #expect(try admin.scalar("SELECT count(*) FROM \"\(schema)\".jobs") == "0")
    _ = try await store.enqueue([textJob()], queue: "kq", clock: clock)
    #expect(try await store.queueNames() == ["kq"])
    await store.close()
  }

  // Two stores add to the same new queues at once (one job, batches, keyed batches): every add
  // succeeds, every queue is registered once.
  @Test func twoStoresAddingToNewQueuesAtOnceBothSucceed() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("pg3two")
    let first = try await openNamedStore(server, .init(schema: schema))
    let second = try await openNamedStore(server, .init(schema: schema))
    let clock = SystemJobClock()
    let queues = (0..<30).map { "nq-\($0)" }
    try await withThrowingTaskGroup(of: Void.self) { group in
      for (index, queue) in queues.enumerated() {
        for store in [first, second] {
          group.addTask {
            switch index % 3 {
            case 0: _ = try await store.enqueue([textJob()], queue: queue, clock: clock)
            case 1: _ = try await store.enqueue([textJob(), textJob()], queue: queue, clock: clock)
            default:
              _ = try await store.enqueue([textJob(key: "a"), textJob(key: "b")], queue: queue, clock: clock)
            }
          }
        }
      }
      try await group.waitForAll()
    }
    #expect(try await first.queueNames() == queues.sorted())
    await first.close()
    await second.close()
  }

  // MARK: Queue names in any collation

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
    for queue in byStore { _ = try await store.enqueue([textJob()], queue: queue, clock: clock) }
    try admin.query("SELECT \"\(schema)\".enqueue('via-fn', 'p')")
    try admin.query(
      """
      INSERT INTO "\(schema)".jobs (queue, payload, status, run_at, created_at)
      SELECT 'raw.' || i, '\\x00', 'ready', now(), now() FROM generate_series(1000, 2999) i
      """)
    // Jobs of every status: one queue of running, one of dead, one of scheduled only.
    _ = try await store.enqueue([textJob()], queue: "run", clock: clock)
    _ = try await store.enqueue([textJob()], queue: "dead", clock: clock)
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
    _ = try await store.enqueue([textJob()], queue: "gone", clock: clock)
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

  // MARK: Wake-ups

  // Each committed add wakes exactly once (one job, a batch, a keyed batch, an add of duplicates
  // alone wakes nobody), and after the store's connections are terminated and opened again the
  // session setting is back (the trigger keeps skipping the store's inserts).
  @Test func everyAddWakesOnceAlsoAfterAReconnect() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("pg3wake")
    let store = try await openNamedStore(server, .init(schema: schema))
    let listener = try listen(server, schema: schema)
    let admin = try AdminConnection(server.url)
    let clock = SystemJobClock()
    func addsWakeOnce(_ round: String) async throws {
      _ = try await store.enqueue([textJob()], queue: "w1", clock: clock)
      #expect(try await collect(listener, expected: 1) == ["w1"], "\(round): one job")
      _ = try await store.enqueue([textJob(), textJob(), textJob()], queue: "w2", clock: clock)
      #expect(try await collect(listener, expected: 1) == ["w2"], "\(round): batch")
      _ = try await store.enqueue(
        [textJob(key: "\(round)a"), textJob(key: "\(round)b")], queue: "w3", clock: clock)
      #expect(try await collect(listener, expected: 1) == ["w3"], "\(round): keyed batch")
      _ = try await store.enqueue([textJob(key: "\(round)a")], queue: "w3", clock: clock)
      #expect(try await collect(listener, expected: 0) == [], "\(round): duplicates alone")
    }
    try await addsWakeOnce("first")
    try await addsWakeOnce("registered")
    try admin.query(
      "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '\(schema)'")
    try await Task.sleep(for: .milliseconds(200))
    // An idempotent call first reconnects (an add right after an idle termination is the next
    // probe's subject).
    _ = try await store.queueNames()
    try await addsWakeOnce("reconnected")
    let setting = try await store.connection.perform(idempotent: true) { db in
      try db.execute("SELECT current_setting('conveyor.store_session', true)", prepared: false).text(0, 0)
    }
    #expect(setting == "on", "the reconnected session skips the trigger")
    #expect(try await store.counts(queue: "w1", clock: clock).ready == 3)
    await store.close()
  }

  // A store open on a version-2 schema's sibling keeps working while another store migrates that
  // schema under it: its prepared statements survive the trigger's replacement, and an old
  // (version 2) session's inserts still register and wake through the trigger.
  @Test func aRunningStoreSurvivesTheMigrationOfItsSchema() async throws {
    let server = try await PostgresServer.shared()
    let name = uniqueSchema("pg3mig")
    let sql = SQL(schema: name)
    let admin = try AdminConnection(server.url)
    try createSchema(sql, atVersion: 2, with: admin)
    let listener = try listen(server, schema: name)
    let store = try await openNamedStore(server, .init(schema: name))
    let clock = SystemJobClock()
    _ = try await store.enqueue([textJob()], queue: "m", clock: clock)
    #expect(try await collect(listener, expected: 1) == ["m"])
    // Replace the trigger again under the running store (as a later migration would).
    try admin.query("BEGIN")
    try admin.query(sql.version3)
    try admin.query("COMMIT")
    _ = try await store.enqueue([textJob()], queue: "m", clock: clock)
    _ = try await store.enqueue([textJob(), textJob()], queue: "m2", clock: clock)
    #expect(try await collect(listener, expected: 2).sorted() == ["m", "m2"])
    // A session that is not the store's (a version-2 process): the trigger serves it.
    try admin.query(
      """
      INSERT INTO \(sql.schema).jobs (queue, payload, status, run_at, created_at)
      VALUES ('old', '\\x7b7d', 'ready', now(), now())
      """)
    #expect(try await collect(listener, expected: 1) == ["old"])
    #expect(try await store.queueNames() == ["m", "m2", "old"])
    // A newer version is refused and left untouched.
    let newer = PostgresJobStore.schemaVersion + 1
    try admin.query("INSERT INTO \(sql.schema).schema_migrations (version) VALUES (\(newer))")
    #expect(throws: PostgresError.self) {
      _ = try PostgresJobStore(url: server.url, options: .init(schema: name))
    }
    #expect(try admin.scalar("SELECT count(*) FROM \(sql.schema).schema_migrations") == "\(newer)")
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
