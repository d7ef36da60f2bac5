import Conveyor
import ConveyorNetworking
import ConveyorSQLite
import Foundation

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// Exit codes, as documented in `conveyor help`.
enum ExitCode: Int32 {
  case success = 0
  /// The command ran, but what it reports failed (e.g. jobs died during `work --until-empty`).
  case failure = 1
  /// The command line was wrong.
  case usage = 2
  /// The database could not be opened or used.
  case storage = 3
}

enum CLI {
  static let usage = """
    conveyor: a durable outbox for HTTP requests and shell commands.

    Usage: conveyor [--database PATH] [--queue NAME] COMMAND [options]

    Commands:
      add http METHOD URL [-H 'Name: value']... [--data TEXT | --data-file PATH] [--timeout S]
      add exec [--cwd DIR] [--timeout S] -- PROGRAM [ARGUMENTS...]
               add options: [--delay S] [--priority N] [--key KEY]; prints the job ID
      work     [--concurrency N] [--until-empty] [--json] [--max-attempts N] [--lease S]
               handle jobs until SIGINT/SIGTERM/SIGHUP (or until none is left with --until-empty)
      status   [--json]                      counts by status, and whether the queue is paused
      list     [--status pending|running|dead] [--limit N] [--json]
      retry    ID... | --all                 re-queue dead jobs
      remove   ID...                         delete jobs
      purge    [--all]                       delete dead jobs (--all: every job not running)
      pause | resume                         stop or restart claiming, for every worker
      demo                                   a self-contained run showing retries and recovery

    Options:
      --database PATH   SQLite file (default: $CONVEYOR_DATABASE, else
                        $XDG_DATA_HOME/conveyor/conveyor.sqlite)
      --queue NAME      queue name (default: outbox)

    Exit codes: 0 success, 1 jobs died (work --until-empty) or IDs not found (remove),
                2 usage error, 3 database error.
    """

  static func main(_ commandLine: [String]) async -> Int32 {
    var arguments = Arguments(Array(commandLine.dropFirst()))
    do {
      let database =
        try arguments.option("--database", "-d")
        ?? ProcessInfo.processInfo.environment["CONVEYOR_DATABASE"].flatMap { $0.isEmpty ? nil : $0 }
      if database == "" { throw UsageError(description: "--database needs a file path") }
      let queueName = try arguments.option("--queue", "-q") ?? "outbox"
      try JobQueueConfiguration.validate(identifier: queueName)
      let command = arguments.next() ?? "help"
      let context = Context(database: database, queue: queueName)
      switch command {
      case "help", "--help", "-h":
        output(usage)
        return ExitCode.success.rawValue
      case "add": return try await add(&arguments, context)
      case "work": return try await work(&arguments, context)
      case "status": return try await status(&arguments, context)
      case "list": return try await list(&arguments, context)
      case "retry": return try await retry(&arguments, context)
      case "remove": return try await remove(&arguments, context)
      case "purge": return try await purge(&arguments, context)
      case "pause", "resume":
        try arguments.finish()
        let queue = try context.controlQueue()
        if command == "pause" { try await queue.pause() } else { try await queue.resume() }
        output("queue \(context.queue) \(command == "pause" ? "paused" : "resumed")")
        return ExitCode.success.rawValue
      case "demo": return try await Demo.run(&arguments)
      default:
        throw UsageError(description: "unknown command \"\(command)\"")
      }
    } catch let error as UsageError {
      printError("conveyor: \(error)\nRun 'conveyor help' for usage.")
      return ExitCode.usage.rawValue
    } catch let error as JobQueueError {
      printError("conveyor: \(error)")
      return ExitCode.usage.rawValue
    } catch {
      printError("conveyor: \(error)")
      return ExitCode.storage.rawValue
    }
  }

  /// Where the jobs are and which queue the command talks to.
  struct Context {
    var database: String?
    var queue: String

