import Conveyor
import Foundation

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// Workflow runs of five steps and two sleeps, run by worker processes while one of them is
/// killed with SIGKILL and started again every 300 to 500 ms, for the whole drain: the crash test
/// of durable workflows on every store that shares a queue across processes.
///
/// Each run (input *n*) takes steps `a` to `e`, sleeping ``firstNap`` after `b` and ``secondNap``
/// after `d`. Every step body logs `start RUN STEP PID MS` when it begins, waits 1 to 15 ms, draws
/// a random nonce, and logs `end RUN STEP PID NONCE MS` before it returns its value and the nonce;
/// the workflow's code logs `saw RUN STEP PID NONCE MS` each time a step call returns (after the
/// store committed the result, or from the stored history on a resumption); the run's output is
/// the last value and the five nonces. The rules (``problems(inLog:outputs:runs:)``):
/// - **none lost, each right**: every run completes with the value its input gives;
/// - **exactly once, as the workflow sees it**: once a `saw` line shows a step's nonce (its result
///   is stored), every later `saw` line of the step and the output show that nonce, it is one an
///   `end` line logged, and no `start` of the step comes after that first `saw` line (a stored step
///   never runs again; a step whose worker was killed before its result was stored runs again);
/// - **sleeps hold**: a step after a sleep starts no sooner than the sleep's length after the
///   step before it ended.
public enum WorkflowProbe {
  /// The workflow's name.
  public static let name = "probe"
  /// The sleep after step `b`.
  public static let firstNap = Duration.milliseconds(40)
  /// The sleep after step `d`.
  public static let secondNap = Duration.milliseconds(20)
  /// How many runs the process tests drain: 1,000, or `CONVEYOR_WORKFLOW_RUNS` (10,000 is the
  /// figure the workflow guide reports).
  public static var runCount: Int {
    ProcessInfo.processInfo.environment["CONVEYOR_WORKFLOW_RUNS"].flatMap(Int.init).map { max(1, $0) }
      ?? 1_000
  }
  /// The steps, in order.
  public static let steps = ["a", "b", "c", "d", "e"]

  /// What a run returns: the last step's value and each step's nonce.
  public struct Output: Codable, Sendable, Hashable {
    /// The last step's value.
    public var value: Int
    /// The nonce each step drew, in step order.
    public var nonces: [UInt32]
  }

  struct StepValue: Codable, Sendable {
    var value: Int
    var nonce: UInt32
  }

  /// The value a step makes of the one before it.
  static func next(_ value: Int, step: Int) -> Int { value * 3 + step }

  /// The value a run of input `input` ends with.
  public static func expected(_ input: Int) -> Int {
    steps.indices.reduce(input) { next($0, step: $1) }
  }

  /// The workflow, logging to `log`.
  public struct Probe: Workflow {
    /// ``WorkflowProbe/name``.
    public var name: String { WorkflowProbe.name }
    let log: String

    /// A probe logging to the file at `log`.
    public init(log: String) { self.log = log }

    /// The five steps and two sleeps.
    public func run(_ input: Int, context: WorkflowContext) async throws -> Output {
      var value = input
      var nonces: [UInt32] = []
      for (index, step) in steps.enumerated() {
        let current = value
        let run = context.run
        let log = self.log
        let result = try await context.step(step, policy: .init(maxAttempts: 100, retryPolicy: .fixed(.zero)))
        {
          let pid = getpid()
          try WorkflowProbe.append("start \(run) \(step) \(pid) \(milliseconds())", to: log)
          try await Task.sleep(for: .milliseconds(Int.random(in: 1...15)))
          let nonce = UInt32.random(in: 1...UInt32.max)
          try WorkflowProbe.append("end \(run) \(step) \(pid) \(nonce) \(milliseconds())", to: log)
          return StepValue(value: next(current, step: index), nonce: nonce)
        }
        try WorkflowProbe.append("saw \(run) \(step) \(getpid()) \(result.nonce) \(milliseconds())", to: log)
        value = result.value
        nonces.append(result.nonce)
        if step == "b" { try await context.sleep(for: firstNap, name: "first") }
        if step == "d" { try await context.sleep(for: secondNap, name: "second") }
      }
      return Output(value: value, nonces: nonces)
    }
  }

