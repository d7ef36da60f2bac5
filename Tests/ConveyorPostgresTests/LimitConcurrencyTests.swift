import Conveyor
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import ConveyorPostgres

/// A queue's concurrency limit under real concurrency: several stores (a connection each, so
/// claims truly overlap, which one store's serialized connection never does) drain one queue.
@Suite("PostgresJobStore concurrency limits under concurrency", .serialized)
struct LimitConcurrencyTests {
  /// The observer's reading: the most running jobs seen committed, and whether to stop.
  final class Observer: Sendable {
    let state = Mutex((most: 0, stop: false))
  }

  /// Six workers, each on its own connection, claim two jobs at a time from a queue limited to
  /// three, complete them after a moment, and claim again; an observer reads the committed count
  /// of running jobs all along. Neither the workers' own count nor the committed one ever exceeds
  /// three, and every job completes once.
  @Test func claimsOnManyConnectionsNeverExceedTheLimit() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("limits")
    let options = PostgresJobStore.Options(schema: schema)
    var opened: [PostgresJobStore] = []
    for _ in 0..<6 { opened.append(try await PostgresJobStore.open(url: server.url, options: options)) }
    let stores = opened
    let clock = SystemJobClock()
    let jobs = 300
    _ = try await stores[0].enqueue(
      (0..<jobs).map { NewJob(payload: Data("j\($0)".utf8), runAt: Date(timeIntervalSince1970: 0)) },
      queue: "q", clock: clock)
    try await stores[0].setLimits(QueueLimits(concurrency: 3), queue: "q")
    let watch = RunningWatch()
    let observer = Observer()
    let url = server.url
    try await withThrowingTaskGroup(of: Void.self) { group in
      for (index, store) in stores.enumerated() {
        group.addTask {
          let lease = Lease(owner: "w\(index)", duration: .seconds(60))
          var settling: [JobSettlement] = []
          var idle = 0
          while idle < 20 {
            watch.state.withLock { $0.running -= settling.count }
            let batch = try await store.settleAndClaim(
              settling, queue: "q", limit: 2, lease: lease, clock: clock)
            watch.state.withLock {
              $0.running += batch.claimed.count
              $0.most = max($0.most, $0.running)
              $0.done += settling.count
            }
            settling = batch.claimed.map {
              JobSettlement(claim: $0.claim, action: .complete, keepsHistory: true)
            }
            idle = batch.claimed.isEmpty ? idle + 1 : 0
            try await Task.sleep(for: .milliseconds(batch.claimed.isEmpty ? 5 : 1))
          }
          watch.state.withLock { $0.running -= settling.count }
          _ = try await store.settleAndClaim(settling, queue: "q", limit: 0, lease: lease, clock: clock)
          watch.state.withLock { $0.done += settling.count }
        }
      }
      group.addTask {
        let admin = try AdminConnection(url)
        while !observer.state.withLock({ $0.stop }) {
          let rows = try await admin.queryOffPool(
            "SELECT count(*) FROM \(schema).jobs WHERE queue = 'q' AND status = 'running'")
          let running = Int((rows.first?.first ?? nil) ?? "0") ?? 0
          observer.state.withLock { $0.most = max($0.most, running) }
          try await Task.sleep(for: .milliseconds(1))
        }
      }
      // The observer stops once the workers are done.
      while watch.state.withLock({ $0.done }) < jobs {
        try await Task.sleep(for: .milliseconds(20))
        try #require(!group.isEmpty)
      }
      observer.state.withLock { $0.stop = true }
      try await group.waitForAll()
    }
    let result = watch.state.withLock { $0 }
    #expect(result.most <= 3, "the workers held at most 3 at once, saw \(result.most)")
    #expect(observer.state.withLock { $0.most } <= 3, "the database never showed more than 3 running")
    #expect(result.done == jobs)
    let counts = try await stores[0].counts(queue: "q", clock: clock)
    #expect(counts.completed == jobs && counts.running == 0 && counts.ready == 0, "\(counts)")
    for store in stores { await store.close() }
  }
}

