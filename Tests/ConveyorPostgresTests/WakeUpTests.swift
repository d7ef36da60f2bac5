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
}
