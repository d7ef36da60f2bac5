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
        Prints the limits stored with the queue, e.g. "concurrency 3 (2 running), rate 10/s
        (bursts of 5)", or "no limits", then the limit per key and the keys with their own limit
        (the first 20; --json lists them all). Change them with 'conveyor limits set'.
        """),
    CommandSpec(
      name: "limits set",
      operands:
        "[--concurrency N|none] [--rate N/s|N/min|N/h|none [--burst B]] [--key-concurrency N|none] "
        + "[--key-rate N/s|none [--key-burst B]] [--key K [--concurrency N|none] [--rate N/s|none [--burst B]]]",
      summary: "store the queue's limits, obeyed by every worker of every process",
      options: [
        OptionSpec(
          names: ["--concurrency"], value: "N",
          help: "at most N of the queue's jobs running at once, across every worker (1 to "
            + "\(QueueLimits.maximumConcurrency)); none removes the limit"),
        OptionSpec(
          names: ["--rate"], value: "N/s",
          help: "at most N of the queue's jobs start a second (or N/min, N/h), across every worker; "
            + "from one a day to \(Int(RateLimit.maximumPerSecond))/s; none removes the rate"),
        OptionSpec(
          names: ["--burst"], value: "B",
          help: "at most B start at once after a quiet spell (1 to \(RateLimit.maximumBurst); default 1: "
            + "starts evenly spaced)"),
        OptionSpec(
          names: ["--key-concurrency"], value: "N",
          help: "at most N jobs of any one --limit-key running at once, across every worker; none removes it"),
        OptionSpec(
          names: ["--key-rate"], value: "N/s",
          help: "at most N jobs of any one --limit-key start a second (or N/min, N/h), across every "
            + "worker, each key with a bucket of its own; none removes it"),
        OptionSpec(
          names: ["--key-burst"], value: "B",
          help: "the burst of the rate per key (1 to \(RateLimit.maximumBurst); default 1)"),
        OptionSpec(
          names: ["--key"], value: "K",
          help: "the options --concurrency, --rate and --burst then set key K's own limits, in place of "
            + "--key-concurrency and --key-rate; none gives K the limit per key again"),
        OptionSpec(names: ["--json"], value: nil, help: "print what was stored as one JSON object"),
      ],
      details: """
        The limits are kept in the database beside the queue's jobs, so every 'conveyor work' of the
        queue, on this machine or another sharing the database, obeys them from its next claim,
        however many --concurrency each runs. A limit not named keeps its stored value:
        'limits set --rate 10/s' keeps the concurrency limit, and --burst alone changes the burst
        of the stored rate. Lowering the concurrency below the number running stops nothing: no
        job is claimed until fewer than the limit run. The rate counts starts (claims, retries
        included): a retried job starts again. Pause the queue to stop claims altogether (a limit
        of 0 is refused). A value that cannot be stored exits 2 and changes nothing. Prints the
        limits as stored.

        A job added with --limit-key K ('add http' takes the URL's host) counts against K's limit:
        its own (--key K --concurrency N) or else the limit per key (--key-concurrency N). When
        K's running jobs reach it, a claim holds K's other jobs it reaches (status counts them as
        held) until one of K's jobs stops running; other keys run meanwhile. Likewise K's rate (its
        own, --key K --rate R, or else --key-rate R): when K's bucket gives no start, a claim holds
        K's jobs it reaches until the bucket gives the next. Setting limits again makes every held
        job claimable (the next claims hold those still over their key's limits).
        """),
  ]

  /// `limits --json`'s and `limits set --json`'s object. `concurrency`, `rate`, `keyConcurrency`
  /// and `keyRate` are null when there is no such limit; a rate is
  /// `{"perSecond": N, "burst": B}`; `keyConcurrencyOverrides` and `keyRateOverrides` map each key
  /// with its own limit to it (`{}` when none).
  struct Shown: Encodable {
    var queue: String
    var concurrency: Int?
    var rate: RateLimit?
    var running: Int
    var ready: Int
    var keyConcurrency: Int?
    var keyConcurrencyOverrides: [String: Int]
    var keyRate: RateLimit?
    var keyRateOverrides: [String: RateLimit]

    func encode(to encoder: any Encoder) throws {
      var container = encoder.container(keyedBy: CodingKeys.self)
      try container.encode(queue, forKey: .queue)
      // Written even when nil: a reader sees `"concurrency": null`, not a missing member.
      try container.encode(concurrency, forKey: .concurrency)
      try container.encode(rate, forKey: .rate)
      try container.encode(running, forKey: .running)
      try container.encode(ready, forKey: .ready)
      try container.encode(keyConcurrency, forKey: .keyConcurrency)
      try container.encode(keyConcurrencyOverrides, forKey: .keyConcurrencyOverrides)
      try container.encode(keyRate, forKey: .keyRate)
      try container.encode(keyRateOverrides, forKey: .keyRateOverrides)
    }

    enum CodingKeys: String, CodingKey {
      case queue, concurrency, rate, running, ready, keyConcurrency, keyConcurrencyOverrides, keyRate
      case keyRateOverrides
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
    let concurrencyText = arguments.option("--concurrency")
    let rateText = arguments.option("--rate")
    let burstText = arguments.option("--burst")
    let keyConcurrencyText = arguments.option("--key-concurrency")
    let keyRateText = arguments.option("--key-rate")
    let keyBurstText = arguments.option("--key-burst")
    let key = arguments.option("--key")
    guard
      [concurrencyText, rateText, burstText, keyConcurrencyText, keyRateText, keyBurstText, key]
        .contains(where: { $0 != nil })
    else {
      throw UsageError(
        description:
          "limits set needs a limit: --concurrency N (1 to \(QueueLimits.maximumConcurrency)) or none, "
          + "--rate N/s (or N/min, N/h) or none, --burst B, --key-concurrency N or none, --key-rate N/s or "
          + "none, --key-burst B, or --key K with --concurrency, --rate or --burst")
    }
    try arguments.finish()
    // Every value is checked before the store is opened: a bad one changes nothing.
    if let key {
      if let problem = LimitKey.problem(key) {
        throw UsageError(description: "--key: \(problem); the stored limits were not changed")
      }
      guard concurrencyText != nil || rateText != nil || burstText != nil else {
        throw UsageError(
          description:
            "--key K takes --concurrency N or none (the key's own limit of jobs running at once), --rate "
            + "N/s or none, or --burst B (the key's own rate); the stored limits were not changed")
      }
    }
    let newKeyConcurrency = try keyConcurrencyText.map { try concurrency($0, option: "--key-concurrency") }
    let newConcurrency = try concurrencyText.map { try concurrency($0) }
    let newRate = try rateText.map { try rate($0) }
    let newBurst = try burstText.map { try burst($0) }
    let newKeyRate = try keyRateText.map { try rate($0, option: "--key-rate") }
    let newKeyBurst = try keyBurstText.map { try burst($0, option: "--key-burst") }
    for (rate, burst, names) in [
      (newRate, newBurst, ("--burst", "--rate")), (newKeyRate, newKeyBurst, ("--key-burst", "--key-rate")),
    ] {
      if case .some(nil) = rate, burst != nil {
        throw UsageError(
          description:
            "\(names.0) goes with a rate, not with \(names.1) none; the stored limits were not changed")
      }
    }
    let queue = try context.controlQueue()
    var limits = try await queue.limits()
    /// The rate `old` changed by `rate` (nil: unchanged; .some(nil): removed) and `burst`.
    func changed(_ old: RateLimit?, rate: Double??, burst: Int?, option: String, what: String) throws
      -> RateLimit?
    {
      var new = old
      if let rate { new = rate.map { RateLimit(perSecond: $0, burst: old?.burst ?? 1) } }
      if let burst {
        guard new != nil else {
          throw UsageError(
            description:
              "\(option) needs a rate: \(what) has none stored; pass the rate with it; the stored limits "
              + "were not changed")
        }
        new?.burst = burst
      }
      return new
    }
    if let key {
      if let newConcurrency {
        try refuseOtherSpelling(of: key, in: limits.keyConcurrencyOverrides)
        limits.keyConcurrencyOverrides[key] = newConcurrency
      }
      if newRate != nil || newBurst != nil {
        try refuseOtherSpelling(of: key, in: limits.keyRateOverrides)
        limits.keyRateOverrides[key] = try changed(
          limits.keyRateOverrides[key], rate: newRate, burst: newBurst, option: "--burst",
          what: "key \"\(printable(key))\"")
      }
    } else {
      if let newConcurrency { limits.concurrency = newConcurrency }
      limits.rate = try changed(
        limits.rate, rate: newRate, burst: newBurst, option: "--burst", what: "the queue")
    }
    if let newKeyConcurrency { limits.keyConcurrency = newKeyConcurrency }
    limits.keyRate = try changed(
      limits.keyRate, rate: newKeyRate, burst: newKeyBurst, option: "--key-burst", what: "the rate per key")
    try await queue.setLimits(limits)
    try await report(try await queue.limits(), queue: queue, context, json: json)
    return ExitCode.success.rawValue
  }

  /// Refuses `--key K` when the stored limits have a key that a Swift dictionary takes for K but
  /// whose bytes differ (a canonically equivalent spelling, such as a decomposed "é" for a
  /// precomposed one): the stores keep the two apart, and ``QueueLimits`` can hold only one of
  /// them, so changing K would change or remove the other.
  static func refuseOtherSpelling<Value>(of key: String, in overrides: [String: Value]) throws {
    guard let index = overrides.index(forKey: key), !overrides[index].key.utf8.elementsEqual(key.utf8) else {
      return
    }
    throw UsageError(
      description:
        "--key \"\(printable(key))\": the queue has limits of key \"\(printable(overrides[index].key))\", "
        + "another spelling of the same text (its bytes differ), and a key's limits can be set for only one "
        + "of them; remove that key's limits first (--key with its exact bytes and none); the stored limits "
        + "were not changed")
  }

  /// A `--concurrency` value: `none` (nil) or a whole number from 1 to
  /// ``QueueLimits/maximumConcurrency``; anything else is a usage error naming what to pass.
  static func concurrency(_ text: String, option: String = "--concurrency") throws -> Int? {
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
        "\(option) must be a whole number from 1 to \(QueueLimits.maximumConcurrency), or none to "
        + "remove the limit, got \"\(printable(text))\"\(hint); the stored limits were not changed")
  }

  /// A `--rate` value: `none` (nil), or a positive decimal number of ASCII digits (a fraction
  /// allowed) followed by `/s`, `/min` or `/h`, from ``RateLimit/minimumPerSecond`` to
  /// ``RateLimit/maximumPerSecond`` a second; anything else is a usage error naming what to pass.
  static func rate(_ text: String, option: String = "--rate") throws -> Double? {
    if text == "none" { return nil }
    let units: [(suffix: String, seconds: Double)] = [("/s", 1), ("/min", 60), ("/h", 3_600)]
    if text.utf8.count <= 32, let unit = units.first(where: { text.hasSuffix($0.suffix) }) {
      let number = text.dropLast(unit.suffix.count)
      let parts = number.split(separator: ".", omittingEmptySubsequences: false)
      let plain =
        (1...2).contains(parts.count) && !parts[0].isEmpty && parts.last?.isEmpty == false
        && parts.allSatisfy { $0.allSatisfy { $0.isASCII && $0.isNumber } }
      if plain, let value = Double(number) {
        let perSecond = value / unit.seconds
        if RateLimit(perSecond: perSecond).problem == nil { return perSecond }
      }
    }
    let hint =
      text.hasPrefix("0") || text.hasPrefix("-") ? "; to stop claims altogether, pause the queue" : ""
    throw UsageError(
      description:
        "\(option) must be a number of starts per second, minute or hour, such as 10/s, 0.5/s, 30/min or "
        + "2/h, from one a day to \(Int(RateLimit.maximumPerSecond))/s, or none to remove the rate, got "
        + "\"\(printable(text))\"\(hint); the stored limits were not changed")
  }

  /// A `--burst` value: a whole number from 1 to ``RateLimit/maximumBurst``.
  static func burst(_ text: String, option: String = "--burst") throws -> Int {
    let digits = text.hasPrefix("+") ? text.dropFirst() : Substring(text)
    if !digits.isEmpty, digits.count <= 7, digits.allSatisfy({ $0.isASCII && $0.isNumber }),
      let value = Int(digits), (1...RateLimit.maximumBurst).contains(value)
    {
      return value
    }
    throw UsageError(
      description:
        "\(option) must be a whole number from 1 to \(RateLimit.maximumBurst), got \"\(printable(text))\"; "
        + "the stored limits were not changed")
  }

  /// Prints `limits` as `limits` shows them, with the queue's running and ready jobs.
  private static func report(
    _ limits: QueueLimits, queue: JobQueue<OutboxJob>, _ context: CLI.Context, json: Bool
  ) async throws {
    let counts = try await queue.count()
    if json {
      try printJSON(
        Shown(
          queue: context.queue, concurrency: limits.concurrency, rate: limits.rate, running: counts.running,
          ready: counts.ready, keyConcurrency: limits.keyConcurrency,
          keyConcurrencyOverrides: limits.keyConcurrencyOverrides, keyRate: limits.keyRate,
          keyRateOverrides: limits.keyRateOverrides))
      return
    }
    let name = printable(context.queue)
    let rate = limits.rate.map { ", rate \($0.description)" } ?? ""
    if let concurrency = limits.concurrency {
      output("queue \(name): concurrency \(concurrency) (\(counts.running) running)\(rate)")
    } else if limits.rate != nil || limits.hasKeyLimits {
      output("queue \(name): no concurrency limit (\(counts.running) running)\(rate)")
    } else {
      output("queue \(name): no limits (\(counts.running) running)")
    }
    for line in keyLimitLines(limits) { output(line) }
    if let reason = reachedText(limits, counts) { output(reason) }
    let store = try context.openStore()
    if let wait = try await rateWait(limits, counts, store: store, queue: context.queue) {
      output(rateReachedText(limits, counts, wait: wait))
    }
    if let concurrency = limits.concurrency, counts.running > concurrency {
      output(
        "\(counts.running) running is more than the limit: none is stopped, and no job is claimed "
          + "until fewer than \(concurrency) run")
    }
  }

  /// The lines `limits` shows for the limits per key: the limit and rate per key, then the keys
  /// with their own (in byte order, the first 20, then how many more).
  static func keyLimitLines(_ limits: QueueLimits) -> [String] {
    guard limits.hasKeyLimits else { return [] }
    var lines: [String] = []
    if let perKey = limits.keyConcurrency {
      lines.append("limit per key: \(perKey) running at once for each --limit-key")
    }
    if let rate = limits.keyRate {
      lines.append("rate per key: at most \(rate) starting for each --limit-key")
    }
    if lines.isEmpty { lines.append("no limit per key (only the keys below are limited)") }
    let shown = 20
    let keys = ownLimitKeys(limits)
    for key in keys.prefix(shown) {
      let parts = [
        QueueLimits.own(limits.keyConcurrencyOverrides, key).map { "\($0) running at once" },
        QueueLimits.own(limits.keyRateOverrides, key).map { "at most \($0) starting" },
      ].compactMap { $0 }
      lines.append("key \(printable(key)): \(parts.joined(separator: ", "))")
    }
    if keys.count > shown {
      lines.append("and \(keys.count - shown) more keys with their own limit (--json lists them)")
    }
    return lines
  }

  /// The keys with a limit or a rate of their own, in byte order.
  static func ownLimitKeys(_ limits: QueueLimits) -> [String] {
    var seen = Set<[UInt8]>()
    return (Array(limits.keyConcurrencyOverrides.keys) + Array(limits.keyRateOverrides.keys))
      .filter { seen.insert(Array($0.utf8)).inserted }
      .sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) }
  }

  /// A limit key with a limit: how many of its jobs run and how many its limits hold.
  struct KeyUsage: Encodable {
    var key: String
    /// The key's concurrency limit (its own, else the limit per key); nil for none.
    var limit: Int?
    /// The key's rate (its own, else the rate per key); nil for none.
    var rate: RateLimit?
    var running: Int
    var held: Int

    private enum CodingKeys: String, CodingKey { case key, limit, rate, running, held }

    /// Writes `limit` and `rate` as `null` when there is none, so every row has every field.
    func encode(to encoder: any Encoder) throws {
      var container = encoder.container(keyedBy: CodingKeys.self)
      try container.encode(key, forKey: .key)
      try container.encode(limit, forKey: .limit)
      try container.encode(rate, forKey: .rate)
      try container.encode(running, forKey: .running)
      try container.encode(held, forKey: .held)
    }
  }

  /// The most keys `status` reads from the store (`--json` lists them; the text the first five).
  static let listedKeys = 1_000

  /// The keys with a limit and their use, from the store's counts (``JobStore/limitKeyUsage``;
  /// see `QueueLimits.keysWithLimits`): at most ``listedKeys`` (`complete` false when there were
  /// more).
  static func keyUsage(_ store: any JobStore, queue: String, limits: QueueLimits) async throws -> (
    keys: [KeyUsage], complete: Bool
  ) {
    let read = try await store.limitKeyUsage(queue: queue, limit: listedKeys + 1)
    let listed = limits.keysWithLimits(read, listing: listedKeys)
    return (
      listed.keys.map {
        KeyUsage(
          key: $0.usage.key, limit: $0.limit, rate: $0.rate, running: $0.usage.running, held: $0.usage.held)
      },
      listed.complete
    )
  }

  /// The lines `status` shows for the keys with a limit (the first five), and how many more.
  static func keyUsageLines(_ usage: (keys: [KeyUsage], complete: Bool)) -> [String] {
    var lines = usage.keys.prefix(5).map {
      "\"\(printable($0.key))\": \($0.running) running" + ($0.limit.map { " of \($0)" } ?? "")
        + ($0.rate.map { ", at most \($0.description) starting" } ?? "")
        + ($0.held > 0 ? ", \($0.held) held" : "")
    }
    if usage.keys.count > 5 || !usage.complete {
      lines.append(
        "and \(usage.complete ? "\(usage.keys.count - 5)" : "more than \(usage.keys.count - 5)") more keys "
          + "(conveyor status --json lists \(usage.complete ? "them" : "the first \(listedKeys)"))")
    }
    return lines
  }

  /// What `status` says of the keys whose limits hold jobs (the first five), each with what holds
  /// them: `limit of key "K" reached` while its running jobs fill its concurrency limit, else
  /// `rate of "K"` when it has a rate (the jobs wait for their starts); nil when no key holds any.
  static func keyUsageText(_ usage: (keys: [KeyUsage], complete: Bool)) -> String? {
    let holding = usage.keys.filter { $0.held > 0 }
    guard !holding.isEmpty else { return nil }
    let shown = holding.prefix(5).map { key in
      let full = key.limit.map { key.running >= $0 } ?? false
      if !full, let rate = key.rate {
        return "rate of \"\(printable(key.key))\" (at most \(rate.description) starting, \(key.held) held)"
      }
      return "limit of key \"\(printable(key.key))\" reached (\(key.running) running, \(key.held) held)"
    }
    // The keys read stop at ``listedKeys``: past them, how many more hold jobs is unknown.
    let extra = max(0, holding.count - 5)
    let more =
      !usage.complete
      ? (extra > 0 ? "; and more than \(extra) more keys" : "; and perhaps more keys")
      : extra > 0 ? "; and \(extra) more keys" : ""
    return shown.joined(separator: "; ") + more
  }

  /// How long until the rate gives its next start, when that is what keeps ready jobs waiting:
  /// the queue has a rate and ready jobs, and its next wake is later than now (ready jobs are due,
  /// so only an empty bucket puts it later). Nil otherwise, and while the concurrency limit is
  /// reached (the store then gives no run date at all).
  static func rateWait(_ limits: QueueLimits, _ counts: JobCounts, store: any JobStore, queue: String)
    async throws -> Duration?
  {
    guard limits.rate != nil, counts.ready > 0 else { return nil }
    let clock = SystemJobClock()
    guard let run = try await store.nextWake(queue: queue, clock: clock).nextRun else { return nil }
    let seconds = run.timeIntervalSince(clock.now())
    return seconds > 0.001 ? .milliseconds(Int64((seconds * 1000).rounded(.up))) : nil
  }

  /// What `status` and `limits` say when the rate keeps ready jobs waiting for `wait`.
  static func rateReachedText(_ limits: QueueLimits, _ counts: JobCounts, wait: Duration) -> String {
    // Between none and a million hours: a clock stepped back gives a negative wait, and the
    // conversions below trap past `Int`'s range.
    let seconds = min(
      max(0, Double(wait.components.seconds) + Double(wait.components.attoseconds) / 1e18), 3_600e6)
    let shown =
      seconds < 60
      ? String(format: "%.1f s", seconds)
      : seconds < 3_600
        ? "\(Int(seconds / 60)) min \(Int(seconds) % 60) s"
        : "\(Int(seconds / 3_600)) h \(Int(seconds) % 3_600 / 60) min"
    let rate = limits.rate.map(\.description) ?? "?"
    return "rate limit of \(rate) reached: \(counts.ready) ready job\(counts.ready == 1 ? "" : "s") "
      + "wait\(counts.ready == 1 ? "s" : "") for the next start, in \(shown)"
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
