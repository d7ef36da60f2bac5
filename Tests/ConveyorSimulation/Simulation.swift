import Conveyor
import ConveyorTestSupport
import Foundation
import Synchronization

/// What one simulated history does: drawn from its seed, and made smaller when shrinking a
/// failing history.
public struct SimScenario: Sendable, Hashable, CustomStringConvertible {
  /// Worker processes running at the start (each with one queue instance); each crash or shutdown
  /// starts a new one.
  public var workers: Int
  /// Jobs the application adds during the chaos phase.
  public var jobs: Int
  /// How long faults are injected (simulated time).
  public var chaos: Duration
  /// Crashes (SIGKILL, then a restart) per simulated minute.
  public var crashesPerMinute: Double
  /// Stalls longer than a lease (SIGSTOP, SIGCONT) per simulated minute.
  public var stallsPerMinute: Double
  /// Steps of the wall clock (forward or back) per simulated minute.
  public var clockStepsPerMinute: Double
  /// Graceful shutdowns (then a restart) per simulated minute.
  public var shutdownsPerMinute: Double
  /// Pauses (resumed a little later) per simulated minute.
  public var pausesPerMinute: Double
  /// Chance that a store call fails before it reaches the store.
  public var storeFailure: Double
  /// Chance that a store call's answer is lost after the store applied it.
  public var lostAnswer: Double
  /// Chance that a store call takes longer than a lease to answer.
  public var slowCall: Double
  /// Chance that an attempt's handler misbehaves (throws, retries, is slow, ignores cancellation,
  /// discards).
  public var handlerTrouble: Double
  /// The interval of the schedule the workers declare (`tick`, every slot caught up), beside a
  /// cron schedule firing each minute (`minute`); nil: no schedules.
  public var scheduleEvery: Duration? = nil
  /// Pauses of the `tick` schedule (resumed a little later) per simulated minute.
  public var schedulePausesPerMinute: Double = 0
  /// A jump of the wall clock forward, once during the chaos, far past the schedules' grace (a
  /// host suspended and resumed): their slots meanwhile are missed and caught up. Nil: none.
  public var clockJump: Duration? = nil
  /// The queue's stored concurrency limit, set by the application as the history starts, then
  /// changed (to 1, 2, 4 or none) `limitChangesPerMinute` times a minute; nil: none set.
  public var concurrencyLimit: Int? = nil
  /// Changes of the stored concurrency limit per simulated minute.
  public var limitChangesPerMinute: Double = 0
  /// The queue's stored rate, set with the concurrency limit and kept through its changes; nil:
  /// none.
  public var rate: RateLimit? = nil
  /// Whether the workers' dead jobs release their ordering keys (`DeadHeadPolicy.releasesKey`).
  public var deadReleasesKey = false
  /// The queue's stored limit per key (`QueueLimits.keyConcurrency`), set with the other limits
  /// and kept through their changes, with key `host-0`'s own limit of 1; every job then has one
  /// of three limit keys. Nil: no limit key, no limit per key.
  public var keyConcurrency: Int? = nil
  /// The queue's stored rate per key (`QueueLimits.keyRate`), set with the other limits and kept
  /// through their changes, with key `host-1`'s own rate of 2 a second; every job then has one of
  /// three limit keys. Nil: none.
  public var keyRate: RateLimit? = nil
  /// Whether the application's jobs (but those with an ordering key) carry one of four fairness
  /// keys (fair shares).
  public var fairShares = false

  /// A defect built into the simulated store on purpose, to show that the checks catch it (nil:
  /// the store keeps its contract).
  public var defect: SimDefect? = nil

