import Conveyor
import Foundation

/// What each page reads from the store. None reads the whole table:
/// - Queues (`/`, `/api/queues`, `/api/activity`, `/metrics`): `activity(since:limit:)` for the
///   last hour (a range of the activity table's minute index: one row per queue and minute),
///   `queueNames()` (the `queues` table and one index seek per status and queue), then per queue
///   `counts` (a count over each status's partial index: about 0.15 s per million jobs of that
///   queue), `isPaused` and `limits` (one primary-key row each) and `oldestReadyRunDate` (one seek of the ready
///   index per priority level, one of the scheduled index).
/// - Jobs (`/jobs`): `jobs(queue:status:after:limit:)` pages in ID order from `after`: running and
///   dead jobs from their partial indexes, completed and cancelled ones in finishing order from
///   theirs; waiting ones (SQLite) from a window of 256 rows of the
///   table in ID order, then from the queue's ready, scheduled and held indexes. The text filter and the ready/scheduled/held split are applied to what was read,
///   at most ``Dashboard/readLimit`` jobs per page; "Next" continues after the last job read.
/// - A job (`/jobs/ID`): `jobSummary` (one primary-key lookup, at most 256 KiB of payload), then,
///   for a job that ran or finished, `job(_:)` for its history (its attempts' errors and output,
///   which summaries leave out).
/// - The queue's counts above its job list, as on the queues page.
/// - Bulk confirmation and actions: `counts`, then `requeueDead(nil)` (the dead index) or
///   `clear` (one status's partial index).
extension Dashboard {
  /// A queue's row on the queues page.
  struct QueueSummary: Encodable {
    var name: String
    /// The name percent-encoded (``HTTPForm/encode(_:)``): ASCII, so an HTML attribute holds it
    /// unchanged, where a browser changes a name's CR to LF and its NUL to U+FFFD. The page's
    /// script matches rows to the JSON by it.
    var key: String
    var ready: Int
    var scheduled: Int
    /// Waiting jobs held behind an earlier job of their ordering key (``JobCounts/held``).
    var held: Int
    var running: Int
    var dead: Int
    /// Completed jobs kept as history.
    var completed: Int
    /// Cancelled jobs kept as history.
    var cancelled: Int
    var paused: Bool
    /// The stored concurrency limit (``QueueLimits/concurrency``); `null` in the JSON when the
    /// queue has none.
    @NullWhenAbsent var concurrency: Int?
    /// The stored rate limit (``QueueLimits/rate``: `perSecond` and `burst`); `null` in the JSON
    /// when the queue has none.
    @NullWhenAbsent var rate: RateLimit?
    /// Seconds since the oldest ready job's run date; nil when none is ready (or the store cannot
    /// tell).
    var oldestReadyAge: Double?
    /// ``oldestReadyAge`` as the page shows it.
    var oldest: String
  }

  /// The most activity rows one page reads: an hour of minutes for up to 1,000 queues.
  static let activityLimit = DashboardCharts.minutes * 1_000

  /// Each queue's activity of the last hour (one range of the activity table's minute index),
  /// without minutes after the current one (workers key minutes by their own clocks): the hour
  /// the charts draw, which `/metrics` sums too.
  /// Keyed by the queue's bytes, as the stores keep queues apart: canonically equivalent names
  /// (a precomposed and a decomposed "é") are two queues.
  func recentActivity(now: Date) async throws -> [ExactText: [QueueActivity]] {
    let rows = try await store.activity(since: DashboardCharts.start(now), limit: Self.activityLimit)
    return Dictionary(grouping: DashboardCharts.lastHour(rows, now: now)) { ExactText($0.queue) }
  }

