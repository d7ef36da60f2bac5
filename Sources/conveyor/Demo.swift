import Conveyor
import ConveyorNetworking
import ConveyorSQLite
import Foundation
import LoopbackHTTPServer
import Synchronization

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// `conveyor demo`: a self-contained run of the outbox on a throwaway SQLite file and a flaky
/// HTTP endpoint on 127.0.0.1, showing retries, dead jobs and recovery from a killed worker.
enum Demo {
  static func run(_ arguments: inout Arguments) async throws -> Int32 {
    let keep = arguments.flag("--keep")
    try arguments.finish()
    let folder = FileManager.default.temporaryDirectory.appendingPathComponent(
      "conveyor-demo-\(ProcessInfo.processInfo.processIdentifier)-\(UUID().uuidString.prefix(6))")
    try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
    defer { if !keep { removeQuietly(folder) } }
    let database = folder.appendingPathComponent("demo.sqlite").path

    // The endpoint fails each request's first tries: 503, then 429 with Retry-After: 1, then 200.
    let attemptsByKey = Mutex<[String: Int]>([:])
    let server = try LoopbackHTTPServer { request, _ in
      let key = request.header("Idempotency-Key") ?? request.target
      let attempt = attemptsByKey.withLock { seen -> Int in
        seen[key, default: 0] += 1
        return seen[key]!
      }
      switch attempt {
      case 1: return .status(503, "try later")
      case 2: return .status(429, "slow down", headers: [("Retry-After", "1")])
      default: return .status(200, "ok")
      }
    }
    defer { server.stop() }

    heading("Conveyor demo: a durable outbox on SQLite")
    output("database  \(database)")
    output("endpoint  http://127.0.0.1:\(server.port)  (answers 503, then 429 Retry-After: 1, then 200)")

    // The demo's 1 s lease needs a lock wait of at most half of it.
    let store = try SQLiteJobStore(path: database, options: .init(busyTimeout: .milliseconds(500)))
    var options = Worker.Options()
    options.retryPolicy = .exponential(initial: .milliseconds(200), maximum: .seconds(2), jitter: 0)
    options.maxAttempts = 3
    options.leaseDuration = .seconds(1)
    options.untilEmpty = true
    options.output = .lines
    let worker = try Worker(store: store, queue: "outbox", options: options)
    let outbox = worker.queue

    heading("1. Queue three HTTP requests and two commands (each committed before add returns)")
    let jobs: [OutboxJob] = [
      OutboxJob(kind: .http(.get(server.url("/orders/42"))), key: nil),
      OutboxJob(kind: .http(.post(server.url("/orders"), form: ["sku": "A-42", "quantity": "2"])), key: nil),
      OutboxJob(kind: .http(.delete(server.url("/orders/41"))), key: nil),
      OutboxJob(kind: .exec(ShellCommand(arguments: ["echo", "hello from the outbox"])), key: nil),
      OutboxJob(
        kind: .exec(ShellCommand(arguments: ["sh", "-c", "echo 'disk full' >&2; exit 3"])), key: nil),
    ]
    var ids: [JobID] = []
    for job in jobs {
      let id = try await outbox.add(job).id
      ids.append(id)
      output("  job \(id)  \(job.summary)")
    }

    heading("2. Work them at concurrency 1: retries back off, Retry-After is honoured, failures die")
    _ = await worker.run()

    heading("3. Crash recovery: a worker process is killed with SIGKILL in the middle of a job")
    let slow = try await outbox.add(
      OutboxJob(kind: .exec(ShellCommand(arguments: ["sleep", "2"])), key: nil)
    ).id
    output("  job \(slow)  exec sleep 2")
    let child = try startChildWorker(database: database)
    output("  worker process \(child.process.processIdentifier) started job \(try child.waitForStart())")
    kill(child.process.processIdentifier, SIGKILL)
    child.process.waitUntilExit()
    let counts = try await outbox.count()
    output("  killed it: the job is still stored, running=\(counts.running), held by a worker that is gone")
    output("  a new worker waits for the 1 s lease to run out, then takes the job over:")
    let rescuer = try Worker(store: store, queue: "outbox", options: options)
    _ = await rescuer.run()

    heading("4. Dead jobs are kept for inspection and can be re-queued")
    for record in try await outbox.jobs(in: .dead) {
      output("  job \(record.id) dead after \(record.attempts) attempts: \(record.lastError ?? "")")
    }
    output("  (conveyor retry ID re-queues one; conveyor purge deletes them)")

    heading("What the endpoint saw")
    let requests = server.requests
    for (key, count) in attemptsByKey.withLock({ $0 }).sorted(by: { $0.key < $1.key }) {
      output("  Idempotency-Key \(key): \(count) deliveries (the same key on every retry)")
    }
    output("  \(requests.count) requests in all, every one on 127.0.0.1")
    if keep {
      output("\nKept the database: conveyor --database \(database) list")
    }
    return ExitCode.success.rawValue
  }

  private static func heading(_ text: String) {
    output("\n\(text)")
  }

  /// A `conveyor work --json` child process on the demo database.
  struct Child {
    var process: Process
    var lines: LineReader

    /// Waits for the child's first "started" event; returns the job ID.
    func waitForStart() throws -> String {
      let deadline = Date().addingTimeInterval(30)
      while Date() < deadline {
        guard let line = lines.next() else { break }
        if line.contains(#""event":"started""#), let range = line.range(of: #""job":"#) {
          return String(line[range.upperBound...].prefix { $0.isNumber })
        }
      }
      throw DemoError(description: "the child worker did not start the job")
    }
  }

  static func startChildWorker(database: String) throws -> Child {
    guard let executable = Bundle.main.executableURL else {
      throw DemoError(description: "cannot find the conveyor executable to start a child worker")
    }
    let process = Process()
    process.executableURL = executable
    process.arguments = ["--database", database, "work", "--json", "--lease", "1"]
    let pipe = Pipe()
    process.standardOutput = pipe
    process.standardError = FileHandle.nullDevice
    try process.run()
    return Child(process: process, lines: LineReader(pipe.fileHandleForReading))
  }
}

struct DemoError: Error, CustomStringConvertible {
  var description: String
}

/// Reads lines from a pipe, blocking.
final class LineReader {
  private let handle: FileHandle
  private var buffer = Data()

  init(_ handle: FileHandle) { self.handle = handle }

  func next() -> String? {
    while true {
      if let newline = buffer.firstIndex(of: 0x0A) {
        let line = String(decoding: buffer[buffer.startIndex..<newline], as: UTF8.self)
        buffer.removeSubrange(buffer.startIndex...newline)
        return line
      }
      let chunk = handle.availableData
      if chunk.isEmpty { return nil }
      buffer.append(chunk)
    }
  }
}
