import CLibPQ
import Conveyor
import Foundation
import Synchronization
import Testing

@testable import ConveyorPostgres

/// Adversarial review of schema version 3 (as reviewed, the store's inserts registered their queue once and
/// notify themselves; the trigger skips the store's sessions) and of the completions-only
/// settlement statement. Tests marked `// Fixed (failed before the fix):` proved a defect.
@Suite("ReviewPG3: inserts, registration and completions", .serialized)
struct ReviewPG3Tests {
  // MARK: Helpers

  func openStore(
    _ server: PostgresServer, schema: String, clock: PostgresJobStore.Clock = .database
  ) async throws -> PostgresJobStore {
    try await PostgresJobStore.open(
      url: server.url + "?application_name=\(schema)", options: .init(schema: schema, clock: clock))
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

  func job(_ text: String = "x", runTime: RunTime = .now, key: String? = nil, priority: Int = 0) -> NewJob {
    NewJob(payload: Data(text.utf8), priority: priority, runTime: runTime, deduplicationKey: key)
  }

  // MARK: Registration

  // Fixed (failed before the fix; queues are now listed from their jobs, so nothing depends on
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
    let store = try await openStore(server, schema: schema)
    let admin = try AdminConnection(server.url)
    let clock = SystemJobClock()
    _ = try await store.enqueue([job()], queue: "reg", clock: clock)
    #expect(try await store.queueNames().contains("reg"))
    try admin.query("DELETE FROM \"\(schema)\".queues WHERE name = 'reg'")
    // One job, and a batch, to the queue whose row is gone.
    _ = try await store.enqueue([job()], queue: "reg", clock: clock)
    _ = try await store.enqueue([job(), job()], queue: "reg", clock: clock)
    let names = try await store.queueNames()
    #expect(names.contains("reg"), "queueNames() lists a queue holding 4 jobs: \(names)")
    // A second store instance (a restarted process) lists it too.
    let fresh = try await openStore(server, schema: schema)
    _ = try await fresh.enqueue([job()], queue: "reg", clock: clock)
    #expect(try await store.queueNames().contains("reg"), "listed after a fresh store's add")
    await fresh.close()
    await store.close()
  }

