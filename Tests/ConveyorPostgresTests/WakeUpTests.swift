import Conveyor
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import ConveyorPostgres

/// Every change that makes a job ready now wakes idle workers of other processes through
/// `NOTIFY`: a retry due at once, a release, a rescued lease, a resume. The idle worker polls only
/// every 60 seconds, so only a notification can start the job within the 5-second bound (a hang
/// bound, not a speed claim: the wake-up itself takes milliseconds).
@Suite("PostgresJobStore wake-ups", .serialized)
struct WakeUpTests {
  struct Item: Queueable { var number: Int }

  let lease = Lease(owner: "other-process", duration: .seconds(3_600))

  /// An idle queue on `worker` polling every 60 s; the stream yields each handled item.
  func idleQueue(on store: PostgresJobStore, queue: String) throws -> (JobQueue<Item>, AsyncStream<Int>) {
    let (stream, continuation) = AsyncStream.makeStream(of: Int.self)
    let configuration = JobQueueConfiguration(identifier: queue, pollInterval: .seconds(60))
    let jobQueue = try JobQueue<Item>(configuration: configuration, store: store) { item, _ in
      continuation.yield(item.number)
      return .handled
    }
    return (jobQueue, stream)
  }

  func enqueue(_ number: Int, on store: PostgresJobStore, queue: String) async throws {
    _ = try await store.enqueue(
      [NewJob(payload: try JSONEncoder().encode(Item(number: number)))], queue: queue, clock: SystemJobClock()
    )
  }

  /// The other process claims the queue's job; then an idle queue starts on `worker` and settles
  /// into its 60-second wait (the claimed job's lease runs an hour).
  func claimElsewhereThenIdle(_ queue: String) async throws -> (
    worker: PostgresJobStore, other: PostgresJobStore, server: PostgresServer, claim: ClaimReference,
    jobQueue: JobQueue<Item>, handled: AsyncStream<Int>
  ) {
    let (server, worker, other) = try await openWakeStores()
    try await enqueue(1, on: other, queue: queue)
    let batch = try await other.settleAndClaim(
      [], queue: queue, limit: 1, lease: lease, clock: SystemJobClock())
    let claim = try #require(batch.claimed.first).claim
    try await primeListener(worker, through: other, queue: queue)
    let (jobQueue, handled) = try idleQueue(on: worker, queue: queue)
    try await Task.sleep(for: .milliseconds(500))  // the loop finds nothing ready and waits
    return (worker, other, server, claim, jobQueue, handled)
  }

  @Test func aRetryDueAtOnceWakesAnIdleWorkerElsewhere() async throws {
    let s = try await claimElsewhereThenIdle("retry")
    let result = try await s.other.settleAndClaim(
      [JobSettlement(claim: s.claim, action: .retry(after: .zero, error: "try again"))], queue: "retry",
      limit: 0, lease: lease, clock: SystemJobClock())
    #expect(result.staleSettlements.isEmpty)
    let handled = await first(s.handled)
    #expect(handled == 1, "the idle worker started the retried job within 5 s (it polls every 60 s)")
    await s.jobQueue.shutdown(gracePeriod: .seconds(5))
    await s.worker.close()
    await s.other.close()
  }

  @Test func aReleaseWakesAnIdleWorkerElsewhere() async throws {
    let s = try await claimElsewhereThenIdle("release")
    _ = try await s.other.settleAndClaim(
      [JobSettlement(claim: s.claim, action: .release(error: nil))], queue: "release", limit: 0, lease: lease,
      clock: SystemJobClock())
    let handled = await first(s.handled)
    #expect(handled == 1, "the idle worker started the released job within 5 s (it polls every 60 s)")
    await s.jobQueue.shutdown(gracePeriod: .seconds(5))
    await s.worker.close()
    await s.other.close()
  }

