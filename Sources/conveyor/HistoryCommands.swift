import Conveyor
import Foundation

// `show`, `purge` and the `work` options of the history of finished jobs.

extension CLI {
  /// `show`'s, `purge`'s and `work`'s specs.
  static let historySpecs: [CommandSpec] = [
    CommandSpec(
      name: "show", operands: "ID", summary: "one job: its status, attempts, errors, run time and output",
      options: [OptionSpec(names: ["--json"], value: nil, help: "as one JSON object")]),
    CommandSpec(
      name: "purge", operands: "", summary: "delete finished jobs (dead ones by default)",
      options: [
        OptionSpec(
          names: ["--status"], value: "STATUS", help: "completed, cancelled or dead (default dead)"),
        OptionSpec(
          names: ["--older-than"], value: "D",
          help: "only those finished more than D ago: 90s, 15m, 24h, 7d (default 0s: all)"),
        OptionSpec(names: ["--all"], value: nil, help: "every waiting and dead job instead"),
      ]),
  ]

  /// The `work` options that set the queue's retention.
  static let retentionOptions = [
    OptionSpec(
      names: ["--keep-completed"], value: "D", help: "keep completed jobs D (default 1d; or forever, none)"),
    OptionSpec(
      names: ["--keep-cancelled"], value: "D", help: "keep cancelled jobs D (default 7d; or forever, none)"),
    OptionSpec(names: ["--keep-dead"], value: "D", help: "keep dead jobs D (default 30d; or forever, none)"),
  ]

  /// The retention `work`'s options give: the library's defaults for those not given.
  static func retention(_ arguments: inout Arguments) throws -> JobRetention {
    func period(_ name: String, _ fallback: JobRetention.Period) throws -> JobRetention.Period {
      guard let text = arguments.option(name) else { return fallback }
      switch text {
      case "forever": return .forever
      case "none": return JobRetention.Period.none
      default:
        guard let duration = Arguments.duration(text), duration > .zero else {
          throw UsageError(
            description:
              "\(name) must be a duration above zero (such as 90s, 15m, 24h, 7d), forever or none, "
              + "got \"\(printable(text))\"")
        }
        return .for(duration)
      }
    }
    let defaults = JobRetention.default
    return JobRetention(
      completed: try period("--keep-completed", defaults.completed),
      cancelled: try period("--keep-cancelled", defaults.cancelled),
      dead: try period("--keep-dead", defaults.dead))
  }

  /// Prints one job, whatever its queue, with its history.
  static func show(_ arguments: inout Arguments, _ context: Context) async throws -> Int32 {
    let json = arguments.flag("--json")
    let ids = try jobIDs(&arguments)
    guard ids.count == 1 else { throw UsageError(description: "name one job ID to show") }
    let store = try context.openStore()
    guard let record = try await store.job(ids[0]) else {
      printError("conveyor: no job \(ids[0]) (removed, pruned from the history, or never added)")
      return ExitCode.failure.rawValue
    }
    let listed = JobSummary(cutting: record, to: PayloadPrefix.listedBytes)
    let run = WorkflowRun(payload: record.payload)
    let summary =
      OutboxJob.summary(of: listed)
      ?? run.map { "a run of workflow \"\($0.workflow)\" (\($0.history.count) in its history)" }
      ?? "(undecodable payload)"
    let now = Date()
    let shown = ShownJob(record, summary: summary, run: run, now: now)
    if json {
      try printJSON(shown)
      return ExitCode.success.rawValue
    }
    output("job       \(shown.id)")
    output("queue     \(printable(shown.queue))")
    output(
      "status    \(shown.status)"
        + (record.isHeldByLimit
          ? " (\(limitHeldText(record.limitKey ?? "")): it waits for a running job of its key to stop)"
          : record.isHeld
            ? " (\(heldText(record.orderingKey ?? "")): it waits for the earlier jobs of its key to finish)"
            : ""))
    output("job       \(printable(summary))")
    output("attempts  \(shown.attempts)")
    output("created   \(shown.createdAt)")
    output("run at    \(shown.runAt)")
    if let finished = shown.finishedAt { output("finished  \(finished)") }
    if let ran = record.runDuration { output("ran       \(JobStoreTime.secondsText(ran)) (last attempt)") }
    if let limit = record.timeLimit { output("limit     \(JobStoreTime.secondsText(limit))") }
    if let key = shown.deduplicationKey { output("key       \(printable(key))") }
    if let key = shown.orderingKey { output("ordering key \(printable(key))") }
    if let key = shown.limitKey { output("limit key \(printable(key))") }
    if let key = shown.fairnessKey { output("fairness key \(printable(key))") }
    if let owner = shown.leaseOwner {
      output("lease     \(printable(owner)) until \(shown.leaseExpiresAt ?? "?")")
    }
    if !shown.errors.isEmpty {
      output("errors    (oldest first)")
      for (index, error) in shown.errors.enumerated() { output("  \(index + 1). \(printable(error))") }
    } else if let error = shown.lastError {
      output("last error \(printable(error))")
    }
    if let text = shown.output { output("output    \(printable(text))") }
    if let workflow = shown.workflow {
      output("input     \(printable(workflow.input))")
      output(workflow.history.isEmpty ? "history   (no step taken yet)" : "history   (oldest first)")
      for (index, entry) in workflow.history.enumerated() {
        output("  \(index + 1). \(printable(entry.text))")
      }
    }
    return ExitCode.success.rawValue
  }

