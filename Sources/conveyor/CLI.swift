import Conveyor
import ConveyorNetworking
import ConveyorPostgres
import ConveyorSQLite
import Foundation
import Synchronization

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
  /// Every command, as `conveyor --help` lists them and as each parses its words.
  static let commands: [CommandSpec] =
    [
      CommandSpec(
        name: "add http", operands: "METHOD URL",
        summary: "queue an HTTP request; prints the job ID",
        options: [
          OptionSpec(names: ["--header", "-H"], value: "'NAME: VALUE'", help: "a header; repeat for more"),
          OptionSpec(names: ["--data"], value: "TEXT", help: "the body"),
          OptionSpec(
            names: ["--data-file"], value: "PATH", help: "the body, read from a file (at most 64 MiB)"),
          OptionSpec(
            names: ["--timeout"], value: "S", help: "seconds for the whole request before it is retried"),
        ] + addOptions,
        details: """
          METHOD is a token such as GET, POST, PUT, PATCH, DELETE; URL starts with http:// or https://.
          Content-Length, Transfer-Encoding and Host are set from the body and the URL. A header
          given twice keeps both values, joined with ", ". A redirect to another host drops
          Authorization, Cookie and Proxy-Authorization.

          \(orderingDetails)
          """),
      CommandSpec(
        name: "add exec", operands: "-- PROGRAM [ARGUMENTS...]",
        summary: "queue a command, run without a shell; prints the job ID",
        options: [
          OptionSpec(
            names: ["--cwd"], value: "DIR", help: "where it runs (a relative DIR is taken from here, now)"),
          OptionSpec(names: ["--timeout"], value: "S", help: "seconds before it is stopped and retried"),
        ] + addOptions, takesCommandAfterDashes: true, details: orderingDetails),
      CommandSpec(
        name: "work", operands: "", summary: "handle jobs until SIGINT/SIGTERM/SIGHUP",
        options: [
          OptionSpec(names: ["--concurrency", "-c"], value: "N", help: "jobs at once (default 1)"),
          OptionSpec(
            names: ["--max-attempts"], value: "N", help: "attempts before a job is dead (default 10)"),
          OptionSpec(
            names: ["--dead-releases-key"], value: nil,
            help: "a job of an ordering key that dies leaves its key, and the next job of the key runs "
              + "(by default the key waits until the dead job is retried or removed)"),
          OptionSpec(
            names: ["--lease"], value: "S", help: "seconds a claim lasts without a heartbeat (default 60)"),
          OptionSpec(
            names: ["--until-empty"], value: nil,
            help: "stop when no job is waiting or running (waits for scheduled retries)"),
          OptionSpec(
            names: ["--until-idle"], value: nil,
            help: "stop when no job is ready or running (leaves scheduled jobs for later)"),
          OptionSpec(names: ["--json"], value: nil, help: "one JSON object per event"),
          OptionSpec(
            names: ["--wait-for-database"], value: "S",
            help: "seconds to wait for a PostgreSQL server that is not up yet (default 60)"),
        ] + retentionOptions),
      CommandSpec(
        name: "status", operands: "", summary: "counts by status, and whether the queue is paused",
        options: [OptionSpec(names: ["--json"], value: nil, help: "as one JSON object")]),
      CommandSpec(
        name: "list", operands: "", summary: "jobs with their status and last error",
        options: [
          OptionSpec(
            names: ["--status"], value: "STATUS",
            help: "ready, scheduled, held, pending (all three), running, dead, completed or cancelled"),
          OptionSpec(names: ["--limit", "-n"], value: "N", help: "at most N jobs (default 100)"),
          OptionSpec(names: ["--json"], value: nil, help: "one JSON object per job"),
        ]),
      CommandSpec(
        name: "retry", operands: "ID... | --all", summary: "re-queue dead jobs",
        options: [OptionSpec(names: ["--all"], value: nil, help: "every dead job")]),
      CommandSpec(
        name: "cancel", operands: "ID...",
        summary: "stop jobs for good: a waiting one never runs, a running one's command is stopped",
        options: []),
      CommandSpec(name: "remove", operands: "ID...", summary: "delete jobs", options: []),
    ] + historySpecs + [
      CommandSpec(name: "pause", operands: "", summary: "stop claiming jobs, for every worker", options: []),
      CommandSpec(name: "resume", operands: "", summary: "claim jobs again", options: []),
    ] + LimitsCommands.specs + ScheduleCommands.specs + [
      DashboardCommand.spec
    ] + Migrate.specs + [
      CommandSpec(
        name: "demo", operands: "", summary: "a self-contained run showing retries and recovery",
        options: [OptionSpec(names: ["--keep"], value: nil, help: "keep the demo's database")]),
      CommandSpec(name: "help", operands: "[COMMAND]", summary: "this help, or a command's", options: []),
    ]

  /// Options every `add` takes.
  static let addOptions = [
    OptionSpec(names: ["--delay"], value: "S", help: "run no sooner than S seconds from now"),
    OptionSpec(names: ["--priority"], value: "N", help: "higher runs first (default 0)"),
    OptionSpec(names: ["--key"], value: "KEY", help: "while a job with this key waits, return it instead"),
    OptionSpec(
      names: ["--unique"], value: "SCOPE",
      help: "with --key, which jobs of the key count: waiting (default), running (waiting or "
        + "running), or a duration such as 1h (also completed within it)"),
    OptionSpec(
      names: ["--replace"], value: nil,
      help: "with --key, give a waiting job of the key this job's request, priority and delay"),
    OptionSpec(
      names: ["--ordering-key"], value: "KEY",
      help: "run after every earlier job of the queue with this key, one at a time (1-512 bytes)"),
    OptionSpec(
      names: ["--limit-key"], value: "KEY",
      help: "count against this key's limit of jobs running at once (conveyor limits set "
        + "--key-concurrency); add http's default: the URL's host"),
    OptionSpec(
      names: ["--fairness-key"], value: "KEY",
      help: "take turns with the queue's other keys, e.g. a tenant: one key's backlog delays "
        + "another's job by one job of each key in turn (1-512 bytes; not with --ordering-key)"),
  ]

  /// What `add --help` says of `--ordering-key`.
  static let orderingDetails = """
    Jobs of the queue with the same --ordering-key run one at a time, in the order they were
    added, whatever their priority and however many workers run. A later one is held: it waits
    while an earlier one waits, runs, waits for a retry, or is dead (a dead job holds its key's
    later jobs until it is re-queued with 'conveyor retry', removed, or purged). 'conveyor status'
    counts held jobs; 'conveyor show ID' says which key holds one. Schedules take no ordering key.

    With a limit per key stored ('conveyor limits set --key-concurrency N', or --key K
    --concurrency N for one key), at most that many jobs of one --limit-key run at once, across
    every worker; the others are held until one of them stops running. 'add http' gives every job
    the URL's host as its limit key unless --limit-key names another; a key without a stored limit
    limits nothing.

    Jobs with a --fairness-key (a tenant, a customer) take turns with the other keys of their
    priority: workers take one job of each key in turn, so one key's backlog of thousands delays
    another key's new job by one job of each key. Jobs without one keep their place by run date.
    """

  /// The priorities `--priority` takes.
  static let priorities = -1_000_000...1_000_000

  /// This build's version; `conveyor --version` prints it with the schema versions it writes.
  static let version = "0.1.0"

  /// What `conveyor --version` prints.
  static var versionLine: String {
    "conveyor \(version) (schema: SQLite \(SQLiteJobStore.schemaVersion), PostgreSQL \(PostgresJobStore.schemaVersion))"
  }

  static var usage: String {
    let width = (commands.map(\.name.count).max() ?? 0) + 2
    let list = commands.map {
      "  " + $0.name.padding(toLength: width, withPad: " ", startingAt: 0) + $0.summary
    }
    return """
      conveyor: a durable outbox for HTTP requests and shell commands.

      Usage: conveyor [--database PATH|URL] [--queue NAME] COMMAND [options]
             conveyor --version

      Commands:
      \(list.joined(separator: "\n"))

      Run 'conveyor COMMAND --help' for a command's options.

      Global options (before the command):
        --database, -d PATH   SQLite file, or a PostgreSQL server shared by workers on
                              many machines: a postgres:// URL or a libpq string such
                              as 'host=db dbname=app' (default: $CONVEYOR_DATABASE,
                              else $XDG_DATA_HOME/conveyor/conveyor.sqlite). Give a
                              password in CONVEYOR_DATABASE, PGPASSWORD or ~/.pgpass,
                              not here: every user of the machine can read it (ps)
        --queue, -q NAME      queue name (default: outbox)

      Exit codes: 0 success, 1 jobs died (work --until-empty/--until-idle), IDs not found
                  (retry, remove), no schedule of the name (schedule remove/pause/resume) or
                  output could not be written, 2 usage error, 3 database error.
      """
  }

  static func main(_ commandLine: [String]) async -> Int32 {
    let context = Context()
    let status: Int32
    do {
      status = try await run(Array(commandLine.dropFirst()), context)
    } catch let error as UsageError {
      printError("conveyor: \(shown(error.description))\nRun 'conveyor help' for usage.")
      status = ExitCode.usage.rawValue
    } catch let error as JobQueueError {
      printError("conveyor: \(shown(error.description))")
      status = ExitCode.usage.rawValue
    } catch {
      printError("conveyor: \(shown(String(describing: error)))")
      status = ExitCode.storage.rawValue
    }
    // Closing checkpoints the WAL into the database file and removes the -wal and -shm files.
    await context.close()
    if let failure = OutputFailure.first, status == ExitCode.success.rawValue {
      printError("conveyor: could not write to standard output: \(failure)")
      return ExitCode.failure.rawValue
    }
    return status
  }

  /// Parses the global options and the command name, then runs the command.
  static func run(_ words: [String], _ context: Context) async throws -> Int32 {
    var index = 0
    var database: String?
    // Every --database given: an earlier one is not used, but is on the command line all the same.
    var givenDatabases: [String] = []
    var queueName = "outbox"
    // Global options: only before the command.
    while index < words.count, words[index].hasPrefix("-"), words[index] != "-" {
      let word = words[index]
      if word == "--help" || word == "-h" {
        output(usage)
        return ExitCode.success.rawValue
      }
      if word == "--version" {
        output(versionLine)
        return ExitCode.success.rawValue
      }
      let (name, inline): (String, String?) =
        word.hasPrefix("--") && word.contains("=")
        ? (String(word.prefix { $0 != "=" }), String(word.drop { $0 != "=" }.dropFirst())) : (word, nil)
      guard Arguments.globalOptions.contains(name) else {
        throw UsageError(description: "unknown option \"\(name)\"; options of a command go after its name")
      }
      let value: String
      if let inline {
        value = inline
        index += 1
      } else {
        guard index + 1 < words.count else { throw UsageError(description: "\(name) needs a value") }
        value = words[index + 1]
        index += 2
      }
      if name == "--database" || name == "-d" {
        database = value
        givenDatabases.append(value)
      } else {
        queueName = value
      }
    }
    database =
      database ?? ProcessInfo.processInfo.environment["CONVEYOR_DATABASE"].flatMap { $0.isEmpty ? nil : $0 }
    if database == "" {
      throw UsageError(
        description:
          "--database needs a file path, a postgres:// URL or a libpq connection string; leave it out for "
          + "the default file")
    }
    context.database = try database.map(DatabaseLocation.init)
    if givenDatabases.contains(where: DatabaseLocation.holdsPassword) {
      warnOfSecretOnCommandLine(
        "the database password is on the command line, where every user of this machine can read it "
          + "(ps, /proc); pass the URL in CONVEYOR_DATABASE, or leave the password out and use PGPASSWORD, "
          + "~/.pgpass or PGPASSFILE")
    }
    context.queue = queueName
    guard index < words.count else {
      output(usage)
      return ExitCode.success.rawValue
    }
    var command = words[index]
    index += 1
    // Commands of two words: the group, then its verb.
    let groups = [
      ("add", "job kind", ["http", "exec"]), ("migrate", "migrate command", ["status", "up", "sql"]),
      ("schedule", "schedule command", ["add", "remove", "pause", "resume"]),
    ]
    if let (group, what, verbs) = groups.first(where: { $0.0 == command }) {
      let choices = verbs.dropLast().joined(separator: ", ") + " or " + verbs.last!
      guard index < words.count, !words[index].hasPrefix("-") else {
        if index < words.count, words[index] == "--help" || words[index] == "-h" {
          output(commands.filter { $0.name.hasPrefix(group + " ") }.map(\.help).joined(separator: "\n\n"))
          return ExitCode.success.rawValue
        }
        throw UsageError(description: "missing \(what) (\(choices))")
      }
      let verb = words[index]
      index += 1
      guard verbs.contains(verb) else {
        throw UsageError(description: "unknown \(what) \"\(printable(verb))\": use \(choices)")
      }
      command = "\(group) \(verb)"
    }
    // `limits` alone shows the limits; `limits set` changes them.
    if command == "limits", index < words.count, !words[index].hasPrefix("-") {
      let verb = words[index]
      index += 1
      guard verb == "set" else {
        throw UsageError(
          description:
            "unknown limits command \"\(printable(verb))\": use conveyor limits to show the queue's limits, "
            + "or conveyor limits set --concurrency N|none --rate N/s|none to change them")
      }
      command = "limits set"
    }
    guard let commandSpec = commands.first(where: { $0.name == command }) else {
      throw UsageError(description: "unknown command \"\(command)\"")
    }
    var commandWords = Array(words[index...])
    // `schedule add`'s words end with a job as `add` takes it: parsed apart, by `add`'s rules.
    var scheduledJob: ScheduleCommands.JobWords?
    if command == "schedule add" {
      try ScheduleCommands.refuseOrderingKey(commandWords)
      (commandWords, scheduledJob) = ScheduleCommands.splitJob(commandWords)
    }
    var arguments = try Arguments(commandWords, for: commandSpec)
    if arguments.wantsHelp {
      output(commandSpec.help)
      return ExitCode.success.rawValue
    }
    if command == "help" {
      let topic = arguments.next()
      try arguments.finish()
      guard let topic else {
        output(usage)
        return ExitCode.success.rawValue
      }
      let matching = commands.filter { $0.name == topic || $0.name.hasPrefix(topic + " ") }
      guard !matching.isEmpty else { throw UsageError(description: "unknown command \"\(topic)\"") }
      output(matching.map(\.help).joined(separator: "\n\n"))
      return ExitCode.success.rawValue
    }
    try JobQueueConfiguration.validate(identifier: queueName)
    switch command {
    case "add http": return try await addHTTP(&arguments, context)
    case "add exec": return try await addExec(&arguments, context)
    case "work": return try await work(&arguments, context)
    case "status": return try await status(&arguments, context)
    case "list": return try await list(&arguments, context)
    case "retry": return try await retry(&arguments, context)
    case "cancel": return try await cancel(&arguments, context)
    case "remove": return try await remove(&arguments, context)
    case "purge": return try await purge(&arguments, context)
    case "show": return try await show(&arguments, context)
    case "pause", "resume":
      try arguments.finish()
      let queue = try context.controlQueue()
      if command == "pause" { try await queue.pause() } else { try await queue.resume() }
      output("queue \(context.queue) \(command == "pause" ? "paused" : "resumed")")
      return ExitCode.success.rawValue
    case "limits": return try await LimitsCommands.show(&arguments, context)
    case "limits set": return try await LimitsCommands.set(&arguments, context)
    case "schedule add": return try await ScheduleCommands.add(&arguments, job: scheduledJob, context)
    case "schedule remove", "schedule pause", "schedule resume":
      return try await ScheduleCommands.change(
        String(command.dropFirst("schedule ".count)), &arguments, context)
    case "schedules": return try await ScheduleCommands.list(&arguments, context)
    case "dashboard": return try await DashboardCommand.run(&arguments, context)
    case "migrate status", "migrate up", "migrate sql":
      return try await Migrate.run(String(command.dropFirst("migrate ".count)), &arguments, context)
    case "demo": return try await Demo.run(&arguments)
    default:
      throw UsageError(description: "unknown command \"\(command)\"")
    }
  }

  /// The description of the command named `name`.
  static func spec(_ name: String) -> CommandSpec {
    commands.first { $0.name == name }!
  }

  /// Warns on standard error that a secret was given on the command line (each kind of secret is
  /// warned of once, where it is read).
  static func warnOfSecretOnCommandLine(_ what: String) {
    printError("conveyor: warning: \(what)")
  }

  /// Where the jobs are and which queue the command talks to; closes the store it opened.
  final class Context {
    /// The database `--database` or `CONVEYOR_DATABASE` names; nil for the default file.
    var database: DatabaseLocation?
    var queue = "outbox"
    private var opened: (any JobStore)?
    /// How `status` names the database: the SQLite file's path, or the PostgreSQL server and
    /// database without the password.
    private(set) var databaseDescription = ""

    /// Opens the store once. `busyTimeout` is how long a call waits for another process's lock;
    /// a worker's lease must be at least twice as long.
    func openStore(busyTimeout: Duration = .seconds(5)) throws -> any JobStore {
      if let opened { return opened }
      let store = try makeStore(busyTimeout: busyTimeout)
      opened = store
      return store
    }

    /// Opens the store once, as ``openStore(busyTimeout:)`` does, waiting up to `wait` for a
    /// PostgreSQL server that cannot be reached yet (a worker started before its database). Says
    /// once on standard error that it waits; a signal (`signals`) ends the wait: then it returns
    /// false and nothing is open.
    func openStoreWaiting(busyTimeout: Duration, wait: Duration, signals: SignalWatcher) async throws -> Bool
    {
      guard opened == nil, case .postgres(let text) = database else { return true }
      let options = PostgresJobStore.Options(lockTimeout: busyTimeout, startupWait: wait)
      let opening = Task {
        try await PostgresJobStore.open(url: text, options: options) { error in
          printError(
            "conveyor: waiting up to \(wait) for the database (\(Secrets.scrub(error.message))); "
              + "SIGINT or SIGTERM stops")
        }
      }
      // A signal while the store opens stops the worker, however the opening ends (it may
      // succeed: a signal that came as it finished is still a request to stop).
      let signalled = Atomic<Bool>(false)
      signals.handle { _ in
        signalled.store(true, ordering: .relaxed)
        opening.cancel()
      }
      defer { signals.handle(with: nil) }
      do {
        let store = try await opening.value
        if signalled.load(ordering: .relaxed) {
          await store.close()
          return false
        }
        opened = store
        databaseDescription = "postgres://" + store.target
        return true
      } catch is CancellationError {
        return false
      } catch  where signalled.load(ordering: .relaxed) {
        return false
      }
    }

    /// Closes the store, if one was opened.
    func close() async {
      guard let store = opened else { return }
      opened = nil
      await Self.close(store)
    }

    /// Closes the store, if one was opened, waiting at most `limit` for the calls in progress
    /// (a PostgreSQL store retries a server that is down for a minute); returns whether it closed.
    /// One that did not is left to close, or to the process's exit.
    func close(within limit: Duration) async -> Bool {
      guard let store = opened else { return true }
      opened = nil
      let settled = OnceFlag()
      return await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
        @Sendable func settle(_ closed: Bool) {
          if settled.claim() { continuation.resume(returning: closed) }
        }
        Task {
          await Self.close(store)
          settle(true)
        }
        // A thread, not a task: the pool's threads may all be held by the calls that block.
        Thread.detachNewThread {
          Thread.sleep(forTimeInterval: limit / .seconds(1))
          settle(false)
        }
      }
    }

    private static func close(_ store: any JobStore) async {
      if let sqlite = store as? SQLiteJobStore { await sqlite.close() }
      if let postgres = store as? PostgresJobStore { await postgres.close() }
    }

    private func makeStore(busyTimeout: Duration) throws -> any JobStore {
      let options = SQLiteJobStore.Options(busyTimeout: busyTimeout)
      switch database {
      case nil:
        let store = try SQLiteJobStore(name: "conveyor", options: options)
        databaseDescription = store.path
        return store
      case .postgres(let text):
        let store = try PostgresJobStore(url: text, options: .init(lockTimeout: busyTimeout))
        databaseDescription = "postgres://" + store.target
        return store
      case .sqlite(let path):
        var info = stat()
        if stat(path, &info) == 0, info.st_mode & S_IFMT == S_IFDIR {
          throw DatabaseError(
            description: "\(path) is a folder; pass the path of a database file in it, e.g. "
              + Paths.joined(path, "conveyor.sqlite"))
        }
        let store = try SQLiteJobStore(path: path, options: options)
        databaseDescription = Secrets.scrub(store.path)
        return store
      }
    }

    /// A queue for inspecting and controlling jobs; it never claims any.
    func controlQueue() throws -> JobQueue<OutboxJob> {
      try JobQueue<OutboxJob>(
        configuration: JobQueueConfiguration(identifier: queue, autoStart: false),
        store: try openStore()
      ) { _, _ in .retry(after: .zero) }
    }
  }

  // MARK: add

  /// The largest `--data-file` read: the body is stored in the job, and base64 in its JSON.
  static let maximumBodySize = 64 << 20

  static func addHTTP(_ arguments: inout Arguments, _ context: Context) async throws -> Int32 {
    var job = try httpJob(&arguments)
    job.limitKey = try limitKey(arguments) ?? job.defaultLimitKey
    job.fairnessKey = try fairnessKey(arguments, orderingKey: job.orderingKey)
    return try await add(job, arguments, context)
  }

  static func addExec(_ arguments: inout Arguments, _ context: Context) async throws -> Int32 {
    var job = try execJob(&arguments)
    job.limitKey = try limitKey(arguments)
    job.fairnessKey = try fairnessKey(arguments, orderingKey: job.orderingKey)
    return try await add(job, arguments, context)
  }

  /// The `--fairness-key`, if given, refused (exit 2, nothing stored) by ``FairnessKey``'s rules
  /// and beside an `--ordering-key`.
  static func fairnessKey(_ arguments: Arguments, orderingKey: String?) throws -> String? {
    guard let key = arguments.option("--fairness-key") else { return nil }
    if key.isEmpty {
      throw UsageError(
        description: "--fairness-key cannot be empty: give a key such as a tenant, or leave the option out")
    }
    if let problem = FairnessKey.problem(key) { throw UsageError(description: "--fairness-key: \(problem)") }
    if orderingKey != nil {
      throw UsageError(
        description: "--fairness-key and --ordering-key cannot go together yet: an ordering key's jobs "
          + "already run one at a time; drop one")
    }
    return key
  }

  /// The `--limit-key`, if given, refused (exit 2, nothing stored) by ``LimitKey``'s rules.
  static func limitKey(_ arguments: Arguments) throws -> String? {
    guard let key = arguments.option("--limit-key") else { return nil }
    guard let problem = LimitKey.problem(key) else { return key }
    throw UsageError(
      description: key.isEmpty
        ? "--limit-key cannot be empty: give a key such as a host or a tenant, or leave the option out"
        : "--limit-key: \(problem)")
  }

  /// The HTTP job `add http`'s words describe (and `schedule add … http`'s, whose words hold no
  /// `--key`).
  static func httpJob(_ arguments: inout Arguments) throws -> OutboxJob {
    let method = try arguments.required("HTTP method (GET, POST, PUT, PATCH, DELETE, ...)").uppercased()
    let urlText = try arguments.required("URL")
    try arguments.finish()
    let url = try httpURL(urlText)
    var headers: [String: String] = [:]
    var names: [String: String] = [:]  // lower-cased name: the spelling first given
    for line in arguments.options("--header") {
      let (name, value) = try header(line)
      let key = names[name.lowercased(), default: name]
      names[name.lowercased()] = key
      headers[key] = headers[key].map { $0 + (key.lowercased() == "cookie" ? "; " : ", ") + value } ?? value
    }
    let data = arguments.option("--data")
    let dataFile = arguments.option("--data-file")
    if data != nil && dataFile != nil {
      throw UsageError(description: "use --data or --data-file, not both")
    }
    var body = data.map { Data($0.utf8) }
    if let dataFile { body = try readBody(dataFile) }
    let timeout = try arguments.seconds("--timeout", allowingZero: false)
    let request = HTTPRequest(
      method: method, url: url, headers: headers, body: body, timeout: timeout?.secondsValue)
    do {
      try request.validate()
    } catch {
      throw UsageError(description: error.description)
    }
    return OutboxJob(
      kind: .http(request), key: arguments.option("--key"), orderingKey: try orderingKey(arguments))
  }

  /// The command job `add exec`'s words describe (and `schedule add … exec`'s, whose words hold
  /// no `--key`).
  static func execJob(_ arguments: inout Arguments) throws -> OutboxJob {
    guard arguments.next() == "--" else {
      throw UsageError(description: "put the command after --, e.g. conveyor add exec -- echo hello")
    }
    var words: [String] = []
    while let word = arguments.next() { words.append(word) }
    guard !words.isEmpty else { throw UsageError(description: "missing the command after --") }
    let directory = try arguments.option("--cwd").map(workingDirectory)
    let timeout = try arguments.seconds("--timeout", allowingZero: false)
    let command = ShellCommand(arguments: words, workingDirectory: directory, timeout: timeout?.secondsValue)
    return OutboxJob(
      kind: .exec(command), key: arguments.option("--key"), orderingKey: try orderingKey(arguments))
  }

  /// The `--ordering-key`, if given, refused (exit 2, nothing stored) by ``OrderingKey``'s rules
  /// with what to pass instead.
  static func orderingKey(_ arguments: Arguments) throws -> String? {
    guard let key = arguments.option("--ordering-key") else { return nil }
    guard let problem = OrderingKey.problem(key) else { return key }
    let bytes = key.utf8.count
    let description =
      if key.isEmpty {
        "--ordering-key cannot be empty: give a key such as an order or customer ID, or leave the "
          + "option out for a job that waits for no other"
      } else if bytes > OrderingKey.maximumBytes {
        "--ordering-key is at most \(OrderingKey.maximumBytes) UTF-8 bytes, this one has \(bytes): pass a "
          + "shorter key, such as an ID or a hash of a long one"
      } else {
        "--ordering-key: \(problem)"
      }
    throw UsageError(description: description)
  }

  /// A `--cwd` as stored: a relative one means the folder it names from here, where the command
  /// was typed, not from wherever a worker happens to run. A file is refused; a folder that does
  /// not exist yet is taken (a worker may run where it does), and a job that finds none dies.
  static func workingDirectory(_ text: String) throws -> String {
    guard !text.isEmpty, !text.utf8.contains(0) else {
      throw UsageError(description: "--cwd needs the path of a folder")
    }
    var folder = text
    if !text.hasPrefix("/") {
      guard let current = Paths.currentFolder() else {
        throw UsageError(
          description: "--cwd \"\(printable(text))\" is relative, but the current folder cannot be read; "
            + "give an absolute path")
      }
      folder = Paths.absolute(text, from: current)
    } else {
      folder = Paths.absolute(text, from: "/")
    }
    switch Paths.kind(folder) {
    case .folder, .missing: return folder
    case .file:
      throw UsageError(description: "--cwd \"\(printable(folder))\" is a file, not a folder")
    case .other:
      throw UsageError(
        description: "--cwd \"\(printable(folder))\" is not a folder (a device, a FIFO or a socket)")
    }
  }

  /// Stores `job` with the `add` options and prints its ID; its payload as ``storedPayload(_:)``
  /// makes it.
  static func add(_ job: OutboxJob, _ arguments: Arguments, _ context: Context) async throws -> Int32 {
    let delay = try arguments.seconds("--delay") ?? .zero
    let priority = try arguments.integer("--priority", in: priorities) ?? 0
    let scope = try uniqueness(arguments)
    let onConflict: DeduplicationConflict = arguments.flag("--replace") ? .replace : .useExisting
    if job.deduplicationKey == nil, arguments.option("--unique") != nil || arguments.flag("--replace") {
      throw UsageError(
        description: "--unique and --replace need a --key: they say what a job of the key does")
    }
    if case .completedWithin(let period) = scope, period > .seconds(86_400) {
      printError(
        "conveyor: note: --unique \(arguments.option("--unique") ?? "") looks back further than the day workers keep "
          + "completed jobs by default; run them with --keep-completed of at least as long")
    }
    let store = try context.openStore()
    let payload = try storedPayload(job)
    let result = try await store.enqueue(
      [
        NewJob(
          payload: payload, priority: priority, runTime: delay > .zero ? .after(delay) : .now,
          deduplicationKey: job.deduplicationKey, deduplicationScope: scope, onConflict: onConflict,
          orderingKey: job.orderingKey, limitKey: job.limitKey, fairnessKey: job.fairnessKey)
      ], queue: context.queue, clock: SystemJobClock())[0]
    let id = result.id
    switch result.outcome {
    case .inserted: break
    case .existing:
      let which =
        switch scope {
        case .waiting: "is already waiting"
        case .waitingOrRunning: "is already waiting or running"
        case .completedWithin:
          "is waiting, running or completed within --unique \(arguments.option("--unique") ?? "")"
        }
      printError("conveyor: not stored: job \(id) with the same --key \(which)")
    case .replaced:
      printError(
        "conveyor: job \(id) with the same --key was waiting; it now has this job's request, priority and delay"
      )
    }
    if job.orderingKey != nil, let record = try await store.job(id), record.isHeld,
      let key = record.orderingKey
    {
      printError(
        "conveyor: job \(id) is \(heldText(key)); it runs once every earlier job of its key has finished")
    }
    if let failure = output(id.description) {
      printError(
        "conveyor: job \(id) was added, but its ID could not be written to standard output (\(failure))")
      return ExitCode.failure.rawValue
    }
    return ExitCode.success.rawValue
  }

  /// `held by ordering key "KEY"`, the key escaped (``printable(_:)``).
  static func heldText(_ key: String) -> String {
    "held by ordering key \"\(printable(key))\""
  }

  /// `held by the limit of key "KEY"`, the key escaped (``printable(_:)``).
  static func limitHeldText(_ key: String) -> String {
    "held by the limit of key \"\(printable(key))\""
  }

  /// What `status` says of held jobs.
  static func heldExplanation(_ limits: QueueLimits) -> String {
    limits.hasKeyLimits
      ? "waiting behind an earlier job of their ordering key, or for their key's limit"
      : "waiting behind an earlier job of their ordering key"
  }

  /// Whether a dead job of `queue` holds a held job: it kept its ordering key (one that left it,
  /// `DeadHeadPolicy.releasesKey`, has none) and a held job has that key. Reads at most 10,000
  /// dead and 10,000 waiting jobs; nil when that was not enough to tell.
  static func aDeadJobHoldsAHeldJob(_ store: any JobStore, queue: String) async throws -> Bool? {
    /// The jobs of `status` that `keep` keeps, and whether every such job was read.
    func read(_ status: JobStatus, _ keep: (JobRecord) -> Bool) async throws -> (jobs: [JobRecord], all: Bool)
    {
      var kept: [JobRecord] = []
      var cursor: JobID?
      for _ in 0..<10 {
        let page = try await store.jobs(queue: queue, status: status, after: cursor, limit: 1_000)
        kept += page.filter(keep)
        guard page.count == 1_000, let last = page.last else { return (kept, true) }
        cursor = last.id
      }
      return (kept, false)
    }
    let dead = try await read(.dead) { $0.orderingKey != nil }
    if dead.jobs.isEmpty { return dead.all ? false : nil }
    let keys = Set(dead.jobs.compactMap(\.orderingKey).map(ExactText.init))
    let held = try await read(.pending) { $0.isHeld }
    if held.jobs.contains(where: { $0.orderingKey.map { keys.contains(ExactText($0)) } ?? false }) {
      return true
    }
    return dead.all && held.all ? false : nil
  }

  /// `job` as `add` stores it: its JSON with each object's members smallest first, so that
  /// listings find its summary in the payload's first bytes.
  static func storedPayload(_ job: OutboxJob) throws -> Data {
    let encoded = try JSONEncoder().encode(job)
    return PayloadPrefix.summaryMembersFirst(encoded) ?? encoded
  }

  /// The `--unique` scope: `waiting` (the default), `running`, or a duration above zero.
  static func uniqueness(_ arguments: Arguments) throws -> DeduplicationScope {
    guard let text = arguments.option("--unique") else { return .waiting }
    switch text {
    case "waiting": return .waiting
    case "running": return .waitingOrRunning
    default:
      guard let period = Arguments.duration(text), period > .zero else {
        throw UsageError(
          description: "--unique must be waiting, running, or a duration above zero such as 90s, 15m, "
            + "24h or 7d (at most 36500d), got \"\(printable(text))\"")
      }
      return .completedWithin(period)
    }
  }

  /// Parses an `http://` or `https://` URL; the scheme may be given in any case.
  static func httpURL(_ text: String) throws -> URL {
    guard var components = URLComponents(string: text), let scheme = components.scheme?.lowercased(),
      ["http", "https"].contains(scheme), components.host?.isEmpty == false
    else {
      throw UsageError(description: "\"\(printable(text))\" is not an http:// or https:// URL")
    }
    if let port = components.port, !(1...65_535).contains(port) {
      throw UsageError(description: "\"\(printable(text))\" has port \(port); a port is 1...65535")
    }
    components.scheme = scheme
    guard let url = components.url else {
      throw UsageError(description: "\"\(printable(text))\" is not an http:// or https:// URL")
    }
    return url
  }

  /// Reads a `--data-file` of at most ``maximumBodySize`` bytes.
  static func readBody(_ path: String) throws -> Data {
    guard let handle = FileHandle(forReadingAtPath: path) else {
      throw UsageError(description: "cannot read --data-file \"\(printable(path))\"")
    }
    defer { closeQuietly(handle) }
    let contents: Data?
    do {
      contents = try handle.read(upToCount: maximumBodySize + 1)
    } catch {
      throw UsageError(
        description: "cannot read --data-file \"\(printable(path))\": \(error.localizedDescription)")
    }
    let body = contents ?? Data()
    guard body.count <= maximumBodySize else {
      throw UsageError(
        description:
          "--data-file \"\(printable(path))\" is larger than \(maximumBodySize >> 20) MiB; "
          + "an outbox job keeps its body in the database: send large files another way")
    }
    return body
  }

  // MARK: work

  static func work(_ arguments: inout Arguments, _ context: Context) async throws -> Int32 {
    let concurrency = try arguments.integer("--concurrency", in: 1...1000) ?? 1
    let maxAttempts = try arguments.integer("--max-attempts", in: 1...1_000_000) ?? 10
    let deadReleasesKey = arguments.flag("--dead-releases-key")
    let lease = try arguments.seconds("--lease", allowingZero: false) ?? .seconds(60)
    let untilEmpty = arguments.flag("--until-empty")
    let untilIdle = arguments.flag("--until-idle")
    let json = arguments.flag("--json")
    let wait = try arguments.seconds("--wait-for-database") ?? .seconds(60)
    let retention = try retention(&arguments)
    try arguments.finish()
    if untilEmpty && untilIdle {
      throw UsageError(description: "use --until-empty or --until-idle, not both")
    }
    let options = Worker.Options(
      concurrency: concurrency, maxAttempts: maxAttempts, leaseDuration: lease, untilEmpty: untilEmpty,
      untilIdle: untilIdle, output: json ? .json : (isatty(STDOUT_FILENO) == 1 ? .live : .lines),
      retention: retention, deadHeadPolicy: deadReleasesKey ? .releasesKey : .holdsKey)
    // One watcher from here to the end: a signal while the database is awaited ends the wait; one
    // after it stops the queue.
    let signals = SignalWatcher()
    defer { signals.cancel() }
    // A short lease needs a short lock wait: a worker waiting longer could lose a running job.
    let busyTimeout = min(.seconds(5), lease / 2)
    guard try await context.openStoreWaiting(busyTimeout: busyTimeout, wait: wait, signals: signals) else {
      printError("conveyor: stopped while waiting for the database")
      return ExitCode.success.rawValue
    }
    let store = try context.openStore(busyTimeout: busyTimeout)
    let worker = try Worker(store: store, queue: context.queue, options: options)
    return await worker.run(signals: signals)
  }

  // MARK: inspection and control

  static func status(_ arguments: inout Arguments, _ context: Context) async throws -> Int32 {
    let json = arguments.flag("--json")
    try arguments.finish()
    let store = try context.openStore()
    let queue = try context.controlQueue()
    let counts = try await queue.count()
    let paused = try await store.isPaused(queue: context.queue)
    let limits = try await store.limits(queue: context.queue)
    let rateWait = try await LimitsCommands.rateWait(limits, counts, store: store, queue: context.queue)
    let keyUsage =
      limits.hasKeyLimits
      ? try await LimitsCommands.keyUsage(store, queue: context.queue, limits: limits) : nil
    // Handlers reported stuck in the last hour, as the workers counted them (their activity).
    let stuck = try await store.activity(since: Date().addingTimeInterval(-3_600), limit: 100_000)
      .filter { $0.queue == context.queue }.reduce(Int64(0)) { $0 &+ $1.stuck }
    if json {
      struct Status: Encodable {
        var database: String
        var queue: String
        var paused: Bool
        var counts: JobCounts
        var stuckInTheLastHour: Int64
        /// The stored limits; absent when none is set.
        var limits: QueueLimits?
        /// Whether the concurrency limit keeps ready jobs waiting; absent without a limit.
        var limitReached: Bool?
        /// Whether the rate keeps ready jobs waiting for its next start; absent without a rate.
        var rateReached: Bool?
        /// Seconds until that next start; absent unless `rateReached`.
        var nextStartIn: Double?
        /// The keys whose limit holds jobs, most held first; absent without limits per key.
        var heldByKeyLimit: [LimitsCommands.KeyUsage]?
        /// Every key with a limit and running or held jobs, most held first, then most running,
        /// then the keys with a limit of their own and neither (at most 1,000); absent without
        /// limits per key.
        var keys: [LimitsCommands.KeyUsage]?
        /// Whether ``keys`` lists every such key; absent without limits per key.
        var keysComplete: Bool?
      }
      try printJSON(
        Status(
          database: context.databaseDescription, queue: context.queue, paused: paused, counts: counts,
          stuckInTheLastHour: stuck, limits: limits.isEmpty ? nil : limits,
          limitReached: limits.isEmpty ? nil : LimitsCommands.reachedText(limits, counts) != nil,
          rateReached: limits.rate == nil ? nil : rateWait != nil,
          nextStartIn: rateWait.map {
            Double($0.components.seconds) + Double($0.components.attoseconds) / 1e18
          }, heldByKeyLimit: keyUsage.map { $0.keys.filter { $0.held > 0 } }, keys: keyUsage?.keys,
          keysComplete: keyUsage?.complete))
    } else {
      output("database  \(printable(context.databaseDescription))")
      output("queue     \(context.queue)\(paused ? " (paused)" : "")")
      if let concurrency = limits.concurrency {
        output("limit     at most \(concurrency) running at once")
      }
      if let rate = limits.rate {
        output("rate      at most \(rate.description) starting, across every worker")
      }
      if let perKey = limits.keyConcurrency {
        output("key limit at most \(perKey) running at once for each --limit-key")
      }
      if let rate = limits.keyRate {
        output("key rate  at most \(rate.description) starting for each --limit-key")
      }
      let own = LimitsCommands.ownLimitKeys(limits).count
      if own > 0 {
        output("key limit \(own) key\(own == 1 ? " has its" : "s have their") own (conveyor limits)")
      }
      for line in keyUsage.map(LimitsCommands.keyUsageLines) ?? [] { output("key       \(line)") }
      output("ready     \(counts.ready)")
      output("scheduled \(counts.scheduled)")
      output("held      \(counts.held)" + (counts.held > 0 ? " (\(heldExplanation(limits)))" : ""))
      output("running   \(counts.running)")
      output("dead      \(counts.dead)")
      output("completed \(counts.completed)")
      output("cancelled \(counts.cancelled)")
      if counts.held > 0, counts.dead > 0,
        try await aDeadJobHoldsAHeldJob(store, queue: context.queue) != false
      {
        output(
          "note      a dead job holds the later jobs of its ordering key until it is re-queued "
            + "(conveyor retry), removed or purged")
      }
      if let reason = LimitsCommands.reachedText(limits, counts) {
        output("waiting   \(reason)")
      }
      if let rateWait {
        output("waiting   \(LimitsCommands.rateReachedText(limits, counts, wait: rateWait))")
      }
      if let text = keyUsage.flatMap(LimitsCommands.keyUsageText) { output("waiting   \(text)") }
      if stuck > 0 {
        output(
          "stuck     \(stuck) in the last hour: handlers past their time limit that ignore cancellation, "
            + "each holding a worker slot until it returns")
      }
    }
    return ExitCode.success.rawValue
  }

  /// The words `list --status` takes: the stored statuses, and `status`'s two kinds of pending.
  enum ListedStatus: String, CaseIterable {
    case ready, scheduled, held, pending, running, dead, completed, cancelled

    var stored: JobStatus {
      switch self {
      case .ready, .scheduled, .held, .pending: .pending
      case .running: .running
      case .dead: .dead
      case .completed: .completed
      case .cancelled: .cancelled
      }
    }

    /// Whether a record of ``stored`` status is listed, `now` telling ready from scheduled.
    func includes(_ record: JobRecord, now: Date) -> Bool {
      switch self {
      case .ready: !record.isHeld && record.runAt <= now
      case .scheduled: !record.isHeld && record.runAt > now
      case .held: record.isHeld
      default: true
      }
    }
  }

  /// A job's status as `list` and `show` name it: a pending one is ready, scheduled or held.
  static func shownStatus(_ record: JobRecord, now: Date) -> String {
    guard record.status == .pending else { return record.status.rawValue }
    return record.isHeld ? "held" : record.runAt <= now ? "ready" : "scheduled"
  }

  static func list(_ arguments: inout Arguments, _ context: Context) async throws -> Int32 {
    let statusText = arguments.option("--status")
    let limit = try arguments.integer("--limit", in: 1...1_000_000) ?? 100
    let json = arguments.flag("--json")
    try arguments.finish()
    let status = try statusText.map { text in
      guard let status = ListedStatus(rawValue: text) else {
        throw UsageError(
          description:
            "--status must be ready, scheduled, held, pending, running, dead, completed or cancelled, got "
            + "\"\(printable(text))\"")
      }
      return status
    }
    let store = try context.openStore()
    let now = Date()
    var printed = 0
    var after: JobID?
    if !json { output(pad("ID", 8) + pad("STATUS", 10) + pad("TRIES", 6) + pad("RUN AT", 21) + "JOB") }
    pages: while printed < limit {
      // Summaries: only the start of each payload is read, so a page takes at most 100 times
      // `PayloadPrefix.listedBytes` of payload, however large the bodies, and of each error its
      // first `listedError` scalars; a job whose start does not hold its summary is read further,
      // alone and within `OutboxJob.summaryReadLimit`.
      let page = try await store.jobSummaries(
        queue: context.queue, status: status?.stored, after: after, limit: min(100, limit - printed),
        payloadPrefix: PayloadPrefix.listedBytes, errorPrefix: listedError + 1)
      if page.isEmpty { break }
      after = page.last?.id
      for listed in page where status?.includes(listed.record, now: now) ?? true {
        var record = listed.record
        record.lastError = record.lastError.map { cut($0, to: listedError) }
        let summary = try await OutboxJob.summary(of: listed, in: store) ?? "(undecodable payload)"
        let shownStatus = Self.shownStatus(record, now: now)
        if json {
          try printJSON(ListedJob(record, summary: summary))
        } else {
          output(
            pad(record.id.description, 8) + pad(shownStatus, 10) + pad(String(record.attempts), 6)
              + pad(timestamp(record.runAt), 21) + printable(summary))
          if let finished = record.finishedAt {
            let ran = record.runDuration.map { " after running \(JobStoreTime.secondsText($0))" } ?? ""
            output(String(repeating: " ", count: 8) + "finished \(timestamp(finished))\(ran)")
          }
          if record.isHeldByLimit, let key = record.limitKey {
            output(
              String(repeating: " ", count: 8)
                + "\(limitHeldText(key)) (waits for a running job of its key to stop)")
          } else if let key = record.orderingKey {
            output(
              String(repeating: " ", count: 8)
                + (record.isHeld
                  ? "\(heldText(key)) (waits for the earlier jobs of its key)"
                  : "ordering key \"\(printable(key))\""))
          }
          if let error = record.lastError {
            output(String(repeating: " ", count: 8) + "last error: \(printable(error))")
          }
        }
        printed += 1
        if printed >= limit { break pages }
      }
    }
    return ExitCode.success.rawValue
  }

  /// The most Unicode scalars of a job's last error `list` shows (and reads): an application's
  /// handler can record an error of any size.
  static let listedError = 16 * 1024

  static func retry(_ arguments: inout Arguments, _ context: Context) async throws -> Int32 {
    let all = arguments.flag("--all")
    let ids = try jobIDs(&arguments)
    guard all || !ids.isEmpty else { throw UsageError(description: "name dead job IDs to retry, or --all") }
    guard !all || ids.isEmpty else { throw UsageError(description: "name job IDs or use --all, not both") }
    let count = try await context.controlQueue().requeueDead(all ? nil : ids)
    output("re-queued \(count) dead job(s)")
    if !all && count < ids.count {
      printError(
        "conveyor: \(ids.count - count) of the IDs were not re-queued: not found, not dead, or dead jobs "
          + "whose --key a waiting or running job holds")
      return ExitCode.failure.rawValue
    }
    return ExitCode.success.rawValue
  }

  /// Cancels each job, saying per job what happened. A job already finished (completed,
  /// cancelled, dead, or pruned) is not an error: nothing was left to stop.
  static func cancel(_ arguments: inout Arguments, _ context: Context) async throws -> Int32 {
    let ids = try jobIDs(&arguments)
    guard !ids.isEmpty else { throw UsageError(description: "name the job IDs to cancel") }
    let results = try await context.controlQueue().cancel(ids)
    for (id, result) in zip(ids, results) {
      switch result {
      case .cancelledWaiting: output("job \(id): cancelled; it will not run")
      case .cancelledRunning:
        output(
          "job \(id): cancelled while running; its worker stops it (within about a second) and does not retry it"
        )
      case .alreadyDead: output("job \(id): already dead; nothing to cancel (delete it with remove)")
      case .alreadyCompleted: output("job \(id): already completed; nothing to cancel")
      case .alreadyCancelled: output("job \(id): already cancelled; nothing to do")
      case .notFound:
        output(
          "job \(id): no such job in this queue (removed, pruned from the history, or never added); nothing to cancel"
        )
      }
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

  /// Splits `Name: value`; the name must be an HTTP token (checked by Unicode scalar, so that a
  /// CR LF pair, one `Character` in Swift, is seen). The value is checked by `HTTPRequest.validate`.
  static func header(_ line: String) throws -> (name: String, value: String) {
    let tokenScalars = Set(
      "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ".unicodeScalars)
    guard let colon = line.unicodeScalars.firstIndex(of: ":") else {
      throw UsageError(description: "header \"\(printable(line))\" must look like 'Name: value'")
    }
    let name = String(line.unicodeScalars[..<colon])
    let value = String(line.unicodeScalars[line.unicodeScalars.index(after: colon)...])
      .trimmingCharacters(in: CharacterSet(charactersIn: " \t"))
    guard !name.isEmpty, name.unicodeScalars.allSatisfy({ tokenScalars.contains($0) }) else {
      throw UsageError(
        description:
          "header \"\(printable(line))\" must look like 'Name: value', with a name of letters, digits and -")
    }
    guard
      value.unicodeScalars.allSatisfy({ $0 == "\t" || !($0.value < 0x20 || (0x7F...0x9F).contains($0.value)) }
      )
    else {
      throw UsageError(
        description: "the value of header \"\(name)\" must be a single line without control characters")
    }
    return (name, value)
  }

  /// Takes the remaining words as job IDs, each once, in order.
  static func jobIDs(_ arguments: inout Arguments) throws -> [JobID] {
    var ids: [JobID] = []
    var seen: Set<JobID> = []
    while let word = arguments.next() {
      guard let value = Int64(word), value > 0 else {
        throw UsageError(description: "\"\(printable(word))\" is not a job ID (a positive whole number)")
      }
      if seen.insert(JobID(value)).inserted { ids.append(JobID(value)) }
    }
    return ids
  }
}

/// True for the first caller of ``claim()`` only.
final class OnceFlag: Sendable {
  private let claimed = Atomic<Bool>(false)

  /// Whether this call is the first.
  func claim() -> Bool {
    !claimed.exchange(true, ordering: .acquiringAndReleasing)
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
  var finishedAt: String?
  var runMilliseconds: Int64?
  /// The job's `--ordering-key`; absent without one.
  var orderingKey: String?
  /// Whether the job (pending) waits behind an earlier job of its ordering key, or for its limit
  /// key's limit (``heldByLimit``).
  var held: Bool
  /// The job's `--limit-key`; absent without one.
  var limitKey: String?
  /// Whether the job (pending) is held for its limit key's limit.
  var heldByLimit: Bool
  /// The job's `--fairness-key`; absent without one.
  var fairnessKey: String?

  init(_ record: JobRecord, summary: String) {
    id = record.id.rawValue
    status = record.status.rawValue
    orderingKey = record.orderingKey
    held = record.isHeld
    limitKey = record.limitKey
    heldByLimit = record.isHeldByLimit
    fairnessKey = record.fairnessKey
    attempts = record.attempts
    runAt = timestamp(record.runAt)
    createdAt = timestamp(record.createdAt)
    job = summary
    lastError = record.lastError
    finishedAt = record.finishedAt.map(timestamp)
    runMilliseconds = record.runDuration.map(JobStoreTime.milliseconds)
  }
}

/// `text` as messages show it: passwords scrubbed (``Secrets``), control characters escaped.
func shown(_ text: String) -> String {
  printable(Secrets.scrub(text))
}

/// Writes a line to standard error; a failure to do so has nowhere to be reported.
func printError(_ message: String) {
  _ = write(Data((message + "\n").utf8), to: STDERR_FILENO)
}

/// `text` with every control character escaped (`\n`, `\r`, `\t`, `\u{1B}`…), so that text from
/// a server, a command or a payload can neither move the cursor, recolour the terminal nor fake
/// a line of output.
func printable(_ text: String) -> String {
  guard text.unicodeScalars.contains(where: isControl) else { return text }
  var result = ""
  for scalar in text.unicodeScalars {
    if isControl(scalar) {
      switch scalar {
      case "\n": result += "\\n"
      case "\r": result += "\\r"
      case "\t": result += "\\t"
      default: result += "\\u{" + String(scalar.value, radix: 16, uppercase: true) + "}"
      }
    } else {
      result.unicodeScalars.append(scalar)
    }
  }
  return result
}

/// C0 and C1 control characters and DEL; also the line and paragraph separators.
private func isControl(_ scalar: Unicode.Scalar) -> Bool {
  scalar.value < 0x20 || (0x7F...0x9F).contains(scalar.value) || scalar.value == 0x2028
    || scalar.value == 0x2029
}

/// The first failure to write to standard output, reported when the command ends.
enum OutputFailure {
  private static let failure = Mutex<String?>(nil)

  static var first: String? { failure.withLock { $0 } }

  static func record(_ reason: String) {
    failure.withLock { $0 = $0 ?? reason }
  }
}

/// Writes all of `data` to `descriptor`, retrying after interruptions; returns the error's text.
private func write(_ data: Data, to descriptor: Int32) -> String? {
  data.withUnsafeBytes { bytes -> String? in
    var offset = 0
    while offset < bytes.count {
      #if canImport(Glibc)
        let written = Glibc.write(descriptor, bytes.baseAddress! + offset, bytes.count - offset)
      #else
        let written = Darwin.write(descriptor, bytes.baseAddress! + offset, bytes.count - offset)
      #endif
      if written < 0 {
        if errno == EINTR { continue }
        return String(cString: strerror(errno))
      }
      offset += written
    }
    return nil
  }
}

/// Prints `value` as one line of JSON. `JSONEncoder` escapes C0 control characters; the C1 ones
/// (such as U+009B, a one-character CSI) and the line and paragraph separators are escaped here
/// too, so no string in the output can act on a terminal or split a line.
func printJSON(_ value: some Encodable) throws {
  let encoder = JSONEncoder()
  encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
  let text = String(decoding: try encoder.encode(value), as: UTF8.self)
  var escaped = ""
  for scalar in text.unicodeScalars {
    if (0x7F...0x9F).contains(scalar.value) || scalar.value == 0x2028 || scalar.value == 0x2029 {
      escaped +=
        "\\u" + String(repeating: "0", count: 4 - String(scalar.value, radix: 16).count)
        + String(scalar.value, radix: 16)
    } else {
      escaped.unicodeScalars.append(scalar)
    }
  }
  output(escaped)
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
/// demo's child worker are read as events happen, not when a buffer fills. A failure (a full
/// disk, `>/dev/full`) is returned and recorded, and makes the command exit 1; it never traps.
@discardableResult
func output(_ text: String = "") -> String? {
  guard let failure = write(Data((text + "\n").utf8), to: STDOUT_FILENO) else { return nil }
  OutputFailure.record(failure)
  return failure
}