  /// The scenario a seed draws.
  public static func drawn(from seed: UInt64) -> SimScenario {
    var random = SeededRandom(seed: seed ^ 0x5CE7_A210)
    var scenario = SimScenario(
      workers: 1 + random.below(3), jobs: random.pick([4, 40, 150, 400]) + random.below(24),
      chaos: .seconds(10 + random.below(30)),
      crashesPerMinute: random.pick([0, 1, 3, 6]), stallsPerMinute: random.pick([0, 1, 3]),
      clockStepsPerMinute: random.pick([0, 0, 1, 3]), shutdownsPerMinute: random.pick([0, 1, 2]),
      pausesPerMinute: random.pick([0, 0, 1, 2]), storeFailure: random.pick([0, 0.01, 0.05]),
      lostAnswer: random.pick([0, 0.01, 0.03]), slowCall: random.pick([0, 0.005, 0.02]),
      handlerTrouble: random.pick([0.05, 0.2, 0.4]))
    // Drawn after the rest, so the other knobs are those each seed drew before schedules.
    scenario.scheduleEvery = random.pick([nil, .seconds(1), .seconds(2), .seconds(5)] as [Duration?])
    scenario.schedulePausesPerMinute = random.pick([0, 1, 3])
    scenario.clockJump = random.pick([nil, nil, nil, .seconds(90), .seconds(200)] as [Duration?])
    // Drawn after the rest, so the other knobs are those each seed drew before limits.
    scenario.concurrencyLimit = random.pick([nil, nil, 1, 2, 4] as [Int?])
    scenario.limitChangesPerMinute = scenario.concurrencyLimit == nil ? 0 : random.pick([0, 2, 6])
    // Drawn after the rest, so the other knobs are those each seed drew before rates.
    scenario.rate = random.pick([nil, nil, nil, RateLimit(perSecond: 8), RateLimit(perSecond: 40, burst: 6)])
    scenario.deadReleasesKey = random.pick([false, false, true])
    // Drawn after the rest, so the other knobs are those each seed drew before limits per key.
    scenario.keyConcurrency = random.pick([nil, nil, 1, 3] as [Int?])
    // Drawn after the rest, so the other knobs are those each seed drew before rates per key.
    scenario.keyRate = random.pick([
      nil, nil, nil, RateLimit(perSecond: 5), RateLimit(perSecond: 20, burst: 3),
    ])
    // Drawn after the rest, so the other knobs are those each seed drew before fair shares.
    scenario.fairShares = random.pick([false, false, true])
    return scenario
  }

  /// Smaller versions of this scenario, one change each, for shrinking.
  var simpler: [SimScenario] {
    var options: [SimScenario] = []
    func with(_ change: (inout SimScenario) -> Void) {
      var copy = self
      change(&copy)
      if copy != self { options.append(copy) }
    }
    with { $0.jobs = max(1, $0.jobs / 2) }
    with { $0.jobs = max(1, $0.jobs - 1) }
    with { $0.workers = max(1, $0.workers - 1) }
    with { $0.chaos = max(.seconds(5), $0.chaos / 2) }
    with { $0.crashesPerMinute = 0 }
    with { $0.stallsPerMinute = 0 }
    with { $0.clockStepsPerMinute = 0 }
    with { $0.shutdownsPerMinute = 0 }
    with { $0.pausesPerMinute = 0 }
    with { $0.storeFailure = 0 }
    with { $0.lostAnswer = 0 }
    with { $0.slowCall = 0 }
    with { $0.handlerTrouble = 0 }
    with { $0.schedulePausesPerMinute = 0 }
    with { $0.scheduleEvery = nil }
    with { $0.clockJump = nil }
    with { $0.limitChangesPerMinute = 0 }
    with {
      $0.concurrencyLimit = nil
      $0.limitChangesPerMinute = 0
    }
    with { $0.rate = nil }
    with { $0.deadReleasesKey = false }
    with { $0.keyConcurrency = nil }
    with { $0.keyRate = nil }
    with { $0.fairShares = false }
    return options
  }

  /// Every knob, in one line.
  public var description: String {
    "workers \(workers), jobs \(jobs), chaos \(chaos), crashes/min \(crashesPerMinute), stalls/min \(stallsPerMinute), "
      + "clock steps/min \(clockStepsPerMinute), shutdowns/min \(shutdownsPerMinute), pauses/min \(pausesPerMinute), "
      + "store failures \(storeFailure), lost answers \(lostAnswer), slow calls \(slowCall), handler trouble \(handlerTrouble), "
      + "schedule every \(scheduleEvery.map { "\($0)" } ?? "-"), schedule pauses/min \(schedulePausesPerMinute), "
      + "clock jump \(clockJump.map { "\($0)" } ?? "-"), "
      + "concurrency limit \(concurrencyLimit.map(String.init) ?? "-"), limit changes/min \(limitChangesPerMinute), "
      + "rate \(rate.map(\.description) ?? "-"), dead releases key \(deadReleasesKey), "
      + "key concurrency \(keyConcurrency.map(String.init) ?? "-"), key rate \(keyRate.map(\.description) ?? "-"), "
      + "fair shares \(fairShares)"
      + (defect.map { ", defect \($0)" } ?? "")
  }
}

