import Conveyor
import ConveyorSQLite
import ConveyorTestSupport
import Foundation
import Testing

private let agreeQueue = "agree"
private func at(_ seconds: Double) -> FixedJobClock { FixedJobClock(epoch.addingTimeInterval(seconds)) }
private func body(_ n: Int) -> Data { Data("\(n)".utf8) }

/// Runs `scenario` on a fresh in-memory store and a fresh SQLite file; returns both transcripts.
private func onBothStores(
  _ scenario: (any JobStore) async throws -> [String]
) async throws -> (memory: [String], sqlite: [String]) {
  let folder = try TemporaryFolder()
  let sqlite = try SQLiteJobStore(path: folder.path("agree.sqlite"))
  let memory = try await scenario(InMemoryJobStore())
  let onDisk = try await scenario(sqlite)
  await sqlite.close()
  return (memory, onDisk)
}

private func ids(_ batch: ClaimBatch) -> String {
  "claimed " + batch.claimed.map(\.id.description).joined(separator: ",")
    + " stale " + batch.staleSettlements.map(\.description).joined(separator: ",")
}

private func describe(_ counts: JobCounts) -> String {
  "ready \(counts.ready) scheduled \(counts.scheduled) running \(counts.running) dead \(counts.dead)"
}

/// The same scenarios on `InMemoryJobStore` and `SQLiteJobStore` give the same answers
/// ("InMemoryJobStore ... has the same semantics as the SQLite store"; "same order in both
/// stores"), wall-clock steps, settlements of other queues and equivalent spellings of queue names
/// and keys included.
@Suite("SQLite and in-memory stores agree")
struct StoresAgreeTests {
  private func job(_ text: String, key: String? = nil, priority: Int = 0) -> NewJob {
    NewJob(payload: payload(text), priority: priority, runAt: epoch, deduplicationKey: key)
  }

  private static func describeRecord(_ record: JobRecord) -> String {
    "\(record.id.rawValue) q=\(scalarsInHex(record.queue)) k=\(scalarsInHex(record.deduplicationKey)) \(record.status) a=\(record.attempts)"
  }

  /// The same calls on SQLite and on the in-memory store, with canonically equivalent (and
  /// compatibility-equivalent) queue names and keys; every answer is written down and compared.
  private static func script(_ store: any JobStore) async throws -> [String] {
    var log: [String] = []
    let composed = "caf\u{E9}"
    let decomposed = "cafe\u{301}"
    let queues = [composed, decomposed, "f", "\u{AC00}", "\u{1100}\u{1161}", "K", "\u{212A}", "q"]
    let keys = [
      composed, decomposed, "", "\0", "a\0b", "a\u{FFFD}b", "a\u{323}\u{307}", "a\u{307}\u{323}",
      "\u{AC00}", "\u{1100}\u{1161}", "K", "\u{212A}", String(repeating: "z", count: 5000),
    ]
    for queue in queues {
      let batch =
        keys.map { NewJob(payload: payload($0), runAt: epoch, deduplicationKey: $0) }
        + keys.reversed().map { NewJob(payload: payload($0), runAt: epoch, deduplicationKey: $0) }
      let results = try await store.enqueue(batch, queue: queue, now: epoch)
      log.append(
        "enqueue \(scalarsInHex(queue)): \(results.map { "\($0.id.rawValue)\($0.inserted ? "+" : "=")" })")
    }
    for queue in queues {
      let again = try await store.enqueue(
        keys.map { NewJob(payload: payload("again"), runAt: epoch, deduplicationKey: $0) }, queue: queue,
        now: epoch)
      log.append(
        "again \(scalarsInHex(queue)): \(again.map { "\($0.id.rawValue)\($0.inserted ? "+" : "=")" })")
    }
    log.append("names \(try await store.queueNames().map { scalarsInHex($0) })")
    // Claim two from the composed queue; kill one, let the other run; dedup checks on both.
    let claimed = try await store.settleAndClaim(
      [], queue: composed, limit: 2, lease: lease(), now: epoch)
    log.append("claimed \(claimed.claimed.map(describeRecord))")
    let whileRunning = try await store.enqueue(
      claimed.claimed.map {
        NewJob(payload: payload("new"), runAt: epoch, deduplicationKey: $0.deduplicationKey)
      },
      queue: composed, now: epoch)
    log.append("while running \(whileRunning.map { "\($0.id.rawValue)\($0.inserted ? "+" : "=")" })")
    let killed = try await store.settleAndClaim(
      claimed.claimed.map { JobSettlement(claim: $0.claim, action: .kill(error: "x")) }, queue: composed,
      limit: 0,
      lease: lease(), now: epoch)
    log.append("kill stale \(killed.staleSettlements)")
    log.append(
      "requeue held \(try await store.requeueDead(nil, queue: composed, clock: FixedJobClock(epoch)))")
    // The waiting copies go away: the dead ones can come back.
    _ = try await store.remove(whileRunning.map(\.id), queue: composed)
    log.append("requeue \(try await store.requeueDead(nil, queue: composed, clock: FixedJobClock(epoch)))")
    try await store.setPaused(true, queue: decomposed)
    try await store.setPaused(true, queue: "\u{212A}")
    for queue in queues {
      let paused = try await store.isPaused(queue: queue)
      let counts = try await store.counts(queue: queue, now: epoch)
      let hint = try await store.nextWake(queue: queue, clock: FixedJobClock(epoch))
      log.append("\(scalarsInHex(queue)) paused=\(paused) counts=\(counts) wake=\(hint)")
      let listed = try await store.jobs(queue: queue, status: nil, after: nil, limit: 100)
      log.append("\(scalarsInHex(queue)) jobs \(listed.map(describeRecord))")
    }
    log.append("cleared \(try await store.clear(queue: "\u{1100}\u{1161}", statuses: [.pending]))")
    log.append("names \(try await store.queueNames().map { scalarsInHex($0) })")
    log.append("removed \(try await store.remove([JobID(1), JobID(2)], queue: decomposed))")
    log.append("names \(try await store.queueNames().map { scalarsInHex($0) })")
    return log
  }

