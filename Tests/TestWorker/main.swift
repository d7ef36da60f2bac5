// A worker process for the SQLite multi-process and crash tests.
//
//   conveyor-test-worker work --database PATH --queue NAME --output FILE
//                             [--progress FILE] [--concurrency N] [--prefetch N] [--lease-ms MS]
//                             [--handle-ms MS] [--forever 1]
//
// Runs a JobQueue<TestJob> on the SQLite file (firing its stored schedules, as every queue does)
// until the queue holds no pending or running job, or with --forever 1 until it is killed
// (jobs held by a killed worker count until their lease runs out and they are handled here).
// For every job it appends
// "<id>\n" to --progress (if given) when the handler starts, then sleeps --handle-ms, then appends
// "<id>\n" to --output. Each append is one write(2), so it survives SIGKILL of this process.
//
//   conveyor-test-worker prune --database PATH --queue NAME --output FILE --progress FILE
//
// Deletes the queue's completed jobs in batches of 100 (`JobStore.prune`), appending the number
// deleted so far to --progress after each batch, and "done" to --output at the end.
//
//   conveyor-test-worker ordered-work --database PATH --queue NAME --output FILE --log FILE
//                                     [--concurrency N] [--prefetch N] [--claims-ahead 1]
//                                     [--lease-ms MS] [--handle-ms MS] [--retry-ms MS]
//
// Runs a JobQueue of `FlowControlProbe` items (`{"key": K, "index": I}`, K the ordering key or
// absent) until it is killed, appending to the shared --log, one write(2) each:
// "start K I PID ATTEMPT MS" when the handler starts, "fail K I PID ATTEMPT MS" when it fails
// the first attempt of an index that is 3 modulo 7 (retried after --retry-ms), and
// "end K I PID ATTEMPT MS" when it has handled the job (after sleeping 1 to --handle-ms ms). K is
// "-" for a job without a key; MS the wall clock in milliseconds.
//
//   conveyor-test-worker workflow-work --database PATH --queue NAME --output FILE --log FILE
//
// Runs `WorkflowProbe`'s workflow runs until it is killed, its steps logging to the shared --log.
//
//   conveyor-test-worker trickle --count N --payload-bytes B [--database PATH]
//
// Trickles N jobs with B-byte payloads through a JobQueue one at a time (add, wait until finished,
// repeat), on the SQLite file when --database is given and in memory otherwise, after a warm-up,
// and prints "rss-growth-kb <KB>": how much the resident memory grew meanwhile.
//
//   conveyor-test-worker trap-check --case exponential-maximum|nan-run-date|infinite-run-date
//
// Runs one input that once reached a Swift trap, in a process of its own so that a trap fails
// only the test that asked: prints the delay `RetryPolicy.exponential(maximum: .seconds(Int64.max))`
// gives after attempt 200 ("delay-seconds <s>"), or what `add(_:runAt:)` did with a NaN or
// infinite date ("invalidSchedule" or "stored").
//
//   conveyor-test-worker timeouts --count N
//
// Runs N one-step pipelines whose step has an hour's timeout (and returns at once) and prints
// "rss-growth-kb <KB>".
//
//   conveyor-test-worker starve --lease-ms MS
//
// Handles one job per core at concurrency = the core count with handlers that spin without
// awaiting for three leases, while a task on a thread of its own rescues expired leases every
// 50 ms and a second queue instance stands by to run rescued jobs; prints "width <n>",
// "handled <numbers>" (one entry per handler call), "rescued <count>" and "warning <message>" per
// warning the queues logged. In a process of its own so the spinning does not starve other tests.
import Conveyor
import ConveyorSQLite
import ConveyorTestSupport
import Foundation
import Synchronization

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

struct Arguments {
  var command = ""
  var database = ""
  var queue = "jobs"
  var output = ""
  var progress: String?
  var concurrency = 4
  var prefetch = 0
  var leaseMilliseconds = 30_000
  var handleMilliseconds = 0
  var forever = false
  var log = ""
  var claimsAhead = false
  var retryMilliseconds = 50

