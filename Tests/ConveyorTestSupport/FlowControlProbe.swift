import Conveyor
import Foundation

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// Jobs in ordering keys handled by worker processes while one of them is killed with SIGKILL and
/// started again every 300 to 500 ms, for the whole drain: for the crash tests of every store
/// that shares ordering keys across processes.
///
/// ``keyCount`` keys of ``jobsPerKey`` jobs each, added in rounds (round *r* adds index *r* of
/// every key, interleaved with ``unkeyedPerRound`` jobs without a key): ``roundsBeforeStart``
/// rounds before the workers start, the others one every 400 ms while they drain, so adds race
/// with the ends of their keys' lines. The workers (``workerOptions(slot:)``: concurrency 4, 2 s
/// leases, handlers of 1 to 60 ms, one worker prefetching and one claiming ahead) log each handler's start, planned
/// failure (the first attempt of every index 3 modulo 7, retried after 50 ms) and end to one
/// shared file, and the probe logs each worker it killed, once it has exited, to the same file
/// (see ``problems(inLog:)`` for the lines and the rules).
///
/// What "one at a time" means across a crash: a killed worker's job comes back when its lease
/// lapses (at least once) and is still its key's head, so the order is kept and the key's later
/// jobs wait for it. The one exception to "one at a time" is the lease lapse itself: a worker
/// that is *stopped* (SIGSTOP, a stall) past its lease may still be running the job when it is
/// handed to another worker, and then two run at once. The probe kills with SIGKILL, after which
/// the killed worker's handler is gone, and logs the kill before the lease can lapse; its 2 s
/// leases are far longer than the few milliseconds a handler runs, so a stall that long inside a
/// handler (which the rules would report as two in flight) is not expected.
public enum FlowControlProbe {
  /// How many ordering keys. (40 keys of 25 jobs and 12 jobs without a key a round made the
  /// drain take 90 s in a loaded whole-suite run, starving the tests beside it.)
  public static let keyCount = 16
  /// How many jobs each key has (indices 0 to 14), and how many rounds are added.
  public static let jobsPerKey = 15
  /// How many jobs without a key each round adds.
  public static let unkeyedPerRound = 4
  /// How many rounds are stored before the workers start.
  public static let roundsBeforeStart = 6
  /// How many 100 ms ticks pass between two rounds added during the drain.
  public static let ticksPerRound = 4
  /// How many jobs in all.
  public static let jobCount = (keyCount + unkeyedPerRound) * jobsPerKey

  /// A job's payload: its `index` within its ordering `key`, or among the jobs without one.
  public struct Item: Codable, Hashable, Sendable {
    /// The job's ordering key; nil for a job without one.
    public var key: String?
    /// The job's place in its key (0 to 24), or its number among the jobs without a key.
    public var index: Int

    /// An item.
    public init(key: String?, index: Int) {
      self.key = key
      self.index = index
    }
  }

  /// The name of key `number`: mostly ASCII, every tenth not (keys compare byte for byte).
  public static func key(_ number: Int) -> String {
    number % 10 == 9 ? "clé-\(number)" : "key-\(number)"
  }

  /// How many limit keys the jobs share (``limitKey(of:)``).
  public static let limitKeyCount = 4

  /// The limit key of a job: `host-0` to `host-3`, each shared by four ordering keys and by a
  /// quarter of the jobs without one, so a limit per key binds jobs of several ordering keys.
  public static func limitKey(of item: Item) -> String {
    guard let key = item.key else { return "host-\(item.index % limitKeyCount)" }
    let number = Int(key.split(separator: "-").last ?? "0") ?? 0
    return "host-\(number % limitKeyCount)"
  }

