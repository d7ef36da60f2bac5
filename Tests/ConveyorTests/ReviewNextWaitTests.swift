import Conveyor
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

/// Review probes of `nextWait`: a lease that looks past by the worker's clock but is not rescued.
@Suite("Review: nextWait with a store clock behind the worker's")
struct ReviewNextWaitTests {
  func configuration(poll: Duration) -> JobQueueConfiguration {
    JobQueueConfiguration(
      identifier: "nw", retryPolicy: .fixed(.seconds(15)), maxAttempts: nil, concurrency: 2, autoStart: true,
      leaseDuration: .seconds(60), pollInterval: poll, clock: SystemJobClock(), log: nil)
  }

  // (held) Another process holds a running job (claimed on the store directly, never heartbeated
  // by this process) and a job is scheduled an hour ahead; the store's clock is an hour behind:
  // the watcher neither finishes nor spins, and finishes once both are gone.
  @Test func aPastLookingLeaseBesideAScheduledJobKeepsTheQueueUnfinishedWithoutSpinning() async throws {
    let base = InMemoryJobStore()
    let clock = SystemJobClock()
    _ = try await base.enqueue(
      [NewJob(payload: try JSONEncoder().encode(EngineItem(number: 1)))], queue: "nw", clock: clock)
    let held = try await base.settleAndClaim(
      [], queue: "nw", limit: 1, lease: Lease(owner: "elsewhere", duration: .seconds(600)), clock: clock
    ).claimed
    #expect(held.count == 1)
    let scheduled = try await base.enqueue(
      [NewJob(payload: try JSONEncoder().encode(EngineItem(number: 2)), runTime: .after(.seconds(3600)))],
      queue: "nw", clock: clock)
    let store = InstrumentedJobStore(base)
    store.skewLeaseExpiries(by: -3600)
    let watcher = try JobQueue<EngineItem>(
      configuration: configuration(poll: .milliseconds(100)), store: store
    ) {
      _, _ in
      Issue.record("the watcher must not run these jobs")
      return .handled
    }
    let finished = Flag()
    let waiter = Task {
      await watcher.waitUntilFinished()
      finished.set()
    }
    try await Task.sleep(for: .seconds(1))
    let calls = store.totalCalls
    #expect(!finished.isSet, "waitUntilFinished returned while another process's job was running")
    #expect(calls < 200, "store calls in 1 s with a 100 ms poll: \(store.calls)")
    // The other process finishes; the scheduled job is removed.
    _ = try await base.settleAndClaim(
      [JobSettlement(claim: held[0].claim, action: .complete)], queue: "nw", limit: 0,
      lease: Lease(owner: "elsewhere", duration: .seconds(600)), clock: clock)
    #expect(try await base.remove([scheduled[0].id], queue: "nw") == 1)
    #expect(await eventually(timeout: .seconds(90)) { finished.isSet }, "waitUntilFinished returns")
    waiter.cancel()
    await watcher.shutdown(gracePeriod: .seconds(1))
  }
}
