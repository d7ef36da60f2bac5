import ConveyorTestSupport
import Foundation
import Testing

@testable import Conveyor

@Suite("InMemoryJobStore conformance")
struct InMemoryJobStoreConformanceTests {
  @Test(arguments: JobStoreConformance.checks)
  func conformance(_ check: JobStoreCheck) async throws {
    try await check.run(InMemoryJobStore())
  }

  @Test(arguments: QueueEngineConformance.checks)
  func engine(_ check: JobStoreCheck) async throws {
    try await check.run(InMemoryJobStore())
  }
}

/// The in-memory store's own promises: what a call that waited for the lock commits, readiness
/// across wall-clock steps, stale settlements, and queue names and keys compared byte for byte, as
/// SQLite and PostgreSQL compare (and sort) them.
@Suite("InMemoryJobStore", .timeLimit(.minutes(10)))
struct InMemoryJobStoreTests {
  static let payload = Data("{}".utf8)
  let lease = Lease(owner: "w", duration: .seconds(30))
  private let t0 = Date(timeIntervalSince1970: 1_700_000_000)

  private func job(_ text: String, key: String? = nil) -> NewJob {
    NewJob(payload: Data(text.utf8), runAt: t0, deduplicationKey: key)
  }

  // Failed before the fix: settleAndClaim read the clock before taking its lock, so a claim that
  // waited for the lock committed a lease computed before the wait: here already expired when it is committed
  // (JobStore.swift: "a call that waited for the lock never commits a lease or run date computed
  // before the wait"; Lease: "a lease is never committed already expired").
  @Test func claimThatWaitedForTheLockGetsAFullLease() async throws {
    let store = InMemoryJobStore()
    let clock = GatedClock(base: ManualJobClock())
    let queue = "q"
    _ = try await store.enqueue([NewJob(payload: Self.payload)], queue: queue, clock: clock)
    let lease = Lease(owner: "w", duration: .seconds(30))
    let batch = try await whileLockHeld(
      store: store, clock: clock, queue: queue, advance: .seconds(60)
    ) {
      try await store.settleAndClaim([], queue: queue, limit: 1, lease: lease, clock: clock)
    }
    let claimed = try #require(batch.claimed.first)
    let now = clock.base.now()
    #expect(
      claimed.leaseExpiresAt == now.addingTimeInterval(30),
      "lease committed at \(now) ends at \(String(describing: claimed.leaseExpiresAt))")
    // A lease committed already expired: another worker's rescue takes the job at once.
    #expect(try await store.rescueExpiredLeases(queue: queue, clock: clock) == 0)
  }

  // Failed before the fix: the same for a retry's run date: computed from a clock reading taken
  // before the wait for the lock, so the job was ready at once instead of 10 s after its outcome was committed.
  @Test func retryThatWaitedForTheLockRunsAfterItsDelay() async throws {
    let store = InMemoryJobStore()
    let clock = GatedClock(base: ManualJobClock())
    let queue = "q"
    _ = try await store.enqueue([NewJob(payload: Self.payload)], queue: queue, clock: clock)
    let lease = Lease(owner: "w", duration: .seconds(300))
    let first = try await store.settleAndClaim([], queue: queue, limit: 1, lease: lease, clock: clock)
    let claim = try #require(first.claimed.first).claim
    let settlement = JobSettlement(claim: claim, action: .retry(after: .seconds(10), error: "boom"))
    let batch = try await whileLockHeld(
      store: store, clock: clock, queue: queue, advance: .seconds(60)
    ) {
      try await store.settleAndClaim([settlement], queue: queue, limit: 0, lease: lease, clock: clock)
    }
    let committedAt = clock.base.now()
    #expect(batch.staleSettlements.isEmpty)
    #expect(batch.retryDates[claim.id] == committedAt.addingTimeInterval(10))
    let counts = try await store.counts(queue: queue, clock: clock)
    #expect(counts.scheduled == 1 && counts.ready == 0, "\(counts)")
  }

  /// Ready marks survive a backward step of the wall clock; scheduled jobs stay scheduled; claim
  /// order is priority, run date, ID; counts and nextWake agree with that.
  @Test func readinessSurvivesAClockStepBack() async throws {
    let store = InMemoryJobStore()
    let clock = ManualJobClock()
    let start = clock.now()
    let q = "q"
    let ids = try await store.enqueue(
      [
        NewJob(payload: Self.payload, priority: 0),  // 1: ready
        NewJob(payload: Self.payload, priority: 0, runTime: .after(.seconds(10))),  // 2: scheduled
        NewJob(payload: Self.payload, priority: 5, runTime: .after(.seconds(20))),  // 3: scheduled
        NewJob(payload: Self.payload, priority: 1),  // 4: ready
      ], queue: q, clock: clock
    ).map(\.id)
    clock.advance(by: .seconds(15))
    // Promotes job 2 (its date came); job 3 stays scheduled.
    let first = try await store.settleAndClaim([], queue: q, limit: 1, lease: lease, clock: clock)
    #expect(first.claimed.map(\.id) == [ids[3]])
    clock.step(by: .seconds(-100))
    var counts = try await store.counts(queue: q, clock: clock)
    #expect(counts == JobCounts(ready: 2, scheduled: 1, running: 1, dead: 0), "\(counts)")
    let hint = try await store.nextWake(queue: q, clock: clock)
    #expect(hint.nextRun == clock.now())
    #expect(hint.nextLeaseExpiry == start.addingTimeInterval(45))
    let second = try await store.settleAndClaim([], queue: q, limit: 5, lease: lease, clock: clock)
    #expect(second.claimed.map(\.id) == [ids[0], ids[1]])
    counts = try await store.counts(queue: q, clock: clock)
    #expect(counts == JobCounts(ready: 0, scheduled: 1, running: 3, dead: 0), "\(counts)")
    #expect(try await store.nextWake(queue: q, clock: clock).nextRun == start.addingTimeInterval(20))
  }

  /// A claim whose lease lapsed and that was re-claimed settles as stale and changes nothing; a
  /// removed job's settlement is stale; release keeps the old place; kill then requeueDead.
  @Test func staleSettlementsChangeNothing() async throws {
    let store = InMemoryJobStore()
    let clock = ManualJobClock()
    let q = "q"
    let ids = try await store.enqueue(
      [NewJob(payload: Self.payload, deduplicationKey: "k"), NewJob(payload: Self.payload)], queue: q,
      clock: clock
    ).map(\.id)
    let a = try await store.settleAndClaim([], queue: q, limit: 1, lease: lease, clock: clock).claimed[0]
    #expect(a.id == ids[0])
    // Running: the key no longer blocks a new job.
    let dup = try await store.enqueue(
      [NewJob(payload: Self.payload, deduplicationKey: "k")], queue: q, clock: clock)
    #expect(dup[0].inserted)
    clock.advance(by: .seconds(31))
    #expect(try await store.rescueExpiredLeases(queue: q, clock: clock) == 1)
    // Both waiting with key "k" now: a third is deduplicated to the older.
    let dup2 = try await store.enqueue(
      [NewJob(payload: Self.payload, deduplicationKey: "k")], queue: q, clock: clock)
    #expect(!dup2[0].inserted && dup2[0].id == ids[0])
    let b = try await store.settleAndClaim([], queue: q, limit: 1, lease: lease, clock: clock).claimed[0]
    #expect(b.id == ids[0] && b.claimToken == a.claimToken + 1 && b.attempts == 2)
    let stale = try await store.settleAndClaim(
      [JobSettlement(claim: a.claim, action: .complete)], queue: q, limit: 0, lease: lease, clock: clock)
    #expect(stale.staleSettlements == [a.claim])
    #expect(try await store.job(ids[0])?.status == .running)
    let released = try await store.settleAndClaim(
      [JobSettlement(claim: b.claim, action: .release(error: nil))], queue: q, limit: 1, lease: lease,
      clock: clock)
    #expect(released.claimed.map(\.id) == [ids[0]] && released.claimed[0].attempts == 2)
    let c = released.claimed[0]
    _ = try await store.settleAndClaim(
      [JobSettlement(claim: c.claim, action: .kill(error: "x"))], queue: q, limit: 0, lease: lease,
      clock: clock)
    // A job with key "k" waits: the dead one is not requeued.
    #expect(try await store.requeueDead(nil, queue: q, clock: clock) == 0)
    #expect(try await store.remove([dup[0].id], queue: q) == 1)
    #expect(try await store.requeueDead(nil, queue: q, clock: clock) == 1)
    // Job 2 (run date of the start) comes before job 1 (re-queued now).
    let both = try await store.settleAndClaim([], queue: q, limit: 2, lease: lease, clock: clock).claimed
    #expect(both.map(\.id) == [ids[1], ids[0]])
    let d = both[1]
    #expect(d.attempts == 1)
    #expect(try await store.remove([ids[0]], queue: q) == 1)
    let gone = try await store.settleAndClaim(
      [JobSettlement(claim: d.claim, action: .complete)], queue: q, limit: 0, lease: lease, clock: clock)
    #expect(gone.staleSettlements == [d.claim])
    #expect(
      try await store.counts(queue: q, clock: clock) == JobCounts(ready: 0, scheduled: 0, running: 1, dead: 0)
    )
  }

  /// A retry into the future stays scheduled when the clock steps forward and back again only if
  /// no claim promoted it; after a claim promoted it, it is ready whatever the clock says.
  @Test func promotedRetryStaysReadyAfterAStepBack() async throws {
    let store = InMemoryJobStore()
    let clock = ManualJobClock()
    let q = "q"
    _ = try await store.enqueue([NewJob(payload: Self.payload)], queue: q, clock: clock)
    let a = try await store.settleAndClaim([], queue: q, limit: 1, lease: lease, clock: clock).claimed[0]
    _ = try await store.settleAndClaim(
      [JobSettlement(claim: a.claim, action: .retry(after: .seconds(10), error: "e"))], queue: q, limit: 0,
      lease: lease, clock: clock)
    clock.step(by: .seconds(11))
    #expect(try await store.counts(queue: q, clock: clock).ready == 1)
    clock.step(by: .seconds(-11))
    #expect(try await store.counts(queue: q, clock: clock).scheduled == 1)
    clock.step(by: .seconds(11))
    // Neither a paused call nor a limit-0 call claims, so neither promotes the job.
    try await store.setPaused(true, queue: q)
    let paused = try await store.settleAndClaim([], queue: q, limit: 1, lease: lease, clock: clock)
    #expect(paused.paused && paused.claimed.isEmpty)
    try await store.setPaused(false, queue: q)
    _ = try await store.settleAndClaim([], queue: q, limit: 0, lease: lease, clock: clock)
    clock.step(by: .seconds(-11))
    let claimed = try await store.settleAndClaim([], queue: q, limit: 1, lease: lease, clock: clock)
    #expect(claimed.claimed.isEmpty, "limit 0 and a paused call promote nothing")
    clock.step(by: .seconds(11))
    #expect(
      try await store.settleAndClaim([], queue: q, limit: 1, lease: lease, clock: clock).claimed.count == 1)
  }

  /// `queueNames()` is "sorted": SQLite (`ORDER BY name`, BINARY) and PostgreSQL
  /// (`ORDER BY name COLLATE "C"`) sort by bytes. The in-memory store sorts by `String`'s order,
  /// which compares the NFC form: "e\u{301}" (bytes 65 CC 81) comes after "f" (66) there, before
  /// it in both databases. (Failed before the fix.)
  @Test func queueNamesAreSortedByBytesAsTheDatabasesSortThem() async throws {
    let store = InMemoryJobStore()
    let decomposed = "e\u{301}"
    for queue in ["f", decomposed] {
      _ = try await store.enqueue([job(queue)], queue: queue, now: t0)
    }
    let names = try await store.queueNames()
    let expected = [decomposed, "f"]
    #expect(
      names.map { Array($0.utf8) } == expected.map { Array($0.utf8) },
      "listed \(names.map { $0.unicodeScalars.map(\.value) }), byte order is \(expected.map { $0.unicodeScalars.map(\.value) })"
    )
  }

  /// The documented semantics with keys of odd content (empty, NUL, noncharacters, long),
  /// and equivalent variants kept apart.
  @Test func oddKeysKeepTheSemantics() async throws {
    let store = InMemoryJobStore()
    let keys = [
      "", "\0", "a\0b", "a\u{FFFD}b", "\u{FFFF}", "\u{10FFFF}", "\u{FEFF}k", "k",
      "\u{212A}", "K", "\u{1100}\u{1161}", "\u{AC00}", "a\u{323}\u{307}", "a\u{307}\u{323}",
      String(repeating: "x", count: 100_000), String(repeating: "x", count: 100_001),
    ]
    let first = try await store.enqueue(keys.map { job($0, key: $0) }, queue: "q", now: t0)
    #expect(first.allSatisfy { $0.inserted })
    #expect(Set(first.map(\.id)).count == keys.count)
    let again = try await store.enqueue(keys.reversed().map { job($0, key: $0) }, queue: "q", now: t0)
    #expect(again.map(\.id) == first.map(\.id).reversed())
    #expect(again.allSatisfy { !$0.inserted })
  }
}
