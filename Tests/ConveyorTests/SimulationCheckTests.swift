import ConveyorSimulation
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import Conveyor

/// What the deterministic simulation of the queue engine (`Tests/ConveyorSimulation`) promises
/// beyond its own invariants: that its fixed seeds (`SimulationTests.seeds`) catch a store that
/// breaks the lease contract, and that a queue on the simulated runtime
/// (`QueueRuntime.simulated(executor:clock:)`) runs nothing and waits for nothing behind the
/// simulation's back.
@Suite(.timeLimit(.minutes(10)))
struct SimulationCheckTests {
  /// The earliest of the fixed seeds whose history, with `defect` built into the store, breaks a
  /// rule; nil when none does. The seeds run in `SimulationTests.parts` parts, each on a thread of
  /// its own.
  static func earliestCatch(of defect: SimDefect) async -> SimOutcome? {
    await withTaskGroup(of: SimOutcome?.self) { group in
      for part in 0..<SimulationTests.parts {
        group.addTask {
          await SimulationTests.simulate { () -> SimOutcome? in
            for seed in SimulationTests.part(part) {
              let outcome = Simulation.run(seed: seed, scenario: scenario(seed, defect))
              if outcome.violation != nil { return outcome }
            }
            return nil
          }
        }
      }
      var earliest: SimOutcome?
      for await case let outcome? in group where outcome.seed < (earliest?.seed ?? .max) {
        earliest = outcome
      }
      return earliest
    }
  }

  /// The scenario `seed` draws, with `defect` built into the store.
  static func scenario(_ seed: UInt64, _ defect: SimDefect) -> SimScenario {
    var scenario = SimScenario.drawn(from: seed)
    scenario.defect = defect
    return scenario
  }

