import Conveyor
import ConveyorTestSupport
import Foundation
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#elseif canImport(Darwin)
  import Darwin
#endif

@Suite("Review: lease keeper", .serialized)
struct ReviewLeaseKeeperTests {
  func configuration(
    _ name: String, lease: Duration, clock: any JobClock, poll: Duration = .seconds(1)
  ) -> JobQueueConfiguration {
    JobQueueConfiguration(
      identifier: name, retryPolicy: .fixed(.seconds(15)), concurrency: 1, leaseDuration: lease,
      pollInterval: poll, clock: clock)
  }

  // Failed before the fix (review of the change that made a heartbeat due a third of the lease
  // after the last one started): every queue's lease keeper shares one thread
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
      configuration("review-b", lease: .seconds(30), clock: clockB), store: storeB, until: gateB)
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
      configuration("review-a", lease: .milliseconds(30), clock: SystemJobClock(), poll: .milliseconds(50)),
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

  // Held: a store whose heartbeat always fails backs off, from the failure; with the manual clock
  // not moving, it makes only the calls that came due.
  @Test("an always-failing heartbeat on a frozen clock does not spin")
  func failingHeartbeatOnFrozenClockDoesNotSpin() async throws {
    let clock = ManualJobClock()
    let store = InstrumentedJobStore()
    store.fail("heartbeat", times: .max)
    let gate = Gate()
    let queue = try await queueHoldingAJob(
      configuration("review-c", lease: .seconds(30), clock: clock), store: store, until: gate)
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
      configuration("review-d", lease: .seconds(30), clock: clock), store: store, until: gate)
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
      let running = try await store.base.jobs(queue: "review-d", status: .running, after: nil, limit: 1)
      return running.first?.leaseExpiresAt.map { $0.timeIntervalSince(clock.now()) } ?? 0 > 29
    }
    gate.open()
    await queue.shutdown(gracePeriod: .seconds(1))
  }
}
