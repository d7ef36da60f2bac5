import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import Conveyor

/// A user's clock whose monotonic reading runs at half the rate of its wall clock, leaving
/// `sleep(untilUptime:)` to the protocol's default.
struct HalfRateUptimeClock: JobClock {
  let base: ManualJobClock
  func now() -> Date { base.now() }
  func sleep(until deadline: Date) async throws { try await base.sleep(until: deadline) }
  func uptime() -> Duration { base.uptime() / 2 }
}

/// A clock with only `now()` and `sleep(until:)`: both monotonic methods are the defaults.
struct WallOnlyClock: JobClock {
  func now() -> Date { Date() }
  func sleep(until deadline: Date) async throws { try await SystemJobClock().sleep(until: deadline) }
}

/// Review of the lease keeper's yield, its handling of errors, and the default
/// `sleep(untilUptime:)`. Each test failed on the code it names.
@Suite("Review 2: lease keeper and default sleep", .serialized)
struct Review2LeaseKeeperTests {
  // Failed before the fix: a keeper whose heartbeat was due at once yielded the shared thread,
  // and the yield, unlike the sleep it stood in for, does not end at a cancellation: cancelled
  // while it waited for the thread, the keeper heartbeated once more.
  @Test("a keeper cancelled while it yields the shared thread makes no further heartbeat")
  func keeperCancelledWhileYieldingDoesNotHeartbeat() async throws {
    let clock = ManualJobClock()
    let store = InstrumentedJobStore()
    let otherKeeperRuns = Flag()
    let release = DispatchSemaphore(value: 0)
    store.runAfterEachHeartbeat {
      guard store.calls["heartbeat", default: 0] == 1 else { return }
      // This heartbeat took a third of the lease: the next is due at once.
      clock.advance(by: .seconds(10))
      // Another queue's keeper has the thread next (its store works on it for a while).
      Task(executorPreference: ThreadExecutor.leases) {
        otherKeeperRuns.set()
        release.wait()
      }
    }
    let claim = ClaimReference(id: JobID(1), token: 1)
    let keeper = LeaseKeeper(
      store: store, queue: "review2-a", lease: Lease(owner: "test", duration: .seconds(30)), clock: clock,
      held: { [claim] }, lost: { _ in }, log: { _, _ in }
    ).start()
    try await waitUntilAsleep(1, on: clock)
    clock.advance(by: .seconds(10))
    // The other keeper runs only once ours gave up the thread (ours waits behind it now).
    try await eventually("the other keeper has the thread") { otherKeeperRuns.isSet }
    keeper.cancel()
    release.signal()
    await keeper.value
    let heartbeats = store.calls["heartbeat", default: 0]
    #expect(heartbeats == 1, "heartbeats after the keeper's cancellation: \(heartbeats - 1)")
  }

