import Conveyor
import Foundation

/// The queues page's charts of the last hour: inline SVG rendered on the server (no script, no
/// inline style: colours come from classes in the stylesheet), one bar per minute, from the
/// store's activity table (`JobStore.activity(since:limit:)`, one row per queue and minute).
enum DashboardCharts {
  /// Minutes a chart shows, the current one included.
  static let minutes = 60
  static let width = 360
  static let height = 80
  static var slotWidth: Int { width / minutes }

  /// The first minute the charts show, for a page rendered at `now`.
  static func start(_ now: Date) -> Date {
    QueueActivity.minute(containing: now).addingTimeInterval(-Double(minutes - 1) * 60)
  }

  /// The chart slot (0 for ``start(_:)``'s minute) holding `minute`, or nil when the minute is
  /// outside the hour the charts show: older, or after the current minute (a worker whose clock is
  /// ahead of the dashboard's).
  static func slot(of minute: Date, start: Date) -> Int? {
    let index = Int((minute.timeIntervalSince(start) / 60).rounded(.down))
    return (0..<minutes).contains(index) ? index : nil
  }

  /// The rows of the hour the charts show at `now`: what the charts draw and `/metrics` sums.
  static func lastHour(_ rows: [QueueActivity], now: Date) -> [QueueActivity] {
    let start = start(now)
    return rows.filter { slot(of: $0.minute, start: start) != nil }
  }

  /// The "Last hour" section: each queue's throughput and wait charts, or a note when no queue is
  /// shown. The script swaps it for a fresh copy from `/api/activity`.
  static func section(queues: [String], activity: [ExactText: [QueueActivity]], now: Date) -> String {
    var body = """
      <section id="activity" class="activity" aria-labelledby="activity-title">
      <h2 id="activity-title">Last hour</h2>
      <p class="meta">Jobs finished per minute and the wait from enqueue to start, as the workers
      count them (sent to the store every 5 s; a worker that crashes loses its last seconds).</p>

      """
    for queue in queues {
      body += row(queue: queue, minutes: activity[ExactText(queue)] ?? [], now: now)
    }
    if queues.isEmpty { body += "<p class=\"empty\">No queues yet.</p>\n" }
    return body + "</section>\n"
  }

  /// One queue's two charts.
  static func row(queue: String, minutes rows: [QueueActivity], now: Date) -> String {
    let start = start(now)
    var slots = [QueueActivity?](repeating: nil, count: minutes)
    for row in rows {
      guard let index = slot(of: row.minute, start: start) else { continue }
      if slots[index] == nil { slots[index] = row } else { slots[index]?.add(row) }
    }
    var total = QueueActivity(queue: queue, minute: start)
    for case let slot? in slots { total.add(slot) }
    let name = html(queue)
    if total.isEmpty {
      return """
        <div class="activity-row quiet" data-chart-queue="\(name)">
        <h3>\(name)</h3>
        <p class="empty">No job started or finished in the last hour.</p>
        </div>

        """
    }
    return """
      <div class="activity-row" data-chart-queue="\(name)">
      <h3>\(name)</h3>
      <figure class="chart">
      \(throughput(slots, start: start, total: total))
      <figcaption>\(total.finished) finished: \(total.succeeded) succeeded, \(total.retried) retried, \(total.died) died</figcaption>
      </figure>
      <figure class="chart">
      \(waits(slots, start: start, total: total))
      <figcaption>\(waitCaption(total))</figcaption>
      </figure>
      </div>

      """
  }

  static func waitCaption(_ total: QueueActivity) -> String {
    guard let mean = total.meanWaitMilliseconds else { return "No job started" }
    return "Wait to start: mean \(html(duration(milliseconds: mean))), longest "
      + "\(html(duration(milliseconds: Double(total.waitMillisecondsMax)))) over \(total.started) start\(total.started == 1 ? "" : "s")"
  }

