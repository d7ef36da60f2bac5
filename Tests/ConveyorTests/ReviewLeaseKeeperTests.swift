import Conveyor
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// Blocks the calling thread (a store doing its work inline, e.g. waiting on its lock). Called
/// only from a lease keeper's heartbeat, which runs on `Conveyor.leases`, not the cooperative pool.
private func blockCallingThread(milliseconds: UInt32) {
  usleep(milliseconds * 1000)
}

/// A store whose heartbeat does its work on the caller's thread and takes `milliseconds` (as
/// `InMemoryJobStore` does under its lock, or any store with a synchronous driver): it never
/// suspends its caller.
final class InlineSlowHeartbeatStore: JobStore {
  let base = InMemoryJobStore()
  let milliseconds: UInt32
  init(milliseconds: UInt32) { self.milliseconds = milliseconds }

  func enqueue(_ jobs: [NewJob], queue: String, clock: any JobClock) async throws -> [EnqueueResult] {
    try await base.enqueue(jobs, queue: queue, clock: clock)
  }
  func settleAndClaim(
    _ settlements: [JobSettlement], queue: String, limit: Int, lease: Lease, clock: any JobClock
  ) async throws -> ClaimBatch {
    try await base.settleAndClaim(settlements, queue: queue, limit: limit, lease: lease, clock: clock)
  }
  func heartbeat(_ claims: [ClaimReference], queue: String, lease: Lease, clock: any JobClock)
    async throws -> [ClaimReference]
  {
    blockCallingThread(milliseconds: milliseconds)
    return try await base.heartbeat(claims, queue: queue, lease: lease, clock: clock)
  }
  func rescueExpiredLeases(queue: String, clock: any JobClock) async throws -> Int {
    try await base.rescueExpiredLeases(queue: queue, clock: clock)
  }
  func counts(queue: String, clock: any JobClock) async throws -> JobCounts {
    try await base.counts(queue: queue, clock: clock)
  }
  func jobs(queue: String, status: JobStatus?, after: JobID?, limit: Int) async throws -> [JobRecord] {
    try await base.jobs(queue: queue, status: status, after: after, limit: limit)
  }
  func job(_ id: JobID) async throws -> JobRecord? { try await base.job(id) }
  func remove(_ ids: [JobID], queue: String) async throws -> Int { try await base.remove(ids, queue: queue) }
  func clear(queue: String, statuses: Set<JobStatus>) async throws -> Int {
    try await base.clear(queue: queue, statuses: statuses)
  }
  func requeueDead(_ ids: [JobID]?, queue: String, clock: any JobClock) async throws -> Int {
    try await base.requeueDead(ids, queue: queue, clock: clock)
  }
  func setPaused(_ paused: Bool, queue: String) async throws {
    try await base.setPaused(paused, queue: queue)
  }
  func isPaused(queue: String) async throws -> Bool { try await base.isPaused(queue: queue) }
  func nextWake(queue: String, clock: any JobClock) async throws -> WakeHint {
    try await base.nextWake(queue: queue, clock: clock)
  }
  func queueNames() async throws -> [String] { try await base.queueNames() }
}

@Suite("Review: lease keeper", .serialized)
struct ReviewLeaseKeeperTests {
  func configuration(
    _ name: String, lease: Duration, clock: any JobClock, poll: Duration = .seconds(1)
  ) -> JobQueueConfiguration {
    JobQueueConfiguration(
      identifier: name, retryPolicy: .fixed(.seconds(15)), concurrency: 1, leaseDuration: lease,
      pollInterval: poll, clock: clock)
  }

  // Every queue's lease keeper shares one thread (`ThreadExecutor.leases`). A heartbeat that took
  // longer than a third of the lease is now "followed by the next at once": the keeper's sleep
  // until a past deadline returns without suspending, so with a store whose heartbeat does not
  // suspend (works inline, as InMemoryJobStore does), the keeper never gives the thread up again.
  // Every other queue's keeper in the process stops heartbeating, and their leases lapse. Before
  // the change the keeper slept a third of the lease after each heartbeat, and so let go.
  @Test("a slow inline heartbeat in one queue does not starve another queue's lease keeper")
  func slowInlineHeartbeatDoesNotStarveOtherKeepers() async throws {
    // Queue B: ordinary store, manual clock, 30 s lease (heartbeats every 10 s of its clock).
    let clockB = ManualJobClock()
    let storeB = InstrumentedJobStore()
    let gateB = Gate()
    let startedB = Flag()
    let queueB = try JobQueue<EngineItem>(
      configuration: configuration("review-b", lease: .seconds(30), clock: clockB), store: storeB
    ) {
      _, _ in
      startedB.set()
      await gateB.wait()
      return .handled
    }
    try await queueB.add(EngineItem(number: 1))
    try await eventually("B's job started") { startedB.isSet }
    let asleep = try await mostAsleep(on: clockB)

    // Queue A: a 30 ms lease (the shortest accepted; heartbeats every 10 ms) and a store whose
    // heartbeat takes 15 ms on the caller's thread.
    let storeA = InstrumentedJobStore(InlineSlowHeartbeatStore(milliseconds: 15))
    let gateA = Gate()
    let startedA = Flag()
    let queueA = try JobQueue<EngineItem>(
      configuration: configuration(
        "review-a", lease: .milliseconds(30), clock: SystemJobClock(), poll: .milliseconds(50)),
      store: storeA
    ) { _, _ in
      startedA.set()
      await gateA.wait()
      return .handled
    }
    try await queueA.add(EngineItem(number: 1))
    try await eventually("A's job started") { startedA.isSet }
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
    let started = Flag()
    let queue = try JobQueue<EngineItem>(
      configuration: configuration("review-c", lease: .seconds(30), clock: clock), store: store
    ) {
      _, _ in
      started.set()
      await gate.wait()
      return .handled
    }
    try await queue.add(EngineItem(number: 1))
    try await eventually("the job started") { started.isSet }
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
    let started = Flag()
    let queue = try JobQueue<EngineItem>(
      configuration: configuration("review-d", lease: .seconds(30), clock: clock), store: store
    ) { _, _ in
      started.set()
      await gate.wait()
      return .handled
    }
    try await queue.add(EngineItem(number: 1))
    try await eventually("the job started") { started.isSet }
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