    /// Opens the store. `busyTimeout` is how long a call waits for another process's lock; a
    /// worker's lease must be at least twice as long.
    func openStore(busyTimeout: Duration = .seconds(5)) throws -> SQLiteJobStore {
      let options = SQLiteJobStore.Options(busyTimeout: busyTimeout)
      guard let database else { return try SQLiteJobStore(name: "conveyor", options: options) }
      if database.hasPrefix("postgres://") || database.hasPrefix("postgresql://") {
        throw UsageError(
          description: "PostgreSQL databases are not supported by this build yet; pass a SQLite file path")
      }
      var isDirectory: ObjCBool = false
      if FileManager.default.fileExists(atPath: database, isDirectory: &isDirectory), isDirectory.boolValue {
        throw DatabaseError(
          description: "\(database) is a folder; pass the path of a database file in it, e.g. "
            + URL(fileURLWithPath: database).appendingPathComponent("conveyor.sqlite").path)
      }
      return try SQLiteJobStore(path: database, options: options)
    }

    /// A queue for inspecting and controlling jobs; it never claims any.
    func controlQueue(store: SQLiteJobStore? = nil) throws -> JobQueue<OutboxJob> {
      try JobQueue<OutboxJob>(
        configuration: JobQueueConfiguration(identifier: queue, autoStart: false),
        store: try store ?? openStore()
      ) { _, _ in .retry(after: .zero) }
    }
  }

  // MARK: add

  static func add(_ arguments: inout Arguments, _ context: Context) async throws -> Int32 {
    let kind = try arguments.required("job kind (http or exec)")
    let delay = try arguments.seconds("--delay") ?? .zero
    let priority = try arguments.integer("--priority", in: -1_000_000...1_000_000) ?? 0
    let key = try arguments.option("--key")
    let job: OutboxJob
    switch kind {
    case "http":
      let method = try arguments.required("HTTP method (GET, POST, PUT, PATCH, DELETE, ...)").uppercased()
      guard method.allSatisfy({ $0.isLetter }), !method.isEmpty else {
        throw UsageError(description: "\"\(method)\" is not an HTTP method")
      }
      let headerLines = try arguments.options(["-H", "--header"])
      let data = try arguments.option("--data")
      let dataFile = try arguments.option("--data-file")
      let timeout = try arguments.seconds("--timeout", allowingZero: false)
      let urlText = try arguments.required("URL")
      guard let url = URL(string: urlText), let scheme = url.scheme?.lowercased(),
        ["http", "https"].contains(scheme),
        url.host != nil
      else {
        throw UsageError(description: "\"\(urlText)\" is not an http:// or https:// URL")
      }
      var headers: [String: String] = [:]
      for line in headerLines {
        let (name, value) = try header(line)
        headers[name] = value
      }
      if data != nil && dataFile != nil {
        throw UsageError(description: "use --data or --data-file, not both")
      }
      var body = data.map { Data($0.utf8) }
      if let dataFile {
        guard let contents = FileManager.default.contents(atPath: dataFile) else {
          throw UsageError(description: "cannot read --data-file \"\(dataFile)\"")
        }
        body = contents
      }
      job = OutboxJob(
        kind: .http(
          HTTPRequest(method: method, url: url, headers: headers, body: body, timeout: timeout?.secondsValue)),
        key: key)
    case "exec":
      let directory = try arguments.option("--cwd")
      let timeout = try arguments.seconds("--timeout", allowingZero: false)
      guard arguments.next() == "--" else {
        throw UsageError(description: "put the command after --, e.g. conveyor add exec -- echo hello")
      }
      var words: [String] = []
      while let word = arguments.next() { words.append(word) }
      guard !words.isEmpty else { throw UsageError(description: "missing the command after --") }
      job = OutboxJob(
        kind: .exec(
          ShellCommand(arguments: words, workingDirectory: directory, timeout: timeout?.secondsValue)),
        key: key)
    default:
      throw UsageError(description: "unknown job kind \"\(kind)\": use http or exec")
    }
    try arguments.finish()
    let queue = try context.controlQueue()
    let result = try await queue.add(job, priority: priority, delay: delay)
    output(result.id.description)
    if !result.inserted {
      FileHandle.standardError.write(
        Data("conveyor: not stored: job \(result.id) with the same --key is already waiting\n".utf8))
    }
    return ExitCode.success.rawValue
  }

