import Conveyor
import ConveyorDashboard
import ConveyorSQLite
import ConveyorTestSupport
import Foundation
import Testing

/// A dashboard over a real SQLite file in a temporary folder (counted by an
/// ``InstrumentedJobStore``, so a test can tell that nothing was read), and requests to it as a
/// host server would pass them: values, no sockets.
struct DashboardHarness {
  let folder: TemporaryFolder
  let store: InstrumentedJobStore
  let dashboard: Dashboard
  let clock = SystemJobClock()

  init(_ configuration: DashboardConfiguration = DashboardConfiguration()) throws {
    folder = try TemporaryFolder(prefix: "conveyor-dashboard-tests")
    store = InstrumentedJobStore(try SQLiteJobStore(path: folder.path("jobs.sqlite")))
    dashboard = try Dashboard(store: store, configuration: configuration)
  }

  /// Stores a schedule of `queue` firing every 5 minutes in Berlin, whose job is `payload`.
  func schedule(_ name: String, queue: String, payload: Data = Data("{}".utf8)) async throws {
    let definition = try ScheduleDefinition(
      name: name, timing: try ScheduleTiming(cron: "*/5 * * * *", timeZone: "Europe/Berlin"), payload: payload
    )
    _ = try await store.base.saveSchedules([definition], queue: queue, origin: .added, clock: clock)
  }

  /// The stored schedule `name` of `queue`, or nil.
  func storedSchedule(_ name: String, queue: String) async throws -> StoredSchedule? {
    try await store.base.schedules(queue: queue).first { $0.name == name }
  }

  /// The host name requests are sent to.
  static let host = "jobs.example.test"

  /// A GET (or another method) with `Host` and `Sec-Fetch-Site: same-origin`, as a browser on
  /// the dashboard's own page sends it.
  func get(_ target: String, method: String = "GET", headers: [(name: String, value: String)] = [])
    async -> Answer
  {
    let request = DashboardRequest(
      method: method, target: target, headers: [("Host", Self.host)] + headers)
    return Answer(await dashboard.respond(to: request))
  }

  /// A form POST from the dashboard's own origin; `origin` and `fetchSite` override what the
  /// browser would send, nil leaves the header out.
  func post(
    _ target: String, form: [(String, String)], origin: String? = "https://\(host)",
    fetchSite: String? = "same-origin", headers: [(name: String, value: String)] = []
  ) async -> Answer {
    var fields: [(name: String, value: String)] = [
      ("Host", Self.host), ("Content-Type", "application/x-www-form-urlencoded"),
    ]
    if let origin { fields.append(("Origin", origin)) }
    if let fetchSite { fields.append(("Sec-Fetch-Site", fetchSite)) }
    let body = form.map { "\(Self.encode($0.0))=\(Self.encode($0.1))" }.joined(separator: "&")
    let request = DashboardRequest(
      method: "POST", target: target, headers: fields + headers, body: Data(body.utf8))
    return Answer(await dashboard.respond(to: request))
  }

  /// The form token of the page at `target` (every form on it carries it; the queues page has
  /// forms once a queue has jobs).
  func formToken(_ target: String = "/", headers: [(name: String, value: String)] = []) async throws -> String
  {
    let page = await get(target, headers: headers)
    let marker = "name=\"csrf\" value=\""
    let start = try #require(page.body.range(of: marker), "no form token in \(target): \(page)")
    return String(page.body[start.upperBound...].prefix { $0 != "\"" })
  }

  /// Adds a job to `queue`, claims it and kills it: a dead job.
  func deadJob(queue: String, payload: Data = Data("{}".utf8)) async throws -> JobID {
    _ = try await store.enqueue([NewJob(payload: payload)], queue: queue, clock: clock)
    let lease = Lease(owner: "test", duration: .seconds(60))
    let claimed = try await store.settleAndClaim([], queue: queue, limit: 1, lease: lease, clock: clock)
      .claimed
    let claim = try #require(claimed.first?.claim)
    _ = try await store.settleAndClaim(
      [JobSettlement(claim: claim, action: .kill(error: "failed for good"))], queue: queue, limit: 0,
      lease: lease, clock: clock)
    return claim.id
  }

  /// Adds a waiting job to `queue`.
  func waitingJob(queue: String, payload: Data = Data("{}".utf8)) async throws -> JobID {
    try #require(try await store.enqueue([NewJob(payload: payload)], queue: queue, clock: clock).first).id
  }

  /// Adds a job to `queue` whose attempts fail with `errors`, one each (each retried at once),
  /// and whose last attempt completes with `output` after running `runDuration`: a completed job
  /// with a history.
  func completedJob(
    queue: String, errors: [String] = [], output: Data? = nil, runDuration: Duration = .milliseconds(1_500)
  ) async throws -> JobID {
    let id = try await waitingJob(queue: queue)
    let lease = Lease(owner: "test", duration: .seconds(60))
    for error in errors + [nil] {
      let claimed = try await store.settleAndClaim([], queue: queue, limit: 1, lease: lease, clock: clock)
        .claimed
      let claim = try #require(claimed.first { $0.id == id }?.claim, "job \(id) was not claimed")
      let settlement =
        error.map {
          JobSettlement(claim: claim, action: .retry(after: .zero, error: $0), runDuration: .milliseconds(5))
        }
        ?? JobSettlement(claim: claim, action: .complete, runDuration: runDuration, output: output)
      let batch = try await store.settleAndClaim(
        [settlement], queue: queue, limit: 0, lease: lease, clock: clock)
      #expect(batch.staleSettlements.isEmpty)
    }
    return id
  }

  static func encode(_ text: String) -> String {
    text.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? text
  }
}

/// A response with its body as text.
struct Answer: CustomStringConvertible {
  let response: DashboardResponse
  var status: Int { response.status }
  var body: String { String(decoding: response.body, as: UTF8.self) }
  func header(_ name: String) -> String? { response.header(name) }
  var description: String { "\(status) \(response.headers)\n\(body.prefix(2000))" }

  init(_ response: DashboardResponse) { self.response = response }

  /// Whether every one of the dashboard's security headers is there, with its value.
  var hasSecurityHeaders: Bool {
    Dashboard.securityHeaders.allSatisfy { expected in
      response.headers.contains { $0.name == expected.name && $0.value == expected.value }
    }
  }

  /// Every `href`, `src` and `action` attribute's value.
  var urls: [String] {
    var found: [String] = []
    for attribute in ["href=\"", "src=\"", "action=\""] {
      var rest = body[...]
      while let start = rest.range(of: attribute) {
        let value = rest[start.upperBound...].prefix { $0 != "\"" }
        found.append(String(value))
        rest = rest[start.upperBound...]
      }
    }
    return found
  }
}
