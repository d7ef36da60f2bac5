import Conveyor
import Foundation

/// Escapes text for HTML content and quoted attribute values.
func html(_ text: String) -> String {
  var result = ""
  result.reserveCapacity(text.utf8.count)
  for character in text.unicodeScalars {
    switch character {
    case "&": result += "&amp;"
    case "<": result += "&lt;"
    case ">": result += "&gt;"
    case "\"": result += "&quot;"
    case "'": result += "&#39;"
    default: result.unicodeScalars.append(character)
    }
  }
  return result
}

/// The dashboard's pages: server-rendered HTML that reads and works without JavaScript. Every
/// piece of text from the store goes through ``html(_:)``; the only unescaped parts are this
/// file's literals and the mount path (checked to hold none of `&<>"'`). Every link, form action
/// and asset URL starts with the mount path ``base``.
struct DashboardPages: Sendable {
  /// The mount path: "" or `/a/b`.
  let base: String
  /// The sign-in page's sentence on where the token comes from (plain text).
  var signInHint = ""

  /// ``base`` escaped for an attribute.
  var htmlBase: String { html(base) }

  func layout(_ title: String, page: String, _ body: String, status: Int = 200) -> DashboardResponse {
    let text = """
      <!doctype html>
      <html lang="en">
      <head>
      <meta charset="utf-8">
      <meta name="viewport" content="width=device-width, initial-scale=1">
      <title>\(html(title)) · Conveyor</title>
      <link rel="stylesheet" href="\(htmlBase)/static/dashboard.css">
      <script src="\(htmlBase)/static/dashboard.js" defer></script>
      </head>
      <body data-page="\(page)" data-base="\(htmlBase)">
      <header><a class="brand" href="\(htmlBase)/">Conveyor</a>
      <nav><a href="\(htmlBase)/">Queues</a> <a href="\(htmlBase)/jobs">Jobs</a> <a href="\(htmlBase)/schedules">Schedules</a> <a href="\(htmlBase)/metrics">Metrics</a></nav></header>
      <main>
      \(body)
      </main>
      </body>
      </html>
      """
    return .text(status, text, contentType: "text/html; charset=utf-8")
  }

  func message(status: Int, title: String, text: String) -> DashboardResponse {
    layout(
      title, page: "message", "<h1>\(html(title))</h1>\n<p class=\"message\">\(html(text))</p>",
      status: status)
  }

  func signIn(message: String?) -> DashboardResponse {
    let warning = message.map { "<p class=\"notice error\">\(html($0))</p>" } ?? ""
    return layout(
      "Sign in", page: "sign-in",
      """
      <h1>Sign in</h1>
      \(warning)
      <p>\(html(signInHint))</p>
      <form method="post" action="\(htmlBase)/login" class="sign-in">
      <label>Token <input type="password" name="token" autocomplete="current-password" required></label>
      <button type="submit">Sign in</button>
      </form>
      """)
  }

  func hidden(_ name: String, _ value: String) -> String {
    "<input type=\"hidden\" name=\"\(html(name))\" value=\"\(html(value))\">"
  }

  /// A one-button POST form carrying the form token.
  func button(
    _ label: String, action: String, fields: [(String, String)] = [], formToken: String, style: String = ""
  ) -> String {
    let inputs = ([("csrf", formToken)] + fields).map { hidden($0.0, $0.1) }.joined()
    return "<form method=\"post\" action=\"\(html(base + action))\" class=\"inline\">\(inputs)"
      + "<button type=\"submit\" class=\"\(style)\">\(html(label))</button></form>"
  }