  /// The workers' queue: concurrency 4, 2 s leases, polls every 20 ms.
  public static func configuration(queue: String) -> JobQueueConfiguration {
    var configuration = JobQueueConfiguration(
      identifier: queue, concurrency: 4, leaseDuration: .seconds(2), pollInterval: .milliseconds(20))
    configuration.maxAttempts = nil
    return configuration
  }

  /// A worker's body: runs the probe's runs in `store` until the process is killed.
  public static func work(store: any JobStore, queue: String, log: String) async throws {
    let workflows = try WorkflowQueue(
      configuration: configuration(queue: queue), store: store, workflows: [Probe(log: log)])
    while !Task.isCancelled { try await Task.sleep(for: .seconds(3_600)) }
    await workflows.jobs.shutdown(gracePeriod: .seconds(1))
  }

  /// What a run of the probe found.
  public struct Outcome: Sendable {
    /// What is wrong, one sentence each (at most 20).
    public var problems: [String]
    /// How long the drain took, how many kills, and how many steps ran again.
    public var summary: String
  }

  /// Adds `runs` runs to `store`'s queue `queue` and drains them with `workers` processes
  /// (`start(slot, generation)`), killing one (`kill`, which returns once it has exited) and
  /// starting another in its place every 300 to 500 ms until every run finished or `drainLimit`
  /// passed; then kills them all and checks the log and the store.
  public static func run<Worker>(
    store: any JobStore, queue: String = "workflows", log: String, runs: Int, workers count: Int = 4,
    drainLimit: Duration = .seconds(240), start: (_ slot: Int, _ generation: Int) throws -> Worker,
    kill: (Worker) async -> Void
  ) async throws -> Outcome {
    let adder = try WorkflowQueue(
      configuration: { () -> JobQueueConfiguration in
        var configuration = configuration(queue: queue)
        configuration.autoStart = false
        // It never claims: a lease that any store's lock wait allows.
        configuration.leaseDuration = .seconds(600)
        return configuration
      }(), store: store, workflows: [Probe(log: log)])
    var ids: [JobID: Int] = [:]
    for input in 0..<runs {
      ids[try await adder.add(Probe(log: log), input: input).id] = input
    }
    var workers = try (0..<count).map { try start($0, 0) }
    var random = SeededRandom(seed: 37)
    var kills = 0
    var nextKill = 3 + random.below(3)
    var tick = 0
    var drained = false
    let clock = SystemJobClock()
    let began = ContinuousClock.now
    while ContinuousClock.now - began < drainLimit {
      try await Task.sleep(for: .milliseconds(100))
      tick += 1
      if try await store.counts(queue: queue, clock: clock).unfinished == 0 {
        drained = true
        break
      }
      if tick >= nextKill {
        let slot = random.below(workers.count)
        await kill(workers[slot])
        kills += 1
        workers[slot] = try start(slot, kills)
        nextKill = tick + 3 + random.below(3)
      }
    }
    let drainTime = ContinuousClock.now - began
    for worker in workers { await kill(worker) }
    var problems: [String] = []
    if !drained {
      problems.append(
        "not drained within \(drainLimit): \(try await store.counts(queue: queue, clock: clock))")
    }
    var outputs: [Int: Output] = [:]
    for (id, input) in ids {
      switch try await adder.status(of: id, as: Probe.self) {
      case .completed(let output?): outputs[input] = output
      case let status: problems.append("run \(id) (input \(input)) is \(status)")
      }
    }
    let text = try String(contentsOfFile: log, encoding: .utf8)
    let (logProblems, reruns) = Self.problems(inLog: text, outputs: outputs, runs: ids)
    problems += logProblems
    let seconds = Double(drainTime.components.seconds) + Double(drainTime.components.attoseconds) / 1e18
    return Outcome(
      problems: Array(problems.prefix(20)),
      summary:
        "\(runs) runs drained in \(String(format: "%.1f", seconds)) s with \(kills) kills; \(reruns) steps "
        + "ran again after a kill")
  }