  // MARK: work

  static func work(_ arguments: inout Arguments, _ context: Context) async throws -> Int32 {
    let concurrency = try arguments.integer("--concurrency", "-c", in: 1...1000) ?? 1
    let maxAttempts = try arguments.integer("--max-attempts", in: 1...1_000_000) ?? 10
    let lease = try arguments.seconds("--lease", allowingZero: false) ?? .seconds(60)
    let untilEmpty = arguments.flag("--until-empty")
    let json = arguments.flag("--json")
    try arguments.finish()
    let options = Worker.Options(
      concurrency: concurrency, maxAttempts: maxAttempts, leaseDuration: lease, untilEmpty: untilEmpty,
      output: json ? .json : (isatty(STDOUT_FILENO) == 1 ? .live : .lines))
    // A short lease needs a short lock wait: a worker waiting longer could lose a running job.
    let store = try context.openStore(busyTimeout: min(.seconds(5), lease / 2))
    let worker = try Worker(store: store, queue: context.queue, options: options)
    return await worker.run()
  }

  // MARK: inspection and control

  static func status(_ arguments: inout Arguments, _ context: Context) async throws -> Int32 {
    let json = arguments.flag("--json")
    try arguments.finish()
    let store = try context.openStore()
    let queue = try context.controlQueue(store: store)
    let counts = try await queue.count()
    let paused = try await store.isPaused(queue: context.queue)
    if json {
      struct Status: Encodable {
        var database: String
        var queue: String
        var paused: Bool
        var counts: JobCounts
      }
      try printJSON(Status(database: store.path, queue: context.queue, paused: paused, counts: counts))
    } else {
      output("database  \(store.path)")
      output("queue     \(context.queue)\(paused ? " (paused)" : "")")
      output("ready     \(counts.ready)")
      output("scheduled \(counts.scheduled)")
      output("running   \(counts.running)")
      output("dead      \(counts.dead)")
    }
    return ExitCode.success.rawValue
  }

  static func list(_ arguments: inout Arguments, _ context: Context) async throws -> Int32 {
    let statusText = try arguments.option("--status")
    let limit = try arguments.integer("--limit", "-n", in: 1...1_000_000) ?? 100
    let json = arguments.flag("--json")
    try arguments.finish()
    let status = try statusText.map { text in
      guard let status = JobStatus(rawValue: text) else {
        throw UsageError(description: "--status must be pending, running or dead, got \"\(text)\"")
      }
      return status
    }
    let queue = try context.controlQueue()
    var printed = 0
    var after: JobID?
    if !json { output(pad("ID", 8) + pad("STATUS", 9) + pad("TRIES", 6) + pad("RUN AT", 21) + "JOB") }
    while printed < limit {
      let page = try await queue.jobs(in: status, after: after, limit: min(500, limit - printed))
      if page.isEmpty { break }
      for record in page {
        let summary: String
        do { summary = try queue.item(of: record).summary } catch { summary = "(undecodable payload)" }
        if json {
          try printJSON(ListedJob(record, summary: summary))
        } else {
          output(
            pad(record.id.description, 8) + pad(record.status.rawValue, 9) + pad(String(record.attempts), 6)
              + pad(timestamp(record.runAt), 21) + summary)
          if let error = record.lastError {
            output(String(repeating: " ", count: 8) + "last error: \(error)")
          }
        }
      }
      printed += page.count
      after = page.last?.id
    }
    return ExitCode.success.rawValue
  }

  static func retry(_ arguments: inout Arguments, _ context: Context) async throws -> Int32 {
    let all = arguments.flag("--all")
    let ids = try jobIDs(&arguments)
    guard all || !ids.isEmpty else { throw UsageError(description: "name dead job IDs to retry, or --all") }
    guard !all || ids.isEmpty else { throw UsageError(description: "name job IDs or use --all, not both") }
    let count = try await context.controlQueue().requeueDead(all ? nil : ids)
    output("re-queued \(count) dead job(s)")
    if !all && count < ids.count {
      printError(
        "conveyor: \(ids.count - count) of the IDs were not re-queued: not dead jobs, or dead jobs "
          + "whose --key a waiting or running job holds")
    }
    return ExitCode.success.rawValue
  }