extension LimitConcurrencyTests {
  /// Opens a store on a fresh schema, limits queue `q` to one, enqueues two jobs and claims the
  /// first: the caller then settles it while another session holds the queue's limit lock.
  private static func claimedFirstOfTwo(lockTimeout: Duration) async throws
    -> (store: PostgresJobStore, schema: String, claimed: JobRecord, url: String)
  {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("limitlock")
    let store = try await PostgresJobStore.open(
      url: server.url, options: PostgresJobStore.Options(schema: schema, lockTimeout: lockTimeout))
    let clock = SystemJobClock()
    _ = try await store.enqueue(
      [NewJob(payload: Data("a".utf8)), NewJob(payload: Data("b".utf8))], queue: "q", clock: clock)
    try await store.setLimits(QueueLimits(concurrency: 1), queue: "q")
    let first = try await store.settleAndClaim(
      [], queue: "q", limit: 1, lease: Lease(owner: "w", duration: .seconds(60)), clock: clock)
    let claimed = try #require(first.claimed.first)
    return (store, schema, claimed, server.url)
  }

  /// A limited claim takes the queue's lock in a second transaction, after the settlements
  /// committed. When that lock is not granted within the lock timeout (another claim of the queue
  /// holds it: here a session of the test), the call throws, though the completion it was asked
  /// to record is already committed: `JobStore` promises that a call which throws changed nothing,
  /// and the engine then keeps the outcome to record again (refused as stale the next time).
  @Test func limitedClaimThatTimesOutOnTheLimitLockLeavesNoSettlementBehind() async throws {
    let (store, _, claimed, url) = try await Self.claimedFirstOfTwo(lockTimeout: .milliseconds(200))
    let admin = try AdminConnection(url)
    try admin.query("SELECT pg_advisory_lock(\(SQL.limitLockKey(store.sql.schema, queue: "'q'")))")
    let outcome: Result<ClaimBatch, any Error>
    do {
      outcome = .success(
        try await store.settleAndClaim(
          [JobSettlement(claim: claimed.claim, action: .complete, keepsHistory: true)], queue: "q",
          limit: 1, lease: Lease(owner: "w", duration: .seconds(60)), clock: SystemJobClock()))
    } catch {
      outcome = .failure(error)
    }
    try admin.query("SELECT pg_advisory_unlock_all()")
    let record = try await store.job(claimed.id)
    switch outcome {
    case .success(let batch):
      #expect(batch.staleSettlements.isEmpty, "the completion committed, yet was reported stale")
    case .failure(let error):
      #expect(
        record?.status != .completed,
        "settleAndClaim threw (\(error)) though the completion it was asked to record committed")
    }
    await store.close()
  }

  /// The connection of a limited claim is lost while the claim waits for the queue's limit lock,
  /// after its settlements committed in the first transaction. The store runs the whole call again
  /// on a new connection, and the completion, already recorded, is then reported stale: the
  /// engine would treat the job's outcome as refused (taken over elsewhere) though it was recorded.
  @Test func limitedClaimWhoseConnectionDropsAfterItsSettlementsReportsThemApplied() async throws {
    let (store, _, claimed, url) = try await Self.claimedFirstOfTwo(lockTimeout: .seconds(5))
    let admin = try AdminConnection(url)
    try admin.query("SELECT pg_advisory_lock(\(SQL.limitLockKey(store.sql.schema, queue: "'q'")))")
    let call = Task {
      try await store.settleAndClaim(
        [JobSettlement(claim: claimed.claim, action: .complete, keepsHistory: true)], queue: "q",
        limit: 1, lease: Lease(owner: "w", duration: .seconds(60)), clock: SystemJobClock())
    }
    // The claim's backend waits for the test's session: end it there.
    let blocked = "SELECT pid FROM pg_stat_activity WHERE pg_backend_pid() = ANY(pg_blocking_pids(pid))"
    try await waitFor("the limited claim to wait for the lock") { try !admin.query(blocked).isEmpty }
    try admin.query("SELECT pg_terminate_backend(pid) FROM (\(blocked)) AS b")
    try await Task.sleep(for: .milliseconds(100))
    try admin.query("SELECT pg_advisory_unlock_all()")
    let outcome = await call.result
    let record = try await store.job(claimed.id)
    #expect(record?.status == .completed, "the completion was recorded: \(String(describing: record))")
    switch outcome {
    case .success(let batch):
      #expect(
        batch.staleSettlements.isEmpty,
        "the completion committed in the first transaction, yet was reported stale: \(batch.staleSettlements)"
      )
    case .failure(let error):
      Issue.record("settleAndClaim threw (\(error)) though the completion it was asked to record committed")
    }
    await store.close()
  }
}