  init(_ arguments: [String]) throws {
    var iterator = arguments.makeIterator()
    command = iterator.next() ?? ""
    while let flag = iterator.next() {
      guard let value = iterator.next() else { throw Failure("missing value for \(flag)") }
      switch flag {
      case "--database": database = value
      case "--queue": queue = value
      case "--output": output = value
      case "--progress": progress = value
      case "--concurrency": concurrency = Int(value) ?? concurrency
      case "--prefetch": prefetch = Int(value) ?? prefetch
      case "--lease-ms": leaseMilliseconds = Int(value) ?? leaseMilliseconds
      case "--handle-ms": handleMilliseconds = Int(value) ?? handleMilliseconds
      case "--forever": forever = value == "1"
      case "--log": log = value
      case "--claims-ahead": claimsAhead = value == "1"
      case "--retry-ms": retryMilliseconds = Int(value) ?? retryMilliseconds
      default: throw Failure("unknown option \(flag)")
      }
    }
    guard ["work", "prune", "ordered-work", "workflow-work"].contains(command), !database.isEmpty,
      !output.isEmpty,
      !["ordered-work", "workflow-work"].contains(command) || !log.isEmpty
    else {
      throw Failure(
        "usage: conveyor-test-worker work|prune|ordered-work --database PATH --output FILE [options]")
    }
  }
}

struct Failure: Error, CustomStringConvertible {
  var description: String
  init(_ description: String) { self.description = description }
}

/// Appends lines to a file with one unbuffered write per line.
final class LineFile: Sendable {
  let descriptor: Int32

  init(path: String) throws {
    descriptor = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o644)
    guard descriptor >= 0 else { throw Failure("cannot open \(path): \(String(cString: strerror(errno)))") }
  }

  deinit { close(descriptor) }

  func append(_ line: String) throws {
    let bytes = Array((line + "\n").utf8)
    let written = bytes.withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) }
    guard written == bytes.count else { throw Failure("write failed: \(String(cString: strerror(errno)))") }
  }
}

/// The item the tests enqueue: `{"number": n}`.
struct TestJob: Queueable {
  var number: Int
}

func work(_ arguments: Arguments) async throws {
  let store = try await SQLiteJobStore.open(
    path: arguments.database, options: .init(busyTimeout: .milliseconds(arguments.leaseMilliseconds / 2)))
  let output = try LineFile(path: arguments.output)
  let progress = try arguments.progress.map { try LineFile(path: $0) }
  let handleDuration = Duration.milliseconds(arguments.handleMilliseconds)
  let configuration = JobQueueConfiguration(
    identifier: arguments.queue, concurrency: arguments.concurrency, prefetch: arguments.prefetch,
    leaseDuration: .milliseconds(arguments.leaseMilliseconds), pollInterval: .milliseconds(20))
  let queue = try JobQueue<TestJob>(configuration: configuration, store: store) { _, context in
    try progress?.append(context.id.description)
    if handleDuration > .zero { try await Task.sleep(for: handleDuration) }
    try output.append(context.id.description)
    return .handled
  }
  if arguments.forever {
    while true { try await Task.sleep(for: .seconds(3_600)) }
  }
  await queue.waitUntilFinished()
  await queue.shutdown(gracePeriod: .seconds(5))
  let counts = try await store.counts(queue: arguments.queue, clock: SystemJobClock())
  guard counts.unfinished == 0 else { throw Failure("finished with \(counts) left") }
}

/// The item of `ordered-work`, as `FlowControlProbe` enqueues it: `index` within its ordering
/// `key`, or among the jobs without one.
struct OrderedJob: Queueable {
  var key: String?
  var index: Int
  var orderingKey: String? { key }
}