  /// Deletes finished jobs of one status, or (`--all`) every waiting and dead job.
  static func purge(_ arguments: inout Arguments, _ context: Context) async throws -> Int32 {
    let all = arguments.flag("--all")
    let statusText = arguments.option("--status")
    let age = try arguments.duration("--older-than")
    try arguments.finish()
    let queue = try context.controlQueue()
    if all {
      guard statusText == nil && age == nil else {
        throw UsageError(description: "use --all alone, or --status and --older-than")
      }
      output("deleted \(try await queue.clear()) job(s)")
      return ExitCode.success.rawValue
    }
    let status = try statusText.map { text -> JobStatus in
      guard let status = JobStatus(rawValue: text), status.isFinished else {
        throw UsageError(
          description:
            "--status must be completed, cancelled or dead, got \"\(printable(text))\" (cancel or clear "
            + "jobs that have not finished)")
      }
      return status
    }
    let purged = status ?? .dead
    let count = try await queue.purge(purged, olderThan: age ?? .zero)
    output("deleted \(count) \(purged.rawValue) job(s)")
    return ExitCode.success.rawValue
  }
}

/// `show --json`'s object.
struct ShownJob: Encodable {
  var id: Int64
  var queue: String
  var status: String
  var job: String
  var attempts: Int
  var priority: Int
  var createdAt: String
  var runAt: String
  var finishedAt: String?
  var runMilliseconds: Int64?
  var timeLimitMilliseconds: Int64?
  var deduplicationKey: String?
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
  var leaseOwner: String?
  var leaseExpiresAt: String?
  var lastError: String?
  var errors: [String]
  /// The output as text (JSON as the handler encoded it); undecodable bytes are replaced.
  var output: String?
  /// For a workflow run: its workflow, input and history.
  var workflow: ShownWorkflow?

  init(_ record: JobRecord, summary: String, run: WorkflowRun? = nil, now: Date = Date()) {
    workflow = run.map { ShownWorkflow($0, now: now) }
    id = record.id.rawValue
    queue = record.queue
    status = record.status.rawValue
    job = summary
    attempts = record.attempts
    priority = record.priority
    createdAt = timestamp(record.createdAt)
    runAt = timestamp(record.runAt)
    finishedAt = record.finishedAt.map(timestamp)
    runMilliseconds = record.runDuration.map(JobStoreTime.milliseconds)
    timeLimitMilliseconds = record.timeLimit.map(JobStoreTime.milliseconds)
    deduplicationKey = record.deduplicationKey
    orderingKey = record.orderingKey
    held = record.isHeld
    limitKey = record.limitKey
    heldByLimit = record.isHeldByLimit
    fairnessKey = record.fairnessKey
    leaseOwner = record.leaseOwner
    leaseExpiresAt = record.leaseExpiresAt.map(timestamp)
    lastError = record.lastError
    errors = record.errors
    output = record.output.map { String(decoding: $0, as: UTF8.self) }
  }
}

/// `show --json`'s `workflow` object: a workflow run's name, input and history, each JSON value
/// as text cut to ``ShownWorkflow/shownBytes``.
struct ShownWorkflow: Encodable {
  /// The most bytes of an input or a step result shown.
  static let shownBytes = 200

  struct Entry: Encodable {
    var kind: String
    var name: String
    var state: String
    var failedAttempts: Int
    var startedAt: String?
    var finishedAt: String?
    var result: String?
    var error: String?
    /// The line `show` prints.
    var text: String {
      let label = "\(kind) \"\(name)\""
      switch state {
      case "completed":
        return
          "\(label) completed (\(failedAttempts + 1) attempt(s)\(finishedAt.map { ", at \($0)" } ?? "")): "
          + (result ?? "")
      case "failed": return "\(label) failed after \(failedAttempts) attempt(s): \(error ?? "")"
      case "retrying":
        return "\(label) retrying, \(failedAttempts) attempt(s) failed, the last: \(error ?? "")"
      default: return "\(label) \(state) until \(finishedAt ?? "?")"
      }
    }
  }

  var name: String
  var input: String
  var history: [Entry]

  init(_ run: WorkflowRun, now: Date) {
    name = Self.cut(run.workflow)
    input = Self.text(run.input)
    history = run.history.map { event in
      Entry(
        kind: event.kind.rawValue, name: Self.cut(event.name), state: event.state(at: now),
        failedAttempts: event.failedAttempts, startedAt: event.startedAt.map(timestamp),
        finishedAt: event.finishedAt.map(timestamp), result: event.result.map(Self.text),
        error: event.error.map(JobHistory.bounded))
    }
  }

  /// JSON bytes as text, cut to ``shownBytes`` with "…" after a cut.
  static func text(_ data: Data) -> String {
    guard data.count > shownBytes else { return String(decoding: data, as: UTF8.self) }
    return String(decoding: data.prefix(shownBytes), as: UTF8.self) + "…"
  }

  /// A name cut to ``shownBytes``.
  static func cut(_ name: String) -> String { text(Data(name.utf8)) }
}
