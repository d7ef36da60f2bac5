import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import Conveyor

private struct R5Step: Queueable {
  var name: String
}

@Suite("Review 5: batched claim-ahead", .timeLimit(.minutes(3)))
struct Review5BatchAheadTests {
  private func configuration(concurrency: Int = 1) -> JobQueueConfiguration {
    var configuration = JobQueueConfiguration(
      identifier: "r5", concurrency: concurrency, autoStart: false, pollInterval: .seconds(3_600))
    // Long leases: the loop also wakes at the next lease expiry, which would record the outcomes
    // after a lease (60 s by default) rather than the promised 50 ms hold.
    configuration.leaseDuration = .seconds(600)
    configuration.claimAheadStoreCallFloor = .seconds(1)
    // And every job that took under a minute as short, however loaded the machine.
    configuration.claimAheadJobCeiling = .seconds(60)
    return configuration
  }

  /// The loop's look at the store (`nextWake`) is slow once, while a batch is held: by the time
  /// it computes its sleep the worker has popped the batch's last job, so the buffer is empty and
  /// the loop sleeps for `pollInterval` (an hour). The outcomes of b, c and d, left by the worker
  /// "for its next claim", are not recorded while the batch's last job runs: the promise "an
  /// outcome so left waits at most until the 50 ms hold passes" is broken.
  @Test
  func outcomesLeftByABatchAreRecordedEvenWhenTheLoopLooksLate() async throws {
    let base = InMemoryJobStore()
    let armed = Mutex(true)
    let loopInWake = Gate()
    let wakeGoes = Gate()
    let store = HookedStore(
      base,
      wakeHook: {
        // Once: the first look at the store made while a batch (4 jobs) is claimed.
        let running = (try? await base.counts(queue: "r5", clock: SystemJobClock()).running) ?? 0
        guard running >= 4,
          armed.withLock({ a in
            defer { a = false }
            return a
          })
        else { return }
        loopInWake.open()
        await wakeGoes.wait()
      })
    let slowStarted = Gate()
    let release = Gate()
    let loopSeen = Mutex(false)
    let queue = try JobQueue<R5Step>(configuration: configuration(), store: store) { step, _ in
      if step.name == "b" {
        // The loop, woken by the batch's claim, is looking at the store. (Not always: on a loaded
        // machine its look can come before the batch's claim, and it then hands the batch back
        // at its hold instead. The outcomes must be recorded either way.)
        let seen = await eventually(timeout: .seconds(5)) { armed.withLock { !$0 } }
        loopSeen.withLock { $0 = seen }
      }
      if step.name == "slow" {
        slowStarted.open()
        await release.wait()
      }
      return .handled
    }
    defer {
      wakeGoes.open()
      release.open()
    }
    try await queue.add(contentsOf: ["a", "b", "c", "d", "slow", "e"].map { R5Step(name: $0) })
    queue.start()
    await slowStarted.wait()
    // Whether the scenario came about (it does when this test runs alone).
    let scenario = loopSeen.withLock { $0 }
    // The loop's look ends now; the buffer is empty (slow was popped), b/c/d outcomes unrecorded.
    wakeGoes.open()
    var recorded = true
    do {
      try await eventually("the outcomes of a, b, c and d recorded", timeout: .seconds(60)) {
        try await base.counts(queue: "r5", clock: SystemJobClock()).unfinished == 2
      }
    } catch {
      recorded = false
    }
    let counts = try await base.counts(queue: "r5", clock: SystemJobClock())
    #expect(recorded, "after 60 s while 'slow' runs (loop held in its look: \(scenario)): \(counts)")
    release.open()
    await queue.waitUntilFinished()
    await queue.shutdown()
    #expect(try await base.counts(queue: "r5", clock: SystemJobClock()).unfinished == 0)
  }

  /// The same, with no hook: many rounds on the plain in-memory store. Each round: a short job,
  /// then a batch of three short jobs and a long one; the three outcomes must be recorded while the
  /// long job runs.
  @Test
  func roundsOfBatchesEndingInALongJobOnThePlainStore() async throws {
    let store = InMemoryJobStore()
    let started = Mutex<Int>(-1)
    let releases = Mutex<[Int: Gate]>([:])
    @Sendable func gate(_ i: Int) -> Gate {
      releases.withLock { gates in
        if let gate = gates[i] { return gate }
        let gate = Gate()
        gates[i] = gate
        return gate
      }
    }
    let queue = try JobQueue<R5Step>(configuration: configuration(), store: store) { step, _ in
      if step.name.hasPrefix("d") {
        // A little work (a few to a few hundred microseconds), varied by round, so the loop's
        // turn sometimes straddles the moment the batch's last job is taken.
        let micros = Int(step.name.dropFirst(1))! % 300
        let start = ContinuousClock.now
        while ContinuousClock.now - start < .microseconds(micros) {}
      }
      if step.name.hasPrefix("slow") {
        let i = Int(step.name.dropFirst(4))!
        started.withLock { $0 = i }
        await gate(i).wait()
      }
      return .handled
    }
    defer { for i in 0..<150 { gate(i).open() } }
    queue.start()
    var stuck: [Int] = []
    for round in 0..<150 {
      try await queue.add(contentsOf: ["a", "b", "c", "d\(round)", "slow\(round)"].map { R5Step(name: $0) })
      try await eventually("slow\(round) started", timeout: .seconds(60)) { started.withLock { $0 == round } }
      do {
        try await eventually("round \(round) outcomes recorded", timeout: .seconds(60)) {
          try await store.counts(queue: "r5", clock: SystemJobClock()).unfinished == 1
        }
      } catch {
        let counts = try await store.counts(queue: "r5", clock: SystemJobClock())
        Issue.record("round \(round): after 60 s while slow\(round) runs: \(counts)")
        stuck.append(round)
        gate(round).open()
        break
      }
      gate(round).open()
      try await eventually("round \(round) done", timeout: .seconds(60)) {
        try await store.counts(queue: "r5", clock: SystemJobClock()).unfinished == 0
      }
    }
    #expect(stuck.isEmpty, "outcomes left unrecorded for 60 s in round(s) \(stuck)")
    await queue.shutdown()
  }
}
