import Conveyor
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import ConveyorPostgres

/// Review 4 of commit f486bd3: the listener's `Owed(count, served)`.
@Suite("Review 4: the listener's owed returns", .serialized)
struct Review4ListenerTests {
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
}