extension LimitConcurrencyTests {
  /// Whether the limit toggler stops, and how many jobs the claims handed out.
  final class Tally: Sendable {
    let stop = Mutex(false)
    let handedOut = Mutex(0)
  }

  /// A claim reads the limit with the pause flag (the promote statement), then claims in the next
  /// statement, which skips a queue with a limit. When the limit is removed between the two, the
  /// first claim takes jobs, then the limited claim runs too and its rows replace the first's: the
  /// jobs of the first claim are left running under this worker's lease, handed to nobody, until
  /// the lease lapses. Here workers claim while another store removes and restores the limit over
  /// and over; once they have drained the queue nothing may be left running.
  @Test func claimsWhileTheLimitIsRemovedHandOutEveryJobTheyTake() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("limittoggle")
    let options = PostgresJobStore.Options(schema: schema)
    var opened: [PostgresJobStore] = []
    for _ in 0..<4 { opened.append(try await PostgresJobStore.open(url: server.url, options: options)) }
    let stores = opened
    let clock = SystemJobClock()
    let jobs = 3_000
    _ = try await stores[0].enqueue(
      (0..<jobs).map { NewJob(payload: Data("j\($0)".utf8), runAt: Date(timeIntervalSince1970: 0)) },
      queue: "q", clock: clock)
    let tally = Tally()
    try await withThrowingTaskGroup(of: Void.self) { group in
      group.addTask {
        var on = false
        while !tally.stop.withLock({ $0 }) {
          on.toggle()
          try await stores[0].setLimits(QueueLimits(concurrency: on ? 1_000_000 : nil), queue: "q")
        }
      }
      for index in 1..<stores.count {
        let store = stores[index]
        group.addTask {
          let lease = Lease(owner: "w\(index)", duration: .seconds(600))
          var settling: [JobSettlement] = []
          var idle = 0
          while idle < 30 {
            let batch = try await store.settleAndClaim(
              settling, queue: "q", limit: 3, lease: lease, clock: clock)
            tally.handedOut.withLock { $0 += batch.claimed.count }
            settling = batch.claimed.map {
              JobSettlement(claim: $0.claim, action: .complete, keepsHistory: false)
            }
            idle = batch.claimed.isEmpty ? idle + 1 : 0
            if batch.claimed.isEmpty { try await Task.sleep(for: .milliseconds(5)) }
          }
          _ = try await store.settleAndClaim(settling, queue: "q", limit: 0, lease: lease, clock: clock)
        }
      }
      for _ in 1..<stores.count { try await group.next() }
      tally.stop.withLock { $0 = true }
      try await group.waitForAll()
    }
    let counts = try await stores[0].counts(queue: "q", clock: clock)
    #expect(
      counts.running == 0 && counts.ready == 0,
      "claimed jobs handed to no worker stay running until their lease lapses: \(counts), \(tally.handedOut.withLock { $0 }) of \(jobs) handed out"
    )
    for store in stores { await store.close() }
  }
}