/// Runs `OrderedJob`s until killed, logging each handler's start, planned failure and end to
/// the shared --log (see the header).
func orderedWork(_ arguments: Arguments) async throws {
  let store = try await SQLiteJobStore.open(
    path: arguments.database, options: .init(busyTimeout: .milliseconds(arguments.leaseMilliseconds / 2)))
  let log = try LineFile(path: arguments.log)
  let pid = getpid()
  let handleMilliseconds = max(1, arguments.handleMilliseconds)
  let retry = Duration.milliseconds(arguments.retryMilliseconds)
  let configuration = JobQueueConfiguration(
    identifier: arguments.queue, concurrency: arguments.concurrency, prefetch: arguments.prefetch,
    claimsAhead: arguments.claimsAhead, leaseDuration: .milliseconds(arguments.leaseMilliseconds),
    pollInterval: .milliseconds(20))
  let queue = try JobQueue<OrderedJob>(configuration: configuration, store: store) { item, context in
    func line(_ event: String) -> String {
      let milliseconds = Int64(Date().timeIntervalSince1970 * 1_000)
      return "\(event) \(item.key ?? "-") \(item.index) \(pid) \(context.attempts) \(milliseconds)"
    }
    try log.append(line("start"))
    try await Task.sleep(for: .milliseconds(Int.random(in: 1...handleMilliseconds)))
    if item.index % 7 == 3 && context.attempts == 1 {
      try log.append(line("fail"))
      return .retry(after: retry, reason: "the planned first failure")
    }
    try log.append(line("end"))
    return .handled
  }
  while !Task.isCancelled { try await Task.sleep(for: .seconds(3_600)) }
  await queue.shutdown(gracePeriod: .seconds(1))
}

/// Deletes the queue's completed jobs in batches of 100, as a queue's pruner does, appending the
/// number deleted so far to --progress after each batch; writes "done" to --output at the end.
func prune(_ arguments: Arguments) async throws {
  let store = try await SQLiteJobStore.open(path: arguments.database)
  let progress = try arguments.progress.map { try LineFile(path: $0) }
  var deleted = 0
  while true {
    let batch = try await store.prune(
      queue: arguments.queue, status: .completed, olderThan: .zero, limit: 100, clock: SystemJobClock())
    deleted += batch
    try progress?.append(String(deleted))
    if batch < 100 { break }
  }
  try LineFile(path: arguments.output).append("done")
}

/// The options of the `trickle` and `trap-check` commands: `--name value` pairs.
func options(_ arguments: ArraySlice<String>, allowed: Set<String>) throws -> [String: String] {
  var result: [String: String] = [:]
  var iterator = arguments.makeIterator()
  while let flag = iterator.next() {
    guard allowed.contains(flag), let value = iterator.next() else { throw Failure("bad option \(flag)") }
    result[flag] = value
  }
  return result
}

/// The resident set size, in KB, from /proc/self/statm.
func residentKilobytes() throws -> Int {
  let statm = try String(contentsOfFile: "/proc/self/statm", encoding: .utf8)
  let fields = statm.split(separator: " ")
  guard fields.count > 1, let pages = Int(fields[1]) else { throw Failure("unreadable statm: \(statm)") }
  return pages * Int(sysconf(Int32(_SC_PAGESIZE))) / 1024
}

/// The item `trickle` enqueues.
struct PayloadJob: Queueable {
  var number: Int
  var text: String
}

func trickle(_ arguments: ArraySlice<String>) async throws {
  let values = try options(arguments, allowed: ["--count", "--payload-bytes", "--database"])
  guard let count = values["--count"].flatMap({ Int($0) }),
    let bytes = values["--payload-bytes"].flatMap({ Int($0) })
  else { throw Failure("usage: conveyor-test-worker trickle --count N --payload-bytes B [--database PATH]") }
  let store: any JobStore =
    try values["--database"].map { try SQLiteJobStore(path: $0) } ?? InMemoryJobStore()
  // No history: what is measured is the engine's own memory, not the completed jobs kept.
  let configuration = JobQueueConfiguration(
    identifier: "trickle", pollInterval: .milliseconds(50), retention: JobRetention(completed: .none))
  let queue = try JobQueue<PayloadJob>(configuration: configuration, store: store) { _, _ in .handled }
  let text = String(repeating: "x", count: bytes)
  func run(_ jobs: Int) async throws {
    for number in 0..<jobs {
      try await queue.add(PayloadJob(number: number, text: text))
      await queue.waitUntilFinished()
    }
  }
  try await run(max(200, count / 10))  // warm up: caches, pools, the store's pages
  let before = try residentKilobytes()
  try await run(count)
  let after = try residentKilobytes()
  await queue.shutdown(gracePeriod: .seconds(5))
  print("rss-growth-kb \(after - before)")
}