  /// Every queue with jobs, a pause flag, a limit or activity in the last hour, with its counts.
  func summaries(activity: [ExactText: [QueueActivity]]) async throws -> [QueueSummary] {
    var summaries: [QueueSummary] = []
    let now = clock.now()
    // By bytes, in byte order, as the stores list them (a `Set` of `String`s merged canonically
    // equivalent names, and one of the two queues vanished from the page and `/metrics`).
    let names = Set(try await store.queueNames().map(ExactText.init)).union(activity.keys).sorted()
    for name in names.map(\.text) {
      let counts = try await store.counts(queue: name, clock: clock)
      let paused = try await store.isPaused(queue: name)
      let limits = try await store.limits(queue: name)
      let age = try await store.oldestReadyRunDate(queue: name, clock: clock).map {
        max(0, now.timeIntervalSince($0))
      }
      summaries.append(
        QueueSummary(
          name: name, key: HTTPForm.encode(name), ready: counts.ready, scheduled: counts.scheduled,
          held: counts.held, running: counts.running,
          dead: counts.dead, completed: counts.completed, cancelled: counts.cancelled, paused: paused,
          concurrency: limits.concurrency, rate: limits.rate, oldestReadyAge: age,
          oldest: age.map { DashboardCharts.duration(milliseconds: $0 * 1000) } ?? "—"))
    }
    return summaries
  }

  func queuesPage(notice: String?) async throws -> DashboardResponse {
    let now = Date()
    let activity = try await recentActivity(now: now)
    let summaries = try await summaries(activity: activity)
    return pages.queues(
      summaries, activity: activity, now: now, notice: notice, formToken: formToken,
      database: configuration.storeDescription)
  }

  /// The "Last hour" section alone, for the script to swap in.
  func activityFragment() async throws -> DashboardResponse {
    let now = Date()
    let activity = try await recentActivity(now: now)
    let names = try await summaries(activity: activity).map(\.name)
    return .text(
      200, DashboardCharts.section(queues: names, activity: activity, now: now),
      contentType: "text/html; charset=utf-8")
  }