  /// Round `round`'s jobs, in the order they are added: index `round` of every key, with a job
  /// without a key after every third key. Every job has its limit key (``limitKey(of:)``).
  public static func jobs(round: Int) throws -> [NewJob] {
    var jobs: [NewJob] = []
    var unkeyed = 0
    for number in 0..<keyCount {
      let key = key(number)
      let item = Item(key: key, index: round)
      jobs.append(
        NewJob(payload: try JSONEncoder().encode(item), orderingKey: key, limitKey: limitKey(of: item)))
      if number % 3 == 2 && unkeyed < unkeyedPerRound {
        let free = Item(key: nil, index: round * 100 + unkeyed)
        jobs.append(NewJob(payload: try JSONEncoder().encode(free), limitKey: limitKey(of: free)))
        unkeyed += 1
      }
    }
    for index in unkeyed..<unkeyedPerRound {
      let free = Item(key: nil, index: round * 100 + index)
      jobs.append(NewJob(payload: try JSONEncoder().encode(free), limitKey: limitKey(of: free)))
    }
    return jobs
  }

  /// The options of worker `slot` (0 to 3), besides the store's and the log's: concurrency 4,
  /// 2 s leases, handlers of 1 to 60 ms (long enough that most kills cut some short), retries after 50 ms; slot 2 prefetches 2 jobs and slot 3
  /// claims ahead.
  public static func workerOptions(slot: Int) -> [String] {
    let base = ["--concurrency", "4", "--lease-ms", "2000", "--handle-ms", "60", "--retry-ms", "50"]
    switch slot % 4 {
    case 2: return base + ["--prefetch", "2"]
    case 3: return base + ["--claims-ahead", "1"]
    default: return base
    }
  }

  /// What a run found: its problems (empty when the store kept every rule) and what happened.
  public struct Outcome: Sendable {
    /// What is wrong, one sentence each (at most 20 from the log and 20 from the store).
    public var problems: [String]
    /// How long the drain took, how many kills, and the log's ``Statistics``.
    public var summary: String
  }