  static let notices: [String: String] = [
    "paused": "Queue paused: no worker claims its jobs until it is resumed.",
    "resumed": "Queue resumed.",
    "requeued": "Job re-queued: it is ready to run.",
    "not-requeued": "Not re-queued: the job is not dead, or a waiting job holds its key.",
    "removed": "Job removed.",
    "cancelled-waiting": "Job cancelled: it was waiting, and will never run.",
    "cancelled-running":
      "Job cancelled while it ran: its worker stops the handler at its next check (within about a second) "
      + "and ignores its outcome; it is not retried.",
    "already-dead": "Not cancelled: the job is dead, so already finished.",
    "already-completed": "Not cancelled: the job already completed.",
    "already-cancelled": "Not cancelled: the job was already cancelled.",
    "bulk-requeued": "Dead jobs re-queued:",
    "bulk-removed": "Jobs removed:",
    "schedule-paused":
      "Schedule paused: no slot fires until it is resumed, and the slots that pass meanwhile are skipped.",
    "schedule-resumed": "Schedule resumed: it fires from its next slot.",
  ]

  /// The notice a cancel's answer is shown with (one of ``notices``' keys).
  static func noticeKey(_ result: CancelResult) -> String {
    switch result {
    case .cancelledWaiting: "cancelled-waiting"
    case .cancelledRunning: "cancelled-running"
    case .alreadyDead: "already-dead"
    case .alreadyCompleted: "already-completed"
    case .alreadyCancelled: "already-cancelled"
    case .notFound: "not-found"
    }
  }

  /// The button that cancels a waiting or running job; none for a finished one.
  func cancelButton(_ record: JobRecord, formToken: String) -> String {
    record.status == .pending || record.status == .running
      ? button("Cancel", action: "/jobs/\(record.id)/cancel", formToken: formToken, style: "danger") : ""
  }

  func notice(_ key: String?, count: Int? = nil) -> String {
    guard let key, let text = Self.notices[key] else { return "" }
    return "<p class=\"notice\" role=\"status\">\(html(text))\(count.map { " \($0)." } ?? "")</p>"
  }

  // MARK: queues

  func queues(
    _ queues: [Dashboard.QueueSummary], activity: [ExactText: [QueueActivity]], now: Date,
    notice key: String?,
    formToken: String, database: String?
  ) -> DashboardResponse {
    var rows = ""
    for queue in queues {
      let name = html(queue.name)
      let link = base + "/jobs?queue=" + HTTPForm.encode(queue.name)
      let toggle = button(
        queue.paused ? "Resume" : "Pause", action: queue.paused ? "/queues/resume" : "/queues/pause",
        fields: [("queue", queue.name)], formToken: formToken)
      let retry =
        queue.dead > 0
        ? "<a class=\"button\" href=\"\(htmlBase)/confirm?action=retry-dead&amp;state=dead&amp;queue=\(html(HTTPForm.encode(queue.name)))\">Retry dead…</a>"
        : ""
      rows += """
        <tr data-queue="\(name)" data-key="\(html(queue.key))">
        <th scope="row"><a href="\(html(link))">\(name)</a></th>
        <td class="count" data-field="ready"><a href="\(html(link))&amp;state=ready">\(queue.ready)</a></td>
        <td class="count" data-field="scheduled"><a href="\(html(link))&amp;state=scheduled">\(queue.scheduled)</a></td>
        <td class="count" data-field="held"><a href="\(html(link))&amp;state=held">\(queue.held)</a></td>
        <td class="count" data-field="running"><a href="\(html(link))&amp;state=running">\(queue.running)</a></td>
        <td class="count" data-field="concurrency" title="\(html(limitTitle(queue.concurrency, rate: queue.rate)))">\(queue.concurrency.map(String.init) ?? "—")</td>
        <td class="count\(queue.dead > 0 ? " dead" : "")" data-field="dead"><a href="\(html(link))&amp;state=dead">\(queue.dead)</a></td>
        <td class="count" data-field="completed"><a href="\(html(link))&amp;state=completed">\(queue.completed)</a></td>
        <td class="count" data-field="cancelled"><a href="\(html(link))&amp;state=cancelled">\(queue.cancelled)</a></td>
        <td class="count" data-field="oldest">\(html(queue.oldest))</td>
        <td data-field="paused">\(queue.paused ? "<span class=\"badge paused\">paused</span>" : "<span class=\"badge\">active</span>")</td>
        <td class="actions">\(toggle) \(retry)</td>
        </tr>

        """
    }
    let table =
      queues.isEmpty
      ? "<p class=\"empty\">No queues yet: add a job with <code>conveyor add</code>.</p>"
      : """
      <table class="queues">
      <thead><tr><th scope="col">Queue</th><th scope="col" class="count">Ready</th>
      <th scope="col" class="count">Scheduled</th><th scope="col" class="count" title="\(html(Self.heldMeaning))">Held</th><th scope="col" class="count">Running</th><th scope="col" class="count" title="The most jobs of the queue running at once, across every worker (conveyor limits set)">Limit</th>
      <th scope="col" class="count">Dead</th><th scope="col" class="count" title="Completed jobs kept as history">Completed</th>
      <th scope="col" class="count" title="Cancelled jobs kept as history">Cancelled</th><th scope="col" class="count" title="How long the oldest ready job has waited since its run date">Oldest ready</th><th scope="col">State</th><th scope="col">Actions</th></tr></thead>
      <tbody>
      \(rows)</tbody>
      </table>
      """
    return layout(
      "Queues", page: "queues",
      """
      <h1>Queues</h1>
      \(notice(key))
      \(table)
      \(DashboardCharts.section(queues: queues.map(\.name), activity: activity, now: now))
      <p class="meta">\(database.map { "Database <code>\(html($0))</code> · " } ?? "")<span id="updated">counts as of \(html(timestamp(Date())))</span></p>
      """)
  }

