import Conveyor
import ConveyorTestSupport
import Synchronization

/// Runs every task of the simulated processes on the thread that drives the simulation, one job
/// at a time, in an order drawn from the seed: the only source of concurrency in a simulated
/// history, so a seed replays exactly.
///
/// Each simulated process has an executor of its own (``SimProcessExecutor``), which every task of
/// its queues prefers (through `QueueRuntime.simulated`). A process can be stalled (its jobs wait,
/// as under `SIGSTOP`) or crashed (its jobs never run again while the history lasts, as after
/// `SIGKILL`; at the end of the history they run as a zombie's, whose store calls fail, so their
/// tasks end).
final class SimScheduler: Sendable {
  /// Where a process is.
  enum Condition: Sendable, Equatable {
    case running
    /// Its jobs wait until the simulated uptime reaches this.
    case stalled(until: Duration)
    /// Killed: its jobs never run (until the history is cleaned up).
    case crashed
    /// Killed, and being cleaned up at the end of the history: its jobs run, its store calls fail.
    case zombie
  }

  private struct Entry {
    var job: UnownedJob
    var process: Int
  }

  private struct State {
    var runnable: [Entry] = []
    /// Jobs of processes that cannot run now (stalled or crashed), by process.
    var held: [Int: [UnownedJob]] = [:]
    var conditions: [Int: Condition] = [:]
    /// Jobs enqueued from a thread other than the driving one: a task that escaped the simulation.
    var foreignEnqueues = 0
    var ran = 0
  }

  private let state = Mutex(State())
  /// The driving thread's identity, set by ``bind()``.
  private let driver = Atomic<UInt>(0)

  init() {}

  /// Marks the calling thread as the one driving the simulation.
  func bind() { driver.store(currentThreadID(), ordering: .relaxed) }

  /// A job of `process` became runnable.
  func enqueue(_ job: UnownedJob, process: Int) {
    let foreign = driver.load(ordering: .relaxed) != currentThreadID()
    state.withLock { state in
      if foreign { state.foreignEnqueues += 1 }
      if state.conditions[process, default: .running].canRun {
        state.runnable.append(Entry(job: job, process: process))
      } else {
        state.held[process, default: []].append(job)
      }
    }
  }

  /// Takes a runnable job chosen with `random` (nil: none is runnable).
  func next(_ random: inout SeededRandom) -> (job: UnownedJob, process: Int)? {
    state.withLock { state in
      guard !state.runnable.isEmpty else { return nil }
      let index = random.below(state.runnable.count)
      state.runnable.swapAt(index, state.runnable.count - 1)
      let entry = state.runnable.removeLast()
      state.ran += 1
      return (entry.job, entry.process)
    }
  }

  /// How many jobs ran, and how many were enqueued from outside the driving thread.
  var counts: (ran: Int, foreign: Int) { state.withLock { ($0.ran, $0.foreignEnqueues) } }

  func condition(of process: Int) -> Condition {
    state.withLock { $0.conditions[process, default: .running] }
  }

  /// Sets a process's condition: jobs of a process that can run again are runnable again; jobs of
  /// one that cannot are held.
  func set(_ condition: Condition, for process: Int) {
    state.withLock { state in
      state.conditions[process] = condition
      if condition.canRun {
        for job in state.held.removeValue(forKey: process) ?? [] {
          state.runnable.append(Entry(job: job, process: process))
        }
      } else {
        let moving = state.runnable.filter { $0.process == process }.map(\.job)
        state.runnable.removeAll { $0.process == process }
        state.held[process, default: []].append(contentsOf: moving)
      }
    }
  }

  /// The earliest uptime at which a stalled process resumes.
  var nextStallEnd: Duration? {
    state.withLock { state in
      state.conditions.values.compactMap { if case .stalled(let until) = $0 { until } else { nil } }.min()
    }
  }

  /// Ends the stalls that are over at `now`.
  func endStalls(at now: Duration) {
    let over = state.withLock { state in
      state.conditions.compactMap { process, condition -> Int? in
        if case .stalled(let until) = condition, until <= now { process } else { nil }
      }.sorted()
    }
    for process in over { set(.running, for: process) }
  }
}

extension SimScheduler.Condition {
  var canRun: Bool {
    switch self {
    case .running, .zombie: true
    case .stalled, .crashed: false
    }
  }
}

/// The executor of one simulated process: its jobs go to the scheduler, tagged with the process.
final class SimProcessExecutor: TaskExecutor {
  let process: Int
  let scheduler: SimScheduler

  init(process: Int, scheduler: SimScheduler) {
    self.process = process
    self.scheduler = scheduler
  }

  func enqueue(_ job: consuming ExecutorJob) {
    scheduler.enqueue(UnownedJob(job), process: process)
  }

  /// Runs `job` on the calling thread, as this executor's.
  func run(_ job: UnownedJob) {
    job.runSynchronously(on: asUnownedTaskExecutor())
  }
}

#if canImport(Glibc)
  import Glibc
  private func currentThreadID() -> UInt { UInt(bitPattern: Int(pthread_self())) }
#elseif canImport(Darwin)
  import Darwin
  private func currentThreadID() -> UInt { UInt(bitPattern: pthread_self()) }
#endif

extension Duration {
  /// The duration in seconds, as a `Double`.
  var inSeconds: Double {
    let (seconds, attoseconds) = components
    return Double(seconds) + Double(attoseconds) / 1e18
  }
}
