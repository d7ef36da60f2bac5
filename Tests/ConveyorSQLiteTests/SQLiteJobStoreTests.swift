import CSQLite
import Conveyor
import ConveyorTestSupport
import Foundation
import Testing

@testable import ConveyorSQLite

@Suite("SQLiteJobStore")
struct SQLiteJobStoreTests {
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
    #expect(try await store.nextWakeDate(queue: "jobs") == epoch.addingTimeInterval(10))
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

  @Test func deduplicationKeys() async throws {
    let folder = try TemporaryFolder()
    let store = try makeStore(folder)
    let first = try await store.enqueue(
      [
        NewJob(payload: payload("a"), runAt: epoch, deduplicationKey: "k"),
        NewJob(payload: payload("b"), runAt: epoch, deduplicationKey: "k"),
        NewJob(payload: payload("c"), runAt: epoch, deduplicationKey: "other"),
      ], queue: "jobs", now: epoch)
    #expect(first.map(\.inserted) == [true, false, true])
    #expect(first[1].id == first[0].id)
    // Another queue has its own keys.
    #expect(
      try await store.enqueue(
        [NewJob(payload: payload("d"), runAt: epoch, deduplicationKey: "k")], queue: "q2", now: epoch)[0]
        .inserted)
    // Running jobs still deduplicate; handled ones no longer do.
    let claimed = try await store.settleAndClaim([], queue: "jobs", limit: 1, lease: lease(), now: epoch)
      .claimed
    #expect(claimed.map(\.id) == [first[0].id])
    #expect(
      try await store.enqueue(
        [NewJob(payload: payload("e"), runAt: epoch, deduplicationKey: "k")], queue: "jobs", now: epoch)[0]
        == EnqueueResult(id: first[0].id, inserted: false))
    _ = try await store.settleAndClaim(
      [JobSettlement(id: first[0].id, owner: "w1", action: .complete)], queue: "jobs", limit: 0,
      lease: lease(), now: epoch)
    let again = try await store.enqueue(
      [NewJob(payload: payload("f"), runAt: epoch, deduplicationKey: "k")], queue: "jobs", now: epoch)[0]
    #expect(again.inserted && again.id > first[2].id)
  }

  @Test func settlementsApplyOnlyForTheLeaseOwner() async throws {
    let folder = try TemporaryFolder()
    let store = try makeStore(folder)
    let ids = try await store.enqueue(
      (0..<4).map { NewJob(payload: payload("\($0)"), runAt: epoch) }, queue: "jobs", now: epoch
    ).map(\.id)
    let claimed = try await store.settleAndClaim([], queue: "jobs", limit: 4, lease: lease(), now: epoch)
      .claimed
    #expect(claimed.map(\.id) == ids)
    let later = epoch.addingTimeInterval(1)
    let batch = try await store.settleAndClaim(
      [
        JobSettlement(id: ids[0], owner: "w1", action: .complete),
        JobSettlement(
          id: ids[1], owner: "w1", action: .retry(at: epoch.addingTimeInterval(30), error: "boom")),
        JobSettlement(id: ids[2], owner: "w1", action: .kill(error: "bad")),
        JobSettlement(id: ids[3], owner: "intruder", action: .complete),
        JobSettlement(id: JobID(999), owner: "w1", action: .complete),
      ], queue: "jobs", limit: 10, lease: lease(), now: later)
    #expect(batch.staleSettlements == [ids[3], JobID(999)])
    #expect(batch.claimed.isEmpty)
    let all = try await store.jobs(queue: "jobs", status: nil, after: nil, limit: 10)
    #expect(all.map(\.id) == [ids[1], ids[2], ids[3]])
    #expect(all[0].status == .pending && all[0].lastError == "boom" && all[0].attempts == 1)
    #expect(
      all[0].runAt == epoch.addingTimeInterval(30) && all[0].leaseOwner == nil && all[0].leaseExpiresAt == nil
    )
    #expect(all[1].status == .dead && all[1].lastError == "bad")
    #expect(all[2].status == .running && all[2].leaseOwner == "w1")

    // Release gives the attempt back.
    let released = try await store.settleAndClaim(
      [JobSettlement(id: ids[3], owner: "w1", action: .release)], queue: "jobs", limit: 0, lease: lease(),
      now: later)
    #expect(released.staleSettlements.isEmpty)
    let record = try #require(
      try await store.jobs(queue: "jobs", status: .pending, after: ids[2], limit: 10).first)
    #expect(record.id == ids[3] && record.attempts == 0 && record.status == .pending)
  }

  @Test func heartbeatAndRescue() async throws {
    let folder = try TemporaryFolder()
    let store = try makeStore(folder)
    let ids = try await store.enqueue(
      (0..<2).map { NewJob(payload: payload("\($0)"), runAt: epoch) }, queue: "jobs", now: epoch
    ).map(\.id)
    _ = try await store.settleAndClaim(
      [], queue: "jobs", limit: 2, lease: lease(until: epoch.addingTimeInterval(5)), now: epoch)
    let held = try await store.heartbeat(
      ids + [JobID(12345)], queue: "jobs", lease: lease(until: epoch.addingTimeInterval(20)))
    #expect(held == ids)
    #expect(try await store.heartbeat(ids, queue: "jobs", lease: lease("other")).isEmpty)
    #expect(try await store.nextWakeDate(queue: "jobs") == epoch.addingTimeInterval(20))
    #expect(try await store.rescueExpiredLeases(queue: "jobs", now: epoch.addingTimeInterval(10)) == 0)
    let rescueTime = epoch.addingTimeInterval(21)
    #expect(try await store.rescueExpiredLeases(queue: "jobs", now: rescueTime) == 2)
    let records = try await store.jobs(queue: "jobs", status: .pending, after: nil, limit: 10)
    #expect(records.map(\.attempts) == [1, 1])
    #expect(records.allSatisfy { $0.runAt == rescueTime && $0.leaseOwner == nil })
    // The old owner's settlement is now stale; a new claim raises attempts again.
    let batch = try await store.settleAndClaim(
      [JobSettlement(id: ids[0], owner: "w1", action: .complete)], queue: "jobs", limit: 1,
      lease: lease("w2", until: rescueTime.addingTimeInterval(60)), now: rescueTime)
    #expect(batch.staleSettlements == [ids[0]])
    #expect(batch.claimed.map(\.attempts) == [2])
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
    _ = try await store.settleAndClaim([], queue: "jobs", limit: 3, lease: lease(), now: epoch)
    _ = try await store.settleAndClaim(
      ids[0..<2].map { JobSettlement(id: $0, owner: "w1", action: .kill(error: "x")) }, queue: "jobs",
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
    #expect(try await store.nextWakeDate(queue: "jobs") == nil)
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

  @Test func listingQueriesUseIndexesNotSorts() throws {
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
    #expect(plan(SQL.list(.running)).contains("jobs_lease"), "\(plan(SQL.list(.running)))")
    for status in [nil, JobStatus.pending, .dead] {
      #expect(!plan(SQL.list(status)).contains("TEMP B-TREE"), "\(status as Any): \(plan(SQL.list(status)))")
    }
    #expect(plan(SQL.selectReady).contains("jobs_ready"))
    #expect(!plan(SQL.selectReady).contains("TEMP B-TREE"))
    // The claim seeks to one priority level and a run-date range: it never scans later jobs.
    #expect(
      plan(SQL.selectReady).contains("priority=? AND run_at<?"), "\(plan(SQL.selectReady))")
    #expect(!plan(SQL.topPriority).contains("SCAN"), "\(plan(SQL.topPriority))")
    #expect(!plan(SQL.lowerPriority).contains("SCAN"), "\(plan(SQL.lowerPriority))")
    #expect(plan(SQL.findDuplicate).contains("jobs_dedup"))
    #expect(plan(SQL.rescue).contains("jobs_lease"))
    #expect(!plan(SQL.nextRunAt).contains("SCAN jobs"), "\(plan(SQL.nextRunAt))")
  }

  @Test func nextWakeDateAcrossPriorities() async throws {
    let folder = try TemporaryFolder()
    let store = try makeStore(folder)
    #expect(try await store.nextWakeDate(queue: "jobs") == nil)
    let jobs = [(5, 50.0), (5, 40.0), (-3, 7.0), (0, 30.0), (-3, 9.0), (100, 60.0)].map {
      NewJob(payload: payload("x"), priority: $0.0, runAt: epoch.addingTimeInterval($0.1))
    }
    _ = try await store.enqueue(jobs, queue: "jobs", now: epoch)
    _ = try await store.enqueue([NewJob(payload: payload("y"), runAt: epoch)], queue: "other", now: epoch)
    #expect(try await store.nextWakeDate(queue: "jobs") == epoch.addingTimeInterval(7))
    _ = try await store.settleAndClaim(
      [], queue: "jobs", limit: 10, lease: lease(until: epoch.addingTimeInterval(8)),
      now: epoch.addingTimeInterval(8))
    // Only the -3 job at 9 s is pending now (the one at 7 s runs, its lease ends at 8 s).
    #expect(try await store.nextWakeDate(queue: "jobs") == epoch.addingTimeInterval(8))
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
}
