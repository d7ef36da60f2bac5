import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import Conveyor

private struct R7Step: Queueable {
  var name: String
}

@Suite("Review 7: the loop's sleep cut by what is held", .timeLimit(.minutes(3)))
struct Review7LoopSleepTests {
  private func configuration(floor: Duration, concurrency: Int = 1) -> JobQueueConfiguration {
    var configuration = JobQueueConfiguration(
      identifier: "r7", concurrency: concurrency, autoStart: false, pollInterval: .seconds(3_600))
    configuration.leaseDuration = .seconds(600)
    configuration.claimAheadStoreCallFloor = floor
    configuration.claimAheadJobCeiling = .seconds(60)
    return configuration
  }

  /// Store calls made over one real second (real sleep; test task, not a pool thread blocked).
  private func callsOverASecond(_ probe: StoreProbe) async throws -> Int {
    let before = probe.total
    try await Task.sleep(for: .seconds(1))
    return probe.total - before
  }

  /// Runs `waitUntilFinished` bounded: true when it returned within 60 s.
  private func finishes(_ queue: JobQueue<R7Step>) async -> Bool {
    let done = Mutex(false)
    let task = Task {
      await queue.waitUntilFinished()
      done.withLock { $0 = true }
    }
    let ok = await eventually(timeout: .seconds(60)) { done.withLock { $0 } }
    if !ok { task.cancel() }
    return ok
  }

  /// Batch mode on SQLite, two workers, many quick jobs: each handled once, all recorded, the
  /// queue finishes with an hour-long poll interval.
  @Test(arguments: [1, 2])
  func batchModeRunsEveryJobOnceAndFinishes(concurrency: Int) async throws {
    let folder = try TemporaryFolder()
    let probe = StoreProbe()
    let store = probe.store(over: try makeStore(folder))
    let handled = Mutex<[String: Int]>([:])
    let queue = try JobQueue<R7Step>(
      configuration: configuration(floor: .seconds(1), concurrency: concurrency), store: store
    ) { step, _ in
      handled.withLock { $0[step.name, default: 0] += 1 }
      return .handled
    }
    let names = (0..<300).map { "j\($0)" }
    try await queue.add(contentsOf: names.map { R7Step(name: $0) })
    queue.start()
    try await eventually("every job recorded", timeout: .seconds(60)) {
      try await store.counts(queue: "r7", clock: SystemJobClock()).unfinished == 0
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
    let queue: JobQueue<R7Step>
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
    let queue = try JobQueue<R7Step>(configuration: configuration(floor: floor), store: store) { step, _ in
      handled.append(step.name)
      if step.name == "b" {
        bStarted.open()
        await bGoes.wait()
      }
      return .handled
    }
    try await queue.add(contentsOf: ["a", "b", "c", "d", "e"].map { R7Step(name: $0) })
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
      try await scene.store.counts(queue: "r7", clock: SystemJobClock()).unfinished == 0
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
    let counts = try await scene.store.counts(queue: "r7", clock: SystemJobClock())
    #expect(counts.running == 0, "nothing left claimed: \(counts)")
  }
}