  // Failed before the fix: after the wall clock steps back (NTP, an administrator), a job committed to run "now"
  // is claimable at once on SQLite (stored 'ready') but not on InMemoryJobStore for as long as the
  // step (it sits in the `scheduled` heap until its run date comes again); counts differ too
  // (SQLite: ready 1; in memory: scheduled 1). InMemoryJobStore.enqueue/insertWaiting always push
  // to `scheduled` and `promote` compares dates; SQLite decides ready/scheduled at insert.
  // Promised: "InMemoryJobStore ... has the same semantics as the SQLite store".
  @Test("a job added just before a wall-clock step back: both stores claim it alike")
  func stepBackAfterEnqueue() async throws {
    let (memory, sqlite) = try await onBothStores { store in
      _ = try await store.enqueue([NewJob(payload: body(1))], queue: agreeQueue, clock: at(0))
      let counts = try await store.counts(queue: agreeQueue, clock: at(-3600))
      let batch = try await store.settleAndClaim(
        [], queue: agreeQueue, limit: 5, lease: lease("w"), clock: at(-3600))
      return [describe(counts), ids(batch)]
    }
    #expect(memory == sqlite, "in memory: \(memory); SQLite: \(sqlite)")
  }

  // Failed before the fix: the same split for a job given back (shutdown, released delegate): SQLite's release
  // makes it 'ready' whatever its date; InMemoryJobStore's release (makeWaiting -> insertWaiting)
  // puts it in `scheduled`, so after a step back it is not "ready again in its old place" for an
  // hour. Promised: JobSettlement.Action.release "Give the job back: ready again in its old
  // place"; both stores the same.
  @Test("a job given back after a wall-clock step back is ready again in both stores")
  func releaseAfterStepBack() async throws {
    let (memory, sqlite) = try await onBothStores { store in
      _ = try await store.enqueue([NewJob(payload: body(1))], queue: agreeQueue, clock: at(0))
      let first = try await store.settleAndClaim(
        [], queue: agreeQueue, limit: 1, lease: lease("w"), clock: at(0))
      let release = JobSettlement(
        claim: first.claimed[0].claim, action: .release(error: "interrupted by shutdown"))
      let again = try await store.settleAndClaim(
        [release], queue: agreeQueue, limit: 1, lease: lease("w"), clock: at(-3600))
      return [ids(first), ids(again)]
    }
    #expect(memory == sqlite, "in memory: \(memory); SQLite: \(sqlite)")
  }