  static func remove(_ arguments: inout Arguments, _ context: Context) async throws -> Int32 {
    let ids = try jobIDs(&arguments)
    guard !ids.isEmpty else { throw UsageError(description: "name the job IDs to remove") }
    let count = try await context.controlQueue().remove(ids)
    output("removed \(count) job(s)")
    if count < ids.count {
      printError(
        "conveyor: \(ids.count - count) of the IDs were not found (already removed, or in another queue)")
    }
    return count == ids.count ? ExitCode.success.rawValue : ExitCode.failure.rawValue
  }

  static func purge(_ arguments: inout Arguments, _ context: Context) async throws -> Int32 {
    let all = arguments.flag("--all")
    try arguments.finish()
    let queue = try context.controlQueue()
    let count = all ? try await queue.clear() : try await queue.purgeDead()
    output("deleted \(count) \(all ? "" : "dead ")job(s)")
    return ExitCode.success.rawValue
  }

  /// Splits `Name: value`; the name must be an HTTP token and the value a single line.
  static func header(_ line: String) throws -> (name: String, value: String) {
    let tokenCharacters = Set("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    guard let colon = line.firstIndex(of: ":") else {
      throw UsageError(description: "header \"\(line)\" must look like 'Name: value'")
    }
    let name = String(line[..<colon])
    let value = String(line[line.index(after: colon)...]).trimmingCharacters(in: .whitespaces)
    guard !name.isEmpty, name.allSatisfy({ tokenCharacters.contains($0) }) else {
      throw UsageError(
        description: "header \"\(line)\" must look like 'Name: value', with a name of letters, digits and -")
    }
    guard !value.contains(where: { $0 == "\r" || $0 == "\n" || $0 == "\0" }) else {
      throw UsageError(description: "the value of header \"\(name)\" must be a single line")
    }
    return (name, value)
  }

  /// Takes the remaining words as job IDs, each once, in order.
  static func jobIDs(_ arguments: inout Arguments) throws -> [JobID] {
    var ids: [JobID] = []
    while let word = arguments.next() {
      guard let value = Int64(word), value > 0 else {
        throw UsageError(description: "\"\(word)\" is not a job ID (a positive whole number)")
      }
      if !ids.contains(JobID(value)) { ids.append(JobID(value)) }
    }
    return ids
  }
}

/// A database path that cannot be used, found before SQLite opens it: exit code 3.
struct DatabaseError: Error, CustomStringConvertible {
  var description: String
}

/// A job as `list --json` prints it.
struct ListedJob: Encodable {
  var id: Int64
  var status: String
  var attempts: Int
  var runAt: String
  var createdAt: String
  var job: String
  var lastError: String?

  init(_ record: JobRecord, summary: String) {
    id = record.id.rawValue
    status = record.status.rawValue
    attempts = record.attempts
    runAt = timestamp(record.runAt)
    createdAt = timestamp(record.createdAt)
    job = summary
    lastError = record.lastError
  }
}

func printError(_ message: String) {
  FileHandle.standardError.write(Data((message + "\n").utf8))
}

func printJSON(_ value: some Encodable) throws {
  let encoder = JSONEncoder()
  encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
  output(String(decoding: try encoder.encode(value), as: UTF8.self))
}

func pad(_ text: String, _ width: Int) -> String {
  text.count >= width ? text + " " : text + String(repeating: " ", count: width - text.count)
}

func timestamp(_ date: Date) -> String {
  date.ISO8601Format()
}

extension Duration {
  var secondsValue: Double {
    Double(components.seconds) + Double(components.attoseconds) / 1e18
  }
}

/// Writes a line to standard output at once (unbuffered), so `conveyor work --json | …` and the
/// demo's child worker are read as events happen, not when a buffer fills.
func output(_ text: String = "") {
  FileHandle.standardOutput.write(Data((text + "\n").utf8))
}