  /// What is wrong in the log, given each run's output (by input) and the runs' IDs; and how
  /// many steps started more than once.
  public static func problems(inLog text: String, outputs: [Int: Output], runs: [JobID: Int]) -> (
    [String], Int
  ) {
    struct Line {
      var number: Int
      var time: Int64
    }
    var problems: [String] = []
    var starts: [String: [Line]] = [:]
    var ends: [String: [UInt32: Line]] = [:]
    var firstSaw: [String: (nonce: UInt32, line: Line)] = [:]
    for (number, text) in text.split(separator: "\n").enumerated() {
      let fields = text.split(separator: " ").map(String.init)
      let key = fields.count >= 3 ? "\(fields[1]) \(fields[2])" : ""
      let line = Line(number: number, time: Int64(fields.last ?? "") ?? 0)
      switch (fields.first, fields.count, fields.count == 6 ? UInt32(fields[4]) : nil) {
      case ("start", 5, _):
        starts[key, default: []].append(line)
      case ("end", 6, let nonce?):
        ends[key, default: [:]][nonce] = line
      case ("saw", 6, let nonce?):
        if let first = firstSaw[key] {
          if first.nonce != nonce {
            problems.append(
              "\(key): the workflow saw nonce \(nonce) on line \(number + 1) after it saw the stored \(first.nonce) "
                + "on line \(first.line.number + 1)")
          }
        } else {
          firstSaw[key] = (nonce, line)
        }
      default: problems.append("an unreadable line: \(text)")
      }
    }
    var reruns = 0
    for (id, input) in runs.sorted(by: { $0.key < $1.key }) {
      guard let output = outputs[input] else { continue }
      if output.value != expected(input) {
        problems.append("run \(id) (input \(input)) ended with \(output.value), expected \(expected(input))")
      }
      guard output.nonces.count == steps.count else {
        problems.append("run \(id) has \(output.nonces.count) nonces")
        continue
      }
      var previousEnd: Line?
      for (index, step) in steps.enumerated() {
        let key = "\(id) \(step)"
        let stepStarts = starts[key] ?? []
        if stepStarts.count > 1 { reruns += stepStarts.count - 1 }
        guard let saw = firstSaw[key] else {
          problems.append("run \(id) completed without the workflow seeing step \(step)")
          continue
        }
        if saw.nonce != output.nonces[index] {
          problems.append(
            "run \(id) output nonce \(output.nonces[index]) for step \(step), stored \(saw.nonce)")
        }
        guard let stored = ends[key]?[saw.nonce] else {
          problems.append("run \(id) stored a nonce for step \(step) that no end line logged")
          continue
        }
        if let late = stepStarts.first(where: { $0.number > saw.line.number }) {
          problems.append(
            "run \(id) ran step \(step) again (log line \(late.number + 1)) after its result was stored "
              + "(line \(saw.line.number + 1))")
        }
        let nap = step == "c" ? firstNap : step == "e" ? secondNap : .zero
        if let previousEnd, nap > .zero, let first = stepStarts.first {
          // The sleep's wake date is read after the step before it logged its end: 1 ms of slack
          // for the log's whole milliseconds.
          let napMilliseconds =
            nap.components.seconds * 1_000 + nap.components.attoseconds / 1_000_000_000_000_000
          if first.time + 1 < previousEnd.time + napMilliseconds {
            problems.append(
              "run \(id) started step \(step) \(first.time - previousEnd.time) ms after the step before it "
                + "ended, within its sleep of \(napMilliseconds) ms")
          }
        }
        previousEnd = stored
      }
    }
    return (problems, reruns)
  }

  static func milliseconds() -> Int64 { Int64(Date().timeIntervalSince1970 * 1_000) }

  /// Appends one line with one write(2), so that a kill never leaves half a line.
  static func append(_ line: String, to path: String) throws {
    try FlowControlProbe.append(line, to: path)
  }
}