  // Failed before the fix (the same through the public API): queue B's shutdown returned (its
  // final outcome could not be stored, so its claim was still held), and its keeper, waiting for
  // the shared thread behind queue A's, then heartbeated the job B had given up.
  @Test("no heartbeat after shutdown returns when the keeper was yielding the shared thread")
  func noHeartbeatAfterShutdownReturns() async throws {
    // Queue A: once armed, its store's heartbeat holds the shared thread until released.
    let clockA = ManualJobClock()
    let armA = Flag()
    let aHoldsThread = Flag()
    let releaseA = DispatchSemaphore(value: 0)
    let storeA = InstrumentedJobStore()
    storeA.runAfterEachHeartbeat {
      guard armA.isSet, !aHoldsThread.isSet else { return }
      aHoldsThread.set()
      releaseA.wait()
    }
    let gateA = Gate()
    let queueA = try await queueHoldingAJob(
      configuration(identifier: "review2-qa", lease: .seconds(30), clock: clockA), store: storeA, until: gateA
    )
    let asleepA = try await mostAsleep(on: clockA)

    // Queue B: a 300 ms lease (heartbeats every 100 ms of its manual clock).
    let clockB = ManualJobClock()
    let armB = Mutex(false)
    let storeB = InstrumentedJobStore()
    storeB.runAfterEachHeartbeat {
      guard
        armB.withLock({ armed in
          defer { armed = false }
          return armed
        })
      else { return }
      // This heartbeat took a third of B's lease: B's next is due at once ...
      clockB.advance(by: .milliseconds(100))
      // ... and A's keeper falls due, so it has the shared thread before B's keeper again.
      armA.set()
      clockA.advance(by: .seconds(10))
    }
    let gateB = Gate()
    let queueB = try await queueHoldingAJob(
      configuration(identifier: "review2-qb", lease: .milliseconds(300), clock: clockB), store: storeB,
      until: gateB)
    try await waitUntilAsleep(try await mostAsleep(on: clockB), on: clockB)
    armB.withLock { $0 = true }
    clockB.advance(by: .milliseconds(100))
    try await eventually("A's keeper holds the shared thread, B's waits behind it") { aHoldsThread.isSet }

    // B shuts down: its store cannot record the outcome, so the claim stays held.
    storeB.fail("settleAndClaim", times: .max)
    gateB.open()
    await queueB.shutdown(gracePeriod: .seconds(1))
    let atShutdown = storeB.calls["heartbeat", default: 0]

    releaseA.signal()
    try await waitUntilAsleep(asleepA, on: clockA)
    try await Task.sleep(for: .milliseconds(300))
    let after = storeB.calls["heartbeat", default: 0]
    gateA.open()
    await queueA.shutdown(gracePeriod: .seconds(1))
    #expect(
      after == atShutdown, "B's store heartbeated \(after - atShutdown) time(s) after B's shutdown returned")
  }

  // Failed before the fix: the default measured what was left in uptime() and slept as long on
  // the wall clock, so a clock whose uptime() runs slower woke early.
  @Test("the default sleep(untilUptime:) does not return before uptime() reaches the deadline")
  func defaultSleepWaitsForTheUptimeDeadline() async throws {
    let manual = ManualJobClock()
    let clock = HalfRateUptimeClock(base: manual)
    let deadline = clock.uptime() + .seconds(10)
    let returnedAt = Mutex<Duration?>(nil)
    let sleeper = Task {
      try await clock.sleep(untilUptime: deadline)
      returnedAt.withLock { $0 = clock.uptime() }
    }
    try await waitUntilAsleep(1, on: manual)
    manual.advance(by: .seconds(10))  // uptime() reads 5 s
    try await waitUntilAsleep(1, on: manual, timeout: .seconds(3))
    #expect(returnedAt.withLock { $0 } == nil)
    manual.advance(by: .seconds(10))  // uptime() reads 10 s
    try await sleeper.value
    let at = try #require(returnedAt.withLock { $0 })
    #expect(at >= deadline, "returned at uptime \(at), deadline \(deadline)")
  }

  // Failed before the fix: `deadline - uptime()` (and, before that, the deadline's seconds)
  // trapped for a deadline near the most negative `Duration`.
  @Test("the default sleep(untilUptime:) does not trap on an extreme deadline")
  func defaultSleepDoesNotTrapOnExtremeDeadline() async {
    await #expect(processExitsWith: .success) {
      try? await WallOnlyClock().sleep(untilUptime: Duration(attoseconds: .min))
      try? await WallOnlyClock().sleep(untilUptime: .zero - .seconds(Int64.max))
    }
  }

  // Failed before the fix: the wall-clock target was `now + left` in one `Double` addition, and a
  // wall clock stepped by hand reaches it by many, one rounding short: with uptime() at the
  // keeper's deadline, the keeper never heartbeated.
  @Test("a keeper on a clock with its own uptime() heartbeats once uptime() reaches its deadline")
  func keeperWakesWhenUptimeReachesTheDeadlineInSteps() async throws {
    let manual = ManualJobClock(start: Date(timeIntervalSince1970: 1_704_067_200.123))
    let clock = QueueEngineTests.OwnUptimeClock(base: manual)
    let store = InstrumentedJobStore()
    let gate = Gate()
    let queue = try await queueHoldingAJob(
      configuration(identifier: "review2-steps", lease: .seconds(3), poll: .seconds(60), clock: clock),
      store: store, until: gate)
    let asleep = try await mostAsleep(on: manual)
    let start = clock.uptime()
    // A third of the lease, in steps of 10 ms: uptime() is then exactly at the keeper's deadline.
    for _ in 0..<100 { manual.advance(by: .milliseconds(10)) }
    #expect(clock.uptime() - start == .seconds(1))
    let heartbeated = await eventually(timeout: .seconds(10)) { store.calls["heartbeat", default: 0] >= 1 }
    #expect(heartbeated, "no heartbeat at the deadline; sleepers: \(manual.sleeping) of \(asleep)")
    gate.open()
    manual.advance(by: .seconds(1))
    await queue.shutdown(gracePeriod: .seconds(1))
  }

  func configuration(
    identifier: String, lease: Duration, poll: Duration = .seconds(1), clock: any JobClock
  ) -> JobQueueConfiguration {
    JobQueueConfiguration(
      identifier: identifier, retryPolicy: .fixed(.seconds(15)), concurrency: 1, leaseDuration: lease,
      pollInterval: poll, clock: clock)
  }
}
