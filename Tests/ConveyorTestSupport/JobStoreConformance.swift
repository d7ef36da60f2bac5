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
  /// A clock showing `at(seconds)`.
  static func now(_ seconds: Double) -> any JobClock { FixedJobClock(at(seconds)) }
  static func lease(_ owner: String = "w1", for seconds: Double = 60) -> Lease {
    Lease(owner: owner, duration: .milliseconds(Int64(seconds * 1000)))
  }
  static func job(_ text: String, priority: Int = 0, at seconds: Double = 0, key: String? = nil) -> NewJob {
    NewJob(payload: Data(text.utf8), priority: priority, runAt: at(seconds), deduplicationKey: key)
  }
  static func settle(_ record: JobRecord, _ action: JobSettlement.Action) -> JobSettlement {
    JobSettlement(claim: record.claim, action: action)
  }
  static func text(_ record: JobRecord) -> String { String(decoding: record.payload, as: UTF8.self) }

  static func expect(
    _ condition: Bool, _ message: @autoclosure () -> String, line: UInt = #line
  ) throws {
    if !condition { throw ConformanceFailure(description: "line \(line): \(message())") }
  }

  static func claim(
    _ store: any JobStore, _ queue: String = "q", limit: Int = 1, settling: [JobSettlement] = [],
    owner: String = "w1", now seconds: Double = 0, leaseFor leaseSeconds: Double = 60
  ) async throws -> ClaimBatch {
    try await store.settleAndClaim(
      settling, queue: queue, limit: limit, lease: lease(owner, for: leaseSeconds), clock: now(seconds))
  }

  static func check(
    _ name: String, _ body: @escaping @Sendable (any JobStore) async throws -> Void
  ) -> JobStoreCheck {
    JobStoreCheck(name: name, run: body)
  }

  /// Every check.
  public static let checks: [JobStoreCheck] =
    [
      check("enqueue assigns increasing IDs and commits every job") { store in
        let results = try await store.enqueue([job("a"), job("b"), job("c")], queue: "q", clock: now(0))
        try expect(results.count == 3 && results.allSatisfy(\.inserted), "three inserted: \(results)")
        try expect(results.map(\.id) == results.map(\.id).sorted(), "IDs increase: \(results)")
        try expect(Set(results.map(\.id)).count == 3, "IDs unique")
        let counts = try await store.counts(queue: "q", clock: now(0))
        try expect(counts == JobCounts(ready: 3), "three ready: \(counts)")
        let listed = try await store.jobs(queue: "q", status: nil, after: nil, limit: 10)
        try expect(listed.map(text) == ["a", "b", "c"], "listed in order: \(listed.map(text))")
        try expect(listed.allSatisfy { $0.status == .pending && $0.attempts == 0 }, "pending, no attempts")
        try expect(listed.allSatisfy { $0.createdAt == at(0) && $0.queue == "q" }, "created at now")
      },
      check("an empty batch changes nothing") { store in
        let results = try await store.enqueue([], queue: "q", clock: now(0))
        try expect(results.isEmpty, "no results")
        try expect(try await store.counts(queue: "q", clock: now(0)) == JobCounts(), "no jobs")
      },
      check("payload bytes and dates round-trip exactly") { store in
        let bytes = Data((0..<256).map { UInt8($0) } + [0, 0, 255])
        let runAt = at(12.345)
        _ = try await store.enqueue(
          [NewJob(payload: bytes, priority: -7, runAt: runAt, deduplicationKey: "k é")], queue: "q",
          clock: now(1.5))
        let record = try await store.jobs(queue: "q", status: nil, after: nil, limit: 1).first
        try expect(record?.payload == bytes, "payload bytes intact")
        try expect(
          record?.runAt == runAt, "run date to the millisecond: \(String(describing: record?.runAt))")
        try expect(record?.createdAt == at(1.5), "created date")
        try expect(record?.priority == -7 && record?.deduplicationKey == "k é", "priority and key")
      },
      check("a job's own time limit round-trips through every insert, listing and claim") { store in
        func limited(_ text: String, _ limit: Duration?, key: String? = nil) -> NewJob {
          NewJob(payload: Data(text.utf8), runAt: at(0), deduplicationKey: key, timeLimit: limit)
        }
        // One job (the single-row insert), a batch that shares everything but the limit, a uniform
        // batch, and a batch with keys: each store has a statement for each.
        _ = try await store.enqueue([limited("one", .milliseconds(1_500))], queue: "q", clock: now(0))
        _ = try await store.enqueue(
          [limited("mixed-a", .seconds(2)), limited("mixed-b", nil)], queue: "q", clock: now(0))
        _ = try await store.enqueue(
          [limited("same-a", .seconds(3)), limited("same-b", .seconds(3))], queue: "q", clock: now(0))
        _ = try await store.enqueue(
          [limited("keyed", .microseconds(400), key: "k"), limited("unkeyed", .seconds(7 * 86_400))],
          queue: "q",
          clock: now(0))
        let expected: [String: Duration?] = [
          "one": .milliseconds(1_500), "mixed-a": .seconds(2), "mixed-b": nil, "same-a": .seconds(3),
          "same-b": .seconds(3), "keyed": .milliseconds(1), "unkeyed": .seconds(7 * 86_400),
        ]
        let listed = try await store.jobs(queue: "q", status: nil, after: nil, limit: 10)
        let claimed = try await claim(store, limit: 10, now: 1).claimed
        for records in [listed, claimed] {
          try expect(records.count == expected.count, "every job: \(records.map(text))")
          for record in records {
            try expect(
              expected[text(record)] == record.timeLimit,
              "\(text(record)): \(String(describing: record.timeLimit))")
          }
        }
        let one = try await store.job(listed[0].id)
        try expect(one?.timeLimit == .milliseconds(1_500), "job(_:): \(String(describing: one?.timeLimit))")
      },
      check("cancel makes waiting and running jobs cancelled, leaves dead ones, and answers for each ID") {
        store in
        let added = try await store.enqueue(
          [job("running"), job("dead"), job("ready"), job("scheduled", at: 3_600), job("other")], queue: "q",
          clock: now(0))
        let ids = added.map(\.id)
        let claimed = try await claim(store, limit: 2, now: 1).claimed
        try expect(claimed.map(text) == ["running", "dead"], "claimed: \(claimed.map(text))")
        _ = try await claim(store, limit: 0, settling: [settle(claimed[1], .kill(error: "boom"))], now: 2)
        let unknown = JobID(ids[4].rawValue + 1_000)
        let results = try await store.cancel(
          [ids[2], ids[3], ids[0], ids[1], unknown, ids[2]], queue: "q", clock: now(4))
        try expect(
          results == [
            .cancelledWaiting, .cancelledWaiting, .cancelledRunning, .alreadyDead, .notFound,
            .alreadyCancelled,
          ],
          "answers: \(results)")
        let counts = try await store.counts(queue: "q", clock: now(4))
        try expect(
          counts == JobCounts(ready: 1, dead: 1, cancelled: 3),
          "the dead job and the untouched one are left, the cancelled ones kept as history: \(counts)")
        for id in [ids[0], ids[2], ids[3]] {
          let record = try await store.job(id)
          try expect(
            record?.status == .cancelled && record?.finishedAt == at(4) && record?.leaseOwner == nil,
            "job \(id) is cancelled at the store's time: \(String(describing: record))")
        }
        try expect(
          try await store.cancel([ids[0]], queue: "q", clock: now(5)) == [.alreadyCancelled],
          "cancelled before")
        // The cancelled running job's outcome is refused.
        let late = try await claim(store, limit: 0, settling: [settle(claimed[0], .complete)], now: 4)
        try expect(late.staleSettlements == [claimed[0].claim], "refused: \(late.staleSettlements)")
        // Another queue's name finds nothing; no queue finds the job wherever it is.
        try expect(
          try await store.cancel([ids[4]], queue: "elsewhere", clock: now(4)) == [.notFound], "another queue")
        try expect(
          try await store.cancel([ids[4]], queue: nil, clock: now(4)) == [.cancelledWaiting], "any queue")
        try expect(
          try await store.cancel([], queue: nil, clock: now(4)).isEmpty, "nothing asked, nothing answered")
      },
      check("cancel answers alreadyDead for a dead job each time its ID is given") { store in
        // The dead job is still there, left as it is: "no such job" would be false, whether the ID
        // comes twice in one call or in two calls.
        let added = try await store.enqueue([job("dead"), job("waiting")], queue: "q", clock: now(0))
        let claimed = try await claim(store, limit: 1, now: 1).claimed
        _ = try await claim(store, limit: 0, settling: [settle(claimed[0], .kill(error: "boom"))], now: 2)
        let dead = added[0].id
        let separately = [
          try await store.cancel([dead], queue: "q", clock: now(4))[0],
          try await store.cancel([dead], queue: "q", clock: now(4))[0],
        ]
        try expect(separately == [.alreadyDead, .alreadyDead], "in two calls: \(separately)")
        let together = try await store.cancel([dead, added[1].id, dead], queue: "q", clock: now(4))
        try expect(together == [.alreadyDead, .cancelledWaiting, .alreadyDead], "in one call: \(together)")
        try expect(try await store.job(dead)?.status == .dead, "the dead job is kept")
      },
      check("currentClaims names the claims still running under their token, reading only") { store in
        _ = try await store.enqueue([job("a"), job("b"), job("c")], queue: "q", clock: now(0))
        let claimed = try await claim(store, limit: 3, now: 1, leaseFor: 1).claimed
        try expect(claimed.count == 3, "three claimed")
        // b is cancelled; c's lease lapses and it is rescued and claimed again (a new token); a's
        // lease lapsed too, but nobody took it: still its claim.
        _ = try await store.cancel([claimed[1].id], queue: "q", clock: now(4))
        _ = try await store.rescueExpiredLeases(queue: "q", clock: now(5))
        let again = try await claim(store, limit: 3, now: 5).claimed
        let c = try expectOne(again.filter { text($0) == "c" })
        let a = try expectOne(again.filter { text($0) == "a" })
        let asked = claimed.map(\.claim) + [a.claim, c.claim]
        let current = try await store.currentClaims(asked, queue: "q")
        try expect(current == [a.claim, c.claim], "only the new claims: \(current)")
        try expect(
          try await store.currentClaims([a.claim], queue: "other").isEmpty,
          "a claim of another queue is not current")
        let counts = try await store.counts(queue: "q", clock: now(5))
        try expect(counts == JobCounts(running: 2, cancelled: 1), "nothing changed: \(counts)")
      },
      check("claims follow priority, then run date, then ID") { store in
        _ = try await store.enqueue(
          [
            job("low", priority: -1), job("late", at: 5), job("first"), job("high", priority: 5),
            job("second"),
          ], queue: "q", clock: now(0))
        let batch = try await claim(store, limit: 10, now: 10)
        try expect(
          batch.claimed.map(text) == ["high", "first", "second", "late", "low"],
          "claim order: \(batch.claimed.map(text))")
      },
      check("a claim marks jobs running, counts the attempt and records the lease") { store in
        _ = try await store.enqueue([job("a"), job("b")], queue: "q", clock: now(0))
        let batch = try await claim(store, limit: 1, owner: "w7", now: 1)
        let record = try expectOne(batch.claimed)
        try expect(text(record) == "a" && record.status == .running, "a running")
        try expect(record.attempts == 1, "one attempt: \(record.attempts)")
        try expect(record.leaseOwner == "w7" && record.leaseExpiresAt == at(61), "lease recorded")
        let counts = try await store.counts(queue: "q", clock: now(1))
        try expect(counts == JobCounts(ready: 1, running: 1), "counts: \(counts)")
        let again = try await claim(store, limit: 5, owner: "w8", now: 1)
        try expect(again.claimed.map(text) == ["b"], "a running job is not claimed twice")
      },
      check("a scheduled job waits for its date and never blocks a ready one") { store in
        _ = try await store.enqueue([job("later", at: 30), job("now")], queue: "q", clock: now(0))
        let first = try await claim(store, limit: 5, now: 1)
        try expect(first.claimed.map(text) == ["now"], "only the ready job: \(first.claimed.map(text))")
        let counts = try await store.counts(queue: "q", clock: now(1))
        try expect(counts.scheduled == 1 && counts.running == 1, "counts: \(counts)")
        let early = try await claim(store, limit: 5, now: 29.999)
        try expect(early.claimed.isEmpty, "not before its date")
        let due = try await claim(store, limit: 5, now: 30)
        try expect(due.claimed.map(text) == ["later"], "claimed at its date")
      },
      check("limit bounds a claim; limit 0 only settles") { store in
        _ = try await store.enqueue((0..<5).map { job("j\($0)") }, queue: "q", clock: now(0))
        let two = try await claim(store, limit: 2)
        try expect(two.claimed.count == 2, "two claimed")
        let settling = two.claimed.map { settle($0, .complete) }
        let none = try await claim(store, limit: 0, settling: settling)
        try expect(none.claimed.isEmpty && none.staleSettlements.isEmpty, "settled only")
        let counts = try await store.counts(queue: "q", clock: now(0))
        try expect(counts == JobCounts(ready: 3, completed: 2), "two completed: \(counts)")
      },
      check(
        "complete keeps a completed job; retry reschedules; kill keeps a dead job; release undoes a claim"
      ) {
        store in
        _ = try await store.enqueue(
          [job("done"), job("again"), job("bad"), job("back")], queue: "q", clock: now(0))
        let batch = try await claim(store, limit: 4)
        let jobs = batch.claimed
        let settled = try await claim(
          store, limit: 0,
          settling: [
            settle(jobs[0], .complete),
            settle(jobs[1], .retry(after: .seconds(19), error: "boom")),
            settle(jobs[2], .kill(error: "fatal")),
            settle(jobs[3], .release(error: nil)),
          ], now: 1)
        try expect(settled.staleSettlements.isEmpty, "all applied")
        let all = try await store.jobs(queue: "q", status: nil, after: nil, limit: 10)
        try expect(all.map(text) == ["done", "again", "bad", "back"], "every job kept: \(all.map(text))")
        try expect(all[0].status == .completed && all[0].finishedAt == at(1), "completed: \(all[0])")
        let again = all[1]
        try expect(again.status == .pending && again.runAt == at(20), "retry at its date")
        // The date the store set, as the engine reports it in `.retryScheduled` events; only retries.
        try expect(settled.retryDates == [again.id: at(20)], "retry dates reported: \(settled.retryDates)")
        try expect(again.attempts == 1 && again.lastError == "boom", "attempt kept, error recorded")
        try expect(again.leaseOwner == nil && again.leaseExpiresAt == nil, "lease cleared")
        try expect(all[2].status == .dead && all[2].lastError == "fatal", "dead with reason")
        try expect(all[2].finishedAt == at(1) && all[2].errors == ["fatal"], "dead's history: \(all[2])")
        try expect(again.errors == ["boom"] && again.finishedAt == nil, "a retry's error in the history")
        try expect(all[3].status == .pending && all[3].attempts == 0, "released: attempt given back")
        try expect(all[3].errors.isEmpty, "a release is not a failed attempt: \(all[3].errors)")
        let counts = try await store.counts(queue: "q", clock: now(1))
        try expect(counts == JobCounts(ready: 1, scheduled: 1, dead: 1, completed: 1), "counts: \(counts)")
        let next = try await claim(store, limit: 5, now: 1)
        try expect(next.claimed.map(text) == ["back"], "dead and scheduled not claimed")
      },
      check("a settlement from a lapsed claim is stale, even from the same worker") { store in
        _ = try await store.enqueue([job("a")], queue: "q", clock: now(0))
        let first = try expectOne(try await claim(store, owner: "w1", now: 0).claimed)
        let rescued = try await store.rescueExpiredLeases(queue: "q", clock: now(61))
        try expect(rescued == 1, "one rescued")
        // The same worker claims it again: only the claim token tells the two attempts apart.
        let second = try expectOne(try await claim(store, owner: "w1", now: 61).claimed)
        try expect(second.id == first.id && second.attempts == 2, "handed out again: \(second)")
        try expect(second.claimToken != first.claimToken, "a new claim token")
        let stale = try await claim(store, limit: 0, settling: [settle(first, .complete)], now: 62)
        try expect(stale.staleSettlements == [first.claim], "the first claim's outcome is stale")
        let running = try await store.jobs(queue: "q", status: .running, after: nil, limit: 5)
        try expect(running.map(\.claimToken) == [second.claimToken], "still held by the second claim")
        let late = try await store.heartbeat([first.claim], queue: "q", lease: lease(), clock: now(62))
        try expect(late.isEmpty, "the first claim cannot heartbeat either")
        let current = try await claim(store, limit: 0, settling: [settle(second, .complete)], now: 63)
        try expect(current.staleSettlements.isEmpty, "the current claim settles")
        try expect(try await store.counts(queue: "q", clock: now(63)).total == 0, "completed once")
        _ = try await store.enqueue([job("b")], queue: "q", clock: now(64))
        let b = try expectOne(try await claim(store, now: 64).claimed)
        try expect(try await store.remove([b.id], queue: "q") == 1, "removed")
        let gone = try await claim(store, limit: 0, settling: [settle(b, .complete)], now: 65)
        try expect(gone.staleSettlements == [b.claim], "settling a removed job is stale")
      },
      // A worker whose lease lapsed while its handler ran, and that claimed the job again, may send
      // the old claim's outcome and the new one's in one call: only the old one is stale.
      check("stale settlements are reported by claim, so two claims of one job in a batch are told apart") {
        store in
        _ = try await store.enqueue([job("a")], queue: "q", clock: now(0))
        let first = try expectOne(try await claim(store, owner: "w1", now: 0).claimed)
        _ = try await store.rescueExpiredLeases(queue: "q", clock: now(61))
        let second = try expectOne(try await claim(store, owner: "w1", now: 61).claimed)
        let batch = try await claim(
          store, limit: 0,
          settling: [settle(first, .complete), settle(second, .retry(after: .zero, error: "again"))],
          now: 62)
        try expect(
          batch.staleSettlements == [first.claim], "only the first claim is stale: \(batch.staleSettlements)")
        try expect(batch.retryDates.keys.contains(second.id), "the second claim's retry applied")
        let record = try await store.job(second.id)
        try expect(
          record?.status == .pending && record?.lastError == "again", "retried: \(String(describing: record))"
        )
      },
      check("heartbeats extend only current claims, from the store's clock") { store in
        _ = try await store.enqueue([job("a"), job("b")], queue: "q", clock: now(0))
        let a = try expectOne(try await claim(store, owner: "w1").claimed)
        let b = try expectOne(try await claim(store, owner: "w2").claimed)
        var stranger = b.claim
        stranger.token += 1
        let held = try await store.heartbeat(
          [a.claim, stranger], queue: "q", lease: lease("w1", for: 500), clock: now(10))
        try expect(held == [a.claim], "only a's current claim: \(held)")
        let rescued = try await store.rescueExpiredLeases(queue: "q", clock: now(100))
        try expect(rescued == 1, "only b expired")
        let running = try await store.jobs(queue: "q", status: .running, after: nil, limit: 5)
        try expect(running.map(\.id) == [a.id] && running.first?.leaseExpiresAt == at(510), "a extended")
      },
      check("a lease runs from the clock reading the store takes, not from a date passed in") { store in
        _ = try await store.enqueue([job("a")], queue: "q", clock: now(0))
        // The clock says 100 s: the claim's lease ends 60 s after that.
        let record = try expectOne(try await claim(store, now: 100).claimed)
        try expect(
          record.leaseExpiresAt == at(160),
          "lease from the store's reading: \(String(describing: record.leaseExpiresAt))")
        try expect(try await store.rescueExpiredLeases(queue: "q", clock: now(159)) == 0, "alive before")
        try expect(
          try await store.rescueExpiredLeases(queue: "q", clock: now(160)) == 1, "expired at its end")
      },
      check("a released or rescued job keeps its place in the order") { store in
        _ = try await store.enqueue([job("a"), job("b"), job("c")], queue: "q", clock: now(0))
        let a = try expectOne(try await claim(store, now: 1).claimed)
        _ = try await claim(store, limit: 0, settling: [settle(a, .release(error: nil))], now: 2)
        let again = try expectOne(try await claim(store, now: 3).claimed)
        try expect(text(again) == "a" && again.attempts == 1, "released: first again, attempt given back")
        try expect(again.runAt == at(0), "run date kept: \(again.runAt)")
        try expect(try await store.rescueExpiredLeases(queue: "q", clock: now(100)) == 1, "rescued")
        let rescued = try await claim(store, limit: 3, now: 101)
        try expect(
          rescued.claimed.map(text) == ["a", "b", "c"], "rescued: still first: \(rescued.claimed.map(text))")
      },
      // Stores keep dates in whole milliseconds, so a retry with no delay usually has the run date
      // of the jobs ready before it: it must still go behind them, or a job that keeps failing
      // would run again before the jobs that waited (and the order would depend on the clock).
      check("a job retried with no delay goes behind every job ready when it was retried") { store in
        _ = try await store.enqueue([job("a"), job("b"), job("c")], queue: "q", clock: now(0))
        let a = try expectOne(try await claim(store, now: 0).claimed)
        let next = try await claim(
          store, limit: 1, settling: [settle(a, .retry(after: .zero, error: nil))], now: 0)
        try expect(next.claimed.map(text) == ["b"], "b before the retried a: \(next.claimed.map(text))")
        // A job added in the same millisecond after the retry goes before it (equal dates; the
        // retried job takes the place behind those of its date).
        _ = try await store.enqueue([job("d")], queue: "q", clock: now(0))
        let rest = try await claim(store, limit: 3, now: 0)
        try expect(rest.claimed.map(text) == ["c", "d", "a"], "then c, d, and a: \(rest.claimed.map(text))")
      },
      check("jobs retried with no delay run again in the order of their retries") { store in
        _ = try await store.enqueue([job("a"), job("b"), job("c")], queue: "q", clock: now(0))
        let all = try await claim(store, limit: 3, now: 0).claimed
        try expect(all.map(text) == ["a", "b", "c"], "claimed in order: \(all.map(text))")
        for index in [2, 0, 1] {
          _ = try await claim(
            store, limit: 0, settling: [settle(all[index], .retry(after: .zero, error: nil))], now: 0)
        }
        let order = try await claim(store, limit: 3, now: 0)
        try expect(order.claimed.map(text) == ["c", "a", "b"], "retry order: \(order.claimed.map(text))")
        // A release keeps the place its retry gave it.
        let c = order.claimed[0]
        _ = try await claim(store, limit: 0, settling: [settle(c, .release(error: nil))], now: 0)
        _ = try await store.enqueue([job("d")], queue: "q", clock: now(0))
        let after = try await claim(
          store, limit: 2,
          settling: order.claimed.dropFirst().map {
            settle($0, .release(error: nil))
          }, now: 0)
        try expect(
          after.claimed.map(text) == ["d", "c"], "released: places kept: \(after.claimed.map(text))")
      },
      // A worker's outcomes are often recorded together, in one call (with its next claim): the
      // jobs it retried run again in the order it retried them, as when each was its own call.
      check("jobs retried with no delay in one call run again in the order of their retries") { store in
        _ = try await store.enqueue([job("a"), job("b"), job("c")], queue: "q", clock: now(0))
        let all = try await claim(store, limit: 3, now: 0).claimed
        try expect(all.map(text) == ["a", "b", "c"], "claimed in order: \(all.map(text))")
        let retries = [2, 0, 1].map { settle(all[$0], .retry(after: .zero, error: nil)) }
        _ = try await claim(store, limit: 0, settling: retries, now: 0)
        let order = try await claim(store, limit: 3, now: 0)
        try expect(order.claimed.map(text) == ["c", "a", "b"], "retry order: \(order.claimed.map(text))")
        // A release and a retry in one call: the released job keeps the place its retry gave it,
        // ahead of the job retried after it.
        let (c, a) = (order.claimed[0], order.claimed[1])
        _ = try await claim(
          store, limit: 0,
          settling: [settle(c, .release(error: nil)), settle(a, .retry(after: .zero, error: nil))], now: 0)
        let again = try await claim(store, limit: 2, now: 0)
        try expect(again.claimed.map(text) == ["c", "a"], "c kept its place: \(again.claimed.map(text))")
      },
      // The place a retry gives a job is kept when its next claim is given back (a shutdown, a
      // hand-back, a rescue): a job retried later, while it was claimed, still goes behind it.
      check("a released job keeps its place ahead of a job retried while it was claimed") { store in
        _ = try await store.enqueue([job("x"), job("y")], queue: "q", clock: now(0))
        let both = try await claim(store, limit: 2, now: 0).claimed
        try expect(both.map(text) == ["x", "y"], "claimed in order: \(both.map(text))")
        // y fails first: retried with no delay, and claimed again while x still runs.
        let y = try expectOne(
          try await claim(
            store, limit: 1, settling: [settle(both[1], .retry(after: .zero, error: nil))], now: 0
          ).claimed)
        try expect(text(y) == "y", "y claimed again: \(text(y))")
        // Then x fails, while y is claimed.
        _ = try await claim(
          store, limit: 0, settling: [settle(both[0], .retry(after: .zero, error: nil))], now: 0)
        // y's claim is given back unstarted: it keeps the place its retry gave it, before x's.
        let order = try await claim(store, limit: 2, settling: [settle(y, .release(error: nil))], now: 0)
        try expect(order.claimed.map(text) == ["y", "x"], "y retried first: \(order.claimed.map(text))")
      },
      // Ready jobs are ordered by their run dates, which the wall clock gives: a retry after the
      // clock was stepped back has an earlier run date than the jobs added before the step, and goes
      // before them (documented on `JobStore`). The jobs run all the same; only their order differs.
      check("after the wall clock steps back, a zero-delay retry is ordered by its earlier run date") {
        store in
        _ = try await store.enqueue([job("a", at: 10), job("b", at: 10)], queue: "q", clock: now(10))
        let a = try expectOne(try await claim(store, now: 10).claimed)
        // The clock steps back five seconds before a's handler asks for a retry.
        let next = try await claim(
          store, limit: 2, settling: [settle(a, .retry(after: .zero, error: nil))], now: 5)
        try expect(
          next.claimed.map(text) == ["a", "b"], "a's run date is earlier: \(next.claimed.map(text))")
      },
      check("with the real clock, a zero-delay retry runs after the jobs that waited") { store in
        let clock = SystemJobClock()
        _ = try await store.enqueue([job("a"), job("b"), job("c")], queue: "q", clock: clock)
        let lease = lease()
        let a = try expectOne(
          try await store.settleAndClaim([], queue: "q", limit: 1, lease: lease, clock: clock).claimed)
        var order = [text(a)]
        var settling = [settle(a, .retry(after: .zero, error: nil))]
        while order.count < 4 {
          let batch = try await store.settleAndClaim(
            settling, queue: "q", limit: 1, lease: lease, clock: clock)
          let record = try expectOne(batch.claimed)
          order.append(text(record))
          settling = [settle(record, .complete)]
        }
        try expect(order == ["a", "b", "c", "a"], "A1, B1, C1, A2: \(order)")
      },
      check("a claim with many priority levels and future jobs still takes the best ready job") { store in
        let future = (0..<500).map { job("f\($0)", priority: 1_000 + $0, at: 3_600) }
        _ = try await store.enqueue(
          future + [job("low", priority: -5), job("mid", priority: 3)], queue: "q", clock: now(0))
        let batch = try await claim(store, limit: 2, now: 1)
        try expect(
          batch.claimed.map(text) == ["mid", "low"], "ready ones by priority: \(batch.claimed.map(text))")
        let later = try await claim(store, limit: 1, now: 3_600)
        try expect(later.claimed.map(text) == ["f499"], "the highest once due")
      },
      check("an expired lease is rescued: the job is ready again and keeps its attempt") { store in
        _ = try await store.enqueue([job("a")], queue: "q", clock: now(0))
        _ = try await claim(store, owner: "gone", now: 0)
        try expect(try await store.rescueExpiredLeases(queue: "q", clock: now(59)) == 0, "not before expiry")
        try expect(try await store.rescueExpiredLeases(queue: "q", clock: now(61)) == 1, "after expiry")
        let record = try await store.jobs(queue: "q", status: .pending, after: nil, limit: 1).first
        try expect(record?.attempts == 1 && record?.leaseOwner == nil, "pending, attempt kept")
        try expect(record.map { $0.runAt <= at(61) } == true, "ready at once")
      },
      // SQLite and PostgreSQL compare text byte for byte, where `String` compares canonically
      // equivalent texts (a precomposed and a decomposed "é") as equal: every store must do as the
      // databases do, or a job with a key of its own is answered as another's, or a queue with jobs
      // is not listed.
      check("queue names and deduplication keys are compared byte for byte") { store in
        let composed = "caf\u{E9}"
        let decomposed = "cafe\u{301}"
        let keyed = try await store.enqueue(
          [job("a", key: composed), job("b", key: decomposed)], queue: "q", clock: now(0))
        try expect(keyed.allSatisfy(\.inserted) && keyed[0].id != keyed[1].id, "two keys, two jobs: \(keyed)")
        let again = try await store.enqueue([job("c", key: decomposed)], queue: "q", clock: now(0))
        try expect(!again[0].inserted && again[0].id == keyed[1].id, "the decomposed key's job: \(again)")
        for queue in [composed, decomposed] {
          _ = try await store.enqueue([job(queue), job(queue)], queue: queue, clock: now(0))
        }
        let names = try await store.queueNames()
        try expect(
          names.filter { $0 != "q" }.map { Array($0.utf8) }.sorted { $0.lexicographicallyPrecedes($1) }
            == [Array(composed.utf8), Array(decomposed.utf8)].sorted { $0.lexicographicallyPrecedes($1) },
          "both queues listed: \(names.map(\.unicodeScalars))")
        for queue in [composed, decomposed] {
          let counts = try await store.counts(queue: queue, clock: now(0))
          try expect(counts == JobCounts(ready: 2), "two jobs in each queue: \(counts)")
          let listed = try await store.jobs(queue: queue, status: nil, after: nil, limit: 10)
          try expect(listed.map(text) == [queue, queue], "each queue lists its own: \(listed.map(text))")
        }
      },
      check("cancel with a queue name touches only that queue, compared byte for byte") { store in
        // A precomposed and a decomposed "é": two queues to the databases, one to `String`.
        let composed = "caf\u{E9}"
        let decomposed = "cafe\u{301}"
        let added = try await store.enqueue([job("theirs")], queue: decomposed, clock: now(0))
        let results = try await store.cancel([added[0].id], queue: composed, clock: now(4))
        try expect(results == [.notFound], "another queue's job is not found: \(results)")
        let counts = try await store.counts(queue: decomposed, clock: now(0))
        try expect(counts == JobCounts(ready: 1), "its own queue still has it: \(counts)")
      },
      check("deduplication keys hold while a job waits; a running job lets a new one in") { store in
        let first = try await store.enqueue(
          [job("a", key: "k"), job("b", key: "k"), job("c", key: "other")], queue: "q", clock: now(0))
        try expect(first.map(\.inserted) == [true, false, true], "dup in batch: \(first)")
        try expect(first[1].id == first[0].id, "the existing job's ID")
        let other = try await store.enqueue([job("x", key: "k")], queue: "other-queue", clock: now(0))
        try expect(other[0].inserted, "keys are per queue")
        let claimed = try expectOne(try await claim(store, limit: 1).claimed)
        // The running job may have read old data: the new item is stored and runs after it.
        let whileRunning = try await store.enqueue([job("d", key: "k")], queue: "q", clock: now(0))
        try expect(whileRunning[0].inserted && whileRunning[0].id != claimed.id, "stored while running")
        let twice = try await store.enqueue([job("d2", key: "k")], queue: "q", clock: now(0))
        try expect(!twice[0].inserted && twice[0].id == whileRunning[0].id, "the waiting one dedups")
        _ = try await claim(store, limit: 0, settling: [settle(claimed, .retry(after: .zero, error: nil))])
        let waiting = try await store.jobs(queue: "q", status: .pending, after: nil, limit: 10)
        try expect(
          waiting.map(text) == ["a", "c", "d"], "a retried job waits beside the newer: \(waiting.map(text))")
        let oldest = try await store.enqueue([job("e", key: "k")], queue: "q", clock: now(0))
        try expect(!oldest[0].inserted && oldest[0].id == claimed.id, "the oldest waiting job's ID")
        let all = try await claim(store, limit: 10, now: 1)
        _ = try await claim(
          store, limit: 0, settling: all.claimed.map { settle($0, .kill(error: "x")) }, now: 1)
        let afterDeath = try await store.enqueue([job("f", key: "k")], queue: "q", clock: now(1))
        try expect(afterDeath[0].inserted, "a dead job does not block its key")
        let c = try await store.enqueue([job("g", key: "f")], queue: "q", clock: now(1))
        try expect(c[0].inserted, "another key")
        let again = try await store.enqueue([job("h", key: "f")], queue: "q", clock: now(1))
        try expect(!again[0].inserted, "still waiting blocks")
      },
      check("a paused queue settles but claims nothing, and the flag is per queue") { store in
        _ = try await store.enqueue([job("a"), job("b")], queue: "q", clock: now(0))
        _ = try await store.enqueue([job("x")], queue: "other", clock: now(0))
        let held = try expectOne(try await claim(store).claimed)
        try await store.setPaused(true, queue: "q")
        try expect(try await store.isPaused(queue: "q"), "paused stored")
        try expect(!(try await store.isPaused(queue: "other")), "other not paused")
        // An idle queue learns of a pause from `nextWake` too (else it claims again at once).
        try expect(try await store.nextWake(queue: "q", clock: now(0)).paused, "nextWake reports the pause")
        try expect(
          !(try await store.nextWake(queue: "other", clock: now(0)).paused), "other's hint not paused")
        let batch = try await claim(
          store, limit: 5, settling: [settle(held, .complete)])
        try expect(batch.paused && batch.claimed.isEmpty, "nothing claimed while paused")
        try expect(batch.staleSettlements.isEmpty, "settlement applied")
        try expect(
          try await store.counts(queue: "q", clock: now(0)) == JobCounts(ready: 1, completed: 1),
          "a completed")
        let other = try await claim(store, "other", limit: 5)
        try expect(other.claimed.count == 1 && !other.paused, "other queue unaffected")
        try await store.setPaused(false, queue: "q")
        try expect(
          !(try await store.nextWake(queue: "q", clock: now(0)).paused), "nextWake reports the resume")
        let resumed = try await claim(store, limit: 5)
        try expect(resumed.claimed.map(text) == ["b"] && !resumed.paused, "claims after resume")
      },
      check("queues are isolated") { store in
        _ = try await store.enqueue([job("a")], queue: "one", clock: now(0))
        _ = try await store.enqueue([job("b")], queue: "two", clock: now(0))
        let batch = try await claim(store, "one", limit: 5)
        try expect(batch.claimed.map(text) == ["a"], "only queue one")
        try expect(try await store.clear(queue: "one", statuses: Set(JobStatus.allCases)) == 1, "clear one")
        try expect(try await store.counts(queue: "two", clock: now(0)) == JobCounts(ready: 1), "two intact")
        try expect(try await store.queueNames() == ["two"], "names")
      },
      check("listing pages by ID and filters by status") { store in
        let ids = try await store.enqueue((0..<25).map { job("j\($0)") }, queue: "q", clock: now(0)).map(\.id)
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
      check("listing merges every status in ID order, a page at a time") { store in
        // Ready, scheduled, running and dead jobs interleaved in ID order, beside another queue.
        var ids: [JobID] = []
        for index in 0..<12 {
          let runs = index % 3 == 1 ? 3_600.0 : 0  // every third job scheduled an hour ahead
          ids += try await store.enqueue([job("j\(index)", at: runs)], queue: "q", clock: now(0)).map(\.id)
          _ = try await store.enqueue([job("other\(index)")], queue: "other", clock: now(0))
        }
        let claimed = try await claim(store, limit: 4).claimed
        _ = try await claim(store, limit: 0, settling: [settle(claimed[1], .kill(error: "dead"))])
        var byStatus: [JobStatus?: [JobID]] = [:]
        for status in [nil, JobStatus.pending, .running, .dead] {
          var after: JobID?
          while true {
            let page = try await store.jobs(queue: "q", status: status, after: after, limit: 3)
            if page.isEmpty { break }
            try expect(page.count <= 3, "page size bounded")
            try expect(
              page.allSatisfy { status == nil || $0.status == status }, "only \(String(describing: status))")
            byStatus[status, default: []] += page.map(\.id)
            after = page.last?.id
          }
        }
        try expect(byStatus[nil] == ids, "every job once, in ID order: \(byStatus[nil] ?? [])")
        let running = Set(claimed.map(\.id)).subtracting([claimed[1].id])
        try expect(byStatus[.running] == ids.filter { running.contains($0) }, "running in ID order")
        try expect(byStatus[.dead] == [claimed[1].id], "the dead job")
        try expect(
          byStatus[.pending] == ids.filter { !running.contains($0) && $0 != claimed[1].id },
          "waiting in ID order")
      },
      check("remove and clear delete what they name and report counts") { store in
        let ids = try await store.enqueue((0..<6).map { job("j\($0)") }, queue: "q", clock: now(0)).map(\.id)
        let batch = try await claim(store, limit: 2)
        _ = try await claim(
          store, limit: 0,
          settling: [settle(batch.claimed[0], .kill(error: "x"))])
        try expect(try await store.remove([ids[5], ids[5], JobID(999_999)], queue: "q") == 1, "remove one")
        try expect(try await store.remove([ids[4]], queue: "other") == 0, "remove is per queue")
        try expect(try await store.clear(queue: "q", statuses: [.dead]) == 1, "clear dead")
        try expect(
          try await store.counts(queue: "q", clock: now(0)) == JobCounts(ready: 3, running: 1), "left")
        try expect(try await store.clear(queue: "q", statuses: [.pending, .running]) == 4, "clear rest")
        try expect(try await store.counts(queue: "q", clock: now(0)).total == 0, "empty")
      },
      check("a tally and a clear bounded by it delete exactly the jobs counted, or none") { store in
        let added = try await store.enqueue([job("a"), job("b"), job("x")], queue: "q", clock: now(0))
        let x = try expectOne(try await claim(store, limit: 1, now: 0).claimed)
        _ = try await claim(store, limit: 0, settling: [settle(x, .kill(error: "dead"))], now: 0)
        let counted = try await store.tally(queue: "q", statuses: [.pending])
        try expect(
          counted == JobTally(count: 2, highestID: added[2].id), "two waiting, up to the last ID: \(counted)")
        try expect(
          try await store.tally(queue: "q", statuses: [.dead]) == JobTally(count: 1, highestID: added[0].id),
          "one dead")
        // A job added after the tally is not deleted with the ones counted.
        let later = try await store.enqueue([job("later")], queue: "q", clock: now(0))
        guard let highest = counted.highestID else { throw ConformanceFailure(description: "no highest ID") }
        let cleared = try await store.clear(queue: "q", statuses: [.pending], through: highest, expecting: 2)
        try expect(cleared == 2, "the two counted: \(String(describing: cleared))")
        let left = try await store.jobs(queue: "q", status: nil, after: nil, limit: 10)
        try expect(
          left.map(\.id) == [added[0].id, later[0].id], "the dead one and the later one: \(left.map(\.id))")
        // A job that started since the tally: the number differs, nothing is deleted.
        let again = try await store.tally(queue: "q", statuses: [.pending])
        _ = try await claim(store, limit: 1, now: 0)
        let refused = try await store.clear(
          queue: "q", statuses: [.pending], through: again.highestID ?? JobID(0), expecting: again.count)
        try expect(refused == nil, "refused: \(String(describing: refused))")
        try expect(
          try await store.counts(queue: "q", clock: now(0)) == JobCounts(running: 1, dead: 1), "all kept")
        try expect(
          try await store.tally(queue: "empty", statuses: [.pending]) == JobTally(count: 0, highestID: nil),
          "an empty queue")
      },
      check("dead jobs can be re-queued, by ID or all, with attempts reset") { store in
        _ = try await store.enqueue((0..<3).map { job("j\($0)") }, queue: "q", clock: now(0))
        let batch = try await claim(store, limit: 3)
        _ = try await claim(
          store, limit: 0,
          settling: batch.claimed.map { settle($0, .kill(error: "e")) })
        let pendingJob = try await store.enqueue([job("p")], queue: "q", clock: now(0))[0].id
        try expect(
          try await store.requeueDead([batch.claimed[0].id, pendingJob], queue: "q", clock: now(5)) == 1,
          "one")
        let requeued = try await store.jobs(queue: "q", status: .pending, after: nil, limit: 10)
        try expect(requeued.first?.id == batch.claimed[0].id, "first re-queued")
        try expect(
          requeued.first?.attempts == 0 && requeued.first?.runAt == at(5), "attempts reset, ready now")
        try expect(try await store.requeueDead(nil, queue: "q", clock: now(5)) == 2, "the rest")
        try expect(try await store.counts(queue: "q", clock: now(5)) == JobCounts(ready: 4), "all pending")
      },
      check("a dead job whose key a live job holds stays dead; of dead twins the oldest goes back") { store in
        let dead = try await store.enqueue(
          [job("a", key: "k"), job("b", key: "twin")], queue: "q", clock: now(0)
        ).map(\.id)
        let first = try await claim(store, limit: 2)
        _ = try await claim(
          store, limit: 0,
          settling: first.claimed.map { settle($0, .kill(error: "e")) })
        let live = try await store.enqueue([job("a again", key: "k")], queue: "q", clock: now(1))[0]
        try expect(live.inserted, "a dead job holds no key")
        let twin = try await store.enqueue([job("b again", key: "twin")], queue: "q", clock: now(1))[0].id
        let second = try await claim(store, limit: 2)
        try expect(second.claimed.map(\.id) == [live.id, twin], "both run")
        _ = try await claim(store, limit: 0, settling: [settle(second.claimed[1], .kill(error: "e"))])
        _ = try await store.enqueue([job("a waiting", key: "k")], queue: "q", clock: now(1))
        // Now "a" (key k) has a waiting twin; "b" and "b again" are dead twins.
        let byID = try await store.requeueDead([dead[0]], queue: "q", clock: now(5))
        try expect(byID == 0, "held key: stays dead")
        try expect(try await store.requeueDead(nil, queue: "q", clock: now(5)) == 1, "one of the twins")
        let pending = try await store.jobs(queue: "q", status: .pending, after: nil, limit: 10)
        try expect(pending.map(\.id).first == dead[1], "the oldest twin")
        try expect(
          try await store.counts(queue: "q", clock: now(5)) == JobCounts(ready: 2, running: 1, dead: 2),
          "the rest stay dead")
      },
      check("nextWake reports the earliest run date and lease expiry") { store in
        try expect(try await store.nextWake(queue: "q", clock: now(0)).isFinished, "empty: finished")
        _ = try await store.enqueue([job("a", at: 50), job("b", at: 20)], queue: "q", clock: now(0))
        let waiting = try await store.nextWake(queue: "q", clock: now(0))
        try expect(
          waiting.nextRun == at(20) && waiting.nextLeaseExpiry == nil, "earliest run date: \(waiting)")
        _ = try await store.settleAndClaim([], queue: "q", limit: 1, lease: lease(for: 5), clock: now(25))
        let running = try await store.nextWake(queue: "q", clock: now(25))
        try expect(running.nextRun == at(50) && running.nextLeaseExpiry == at(30), "lease expiry: \(running)")
        _ = try await store.clear(queue: "q", statuses: [.pending])
        let only = try await store.nextWake(queue: "q", clock: now(25))
        try expect(only.nextRun == nil && only.nextLeaseExpiry == at(30), "running only: \(only)")
        _ = try await store.enqueue([job("c")], queue: "q", clock: now(26))
        let ready = try await store.nextWake(queue: "q", clock: now(27))
        try expect(ready.nextRun.map { $0 <= at(27) } == true, "a ready job: due now: \(ready)")
      },
      check("queueNames lists queues with jobs or a pause flag") { store in
        _ = try await store.enqueue([job("a")], queue: "b-queue", clock: now(0))
        try await store.setPaused(true, queue: "a-queue")
        try expect(try await store.queueNames() == ["a-queue", "b-queue"], "sorted names")
      },
      check("concurrent claimers never receive the same job") { store in
        let total = 300
        _ = try await store.enqueue((0..<total).map { job("j\($0)") }, queue: "q", clock: now(0))
        let perWorker = try await withThrowingTaskGroup(of: [JobID].self) { group in
          for worker in 0..<6 {
            group.addTask {
              var mine: [JobID] = []
              var settling: [JobSettlement] = []
              while true {
                let batch = try await store.settleAndClaim(
                  settling, queue: "q", limit: 7, lease: lease("w\(worker)"), clock: now(0))
                if batch.claimed.isEmpty { return mine }
                mine += batch.claimed.map(\.id)
                settling = batch.claimed.map { settle($0, .complete) }
              }
            }
          }
          var all: [[JobID]] = []
          for try await ids in group { all.append(ids) }
          return all
        }
        let flat = perWorker.flatMap { $0 }
        try expect(flat.count == total && Set(flat).count == total, "each job once: \(flat.count)")
        let left = try await store.counts(queue: "q", clock: now(0))
        try expect(left.total == 0, "every job completed: \(left)")
      },
    ] + historyChecks + deduplicationChecks + scheduleChecks + orderingChecks + deadHeadChecks + limitChecks
    + keyLimitChecks
    + keyRateChecks
    + fairShareChecks + checkpointChecks

  static func expectOne<Element>(_ elements: [Element], line: UInt = #line) throws -> Element {
    try expect(elements.count == 1, "exactly one, got \(elements.count)", line: line)
    return elements[0]
  }
}
