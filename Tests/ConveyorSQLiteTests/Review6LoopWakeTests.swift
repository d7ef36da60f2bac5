import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import Conveyor

private struct R6Step: Queueable {
  var name: String
}

/// A manual clock whose monotonic reading moves on by a nanosecond at every read, as a real
/// clock does between two reads (time passes while code runs); otherwise it moves only when the
/// test advances it, so no hold or poll ever passes unless the test says so.
private final class R6TickingClock: JobClock {
  let base = ManualJobClock()
  func now() -> Date { base.now() }
  func sleep(until deadline: Date) async throws { try await base.sleep(until: deadline) }
  func uptime() -> Duration {
    base.advance(by: .nanoseconds(1))
    return base.uptime()
  }
  func sleep(untilUptime deadline: Duration) async throws { try await base.sleep(untilUptime: deadline) }
}

@Suite("Review 6: the loop's undisturbed sleep", .timeLimit(.minutes(3)))
struct Review6LoopWakeTests {
  private func configuration(clock: any JobClock, floor: Duration) -> JobQueueConfiguration {
    var configuration = JobQueueConfiguration(
      identifier: "r6", concurrency: 1, autoStart: false, pollInterval: .seconds(3_600))
    configuration.leaseDuration = .seconds(600)
    configuration.claimAheadStoreCallFloor = floor
    configuration.clock = clock
    return configuration
  }

  /// Batch mode (a store call under the floor). The loop, woken by the batch's claim, goes to
  /// sleep "until the batch's hold" — but its deadline is computed as `uptime() + (due - an
  /// earlier uptime())`, so it lies past the hold by the time spent between the two reads. A
  /// worker finishing a batch job then finds `loopSleepsUntil > due` and wakes the loop, which
  /// records that single outcome in a call of its own: the outcome is not "left for the worker's
  /// next claim", and the loop is disturbed although it would wake in time anyway. With a real
  /// clock some nanoseconds always pass between the two reads, so this happens on every job of
  /// every batch taken while the loop sleeps on the hold.
  @Test
  func aBatchJobFinishingWhileTheLoopSleepsOnTheHoldDoesNotWakeIt() async throws {
    let clock = R6TickingClock()
    let probe = StoreProbe()
    let store = probe.store(over: InMemoryJobStore())
    let ids = Mutex<[String: JobID]>([:])
    let bStarted = Gate()
    let bGoes = Gate()
    let queue = try JobQueue<R6Step>(
      configuration: configuration(clock: clock, floor: .seconds(1)), store: store
    ) {
      step, context in
      ids.withLock { $0[step.name] = context.id }
      if step.name == "b" {
        bStarted.open()
        await bGoes.wait()
      }
      return .handled
    }
    defer { bGoes.open() }
    try await queue.add(contentsOf: ["a", "b", "c", "d", "e"].map { R6Step(name: $0) })
    queue.start()
    await bStarted.wait()
    // The batch (b running; c, d, e held) is claimed; wait until the loop sleeps on its hold.
    // Two looks at the store: the loop has turned since the batch's claim signalled it (the
    // signal may have arrived while it was awake, and been kept for its next sleep).
    try await eventually("the loop asleep on the batch's hold", timeout: .seconds(60)) {
      probe.wakeCalls.withLock { $0 } >= 2
        && queue.core.withLock { core in
          guard let until = core.state.loopSleepsUntil, core.state.loopDue(canHandle: true) != nil else {
            return false
          }
          return until < clock.base.uptime() + .seconds(1)
        }
    }
    let (sleepsUntil, due, mustWake) = queue.core.withLock { core in
      (core.state.loopSleepsUntil!, core.state.loopDue(canHandle: true)!, core.state.loopMustWake)
    }
    #expect(
      sleepsUntil <= due,
      "the loop sleeps until \(sleepsUntil), past the hold it computed its sleep for (\(due)): a worker will wake it (loopMustWake \(mustWake))"
    )
    bGoes.open()
    // Not `waitUntilFinished` yet: it wakes the loop for a finish check, which would record what
    // is outstanding at that moment. The worker's claim after e records b, c, d and e.
    try await eventually("every job recorded", timeout: .seconds(60)) {
      try await store.counts(queue: "r6", clock: clock).unfinished == 0
    }
    await queue.waitUntilFinished()
    await queue.shutdown()
    let b = try #require(ids.withLock { $0["b"] })
    let recordedB = probe.calls.all.filter { $0.ids.contains(b) }
    #expect(recordedB.count == 1)
    #expect(
      recordedB.allSatisfy { $0.limit > 0 },
      "b's outcome should be left for the worker's next claim; the loop recorded it alone: \(recordedB.map { "(\($0.ids.count) outcome(s), limit \($0.limit))" })"
    )
    #expect(try await store.counts(queue: "r6", clock: clock).unfinished == 0)
  }

  /// One-ahead mode on a manual clock. `nextWake` fails (the store answers claims but not the
  /// loop's look): the loop sleeps its error backoff (100 ms, 200 ms, ... 5 s) and ignores the
  /// hold of a job claimed ahead. A worker's claim ahead wakes it (it sleeps past the hold), but
  /// the loop's turn fails again and it goes back to sleep for the longer backoff: the job held
  /// while every slot is busy is not handed back when its 50 ms hold passes.
  @Test
  func aJobClaimedAheadIsHandedBackAtItsHoldWhileTheLoopBacksOff() async throws {
    let clock = ManualJobClock()
    let probe = StoreProbe()
    let store = probe.store(over: InMemoryJobStore())
    probe.failWake.withLock { $0 = true }
    let bStarted = Gate()
    let bGoes = Gate()
    let queue = try JobQueue<R6Step>(configuration: configuration(clock: clock, floor: .zero), store: store) {
      step, _ in
      if step.name == "b" {
        bStarted.open()
        await bGoes.wait()
      }
      return .handled
    }
    defer { bGoes.open() }
    try await queue.add(contentsOf: ["a", "b", "c"].map { R6Step(name: $0) })
    queue.start()
    await bStarted.wait()
    // c is held (claimed ahead with b); the loop has looked (and failed) since and sleeps.
    try await eventually("the loop asleep after the claim ahead", timeout: .seconds(60)) {
      probe.wakeCalls.withLock { $0 } >= 2
        && queue.core.withLock { $0.state.loopSleepsUntil != nil && !$0.state.buffer.isEmpty }
    }
    let (sleepsUntil, due) = queue.core.withLock {
      ($0.state.loopSleepsUntil!, $0.state.loopDue(canHandle: true)!)
    }
    // Past c's 50 ms hold; b still holds the only slot.
    clock.advance(by: .milliseconds(60))
    var handedBack = true
    do {
      try await eventually("c handed back", timeout: .seconds(60)) {
        probe.calls.all.contains { $0.releases > 0 && $0.limit == 0 }
      }
    } catch {
      handedBack = false
    }
    #expect(
      handedBack,
      "60 s after the clock passed c's hold (\(due)) c was not handed back: the loop backs off until \(sleepsUntil)"
    )
    probe.failWake.withLock { $0 = false }
    bGoes.open()
    clock.advance(by: .seconds(10))
    await queue.shutdown()
  }
}
