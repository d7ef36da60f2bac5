import Conveyor
import Foundation

/// `conveyor schedule add|remove|pause|resume` and `conveyor schedules`: periodic outbox jobs
/// stored in the database (origin ``ScheduleOrigin/added``), fired by every `conveyor work` of the
/// queue.
enum ScheduleCommands {
  static let specs = [
    CommandSpec(
      name: "schedule add", operands: "NAME (--cron EXPR | --every D) exec|http ...",
      summary: "store a periodic job: each slot adds a job, fired by every worker of the queue",
      options: [
        OptionSpec(
          names: ["--cron"], value: "EXPR",
          help: "five cron fields such as '0 8 * * MON-FRI' (minute hour day month weekday), or @daily"),
        OptionSpec(
          names: ["--every"], value: "D",
          help: "an interval: 90s, 15m, 1h, 1d (slots at its multiples since 1970-01-01 UTC)"),
        OptionSpec(
          names: ["--time-zone"], value: "TZ",
          help: "the zone whose wall clock --cron reads, such as Europe/Berlin (default UTC)"),
        OptionSpec(
          names: ["--catch-up"], value: "POLICY",
          help: "slots missed while no worker ran: skip (default), latest (the last one), or all[:N] "
            + "(the last N, 1 to 1000; all alone is all:100)"),
        OptionSpec(
          names: ["--jitter"], value: "D",
          help: "run each slot's job up to D late (0 to 1h), the same delay in every process"),
        OptionSpec(
          names: ["--priority"], value: "N", help: "each job's priority; higher runs first (default 0)"),
        OptionSpec(
          names: ["--time-limit"], value: "D",
          help: "each job's time limit per attempt, 1s to 7d (default none)"),
        OptionSpec(
          names: ["--key"], value: "KEY",
          help: "each job's deduplication key: a slot whose job finds a waiting one of the key adds nothing"),
        OptionSpec(
          names: ["--unique"], value: "SCOPE",
          help: "with --key, which jobs of the key count: waiting (default), running (so the schedule "
            + "never runs twice at once), or a duration such as 1h (also completed within it)"),
        OptionSpec(
          names: ["--replace"], value: nil,
          help: "with --key, give a waiting job of the key the new slot's job instead"),
      ],
      details: """
        NAME is 1-128 characters of A-Z a-z 0-9 . _ -, unique in the queue; adding a NAME again
        updates it from its next slot (no slot fires twice; a paused schedule stays paused). Give
        exactly one of --cron and --every. After the schedule's options comes the job, exactly as
        'conveyor add exec' or 'conveyor add http' takes it (see 'conveyor help add'), without
        --delay (each slot is the job's time); --priority, --key, --unique and --replace are options
        of the schedule, e.g.
          conveyor schedule add nightly --cron '0 3 * * *' --time-zone Europe/Berlin exec -- ./backup.sh
          conveyor schedule add ping --every 5m http GET https://example.com/health
        A slot's job is added once, however many workers run, and runs as any job does (retries,
        dead jobs). Prints whether it was created or updated, and the next fire time. Schedules
        cannot carry an ordering key yet: --ordering-key is refused (exit 2), here or in the job.
        """),
    CommandSpec(
      name: "schedule remove", operands: "NAME", summary: "delete a schedule (the jobs it added stay)",
      options: []),
    CommandSpec(
      name: "schedule pause", operands: "NAME",
      summary: "stop a schedule firing; the slots that pass meanwhile are skipped", options: []),
    CommandSpec(
      name: "schedule resume", operands: "NAME", summary: "fire a paused schedule again from its next slot",
      options: []),
    CommandSpec(
      name: "schedules", operands: "",
      summary: "the queue's schedules: spacing, zone, catch-up, state, next and last slot",
      options: [OptionSpec(names: ["--json"], value: nil, help: "one JSON object per schedule")],
      details: """
        STATE is active, paused, or inactive: declared by an application's code, which no longer
        declares it (kept, never fired). NEXT is the next slot of a schedule that fires, in UTC and
        in its time zone; LAST SLOT the latest slot fired or passed over.
        """),
  ]

  /// What `catch-up all` alone fires at most.
  static let defaultCaughtUp = 100

  // MARK: splitting off the job