extension LimitConcurrencyTests {
  /// With the caller's clock (`Options.clock` `.caller`), a claim dates its lease from the clock
  /// reading taken before the call's first transaction; a limited claim then waits for the queue's
  /// limit lock in its second transaction, and the wait comes off the lease. `JobStore` promises a
  /// lease of `lease.duration` from the store's clock reading under its lock (as SQLite's claim
  /// reads the clock once it holds the write lock). Here the lock is held for a second.
  @Test func limitedClaimWaitingForTheLimitLockKeepsItsWholeLease() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("limitlease")
    let store = try await PostgresJobStore.open(
      url: server.url, options: PostgresJobStore.Options(schema: schema, clock: .caller))
    let clock = SystemJobClock()
    _ = try await store.enqueue([NewJob(payload: Data("a".utf8))], queue: "q", clock: clock)
    try await store.setLimits(QueueLimits(concurrency: 1), queue: "q")
    let admin = try AdminConnection(server.url)
    try admin.query("SELECT pg_advisory_lock(\(SQL.limitLockKey(store.sql.schema, queue: "'q'")))")
    let call = Task {
      try await store.settleAndClaim(
        [], queue: "q", limit: 1, lease: Lease(owner: "w", duration: .seconds(60)), clock: clock)
    }
    let blocked = "SELECT pid FROM pg_stat_activity WHERE pg_backend_pid() = ANY(pg_blocking_pids(pid))"
    try await waitFor("the limited claim to wait for the lock") { try !admin.query(blocked).isEmpty }
    try await Task.sleep(for: .seconds(1))
    let released = clock.now()
    try admin.query("SELECT pg_advisory_unlock_all()")
    let batch = try await call.value
    let claimed = try #require(batch.claimed.first)
    let expiry = try #require(claimed.leaseExpiresAt)
    let lease = expiry.timeIntervalSince(released)
    // Counted from before the wait, the lease would run 59 s or less from the release. A loaded
    // machine may delay the call between its clock reading and the server's start of the
    // transaction, which nothing measures (0.22 s was seen in a whole-suite run), so the bound
    // leaves half a second for it.
    #expect(lease >= 59.5, "the lease runs \(lease) s from the claim under the lock, not 60 s")
    await store.close()
  }
}

extension LimitConcurrencyTests {
  /// Limits set while a claim waits for the queue's limit lock: `setLimits` takes that lock too,
  /// so the claim that queued behind it claims by the limits it stored: as many as asked once the
  /// limit is gone, however many run; no more than the places left under a lowered one, and says
  /// the queue is full.
  @Test func aClaimWaitingForTheLimitLockClaimsByTheLimitStoredWhenItGetsIt() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("limitwait")
    let store = try await PostgresJobStore.open(
      url: server.url, options: PostgresJobStore.Options(schema: schema))
    let other = try await PostgresJobStore.open(
      url: server.url, options: PostgresJobStore.Options(schema: schema))
    let clock = SystemJobClock()
    let lease = Lease(owner: "w", duration: .seconds(600))
    _ = try await store.enqueue(
      (0..<20).map { NewJob(payload: Data("j\($0)".utf8), runAt: Date(timeIntervalSince1970: 0)) },
      queue: "q",
      clock: clock)
    try await store.setLimits(QueueLimits(concurrency: 2), queue: "q")
    let first = try await store.settleAndClaim([], queue: "q", limit: 5, lease: lease, clock: clock)
    #expect(first.claimed.count == 2 && first.full, "two under the limit: \(first)")
    let admin = try AdminConnection(server.url)
    let blocked = "SELECT pid FROM pg_stat_activity WHERE pg_backend_pid() = ANY(pg_blocking_pids(pid))"
    let lock = "SELECT pg_advisory_lock(\(SQL.limitLockKey(store.sql.schema, queue: "'q'")))"

    // Removed while the claim waits (the removal first in the lock's queue): it takes the five
    // asked for, with two running.
    try admin.query(lock)
    let removal = Task { try await other.setLimits(QueueLimits(), queue: "q") }
    try await waitFor("the removal to wait for the lock") { try admin.query(blocked).count == 1 }
    let removed = Task {
      try await store.settleAndClaim([], queue: "q", limit: 5, lease: lease, clock: clock)
    }
    try await waitFor("the claim to wait for the lock") { try admin.query(blocked).count == 2 }
    try admin.query("SELECT pg_advisory_unlock_all()")
    try await removal.value
    let free = try await removed.value
    #expect(free.claimed.count == 5 && !free.full, "as many as asked once the limit is gone: \(free)")