/// A defect the simulated store can be given on purpose, so a test shows the simulation catches
/// it.
public enum SimDefect: String, Sendable, Hashable {
  /// The store applies a settlement to the job's current claim whatever claim it names: an
  /// outcome of a lapsed claim settles the newer one (the defect of a store that ignores the
  /// claim token).
  case settlesStaleClaims
  /// The store hands jobs out again a quarter of a second before their lease lapses: a job whose
  /// worker still holds it runs a second time.
  case rescuesLiveLeases
  /// The store renews a running job's lease whatever claim a heartbeat names: a worker whose
  /// claim passed to another still hears that it holds the job (the defect of a store that
  /// ignores the claim token in heartbeats).
  case renewsStaleClaims
  /// The store's pruning ignores the age it is given: a completed job is deleted as soon as a
  /// queue prunes, whatever its retention.
  case prunesEarly
  /// The store's pruning also deletes the oldest waiting job (the defect of a prune that reads
  /// the wrong status).
  case prunesUnfinished
  /// The store takes every deduplication scope as `.waiting`: an add of a key whose job runs
  /// stores a second job though the add asked for one at a time.
  case ignoresRunningForUniqueness
  /// A claim hands out the payload a job was added with, not the one a replace gave it (the
  /// defect of a worker or store that keeps payloads it read before).
  case runsStalePayload
  /// Once in a while a firing leaves the schedule's last slot where it was, so the next firing
  /// adds the same slot's job again (the defect of a store that inserts the jobs but loses the
  /// update of the schedule's row).
  case firesSlotTwice
  /// Once in a while a firing passes over a due slot without adding its job, as a store that
  /// advances the schedule's last slot one slot too far does.
  case skipsSlot
  /// Once in a while a firing judges due slots by a clock 1.5 seconds ahead: a slot's job is
  /// added before its slot (dated by that clock, so its creation date does not show it).
  case firesEarly
  /// The store stores jobs without their ordering keys: jobs of a key run side by side and out
  /// of the order they were added.
  case ignoresOrderingKeys
  /// The store answers a change of the queue's limits as done but keeps the limits it had (none
  /// at first): claims take more jobs than the limit the application set.
  case forgetsLimits
  /// The store keeps a rate's stored time per process, as if each process had a bucket of its
  /// own: with several workers, claims start more often than the rate the application set.
  case ratePerProcess
  /// The store keeps the queue's concurrency and rate but drops its limits per key: claims take
  /// more jobs of a key than its limit.
  case ignoresKeyLimits
  /// The store keeps the queue's other limits but drops its rates per key: claims start a key's
  /// jobs more often than its rate.
  case ignoresKeyRates
  /// The store stores jobs without their fairness keys: they take no turns, and a claimed job
  /// comes back without the key it was added with.
  case dropsFairnessKeys
}

/// The outcome of one simulated history.
public struct SimOutcome: Sendable {
  /// The history's seed.
  public var seed: UInt64
  /// What the history did.
  public var scenario: SimScenario
  /// The broken rule, if any.
  public var violation: String?
  /// The last events before the end (or the violation), oldest first.
  public var trace: [String]
  /// Jobs handled or dead.
  public var lifecycles: Int
  /// Executor jobs run.
  public var steps: Int
  /// Simulated time at the end.
  public var simulated: Duration
}

/// Deterministic simulation of the queue engine: several worker processes, each with a real
/// `JobQueue` (its `QueueState` and loop), over one shared in-memory store, driven by a seeded
/// scheduler on one thread with a simulated clock, with faults injected as the history goes.
/// The same seed and scenario always give the same history.
public enum Simulation {
  /// Runs the history of `seed` (its scenario drawn from the seed unless given) on the calling
  /// thread, which it holds until the history ends (call it from a thread of your own, not from
  /// Swift's cooperative pool), and returns its outcome.
  public static func run(seed: UInt64, scenario: SimScenario? = nil) -> SimOutcome {
    let world = SimWorld(seed: seed, scenario: scenario ?? .drawn(from: seed))
    return world.run()
  }

  /// Runs a failing history again with simpler scenarios, keeping each change that still fails,
  /// until none does: the smallest failing scenario found, and its outcome.
  public static func shrink(_ failing: SimOutcome, budget: Int = 200) -> SimOutcome {
    var best = failing
    var tries = 0
    var improved = true
    while improved && tries < budget {
      improved = false
      for candidate in best.scenario.simpler {
        tries += 1
        let outcome = run(seed: failing.seed, scenario: candidate)
        if outcome.violation != nil {
          best = outcome
          improved = true
          break
        }
        if tries >= budget { break }
      }
    }
    return best
  }
}

/// An error a simulated store call fails with.
enum SimFault: Error, CustomStringConvertible {
  case refused
  case answerLost
  case dead

  var description: String {
    switch self {
    case .refused: "store call failed (simulated)"
    case .answerLost: "store answer lost after commit (simulated)"
    case .dead: "the process is dead (simulated)"
    }
  }
}

/// The item the simulated application adds: which job of the scenario it is, or (negative) which
/// schedule added it (see ``SimWorld/scheduleNames``).
struct SimItem: Queueable {
  var job: Int
  /// The item's ordering key, if any.
  var order: String? = nil
  var orderingKey: String? { order }
}
