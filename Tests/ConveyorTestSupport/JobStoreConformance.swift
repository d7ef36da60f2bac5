import Conveyor
import Foundation

/// A failed expectation inside a conformance check.
public struct ConformanceFailure: Error, CustomStringConvertible {
  /// What was expected.
  public var description: String
}

/// One named conformance check, run against a fresh store.
public struct JobStoreCheck: Sendable, CustomStringConvertible {
  /// The check's name, shown by the test runner.
  public var name: String
  /// Runs the check against an empty store; throws ``ConformanceFailure`` on a broken rule.
  public var run: @Sendable (any JobStore) async throws -> Void

  /// The name.
  public var description: String { name }
}

/// The rules every ``JobStore`` follows, written once; each store's tests run every check.
///
/// ```swift
/// @Test(arguments: JobStoreConformance.checks)
/// func conformance(_ check: JobStoreCheck) async throws {
///   try await check.run(makeStore())
/// }
/// ```
public enum JobStoreConformance {
  static let t0 = Date(timeIntervalSince1970: 1_700_000_000)
  static func at(_ seconds: Double) -> Date { t0.addingTimeInterval(seconds) }
  static func lease(_ owner: String = "w1", until seconds: Double = 60) -> Lease {
    Lease(owner: owner, expiresAt: at(seconds))
  }
  static func job(_ text: String, priority: Int = 0, at seconds: Double = 0, key: String? = nil) -> NewJob {
    NewJob(payload: Data(text.utf8), priority: priority, runAt: at(seconds), deduplicationKey: key)
  }
  static func text(_ record: JobRecord) -> String { String(decoding: record.payload, as: UTF8.self) }

  static func expect(
    _ condition: Bool, _ message: @autoclosure () -> String, line: UInt = #line
  ) throws {
    if !condition { throw ConformanceFailure(description: "line \(line): \(message())") }
  }

  static func claim(
    _ store: any JobStore, _ queue: String = "q", limit: Int = 1, settling: [JobSettlement] = [],
    owner: String = "w1", now seconds: Double = 0
  ) async throws -> ClaimBatch {
    try await store.settleAndClaim(
      settling, queue: queue, limit: limit, lease: lease(owner, until: seconds + 60), now: at(seconds))
  }

  static func check(
    _ name: String, _ body: @escaping @Sendable (any JobStore) async throws -> Void
  ) -> JobStoreCheck {
    JobStoreCheck(name: name, run: body)
  }