    // Lowered while the claim waits, to 8 with 7 running: one place, and the queue is then full.
    try await store.setLimits(QueueLimits(concurrency: 1_000), queue: "q")
    try admin.query(lock)
    let lowering = Task { try await other.setLimits(QueueLimits(concurrency: 8), queue: "q") }
    try await waitFor("the change to wait for the lock") { try admin.query(blocked).count == 1 }
    let lowered = Task {
      try await store.settleAndClaim([], queue: "q", limit: 5, lease: lease, clock: clock)
    }
    try await waitFor("the claim to wait for the lock") { try admin.query(blocked).count == 2 }
    try admin.query("SELECT pg_advisory_unlock_all()")
    try await lowering.value
    let one = try await lowered.value
    #expect(one.claimed.count == 1 && one.full, "one place left under the lowered limit: \(one)")
    let counts = try await store.counts(queue: "q", clock: clock)
    #expect(counts.running == 8, "\(counts)")
    let wake = try await store.nextWake(queue: "q", clock: clock)
    #expect(wake.nextRun == nil, "no run date while the running jobs fill the limit: \(wake)")
    await store.close()
    await other.close()
  }
  /// A claim that waited for the queue's limit lock (another claim, a slow commit; here a test
  /// session holding it for 2 s) counts its start from when it got the lock, with either clock:
  /// at 1 a second, one at a time, the claim right after it on another connection takes nothing.
  @Test(arguments: [PostgresJobStore.Clock.caller, .database])
  func aClaimThatWaitedForTheLimitLockCountsItsStartFromTheLock(_ mode: PostgresJobStore.Clock) async throws {
    let server = try await PostgresServer.shared()
    let options = PostgresJobStore.Options(
      schema: uniqueSchema("ratelock"), clock: mode, lockTimeout: .seconds(20))
    let a = try await PostgresJobStore.open(url: server.url, options: options)
    let b = try await PostgresJobStore.open(url: server.url, options: options)
    let clock = SystemJobClock()
    let lease = Lease(owner: "w", duration: .seconds(60))
    _ = try await a.enqueue((1...4).map { _ in NewJob(payload: Data("x".utf8)) }, queue: "q", clock: clock)
    try await a.setLimits(QueueLimits(rate: RateLimit(perSecond: 1, burst: 1)), queue: "q")
    let first = try await a.settleAndClaim([], queue: "q", limit: 1, lease: lease, clock: clock)
    #expect(first.claimed.count == 1)
    try await Task.sleep(for: .milliseconds(1100))  // a start is due again
    let admin = try AdminConnection(server.url)
    try admin.query("SELECT pg_advisory_lock(\(SQL.limitLockKey(a.sql.schema, queue: "'q'")))")
    let waiting = Task { try await b.settleAndClaim([], queue: "q", limit: 1, lease: lease, clock: clock) }
    let blocked = "SELECT pid FROM pg_stat_activity WHERE pg_backend_pid() = ANY(pg_blocking_pids(pid))"
    let deadline = ContinuousClock.now + .seconds(60)
    while try admin.query(blocked).isEmpty {
      #expect(ContinuousClock.now < deadline, "the claim never waited for the limit lock")
      if ContinuousClock.now >= deadline { break }
      try await Task.sleep(for: .milliseconds(5))
    }
    try await Task.sleep(for: .seconds(2))
    try admin.query("SELECT pg_advisory_unlock_all()")
    let released = Date()
    let second = try await waiting.value
    let third = try await a.settleAndClaim([], queue: "q", limit: 1, lease: lease, clock: clock)
    let span = Date().timeIntervalSince(released)
    let starts = second.claimed.count + third.claimed.count
    #expect(
      Double(starts) <= 1 + span,
      "\(mode): one at a time at 1 a second, yet \(starts) starts within \(Int(span * 1000)) ms of the lock's release"
    )
    await a.close()
    await b.close()
  }
  /// A claim whose settlements waited before its limit lock (here for the line lock of an
  /// ordering key, which another session holds for 1.5 s) counts its start from after the wait,
  /// with either clock: at 1 a second, one at a time, a claim right after it takes nothing.
  @Test(arguments: [PostgresJobStore.Clock.caller, .database])
  func aClaimWhoseSettlementsWaitedCountsItsStartFromAfterTheWait(_ mode: PostgresJobStore.Clock) async throws
  {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("ratedelay")
    let a = try await PostgresJobStore.open(url: server.url, options: .init(schema: schema, clock: mode))
    let b = try await PostgresJobStore.open(url: server.url, options: .init(schema: schema, clock: mode))
    let clock = SystemJobClock()
    let lease = Lease(owner: "w", duration: .seconds(60))
    _ = try await a.enqueue(
      [NewJob(payload: Data("h".utf8), orderingKey: "K"), NewJob(payload: Data("h2".utf8), orderingKey: "K")]
        + (1...3).map { NewJob(payload: Data("f\($0)".utf8)) }, queue: "q", clock: clock)
    let head = try #require(
      try await a.settleAndClaim([], queue: "q", limit: 1, lease: lease, clock: clock).claimed.first)
    #expect(head.orderingKey == "K")
    try await a.setLimits(QueueLimits(rate: RateLimit(perSecond: 1, burst: 1)), queue: "q")
    let admin = try AdminConnection(server.url)
    try admin.query("BEGIN")
    try admin.query("SELECT pg_advisory_xact_lock(\(schema).order_lock_key('q', 'K'))")
    let waiting = Task {
      try await a.settleAndClaim(
        [JobSettlement(claim: head.claim, action: .complete)], queue: "q", limit: 1, lease: lease,
        clock: clock)
    }
    try await Task.sleep(for: .milliseconds(1500))
    try admin.query("COMMIT")
    let first = try await waiting.value
    let firstAt = Date()
    let second = try await b.settleAndClaim([], queue: "q", limit: 1, lease: lease, clock: clock)
    let gap = Date().timeIntervalSince(firstAt)
    await a.close()
    await b.close()
    #expect(
      Double(first.claimed.count + second.claimed.count) <= 1 + gap,
      "\(mode): \(first.claimed.count) + \(second.claimed.count) starts within \(gap) s at 1/s, one at a time"
    )
  }
}