  /// What a queue's "Limit" cell says when hovered.
  func limitTitle(_ concurrency: Int?, rate: RateLimit? = nil) -> String {
    let limit =
      concurrency.map { "At most \($0) running at once, across every worker" }
      ?? "No concurrency limit (set one with conveyor limits set --concurrency N)"
    return limit + (rate.map { "; at most \($0) starting" } ?? "")
  }

  /// The line under a queue's counts on its jobs page naming its limits (concurrency, rate, per
  /// key), and why nothing more is claimed when the concurrency limit is reached with ready jobs
  /// waiting; nil without one.
  func limitLine(_ limits: QueueLimits, _ counts: JobCounts) -> String? {
    var parts: [String] = []
    if let concurrency = limits.concurrency {
      var text = "Concurrency limit: at most \(concurrency) running at once, across every worker."
      if counts.running >= concurrency, counts.ready > 0 {
        text +=
          " Limit reached: \(counts.ready) ready job\(counts.ready == 1 ? "" : "s") "
          + "wait\(counts.ready == 1 ? "s" : "") for a place."
      }
      parts.append(text)
    }
    if let rate = limits.rate {
      parts.append("Rate limit: at most \(rate) starting, across every worker.")
    }
    if let perKey = limits.keyConcurrency {
      parts.append("Limit per key: at most \(perKey) running at once for each limit key.")
    }
    if let rate = limits.keyRate {
      parts.append("Rate per key: at most \(rate) starting for each limit key.")
    }
    let own = Set(limits.keyConcurrencyOverrides.keys.map { Array($0.utf8) })
      .union(limits.keyRateOverrides.keys.map { Array($0.utf8) })
    if !own.isEmpty {
      let count = own.count
      parts.append(
        "\(count) key\(count == 1 ? " has its" : "s have their") own limit; jobs held for their key's limit "
          + "say so (held by the limit of key …).")
    }
    guard !parts.isEmpty else { return nil }
    let text = parts.joined(separator: " ")
    return "<p class=\"limits\" data-field=\"limits\">\(html(text))</p>\n"
  }

  /// The table of a queue's keys with a limit: each key's running jobs, its limit and its jobs held
  /// for it, the keys holding most first (see `QueueLimits.keysWithLimits`).
  func keyTable(_ keys: (keys: [KeyWithLimits], complete: Bool)) -> String {
    guard !keys.keys.isEmpty || !keys.complete else { return "" }
    let rows = keys.keys.map { key in
      "<tr><td class=\"key\">\(html(key.usage.key))</td><td class=\"count\">\(key.usage.running)</td>"
        + "<td class=\"count\">\(key.limit.map(String.init) ?? "—")</td><td>\(key.rate.map { html($0.description) } ?? "—")</td>"
        + "<td class=\"count\">\(key.usage.held)</td></tr>"
    }.joined(separator: "\n")
    let more =
      keys.complete
      ? ""
      : "<p class=\"more\">More keys have a limit than are listed: conveyor status --json lists them.</p>\n"
    return """
      <table class="keys" data-field="keys">
      <thead><tr><th scope="col">Limit key</th><th scope="col" class="count">Running</th><th scope="col" class="count">Limit</th>
      <th scope="col">Rate</th><th scope="col" class="count" title="Jobs a claim held for their key's limit or rate">Held</th></tr></thead>
      <tbody>
      \(rows)
      </tbody>
      </table>
      \(more)
      """
  }