  /// The job part of `schedule add`'s words: its kind and the words after it.
  struct JobWords {
    var kind: String
    var words: [String]
  }

  /// `schedule add`'s words split at the job kind, the second operand (NAME is the first): the
  /// schedule's words before it, and the job's after it; nil when there is no second operand
  /// before a `--`.
  static func splitJob(_ words: [String]) -> ([String], JobWords?) {
    let options = CLI.spec("schedule add").options
    var index = 0
    var operands = 0
    while index < words.count {
      let word = words[index]
      if word == "--" { break }
      if word.hasPrefix("-"), word.count > 1, Int(word) == nil {
        // An option's value is the next word unless it is inline (`--every=1h`).
        let takesValue = options.first { $0.names.contains(word) }?.value != nil
        index += takesValue ? 2 : 1
        continue
      }
      operands += 1
      if operands == 2 {
        return (Array(words[..<index]), JobWords(kind: word, words: Array(words[(index + 1)...])))
      }
      index += 1
    }
    return (words, nil)
  }

  /// What refuses `--ordering-key` in `schedule add`: a stored schedule has no ordering key for its
  /// slots' jobs, and one dropped silently would let them run out of order.
  static let noOrderingKey =
    "schedules cannot carry an ordering key yet: a slot's job would be added without one, so "
    + "--ordering-key is refused and nothing was stored; add such jobs with conveyor add exec|http "
    + "--ordering-key KEY"

  /// Refuses `--ordering-key` anywhere among `schedule add`'s words before `--`, the schedule's
  /// or the job's: an option's value (`--key --ordering-key`) is skipped, not taken for one.
  static func refuseOrderingKey(_ words: [String]) throws {
    let valued = Set(
      (CLI.spec("schedule add").options + CLI.spec("add http").options + CLI.spec("add exec").options)
        .filter { $0.value != nil }.flatMap(\.names))
    var index = 0
    while index < words.count {
      let word = words[index]
      index += 1
      if word == "--" { return }
      guard word.hasPrefix("-"), word.count > 1 else { continue }
      let name = word.hasPrefix("--") ? String(word.prefix { $0 != "=" }) : word
      if name == "--ordering-key" { throw UsageError(description: noOrderingKey) }
      if valued.contains(name), !word.contains("=") { index += 1 }
    }
  }

  /// `add exec`'s or `add http`'s description without the options of `add` itself, which a
  /// schedule's job does not take.
  static func jobSpec(_ kind: String) -> CommandSpec {
    var spec = CLI.spec("add \(kind)")
    let addOnly = Set(CLI.addOptions.flatMap(\.names))
    spec.options.removeAll { $0.names.contains(where: addOnly.contains) }
    spec.name = "schedule add"
    return spec
  }

  /// Refuses, with what to do instead, an option of the schedule or of `add` among the job's
  /// words (before `--`).
  static func refuseMisplacedOptions(_ words: [String]) throws {
    let scheduleOptions = Set(CLI.spec("schedule add").options.flatMap(\.names))
    let addOnly = Set(CLI.addOptions.flatMap(\.names))
    for word in words {
      if word == "--" { return }
      guard word.hasPrefix("-") else { continue }
      let name = word.hasPrefix("--") ? String(word.prefix { $0 != "=" }) : word
      if scheduleOptions.contains(name) {
        throw UsageError(
          description: "\(name) is an option of the schedule: put it before the job kind, e.g. conveyor "
            + "schedule add NAME --every 1h \(name == "--every" ? "" : "\(name) ... ")exec -- PROGRAM")
      }
      if addOnly.contains(name) {
        throw UsageError(
          description: "\(name) is an option of conveyor add, not of a schedule's job: each slot adds its "
            + "own job when the slot comes (give --priority before the job kind)")
      }
    }
  }

  // MARK: add