/// The item `trap-check` enqueues.
struct PlainJob: Queueable {
  var number: Int
}

func trapCheck(_ arguments: ArraySlice<String>) async throws {
  let values = try options(arguments, allowed: ["--case"])
  switch values["--case"] {
  case "exponential-maximum":
    let policy = RetryPolicy.exponential(maximum: .seconds(Int64.max), jitter: 0)
    print("delay-seconds \(policy.delay(afterAttempt: 200).components.seconds)")
  case "nan-run-date", "infinite-run-date":
    let date = Date(timeIntervalSince1970: values["--case"] == "nan-run-date" ? .nan : .infinity)
    let configuration = JobQueueConfiguration(identifier: "traps", autoStart: false)
    let queue = try JobQueue<PlainJob>(configuration: configuration, store: InMemoryJobStore()) { _, _ in
      .handled
    }
    do {
      try await queue.add(PlainJob(number: 1), runAt: date)
      print("stored")
    } catch let error as JobQueueError {
      guard case .invalidSchedule = error else { throw error }
      print("invalidSchedule")
    }
  default:
    throw Failure(
      "usage: conveyor-test-worker trap-check --case exponential-maximum|nan-run-date|infinite-run-date")
  }
}

/// A task executor on a thread of its own: `starve` rescues leases there, as another process
/// would, while handlers keep every thread of the cooperative pool busy.
final class DedicatedThreadExecutor: TaskExecutor {
  private let jobs = Mutex<[UnownedJob]>([])
  private let available = DispatchSemaphore(value: 0)

  init(name: String) {
    let thread = Thread { [self] in run() }
    thread.name = name
    thread.start()
  }

  func enqueue(_ job: consuming ExecutorJob) {
    let job = UnownedJob(job)
    jobs.withLock { $0.append(job) }
    available.signal()
  }

  private func run() {
    while true {
      available.wait()
      let job = jobs.withLock { $0.isEmpty ? nil : $0.removeFirst() }
      job?.runSynchronously(on: asUnownedTaskExecutor())
    }
  }
}

func starve(_ arguments: ArraySlice<String>) async throws {
  let values = try options(arguments, allowed: ["--lease-ms"])
  guard let leaseMilliseconds = values["--lease-ms"].flatMap({ Int64($0) }) else {
    throw Failure("usage: conveyor-test-worker starve --lease-ms MS")
  }
  let lease = Duration.milliseconds(leaseMilliseconds)
  let width = ProcessInfo.processInfo.activeProcessorCount
  let store = InMemoryJobStore()
  let handled = Mutex<[Int]>([])
  let warnings = Mutex<[String]>([])
  let handler: JobQueue<PlainJob>.Handler = { item, _ in
    let first = handled.withLock { handled in
      defer { handled.append(item.number) }
      return !handled.contains(item.number)
    }
    // Spin without awaiting for three leases (the first time only: a job handed out again must
    // not spin forever), so this thread of the pool is not given back meanwhile.
    let end = ContinuousClock.now + (first ? lease * 3 : .zero)
    while ContinuousClock.now < end {}
    return .handled
  }
  func configuration(autoStart: Bool) -> JobQueueConfiguration {
    JobQueueConfiguration(
      identifier: "starve", concurrency: width, autoStart: autoStart, leaseDuration: lease,
      pollInterval: .milliseconds(50),
      log: { record in if record.level >= .warning { warnings.withLock { $0.append(record.message) } } })
  }
  let worker = try JobQueue<PlainJob>(
    configuration: configuration(autoStart: false), store: store, handler: handler)
  try await worker.add(contentsOf: (1...width).map { PlainJob(number: $0) })
  // Another process would rescue a lapsed lease within 50 ms; this one runs off the pool.
  let rescued = Mutex(0)
  let rescuer = Task(executorPreference: DedicatedThreadExecutor(name: "starve.rescuer")) {
    while !Task.isCancelled {
      let count = (try? await store.rescueExpiredLeases(queue: "starve", clock: SystemJobClock())) ?? 0
      rescued.withLock { $0 += count }
      usleep(50_000)  // blocks the dedicated thread only
    }
  }
  let second = try JobQueue<PlainJob>(
    configuration: configuration(autoStart: true), store: store, handler: handler)
  worker.start()
  let deadline = ContinuousClock.now + .seconds(60)
  while ContinuousClock.now < deadline {
    let left = try await store.counts(queue: "starve", clock: SystemJobClock()).unfinished
    if left == 0 && handled.withLock({ Set($0).count }) == width { break }
    try await Task.sleep(for: .milliseconds(20))
  }
  rescuer.cancel()
  await second.shutdown(gracePeriod: .seconds(1))
  await worker.shutdown(gracePeriod: .seconds(1))
  print("width \(width)")
  print("handled \(handled.withLock { $0.sorted() }.map(String.init).joined(separator: ","))")
  print("rescued \(rescued.withLock { $0 })")
  for warning in warnings.withLock({ $0 }) { print("warning \(warning)") }
}