extension LimitConcurrencyTests {
  /// Limits per key set while a claim of the queue runs on another connection: every job the
  /// claim held under the old limit is claimable once both have committed, whichever went first.
  /// Failed before `setLimits` took the queue's limit lock: a claim that read the old limit held
  /// jobs after the new limits' unhold took its snapshot, and they stayed held under a limit of
  /// 100 with one job of their key running (about one round in three).
  @Test func limitsSetDuringAClaimLeaveNoJobHeldUnderTheNewLimit() async throws {
    let server = try await PostgresServer.shared()
    var options = PostgresJobStore.Options(schema: uniqueSchema("keyrace"), clock: .caller)
    options.claimDelayCounted = nil
    let one = try await PostgresJobStore.open(url: server.url, options: options)
    let two = try await PostgresJobStore.open(url: server.url, options: options)
    let clock = SystemJobClock()
    let lease = Lease(owner: "w", duration: .seconds(600))
    var stuck: [String] = []
    for round in 0..<60 {
      let queue = "q\(round)"
      try await one.setLimits(QueueLimits(keyConcurrency: 1), queue: queue)
      _ = try await one.enqueue(
        (0..<20).map { NewJob(payload: Data("\($0)".utf8), limitKey: "A") }, queue: queue, clock: clock)
      let first = try await one.settleAndClaim([], queue: queue, limit: 1, lease: lease, clock: clock)
      #expect(first.claimed.count == 1)
      // The others are held; set the limits again (every held job claimable), then race a claim,
      // which holds them again under a limit of 1, with a raise to 100.
      try await one.setLimits(QueueLimits(keyConcurrency: 1), queue: queue)
      async let claimed = one.settleAndClaim([], queue: queue, limit: 1, lease: lease, clock: clock)
      async let raised: Void = two.setLimits(QueueLimits(keyConcurrency: 100), queue: queue)
      _ = try await (claimed, raised)
      let held = try await one.jobs(queue: queue, status: .pending, after: nil, limit: 100).filter(
        \.isHeldByLimit)
      if !held.isEmpty { stuck.append("round \(round): \(held.count) held under a limit of 100") }
    }
    #expect(stuck.isEmpty, "\(stuck.count) rounds: \(stuck.prefix(5))")
    await one.close()
    await two.close()
  }
}