  static func add(_ arguments: inout Arguments, job: JobWords?, _ context: CLI.Context) async throws -> Int32
  {
    let name = try arguments.required("schedule name")
    try arguments.finish()
    guard let job else {
      throw UsageError(
        description: "missing the job: end with exec -- PROGRAM [ARGUMENTS...] or http METHOD URL, as "
          + "conveyor add takes them; run 'conveyor schedule add --help'")
    }
    guard job.kind == "exec" || job.kind == "http" else {
      throw UsageError(description: "unknown job kind \"\(printable(job.kind))\": use http or exec")
    }
    try refuseMisplacedOptions(job.words)
    var jobArguments = try Arguments(job.words, for: jobSpec(job.kind))
    if jobArguments.wantsHelp {
      output(CLI.spec("schedule add").help)
      return ExitCode.success.rawValue
    }
    let outbox = job.kind == "http" ? try CLI.httpJob(&jobArguments) : try CLI.execJob(&jobArguments)
    let payload = try CLI.storedPayload(outbox)

    let cron = arguments.option("--cron")
    let every = try arguments.duration("--every")
    guard (cron == nil) != (every == nil) else {
      throw UsageError(
        description: cron == nil
          ? "give --cron EXPR or --every DURATION: when the schedule fires"
          : "give --cron or --every, not both")
    }
    let zone = arguments.option("--time-zone")
    if every != nil, zone != nil {
      throw UsageError(
        description:
          "--time-zone applies to --cron: --every counts its slots from 1970-01-01 UTC, in any zone")
    }
    let catchUp = try catchUpPolicy(arguments.option("--catch-up"))
    let jitter = try arguments.duration("--jitter") ?? .zero
    let priority = try arguments.integer("--priority", in: CLI.priorities) ?? 0
    let timeLimit = try arguments.duration("--time-limit")
    let key = arguments.option("--key")
    let scope = try CLI.uniqueness(arguments)
    let onConflict: DeduplicationConflict = arguments.flag("--replace") ? .replace : .useExisting
    if key == nil, arguments.option("--unique") != nil || arguments.flag("--replace") {
      throw UsageError(
        description: "--unique and --replace need a --key: they say what a slot's job of the key does")
    }
    let definition: ScheduleDefinition
    do {
      let timing =
        if let cron {
          try ScheduleTiming(cron: cron, timeZone: zone ?? "UTC", catchUp: catchUp, jitter: jitter)
        } else {
          try ScheduleTiming(every: every ?? .zero, catchUp: catchUp, jitter: jitter)
        }
      definition = try ScheduleDefinition(
        name: name, timing: timing, payload: payload, priority: priority, timeLimit: timeLimit,
        deduplicationKey: key, deduplicationScope: scope, onConflict: onConflict)
    } catch {
      throw UsageError(description: error.description)
    }

    let queue = try context.controlQueue()
    let summary = try await queue.addSchedule(definition)
    let what =
      !summary.created.isEmpty
      ? "created" : !summary.updated.isEmpty ? "updated" : "unchanged (stored as given)"
    output(
      "schedule \(printable(name)) \(what) in queue \(printable(context.queue)): \(printable(spacing(definition.timing)))"
    )
    let stored = try await queue.schedules().first { $0.name == name }
    if let stored, !stored.fires {
      output(notFiring(stored))
    } else {
      output("next fire \(fireTimes(definition.timing.nextSlot(after: Date()), of: definition.timing))")
    }
    return ExitCode.success.rawValue
  }

  /// A `--catch-up` policy: `skip`, `latest`, `all` (``defaultCaughtUp``) or `all:N`.
  static func catchUpPolicy(_ text: String?) throws -> ScheduleTiming.CatchUp {
    guard let text else { return .skip }
    switch text {
    case "skip": return .skip
    case "latest": return .latest
    case "all": return .all(atMost: defaultCaughtUp)
    default:
      let bound = ScheduleTiming.mostCaughtUp
      guard text.hasPrefix("all:") else {
        throw UsageError(
          description: "--catch-up must be skip, latest, all or all:N, got \"\(printable(text))\"")
      }
      let digits = text.dropFirst(4)
      guard digits.count <= 4, digits.allSatisfy({ $0.isASCII && $0.isNumber }), let count = Int(digits),
        (1...bound).contains(count)
      else {
        throw UsageError(
          description: "--catch-up all:N fires the last N missed slots, N from 1 to \(bound); got "
            + "\"\(printable(text))\"")
      }
      return .all(atMost: count)
    }
  }

  // MARK: remove, pause, resume