  /// Adds the jobs to `store`'s queue `queue` and drains them with `workers` processes
  /// (`start(slot, generation)`, each given ``workerOptions(slot:)`` and the shared `log`),
  /// killing one (`kill`, which returns its process ID once it has exited) and starting another
  /// in its place every 300 to 500 ms until the queue holds no unfinished job or `drainLimit`
  /// passes (about 10 s alone; the limit leaves room for a loaded machine running the whole suite,
  /// where this task's 100 ms sleeps were seen to take a second); then kills them all and checks
  /// the log and the store.
  ///
  /// With a `concurrencyLimit`, the queue's stored ``QueueLimits/concurrency`` is set to it before
  /// the workers start (their 16 slots outnumber it) and the log must never show more handlers
  /// in flight at once, among workers not yet killed; a kill then comes every `killTicks` 100 ms
  /// ticks instead of every 3 to 5, since each kill's jobs keep their places until their 2 s
  /// leases lapse.
  ///
  /// With a `rate`, the queue's stored ``QueueLimits/rate`` is set before the workers start, and
  /// the log's starts must keep to it (see ``problems(inLog:limits:since:)``).
  ///
  /// With limits per key (``QueueLimits/keyConcurrency`` and overrides), they are stored before
  /// the workers start, and the log must never show more handlers of one limit key in flight at
  /// once than its limit, among workers not yet killed; kills come as with a concurrency limit.
  public static func run<Worker>(
    store: any JobStore, queue: String = "jobs", log: String, workers count: Int = 4,
    limits: QueueLimits = QueueLimits(), drainLimit: Duration = .seconds(240),
    start: (_ slot: Int, _ generation: Int) throws -> Worker,
    pid: (Worker) -> Int32, kill: (Worker) async -> Int32
  ) async throws -> Outcome {
    var found: [String] = []
    let clock = SystemJobClock()
    // The rate's bucket is full when it is stored: no start can come before this time.
    let rateSince = milliseconds()
    if !limits.isEmpty { try await store.setLimits(limits, queue: queue) }
    let killTicks = limits.concurrency == nil && !limits.hasKeyLimits ? 3 : 10
    for round in 0..<roundsBeforeStart {
      _ = try await store.enqueue(try jobs(round: round), queue: queue, clock: clock)
    }
    let before = try await store.counts(queue: queue, clock: clock)
    // Each key's first job is ready, its later ones held; every job without a key is ready.
    let expected = JobCounts(
      ready: keyCount + roundsBeforeStart * unkeyedPerRound, held: (roundsBeforeStart - 1) * keyCount)
    if before != expected {
      found.append("before the workers started the store counted \(before), expected \(expected)")
    }
    var workers = try (0..<count).map { try start($0, 0) }
    var random = SeededRandom(seed: 61)
    var round = roundsBeforeStart
    var kills = 0
    var nextKill = killTicks + random.below(3)
    var tick = 0
    let began = ContinuousClock.now
    var drained = false
    while ContinuousClock.now - began < drainLimit {
      try await Task.sleep(for: .milliseconds(100))
      tick += 1
      if round < jobsPerKey {
        if tick % ticksPerRound == 0 {
          _ = try await store.enqueue(try jobs(round: round), queue: queue, clock: clock)
          round += 1
        }
      } else if try await store.counts(queue: queue, clock: clock).unfinished == 0 {
        drained = true
        break
      }
      if tick >= nextKill {
        // A worker that runs a job with a key, when the log shows one (so the crash path is
        // tested however slow the machine is), else one drawn at random.
        let drawn = random.below(workers.count)
        let running = Self.pidsRunningKeyedJobs(log: log)
        let slot = workers.indices.first { running.contains(pid(workers[$0])) } ?? drawn
        let pid = await kill(workers[slot])
        try append("killed \(pid) \(milliseconds())", to: log)
        kills += 1
        workers[slot] = try start(slot, kills)
        nextKill = tick + killTicks + random.below(3)
      }
    }
    let drainTime = ContinuousClock.now - began
    for worker in workers {
      let pid = await kill(worker)
      try append("killed \(pid) \(milliseconds())", to: log)
    }
    if !drained {
      let counts = try await store.counts(queue: queue, clock: clock)
      found.append("not drained within \(drainLimit): \(counts)")
    }
    let text = try String(contentsOfFile: log, encoding: .utf8)
    let (logProblems, statistics) = problems(inLog: text, limits: limits, since: rateSince)
    found += logProblems
    found += try await storeProblems(store, queue: queue)
    let seconds = Double(drainTime.components.seconds) + Double(drainTime.components.attoseconds) / 1e18
    let summary =
      "drained in \(String(format: "%.1f", seconds)) s with \(kills) kills; \(statistics)"
    return Outcome(problems: found, summary: summary)
  }

  /// The processes that, by the last lines of the log, have started a job with a key and not
  /// yet ended it or failed it.
  static func pidsRunningKeyedJobs(log: String) -> Set<Int32> {
    guard let text = try? String(contentsOfFile: log, encoding: .utf8) else { return [] }
    var open: [String: Int32] = [:]
    for line in text.split(separator: "\n").suffix(400) {
      let parts = line.split(separator: " ")
      guard parts.count >= 5, parts[1] != "-", let pid = Int32(parts[3]) else { continue }
      let attempt = parts[1...4].joined(separator: " ")
      switch parts[0] {
      case "start": open[attempt] = pid
      case "end", "fail": open[attempt] = nil
      default: break
      }
    }
    return Set(open.values)
  }

  /// What happened in a log, besides its problems.
  public struct Statistics: Sendable, CustomStringConvertible {
    /// Handler starts.
    public var starts = 0
    /// Planned failures.
    public var failures = 0
    /// Attempts a kill cut short (started, neither failed nor ended).
    public var stranded = 0
    /// How many of ``stranded`` had a key.
    public var strandedWithKey = 0
    /// Starts of a job that had already ended (its worker was killed before the store recorded
    /// it: at least once).
    public var rerunsAfterEnd = 0
    /// The most handlers in flight at once in workers not yet killed.
    public var mostInFlight = 0

