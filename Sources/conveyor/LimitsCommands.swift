import Conveyor
import Foundation

/// `conveyor limits` and `conveyor limits set`: the queue's stored ``QueueLimits``, which every
/// worker of every process sharing the database obeys.
enum LimitsCommands {
  static let specs = [
    CommandSpec(
      name: "limits", operands: "",
      summary: "the queue's stored limits, and how many of its jobs run now",
      options: [OptionSpec(names: ["--json"], value: nil, help: "as one JSON object")],
      details: """
        Prints the limits stored with the queue, e.g. "concurrency 3 (2 running)", or "no limits".
        Change them with 'conveyor limits set'.
        """),
    CommandSpec(
      name: "limits set", operands: "--concurrency N|none",
      summary: "store the queue's limits, obeyed by every worker of every process",
      options: [
        OptionSpec(
          names: ["--concurrency"], value: "N",
          help: "at most N of the queue's jobs running at once, across every worker (1 to "
            + "\(QueueLimits.maximumConcurrency)); none removes the limit"),
        OptionSpec(names: ["--json"], value: nil, help: "print what was stored as one JSON object"),
      ],
      details: """
        The limit is kept in the database beside the queue's jobs, so every 'conveyor work' of the
        queue, on this machine or another sharing the database, obeys it from its next claim,
        however many --concurrency each runs. Lowering it below the number running stops nothing:
        no job is claimed until fewer than the limit run. Pause the queue to stop claims altogether
        (a limit of 0 is refused). A value that cannot be stored exits 2 and changes nothing.
        Prints the limits as stored.
        """),
  ]

  /// `limits --json`'s and `limits set --json`'s object. `concurrency` is null when there is no
  /// limit.
  struct Shown: Encodable {
    var queue: String
    var concurrency: Int?
    var running: Int
    var ready: Int

    func encode(to encoder: any Encoder) throws {
      var container = encoder.container(keyedBy: CodingKeys.self)
      try container.encode(queue, forKey: .queue)
      // Written even when nil: a reader sees `"concurrency": null`, not a missing member.
      try container.encode(concurrency, forKey: .concurrency)
      try container.encode(running, forKey: .running)
      try container.encode(ready, forKey: .ready)
    }

    enum CodingKeys: String, CodingKey {
      case queue, concurrency, running, ready
    }
  }

  /// `limits`: prints the stored limits.
  static func show(_ arguments: inout Arguments, _ context: CLI.Context) async throws -> Int32 {
    let json = arguments.flag("--json")
    try arguments.finish()
    let queue = try context.controlQueue()
    try await report(try await queue.limits(), queue: queue, context, json: json)
    return ExitCode.success.rawValue
  }

  /// `limits set`: stores the limits the options give, then prints them as stored.
  static func set(_ arguments: inout Arguments, _ context: CLI.Context) async throws -> Int32 {
    let json = arguments.flag("--json")
    guard let text = arguments.option("--concurrency") else {
      throw UsageError(
        description:
          "limits set needs a limit: --concurrency N (1 to \(QueueLimits.maximumConcurrency)), "
          + "or --concurrency none to remove it")
    }
    try arguments.finish()
    let limits = QueueLimits(concurrency: try concurrency(text))
    let queue = try context.controlQueue()
    try await queue.setLimits(limits)
    try await report(try await queue.limits(), queue: queue, context, json: json)
    return ExitCode.success.rawValue
  }

  /// A `--concurrency` value: `none` (nil) or a whole number from 1 to
  /// ``QueueLimits/maximumConcurrency``; anything else is a usage error naming what to pass.
  static func concurrency(_ text: String) throws -> Int? {
    if text == "none" { return nil }
    let range = 1...QueueLimits.maximumConcurrency
    // ASCII digits only, at most 7 of them after an optional "+" (so no overflow, no spaces,
    // no other scripts' digits): `Int` alone would take "+3" but not " 3".
    let digits = text.hasPrefix("+") ? text.dropFirst() : Substring(text)
    if !digits.isEmpty, digits.count <= 7, digits.allSatisfy({ $0.isASCII && $0.isNumber }),
      let value = Int(digits), range.contains(value)
    {
      return value
    }
    let hint =
      text == "0" || (Int(text).map { $0 <= 0 } ?? false)
      ? "; to stop claims altogether, pause the queue (conveyor pause)" : ""
    throw UsageError(
      description:
        "--concurrency must be a whole number from 1 to \(QueueLimits.maximumConcurrency), or none to "
        + "remove the limit, got \"\(printable(text))\"\(hint); the stored limits were not changed")
  }

  /// Prints `limits` as `limits` shows them, with the queue's running and ready jobs.
  private static func report(
    _ limits: QueueLimits, queue: JobQueue<OutboxJob>, _ context: CLI.Context, json: Bool
  ) async throws {
    let counts = try await queue.count()
    if json {
      try printJSON(
        Shown(
          queue: context.queue, concurrency: limits.concurrency, running: counts.running,
          ready: counts.ready))
      return
    }
    let name = printable(context.queue)
    if let concurrency = limits.concurrency {
      output("queue \(name): concurrency \(concurrency) (\(counts.running) running)")
    } else {
      output("queue \(name): no limits (\(counts.running) running)")
    }
    if let reason = reachedText(limits, counts) { output(reason) }
    if let concurrency = limits.concurrency, counts.running > concurrency {
      output(
        "\(counts.running) running is more than the limit: none is stopped, and no job is claimed "
          + "until fewer than \(concurrency) run")
    }
  }

  /// What `status` and `limits` say when the concurrency limit keeps ready jobs waiting; nil
  /// when it does not.
  static func reachedText(_ limits: QueueLimits, _ counts: JobCounts) -> String? {
    guard let concurrency = limits.concurrency, counts.running >= concurrency, counts.ready > 0 else {
      return nil
    }
    return
      "concurrency limit of \(concurrency) reached: \(counts.ready) ready job\(counts.ready == 1 ? "" : "s") "
      + "wait\(counts.ready == 1 ? "s" : "") for a place"
  }
}