  static func change(_ verb: String, _ arguments: inout Arguments, _ context: CLI.Context) async throws
    -> Int32
  {
    let name = try arguments.required("schedule name")
    try arguments.finish()
    try checkName(name)
    let queue = try context.controlQueue()
    let found: Bool
    switch verb {
    case "remove": found = try await queue.removeSchedule(name)
    case "pause": found = try await queue.pauseSchedule(name)
    default: found = try await queue.resumeSchedule(name)
    }
    let shownName = printable(name)
    guard found else {
      printError(
        "conveyor: no schedule \(shownName) in queue \(printable(context.queue)); 'conveyor schedules' lists them"
      )
      return ExitCode.failure.rawValue
    }
    switch verb {
    case "remove":
      output("schedule \(shownName) removed from queue \(printable(context.queue)); the jobs it added stay")
    case "pause":
      output(
        "schedule \(shownName) paused: no slot fires until 'conveyor schedule resume \(shownName)', and the "
          + "slots that pass meanwhile are skipped")
    default:
      let stored = try await queue.schedules().first { $0.name == name }
      if let stored, !stored.fires {
        output("schedule \(shownName) resumed, but \(notFiring(stored))")
      } else {
        let timing = stored?.definition.timing
        output(
          "schedule \(shownName) resumed; next fire "
            + (timing.map { fireTimes($0.nextSlot(after: Date()), of: $0) }
              ?? "unknown: it was removed meanwhile"))
      }
    }
    return ExitCode.success.rawValue
  }

  /// Refuses a name no schedule can have, by the rule ``ScheduleDefinition`` applies.
  static func checkName(_ name: String) throws {
    do {
      _ = try ScheduleDefinition(name: name, timing: try ScheduleTiming(every: .seconds(60)), payload: Data())
    } catch {
      throw UsageError(description: error.description)
    }
  }

  // MARK: schedules

  static func list(_ arguments: inout Arguments, _ context: CLI.Context) async throws -> Int32 {
    let json = arguments.flag("--json")
    try arguments.finish()
    let schedules = try await context.controlQueue().schedules()
    let now = Date()
    if json {
      for schedule in schedules { try printJSON(ListedSchedule(schedule, now: now)) }
      return ExitCode.success.rawValue
    }
    guard !schedules.isEmpty else {
      output(
        "no schedules in queue \(printable(context.queue)); add one with conveyor schedule add "
          + "(see conveyor schedule add --help)")
      return ExitCode.success.rawValue
    }
    let nameWidth = min(34, max(6, schedules.map { printable($0.name).count }.max() ?? 0) + 2)
    let zoneWidth = min(
      34, max(6, schedules.map { printable(zoneName($0.definition.timing)).count }.max() ?? 0) + 2)
    output(
      pad("NAME", nameWidth) + pad("STATE", 10) + pad("NEXT (UTC)", 22) + pad("NEXT (LOCAL)", 27)
        + pad("LAST SLOT (UTC)", 22) + pad("CATCH-UP", 10) + pad("ZONE", zoneWidth) + "SPACING")
    for schedule in schedules {
      let listed = ListedSchedule(schedule, now: now)
      output(
        pad(printable(listed.name), nameWidth) + pad(listed.state, 10) + pad(listed.nextFire ?? "—", 22)
          + pad(printable(listed.nextFireLocal ?? "—"), 27) + pad(listed.lastSlot ?? "—", 22)
          + pad(listed.catchUp, 10) + pad(printable(listed.timeZone), zoneWidth) + printable(listed.spacing))
      output(String(repeating: " ", count: 8) + "job: " + printable(listed.job))
    }
    return ExitCode.success.rawValue
  }

  // MARK: how schedules are shown

  /// `cron EXPR` or `every Ns`.
  static func spacing(_ timing: ScheduleTiming) -> String {
    switch timing.spacing {
    case .cron(let expression): "cron \(expression.text)"
    case .every(let interval): "every \(interval.components.seconds)s"
    }
  }

  /// The catch-up policy as `--catch-up` takes it.
  static func catchUp(_ timing: ScheduleTiming) -> String {
    switch timing.catchUp {
    case .skip: "skip"
    case .latest: "latest"
    case .all(let bound): "all:\(bound)"
    }
  }

  /// `active`, `paused` or `inactive` (declared by code that no longer declares it).
  static func state(_ schedule: StoredSchedule) -> String {
    !schedule.active ? "inactive" : schedule.paused ? "paused" : "active"
  }