  /// Stacked bars: succeeded, retried, died per minute.
  static func throughput(_ slots: [QueueActivity?], start: Date, total: QueueActivity) -> String {
    let peak = max(1, slots.map { $0?.finished ?? 0 }.max() ?? 0)
    var bars = ""
    for (index, slot) in slots.enumerated() {
      guard let slot, slot.finished > 0 else { continue }
      var y = Double(height)
      var rects = ""
      for (value, style) in [(slot.succeeded, "ok"), (slot.retried, "retry"), (slot.died, "died")]
      where value > 0 {
        let h = Double(value) / Double(peak) * Double(height - 4)
        y -= h
        rects += rect(x: index * slotWidth, y: y, height: h, style: style)
      }
      let label =
        "\(clock(slot.minute)): \(slot.succeeded) succeeded, \(slot.retried) retried, \(slot.died) died"
      bars += "<g><title>\(html(label))</title>\(rects)</g>"
    }
    return svg(
      label: "Jobs finished per minute in the last hour: \(total.finished) in all, peak \(peak) a minute",
      data: "data-finished=\"\(total.finished)\" data-peak=\"\(peak)\"", bars: bars, start: start)
  }

  /// Bars of each minute's mean wait from enqueue to start.
  static func waits(_ slots: [QueueActivity?], start: Date, total: QueueActivity) -> String {
    let means = slots.map { $0?.meanWaitMilliseconds ?? 0 }
    let peak = max(1, means.max() ?? 0)
    var bars = ""
    for (index, slot) in slots.enumerated() {
      guard let slot, let mean = slot.meanWaitMilliseconds else { continue }
      let h = max(1, mean / peak * Double(height - 4))
      let label =
        "\(clock(slot.minute)): mean wait \(duration(milliseconds: mean)), longest "
        + "\(duration(milliseconds: Double(slot.waitMillisecondsMax))), \(slot.started) started"
      bars +=
        "<g><title>\(html(label))</title>\(rect(x: index * slotWidth, y: Double(height) - h, height: h, style: "wait"))</g>"
    }
    return svg(
      label: "Mean wait from enqueue to start per minute in the last hour; longest mean "
        + duration(milliseconds: peak),
      data: "data-started=\"\(total.started)\"", bars: bars, start: start)
  }

  private static func rect(x: Int, y: Double, height: Double, style: String) -> String {
    "<rect class=\"\(style)\" x=\"\(x)\" y=\"\(format(y))\" width=\"\(slotWidth - 1)\" height=\"\(format(height))\"/>"
  }

  private static func svg(label: String, data: String, bars: String, start: Date) -> String {
    """
    <svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 \(width) \(height + 14)" role="img" aria-label="\(html(label))" \(data)>\
    <line class="axis" x1="0" y1="\(height)" x2="\(width)" y2="\(height)"/>\(bars)\
    <text class="tick" x="0" y="\(height + 12)">\(clock(start))</text>\
    <text class="tick" x="\(width)" y="\(height + 12)" text-anchor="end">now</text></svg>
    """
  }

  private static func format(_ value: Double) -> String { String(format: "%.1f", value) }

  /// `HH:MM` in UTC.
  static func clock(_ date: Date) -> String {
    let seconds = Int64(date.timeIntervalSince1970.rounded(.down))
    let minutes = ((seconds / 60) % 1440 + 1440) % 1440
    return String(format: "%02d:%02d", minutes / 60, minutes % 60) + " UTC"
  }

  /// A duration a person reads: "850 ms", "3.2 s", "4 min", "2.5 h".
  static func duration(milliseconds: Double) -> String {
    if milliseconds < 1000 { return "\(Int(milliseconds.rounded())) ms" }
    let seconds = milliseconds / 1000
    if seconds < 60 { return String(format: "%.1f s", seconds) }
    if seconds < 3600 { return "\(Int((seconds / 60).rounded())) min" }
    return String(format: "%.1f h", seconds / 3600)
  }
}