  // MARK: jobs

  func jobs(
    _ rows: [Dashboard.ListedRow], queues: [String], queue: String?, counts: JobCounts?,
    limits: QueueLimits = QueueLimits(),
    keys: (keys: [KeyWithLimits], complete: Bool)? = nil,
    filter: Dashboard.StateFilter, text: String,
    after: JobID?, next: JobID?, notice key: String?, count: Int?, formToken: String
  ) -> DashboardResponse {
    let queueOptions = queues.map {
      "<option value=\"\(html($0))\"\($0 == queue ? " selected" : "")>\(html($0))</option>"
    }.joined()
    let stateOptions = Dashboard.StateFilter.allCases.map {
      "<option value=\"\($0.rawValue)\"\($0 == filter ? " selected" : "")>\($0 == .all ? "any state" : $0.rawValue)</option>"
    }.joined()
    var body = """
      <h1>Jobs\(queue.map { " in " + html($0) } ?? "")</h1>
      \(notice(key, count: count))
      <form method="get" action="\(htmlBase)/jobs" class="filters">
      <label>Queue <select name="queue">\(queueOptions)</select></label>
      <label>State <select name="state">\(stateOptions)</select></label>
      <label>Text <input type="search" name="q" value="\(html(text))" placeholder="in summary or last error"></label>
      <button type="submit">Filter</button>
      </form>

      """
    if let queue, let counts {
      // The queue's counts, each a link to its filter.
      let encoded = html(HTTPForm.encode(queue))
      let links = [
        ("ready", counts.ready), ("scheduled", counts.scheduled), ("held", counts.held),
        ("running", counts.running), ("dead", counts.dead), ("completed", counts.completed),
        ("cancelled", counts.cancelled),
      ].map { state, count in
        "<a href=\"\(htmlBase)/jobs?queue=\(encoded)&amp;state=\(state)\" data-field=\"\(state)\""
          + (state == "held" ? " title=\"\(html(Self.heldMeaning))\"" : "") + ">\(state) "
          + "<span class=\"count\">\(count)</span></a>"
      }
      body += "<p class=\"counts\">\(links.joined(separator: " · "))</p>\n"
      if let line = limitLine(limits, counts) { body += line }
      if let keys { body += keyTable(keys) }
    }
    if let queue, filter == .dead || filter == .waiting {
      let encoded = html(HTTPForm.encode(queue))
      body += "<p class=\"bulk\">"
      if filter == .dead {
        body +=
          "<a class=\"button\" href=\"\(htmlBase)/confirm?action=retry-dead&amp;state=dead&amp;queue=\(encoded)\">Retry all dead…</a> "
      }
      body +=
        "<a class=\"button danger\" href=\"\(htmlBase)/confirm?action=remove&amp;state=\(filter.rawValue)&amp;queue=\(encoded)\">Remove all \(filter.rawValue)…</a></p>\n"
    }
    if rows.isEmpty {
      body += "<p class=\"empty\">No jobs match.</p>\n"
    } else {
      body += """
        <table class="jobs">
        <thead><tr><th scope="col">ID</th><th scope="col">State</th><th scope="col">Tries</th><th scope="col">Run at</th>
        <th scope="col">Finished</th><th scope="col">Job</th><th scope="col">Last error</th><th scope="col"></th></tr></thead>
        <tbody>

        """
      for row in rows {
        let record = row.record
        let error = cut(record.lastError ?? "", to: Dashboard.shownError)
        let retry =
          record.status == .dead
          ? button("Retry", action: "/jobs/\(record.id)/retry", formToken: formToken)
          : cancelButton(record, formToken: formToken)
        let finished = record.finishedAt.map { "<time>\(html(timestamp($0)))</time>" } ?? ""
        body += """
          <tr data-job="\(record.id)">
          <td><a href="\(htmlBase)/jobs/\(record.id)">\(record.id)</a></td>
          <td><span class="badge \(row.state)">\(row.state)</span></td>
          <td class="count">\(record.attempts)</td>
          <td><time>\(html(timestamp(record.runAt)))</time></td>
          <td>\(finished)</td>
          <td class="summary">\(html(row.summary))\(heldBy(record))</td>
          <td class="error">\(html(error))</td>
          <td class="actions">\(retry)</td>
          </tr>

          """
      }
      body += "</tbody>\n</table>\n"
    }
    var links: [String] = []
    func link(_ after: JobID?) -> String {
      var parts = ["queue=" + HTTPForm.encode(queue ?? ""), "state=" + filter.rawValue]
      if !text.isEmpty { parts.append("q=" + HTTPForm.encode(text)) }
      if let after { parts.append("after=\(after)") }
      return html(base + "/jobs?" + parts.joined(separator: "&"))
    }
    if after != nil { links.append("<a href=\"\(link(nil))\">First page</a>") }
    if let next { links.append("<a href=\"\(link(next))\" rel=\"next\">Next page</a>") }
    body += "<p class=\"pages\">\(links.joined(separator: " · "))</p>\n"
    body +=
      "<p class=\"meta\">Up to \(Dashboard.pageSize) jobs a page in ID order (completed and cancelled jobs in "
      + "the order they finished); the text and ready/scheduled/held filters look at up to \(Dashboard.readLimit) "
      + "jobs per page.</p>"
    return layout("Jobs", page: "jobs", body)
  }