  func queuesJSON() async throws -> DashboardResponse {
    struct Body: Encodable {
      var queues: [QueueSummary]
      var time: String
    }
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.sortedKeys]
    let activity = try await recentActivity(now: Date())
    let body = try encoder.encode(
      Body(queues: try await summaries(activity: activity), time: timestamp(Date())))
    return DashboardResponse(status: 200, headers: [("Content-Type", "application/json")], body: body)
  }

  /// Prometheus text format 0.0.4: jobs by queue and state, the pause flag, the stored limits,
  /// the oldest ready job's age and the last hour's activity.
  func metrics() async throws -> DashboardResponse {
    let activity = try await recentActivity(now: Date())
    let summaries = try await summaries(activity: activity)
    var lines = [
      "# HELP conveyor_jobs Jobs stored, by queue and state.",
      "# TYPE conveyor_jobs gauge",
    ]
    for queue in summaries {
      let label = Self.prometheusLabel(queue.name)
      for (state, value) in [
        ("ready", queue.ready), ("scheduled", queue.scheduled), ("held", queue.held),
        ("running", queue.running), ("dead", queue.dead), ("completed", queue.completed),
        ("cancelled", queue.cancelled),
      ] {
        lines.append("conveyor_jobs{queue=\"\(label)\",state=\"\(state)\"} \(value)")
      }
    }
    /// A gauge of one sample per queue that has a value (none for the others).
    func gauge(_ name: String, _ help: String, _ value: (QueueSummary) -> String?) {
      lines += ["# HELP \(name) \(help)", "# TYPE \(name) gauge"]
      for queue in summaries {
        guard let value = value(queue) else { continue }
        lines.append("\(name){queue=\"\(Self.prometheusLabel(queue.name))\"} \(value)")
      }
    }
    gauge("conveyor_queue_paused", "1 when the queue's stored pause flag is set.") { $0.paused ? "1" : "0" }
    gauge(
      "conveyor_queue_concurrency_limit",
      "The most jobs of the queue that may run at once, across every worker (no sample for a queue "
        + "without a limit)."
    ) { $0.concurrency.map(String.init) }
    gauge(
      "conveyor_queue_rate_limit_per_second",
      "The most starts a second of the queue's jobs, across every worker (no sample for a queue without "
        + "a rate)."
    ) { $0.rate.map { "\($0.perSecond)" } }
    gauge(
      "conveyor_queue_rate_limit_burst",
      "The most of the queue's jobs that may start at once after a quiet spell (no sample for a queue "
        + "without a rate)."
    ) { $0.rate.map { String($0.burst) } }
    lines += [
      "# HELP conveyor_queue_oldest_ready_age_seconds How long the queue's oldest ready job has waited "
        + "since its run date (0 when none is ready).",
      "# TYPE conveyor_queue_oldest_ready_age_seconds gauge",
    ]
    for queue in summaries {
      lines.append(
        "conveyor_queue_oldest_ready_age_seconds{queue=\"\(Self.prometheusLabel(queue.name))\"} "
          + String(format: "%.3f", queue.oldestReadyAge ?? 0))
    }
    lines += [
      "# HELP conveyor_jobs_finished_last_hour Job runs that ended in the last hour, by outcome, as "
        + "workers count them.",
      "# TYPE conveyor_jobs_finished_last_hour gauge",
    ]
    var totals: [ExactText: QueueActivity] = [:]
    for queue in summaries {
      var total = QueueActivity(queue: queue.name, minute: Date())
      for minute in activity[ExactText(queue.name)] ?? [] { total.add(minute) }
      totals[ExactText(queue.name)] = total
      let label = Self.prometheusLabel(queue.name)
      for (outcome, value) in [
        ("succeeded", total.succeeded), ("retried", total.retried), ("died", total.died),
      ] {
        lines.append("conveyor_jobs_finished_last_hour{queue=\"\(label)\",outcome=\"\(outcome)\"} \(value)")
      }
    }
    lines += [
      "# HELP conveyor_job_wait_seconds_last_hour The wait from enqueue to first start over the last "
        + "hour: mean and longest.",
      "# TYPE conveyor_job_wait_seconds_last_hour gauge",
    ]
    for queue in summaries {
      guard let total = totals[ExactText(queue.name)], let mean = total.meanWaitMilliseconds else { continue }
      let label = Self.prometheusLabel(queue.name)
      lines.append(
        "conveyor_job_wait_seconds_last_hour{queue=\"\(label)\",stat=\"mean\"} "
          + String(format: "%.3f", mean / 1000))
      lines.append(
        "conveyor_job_wait_seconds_last_hour{queue=\"\(label)\",stat=\"max\"} "
          + String(format: "%.3f", Double(total.waitMillisecondsMax) / 1000))
    }
    return .text(
      200, lines.joined(separator: "\n") + "\n", contentType: "text/plain; version=0.0.4; charset=utf-8")
  }

  static func prometheusLabel(_ text: String) -> String {
    text.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"")
      .replacingOccurrences(of: "\n", with: "\\n")
  }

  /// The states the jobs page filters by.
  enum StateFilter: String, CaseIterable {
    case all = ""
    case ready, scheduled, held, waiting, running, dead, completed, cancelled

    var stored: JobStatus? {
      switch self {
      case .all: nil
      case .ready, .scheduled, .held, .waiting: .pending
      case .running: .running
      case .dead: .dead
      case .completed: .completed
      case .cancelled: .cancelled
      }
    }

    func includes(_ record: JobRecord, now: Date) -> Bool {
      switch self {
      case .ready: !record.isHeld && record.runAt <= now
      case .scheduled: !record.isHeld && record.runAt > now
      case .held: record.isHeld
      default: true
      }
    }
  }

  /// A job's row on the jobs page.
  struct ListedRow {
    var record: JobRecord
    var state: String
    var summary: String
  }

  /// The most Unicode scalars of a summary the jobs page shows. With errors cut to
  /// ``shownError`` scalars and 50 rows, a page's rows take at most 50 × 500 scalars of 4 bytes,
  /// 100 KB of text (600 KB escaped), whatever the jobs. (Scalars, not Characters: a Character
  /// has no bound in bytes.)
  static let shownSummary = 300
  /// The most Unicode scalars of a last error the jobs page shows in a row.
  static let shownError = 200
  /// The most Unicode scalars of each last error the jobs page reads: its text filter looks at
  /// them (an error can be of any size; reading 100 whole errors of 2 MB took 232 MB).
  static let searchedError = 4 * 1024
  /// The most Unicode scalars of a last error a job's page reads and shows.
  static let shownJobError = 64 * 1024
  /// The most errors of a job's attempts its page shows (the latest): as many as a store keeps
  /// (``JobHistory/maximumErrors``).
  static let shownErrors = JobHistory.maximumErrors
  /// The most Unicode scalars of each attempt's error a job's page shows: as many bytes as a store
  /// keeps of one (``JobHistory/maximumErrorBytes``).
  static let shownAttemptError = JobHistory.maximumErrorBytes
  /// The most bytes of a job's output its page shows: as many as a store keeps
  /// (``JobHistory/maximumOutputBytes``); a larger one (another program's store) is described by
  /// its size.
  static let shownOutput = JobHistory.maximumOutputBytes
  /// The most Unicode scalars of a `--key` or an ordering key a job's page (or row) shows.
  static let shownKey = 1_000
  /// The most queue names the jobs page's queue menu lists.
  static let listedQueues = 1_000
  /// The most limit keys a queue's jobs page lists (`conveyor status --json` lists more).
  static let listedKeys = 20
  /// The most bytes of each payload the jobs page reads for its summary.
  static let listedPayload = 16 * 1024
  /// The most bytes of a payload the job page reads; a larger payload is described from them.
  static let shownPayload = 256 * 1024

  func jobsPage(_ query: HTTPForm) async throws -> DashboardResponse {
    let names = try await store.queueNames()
    let queue = try query["queue"].flatMap { $0.isEmpty ? nil : $0 }.map(queueName) ?? names.first
    guard let filter = StateFilter(rawValue: query["state"] ?? "") else {
      throw DashboardError(status: 400, text: "Unknown state filter.")
    }
    let text = (query["q"] ?? "").trimmingCharacters(in: .whitespaces)
    let after = query["after"].flatMap { Int64($0) }.map { JobID($0) }
    var rows: [ListedRow] = []
    var cursor = after
    var more = false
    var counts: JobCounts?
    var limits = QueueLimits()
    var keys: (keys: [KeyWithLimits], complete: Bool)?
    if let queue {
      counts = try await store.counts(queue: queue, clock: clock)
      limits = try await store.limits(queue: queue)
      if limits.hasKeyLimits {
        let read = try await store.limitKeyUsage(queue: queue, limit: Self.listedKeys + 1)
        keys = limits.keysWithLimits(read, listing: Self.listedKeys)
      }
      let now = Date()
      var read = 0
      reading: while rows.count < Self.pageSize && read < Self.readLimit {
        let asked = min(100, Self.readLimit - read)
        // Summaries: only the start of each payload is read (bounded whatever the jobs' sizes).
        let batch = try await store.jobSummaries(
          queue: queue, status: filter.stored, after: cursor, limit: asked,
          payloadPrefix: Self.listedPayload, errorPrefix: Self.searchedError)
        more = batch.count == asked
        for listed in batch {
          var record = listed.record
          read += 1
          guard filter.includes(record, now: now) else {
            cursor = record.id
            continue
          }
          let summary = try await configuration.summarize(listed, store)
          if !text.isEmpty,
            !(summary.localizedCaseInsensitiveContains(text)
              || (record.lastError?.localizedCaseInsensitiveContains(text) ?? false))
          {
            cursor = record.id
            continue
          }
          // A row keeps what it shows: the summary and the error cut short, no payload.
          record.payload = Data()
          record.lastError = record.lastError.map { cut($0, to: Self.shownError) }
          record.orderingKey = record.orderingKey.map { cut($0, to: Self.shownKey) }
          record.limitKey = record.limitKey.map { cut($0, to: Self.shownKey) }
          record.fairnessKey = record.fairnessKey.map { cut($0, to: Self.shownKey) }
          let row = ListedRow(
            record: record, state: Self.state(of: record, now: now),
            summary: cut(summary, to: Self.shownSummary))
          rows.append(row)
          cursor = record.id
          if rows.count == Self.pageSize {
            more = more || record.id != batch.last?.id
            break reading
          }
        }
        if !more { break }
      }
    }
    return pages.jobs(
      rows, queues: Array(names.prefix(Self.listedQueues)), queue: queue, counts: counts, limits: limits,
      keys: keys, filter: filter,
      text: text, after: after, next: more ? cursor : nil,
      notice: query["notice"], count: query["count"].flatMap { Int($0) }, formToken: formToken)
  }

  func jobPage(_ id: JobID, notice: String?) async throws -> DashboardResponse {
    // At most `shownPayload` bytes (and one more, to know it is larger) are read.
    guard
      let listed = try await store.jobSummary(
        id, payloadPrefix: Self.shownPayload + 1, errorPrefix: Self.shownJobError + 1)
    else {
      return pages.message(
        status: 404, title: "Not found", text: "No job \(id): handled, removed, or never added.")
    }
    var record = listed.record
    let details: Details
    let payload: String
    if listed.isPayloadComplete && listed.payloadSize <= Self.shownPayload {
      details = describe(record.payload)
      payload = redactedJSON(record.payload)
    } else {
      details = .unknown(
        cut(try await configuration.summarize(listed, store), to: Self.shownSummary)
          + ". The payload is \(listed.payloadSize) bytes: too large to show here.")
      payload = "(\(listed.payloadSize) bytes: too large to show)"
    }
    record.payload = Data()
    record.lastError = record.lastError.map { cut($0, to: Self.shownJobError) }
    record.deduplicationKey = record.deduplicationKey.map { cut($0, to: Self.shownKey) }
    record.orderingKey = record.orderingKey.map { cut($0, to: Self.shownKey) }
    record.limitKey = record.limitKey.map { cut($0, to: Self.shownKey) }
    record.fairnessKey = record.fairnessKey.map { cut($0, to: Self.shownKey) }
    // A summary leaves the history out (every attempt's error, the output): a job that ran or
    // finished is read whole for it, one more primary-key lookup (its payload too, at most what
    // the store took). What the page shows of it is bounded.
    var history = JobHistoryView()
    if record.attempts > 0 || record.status.isFinished, let full = try await store.job(id) {
      history.omittedErrors = max(0, full.errors.count - Self.shownErrors)
      history.errors = full.errors.suffix(Self.shownErrors).map { cut($0, to: Self.shownAttemptError) }
      history.output = full.output.map(outputText)
      record.finishedAt = full.finishedAt
      record.runDuration = full.runDuration
    }
    return pages.job(
      record, state: Self.state(of: record, now: Date()), details: details, payload: payload,
      history: history,
      notice: notice, formToken: formToken)
  }

  /// What a job's page shows of its history besides its record's fields: its attempts' errors
  /// (the latest ``shownErrors``, each cut to ``shownAttemptError`` scalars) and its output as
  /// text.
  struct JobHistoryView {
    /// The errors shown, oldest first.
    var errors: [String] = []
    /// How many older errors are left out.
    var omittedErrors = 0
    /// The output as the page shows it; nil when the job has none.
    var output: String?
  }

  /// A job's output (JSON) as text: indented and redacted as the payload is, at most
  /// ``shownPrettyJSON`` bytes once escaped; an output that is not JSON is shown as UTF-8 text,
  /// cut; one over ``shownOutput`` bytes is described by its size.
  func outputText(_ output: Data) -> String {
    guard output.count <= Self.shownOutput else { return "(\(output.count) bytes: too large to show)" }
    return prettyRedactedJSON(output)
      ?? cut(String(decoding: output, as: UTF8.self), to: Self.shownOutput)
  }

  /// The bulk actions the confirmation page offers.
  enum BulkAction: String {
    case retryDead = "retry-dead"
    case remove
  }

  /// The jobs a bulk action covers: every dead job, or every waiting or dead job of a queue.
  private func bulkTarget(_ form: HTTPForm) throws -> (BulkAction, String, StateFilter) {
    guard let action = BulkAction(rawValue: form["action"] ?? "") else {
      throw DashboardError(status: 400, text: "Unknown bulk action.")
    }
    let queue = try queueName(form["queue"])
    let state = StateFilter(rawValue: form["state"] ?? "dead") ?? .all
    switch (action, state) {
    case (.retryDead, .dead), (.remove, .dead), (.remove, .waiting): return (action, queue, state)
    default:
      throw DashboardError(
        status: 400, text: "Bulk actions cover dead jobs (retry or remove) or waiting jobs (remove).")
    }
  }

  /// The jobs a bulk action covers now: how many, and the highest of their IDs.
  private func bulkTally(_ queue: String, _ state: StateFilter) async throws -> JobTally {
    try await store.tally(queue: queue, statuses: [state == .dead ? .dead : .pending])
  }

  func confirmPage(_ query: HTTPForm) async throws -> DashboardResponse {
    let (action, queue, state) = try bulkTarget(query)
    let tally = try await bulkTally(queue, state)
    return pages.confirm(
      action: action, queue: queue, state: state, count: tally.count, through: tally.highestID,
      changed: false,
      formToken: formToken)
  }

  func bulk(_ form: HTTPForm) async throws -> DashboardResponse {
    let (action, queue, state) = try bulkTarget(form)
    // What the operator confirmed is not what is there now: confirm again.
    func confirmAgain() async throws -> DashboardResponse {
      let tally = try await bulkTally(queue, state)
      var page = pages.confirm(
        action: action, queue: queue, state: state, count: tally.count, through: tally.highestID,
        changed: true,
        formToken: formToken)
      page.status = 409
      return page
    }
    guard let expected = form["expected"].flatMap({ Int($0) }) else { return try await confirmAgain() }
    let done: Int
    switch action {
    case .retryDead:
      // The dead jobs counted, no others: those with IDs up to the highest counted (a job that
      // died since, with a higher ID, is left dead), and only if they are still as many.
      guard let through = form["through"].flatMap({ Int64($0) }) else { return try await confirmAgain() }
      var ids: [JobID] = []
      var after: JobID?
      while true {
        let page = try await store.jobs(queue: queue, status: .dead, after: after, limit: 500)
        ids += page.lazy.map(\.id).filter { $0.rawValue <= through }
        guard page.count == 500, let last = page.last, last.id.rawValue <= through else { break }
        after = last.id
      }
      guard ids.count == expected else { return try await confirmAgain() }
      var requeued = 0
      for start in stride(from: 0, to: ids.count, by: 500) {
        requeued += try await store.requeueDead(
          Array(ids[start..<min(start + 500, ids.count)]), queue: queue, clock: clock)
      }
      done = requeued
    case .remove:
      // Exactly the jobs counted, checked in the deleting transaction: none added since (a higher
      // ID), and only if their number is still the one confirmed.
      guard let through = form["through"].flatMap({ Int64($0) }).map({ JobID($0) }),
        let removed = try await store.clear(
          queue: queue, statuses: [state == .dead ? .dead : .pending], through: through, expecting: expected)
      else { return try await confirmAgain() }
      done = removed
    }
    let notice = action == .retryDead ? "bulk-requeued" : "bulk-removed"
    return redirect("/jobs?queue=\(HTTPForm.encode(queue))&notice=\(notice)&count=\(done)")
  }

  // MARK: what a job is

  /// A waiting job is ready, scheduled, or held (behind an earlier job of its ordering key).
  static func state(of record: JobRecord, now: Date) -> String {
    guard record.status == .pending else { return record.status.rawValue }
    return record.isHeld ? "held" : record.runAt <= now ? "ready" : "scheduled"
  }

  /// What a job is, for its page: an HTTP request (credentials redacted) or a command.
  enum Details {
    case http(method: String, url: String, headers: [(String, String)], body: String?, bodySize: Int)
    case exec(arguments: [String], directory: String?, timeout: Double?)
    /// A durable workflow's run: its history is shown step by step.
    case workflow(WorkflowRun)
    case unknown(String)
  }

  /// What the application's ``DashboardConfiguration/describe`` says the payload is, redacted:
  /// secret header values, a URL's password and credential-like query values.
  func describe(_ payload: Data) -> Details {
    guard let details = configuration.describe(payload) else {
      if let run = WorkflowRun(payload: payload) { return .workflow(run) }
      return .unknown("A job of this application; its payload is shown below.")
    }
    switch details {
    case .httpRequest(let method, let url, let headers, let body):
      let headers = headers.sorted { $0.name.lowercased() < $1.name.lowercased() }.map {
        ($0.name, secretHeaders.contains($0.name.lowercased()) ? "[redacted]" : $0.value)
      }
      let text = body.flatMap { $0.count <= 16_384 ? String(data: $0, encoding: .utf8) : nil }
      return .http(
        method: method, url: Self.redacted(url), headers: headers, body: text, bodySize: body?.count ?? 0)
    case .command(let arguments, let directory, let timeout):
      return .exec(arguments: arguments, directory: directory, timeout: timeout)
    case .text(let text):
      return .unknown(text)
    }
  }

  /// Query parameters whose names suggest a credential.
  static let secretQueryWords = [
    "token", "key", "secret", "pass", "sig", "auth", "code", "session", "credential",
  ]

  /// The URL with its password and credential-like query values replaced by `[redacted]`.
  static func redacted(_ url: URL) -> String {
    guard var components = URLComponents(url: url, resolvingAgainstBaseURL: false) else { return "(URL)" }
    // The user name is a credential too: an API key sent as the user (`https://KEY:@host`,
    // `https://TOKEN@host`).
    if components.user != nil { components.user = "redacted" }
    if components.password != nil { components.password = "redacted" }
    components.queryItems = components.queryItems?.map { item in
      let name = item.name.lowercased()
      return secretQueryWords.contains(where: name.contains)
        ? URLQueryItem(name: item.name, value: "redacted") : item
    }
    return components.string ?? "(URL)"
  }

  /// The most bytes of pretty JSON a job's page shows, counted as the page holds them (escaped
  /// for HTML: a quote is 6 bytes).
  static let shownPrettyJSON = 256 * 1024
  /// The deepest indentation pretty JSON gets; deeper levels are indented as this one. Each
  /// line is indented by its depth, so a payload nested 200 deep around 60,000 numbers made a
  /// 24 MB page.
  static let deepestIndent = 16

  /// The payload as pretty JSON, with the values of secret headers in any `headers` object
  /// replaced and any `url` redacted; a payload that is not JSON, or over 256 KiB, is described
  /// instead. The text is at most ``shownPrettyJSON`` bytes once escaped, whatever the payload's
  /// shape, with a note where it is cut.
  func redactedJSON(_ payload: Data) -> String {
    guard payload.count <= 256 * 1024 else { return "(\(payload.count) bytes: too large to show)" }
    return prettyRedactedJSON(payload) ?? "(\(payload.count) bytes, not JSON)"
  }

  /// `json` redacted and indented (``indented(_:limit:)``), or nil when it is not JSON.
  private func prettyRedactedJSON(_ json: Data) -> String? {
    do {
      let object = try JSONSerialization.jsonObject(with: json, options: [.fragmentsAllowed])
      let compact = try JSONSerialization.data(
        withJSONObject: redact(object), options: [.sortedKeys, .withoutEscapingSlashes, .fragmentsAllowed])
      return Self.indented(compact, limit: Self.shownPrettyJSON)
    } catch {
      // Not JSON: the caller says so.
      return nil
    }
  }

  /// `json` (compact, valid JSON) written one member or element a line, each line indented by
  /// two spaces a level up to ``deepestIndent`` levels, and cut with a note once the text would
  /// pass `limit` bytes escaped for HTML. Plain bytes: a cut falls between UTF-8 sequences.
  static func indented(_ json: Data, limit: Int) -> String {
    let bytes = [UInt8](json)
    var output: [UInt8] = []
    output.reserveCapacity(min(limit, bytes.count * 2))
    var cost = 0
    var depth = 0
    var inString = false
    var escaped = false
    func append(_ byte: UInt8) {
      output.append(byte)
      cost += htmlCost(byte)
    }
    func newLine() {
      append(0x0A)
      let spaces = 2 * min(max(depth, 0), deepestIndent)
      output.append(contentsOf: repeatElement(0x20, count: spaces))
      cost += spaces
    }
    var index = 0
    while index < bytes.count {
      if cost > limit {
        // Back to the start of a UTF-8 sequence, which is left out.
        while let last = output.last, last & 0xC0 == 0x80 { output.removeLast() }
        if let last = output.last, last >= 0xC0 { output.removeLast() }
        return String(decoding: output, as: UTF8.self)
          + "\n… (cut here: the rest is not shown; the payload is \(bytes.count) bytes of JSON)"
      }
      let byte = bytes[index]
      index += 1
      if inString {
        append(byte)
        if escaped {
          escaped = false
        } else if byte == UInt8(ascii: "\\") {
          escaped = true
        } else if byte == UInt8(ascii: "\"") {
          inString = false
        }
        continue
      }
      switch byte {
      case UInt8(ascii: "\""):
        inString = true
        append(byte)
      case UInt8(ascii: "{"), UInt8(ascii: "["):
        append(byte)
        let close = byte == UInt8(ascii: "{") ? UInt8(ascii: "}") : UInt8(ascii: "]")
        if index < bytes.count, bytes[index] == close {
          append(close)
          index += 1
        } else {
          depth += 1
          newLine()
        }
      case UInt8(ascii: "}"), UInt8(ascii: "]"):
        depth -= 1
        newLine()
        append(byte)
      case UInt8(ascii: ","):
        append(byte)
        newLine()
      case UInt8(ascii: ":"):
        // `"key" : value`, as Foundation's pretty printing writes it.
        append(0x20)
        append(byte)
        append(0x20)
      default:
        append(byte)
      }
    }
    return String(decoding: output, as: UTF8.self)
  }

  /// How many bytes `byte` takes once escaped by ``html(_:)``.
  private static func htmlCost(_ byte: UInt8) -> Int {
    switch byte {
    case UInt8(ascii: "&"): 5
    case UInt8(ascii: "<"), UInt8(ascii: ">"): 4
    case UInt8(ascii: "\""): 6
    case UInt8(ascii: "'"): 5
    default: 1
    }
  }

  private func redact(_ value: Any) -> Any {
    if let dictionary = value as? [String: Any] {
      var result: [String: Any] = [:]
      for (key, item) in dictionary {
        if key == "headers", let headers = item as? [String: Any] {
          var cleaned: [String: Any] = [:]
          for (name, headerValue) in headers {
            cleaned[name] = secretHeaders.contains(name.lowercased()) ? "[redacted]" : headerValue
          }
          result[key] = cleaned
        } else {
          result[key] = redact(item)
        }
      }
      return result
    }
    if let array = value as? [Any] { return array.map(redact) }
    // A URL under any key (`url`, `webhook`, `endpoint`…): its password and credential-like
    // query values are redacted.
    if let text = value as? String, text.contains("://"), let url = URL(string: text), url.scheme != nil {
      return Self.redacted(url)
    }
    return value
  }
}

/// An optional value a synthesized `Encodable` writes as `null` when it is nil, where it would
/// leave the member out: `/api/queues` always has `"concurrency"`.
@propertyWrapper
struct NullWhenAbsent<Value: Encodable>: Encodable {
  var wrappedValue: Value?

  init(wrappedValue: Value?) {
    self.wrappedValue = wrappedValue
  }

  func encode(to encoder: any Encoder) throws {
    var container = encoder.singleValueContainer()
    if let wrappedValue { try container.encode(wrappedValue) } else { try container.encodeNil() }
  }
}
