// A worker process for the SQLite multi-process and crash tests.
//
//   conveyor-test-worker work --database PATH --queue NAME --output FILE
//                             [--progress FILE] [--concurrency N] [--prefetch N] [--lease-ms MS]
//                             [--handle-ms MS]
//
// Runs a JobQueue<TestJob> on the SQLite file until the queue holds no pending or running job
// (jobs held by a killed worker count until their lease runs out and they are handled here).
// For every job it appends
// "<id>\n" to --progress (if given) when the handler starts, then sleeps --handle-ms, then appends
// "<id>\n" to --output. Each append is one write(2), so it survives SIGKILL of this process.
//
//   conveyor-test-worker trickle --count N --payload-bytes B [--database PATH]
//
// Trickles N jobs with B-byte payloads through a JobQueue one at a time (add, wait until finished,
// repeat), on the SQLite file when --database is given and in memory otherwise, after a warm-up,
// and prints "rss-growth-kb <KB>": how much the resident memory grew meanwhile.
//
//   conveyor-test-worker retry-delay --attempt N --maximum-seconds S
//
// Prints "delay-seconds <s>", the delay `RetryPolicy.exponential(maximum: .seconds(S), jitter: 0)`
// gives after attempt N (in a process of its own, so a trap fails only the test that asked).
import Conveyor
import ConveyorSQLite
import Foundation

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
      default: throw Failure("unknown option \(flag)")
      }
    }
    guard command == "work", !database.isEmpty, !output.isEmpty else {
      throw Failure("usage: conveyor-test-worker work --database PATH --output FILE [options]")
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
  await queue.waitUntilFinished()
  await queue.shutdown(gracePeriod: .seconds(5))
  let counts = try await store.counts(queue: arguments.queue, clock: SystemJobClock())
  guard counts.unfinished == 0 else { throw Failure("finished with \(counts) left") }
}

/// The options of the `trickle` and `retry-delay` commands: `--name value` pairs.
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
  let configuration = JobQueueConfiguration(identifier: "trickle", pollInterval: .milliseconds(50))
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

func retryDelay(_ arguments: ArraySlice<String>) throws {
  let values = try options(arguments, allowed: ["--attempt", "--maximum-seconds"])
  guard let attempt = values["--attempt"].flatMap({ Int($0) }),
    let maximum = values["--maximum-seconds"].flatMap({ Int64($0) })
  else { throw Failure("usage: conveyor-test-worker retry-delay --attempt N --maximum-seconds S") }
  let delay = RetryPolicy.exponential(maximum: .seconds(maximum), jitter: 0).delay(afterAttempt: attempt)
  print("delay-seconds \(delay.components.seconds)")
}

do {
  let arguments = Array(CommandLine.arguments.dropFirst())
  switch arguments.first {
  case "trickle": try await trickle(arguments.dropFirst())
  case "retry-delay": try retryDelay(arguments.dropFirst())
  default: try await work(Arguments(arguments))
  }
} catch {
  FileHandle.standardError.write(Data("conveyor-test-worker: \(error)\n".utf8))
  exit(1)
}