  /// A store that rescues leases a quarter of a second before they lapse hands a job out while
  /// the worker that claimed it still holds it and runs it: the job runs twice at once, which
  /// leases exist to prevent. No invariant compares a rescue with the lease it ended.
  @Test func theFixedSeedsCatchAStoreThatRescuesLiveLeases() async {
    let caught = await Self.earliestCatch(of: .rescuesLiveLeases)
    #expect(
      caught != nil, "no seed of \(SimulationTests.seeds) caught a store that rescues leases that still hold")
  }

  /// A store whose heartbeat (and claim check) renews a running job's lease whatever claim it
  /// names tells a worker whose claim passed to another that it still holds the job.
  /// (`conveyor-simulate --defect renewsStaleClaims` searches for the seeds that catch it.)
  @Test func theFixedSeedsCatchAStoreThatRenewsStaleClaims() async {
    let caught = await Self.earliestCatch(of: .renewsStaleClaims)
    #expect(caught != nil, "no seed of \(SimulationTests.seeds) caught a store that renews stale claims")
  }

  /// A store whose pruning ignores the age deletes completed jobs that every process keeps a day.
  @Test func theFixedSeedsCatchAStoreThatPrunesEarly() async {
    let caught = await Self.earliestCatch(of: .prunesEarly)
    #expect(caught != nil, "no seed of \(SimulationTests.seeds) caught a store that prunes too early")
  }

  /// A store whose pruning deletes a waiting job loses it.
  @Test func theFixedSeedsCatchAStoreThatPrunesUnfinishedJobs() async {
    let caught = await Self.earliestCatch(of: .prunesUnfinished)
    #expect(caught != nil, "no seed of \(SimulationTests.seeds) caught a store that prunes waiting jobs")
  }

  /// A store that takes every deduplication scope as `.waiting` stores a second job of a key
  /// added one at a time while its job runs.
  @Test func theFixedSeedsCatchAStoreThatIgnoresRunningJobsForUniqueness() async {
    let caught = await Self.earliestCatch(of: .ignoresRunningForUniqueness)
    #expect(
      caught != nil, "no seed of \(SimulationTests.seeds) caught a store that ignores running jobs for a key")
  }

  /// A claim that hands out a job's first payload after a replace runs stale work.
  @Test func theFixedSeedsCatchAClaimThatRunsAStalePayload() async {
    let caught = await Self.earliestCatch(of: .runsStalePayload)
    #expect(
      caught != nil,
      "no seed of \(SimulationTests.seeds) caught a claim that runs a replaced job's old payload")
  }

  /// A store whose firing now and then leaves the schedule's last slot unadvanced adds the same
  /// slot's job again at the next firing.
  @Test func theFixedSeedsCatchAStoreThatFiresASlotTwice() async {
    let caught = await Self.earliestCatch(of: .firesSlotTwice)
    #expect(caught != nil, "no seed of \(SimulationTests.seeds) caught a store that fires a slot twice")
    #expect(
      caught?.violation?.hasPrefix("a schedule adds at most one job for each of its slots") == true,
      "\(caught?.violation ?? "")")
  }

  /// A store whose firing now and then passes over a due slot without adding its job leaves a
  /// slot of a schedule that catches up every slot without a job.
  @Test func theFixedSeedsCatchAStoreThatSkipsASlot() async {
    let caught = await Self.earliestCatch(of: .skipsSlot)
    #expect(caught != nil, "no seed of \(SimulationTests.seeds) caught a store that skips a slot")
    #expect(
      caught?.violation?.hasPrefix("a schedule that catches up every missed slot") == true,
      "\(caught?.violation ?? "")")
  }

  /// A store that now and then judges due slots by a clock ahead of the wall clock adds a slot's
  /// job before the slot.
  @Test func theFixedSeedsCatchAStoreThatFiresASlotEarly() async {
    let caught = await Self.earliestCatch(of: .firesEarly)
    #expect(caught != nil, "no seed of \(SimulationTests.seeds) caught a store that fires a slot early")
    #expect(
      caught?.violation?.hasPrefix("a schedule's job is added no earlier than its slot") == true,
      "\(caught?.violation ?? "")")
  }

  /// A store that drops ordering keys runs the jobs of a key side by side and out of the order
  /// they were added.
  @Test func theFixedSeedsCatchAStoreThatIgnoresOrderingKeys() async {
    let caught = await Self.earliestCatch(of: .ignoresOrderingKeys)
    #expect(caught != nil, "no seed of \(SimulationTests.seeds) caught a store that ignores ordering keys")
    #expect(
      caught?.violation?.hasPrefix("a job of an ordering key is claimed only once") == true,
      "\(caught?.violation ?? "")")
  }

  /// A store that keeps no limit it is given lets claims take more jobs than the application's
  /// concurrency limit.
  @Test func theFixedSeedsCatchAStoreThatForgetsLimits() async {
    let caught = await Self.earliestCatch(of: .forgetsLimits)
    #expect(caught != nil, "no seed of \(SimulationTests.seeds) caught a store that forgets limits")
    #expect(
      caught?.violation?.hasPrefix("a claim never takes the queue's running jobs past its stored concurrency")
        == true,
      "\(caught?.violation ?? "")")
  }

  /// A store that gives each process a rate bucket of its own lets several workers start jobs more
  /// often than the application's rate.
  @Test func theFixedSeedsCatchAStoreWithARateBucketPerProcess() async {
    let caught = await Self.earliestCatch(of: .ratePerProcess)
    #expect(caught != nil, "no seed of \(SimulationTests.seeds) caught a rate bucket per process")
    #expect(
      caught?.violation?.hasPrefix("the queue's claims keep to its stored rate") == true,
      "\(caught?.violation ?? "")")
  }

  /// A store that drops the limits per key lets claims take more jobs of a key than its limit.
  @Test func theFixedSeedsCatchAStoreThatIgnoresLimitsPerKey() async {
    let caught = await Self.earliestCatch(of: .ignoresKeyLimits)
    #expect(caught != nil, "no seed of \(SimulationTests.seeds) caught a store ignoring limits per key")
    #expect(
      caught?.violation?.hasPrefix("a claim never takes a limit key's running jobs past") == true,
      "\(caught?.violation ?? "")")
  }

  /// A store that drops the rates per key lets claims start a key's jobs more often than its rate.
  @Test func theFixedSeedsCatchAStoreThatIgnoresRatesPerKey() async {
    let caught = await Self.earliestCatch(of: .ignoresKeyRates)
    #expect(caught != nil, "no seed of \(SimulationTests.seeds) caught a store ignoring rates per key")
    #expect(
      caught?.violation?.hasPrefix("each limit key's claims keep to its stored rate") == true,
      "\(caught?.violation ?? "")")
  }

  /// A store that drops fairness keys hands out jobs without the key they were added with.
  @Test func theFixedSeedsCatchAStoreThatDropsFairnessKeys() async {
    let caught = await Self.earliestCatch(of: .dropsFairnessKeys)
    #expect(caught != nil, "no seed of \(SimulationTests.seeds) caught a store dropping fairness keys")
    #expect(
      caught?.violation?.hasPrefix("a claimed job carries the fairness key") == true,
      "\(caught?.violation ?? "")")
  }

  /// More workers and more frequent faults than any seed draws (six wall-clock steps a minute,
  /// where the drawn scenarios have at most three). Worker p4 claims jobs 39–41 ahead at 8.867 s
  /// (lease 2 s); at 9.213 s the wall clock steps forward 2.345 s, so the store's leases lapse and
  /// another worker's rescue makes the jobs waiting; at 9.423 s it steps back 3.565 s. At 9.626 s
  /// p4 starts job 40: its lease bound subtracts only the net forward step since the claim
  /// (`LeaseBound.remaining`: `max(0, now.wallOffset - wallOffset)`, here negative, so nothing),
  /// and p4 read no clock during the excursion. The store holds the job as waiting: another
  /// worker may claim and run it at the same time (p6 claims it at 11.018 s).
  ///
  /// No worker can see an excursion it took no reading in (forward 100 s and back 100 s leaves
  /// no trace), so this is a documented limit of stores that date leases by the wall clock
  /// (`DurableQueues` guide, Limitations): the oracle excuses a start whose claim saw the wall
  /// clock step forward and then back, and says so in the trace; everything else in the history
  /// must hold.
  @Test func aLeaseLapsedInAWallClockExcursionNoWorkerSawIsExcusedAndTheRestHolds() async {
    var scenario = SimScenario.drawn(from: 458)
    scenario.workers = 5
    scenario.crashesPerMinute = 6
    scenario.stallsPerMinute = 3
    scenario.clockStepsPerMinute = 6
    scenario.shutdownsPerMinute = 0
    scenario.pausesPerMinute = 0
    scenario.storeFailure = 0.2
    scenario.lostAnswer = 0
    scenario.slowCall = 0.1
    scenario.handlerTrouble = 0.8
    let outcome = await SimulationTests.simulate { [scenario] in Simulation.run(seed: 458, scenario: scenario)
    }
    #expect(
      outcome.violation == nil,
      """
      seed 458, \(outcome.scenario): \(outcome.violation ?? "")
      \(outcome.trace.suffix(40).joined(separator: "\n"))
      """)
  }

  /// A queue on the simulated runtime, over a store that keeps activity counts (as the SQLite and
  /// PostgreSQL stores do), handles one job while its clock stands still; then the simulation
  /// waits, running no task. On the simulation's clock no flush of the counts is due, yet the
  /// store is called: the periodic flush sleeps with `Task.sleep`, in a task on the global
  /// executor. At shutdown the hand-over of the counts waits in real time (`DispatchSleep`), and
  /// the queue's loop is resumed from another thread. (The simulation's store keeps no activity,
  /// so its histories never take these paths.)
  @Test func aSimulatedQueueRunsNothingBehindTheSimulationsBack() async throws {
    // A store whose calls answer at once: a store that waits in real time (a slow first call)
    // would resume the queue's task from its timer's thread, which is the store's doing.
    let store = QueueActivityShutdownTests.ActivityStore(first: .blockedUntilReleased)
    store.release()
    let payload = try JSONEncoder().encode(QueueActivityShutdownTests.Item(n: 1))
    _ = try await store.enqueue([NewJob(payload: payload)], queue: "escape", clock: SystemJobClock())
    let outcome = try await onOwnThread(name: "simulation-check") {
      () throws -> (handled: Int, uptime: Duration, called: Bool, foreign: Int, stopped: Bool) in
      let executor = SteppedExecutor()
      let clock = ManualJobClock()
      var configuration = JobQueueConfiguration(
        identifier: "escape", leaseDuration: .seconds(60), pollInterval: .seconds(1), clock: clock)
      configuration.runtime = .simulated(executor: executor, clock: clock)
      configuration.activityFlushInterval = .milliseconds(10)
      let handledJobs = Atomic(0)
      let queue = try JobQueue<QueueActivityShutdownTests.Item>(configuration: configuration, store: store) {
        _, _ in
        handledJobs.add(1, ordering: .relaxed)
        return .handled
      }
      // The job is handled and its outcome recorded without the clock moving.
      executor.drive(
        advancing: nil, until: { store.base.peekAll(queue: "escape").map(\.status) == [.completed] })
      // The simulation waits: no task runs, no clock moves.
      Thread.sleep(forTimeInterval: 0.5)
      let called = store.firstCallEntered
      let uptime = clock.uptime()
      // Stop the queue, driving it (and its clock) until it has.
      let stopped = Atomic(false)
      Task(executorPreference: executor) {
        await queue.shutdown(gracePeriod: .zero)
        stopped.store(true, ordering: .relaxed)
      }
      executor.drive(advancing: clock, until: { stopped.load(ordering: .relaxed) })
      return (
        handledJobs.load(ordering: .relaxed), uptime, called, executor.foreignEnqueues,
        stopped.load(ordering: .relaxed)
      )
    }
    #expect(outcome.handled == 1)
    #expect(outcome.stopped)
    #expect(outcome.uptime == .zero)
    #expect(!outcome.called, "the store's recordActivity was called though the queue's clock never moved")
    #expect(outcome.foreign == 0, "\(outcome.foreign) jobs reached the simulated executor from other threads")
  }
}