  /// Every check.
  public static let checks: [JobStoreCheck] = [
    check("enqueue assigns increasing IDs and commits every job") { store in
      let results = try await store.enqueue([job("a"), job("b"), job("c")], queue: "q", now: at(0))
      try expect(results.count == 3 && results.allSatisfy(\.inserted), "three inserted: \(results)")
      try expect(results.map(\.id) == results.map(\.id).sorted(), "IDs increase: \(results)")
      try expect(Set(results.map(\.id)).count == 3, "IDs unique")
      let counts = try await store.counts(queue: "q", now: at(0))
      try expect(counts == JobCounts(ready: 3), "three ready: \(counts)")
      let listed = try await store.jobs(queue: "q", status: nil, after: nil, limit: 10)
      try expect(listed.map(text) == ["a", "b", "c"], "listed in order: \(listed.map(text))")
      try expect(listed.allSatisfy { $0.status == .pending && $0.attempts == 0 }, "pending, no attempts")
      try expect(listed.allSatisfy { $0.createdAt == at(0) && $0.queue == "q" }, "created at now")
    },
    check("an empty batch changes nothing") { store in
      let results = try await store.enqueue([], queue: "q", now: at(0))
      try expect(results.isEmpty, "no results")
      try expect(try await store.counts(queue: "q", now: at(0)) == JobCounts(), "no jobs")
    },
    check("payload bytes and dates round-trip exactly") { store in
      let bytes = Data((0..<256).map { UInt8($0) } + [0, 0, 255])
      let runAt = at(12.345)
      _ = try await store.enqueue(
        [NewJob(payload: bytes, priority: -7, runAt: runAt, deduplicationKey: "k é")], queue: "q",
        now: at(1.5))
      let record = try await store.jobs(queue: "q", status: nil, after: nil, limit: 1).first
      try expect(record?.payload == bytes, "payload bytes intact")
      try expect(record?.runAt == runAt, "run date to the millisecond: \(String(describing: record?.runAt))")
      try expect(record?.createdAt == at(1.5), "created date")
      try expect(record?.priority == -7 && record?.deduplicationKey == "k é", "priority and key")
    },
    check("claims follow priority, then run date, then ID") { store in
      _ = try await store.enqueue(
        [
          job("low", priority: -1), job("late", at: 5), job("first"), job("high", priority: 5),
          job("second"),
        ], queue: "q", now: at(0))
      let batch = try await claim(store, limit: 10, now: 10)
      try expect(
        batch.claimed.map(text) == ["high", "first", "second", "late", "low"],
        "claim order: \(batch.claimed.map(text))")
    },
    check("a claim marks jobs running, counts the attempt and records the lease") { store in
      _ = try await store.enqueue([job("a"), job("b")], queue: "q", now: at(0))
      let batch = try await claim(store, limit: 1, owner: "w7", now: 1)
      let record = try expectOne(batch.claimed)
      try expect(text(record) == "a" && record.status == .running, "a running")
      try expect(record.attempts == 1, "one attempt: \(record.attempts)")
      try expect(record.leaseOwner == "w7" && record.leaseExpiresAt == at(61), "lease recorded")
      let counts = try await store.counts(queue: "q", now: at(1))
      try expect(counts == JobCounts(ready: 1, running: 1), "counts: \(counts)")
      let again = try await claim(store, limit: 5, owner: "w8", now: 1)
      try expect(again.claimed.map(text) == ["b"], "a running job is not claimed twice")
    },
    check("a scheduled job waits for its date and never blocks a ready one") { store in
      _ = try await store.enqueue([job("later", at: 30), job("now")], queue: "q", now: at(0))
      let first = try await claim(store, limit: 5, now: 1)
      try expect(first.claimed.map(text) == ["now"], "only the ready job: \(first.claimed.map(text))")
      let counts = try await store.counts(queue: "q", now: at(1))
      try expect(counts.scheduled == 1 && counts.running == 1, "counts: \(counts)")
      let early = try await claim(store, limit: 5, now: 29.999)
      try expect(early.claimed.isEmpty, "not before its date")
      let due = try await claim(store, limit: 5, now: 30)
      try expect(due.claimed.map(text) == ["later"], "claimed at its date")
    },
    check("limit bounds a claim; limit 0 only settles") { store in
      _ = try await store.enqueue((0..<5).map { job("j\($0)") }, queue: "q", now: at(0))
      let two = try await claim(store, limit: 2)
      try expect(two.claimed.count == 2, "two claimed")
      let settle = two.claimed.map { JobSettlement(id: $0.id, owner: "w1", action: .complete) }
      let none = try await claim(store, limit: 0, settling: settle)
      try expect(none.claimed.isEmpty && none.staleSettlements.isEmpty, "settled only")
      let counts = try await store.counts(queue: "q", now: at(0))
      try expect(counts == JobCounts(ready: 3), "two deleted: \(counts)")
    },
    check("complete deletes; retry reschedules; kill keeps a dead job; release undoes a claim") { store in
      _ = try await store.enqueue(
        [job("done"), job("again"), job("bad"), job("back")], queue: "q", now: at(0))
      let batch = try await claim(store, limit: 4)
      let ids = batch.claimed.map(\.id)
      let settled = try await claim(
        store, limit: 0,
        settling: [
          JobSettlement(id: ids[0], owner: "w1", action: .complete),
          JobSettlement(id: ids[1], owner: "w1", action: .retry(at: at(20), error: "boom")),
          JobSettlement(id: ids[2], owner: "w1", action: .kill(error: "fatal")),
          JobSettlement(id: ids[3], owner: "w1", action: .release),
        ], now: 1)
      try expect(settled.staleSettlements.isEmpty, "all applied")
      let all = try await store.jobs(queue: "q", status: nil, after: nil, limit: 10)
      try expect(all.map(text) == ["again", "bad", "back"], "done deleted: \(all.map(text))")
      let again = all[0]
      try expect(again.status == .pending && again.runAt == at(20), "retry at its date")
      try expect(again.attempts == 1 && again.lastError == "boom", "attempt kept, error recorded")
      try expect(again.leaseOwner == nil && again.leaseExpiresAt == nil, "lease cleared")
      try expect(all[1].status == .dead && all[1].lastError == "fatal", "dead with reason")
      try expect(all[2].status == .pending && all[2].attempts == 0, "released: attempt given back")
      let counts = try await store.counts(queue: "q", now: at(1))
      try expect(counts == JobCounts(ready: 1, scheduled: 1, dead: 1), "counts: \(counts)")
      let next = try await claim(store, limit: 5, now: 1)
      try expect(next.claimed.map(text) == ["back"], "dead and scheduled not claimed")
    },
    check("a settlement from a worker that lost the lease is stale and ignored") { store in
      _ = try await store.enqueue([job("a")], queue: "q", now: at(0))
      let first = try await claim(store, owner: "old", now: 0)
      let id = try expectOne(first.claimed).id
      let rescued = try await store.rescueExpiredLeases(queue: "q", now: at(61))
      try expect(rescued == 1, "one rescued")
      let second = try await claim(store, owner: "new", now: 61)
      try expect(second.claimed.map(\.id) == [id], "handed out again")
      try expect(second.claimed.first?.attempts == 2, "second attempt")
      let stale = try await claim(
        store, limit: 0, settling: [JobSettlement(id: id, owner: "old", action: .complete)], now: 62)
      try expect(stale.staleSettlements == [id], "old owner's settlement is stale")
      let record = try await store.jobs(queue: "q", status: .running, after: nil, limit: 5)
      try expect(record.first?.leaseOwner == "new", "still held by the new owner")
      let removedMeanwhile = try await store.remove([id], queue: "q")
      try expect(removedMeanwhile == 1, "removed")
      let gone = try await claim(
        store, limit: 0, settling: [JobSettlement(id: id, owner: "new", action: .complete)], now: 63)
      try expect(gone.staleSettlements == [id], "settling a removed job is stale")
    },
    check("heartbeat extends only the owner's leases") { store in
      _ = try await store.enqueue([job("a"), job("b")], queue: "q", now: at(0))
      let a = try expectOne(try await claim(store, owner: "w1").claimed).id
      let b = try expectOne(try await claim(store, owner: "w2").claimed).id
      let held = try await store.heartbeat([a, b], queue: "q", lease: Lease(owner: "w1", expiresAt: at(500)))
      try expect(held == [a], "w1 holds only a: \(held)")
      let rescued = try await store.rescueExpiredLeases(queue: "q", now: at(100))
      try expect(rescued == 1, "only b expired")
      let running = try await store.jobs(queue: "q", status: .running, after: nil, limit: 5)
      try expect(running.map(\.id) == [a] && running.first?.leaseExpiresAt == at(500), "a extended")
    },
    check("an expired lease is rescued: the job is ready again and keeps its attempt") { store in
      _ = try await store.enqueue([job("a")], queue: "q", now: at(0))
      _ = try await claim(store, owner: "gone", now: 0)
      try expect(try await store.rescueExpiredLeases(queue: "q", now: at(59)) == 0, "not before expiry")
      try expect(try await store.rescueExpiredLeases(queue: "q", now: at(61)) == 1, "after expiry")
      let record = try await store.jobs(queue: "q", status: .pending, after: nil, limit: 1).first
      try expect(record?.attempts == 1 && record?.leaseOwner == nil, "pending, attempt kept")
      try expect(record.map { $0.runAt <= at(61) } == true, "ready at once")
    },
    check("deduplication keys hold while a job is pending or running") { store in
      let first = try await store.enqueue(
        [job("a", key: "k"), job("b", key: "k"), job("c", key: "other")], queue: "q", now: at(0))
      try expect(first.map(\.inserted) == [true, false, true], "dup in batch: \(first)")
      try expect(first[1].id == first[0].id, "the existing job's ID")
      let other = try await store.enqueue([job("x", key: "k")], queue: "other-queue", now: at(0))
      try expect(other[0].inserted, "keys are per queue")
      let claimed = try expectOne(try await claim(store, limit: 1).claimed)
      let whileRunning = try await store.enqueue([job("d", key: "k")], queue: "q", now: at(0))
      try expect(!whileRunning[0].inserted && whileRunning[0].id == claimed.id, "blocked while running")
      _ = try await claim(
        store, limit: 0, settling: [JobSettlement(id: claimed.id, owner: "w1", action: .kill(error: "x"))])
      let afterDeath = try await store.enqueue([job("e", key: "k")], queue: "q", now: at(0))
      try expect(afterDeath[0].inserted, "a dead job does not block its key")
      let c = try await store.enqueue([job("f", key: "other")], queue: "q", now: at(0))
      try expect(!c[0].inserted, "still pending blocks")
    },
    check("a paused queue settles but claims nothing, and the flag is per queue") { store in
      _ = try await store.enqueue([job("a"), job("b")], queue: "q", now: at(0))
      _ = try await store.enqueue([job("x")], queue: "other", now: at(0))
      let held = try expectOne(try await claim(store).claimed)
      try await store.setPaused(true, queue: "q")
      try expect(try await store.isPaused(queue: "q"), "paused stored")
      try expect(!(try await store.isPaused(queue: "other")), "other not paused")
      let batch = try await claim(
        store, limit: 5, settling: [JobSettlement(id: held.id, owner: "w1", action: .complete)])
      try expect(batch.paused && batch.claimed.isEmpty, "nothing claimed while paused")
      try expect(batch.staleSettlements.isEmpty, "settlement applied")
      try expect(try await store.counts(queue: "q", now: at(0)) == JobCounts(ready: 1), "a completed")
      let other = try await claim(store, "other", limit: 5)
      try expect(other.claimed.count == 1 && !other.paused, "other queue unaffected")
      try await store.setPaused(false, queue: "q")
      let resumed = try await claim(store, limit: 5)
      try expect(resumed.claimed.map(text) == ["b"] && !resumed.paused, "claims after resume")
    },
    check("queues are isolated") { store in
      _ = try await store.enqueue([job("a")], queue: "one", now: at(0))
      _ = try await store.enqueue([job("b")], queue: "two", now: at(0))
      let batch = try await claim(store, "one", limit: 5)
      try expect(batch.claimed.map(text) == ["a"], "only queue one")
      try expect(try await store.clear(queue: "one", statuses: Set(JobStatus.allCases)) == 1, "clear one")
      try expect(try await store.counts(queue: "two", now: at(0)) == JobCounts(ready: 1), "two intact")
      try expect(try await store.queueNames() == ["two"], "names")
    },
    check("listing pages by ID and filters by status") { store in
      let ids = try await store.enqueue((0..<25).map { job("j\($0)") }, queue: "q", now: at(0)).map(\.id)
      var seen: [JobID] = []
      var after: JobID?
      while true {
        let page = try await store.jobs(queue: "q", status: nil, after: after, limit: 10)
        if page.isEmpty { break }
        try expect(page.count <= 10, "page size bounded")
        seen += page.map(\.id)
        after = page.last?.id
      }
      try expect(seen == ids, "every job once, in ID order")
      _ = try await claim(store, limit: 3)
      let running = try await store.jobs(queue: "q", status: .running, after: nil, limit: 100)
      try expect(running.map(\.id) == Array(ids.prefix(3)), "status filter")
      let none = try await store.jobs(queue: "q", status: .dead, after: nil, limit: 100)
      try expect(none.isEmpty, "no dead")
    },
    check("remove and clear delete what they name and report counts") { store in
      let ids = try await store.enqueue((0..<6).map { job("j\($0)") }, queue: "q", now: at(0)).map(\.id)
      let batch = try await claim(store, limit: 2)
      _ = try await claim(
        store, limit: 0,
        settling: [JobSettlement(id: batch.claimed[0].id, owner: "w1", action: .kill(error: "x"))])
      try expect(try await store.remove([ids[5], ids[5], JobID(999_999)], queue: "q") == 1, "remove one")
      try expect(try await store.remove([ids[4]], queue: "other") == 0, "remove is per queue")
      try expect(try await store.clear(queue: "q", statuses: [.dead]) == 1, "clear dead")
      try expect(try await store.counts(queue: "q", now: at(0)) == JobCounts(ready: 3, running: 1), "left")
      try expect(try await store.clear(queue: "q", statuses: [.pending, .running]) == 4, "clear rest")
      try expect(try await store.counts(queue: "q", now: at(0)).total == 0, "empty")
    },
    check("dead jobs can be re-queued, by ID or all, with attempts reset") { store in
      _ = try await store.enqueue((0..<3).map { job("j\($0)") }, queue: "q", now: at(0))
      let batch = try await claim(store, limit: 3)
      _ = try await claim(
        store, limit: 0,
        settling: batch.claimed.map { JobSettlement(id: $0.id, owner: "w1", action: .kill(error: "e")) })
      let pendingJob = try await store.enqueue([job("p")], queue: "q", now: at(0))[0].id
      try expect(
        try await store.requeueDead([batch.claimed[0].id, pendingJob], queue: "q", now: at(5)) == 1, "one")
      let requeued = try await store.jobs(queue: "q", status: .pending, after: nil, limit: 10)
      try expect(requeued.first?.id == batch.claimed[0].id, "first re-queued")
      try expect(requeued.first?.attempts == 0 && requeued.first?.runAt == at(5), "attempts reset, ready now")
      try expect(try await store.requeueDead(nil, queue: "q", now: at(5)) == 2, "the rest")
      try expect(try await store.counts(queue: "q", now: at(5)) == JobCounts(ready: 4), "all pending")
    },
    check("a dead job whose key a live job holds stays dead; of dead twins the oldest goes back") { store in
      let dead = try await store.enqueue(
        [job("a", key: "k"), job("b", key: "twin")], queue: "q", now: at(0)
      ).map(\.id)
      let first = try await claim(store, limit: 2)
      _ = try await claim(
        store, limit: 0,
        settling: first.claimed.map { JobSettlement(id: $0.id, owner: "w1", action: .kill(error: "e")) })
      let live = try await store.enqueue([job("a again", key: "k")], queue: "q", now: at(1))[0]
      try expect(live.inserted, "a dead job holds no key")
      let twin = try await store.enqueue([job("b again", key: "twin")], queue: "q", now: at(1))[0].id
      let second = try await claim(store, limit: 2)
      try expect(second.claimed.map(\.id) == [live.id, twin], "both run")
      _ = try await claim(
        store, limit: 0,
        settling: [JobSettlement(id: twin, owner: "w1", action: .kill(error: "e"))])
      // Now "a" (key k) has a running twin; "b" and "b again" are dead twins.
      let byID = try await store.requeueDead([dead[0]], queue: "q", now: at(5))
      try expect(byID == 0, "held key: stays dead")
      try expect(try await store.requeueDead(nil, queue: "q", now: at(5)) == 1, "one of the twins")
      let pending = try await store.jobs(queue: "q", status: .pending, after: nil, limit: 10)
      try expect(pending.map(\.id) == [dead[1]], "the oldest twin")
      try expect(
        try await store.counts(queue: "q", now: at(5)) == JobCounts(ready: 1, running: 1, dead: 2),
        "the rest stay dead")
    },
    check("nextWakeDate reports the earliest run date or lease expiry") { store in
      try expect(try await store.nextWakeDate(queue: "q") == nil, "empty: nil")
      _ = try await store.enqueue([job("a", at: 50), job("b", at: 20)], queue: "q", now: at(0))
      try expect(try await store.nextWakeDate(queue: "q") == at(20), "earliest run date")
      _ = try await store.settleAndClaim([], queue: "q", limit: 1, lease: lease(until: 30), now: at(25))
      try expect(try await store.nextWakeDate(queue: "q") == at(30), "lease expiry")
      _ = try await store.clear(queue: "q", statuses: [.pending])
      try expect(try await store.nextWakeDate(queue: "q") == at(30), "running only")
    },
    check("queueNames lists queues with jobs or a pause flag") { store in
      _ = try await store.enqueue([job("a")], queue: "b-queue", now: at(0))
      try await store.setPaused(true, queue: "a-queue")
      try expect(try await store.queueNames() == ["a-queue", "b-queue"], "sorted names")
    },
    check("concurrent claimers never receive the same job") { store in
      let total = 300
      _ = try await store.enqueue((0..<total).map { job("j\($0)") }, queue: "q", now: at(0))
      let perWorker = try await withThrowingTaskGroup(of: [JobID].self) { group in
        for worker in 0..<6 {
          group.addTask {
            var mine: [JobID] = []
            var settle: [JobSettlement] = []
            while true {
              let batch = try await store.settleAndClaim(
                settle, queue: "q", limit: 7, lease: lease("w\(worker)"), now: at(0))
              if batch.claimed.isEmpty { return mine }
              mine += batch.claimed.map(\.id)
              settle = batch.claimed.map {
                JobSettlement(id: $0.id, owner: "w\(worker)", action: .complete)
              }
            }
          }
        }
        var all: [[JobID]] = []
        for try await ids in group { all.append(ids) }
        return all
      }
      let flat = perWorker.flatMap { $0 }
      try expect(flat.count == total && Set(flat).count == total, "each job once: \(flat.count)")
      let left = try await store.counts(queue: "q", now: at(0))
      try expect(left.total == 0, "every job completed: \(left)")
    },
  ]

  static func expectOne(_ records: [JobRecord], line: UInt = #line) throws -> JobRecord {
    try expect(records.count == 1, "exactly one record, got \(records.count)", line: line)
    return records[0]
  }
}
