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

do {
  try await work(Arguments(Array(CommandLine.arguments.dropFirst())))
} catch {
  FileHandle.standardError.write(Data("conveyor-test-worker: \(error)\n".utf8))
  exit(1)
}
