import CSQLite
import Conveyor
import ConveyorTestSupport
import Foundation
import Testing

@testable import ConveyorSQLite

/// A clock that cancels the task reading it: the store reads the clock inside its transaction, so
/// the cancellation arrives mid-transaction, after `BEGIN IMMEDIATE` and before `COMMIT`.
private struct CancellingClock: JobClock {
  func now() -> Date {
    withUnsafeCurrentTask { $0?.cancel() }
    return epoch
  }
  func sleep(until deadline: Date) async throws { try await Task.sleep(for: .milliseconds(1)) }
}

@Suite("SQLiteJobStore")
struct SQLiteJobStoreTests {
  @Test func aLeaseShorterThanTwiceTheBusyTimeoutIsRefusedNamingBusyTimeout() async throws {
    let folder = try TemporaryFolder()
    let store = try makeStore(folder, options: .init(busyTimeout: .seconds(5)))
    struct Item: Queueable { var n: Int }
    #expect {
      _ = try JobQueue<Item>(
        configuration: .init(identifier: "q", autoStart: false, leaseDuration: .seconds(9)), store: store
      ) { _, _ in .handled }
    } throws: { error in
      String(describing: error).contains("SQLiteJobStore.Options.busyTimeout")
    }
  }

  @Test func enqueueAndClaimInPriorityOrder() async throws {
    let folder = try TemporaryFolder()
    let store = try makeStore(folder)
    let results = try await store.enqueue(
      [
        NewJob(payload: payload("low"), priority: 0, runAt: epoch),
        NewJob(payload: payload("high"), priority: 5, runAt: epoch),
        NewJob(payload: payload("later"), priority: 9, runAt: epoch.addingTimeInterval(10)),
        NewJob(payload: Data(), priority: 0, runAt: epoch.addingTimeInterval(-1)),
      ], queue: "jobs", now: epoch)
    #expect(results.map(\.inserted) == [true, true, true, true])
    #expect(results.map(\.id) == results.map(\.id).sorted())

    let batch = try await store.settleAndClaim([], queue: "jobs", limit: 10, lease: lease(), now: epoch)
    #expect(batch.claimed.map(\.payload) == [payload("high"), Data(), payload("low")])
    #expect(batch.claimed.allSatisfy { $0.status == .running && $0.attempts == 1 && $0.leaseOwner == "w1" })
    #expect(batch.claimed.allSatisfy { $0.leaseExpiresAt == epoch.addingTimeInterval(60) })
    #expect(
      try await store.counts(queue: "jobs", now: epoch) == JobCounts(ready: 0, scheduled: 1, running: 3))
    #expect(try await store.nextWake(queue: "jobs").nextRun == epoch.addingTimeInterval(10))
  }

  @Test func datesRoundTripToTheMillisecond() async throws {
    let folder = try TemporaryFolder()
    let store = try makeStore(folder)
    let dates = [
      Date(timeIntervalSince1970: 1_700_000_000.123), Date(timeIntervalSince1970: 0.001),
      Date(timeIntervalSince1970: 4_102_444_800.999), Date(timeIntervalSince1970: -86_400.5),
    ]
    for runAt in dates {
      let id = try await store.enqueue([NewJob(payload: payload("x"), runAt: runAt)], queue: "d", now: runAt)[
        0
      ].id
      let record = try #require(
        try await store.jobs(queue: "d", status: nil, after: nil, limit: 100).first { $0.id == id })
      #expect(record.runAt == runAt)
      #expect(record.createdAt == runAt)
    }
    #expect(millis(Date(timeIntervalSince1970: 1.0004)) == 1000)
    #expect(date(1_700_000_000_123) == Date(timeIntervalSince1970: 1_700_000_000.123))
  }

  @Test func settlementsApplyOnlyToTheCurrentClaim() async throws {
    let folder = try TemporaryFolder()
    let store = try makeStore(folder)
    let ids = try await store.enqueue(
      (0..<4).map { NewJob(payload: payload("\($0)"), runAt: epoch) }, queue: "jobs", now: epoch
    ).map(\.id)
    let claimed = try await store.settleAndClaim([], queue: "jobs", limit: 4, lease: lease(), now: epoch)
      .claimed
    #expect(claimed.map(\.id) == ids)
    let later = epoch.addingTimeInterval(1)
    var forged = claimed[3].claim
    forged.token += 7
    let batch = try await store.settleAndClaim(
      [
        JobSettlement(claim: claimed[0].claim, action: .complete),
        JobSettlement(claim: claimed[1].claim, action: .retry(after: .seconds(29), error: "boom")),
        JobSettlement(claim: claimed[2].claim, action: .kill(error: "bad")),
        JobSettlement(claim: forged, action: .complete),
        JobSettlement(claim: ClaimReference(id: JobID(999), token: 1), action: .complete),
      ], queue: "jobs", limit: 10, lease: lease(), now: later)
    #expect(batch.staleSettlements == [forged, ClaimReference(id: JobID(999), token: 1)])
    #expect(batch.claimed.isEmpty)
    let every = try await store.jobs(queue: "jobs", status: nil, after: nil, limit: 10)
    #expect(every.map(\.id) == ids)
    #expect(every[0].status == .completed)
    let all = Array(every.dropFirst())
    #expect(all[0].status == .pending && all[0].lastError == "boom" && all[0].attempts == 1)
    #expect(
      all[0].runAt == epoch.addingTimeInterval(30) && all[0].leaseOwner == nil && all[0].leaseExpiresAt == nil
    )
    #expect(all[1].status == .dead && all[1].lastError == "bad")
    #expect(all[2].status == .running && all[2].leaseOwner == "w1")
  }

  @Test func pauseIsStoredAndStopsClaims() async throws {
    let folder = try TemporaryFolder()
    let store = try makeStore(folder)
    _ = try await store.enqueue([NewJob(payload: payload("a"), runAt: epoch)], queue: "jobs", now: epoch)
    try await store.setPaused(true, queue: "jobs")
    try await store.setPaused(true, queue: "idle")
    #expect(try await store.isPaused(queue: "jobs"))
    // Another connection on the same file sees the flag.
    let other = try makeStore(folder)
    #expect(try await other.isPaused(queue: "jobs"))
    #expect(
      try await other.settleAndClaim([], queue: "jobs", limit: 5, lease: lease(), now: epoch).claimed.isEmpty)
    #expect(try await store.queueNames() == ["idle", "jobs"])
    try await other.setPaused(false, queue: "jobs")
    try await other.setPaused(false, queue: "idle")
    #expect(try await store.isPaused(queue: "jobs") == false)
    #expect(try await store.queueNames() == ["jobs"])
    #expect(
      try await store.settleAndClaim([], queue: "jobs", limit: 5, lease: lease(), now: epoch).claimed.count
        == 1)
  }

  @Test func removeClearAndRequeue() async throws {
    let folder = try TemporaryFolder()
    let store = try makeStore(folder)
    let ids = try await store.enqueue(
      (0..<6).map { NewJob(payload: payload("\($0)"), runAt: epoch) }, queue: "jobs", now: epoch
    ).map(\.id)
    _ = try await store.enqueue([NewJob(payload: payload("other"), runAt: epoch)], queue: "other", now: epoch)
    let claimed = try await store.settleAndClaim([], queue: "jobs", limit: 3, lease: lease(), now: epoch)
    _ = try await store.settleAndClaim(
      claimed.claimed[0..<2].map { JobSettlement(claim: $0.claim, action: .kill(error: "x")) }, queue: "jobs",
      limit: 0, lease: lease(), now: epoch)
    #expect(try await store.counts(queue: "jobs", now: epoch) == JobCounts(ready: 3, running: 1, dead: 2))
    #expect(try await store.requeueDead([ids[0], ids[3]], queue: "jobs", now: epoch) == 1)
    #expect(try await store.remove([ids[5], JobID(999)], queue: "jobs") == 1)
    #expect(try await store.remove([ids[4]], queue: "other") == 0)
    #expect(try await store.counts(queue: "jobs", now: epoch) == JobCounts(ready: 3, running: 1, dead: 1))
    #expect(try await store.requeueDead(nil, queue: "jobs", now: epoch) == 1)
    let requeued = try await store.jobs(queue: "jobs", status: .pending, after: nil, limit: 2)
    #expect(requeued.map(\.id) == [ids[0], ids[1]] && requeued.allSatisfy { $0.attempts == 0 })
    #expect(try await store.clear(queue: "jobs", statuses: [.pending]) == 4)
    #expect(try await store.clear(queue: "jobs", statuses: [.running, .dead]) == 1)
    #expect(try await store.counts(queue: "jobs", now: epoch).total == 0)
    #expect(try await store.counts(queue: "other", now: epoch).ready == 1)
    #expect(try await store.queueNames() == ["other"])
    #expect(try await store.nextWake(queue: "jobs").isFinished)
  }

  @Test func listingIsPaged() async throws {
    let folder = try TemporaryFolder()
    let store = try makeStore(folder)
    let ids = try await store.enqueue(
      (0..<2_500).map { NewJob(payload: payload("\($0)"), priority: $0 % 3, runAt: epoch) }, queue: "jobs",
      now: epoch
    ).map(\.id)
    var seen: [JobID] = []
    var after: JobID?
    while true {
      let page = try await store.jobs(queue: "jobs", status: .pending, after: after, limit: 100)
      #expect(page.count <= 100)
      guard let last = page.last else { break }
      seen += page.map(\.id)
      after = last.id
    }
    #expect(seen == ids)
    // Claims are bounded by the limit too.
    #expect(
      try await store.settleAndClaim([], queue: "jobs", limit: 7, lease: lease(), now: epoch).claimed.count
        == 7)
    #expect(try await store.jobs(queue: "jobs", status: .running, after: nil, limit: 100).count == 7)
  }

  @Test func statementsUseTheirIndexesAndNeverSortOrScanTheTable() throws {
    let folder = try TemporaryFolder()
    let store = try makeStore(folder)
    _ = store
    var db: OpaquePointer?
    #expect(sqlite3_open(folder.path("jobs.sqlite"), &db) == SQLITE_OK)
    defer { sqlite3_close(db) }
    func plan(_ sql: String) -> String {
      var statement: OpaquePointer?
      sqlite3_prepare_v2(db, "EXPLAIN QUERY PLAN " + sql, -1, &statement, nil)
      defer { sqlite3_finalize(statement) }
      var lines: [String] = []
      while sqlite3_step(statement) == SQLITE_ROW {
        lines.append(String(cString: sqlite3_column_text(statement, 3)))
      }
      return lines.joined(separator: "; ")
    }
    let expectations: [(String, String)] = [
      (SQL.selectReady, "jobs_ready"), (SQL.anyReady, "jobs_"), (SQL.promote, "jobs_scheduled"),
      (SQL.nextScheduled, "jobs_scheduled"), (SQL.countDue, "jobs_scheduled"),
      (SQL.findDuplicate, "jobs_dedup"), (SQL.rescue, "jobs_running"), (SQL.nextExpiry, "jobs_running"),
      (SQL.count("dead"), "jobs_dead"), (SQL.count("running"), "jobs_running"),
      (SQL.count("ready"), "jobs_ready"),
      (SQL.count("scheduled"), "jobs_scheduled"), (SQL.list(.running), "jobs_running"),
      (SQL.list(.dead), "jobs_dead"), (ListingSQL.windowed(.pending), "PRIMARY KEY"),
      (ListingSQL.windowed(nil), "PRIMARY KEY"), (ListingSQL.windowEnd, "PRIMARY KEY"),
      (SQL.queueNames, "jobs_dead"), (SQL.count("completed"), "jobs_completed"),
      (SQL.count("cancelled"), "jobs_cancelled"), (SQL.history(.completed, after: false), "jobs_completed"),
      (SQL.history(.completed, after: true), "jobs_completed"),
      (SQL.history(.cancelled, after: true), "jobs_cancelled"), (SQL.prune("completed"), "jobs_completed"),
      (SQL.prune("cancelled"), "jobs_cancelled"), (SQL.prune("dead"), "jobs_dead_finished"),
      (SQL.pruneAll("completed"), "jobs_completed"), (SQL.finishedAt, "PRIMARY KEY"),
    ]
    for (sql, index) in expectations {
      let shown = plan(sql)
      #expect(shown.contains(index), "\(sql): \(shown)")
      #expect(!shown.contains("TEMP B-TREE"), "\(sql): \(shown)")
      // Listings walk the table by rowid from `after` (a SEARCH on the primary key, not a SCAN).
      #expect(!shown.contains("SCAN jobs"), "\(sql): \(shown)")
    }
    // A listing's second step reads the queue's own partial indexes and sorts their IDs: the one
    // sort, bounded by the queue's waiting jobs (never another queue's rows).
    for status in [JobStatus.pending, nil] {
      let shown = plan(ListingSQL.idsAfter(status))
      #expect(
        shown.contains("jobs_ready (queue=?)") && shown.contains("jobs_scheduled (queue=?)"), "\(shown)")
      #expect(!shown.contains("SCAN jobs"), "\(shown)")
    }
  }

  @Test func aBacklogOfManyPriorityLevelsAndFutureJobsCostsAClaimNoMoreThanOneLevel() async throws {
    // Counted in SQLite virtual-machine steps (not time): a claim with 20,000 not-yet-due jobs on
    // 10,000 priority levels runs about as many steps as a claim on a queue of one job.
    let folder = try TemporaryFolder()
    let store = try makeStore(folder)
    _ = try await store.enqueue([NewJob(payload: payload("now"), runAt: epoch)], queue: "jobs", now: epoch)
    let small = try await store.claimSteps(queue: "jobs", now: epoch)
    _ = try await store.enqueue(
      (0..<20_000).map {
        NewJob(payload: payload("later"), priority: $0 % 10_000, runAt: epoch.addingTimeInterval(3_600))
      } + [NewJob(payload: payload("now"), runAt: epoch)], queue: "jobs", now: epoch)
    let large = try await store.claimSteps(queue: "jobs", now: epoch)
    #expect(large < small * 2 + 100, "steps: \(small) with one job, \(large) with 20,000 scheduled")
  }

  @Test func aHundredThousandBlockedOrderingKeysCostAClaimNothing() async throws {
    // Counted in SQLite virtual-machine steps (not time): 100,000 ordering keys whose heads wait
    // for a retry an hour away, each with a held job behind it, and 1,000 keys whose head is
    // dead with a held job behind it, cost a claim no more than a queue of one ready job. Held
    // jobs are in no index a claim reads.
    let folder = try TemporaryFolder()
    let store = try makeStore(folder)
    _ = try await store.enqueue([NewJob(payload: payload("now"), runAt: epoch)], queue: "jobs", now: epoch)
    let small = try await store.claimSteps(queue: "jobs", now: epoch)
    for batch in stride(from: 0, to: 100_000, by: 5_000) {
      _ = try await store.enqueue(
        (batch..<batch + 5_000).flatMap { key in
          [
            NewJob(payload: payload("head"), runAt: epoch.addingTimeInterval(3_600), orderingKey: "k\(key)"),
            NewJob(payload: payload("next"), runAt: epoch, orderingKey: "k\(key)"),
          ]
        }, queue: "jobs", now: epoch)
    }
    _ = try await store.enqueue(
      (0..<1_000).flatMap { key in
        [
          NewJob(payload: payload("dies"), runAt: epoch, orderingKey: "dead\(key)"),
          NewJob(payload: payload("next"), runAt: epoch, orderingKey: "dead\(key)"),
        ]
      }, queue: "jobs", now: epoch)
    let claimed = try await store.settleAndClaim([], queue: "jobs", limit: 1_001, lease: lease(), now: epoch)
    #expect(claimed.claimed.count == 1_001, "the first job and the 1,000 heads that die")
    _ = try await store.settleAndClaim(
      claimed.claimed.filter { $0.orderingKey != nil }.map {
        JobSettlement(claim: $0.claim, action: .kill(error: "no"))
      }, queue: "jobs", limit: 0, lease: lease(), now: epoch)
    _ = try await store.enqueue([NewJob(payload: payload("now"), runAt: epoch)], queue: "jobs", now: epoch)
    let counts = try await store.counts(queue: "jobs", clock: FixedJobClock(epoch))
    #expect(counts.held == 101_000 && counts.dead == 1_000 && counts.ready == 1, "\(counts)")
    let large = try await store.claimSteps(queue: "jobs", now: epoch)
    #expect(large < small * 2 + 100, "steps: \(small) with one job, \(large) with 101,000 keys blocked")
  }

  /// Under `limits`, 100,000 limit keys each with a job running and one held behind it cost a
  /// claim no more VM steps than a queue of one ready job under the same limits (`held`: what
  /// holds them, for the message). Held jobs are in no index a claim reads.
  private func expectHeldKeysCostAClaimNothing(_ limits: QueueLimits, held: String) async throws {
    let folder = try TemporaryFolder()
    let store = try makeStore(folder)
    try await store.setLimits(limits, queue: "jobs")
    _ = try await store.enqueue(
      [NewJob(payload: payload("now"), runAt: epoch, limitKey: "free")], queue: "jobs", now: epoch)
    let small = try await store.claimSteps(queue: "jobs", now: epoch)
    _ = try await store.settleAndClaim([], queue: "jobs", limit: 1, lease: lease(), now: epoch)
    for batch in stride(from: 0, to: 100_000, by: 5_000) {
      _ = try await store.enqueue(
        (batch..<batch + 5_000).flatMap { key in
          [
            NewJob(payload: payload("runs"), runAt: epoch, limitKey: "k\(key)"),
            NewJob(payload: payload("held"), runAt: epoch, limitKey: "k\(key)"),
          ]
        }, queue: "jobs", now: epoch)
      _ = try await store.settleAndClaim([], queue: "jobs", limit: 10_000, lease: lease(), now: epoch)
    }
    _ = try await store.enqueue(
      [NewJob(payload: payload("now"), runAt: epoch, limitKey: "other")], queue: "jobs", now: epoch)
    let counts = try await store.counts(queue: "jobs", clock: FixedJobClock(epoch))
    #expect(counts.held == 100_000 && counts.running == 100_001 && counts.ready == 1, "\(counts)")
    let large = try await store.claimSteps(queue: "jobs", now: epoch)
    #expect(large < small * 2 + 100, "steps: \(small) with one job, \(large) with 100,000 keys \(held)")
  }

  @Test func aHundredThousandKeysAtTheirLimitCostAClaimNothing() async throws {
    // Counted in SQLite virtual-machine steps (not time), at a limit of 1 per key.
    try await expectHeldKeysCostAClaimNothing(QueueLimits(keyConcurrency: 1), held: "at their limit")
  }

  @Test func aHundredThousandKeysHeldByTheirRateCostAClaimNothing() async throws {
    // Counted in SQLite virtual-machine steps (not time), at a rate of one start a day per key:
    // each key's start is taken, its held job due in a day. The claim looks for keys due in an
    // index of due times.
    try await expectHeldKeysCostAClaimNothing(
      QueueLimits(keyRate: RateLimit(perSecond: RateLimit.minimumPerSecond)), held: "held by their rate")
  }

  /// The VM steps of adding one ready job with `fairnessKey` to queue `jobs` (its turn taken by
  /// the insert's trigger), undone after.
  private func addSteps(_ store: SQLiteJobStore, fairnessKey: String) async throws -> Int {
    try await store.connection.perform { db in
      let insert = try db.statement(SQL.insert)
      _ = sqlite3_stmt_status(insert.handle, SQLITE_STMTSTATUS_VM_STEP, 1)
      try db.execute("SAVEPOINT measure")
      defer { try? db.execute("ROLLBACK TO measure; RELEASE measure") }
      let time = Int64(epoch.timeIntervalSince1970 * 1_000)
      try db.run(
        SQL.insert, .text("jobs"), .blob(Data("{}".utf8)), .text("ready"), .integer(0), .integer(time),
        .integer(time), .null, .null, .null, .null, .null, .text(fairnessKey))
      return Int(sqlite3_stmt_status(insert.handle, SQLITE_STMTSTATUS_VM_STEP, 1))
    }
  }

  @Test func aHundredThousandFairnessKeysWithBacklogsCostAClaimAndAnAddNothing() async throws {
    // Counted in SQLite virtual-machine steps (not time): 100,000 fairness keys with two ready
    // jobs each cost a claim no more than a queue of one ready job, and the add of a job (whose
    // trigger looks up the head of the queue, the latest turn and its key's turn) about as much as
    // into an empty queue. Claims read the ready index in place order, as without keys.
    let folder = try TemporaryFolder()
    let store = try makeStore(folder)
    _ = try await store.enqueue(
      [NewJob(payload: payload("now"), runAt: epoch, fairnessKey: "first")], queue: "jobs", now: epoch)
    let smallClaim = try await store.claimSteps(queue: "jobs", now: epoch)
    let smallAdd = try await addSteps(store, fairnessKey: "k7")
    for batch in stride(from: 0, to: 100_000, by: 5_000) {
      _ = try await store.enqueue(
        (batch..<batch + 5_000).flatMap { key in
          (0..<2).map { _ in NewJob(payload: payload("\(key)"), runAt: epoch, fairnessKey: "k\(key)") }
        }, queue: "jobs", now: epoch)
    }
    let counts = try await store.counts(queue: "jobs", clock: FixedJobClock(epoch))
    #expect(counts.ready == 200_001, "\(counts)")
    let largeClaim = try await store.claimSteps(queue: "jobs", now: epoch)
    #expect(
      largeClaim < smallClaim * 2 + 100,
      "claim steps: \(smallClaim) with one job, \(largeClaim) with 100,000 keys")
    let largeAdd = try await addSteps(store, fairnessKey: "k7")
    #expect(
      largeAdd < smallAdd * 2 + 100, "add steps: \(smallAdd) into one job, \(largeAdd) beside 100,000 keys")
    // The turns alternate keys: the first claims take one job of each key before any second.
    let batch = try await store.settleAndClaim([], queue: "jobs", limit: 4, lease: lease(), now: epoch)
    #expect(
      batch.claimed.map(\.fairnessKey) == ["first", "k0", "k1", "k2"],
      "\(batch.claimed.map(\.fairnessKey))")
  }

  @Test func aLimitLoweredFarBelowTheRunningJobsCostsAClaimTheLimitsWorth() async throws {
    // Counted in SQLite virtual-machine steps: with 20,000 jobs running and the limit lowered
    // to 2, a claim's count of the running jobs reads about as much as with 2 running.
    let folder = try TemporaryFolder()
    let store = try makeStore(folder)
    _ = try await store.enqueue(
      (0..<2).map { NewJob(payload: payload("\($0)"), runAt: epoch) }, queue: "jobs", now: epoch)
    _ = try await store.settleAndClaim([], queue: "jobs", limit: 2, lease: lease(), now: epoch)
    try await store.setLimits(QueueLimits(concurrency: 2), queue: "jobs")
    let small = try await store.runningCountSteps(queue: "jobs")
    try await store.setLimits(QueueLimits(), queue: "jobs")
    _ = try await store.enqueue(
      (0..<20_000).map { NewJob(payload: payload("\($0)"), runAt: epoch) }, queue: "jobs", now: epoch)
    _ = try await store.settleAndClaim([], queue: "jobs", limit: 20_000, lease: lease(), now: epoch)
    try await store.setLimits(QueueLimits(concurrency: 2), queue: "jobs")
    #expect(try await store.counts(queue: "jobs", now: epoch).running == 20_002)
    let large = try await store.runningCountSteps(queue: "jobs")
    #expect(small > 0 && large < small * 2 + 20, "steps: \(small) with 2 running, \(large) with 20,002")
    let batch = try await store.settleAndClaim([], queue: "jobs", limit: 5, lease: lease(), now: epoch)
    #expect(batch.claimed.isEmpty && batch.full, "nothing claimed past the limit: \(batch)")
  }

  @Test func statementsArePreparedOnce() async throws {
    let folder = try TemporaryFolder()
    let store = try makeStore(folder)
    var counts: [Int] = []
    for round in 0..<20 {
      _ = try await store.enqueue(
        [NewJob(payload: payload("\(round)"), runAt: epoch)], queue: "jobs", now: epoch)
      _ = try await store.settleAndClaim([], queue: "jobs", limit: 1, lease: lease(), now: epoch)
      counts.append(try await store.cachedStatementCount())
    }
    // Prepared on the first round and reused: the cache neither stays empty nor grows.
    #expect(counts[0] > 0)
    #expect(Set(counts) == [counts[0]], "cached statements per round: \(counts)")
  }

  @Test func cancellationBeforeStartThrows() async throws {
    let folder = try TemporaryFolder()
    let store = try makeStore(folder)
    let task = Task {
      withUnsafeCurrentTask { $0?.cancel() }
      return try await store.counts(queue: "jobs", now: epoch)
    }
    await #expect(throws: CancellationError.self) { try await task.value }
    // The store still works afterwards.
    #expect(try await store.counts(queue: "jobs", now: epoch).total == 0)
  }

  /// Failed before the fix (SQLite can report `SQLITE_INTERRUPT` from a `COMMIT` that
  /// committed, when the progress handler runs at its end; see `InterruptFlag`).
  /// A cancelled call interrupts its statement and nothing is committed. An add whose
  /// task is cancelled mid-transaction either commits and returns, or throws `CancellationError`
  /// and leaves nothing behind.
  @Test(.timeLimit(.minutes(10))) func aCancelledAddThatThrowsCommittedNothing() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("cancel-add.sqlite")
    let store = try SQLiteJobStore(path: path)
    var cancelled: [String] = []
    var returned = 0
    for index in 0..<3_000 {
      let outcome = await Task { () -> Bool? in
        do {
          _ = try await store.enqueue(
            [NewJob(payload: payload("job-\(index)"), runAt: epoch)], queue: "jobs", clock: CancellingClock())
          return false
        } catch is CancellationError {
          return true
        } catch {
          Issue.record("add \(index) failed with \(error)")
          return nil
        }
      }.value
      if outcome == true { cancelled.append("job-\(index)") }
      if outcome == false { returned += 1 }
    }
    let stored = Set(try storedPayloads(path))
    let committedAnyway = cancelled.filter(stored.contains)
    #expect(
      committedAnyway.isEmpty,
      """
      \(committedAnyway.count) of \(cancelled.count) adds that threw CancellationError were committed \
      (\(committedAnyway.prefix(5))); \(returned) returned normally
      """)
    await store.close()
  }

  /// Failed before the fix, as above.
  /// The same for claims: a claim that throws `CancellationError` claimed nothing, so the running
  /// count equals the jobs the returned batches hold.
  @Test(.timeLimit(.minutes(10))) func aCancelledClaimThatThrowsClaimedNothing() async throws {
    let folder = try TemporaryFolder()
    let store = try SQLiteJobStore(path: folder.path("cancel-claim.sqlite"))
    let jobs = (0..<1_500).map { NewJob(payload: payload("\($0)"), runAt: epoch) }
    _ = try await store.enqueue(jobs, queue: "jobs", now: epoch)
    var claimedByCallers = 0
    var threw = 0
    for _ in 0..<1_500 {
      let claimed = await Task { () -> Int? in
        do {
          return try await store.settleAndClaim(
            [], queue: "jobs", limit: 1, lease: lease(), clock: CancellingClock()
          ).claimed.count
        } catch is CancellationError {
          return nil
        } catch {
          Issue.record("claim failed with \(error)")
          return nil
        }
      }.value
      if let claimed { claimedByCallers += claimed } else { threw += 1 }
    }
    let running = try await store.counts(queue: "jobs", now: epoch).running
    #expect(
      running == claimedByCallers,
      """
      \(running) jobs are running but the callers got \(claimedByCallers) \
      (\(threw) claims threw CancellationError): \(running - claimedByCallers) claims were \
      committed for callers told they were cancelled
      """)
    await store.close()
  }

  // Retry dates on SQLite: exactly the applied retries, each the stored run date, with clamped
  // delays at a clock near the latest date a store keeps.
  @Test(.timeLimit(.minutes(10))) func retryDatesAreTheStoredRunDates() async throws {
    let folder = try TemporaryFolder()
    let store = try makeStore(folder)
    for base in [JobStoreTime.latest.addingTimeInterval(-86_400.4567), epoch.addingTimeInterval(0.0006)] {
      let clock = FixedJobClock(base)
      _ = try await store.enqueue(
        (0..<9).map { NewJob(payload: payload("j\($0)"), runAt: epoch) }, queue: "r", clock: clock)
      let claimed = try await store.settleAndClaim([], queue: "r", limit: 9, lease: lease(), clock: clock)
        .claimed
      #expect(claimed.count == 9)
      let refs = claimed.map { ClaimReference(id: $0.id, token: $0.claimToken) }
      let actions: [JobSettlement.Action] = [
        .retry(after: .zero, error: "e"), .retry(after: .milliseconds(1500), error: nil),
        .retry(after: .seconds(Int64.max), error: nil),
        .retry(after: .seconds(86_400 * 365 * 200), error: nil),
        .retry(after: .seconds(-5), error: nil), .complete, .kill(error: "k"), .release(error: nil),
      ]
      var settlements = zip(refs, actions).map { JobSettlement(claim: $0, action: $1) }
      settlements.append(
        JobSettlement(
          claim: ClaimReference(id: refs[8].id, token: refs[8].token + 7),
          action: .retry(after: .seconds(1), error: nil)))
      let batch = try await store.settleAndClaim(
        settlements, queue: "r", limit: 0, lease: lease(), clock: clock)
      let retried = Set(refs[0..<5].map(\.id))
      #expect(Set(batch.retryDates.keys) == retried)
      #expect(batch.staleSettlements == [ClaimReference(id: refs[8].id, token: refs[8].token + 7)])
      for id in retried {
        let stored = try await store.job(id)?.runAt
        #expect(batch.retryDates[id] == stored, "job \(id)")
      }
      _ = try await store.clear(queue: "r", statuses: Set(JobStatus.allCases))
    }
    await store.close()
  }
}