  // Failed before the fix: SQLite applies a settlement (and a heartbeat) to a job of another queue: its fence is
  // `id = ? AND status = 'running' AND claim_token = ?` with no `queue = ?`, while
  // InMemoryJobStore looks the claim up in the named queue and reports it stale. A caller that
  // passes the wrong queue name deletes another queue's running job on SQLite only.
  // Promised: settleAndClaim(_:queue:...) settles the queue's jobs; both stores the same.
  @Test("a settlement naming another queue is refused by both stores")
  func settlementForAnotherQueue() async throws {
    let (memory, sqlite) = try await onBothStores { store in
      _ = try await store.enqueue([NewJob(payload: body(1))], queue: "other", clock: at(0))
      let held = try await store.settleAndClaim(
        [], queue: "other", limit: 1, lease: lease("w"), clock: at(0))
      let claim = held.claimed[0].claim
      let beat = try await store.heartbeat([claim], queue: agreeQueue, lease: lease("w"), clock: at(1))
      let wrong = try await store.settleAndClaim(
        [JobSettlement(claim: claim, action: .complete)], queue: agreeQueue, limit: 0, lease: lease("w"),
        clock: at(1))
      let left = try await store.counts(queue: "other", clock: at(1))
      return ["heartbeat kept \(beat.count)", ids(wrong), describe(left)]
    }
    #expect(memory == sqlite, "in memory: \(memory); SQLite: \(sqlite)")
  }

  @Test("claim order, retries, releases, rescues, dedup and requeueDead agree")
  func mixedScenarioAgrees() async throws {
    let (memory, sqlite) = try await onBothStores { store in
      var log: [String] = []
      var jobs: [NewJob] = []
      for n in 0..<24 {
        let runTime: RunTime =
          n % 5 == 0
          ? .after(.milliseconds(n * 100)) : (n % 7 == 0 ? .at(epoch.addingTimeInterval(-5)) : .now)
        jobs.append(
          NewJob(
            payload: body(n), priority: n % 3, runTime: runTime,
            deduplicationKey: n % 4 == 0 ? "k\(n % 8)" : nil))
      }
      log.append(
        try await store.enqueue(jobs, queue: agreeQueue, clock: at(0)).map { "\($0.id)\($0.inserted)" }
          .joined(separator: ","))
      let first = try await store.settleAndClaim(
        [], queue: agreeQueue, limit: 6, lease: lease("a", for: .seconds(10)), clock: at(0))
      log.append(ids(first))
      var settlements: [JobSettlement] = []
      for (index, job) in first.claimed.enumerated() {
        switch index % 4 {
        case 0: settlements.append(.init(claim: job.claim, action: .retry(after: .zero, error: "zero")))
        case 1: settlements.append(.init(claim: job.claim, action: .release(error: nil)))
        case 2: settlements.append(.init(claim: job.claim, action: .kill(error: "dead")))
        default: break  // left to lapse
        }
      }
      log.append(
        ids(
          try await store.settleAndClaim(
            settlements, queue: agreeQueue, limit: 3, lease: lease("b"), clock: at(1))))
      log.append("rescued \(try await store.rescueExpiredLeases(queue: agreeQueue, clock: at(30)))")
      log.append("requeued \(try await store.requeueDead(nil, queue: agreeQueue, clock: at(31)))")
      log.append(
        try await store.enqueue(
          [NewJob(payload: body(99), deduplicationKey: "k0")], queue: agreeQueue, clock: at(31)
        ).map { "\($0.id)\($0.inserted)" }.joined())
      log.append(describe(try await store.counts(queue: agreeQueue, clock: at(31))))
      log.append(
        ids(
          try await store.settleAndClaim(
            [], queue: agreeQueue, limit: 100, lease: lease("c"), clock: at(32))))
      return log
    }
    #expect(memory == sqlite, "in memory: \(memory)\nSQLite:    \(sqlite)")
  }

  @Test func sqliteAnswersAsTheInMemoryStoreDoes() async throws {
    let folder = try TemporaryFolder()
    let sqlite = try makeStore(folder)
    let onDisk = try await Self.script(sqlite)
    let inMemory = try await Self.script(InMemoryJobStore())
    for (index, (a, b)) in zip(onDisk, inMemory).enumerated() where a != b {
      Issue.record("step \(index) differs:\n  SQLite:    \(a)\n  in memory: \(b)")
    }
    #expect(onDisk.count == inMemory.count)
  }
}