  /// Why a stored schedule does not fire, and what to do.
  static func notFiring(_ schedule: StoredSchedule) -> String {
    schedule.active
      ? "it is paused: no slot fires until 'conveyor schedule resume \(printable(schedule.name))'"
      : "it is inactive: the code that declared it no longer does, so it never fires"
  }

  /// `date` in `zone` with its offset, such as `2026-03-01T08:00:00+01:00`.
  static func localTimestamp(_ date: Date, in zone: TimeZone) -> String {
    date.ISO8601Format(Date.ISO8601FormatStyle(timeZoneSeparator: .colon, timeZone: zone))
  }

  /// A slot in the schedule's zone and in UTC.
  static func fireTimes(_ slot: Date?, of timing: ScheduleTiming) -> String {
    guard let slot else { return "none: no slot comes before the year 9999" }
    if zoneName(timing) == "UTC" { return "\(timestamp(slot)) UTC" }
    return
      "\(localTimestamp(slot, in: timing.timeZone)) \(printable(zoneName(timing))) (\(timestamp(slot)) UTC)"
  }

  /// The zone a schedule's wall clock reads: UTC for `--every` (whose zone Foundation may call
  /// GMT), else the name given.
  static func zoneName(_ timing: ScheduleTiming) -> String {
    if case .every = timing.spacing { return "UTC" }
    return timing.timeZoneName
  }
}

/// A schedule as `schedules --json` prints it (and `schedules` shows it).
struct ListedSchedule: Encodable {
  var queue: String
  var name: String
  /// `active`, `paused` or `inactive`.
  var state: String
  var active: Bool
  var paused: Bool
  /// `declared` (by an application's code) or `added` (`schedule add`, `JobQueue.addSchedule`).
  var origin: String
  /// `cron EXPR` or `every Ns`.
  var spacing: String
  var cron: String?
  var everySeconds: Int64?
  var timeZone: String
  /// As `--catch-up` takes it: `skip`, `latest`, `all:N`.
  var catchUp: String
  var jitterMilliseconds: Int64
  var priority: Int
  var timeLimitMilliseconds: Int64?
  /// Each job's deduplication key, and `--unique` as `add` takes it (`waiting`, `running` or a
  /// number of seconds), and whether `--replace` was given; absent without a key.
  var key: String?
  var unique: String?
  var replace: Bool?
  /// The next slot in UTC, for a schedule that fires.
  var nextFire: String?
  /// The next slot in the schedule's zone, with its offset.
  var nextFireLocal: String?
  var lastSlot: String?
  var createdAt: String
  /// What each slot adds, as `list` summarizes a job.
  var job: String

  init(_ schedule: StoredSchedule, now: Date) {
    let timing = schedule.definition.timing
    queue = schedule.queue
    name = schedule.name
    state = ScheduleCommands.state(schedule)
    active = schedule.active
    paused = schedule.paused
    origin = schedule.origin.rawValue
    spacing = ScheduleCommands.spacing(timing)
    switch timing.spacing {
    case .cron(let expression): cron = expression.text
    case .every(let interval): everySeconds = interval.components.seconds
    }
    timeZone = ScheduleCommands.zoneName(timing)
    catchUp = ScheduleCommands.catchUp(timing)
    jitterMilliseconds = JobStoreTime.milliseconds(timing.jitter)
    priority = schedule.definition.priority
    timeLimitMilliseconds = schedule.definition.timeLimit.map(JobStoreTime.milliseconds)
    key = schedule.definition.deduplicationKey
    if key != nil {
      unique =
        switch schedule.definition.deduplicationScope {
        case .waiting: "waiting"
        case .waitingOrRunning: "running"
        case .completedWithin(let period): "\(JobStoreTime.milliseconds(period) / 1_000)s"
        }
      replace = schedule.definition.onConflict == .replace
    }
    let next = schedule.fires ? timing.nextSlot(after: now) : nil
    nextFire = next.map(timestamp)
    nextFireLocal = next.map { ScheduleCommands.localTimestamp($0, in: timing.timeZone) }
    lastSlot = schedule.lastSlot.map(timestamp)
    createdAt = timestamp(schedule.createdAt)
    let payload = schedule.definition.payload
    job = OutboxJob.summary(ofStart: payload, payloadSize: payload.count) ?? "(not an outbox job)"
  }
}