  // A first add that fails (a constraint refuses one of its jobs) commits nothing, wakes nobody
  // and leaves the queue unlisted; the next add is listed and wakes once.
  @Test func aFailedFirstAddLeavesNothingAndTheNextAddIsListed() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("pg3fail")
    let store = try await openStore(server, schema: schema)
    let admin = try AdminConnection(server.url)
    let listener = try listen(server, schema: schema)
    let clock = SystemJobClock()
    try admin.query(
      "ALTER TABLE \"\(schema)\".jobs ADD CONSTRAINT no_bad CHECK (payload <> '\\x626164'::bytea)")
    await #expect(throws: (any Error).self) {
      _ = try await store.enqueue([job("bad")], queue: "fq", clock: clock)
    }
    await #expect(throws: (any Error).self) {
      _ = try await store.enqueue([job("ok"), job("bad")], queue: "fq", clock: clock)
    }
    await #expect(throws: (any Error).self) {
      _ = try await store.enqueue([job("ok", key: "k"), job("bad", key: "m")], queue: "fq", clock: clock)
    }
    #expect(try await collect(listener, expected: 0) == [], "no wake-up for rolled-back adds")
    #expect(try admin.scalar("SELECT count(*) FROM \"\(schema)\".queues") == "0")
    #expect(try admin.scalar("SELECT count(*) FROM \"\(schema)\".jobs") == "0")
    _ = try await store.enqueue([job("ok")], queue: "fq", clock: clock)
    #expect(try await collect(listener, expected: 1) == ["fq"])
    #expect(try await store.queueNames() == ["fq"])
    await store.close()
  }

  // A first add whose connection is killed while it waits (commit unknown), then one that is
  // cancelled, add nothing; the next add succeeds and its queue is listed.
  @Test func aKilledOrCancelledFirstAddAddsNothingAndTheNextAddIsListed() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("pg3kill")
    let store = try await openStore(server, schema: schema)
    let admin = try AdminConnection(server.url)
    let locker = try AdminConnection(server.url)
    let clock = SystemJobClock()
    // Touch the store once so its connection exists.
    _ = try await store.queueNames()
    try locker.query("BEGIN")
    try locker.query("LOCK TABLE \"\(schema)\".jobs IN ACCESS EXCLUSIVE MODE")
    let add = Task { try await store.enqueue([job()], queue: "kq", clock: clock) }
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
    let cancelled = Task { try await store.enqueue([job(), job()], queue: "kq", clock: clock) }
    try await Task.sleep(for: .milliseconds(500))
    cancelled.cancel()
    let cancelledOutcome = await cancelled.result
    try locker.query("ROLLBACK")
    if case .success = cancelledOutcome { Issue.record("the cancelled add reported success") }
    #expect(try admin.scalar("SELECT count(*) FROM \"\(schema)\".jobs") == "0")
    _ = try await store.enqueue([job()], queue: "kq", clock: clock)
    #expect(try await store.queueNames() == ["kq"])
    await store.close()
  }

  // Two stores add to the same new queues at once (one job, batches, keyed batches): every add
  // succeeds, every queue is registered once.
  @Test func twoStoresAddingToNewQueuesAtOnceBothSucceed() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("pg3two")
    let first = try await openStore(server, schema: schema)
    let second = try await openStore(server, schema: schema)
    let clock = SystemJobClock()
    let queues = (0..<30).map { "nq-\($0)" }
    try await withThrowingTaskGroup(of: Void.self) { group in
      for (index, queue) in queues.enumerated() {
        for store in [first, second] {
          group.addTask {
            switch index % 3 {
            case 0: _ = try await store.enqueue([job()], queue: queue, clock: clock)
            case 1: _ = try await store.enqueue([job(), job()], queue: queue, clock: clock)
            default: _ = try await store.enqueue([job(key: "a"), job(key: "b")], queue: queue, clock: clock)
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

  // MARK: Wake-ups

  // Each committed add wakes exactly once (one job, a batch, a keyed batch, an add of duplicates
  // alone wakes nobody), and after the store's connections are terminated and opened again the
  // session setting is back (the trigger keeps skipping the store's inserts).
  @Test func everyAddWakesOnceAlsoAfterAReconnect() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("pg3wake")
    let store = try await openStore(server, schema: schema)
    let listener = try listen(server, schema: schema)
    let admin = try AdminConnection(server.url)
    let clock = SystemJobClock()
    func addsWakeOnce(_ round: String) async throws {
      _ = try await store.enqueue([job()], queue: "w1", clock: clock)
      #expect(try await collect(listener, expected: 1) == ["w1"], "\(round): one job")
      _ = try await store.enqueue([job(), job(), job()], queue: "w2", clock: clock)
      #expect(try await collect(listener, expected: 1) == ["w2"], "\(round): batch")
      _ = try await store.enqueue([job(key: "\(round)a"), job(key: "\(round)b")], queue: "w3", clock: clock)
      #expect(try await collect(listener, expected: 1) == ["w3"], "\(round): keyed batch")
      _ = try await store.enqueue([job(key: "\(round)a")], queue: "w3", clock: clock)
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

  // Fixed (failed before the fix; `Connection.isHealthy` now looks for the server's close with a
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
    let store = try await openStore(server, schema: schema)
    let admin = try AdminConnection(server.url)
    let clock = SystemJobClock()
    // Twice: the second add prepares the statement the add after the termination runs (an
    // unprepared one fails in PQprepare, which counts as "nothing sent", and is run again).
    _ = try await store.enqueue([job()], queue: "i", clock: clock)
    _ = try await store.enqueue([job()], queue: "i", clock: clock)
    let killed = try admin.query(
      """
      SELECT pg_terminate_backend(pid) FROM pg_stat_activity
      WHERE application_name = '\(schema)' AND backend_type = 'client backend'
      """)
    #expect(killed.count >= 1)
    try await Task.sleep(for: .seconds(wait))
    do {
      _ = try await store.enqueue([job()], queue: "i", clock: clock)
      #expect(try await store.counts(queue: "i", clock: clock).ready == 3)
    } catch {
      Issue.record("an add on a connection terminated while idle \(wait) s before failed: \(error)")
      // The "unknown" commit is known: nothing was added.
      #expect(try await store.counts(queue: "i", clock: clock).ready == 2)
    }
    await store.close()
  }

  // MARK: Adds of one job

  // An add of one job (the scalar statement) stores exactly what the batch statement stores:
  // status, run date (clamped), priority, key, payload, for every kind of run time.
  @Test func oneJobAddsStoreWhatBatchAddsStore() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("pg3one")
    let store = try await openStore(server, schema: schema, clock: .caller)
    let clock = ManualJobClock(start: Date(timeIntervalSince1970: 1_800_000_000.123))
    let times = RunTime.edgeCases(around: clock.now())
    for (index, time) in times.enumerated() {
      let single = try await store.enqueue(
        [job("p\(index)", runTime: time, key: "s\(index)", priority: index - 5)], queue: "one", clock: clock)
      let batch = try await store.enqueue(
        [job("p\(index)", runTime: time, key: "b\(index)", priority: index - 5), job("filler")],
        queue: "one", clock: clock)
      let a = try #require(try await store.job(single[0].id))
      let b = try #require(try await store.job(batch[0].id))
      #expect(a.status == b.status, "\(time): status")
      #expect(a.runAt == b.runAt, "\(time): run date \(a.runAt) vs \(b.runAt)")
      #expect(a.createdAt == b.createdAt, "\(time): created")
      #expect(a.priority == b.priority && a.payload == b.payload, "\(time)")
      #expect(a.deduplicationKey == "s\(index)" && b.deduplicationKey == "b\(index)")
    }
    // Empty payload and empty key go through the scalar statement as values, not NULL.
    let empty = try await store.enqueue(
      [NewJob(payload: Data(), deduplicationKey: "")], queue: "one", clock: clock)
    let record = try #require(try await store.job(empty[0].id))
    #expect(record.payload == Data() && record.deduplicationKey == "")
    let again = try await store.enqueue(
      [NewJob(payload: Data("other".utf8), deduplicationKey: "")], queue: "one", clock: clock)
    #expect(again == [EnqueueResult(id: empty[0].id, inserted: false)])
    await store.close()
  }

  // Deduplication through the one-job statement and mixed batches: IDs in input order, the
  // existing job returned, duplicates within the batch folded.
  @Test func deduplicationAcrossOneJobAndBatchAdds() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("pg3dedup")
    let store = try await openStore(server, schema: schema)
    let clock = SystemJobClock()
    let first = try await store.enqueue([job(key: "k")], queue: "d", clock: clock)[0]
    #expect(first.inserted)
    let dup = try await store.enqueue([job(key: "k")], queue: "d", clock: clock)
    #expect(dup == [EnqueueResult(id: first.id, inserted: false)])
    // [existing, new key, no key, same new key, existing]: two inserts, in input order.
    let mixed = try await store.enqueue(
      [job(key: "k"), job(key: "m"), job(), job(key: "m"), job(key: "k")], queue: "d", clock: clock)
    #expect(mixed[0] == EnqueueResult(id: first.id, inserted: false))
    #expect(mixed[1].inserted && mixed[2].inserted && mixed[1].id < mixed[2].id)
    #expect(mixed[3] == EnqueueResult(id: mixed[1].id, inserted: false))
    #expect(mixed[4] == EnqueueResult(id: first.id, inserted: false))
    // One insert among duplicates takes the one-job statement.
    let oneAmong = try await store.enqueue(
      [job(key: "k"), job(key: "z"), job(key: "z")], queue: "d", clock: clock)
    #expect(oneAmong[0] == EnqueueResult(id: first.id, inserted: false))
    #expect(oneAmong[1].inserted && oneAmong[2] == EnqueueResult(id: oneAmong[1].id, inserted: false))
    // Another queue's key is another key.
    let other = try await store.enqueue([job(key: "k")], queue: "d2", clock: clock)
    #expect(other[0].inserted && other[0].id != first.id)
    #expect(try await store.counts(queue: "d", clock: clock).ready == 4)
    #expect(try await store.queueNames() == ["d", "d2"])
    await store.close()
  }

  // MARK: Completions

  struct Scenario {
    var applied: Set<JobID>
    var stale: [ClaimReference]
  }

  /// Claims jobs in two queues, then settles in queue `ca`: a current completion twice, a stale
  /// token, another queue's job, a removed job, a rescued-and-reclaimed job's old claim, an
  /// unknown ID; with `mixed` a kill of one more current claim joins the batch.
  func completions(mixed: Bool) async throws -> (stale: [ClaimReference], rows: [String: String]) {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema(mixed ? "pg3mix" : "pg3comp")
    let store = try await openStore(server, schema: schema, clock: .caller)
    let clock = ManualJobClock()
    let lease = Lease(owner: "w", duration: .seconds(30))
    let a = try await store.enqueue((0..<6).map { job("a\($0)") }, queue: "ca", clock: clock).map(\.id)
    let b = try await store.enqueue([job("b")], queue: "cb", clock: clock).map(\.id)
    let claimedA = try await store.settleAndClaim([], queue: "ca", limit: 5, lease: lease, clock: clock)
      .claimed
    let claimedB = try await store.settleAndClaim([], queue: "cb", limit: 1, lease: lease, clock: clock)
      .claimed
    #expect(claimedA.map(\.id) == Array(a.prefix(5)) && claimedB.map(\.id) == b)
    let claim = Dictionary(uniqueKeysWithValues: (claimedA + claimedB).map { ($0.id, $0.claim) })
    // a[2] is removed; a[3]'s lease lapses, it is rescued and claimed again (new token).
    _ = try await store.remove([a[2]], queue: "ca")
    _ = try await store.heartbeat(
      [claim[a[0]]!, claim[a[1]]!, claim[a[4]]!], queue: "ca",
      lease: Lease(owner: "w", duration: .seconds(3600)), clock: clock)
    clock.step(by: .seconds(60))
    #expect(try await store.rescueExpiredLeases(queue: "ca", clock: clock) == 1)
    let reclaimed = try await store.settleAndClaim([], queue: "ca", limit: 1, lease: lease, clock: clock)
      .claimed
    #expect(reclaimed.map(\.id) == [a[3]])
    var settlements = [
      JobSettlement(claim: claim[a[0]]!, action: .complete),
      JobSettlement(claim: claim[a[0]]!, action: .complete),
      JobSettlement(claim: ClaimReference(id: a[1], token: claim[a[1]]!.token - 1), action: .complete),
      JobSettlement(claim: claim[b[0]]!, action: .complete),
      JobSettlement(claim: claim[a[2]]!, action: .complete),
      JobSettlement(claim: claim[a[3]]!, action: .complete),
      JobSettlement(claim: ClaimReference(id: JobID(9_000_000), token: 1), action: .complete),
    ]
    if mixed { settlements.append(JobSettlement(claim: claim[a[4]]!, action: .kill(error: "k"))) }
    let batch = try await store.settleAndClaim(settlements, queue: "ca", limit: 0, lease: lease, clock: clock)
    let admin = try AdminConnection(server.url)
    var rows: [String: String] = [:]
    for row in try admin.query("SELECT payload, status FROM \"\(schema)\".jobs ORDER BY id") {
      let hex = row[0] ?? ""
      rows[hex] = row[1] ?? ""
    }
    await store.close()
    return (batch.staleSettlements, rows)
  }

  // Completions alone (the DELETE statement) and a mixed batch report the same stale
  // settlements and change the same rows.
  @Test func completionsAloneAndMixedBatchesAgree() async throws {
    let alone = try await completions(mixed: false)
    let mixed = try await completions(mixed: true)
    // Both scenarios number their jobs from their own schema's sequence: compare positions.
    #expect(alone.stale.count == 5, "stale: \(alone.stale)")
    #expect(mixed.stale.count == 5, "stale: \(mixed.stale)")
    var expectedMixed = alone.rows
    expectedMixed["\\x6134"] = "dead"
    #expect(alone.rows["\\x6134"] == "running")
    #expect(mixed.rows == expectedMixed, "alone \(alone.rows) mixed \(mixed.rows)")
    #expect(alone.rows["\\x6130"] == nil, "the current completion applied")
    #expect(alone.rows["\\x6131"] == "running" && alone.rows["\\x62"] == "running")
    #expect(alone.rows["\\x6133"] == "running", "the rescued job's new claim is untouched")
  }

  // NUL in a lease owner and in errors is stored as U+FFFD (checked in the UTF-8 bytes now).
  @Test func nulInOwnerAndErrorsIsStoredAsReplacement() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("pg3nul")
    let store = try await openStore(server, schema: schema)
    let clock = SystemJobClock()
    _ = try await store.enqueue([job(), job()], queue: "n", clock: clock)
    let owner = "w\0x\0"
    let claimed = try await store.settleAndClaim(
      [], queue: "n", limit: 2, lease: Lease(owner: owner, duration: .seconds(30)), clock: clock
    ).claimed
    #expect(claimed.map(\.leaseOwner) == ["w\u{FFFD}x\u{FFFD}", "w\u{FFFD}x\u{FFFD}"])
    let result = try await store.settleAndClaim(
      [JobSettlement(claim: claimed[0].claim, action: .kill(error: "e\0r"))], queue: "n", limit: 0,
      lease: Lease(owner: owner, duration: .seconds(30)), clock: clock)
    #expect(result.staleSettlements.isEmpty)
    #expect(try await store.job(claimed[0].id)?.lastError == "e\u{FFFD}r")
    await store.close()
  }

  // MARK: Migration

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
    let store = try await openStore(server, schema: name)
    let clock = SystemJobClock()
    _ = try await store.enqueue([job()], queue: "m", clock: clock)
    #expect(try await collect(listener, expected: 1) == ["m"])
    // Replace the trigger again under the running store (as a later migration would).
    try admin.query("BEGIN")
    try admin.query(sql.version3)
    try admin.query("COMMIT")
    _ = try await store.enqueue([job()], queue: "m", clock: clock)
    _ = try await store.enqueue([job(), job()], queue: "m2", clock: clock)
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