  // MARK: a job

  func job(
    _ record: JobRecord, state: String, details: Dashboard.Details, payload: String,
    history: Dashboard.JobHistoryView, notice key: String?, formToken: String
  ) -> DashboardResponse {
    func row(_ name: String, _ value: String?) -> String {
      "<tr><th scope=\"row\">\(html(name))</th><td>\(value.map(html) ?? "<span class=\"none\">—</span>")</td></tr>"
    }
    let facts = [
      row("Queue", record.queue),
      "<tr><th scope=\"row\">State</th><td><span class=\"badge \(state)\">\(state)</span></td></tr>",
      row("Attempts", String(record.attempts)),
      row("Priority", String(record.priority)),
      row("Run at", timestamp(record.runAt)),
      row("Created", timestamp(record.createdAt)),
      row("Finished", record.finishedAt.map(timestamp)),
      row("Run time", record.runDuration.map { Self.duration($0) + " (the last attempt)" }),
      row("Time limit", record.timeLimit.map { Self.duration($0) } ?? "the queue's"),
      row("Lease owner", record.leaseOwner),
      row("Lease expires", record.leaseExpiresAt.map(timestamp)),
      row("Key", record.deduplicationKey),
      row("Ordering key", record.orderingKey),
      row("Limit key", record.limitKey),
      row("Fairness key", record.fairnessKey),
    ].joined(separator: "\n")
    let held =
      record.isHeldByLimit
      ? "<p class=\"notice held\" role=\"status\">Held by the limit of key <code>\(html(record.limitKey ?? ""))</code>: "
        + "as many jobs of this key run as its limit allows; it is claimable again when one of them stops running.</p>"
      : record.isHeld
        ? "<p class=\"notice held\" role=\"status\">Held by ordering key <code>\(html(record.orderingKey ?? ""))</code> "
          + "(waits for the earlier job of its key): it runs once every earlier job of the queue with this key "
          + "has finished. A dead one holds it until that one is retried or removed.</p>"
        : ""
    var what: String
    switch details {
    case .http(let method, let url, let headers, let body, let bodySize):
      let headerRows = headers.map { "<tr><th scope=\"row\">\(html($0.0))</th><td>\(html($0.1))</td></tr>" }
        .joined()
      what = """
        <h2>HTTP request</h2>
        <p class="request"><code>\(html(method)) \(html(url))</code></p>
        \(headers.isEmpty ? "<p class=\"none\">No headers.</p>" : "<table class=\"headers\"><tbody>\(headerRows)</tbody></table>")
        <p>Body: \(bodySize) bytes</p>
        """
      if let body, !body.isEmpty { what += "<pre class=\"body\">\(html(body))</pre>" }
    case .exec(let arguments, let directory, let timeout):
      let items = arguments.map { "<li><code>\(html($0))</code></li>" }.joined()
      what = """
        <h2>Command</h2>
        <ol class="argv">\(items)</ol>
        <p>Working directory: \(directory.map { "<code>\(html($0))</code>" } ?? "the worker's")\(timeout.map { " · timeout \($0) s" } ?? "")</p>
        """
    case .workflow(let run):
      what = workflowSection(run, now: Date())
    case .unknown(let text):
      what = "<p class=\"none\">\(html(text))</p>"
    }
    var actions: [String] = []
    if record.status == .dead {
      actions.append(button("Retry", action: "/jobs/\(record.id)/retry", formToken: formToken))
    }
    let cancel = cancelButton(record, formToken: formToken)
    if !cancel.isEmpty { actions.append(cancel) }
    actions.append(
      button("Remove", action: "/jobs/\(record.id)/remove", formToken: formToken, style: "danger"))
    var error =
      record.lastError.map { "<h2>Last error</h2>\n<pre class=\"error\">\(html($0))</pre>" }
      ?? ""
    if !history.errors.isEmpty {
      let omitted =
        history.omittedErrors > 0
        ? "<p class=\"meta\">\(history.omittedErrors) older error\(history.omittedErrors == 1 ? "" : "s") not shown.</p>\n"
        : ""
      let items = history.errors.map { "<li><pre class=\"error\">\(html($0))</pre></li>" }.joined(
        separator: "\n")
      error += "\n<h2>Errors of its attempts</h2>\n\(omitted)<ol class=\"errors\">\n\(items)\n</ol>"
    }
    if let output = history.output {
      error += "\n<h2>Output</h2>\n<pre class=\"output\">\(html(output))</pre>"
    }
    return layout(
      "Job \(record.id)", page: "job",
      """
      <h1>Job \(record.id)</h1>
      \(notice(key))
      \(held)
      <p class="actions">\(actions.joined(separator: " "))</p>
      <table class="facts"><tbody>
      \(facts)
      </tbody></table>
      \(error)
      \(what)
      <h2>Payload</h2>
      <pre class="payload">\(html(payload))</pre>
      <p><a href="\(htmlBase)/jobs?queue=\(html(HTTPForm.encode(record.queue)))">All jobs in \(html(record.queue))</a></p>
      """)
  }

  /// The most entries of a run's history the job page lists.
  static let shownWorkflowEntries = 500
  /// The most bytes of a run's input or a step's result the job page shows.
  static let shownWorkflowValue = 300
  /// The most bytes of a step's name the job page shows.
  static let shownWorkflowName = 200
  /// The most bytes of a step's error the job page shows.
  static let shownWorkflowError = 1_000

  /// A workflow run's name, input and history, one row per step or sleep, every value escaped and
  /// cut.
  func workflowSection(_ run: WorkflowRun, now: Date) -> String {
    func value(_ data: Data) -> String {
      let text = String(decoding: data.prefix(Self.shownWorkflowValue), as: UTF8.self)
      return html(data.count > Self.shownWorkflowValue ? text + "…" : text)
    }
    func cut(_ text: String, _ bytes: Int) -> String {
      text.utf8.count > bytes ? String(decoding: text.utf8.prefix(bytes), as: UTF8.self) + "…" : text
    }
    let rows = run.history.prefix(Self.shownWorkflowEntries).enumerated().map { index, event in
      let state = event.state(at: now)
      let detail =
        event.result.map { "<code>\(value($0))</code>" }
        ?? event.error.map { html(cut($0, Self.shownWorkflowError)) } ?? ""
      return """
        <tr><td>\(index + 1)</td><td>\(html(event.kind.rawValue)) <code>\(html(cut(event.name, Self.shownWorkflowName)))</code></td>\
        <td><span class="badge \(state)">\(state)</span></td><td>\(event.failedAttempts)</td>\
        <td>\(event.startedAt.map { html(timestamp($0)) } ?? "")</td>\
        <td>\(event.finishedAt.map { html(timestamp($0)) } ?? "")</td><td>\(detail)</td></tr>
        """
    }.joined(separator: "\n")
    let omitted =
      run.history.count > Self.shownWorkflowEntries
      ? "<p class=\"meta\">\(run.history.count - Self.shownWorkflowEntries) later entries not shown.</p>" : ""
    let table =
      run.history.isEmpty
      ? "<p class=\"none\">No step taken yet.</p>"
      : """
      <table class="steps"><thead><tr><th scope="col">#</th><th scope="col">Entry</th><th scope="col">State</th>\
      <th scope="col">Failed attempts</th><th scope="col">Started</th><th scope="col">Finished, or sleeps until</th>\
      <th scope="col">Result or error</th></tr></thead>
      <tbody>
      \(rows)
      </tbody></table>
      \(omitted)
      """
    return """
      <h2>Workflow run</h2>
      <p>Workflow <code>\(html(cut(run.workflow, Self.shownWorkflowName)))</code>, input <code>\(value(run.input))</code></p>
      \(table)
      """
  }

  /// What "held" means, for the titles of the held counts.
  static let heldMeaning = "Waiting behind an earlier job of their ordering key, or for their key's limit"

  /// A held row's mark under its summary: the key that holds it, escaped.
  func heldBy(_ record: JobRecord) -> String {
    guard record.isHeld else { return "" }
    if record.isHeldByLimit {
      return
        "<span class=\"held-by\">held by the limit of key <code>\(html(record.limitKey ?? ""))</code></span>"
    }
    return
      "<span class=\"held-by\">held by ordering key <code>\(html(record.orderingKey ?? ""))</code></span>"
  }

  /// A duration as a job's page shows it (a negative one, from a hostile store, as zero).
  static func duration(_ duration: Duration) -> String {
    let parts = duration.components
    let milliseconds = Double(parts.seconds) * 1000 + Double(parts.attoseconds) / 1e15
    return DashboardCharts.duration(milliseconds: max(0, milliseconds))
  }

  // MARK: bulk

  /// The confirmation of a bulk action over `count` jobs; `through` (the highest of their IDs,
  /// when known) bounds what the action may touch.
  func confirm(
    action: Dashboard.BulkAction, queue: String, state: Dashboard.StateFilter, count: Int, through: JobID?,
    changed: Bool, formToken: String
  ) -> DashboardResponse {
    let verb = action == .retryDead ? "Re-queue" : "Remove"
    let what = "\(count) \(state.rawValue) job\(count == 1 ? "" : "s") of queue \(queue)"
    let warning =
      changed ? "<p class=\"notice error\">The number changed since you confirmed: check it again.</p>" : ""
    let form =
      count == 0
      ? "<p class=\"empty\">Nothing to do.</p>"
      : button(
        "\(verb) \(count) job\(count == 1 ? "" : "s")", action: "/bulk",
        fields: [
          ("action", action.rawValue), ("queue", queue), ("state", state.rawValue),
          ("expected", String(count)),
        ] + (through.map { [("through", String($0.rawValue))] } ?? []),
        formToken: formToken, style: action == .remove ? "danger" : "")
    return layout(
      "Confirm", page: "confirm",
      """
      <h1>\(html(verb)) \(html(what))?</h1>
      \(warning)
      <p>This applies to the \(html(state.rawValue)) jobs counted here: jobs added later are left alone, and
      if the number changed when you confirm, nothing is done and you are asked again.</p>
      <p class="actions">\(form) <a href="\(htmlBase)/jobs?queue=\(html(HTTPForm.encode(queue)))&amp;state=\(state.rawValue)">Cancel</a></p>
      """)
  }
}