  @Test func aRescuedLeaseWakesAnIdleWorkerElsewhere() async throws {
    let s = try await claimElsewhereThenIdle("rescue")
    // The other process's claim runs out (as if it had died an hour ago); a third party rescues it.
    let schema = s.worker.options.schema
    try AdminConnection(s.server.url).query(
      "UPDATE \(schema).jobs SET lease_expires_at = now() - interval '1 second' WHERE status = 'running'")
    #expect(try await s.other.rescueExpiredLeases(queue: "rescue", clock: SystemJobClock()) == 1)
    let handled = await first(s.handled)
    #expect(handled == 1, "the idle worker started the rescued job within 5 s (it polls every 60 s)")
    await s.jobQueue.shutdown(gracePeriod: .seconds(5))
    await s.worker.close()
    await s.other.close()
  }

  @Test func aQueueShutDownElsewhereHandsItsJobToAnIdleWorker() async throws {
    let (_, worker, other) = try await openWakeStores()
    let queue = "shutdown"
    try await enqueue(1, on: other, queue: queue)
    // The other process's queue starts the job and holds it until it is shut down.
    let (started, startedContinuation) = AsyncStream.makeStream(of: Int.self)
    let holding = try JobQueue<Item>(
      configuration: JobQueueConfiguration(identifier: queue, pollInterval: .seconds(60)), store: other
    ) { item, _ in
      startedContinuation.yield(item.number)
      try await Task.sleep(for: .seconds(3_600))
      return .handled
    }
    #expect(await first(started, within: 30) == 1)
    try await primeListener(worker, through: other, queue: queue)
    let (jobQueue, handled) = try idleQueue(on: worker, queue: queue)
    try await Task.sleep(for: .milliseconds(500))
    await holding.shutdown(gracePeriod: .milliseconds(100))  // the interrupted job is released
    #expect(await first(handled) == 1, "the idle worker started the released job within 5 s")
    await jobQueue.shutdown(gracePeriod: .seconds(5))
    await worker.close()
    await other.close()
  }

  @Test func aResumeWakesAnIdleWorkerElsewhere() async throws {
    let (_, worker, other) = try await openWakeStores()
    let queue = "resume"
    try await other.setPaused(true, queue: queue)
    try await enqueue(1, on: other, queue: queue)
    try await primeListener(worker, through: other, queue: queue)
    try await other.setPaused(true, queue: queue)  // primeListener resumed it
    while await worker.waitForWork(queue: queue, timeout: .milliseconds(300)) {}
    let (jobQueue, handled) = try idleQueue(on: worker, queue: queue)
    try await Task.sleep(for: .milliseconds(500))  // paused: the loop waits
    try await other.setPaused(false, queue: queue)
    #expect(await first(handled) == 1, "the idle worker started the job within 5 s of the resume")
    await jobQueue.shutdown(gracePeriod: .seconds(5))
    await worker.close()
    await other.close()
  }

  /// A wait that a notification ends early leaves no timer behind. A queue's watcher waits again
  /// after every notification, for its poll interval: each wait's timeout stayed scheduled until
  /// it passed, so a queue with an hour's poll interval, notified for every job another process
  /// adds, held a timer (and its closure) per job added in the last hour.
  @Test func notifiedWaitsLeaveNoTimerBehind() async throws {
    let (_, worker, other) = try await openWakeStores()
    try await primeListener(worker, through: other, queue: "timers")
    let before = worker.listener!.armedTimeouts
    for _ in 0..<300 {
      let waiter = Task { await worker.waitForWork(queue: "timers", timeout: .seconds(3_600)) }
      try await other.setPaused(false, queue: "timers")
      let woken = await waiter.value
      #expect(woken)
    }
    let grown = worker.listener!.armedTimeouts - before
    #expect(grown < 10, "\(grown) hour-long timeouts still scheduled after 300 notified waits")
    await worker.close()
    await other.close()
  }

