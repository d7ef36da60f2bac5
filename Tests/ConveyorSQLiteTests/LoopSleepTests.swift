import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import Conveyor

/// An item of the loop's tests.
private struct LoopStep: Queueable {
  var name: String
}

/// A manual clock whose monotonic reading moves on by a nanosecond at every read, as a real
/// clock does between two reads (time passes while code runs); otherwise it moves only when the
/// test advances it, so no hold or poll ever passes unless the test says so.
private final class TickingClock: JobClock {
  let base = ManualJobClock()
  func now() -> Date { base.now() }
  func sleep(until deadline: Date) async throws { try await base.sleep(until: deadline) }
  func uptime() -> Duration {
    base.advance(by: .nanoseconds(1))
    return base.uptime()
  }
  func sleep(untilUptime deadline: Duration) async throws { try await base.sleep(untilUptime: deadline) }
}

/// While jobs are claimed ahead (one, or a batch on a cheap store), the queue's loop sleeps until
/// the hold of what it holds passes: it must record the outcomes a batch left and hand back a job
/// held too long at that hold (not an hour later at its poll), must not be woken for nothing
/// before, and must not spin when the store fails meanwhile. The poll interval is an hour and
/// leases are ten minutes, so only the hold can wake the loop in time.
@Suite("Claiming ahead: the queue loop's sleep", .timeLimit(.minutes(10)))
struct LoopSleepTests {
  static let queueName = "loop"

  /// A stopped queue of concurrency `concurrency` whose store calls count as cheap below
  /// `floor`; with `shortJobs`, every job that took under a minute counts as short, however loaded
  /// the machine.
  private func configuration(
    floor: Duration, concurrency: Int = 1, clock: any JobClock = SystemJobClock(), shortJobs: Bool = true
  ) -> JobQueueConfiguration {
    var configuration = JobQueueConfiguration(
      identifier: Self.queueName, concurrency: concurrency, claimsAhead: true, autoStart: false,
      pollInterval: .seconds(3_600))
    // Long leases: the loop also wakes at the next lease expiry, which would record the outcomes
    // after a lease (60 s by default) rather than the promised 50 ms hold.
    configuration.leaseDuration = .seconds(600)
    configuration.claimAheadStoreCallFloor = floor
    if shortJobs { configuration.claimAheadJobCeiling = .seconds(60) }
    configuration.clock = clock
    return configuration
  }

  /// Store calls made over one real second (real sleep; test task, not a pool thread blocked).
  private func callsOverASecond(_ probe: StoreProbe) async throws -> Int {
    let before = probe.total
    try await Task.sleep(for: .seconds(1))
    return probe.total - before
  }

  /// Runs `waitUntilFinished` bounded: true when it returned within 60 s.
  private func finishes(_ queue: JobQueue<LoopStep>) async -> Bool {
    let done = Mutex(false)
    let task = Task {
      await queue.waitUntilFinished()
      done.withLock { $0 = true }
    }
    let ok = await eventually(timeout: .seconds(60)) { done.withLock { $0 } }
    if !ok { task.cancel() }
    return ok
  }