/// Runs `--count` one-step pipelines whose step has an hour's timeout and returns at once, after
/// a warm-up; prints "rss-growth-kb <KB>". Each run's timer is cancelled when its step returns.
func timeouts(_ arguments: ArraySlice<String>) async throws {
  let values = try options(arguments, allowed: ["--count"])
  guard let count = values["--count"].flatMap({ Int($0) }) else {
    throw Failure("usage: conveyor-test-worker timeouts --count N")
  }
  let pipeline = Pipeline(defaultValue: 0).then(
    Pipeline.step(timeout: .seconds(3_600)) { value in value + 1 })
  func run(_ runs: Int) async throws {
    for _ in 0..<runs { _ = try await pipeline.run() }
  }
  try await run(max(1_000, count / 10))  // warm up
  try await settleTimers()
  let before = try residentKilobytes()
  try await run(count)
  // What a leak keeps (a timer per run, scheduled until its hour is up) stays after the wait and
  // the trim; a backlog of cancelled timers whose disposal a busy machine delayed does not: a
  // full test run beside CPU-bound workers once grew 5 MB that way.
  let live = try await settleTimers()
  let after = try residentKilobytes()
  print("rss-growth-kb \(after - before)")
  print("live-timers \(live)")
}

#if canImport(Glibc)
  /// glibc's `malloc_trim` (in `malloc.h`, which the Glibc module leaves out): returns free memory
  /// of every arena to the system.
  @_silgen_name("malloc_trim") func mallocTrim(_ pad: Int) -> Int32
#endif

/// Waits (at most 10 s) until no timer of `DispatchSleep` is live, then gives the memory that
/// malloc holds free back to the system; returns the timers still live.
@discardableResult
func settleTimers() async throws -> Int {
  let deadline = ContinuousClock.now + .seconds(10)
  while DispatchSleep.liveTimers.load(ordering: .relaxed) > 0 && ContinuousClock.now < deadline {
    try await Task.sleep(for: .milliseconds(10))
  }
  #if canImport(Glibc)
    _ = mallocTrim(0)
  #endif
  return DispatchSleep.liveTimers.load(ordering: .relaxed)
}

do {
  let arguments = Array(CommandLine.arguments.dropFirst())
  switch arguments.first {
  case "trickle": try await trickle(arguments.dropFirst())
  case "trap-check": try await trapCheck(arguments.dropFirst())
  case "starve": try await starve(arguments.dropFirst())
  case "timeouts": try await timeouts(arguments.dropFirst())
  case "prune": try await prune(Arguments(arguments))
  case "ordered-work": try await orderedWork(Arguments(arguments))
  case "workflow-work":
    let arguments = try Arguments(arguments)
    let store = try await SQLiteJobStore.open(
      path: arguments.database, options: .init(busyTimeout: .seconds(1)))
    try await WorkflowProbe.work(store: store, queue: arguments.queue, log: arguments.log)
  default: try await work(Arguments(arguments))
  }
} catch {
  FileHandle.standardError.write(Data("conveyor-test-worker: \(error)\n".utf8))
  exit(1)
}