    /// The statistics in a sentence.
    public var description: String {
      "\(starts) starts, \(failures) planned failures, \(stranded) attempts cut short by a kill "
        + "(\(strandedWithKey) with a key), \(rerunsAfterEnd) runs again after an end, "
        + "at most \(mostInFlight) in flight"
    }
  }

  /// The first start of `times` (milliseconds since 1970) that came before `rate`, stored at
  /// `since`, allowed it: the *k*-th start no earlier than `since + (k - burst) / rate`.
  static func rateProblem(_ times: [Int64], rate: RateLimit, since: Int64, of what: String) -> String? {
    // The log's times are whole milliseconds, cut down: 2 ms of slack.
    for (offset, time) in times.sorted().enumerated() where offset + 1 > rate.burst {
      let earliest =
        since + Int64((Double(offset + 1 - rate.burst) / rate.perSecond * 1_000).rounded(.down)) - 2
      if time < earliest {
        return
          "over the rate of \(what), \(rate.perSecond)/s (bursts of \(rate.burst)): start \(offset + 1) came "
          + "\(time - since) ms after the rate was stored, before \(earliest - since) ms"
      }
    }
    return nil
  }

  /// What is wrong in a shared log, and what happened. Its lines, in the order they were
  /// appended: `start K I PID ATTEMPT MS`, `fail K I PID ATTEMPT MS`, `end K I PID ATTEMPT MS`
  /// from the workers (K `-` for a job without a key) and `killed PID MS` from the probe, once
  /// the worker has exited. The rules, for every key:
  /// - **order**: a start of index *i* > 0 comes after an end of *i* − 1 (a failed attempt or
  ///   one cut short by a kill is not an end: a retrying head holds its key, and so does a
  ///   crashed one until it ends);
  /// - **no going back**: no index starts after a later index of its key started;
  /// - **one at a time**: no job of the key starts while another attempt of the key is in flight
  ///   in a worker not yet killed;
  /// - **none lost**: every job, with a key or without, has an end;
  /// - **within the limit**, given a `concurrencyLimit`: no start while that many attempts, of
  ///   any key or none, are in flight in workers not yet killed (a worker logs an end before the
  ///   store hears of it, and a start after its claim, so the log never shows fewer in flight than
  ///   the store counted running).
  /// - **within each key's limit**, given limits per key: no start of a job while its limit key
  ///   (``limitKey(of:)``) has its limit's worth of attempts in flight in workers not yet killed
  ///   (the same reasoning);
  /// - **within the rate**, given a `rate` stored at `since` (milliseconds since 1970): the
  ///   *k*-th start (of all, in time order) comes no earlier than `since + (k - burst) / rate`.
  ///   A handler starts after its claim, and the store gives the *k*-th claim no earlier than
  ///   that, however many processes claim; a start delayed after its claim (a job prefetched or
  ///   claimed ahead, a loaded machine) only comes later, so the rule holds whatever the delays.
  /// - **within each key's rate**, given rates per key: the same rule for the starts of each limit
  ///   key with a rate, counted from `since`.
  public static func problems(
    inLog text: String, limits: QueueLimits = QueueLimits(), since: Int64 = 0
  ) -> ([String], Statistics) {
    let concurrencyLimit = limits.concurrency
    let rate = limits.rate
    struct Attempt {
      var index: Int
      var pid: Int32
      var line: String
    }
    var problems: [String] = []
    var statistics = Statistics()
    var ended = Set<Item>()
    var furthest: [String: (index: Int, line: String)] = [:]
    var inFlight: [String: [Attempt]] = [:]
    var killed = Set<Int32>()
    var startTimes: [Int64] = []
    var keyStartTimes: [String: [Int64]] = [:]
    for line in text.split(separator: "\n").map(String.init) {
      let fields = line.split(separator: " ").map(String.init)
      if fields.count == 3, fields[0] == "killed", let pid = Int32(fields[1]) {
        killed.insert(pid)
        for (key, attempts) in inFlight {
          let cut = attempts.filter { $0.pid == pid }
          statistics.stranded += cut.count
          if key != "-" { statistics.strandedWithKey += cut.count }
          inFlight[key] = attempts.filter { $0.pid != pid }
        }
        continue
      }
      guard fields.count == 6, let index = Int(fields[2]), let pid = Int32(fields[3]) else {
        problems.append("an unreadable line: \(line)")
        continue
      }
      let key = fields[1]
      let item = Item(key: key == "-" ? nil : key, index: index)
      if killed.contains(pid) { problems.append("a line from a worker already killed: \(line)") }
      switch fields[0] {
      case "start":
        statistics.starts += 1
        if let time = Int64(fields[5]) { startTimes.append(time) }
        let flying = inFlight.values.reduce(0) { $0 + $1.count }
        statistics.mostInFlight = max(statistics.mostInFlight, flying + 1)
        if let concurrencyLimit, flying >= concurrencyLimit {
          problems.append("over the limit of \(concurrencyLimit): \(line) while \(flying) are in flight")
        }
        let limitKey = limitKey(of: item)
        if limits.rate(forKey: limitKey) != nil, let time = Int64(fields[5]) {
          keyStartTimes[limitKey, default: []].append(time)
        }
        if let bound = limits.concurrency(forKey: limitKey) {
          let sameKey = inFlight.reduce(0) { count, entry in
            count
              + entry.value.filter {
                Self.limitKey(of: Item(key: entry.key == "-" ? nil : entry.key, index: $0.index)) == limitKey
              }.count
          }
          if sameKey >= bound {
            problems.append(
              "over the limit of key \(limitKey) (\(bound)): \(line) while \(sameKey) of the key are in flight"
            )
          }
        }
        if ended.contains(item) { statistics.rerunsAfterEnd += 1 }
        if key != "-" {
          if index > 0 && !ended.contains(Item(key: key, index: index - 1)) {
            problems.append("order: \(line) before any end of index \(index - 1)")
          }
          if let seen = furthest[key], seen.index > index {
            problems.append("going back: \(line) after \(seen.line)")
          }
          if let other = inFlight[key]?.first {
            problems.append("two at a time: \(line) while \(other.line) is in flight")
          }
          if (furthest[key]?.index ?? -1) < index { furthest[key] = (index, line) }
        }
        inFlight[key, default: []].append(Attempt(index: index, pid: pid, line: line))
      case "fail", "end":
        let attempts = inFlight[key] ?? []
        guard let position = attempts.firstIndex(where: { $0.index == index && $0.pid == pid }) else {
          problems.append("an outcome without its start: \(line)")
          continue
        }
        inFlight[key]?.remove(at: position)
        if fields[0] == "fail" {
          statistics.failures += 1
        } else {
          ended.insert(item)
        }
      default:
        problems.append("an unreadable line: \(line)")
      }
    }
    var lost: [Item] = []
    for round in 0..<jobsPerKey {
      for number in 0..<keyCount where !ended.contains(Item(key: key(number), index: round)) {
        lost.append(Item(key: key(number), index: round))
      }
      for index in 0..<unkeyedPerRound where !ended.contains(Item(key: nil, index: round * 100 + index)) {
        lost.append(Item(key: nil, index: round * 100 + index))
      }
    }
    if !lost.isEmpty {
      problems.append(
        "\(lost.count) jobs never ended: \(lost.prefix(10).map { "\($0.key ?? "-") \($0.index)" })")
    }
    if statistics.failures == 0 { problems.append("no planned failure ran: the retry path was not tested") }
    if let rate, let problem = rateProblem(startTimes, rate: rate, since: since, of: "the queue") {
      problems.append(problem)
    }
    for (key, times) in keyStartTimes.sorted(by: { $0.key < $1.key }) {
      guard let rate = limits.rate(forKey: key) else { continue }
      if let problem = rateProblem(times, rate: rate, since: since, of: "key \(key)") {
        problems.append(problem)
      }
    }
    // Whether a kill cut a keyed job short is in the summary the tests print, not a problem: a
    // run alone cuts several, but on a machine loaded by the whole suite the handlers of the job
    // chosen had sometimes ended before the signal landed, and the rules above hold either way.
    if problems.count > 20 { problems = Array(problems.prefix(20)) + ["… \(problems.count - 20) more"] }
    return (problems, statistics)
  }

