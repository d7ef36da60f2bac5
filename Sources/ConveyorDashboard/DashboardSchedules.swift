import Conveyor
import Foundation

/// The schedules page (`/schedules`): every queue's stored schedules, read with
/// `schedules(queue: nil)` (one read of the schedules table), with pause and resume forms that
/// post to `/schedules/pause` and `/schedules/resume` as the queues' forms do (form token, same
/// origin).
extension Dashboard {
  /// A schedule as the page shows it.
  struct ScheduleRow {
    var queue: String
    var name: String
    /// `cron EXPR` or `every N s`.
    var spacing: String
    var timeZone: String
    /// `skip`, `latest` or `all (at most N)`.
    var catchUp: String
    /// `active`, `paused` or `inactive`.
    var state: String
    var paused: Bool
    /// The next slot of a schedule that fires, in UTC and in its zone with the offset.
    var next: (utc: String, local: String)?
    var lastSlot: String?
    /// What each slot adds, as the jobs page summarizes a job.
    var job: String
  }

  /// The longest schedule name a form may name (stored names may predate today's rules).
  static let longestScheduleName = 1024

  func schedulesPage(notice: String?) async throws -> DashboardResponse {
    let now = clock.now()
    let rows = try await store.schedules(queue: nil).map { scheduleRow($0, now: now) }
    return pages.schedules(rows, notice: notice, formToken: formToken)
  }

  /// Pauses or resumes the schedule a form names.
  func setSchedulePaused(_ paused: Bool, form: HTTPForm) async throws -> DashboardResponse {
    let queue = try queueName(form["queue"])
    guard let name = form["name"], !name.isEmpty, name.utf8.count <= Self.longestScheduleName else {
      throw DashboardError(status: 400, text: "No schedule named, or not a schedule name.")
    }
    guard try await store.setSchedulePaused(paused, name: name, queue: queue, clock: clock) else {
      return pages.message(
        status: 404, title: "Not found", text: "Queue \(queue) has no schedule \(name): it was removed.")
    }
    return redirect("/schedules?notice=" + (paused ? "schedule-paused" : "schedule-resumed"))
  }

  func scheduleRow(_ schedule: StoredSchedule, now: Date) -> ScheduleRow {
    let timing = schedule.definition.timing
    let spacing: String
    let zone: String
    switch timing.spacing {
    case .cron(let expression):
      spacing = "cron \(expression.text)"
      zone = timing.timeZoneName
    case .every(let interval):
      spacing = "every \(interval.components.seconds) s"
      zone = "UTC"
    }
    let catchUp =
      switch timing.catchUp {
      case .skip: "skip"
      case .latest: "latest"
      case .all(let bound): "all (at most \(bound))"
      }
    let next = schedule.fires ? timing.nextSlot(after: now) : nil
    return ScheduleRow(
      queue: schedule.queue, name: schedule.name, spacing: spacing, timeZone: zone, catchUp: catchUp,
      state: !schedule.active ? "inactive" : schedule.paused ? "paused" : "active", paused: schedule.paused,
      next: next.map {
        (
          timestamp($0),
          $0.ISO8601Format(Date.ISO8601FormatStyle(timeZoneSeparator: .colon, timeZone: timing.timeZone))
        )
      },
      lastSlot: schedule.lastSlot.map(timestamp),
      job: cut(jobSummary(schedule.definition.payload), to: Self.shownSummary))
  }

  /// A one-line description of a schedule's job, from the application's
  /// ``DashboardConfiguration/describe`` (a URL's credentials redacted, no header or body).
  func jobSummary(_ payload: Data) -> String {
    switch describe(payload) {
    case .http(let method, let url, _, _, _): "http \(method) \(url)"
    case .exec(let arguments, _, _): "exec " + arguments.joined(separator: " ")
    case .workflow(let run): "a run of workflow \(run.workflow)"
    case .unknown: "\(payload.count) bytes of payload"
    }
  }
}

extension DashboardPages {
  func schedules(_ rows: [Dashboard.ScheduleRow], notice key: String?, formToken: String) -> DashboardResponse
  {
    var body = "<h1>Schedules</h1>\n\(notice(key))\n"
    if rows.isEmpty {
      body +=
        "<p class=\"empty\">No schedules: add one with <code>conveyor schedule add</code>, or declare them "
        + "in code with <code>JobQueue.declareSchedules</code>.</p>\n"
      return layout("Schedules", page: "schedules", body)
    }
    body += """
      <table class="schedules">
      <thead><tr><th scope="col">Queue</th><th scope="col">Schedule</th><th scope="col">Spacing</th>
      <th scope="col">Time zone</th><th scope="col" title="What happens to slots missed while no worker ran">Catch-up</th>
      <th scope="col">State</th><th scope="col">Next (UTC)</th><th scope="col">Next (its zone)</th>
      <th scope="col" title="The latest slot fired or passed over">Last slot</th><th scope="col">Job</th><th scope="col">Actions</th></tr></thead>
      <tbody>

      """
    for row in rows {
      let badge =
        switch row.state {
        case "paused": "<span class=\"badge paused\">paused</span>"
        case "inactive":
          "<span class=\"badge inactive\" title=\"Declared by code that no longer declares it: kept, never fired\">inactive</span>"
        default: "<span class=\"badge\">active</span>"
        }
      let toggle = button(
        row.paused ? "Resume" : "Pause", action: row.paused ? "/schedules/resume" : "/schedules/pause",
        fields: [("queue", row.queue), ("name", row.name)], formToken: formToken)
      let none = "<span class=\"none\">—</span>"
      body += """
        <tr data-queue="\(html(HTTPForm.encode(row.queue)))" data-schedule="\(html(HTTPForm.encode(row.name)))">
        <td><a href="\(html(base + "/jobs?queue=" + HTTPForm.encode(row.queue)))">\(html(row.queue))</a></td>
        <th scope="row">\(html(row.name))</th>
        <td data-field="spacing"><code>\(html(row.spacing))</code></td>
        <td data-field="zone">\(html(row.timeZone))</td>
        <td data-field="catch-up">\(html(row.catchUp))</td>
        <td data-field="state">\(badge)</td>
        <td data-field="next">\(row.next.map { "<time>\(html($0.utc))</time>" } ?? none)</td>
        <td data-field="next-local">\(row.next.map { "<time>\(html($0.local))</time>" } ?? none)</td>
        <td data-field="last-slot">\(row.lastSlot.map { "<time>\(html($0))</time>" } ?? none)</td>
        <td class="summary" data-field="job">\(html(row.job))</td>
        <td class="actions">\(toggle)</td>
        </tr>

        """
    }
    body += "</tbody>\n</table>\n"
    body +=
      "<p class=\"meta\">A paused schedule skips the slots that pass until it is resumed. Every worker of "
      + "a queue fires its schedules; each slot adds one job.</p>"
    return layout("Schedules", page: "schedules", body)
  }
}