  /// The loop's look at the store (`nextWake`) is slow once, while a batch is held: by the time
  /// it computed its sleep the worker has popped the batch's last job, so the buffer is empty and
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
        let running = (try? await base.counts(queue: Self.queueName, clock: SystemJobClock()).running) ?? 0
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
    let queue = try JobQueue<LoopStep>(configuration: configuration(floor: .seconds(1)), store: store) {
      step, _ in
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
    try await queue.add(contentsOf: ["a", "b", "c", "d", "slow", "e"].map { LoopStep(name: $0) })
    queue.start()
    await slowStarted.wait()
    // Whether the scenario came about (it does when this test runs alone).
    let scenario = loopSeen.withLock { $0 }
    // The loop's look ends now; the buffer is empty (slow was popped), b/c/d outcomes unrecorded.
    wakeGoes.open()
    var recorded = true
    do {
      try await eventually("the outcomes of a, b, c and d recorded", timeout: .seconds(60)) {
        try await base.counts(queue: Self.queueName, clock: SystemJobClock()).unfinished == 2
      }
    } catch {
      recorded = false
    }
    let counts = try await base.counts(queue: Self.queueName, clock: SystemJobClock())
    #expect(recorded, "after 60 s while 'slow' runs (loop held in its look: \(scenario)): \(counts)")
    release.open()
    await queue.waitUntilFinished()
    await queue.shutdown()
    #expect(try await base.counts(queue: Self.queueName, clock: SystemJobClock()).unfinished == 0)
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
    let queue = try JobQueue<LoopStep>(configuration: configuration(floor: .seconds(1)), store: store) {
      step, _ in
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
      try await queue.add(
        contentsOf: ["a", "b", "c", "d\(round)", "slow\(round)"].map { LoopStep(name: $0) })
      try await eventually("slow\(round) started", timeout: .seconds(60)) { started.withLock { $0 == round } }
      do {
        try await eventually("round \(round) outcomes recorded", timeout: .seconds(60)) {
          try await store.counts(queue: Self.queueName, clock: SystemJobClock()).unfinished == 1
        }
      } catch {
        let counts = try await store.counts(queue: Self.queueName, clock: SystemJobClock())
        Issue.record("round \(round): after 60 s while slow\(round) runs: \(counts)")
        stuck.append(round)
        gate(round).open()
        break
      }
      gate(round).open()
      try await eventually("round \(round) done", timeout: .seconds(60)) {
        try await store.counts(queue: Self.queueName, clock: SystemJobClock()).unfinished == 0
      }
    }
    #expect(stuck.isEmpty, "outcomes left unrecorded for 60 s in round(s) \(stuck)")
    await queue.shutdown()
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
    let clock = TickingClock()
    let probe = StoreProbe()
    let store = probe.store(over: InMemoryJobStore())
    let ids = Mutex<[String: JobID]>([:])
    let bStarted = Gate()
    let bGoes = Gate()
    let queue = try JobQueue<LoopStep>(
      configuration: configuration(floor: .seconds(1), clock: clock, shortJobs: false), store: store
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
    try await queue.add(contentsOf: ["a", "b", "c", "d", "e"].map { LoopStep(name: $0) })
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
      try await store.counts(queue: Self.queueName, clock: clock).unfinished == 0
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
    #expect(try await store.counts(queue: Self.queueName, clock: clock).unfinished == 0)
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
    let queue = try JobQueue<LoopStep>(
      configuration: configuration(floor: .zero, clock: clock, shortJobs: false), store: store
    ) {
      step, _ in
      if step.name == "b" {
        bStarted.open()
        await bGoes.wait()
      }
      return .handled
    }
    defer { bGoes.open() }
    try await queue.add(contentsOf: ["a", "b", "c"].map { LoopStep(name: $0) })
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

  /// Batch mode on SQLite, two workers, many quick jobs: each handled once, all recorded, the
  /// queue finishes with an hour-long poll interval.
  @Test(arguments: [1, 2])
  func batchModeRunsEveryJobOnceAndFinishes(concurrency: Int) async throws {
    let folder = try TemporaryFolder()
    let probe = StoreProbe()
    let store = probe.store(over: try makeStore(folder))
    let handled = Mutex<[String: Int]>([:])
    let queue = try JobQueue<LoopStep>(
      configuration: configuration(floor: .seconds(1), concurrency: concurrency), store: store
    ) { step, _ in
      handled.withLock { $0[step.name, default: 0] += 1 }
      return .handled
    }
    let names = (0..<300).map { "j\($0)" }
    try await queue.add(contentsOf: names.map { LoopStep(name: $0) })
    queue.start()
    try await eventually("every job recorded", timeout: .seconds(60)) {
      try await store.counts(queue: Self.queueName, clock: SystemJobClock()).unfinished == 0
    }
    #expect(await finishes(queue))
    await queue.shutdown()
    let counts = handled.withLock { $0 }
    #expect(counts.count == 300)
    #expect(counts.values.allSatisfy { $0 == 1 }, "run twice: \(counts.filter { $0.value > 1 })")
  }

  /// A queue whose job b blocks the only slot while the jobs after it are claimed ahead, with
  /// every store call failing from b's start on. `bGoes` lets b finish.
  private struct HeldWhileFailing {
    let folder: TemporaryFolder
    let probe: StoreProbe
    let store: HookedStore
    let queue: JobQueue<LoopStep>
    let bGoes: Gate
    /// The name of every job run, once per run.
    let handled: Log<String>
  }

  private func heldWhileFailing(floor: Duration) async throws -> HeldWhileFailing {
    let folder = try TemporaryFolder()
    let probe = StoreProbe()
    let store = probe.store(over: try makeStore(folder))
    let bStarted = Gate()
    let bGoes = Gate()
    let handled = Log<String>()
    let queue = try JobQueue<LoopStep>(configuration: configuration(floor: floor), store: store) { step, _ in
      handled.append(step.name)
      if step.name == "b" {
        bStarted.open()
        await bGoes.wait()
      }
      return .handled
    }
    try await queue.add(contentsOf: ["a", "b", "c", "d", "e"].map { LoopStep(name: $0) })
    queue.start()
    await bStarted.wait()
    probe.failWake.withLock { $0 = true }
    probe.failClaim.withLock { $0 = true }
    return HeldWhileFailing(
      folder: folder, probe: probe, store: store, queue: queue, bGoes: bGoes, handled: handled)
  }

  /// One job blocks the only slot, one is claimed ahead; then every store call fails. The loop
  /// hands back (fails), backs off: it must not turn thousands of times a second.
  @Test(arguments: [Duration.zero, .seconds(1)])
  func aFailingStoreWithAHeldJobDoesNotSpin(floor: Duration) async throws {
    let scene = try await heldWhileFailing(floor: floor)
    defer { scene.bGoes.open() }
    try await Task.sleep(for: .milliseconds(200))
    let turns = try await callsOverASecond(scene.probe)
    #expect(turns < 2_000, "the loop spins: \(turns) store calls in one second")
    scene.probe.failWake.withLock { $0 = false }
    scene.probe.failClaim.withLock { $0 = false }
    scene.bGoes.open()
    try await eventually("every job recorded", timeout: .seconds(60)) {
      try await scene.store.counts(queue: Self.queueName, clock: SystemJobClock()).unfinished == 0
    }
    #expect(await finishes(scene.queue))
    await scene.queue.shutdown()
    #expect(Set(scene.handled.all).count == scene.handled.count, "run twice: \(scene.handled.all)")
  }

  /// Stopping with a job running and one held, every store call failing: the hand-back (due
  /// `.zero`) cannot be recorded; the loop must not spin on it.
  @Test(arguments: [Duration.zero, .seconds(1)])
  func stoppingWithAFailingStoreDoesNotSpin(floor: Duration) async throws {
    let scene = try await heldWhileFailing(floor: floor)
    defer { scene.bGoes.open() }
    let stopped = Mutex(false)
    let queue = scene.queue
    let stopper = Task {
      await queue.shutdown(gracePeriod: .seconds(60))
      stopped.withLock { $0 = true }
    }
    try await Task.sleep(for: .milliseconds(200))
    let turns = try await callsOverASecond(scene.probe)
    #expect(turns < 2_000, "the loop spins while stopping: \(turns) store calls in one second")
    scene.probe.failWake.withLock { $0 = false }
    scene.probe.failClaim.withLock { $0 = false }
    scene.bGoes.open()
    #expect(await eventually(timeout: .seconds(60)) { stopped.withLock { $0 } }, "shutdown completes")
    _ = stopper
    let counts = try await scene.store.counts(queue: Self.queueName, clock: SystemJobClock())
    #expect(counts.running == 0, "nothing left claimed: \(counts)")
  }
}