/// An executor that keeps the jobs given to it until the thread that drives it runs them, and
/// counts the jobs given to it from any other thread (a task that escaped the driving thread).
final class SteppedExecutor: TaskExecutor {
  private struct State {
    var jobs: [UnownedJob] = []
    var driver: ObjectIdentifier?
    var foreign = 0
  }
  private let state = Mutex(State())

  func enqueue(_ job: consuming ExecutorJob) {
    let job = UnownedJob(job)
    let caller = ObjectIdentifier(Thread.current)
    state.withLock { state in
      if let driver = state.driver, driver != caller { state.foreign += 1 }
      state.jobs.append(job)
    }
  }

  /// Jobs given from a thread other than the driving one.
  var foreignEnqueues: Int { state.withLock { $0.foreign } }

  /// Runs the jobs on the calling thread until `done` holds or 30 s of real time pass; whenever
  /// none is ready, advances `clock` by 100 ms if given (and something sleeps on it), or waits a
  /// millisecond of real time.
  func drive(advancing clock: ManualJobClock?, until done: () -> Bool) {
    state.withLock { $0.driver = ObjectIdentifier(Thread.current) }
    let deadline = Date().addingTimeInterval(30)
    while !done() && Date() < deadline {
      let job = state.withLock { state in state.jobs.isEmpty ? nil : state.jobs.removeFirst() }
      if let job {
        job.runSynchronously(on: asUnownedTaskExecutor())
      } else if let clock, clock.sleeping > 0 {
        clock.advance(by: .milliseconds(100))
      } else {
        Thread.sleep(forTimeInterval: 0.001)
      }
    }
  }
}