  /// Two watchers of one queue on one store (two `JobQueue`s of the same queue in one process):
  /// a notification that comes while one waits and the other is between two waits wakes the
  /// first, and the second's next wait returns at once. Before, it was spent on the first, and
  /// the second slept until its poll.
  @Test func aNotificationAlsoReachesAWatcherThatWasBetweenTwoWaits() async throws {
    let (_, worker, other) = try await openWakeStores()
    let queue = "two-watchers"
    try await countTwoWatchers(worker, through: other, queue: queue)
    // Only one waits now: the other is between two waits.
    let lone = Task { await worker.waitForWork(queue: queue, timeout: .seconds(60)) }
    let loneWaits = await eventually(timeout: .seconds(10)) { worker.listener!.armedTimeouts == 1 }
    #expect(loneWaits)
    try await other.setPaused(false, queue: queue)
    let loneWoken = await lone.value
    #expect(loneWoken)
    // The other watcher waits again: the notification it missed ends the wait at once (a hang
    // bound: without it the wait lasts its 20 s and returns false).
    #expect(
      await worker.waitForWork(queue: queue, timeout: .seconds(20)),
      "the second watcher missed the notification")
    await worker.close()
    await other.close()
  }

  /// A watcher woken by one notification, and between two waits when the next comes, is owed a
  /// return by the next. (The tasks a notification woke were kept as served for as long as a
  /// debt stood: after one of two watchers of a queue had stopped, the other's was never paid, so
  /// the remaining watcher stayed served, and a notification that came while it was between two
  /// waits was lost until its poll.)
  @Test func aWatcherWokenBeforeIsOwedTheNextNotificationItMissed() async throws {
    let (_, worker, other) = try await openWakeStores()
    let queue = "woken-before"
    // Two watchers (the second then stops for good).
    try await countTwoWatchers(worker, through: other, queue: queue)

    // The remaining watcher (one task) is woken, then is between two waits when the next
    // notification comes.
    let (between, betweenContinuation) = AsyncStream.makeStream(of: Void.self)
    let (proceed, proceedContinuation) = AsyncStream.makeStream(of: Void.self)
    let watcher = Task { () -> (Bool, Bool) in
      let woken = await worker.waitForWork(queue: queue, timeout: .seconds(60))
      betweenContinuation.yield()
      for await _ in proceed { break }
      let next = await worker.waitForWork(queue: queue, timeout: .seconds(20))
      return (woken, next)
    }
    let waits = await eventually(timeout: .seconds(10)) { worker.listener!.armedTimeouts == 1 }
    #expect(waits)
    try await other.setPaused(false, queue: queue)
    for await _ in between { break }
    try await other.setPaused(false, queue: queue)
    // The listener took the notification in (two returns owed, for two watchers).
    let heard = await eventually(timeout: .seconds(10)) { worker.listener!.owedReturns(queue) == 2 }
    #expect(heard)
    proceedContinuation.yield()
    let (woken, next) = await watcher.value
    #expect(woken)
    #expect(next, "the notification that came while the watcher was between two waits was lost")
    await worker.close()
    await other.close()
  }

  // MARK: Watchers between two waits: the returns owed to them

  /// Two watchers A and B of one queue on one store (two `JobQueue`s). A notification comes while
  /// A waits and B is between two waits. A is woken, and (as `JobQueue`'s watcher loop does: it
  /// signals the loop and waits again at once) A waits again before B does. The one early return
  /// the notification left "for B" is taken by A's next wait (a spurious wake-up for A), and B's
  /// next wait sleeps until its poll: the case the commit fixes is only fixed when B happens to
  /// come back before A. `pending` is a count per queue, not per watcher.
  @Test func theEarlyReturnOwedToTheWatcherBetweenWaitsIsTakenByTheWokenWatcher() async throws {
    let (_, worker, other) = try await openWakeStores("rev3")
    defer {
      Task {
        await worker.close()
        await other.close()
      }
    }
    let queue = "stolen"
    // Both watchers wait at once: the listener counts two watchers.
    try await countTwoWatchers(worker, through: other, queue: queue)

    // A's watcher (one task, as `JobQueue`'s is) waits; B is between two waits (its loop has not
    // come back yet). A is woken, and waits again at once (it only signals its loop).
    let aWoken = Counter()
    let a = Task { () -> (Bool, Bool) in
      let a2 = await worker.waitForWork(queue: queue, timeout: .seconds(60))
      aWoken.increment()
      let a3 = await worker.waitForWork(queue: queue, timeout: .seconds(60))
      aWoken.increment()
      return (a2, a3)
    }
    #expect(await waitsRegistered(worker, 1))
    try await other.setPaused(false, queue: queue)
    // A's second wait has returned, or waits.
    #expect(
      await eventually(timeout: .seconds(10)) {
        aWoken.value == 2 || (aWoken.value == 1 && worker.listener!.armedTimeouts == 1)
      })

    // B comes back: the notification it missed should end its wait at once (a hang bound: it
    // otherwise lasts its 8 s and returns false).
    let b2 = await worker.waitForWork(queue: queue, timeout: .seconds(8))
    #expect(b2, "B, between two waits when the notification came, slept until its poll")
    a.cancel()
    let (a2, a3) = await a.value
    #expect(a2, "A is woken by the notification")
    #expect(!a3, "A, already woken by the notification, took the early return owed to B")
  }

  /// The same scenario through two `JobQueue`s of one queue on one store. A (concurrency 1) is
  /// busy with job 1 for good; B is idle. A notification wakes both watchers; B's watcher is
  /// slower to come back (its next wait starts a few seconds later here, standing for a loaded
  /// pool: any delay that lets A's watcher come back first will do). Job 2 is added meanwhile: A
  /// is woken but cannot take it, and takes the early return owed to B; B's next wait sleeps
  /// until its 60-second poll, and job 2 waits for it: the case the commit promises to fix.
  @Test func anIdleJobQueueBetweenTwoWaitsStillMissesAJobWhenABusyOneComesBackFirst() async throws {
    let (_, worker, other) = try await openWakeStores("rev3")
    let queue = "stolen-queue"
    try await primeListener(worker, through: other, queue: queue)
    #expect(await waitsRegistered(worker, 0))
    let (started, startedContinuation) = AsyncStream.makeStream(of: Int.self)
    let busy = try JobQueue<Item>(
      configuration: JobQueueConfiguration(identifier: queue, concurrency: 1, pollInterval: .seconds(60)),
      store: worker
    ) { item, _ in
      startedContinuation.yield(item.number)
      try await Task.sleep(for: .seconds(3_600))
      return .handled
    }
    try await enqueue(1, on: other, queue: queue)
    let held = await first(started, within: 30)
    #expect(held == 1, "the busy queue holds job 1")

    let lagging = LaggingStore(worker)
    let (handled, handledContinuation) = AsyncStream.makeStream(of: Int.self)
    let idle = try JobQueue<Item>(
      configuration: JobQueueConfiguration(identifier: queue, concurrency: 1, pollInterval: .seconds(60)),
      store: lagging
    ) { item, _ in
      handledContinuation.yield(item.number)
      return .handled
    }
    // Both watchers wait: the listener counts two watchers of the queue.
    #expect(await waitsRegistered(worker, 2))
    // A notification wakes both; B's watcher will come back late.
    lagging.lagAfterNextWakeUp(.seconds(5))
    let turnsBefore = lagging.nextWakeCalls
    try await other.setPaused(false, queue: queue)
    // B's loop turned (found nothing) and A's watcher waits again; B's does not yet.
    #expect(await eventually(timeout: .seconds(10)) { lagging.nextWakeCalls > turnsBefore })
    #expect(await waitsRegistered(worker, 1))
    try await enqueue(2, on: other, queue: queue)
    let second = await first(handled, within: 15)
    #expect(second == 2, "the idle queue started job 2 within 15 s (it polls every 60 s)")
    await busy.shutdown(gracePeriod: .milliseconds(100))
    await idle.shutdown(gracePeriod: .seconds(5))
    await worker.close()
    await other.close()
  }

  /// Primes the listener, makes the listener count two watchers of `queue` (two waits at once,
  /// both woken: nothing pending), and watches `probe` (its first wait returns at once).
  func twoWatchers(_ worker: PostgresJobStore, _ other: PostgresJobStore, queue: String, probe: String)
    async throws
  {
    try await countTwoWatchers(worker, through: other, queue: queue)
    #expect(await worker.waitForWork(queue: probe, timeout: .seconds(5)), "a first wait returns at once")
  }

  /// Notifies `queue`, then waits until the listener has delivered it (a notification of `probe`
  /// sent after it has come).
  func notifyAndSettle(_ worker: PostgresJobStore, _ other: PostgresJobStore, queue: String, probe: String)
    async throws
  {
    try await other.setPaused(false, queue: queue)
    try await other.setPaused(false, queue: probe)
    #expect(await worker.waitForWork(queue: probe, timeout: .seconds(10)), "the probe's notification came")
  }

  /// Two watchers A and B (two `JobQueue`s of one queue on one store, each one task). A
  /// notification comes while both are between two waits: `pending = Owed(2, [])`. A comes back
  /// first and, its wait returning at once, waits again at once (as the watcher loop does): the
  /// second early return, owed to B, is taken by A too, since a wait that consumes an early
  /// return does not mark its task served. B's next wait sleeps until its poll.
  @Test func bothBetweenWaitsTheFirstBackTakesBothEarlyReturns() async throws {
    let (_, worker, other) = try await openWakeStores("rev4")
    let (queue, probe) = ("both-between", "both-between-probe")
    try await twoWatchers(worker, other, queue: queue, probe: probe)
    try await notifyAndSettle(worker, other, queue: queue, probe: probe)
    let a = Task { () -> (Bool, Bool) in
      let first = await worker.waitForWork(queue: queue, timeout: .seconds(5))
      let second = await worker.waitForWork(queue: queue, timeout: .seconds(3))
      return (first, second)
    }
    let (aFirst, aSecond) = await a.value
    #expect(aFirst, "A missed the notification")
    #expect(!aSecond, "A, already told, took the early return owed to B")
    // B (this task) comes back: a hang bound, it otherwise lasts 8 s and returns false.
    let b = await worker.waitForWork(queue: queue, timeout: .seconds(8))
    #expect(b, "B, between two waits when the notification came, slept until its poll")
    await worker.close()
    await other.close()
  }

  /// A is woken by notification 1 while B is between waits: `pending = Owed(1, [A])`. Before B
  /// comes back, notification 2 comes while A too is between waits. `served` still holds A, so
  /// A's next wait sleeps until its poll (notification 2 is lost for A), while B's two next waits
  /// both return at once.
  @Test func aWatcherServedByAnEarlierNotificationMissesTheNextOne() async throws {
    let (_, worker, other) = try await openWakeStores("rev4")
    let (queue, probe) = ("served-stale", "served-stale-probe")
    try await twoWatchers(worker, other, queue: queue, probe: probe)
    let (go, goContinuation) = AsyncStream.makeStream(of: Void.self)
    let (woken, wokenContinuation) = AsyncStream.makeStream(of: Bool.self)
    let a = Task { () -> Bool in
      let first = await worker.waitForWork(queue: queue, timeout: .seconds(60))
      wokenContinuation.yield(first)
      var iterator = go.makeAsyncIterator()
      await iterator.next()  // between two waits
      return await worker.waitForWork(queue: queue, timeout: .seconds(8))
    }
    #expect(await waitsRegistered(worker, 1))
    try await other.setPaused(false, queue: queue)  // notification 1: wakes A; B is away
    var wokenIterator = woken.makeAsyncIterator()
    #expect(await wokenIterator.next() == true, "A is woken by notification 1")
    #expect(await waitsRegistered(worker, 0))
    try await notifyAndSettle(worker, other, queue: queue, probe: probe)  // notification 2
    goContinuation.yield()
    // A hang bound: A's wait otherwise lasts 8 s and returns false.
    let aSecond = await a.value
    #expect(aSecond, "A, between two waits when notification 2 came, slept until its poll")
    await worker.close()
    await other.close()
  }

  // MARK: Every change that makes a job ready, and only for its own queue

  // Failed before the fix: `requeueDead(_:queue:clock:)` with explicit IDs never sends NOTIFY (the `if let ids`
  // branch returns before `sql.notify`, PostgresJobStore.swift requeueDead), although
  // `waitForWork` promises to wake when a job is "re-queued". Idle workers only find the
  // re-queued job at their next poll.
  @Test func requeueingDeadJobsByIDWakesIdleWorkers() async throws {
    let server = try await PostgresServer.shared()
    let store = try await openNamedStore(server, .init(schema: uniqueSchema("rv")))
    let clock = SystemJobClock()
    let lease = Lease(owner: "w", duration: .seconds(30))
    let id = try await store.enqueue([NewJob(payload: Data("x".utf8))], queue: "rq", clock: clock)[0].id
    let claimed = try await store.settleAndClaim([], queue: "rq", limit: 1, lease: lease, clock: clock)
      .claimed
    #expect(claimed.map(\.id) == [id])
    _ = try await store.settleAndClaim(
      [JobSettlement(claim: claimed[0].claim, action: .kill(error: "boom"))], queue: "rq", limit: 0,
      lease: lease,
      clock: clock)
    try await primeListener(store, queue: "rq")

    let waiter = Task { await store.waitForWork(queue: "rq", timeout: .seconds(4)) }
    try await Task.sleep(for: .milliseconds(300))
    #expect(try await store.requeueDead([id], queue: "rq", clock: clock) == 1)
    #expect(await waiter.value, "re-queueing a dead job by ID wakes the idle worker")

    // The same with `nil` (every dead job) does notify: only the by-ID path is silent.
    let claimedAgain = try await store.settleAndClaim([], queue: "rq", limit: 1, lease: lease, clock: clock)
      .claimed
    _ = try await store.settleAndClaim(
      [JobSettlement(claim: claimedAgain[0].claim, action: .kill(error: "boom"))], queue: "rq", limit: 0,
      lease: lease, clock: clock)
    while await store.waitForWork(queue: "rq", timeout: .milliseconds(300)) {}
    let allWaiter = Task { await store.waitForWork(queue: "rq", timeout: .seconds(4)) }
    try await Task.sleep(for: .milliseconds(300))
    #expect(try await store.requeueDead(nil, queue: "rq", clock: clock) == 1)
    #expect(await allWaiter.value, "re-queueing every dead job wakes the idle worker")
    await store.close()
  }

  // A retry, a release and a rescued lease wake a worker idle in another store.
  @Test func retryReleaseAndRescueWakeAnIdleStoreElsewhere() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("rn")
    let worker = try await openNamedStore(server, .init(schema: schema, reconnectTimeout: .seconds(30)))
    let idle = try await openNamedStore(server, .init(schema: schema, reconnectTimeout: .seconds(30)))
    defer {
      Task {
        await worker.close()
        await idle.close()
      }
    }
    let clock = SystemJobClock()
    let lease = Lease(owner: "w", duration: .seconds(30))
    _ = try await worker.enqueue([NewJob(payload: Data("a".utf8))], queue: "n", clock: clock)
    // Starts the idle store's listener.
    _ = await idle.waitForWork(queue: "n", timeout: .seconds(1))

    var claim = try await worker.settleAndClaim([], queue: "n", limit: 1, lease: lease, clock: clock).claimed[
      0
    ]
    .claim
    let retried = claim
    #expect(
      try await wakes(idle, queue: "n") {
        _ = try await worker.settleAndClaim(
          [JobSettlement(claim: retried, action: .retry(after: .zero, error: "e"))], queue: "n", limit: 0,
          lease: lease, clock: clock)
      })
    claim = try await worker.settleAndClaim([], queue: "n", limit: 1, lease: lease, clock: clock).claimed[0]
      .claim
    let released = claim
    #expect(
      try await wakes(idle, queue: "n") {
        _ = try await worker.settleAndClaim(
          [JobSettlement(claim: released, action: .release(error: nil))], queue: "n", limit: 0,
          lease: lease, clock: clock)
      })
    let short = Lease(owner: "w", duration: .milliseconds(1))
    _ = try await worker.settleAndClaim([], queue: "n", limit: 1, lease: short, clock: clock)
    try await Task.sleep(for: .milliseconds(50))
    let rescued = Mutex(0)
    #expect(
      try await wakes(idle, queue: "n") {
        let count = try await worker.rescueExpiredLeases(queue: "n", clock: clock)
        rescued.withLock { $0 = count }
      })
    #expect(rescued.withLock { $0 } == 1)
  }

  /// `waitForWork(queue:)` answers whether the store learned of work for that queue. The listener
  /// matches a notification's queue name to its waiters with `String`'s `==` (and keeps its
  /// watched set and owed returns by `String`): an add to "caf\u{E9}" wakes the waiter of
  /// "cafe\u{301}", another queue, which has no job.
  @Test func anAddToOneQueueDoesNotWakeTheWaiterOfAnEquivalentName() async throws {
    let store = try await openCallerClockStore()
    let composed = "caf\u{E9}"
    let decomposed = "cafe\u{301}"
    // The listener starts with this wait, and its first LISTEN ends it.
    _ = await store.waitForWork(queue: composed, timeout: .seconds(30))
    // The first wait for a queue the listener never watched may return at once: done here.
    _ = await store.waitForWork(queue: decomposed, timeout: .milliseconds(300))
    let waiter = Task { await store.waitForWork(queue: decomposed, timeout: .seconds(4)) }
    _ = try await store.enqueue(
      [NewJob(payload: Data("x".utf8), runAt: epoch)], queue: composed, clock: FixedJobClock(epoch))
    let woke = await waiter.value
    let counts = try await store.counts(queue: decomposed, clock: FixedJobClock(epoch))
    #expect(!woke, "the waiter of \(scalarsInHex(decomposed)) was told of work; its counts: \(counts)")
    await store.close()
  }

  /// The listener keeps the returns owed to a queue's watchers (a notification that came while
  /// its watcher was between two waits) under a `String` key: the waiter of "cafe\u{301}" takes
  /// the return owed to "caf\u{E9}", whose watcher then sleeps on a ready job (a lost wake-up).
  @Test func aReturnOwedToOneQueueIsNotTakenByAnEquivalentName() async throws {
    let store = try await openCallerClockStore()
    let composed = "caf\u{E9}"
    let decomposed = "cafe\u{301}"
    _ = await store.waitForWork(queue: composed, timeout: .seconds(30))
    _ = await store.waitForWork(queue: decomposed, timeout: .milliseconds(300))
    // No wait in progress: the add's notification is owed to the composed queue's next wait.
    _ = try await store.enqueue(
      [NewJob(payload: Data("x".utf8), runAt: epoch)], queue: composed, clock: FixedJobClock(epoch))
    try await eventually("the notification came", timeout: .seconds(30)) {
      store.listener!.owedReturns(composed) > 0
    }
    let otherWoke = await store.waitForWork(queue: decomposed, timeout: .seconds(2))
    let ownWoke = await store.waitForWork(queue: composed, timeout: .seconds(2))
    let counts = try await store.counts(queue: composed, clock: FixedJobClock(epoch))
    #expect(!otherWoke, "the other queue's waiter was told of work")
    #expect(ownWoke, "the composed queue's watcher missed its notification; its counts: \(counts)")
    await store.close()
  }
}
