import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import Conveyor

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#elseif canImport(Darwin)
  import Darwin
#endif

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

/// The lease keeper: every queue's keeper heartbeats its claims on one shared thread
/// (`ThreadExecutor.leases`), so one keeper must neither starve the others nor heartbeat after it
/// was cancelled or its queue shut down, and errors from the store must not stop it; it sleeps
/// with `JobClock.sleep(untilUptime:)`, whose default (for clocks that leave it to the protocol)
/// must not wake early, trap, or miss a deadline reached in steps. Serialized: the tests hold the
/// shared thread on purpose.
@Suite("Lease keeper and the default sleep(untilUptime:)", .serialized)
struct LeaseKeeperTests {
  func configuration(
    _ name: String, lease: Duration, clock: any JobClock, poll: Duration = .seconds(1)
  ) -> JobQueueConfiguration {
    JobQueueConfiguration(
      identifier: name, retryPolicy: .fixed(.seconds(15)), concurrency: 1, leaseDuration: lease,
      pollInterval: poll, clock: clock)
  }

  // Failed before the fix (once a heartbeat fell due a third of the lease after the last one
  // started): every queue's lease keeper shares one thread
  // (`ThreadExecutor.leases`). When a heartbeat took longer than a third of the lease, the next
  // was due at once, and a sleep until a past deadline returned without suspending; with a store
  // whose heartbeat does not suspend either (it works on the caller's thread), the keeper never
  // gave the thread up again, and every other queue's keeper stopped heartbeating. A keeper due
  // at once now yields first.
  @Test("a slow inline heartbeat in one queue does not starve another queue's lease keeper")
  func slowInlineHeartbeatDoesNotStarveOtherKeepers() async throws {
    // Queue B: ordinary store, manual clock, 30 s lease (heartbeats every 10 s of its clock).
    let clockB = ManualJobClock()
    let storeB = InstrumentedJobStore()
    let gateB = Gate()
    let queueB = try await queueHoldingAJob(
      configuration("keeper-b", lease: .seconds(30), clock: clockB), store: storeB, until: gateB)
    let asleep = try await mostAsleep(on: clockB)

    // Queue A: a 30 ms lease (the shortest accepted; heartbeats every 10 ms) and a store whose
    // heartbeat takes 15 ms on the caller's thread.
    let storeA = InstrumentedJobStore()
    storeA.runAfterEachHeartbeat {
      let until = ContinuousClock.now + .milliseconds(15)
      while ContinuousClock.now < until { usleep(1_000) }
    }
    let gateA = Gate()
    let queueA = try await queueHoldingAJob(
      configuration("keeper-a", lease: .milliseconds(30), clock: SystemJobClock(), poll: .milliseconds(50)),
      store: storeA, until: gateA)
    try await eventually("A's keeper heartbeats") { storeA.calls["heartbeat", default: 0] >= 3 }

    // B's heartbeat falls due.
    try await waitUntilAsleep(asleep, on: clockB)
    clockB.advance(by: .seconds(10))
    let heartbeatB = await eventually(timeout: .seconds(15)) { storeB.calls["heartbeat", default: 0] >= 1 }

    // Free the shared thread before anything else (and before the expectation's report).
    gateA.open()
    await queueA.shutdown(gracePeriod: .seconds(1))
    #expect(
      heartbeatB,
      "B's heartbeat, due at +10 s, never ran while A's keeper heartbeated back-to-back (A: \(storeA.calls["heartbeat", default: 0]) heartbeats)"
    )
    gateB.open()
    await queueB.shutdown(gracePeriod: .seconds(1))
  }

  // A store whose heartbeat always fails backs off, from the failure; with the manual clock
  // not moving, it makes only the calls that came due.
  @Test("an always-failing heartbeat on a frozen clock does not spin")
  func failingHeartbeatOnFrozenClockDoesNotSpin() async throws {
    let clock = ManualJobClock()
    let store = InstrumentedJobStore()
    store.fail("heartbeat", times: .max)
    let gate = Gate()
    let queue = try await queueHoldingAJob(
      configuration("keeper-c", lease: .seconds(30), clock: clock), store: store, until: gate)
    let asleep = try await mostAsleep(on: clock)
    clock.advance(by: .seconds(10))
    try await eventually("the first heartbeat failed") { store.calls["heartbeat", default: 0] >= 1 }
    try await waitUntilAsleep(asleep, on: clock)
    try await Task.sleep(for: .milliseconds(500))
    #expect(store.calls["heartbeat", default: 0] == 1)
    // Retries 200 ms, 400 ms, 800 ms, 1.6 s, 3.2 s, 3.2 s ... after each failure: seven over 15 s.
    for _ in 0..<150 {
      try await waitUntilAsleep(asleep, on: clock)
      clock.advance(by: .milliseconds(100))
    }
    try await Task.sleep(for: .milliseconds(200))
    let calls = store.calls["heartbeat", default: 0]
    #expect(calls >= 5 && calls <= 10, "heartbeats: \(calls)")
    gate.open()
    await queue.shutdown(gracePeriod: .seconds(1))
  }

  // Failed before the fix: a store whose heartbeat threw `CancellationError` (a driver reporting
  // an interrupted statement so, say) while the keeper's task was not cancelled stopped the
  // keeper for good, and every lease the queue held ran out. Only the keeper's own cancellation
  // stops it now; any other error is a failed heartbeat, tried again.
  @Test("a CancellationError from the store does not stop the lease keeper")
  func cancellationErrorFromTheStoreIsAFailure() async throws {
    let clock = ManualJobClock()
    let store = InstrumentedJobStore()
    store.fail("heartbeat", times: 1, with: CancellationError())
    let gate = Gate()
    let queue = try await queueHoldingAJob(
      configuration("keeper-d", lease: .seconds(30), clock: clock), store: store, until: gate)
    let asleep = try await mostAsleep(on: clock)
    clock.advance(by: .seconds(10))
    try await eventually("the first heartbeat failed") { store.calls["heartbeat", default: 0] >= 1 }
    // Retried 200 ms after the failure, and then every 10 s.
    for _ in 0..<10 {
      try await waitUntilAsleep(asleep, on: clock, timeout: .seconds(20))
      clock.advance(by: .milliseconds(100))
    }
    try await eventually("the heartbeat tried again", timeout: .seconds(20)) {
      store.calls["heartbeat", default: 0] >= 2
    }
    try await eventually("the lease runs 30 s ahead of the retry") {
      let running = try await store.base.jobs(queue: "keeper-d", status: .running, after: nil, limit: 1)
      return running.first?.leaseExpiresAt.map { $0.timeIntervalSince(clock.now()) } ?? 0 > 29
    }
    gate.open()
    await queue.shutdown(gracePeriod: .seconds(1))
  }

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
      store: store, queue: "keeper-yield", lease: Lease(owner: "test", duration: .seconds(30)), clock: clock,
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
      configuration("keeper-qa", lease: .seconds(30), clock: clockA), store: storeA, until: gateA
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
      configuration("keeper-qb", lease: .milliseconds(300), clock: clockB), store: storeB,
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
      configuration("keeper-steps", lease: .seconds(3), clock: clock, poll: .seconds(60)),
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
}
