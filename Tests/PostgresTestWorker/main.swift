// A worker process for the PostgreSQL multi-process, crash and restart tests.
//
//   conveyor-postgres-test-worker --database URL --schema NAME --queue NAME --output FILE
//                                 [--progress FILE] [--concurrency N] [--lease-ms MS] [--handle-ms MS]
//                                 [--poll-ms MS] [--forever 1]
//
// Runs a JobQueue<TestJob> on the PostgreSQL store (firing its stored schedules, as every queue
// does) until the queue holds no pending or running job, or with --forever 1 until it is killed
// (jobs held by a killed worker count until their lease runs out and they are handled here). For
// every job it appends "<id>\n" to --progress (if given) when the handler starts, then sleeps
// --handle-ms, then appends "<id>\n" to --output. Each append is one write(2), so it survives
// SIGKILL of this process. It prints "store-errors <n>" (warnings the queue logged about the
// store) before it exits.
//
// With --ordered-log FILE [--prefetch N] [--claims-ahead 1] [--retry-ms MS] it runs a JobQueue of
// `FlowControlProbe` items (`{"key": K, "index": I}`, K the ordering key or absent) instead, until it
// is killed, appending to the shared FILE, one write(2) each: "start K I PID ATTEMPT MS" when the
// handler starts, "fail K I PID ATTEMPT MS" when it fails the first attempt of an index that is
// 3 modulo 7 (retried after --retry-ms), and "end K I PID ATTEMPT MS" when it has handled the job
// (after sleeping 1 to --handle-ms ms). K is "-" for a job without a key; MS the wall clock in
// milliseconds.
//
// With --workflow-log FILE it runs `WorkflowProbe`'s workflow runs of --queue instead, until it is
// killed, their steps logging to the shared FILE.
import Conveyor
import ConveyorPostgres
import ConveyorTestSupport
import Foundation
import Synchronization

#if canImport(Glibc)
  import Glibc
#endif

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

/// The item of the ordered mode, as `FlowControlProbe` enqueues it: `index` within its ordering
/// `key`, or among the jobs without one.
struct OrderedJob: Queueable {
  var key: String?
  var index: Int
  var orderingKey: String? { key }
}

/// Runs `OrderedJob`s until killed, logging each handler's start, planned failure and end to
/// `path` (see the header).
func orderedWork(
  store: PostgresJobStore, configuration: JobQueueConfiguration, path: String, values: [String: String]
) async throws {
  let log = try LineFile(path: path)
  let pid = getpid()
  let handleMilliseconds = max(1, Int(values["--handle-ms"] ?? "") ?? 1)
  let retry = Duration.milliseconds(Int(values["--retry-ms"] ?? "") ?? 50)
  var configuration = configuration
  configuration.prefetch = Int(values["--prefetch"] ?? "") ?? 0
  configuration.claimsAhead = values["--claims-ahead"] == "1"
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

func main() async throws {
  var values: [String: String] = [:]
  var iterator = CommandLine.arguments.dropFirst().makeIterator()
  while let flag = iterator.next() {
    guard let value = iterator.next() else { throw Failure("missing value for \(flag)") }
    values[flag] = value
  }
  guard let url = values["--database"], let output = values["--output"] else {
    throw Failure("usage: conveyor-postgres-test-worker --database URL --output FILE [options]")
  }
  let schema = values["--schema"] ?? "conveyor"
  let queueName = values["--queue"] ?? "jobs"
  let lease = Int(values["--lease-ms"] ?? "") ?? 30_000
  let handle = Duration.milliseconds(Int(values["--handle-ms"] ?? "") ?? 0)
  let store = try await PostgresJobStore.open(
    url: url, options: .init(schema: schema, lockTimeout: .milliseconds(lease / 2)))
  let handled = try LineFile(path: output)
  let progress = try values["--progress"].map { try LineFile(path: $0) }
  let storeErrors = Atomic<Int>(0)
  let configuration = JobQueueConfiguration(
    identifier: queueName, concurrency: Int(values["--concurrency"] ?? "") ?? 4,
    leaseDuration: .milliseconds(lease), pollInterval: .milliseconds(Int(values["--poll-ms"] ?? "") ?? 200),
    log: { record in
      if record.level >= .warning && record.message.contains("store error") {
        storeErrors.add(1, ordering: .relaxed)
      }
    })
  if let path = values["--workflow-log"] {
    try await WorkflowProbe.work(store: store, queue: queueName, log: path)
    return
  }
  if let path = values["--ordered-log"] {
    try await orderedWork(store: store, configuration: configuration, path: path, values: values)
    return
  }
  let queue = try JobQueue<TestJob>(configuration: configuration, store: store) { _, context in
    try progress?.append(context.id.description)
    if handle > .zero { try await Task.sleep(for: handle) }
    try handled.append(context.id.description)
    return .handled
  }
  if values["--forever"] == "1" {
    while true { try await Task.sleep(for: .seconds(3_600)) }
  }
  await queue.waitUntilFinished()
  await queue.shutdown(gracePeriod: .seconds(5))
  let counts = try await store.counts(queue: queueName, clock: SystemJobClock())
  guard counts.unfinished == 0 else { throw Failure("finished with \(counts) left") }
  print("store-errors \(storeErrors.load(ordering: .relaxed))")
  await store.close()
}

do {
  try await main()
} catch {
  FileHandle.standardError.write(Data("conveyor-postgres-test-worker: \(error)\n".utf8))
  exit(1)
}