  /// What is wrong with the jobs `store` holds in `queue` after the drain: every job is there
  /// once, completed, with its key, and each key's jobs finished in index order.
  public static func storeProblems(_ store: any JobStore, queue: String = "jobs") async throws -> [String] {
    var problems: [String] = []
    let counts = try await store.counts(queue: queue, clock: SystemJobClock())
    if counts != JobCounts(completed: jobCount) {
      problems.append("the store counts \(counts), expected \(jobCount) completed and nothing else")
    }
    var records: [Item: JobRecord] = [:]
    var cursor: JobID?
    while true {
      let page = try await store.jobs(queue: queue, status: nil, after: cursor, limit: 1_000)
      guard let last = page.last else { break }
      for record in page {
        guard let item = try? JSONDecoder().decode(Item.self, from: record.payload) else {
          problems.append("job \(record.id) has an unreadable payload")
          continue
        }
        if let earlier = records[item] {
          problems.append("\(item) stored twice: jobs \(earlier.id) and \(record.id)")
        }
        records[item] = record
        if record.status != .completed || record.isHeld {
          problems.append("\(item) is \(record.status)\(record.isHeld ? ", held" : "")")
        }
        if record.orderingKey != item.key {
          problems.append("\(item) has the ordering key \(record.orderingKey ?? "nil")")
        }
        if record.limitKey != limitKey(of: item) {
          problems.append("\(item) has the limit key \(record.limitKey ?? "nil")")
        }
      }
      cursor = last.id
    }
    if records.count != jobCount { problems.append("\(records.count) jobs stored, expected \(jobCount)") }
    for number in 0..<keyCount {
      let key = key(number)
      for index in 1..<jobsPerKey {
        guard let before = records[Item(key: key, index: index - 1)],
          let after = records[Item(key: key, index: index)]
        else { continue }
        if before.id.rawValue >= after.id.rawValue {
          problems.append("\(key) \(index) has an ID (\(after.id)) before \(index - 1)'s (\(before.id))")
        }
        if let first = before.finishedAt, let second = after.finishedAt, second < first {
          problems.append("\(key) \(index) finished at \(second), before \(index - 1) at \(first)")
        }
      }
    }
    if problems.count > 20 { problems = Array(problems.prefix(20)) + ["… \(problems.count - 20) more"] }
    return problems
  }

  /// The wall clock in milliseconds, as the workers log it.
  static func milliseconds() -> Int64 { Int64(Date().timeIntervalSince1970 * 1_000) }

  /// Appends `line` to the file at `path` with one write(2).
  static func append(_ line: String, to path: String) throws {
    let descriptor = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o644)
    guard descriptor >= 0 else { throw FlowControlProbeFailure("cannot open \(path): errno \(errno)") }
    defer { close(descriptor) }
    let bytes = Array((line + "\n").utf8)
    let written = bytes.withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) }
    guard written == bytes.count else {
      throw FlowControlProbeFailure("cannot write to \(path): errno \(errno)")
    }
  }
}

/// The probe could not write its log.
public struct FlowControlProbeFailure: Error, CustomStringConvertible {
  /// What failed.
  public var description: String
  init(_ description: String) { self.description = description }
}
