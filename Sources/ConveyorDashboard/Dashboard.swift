import Conveyor
import Foundation

/// Conveyor's web dashboard over a `JobStore`, transport-free: a request value in, a
/// response value out. Mount it in any HTTP server (Hummingbird, Vapor, `conveyor dashboard`'s
/// own) by converting the server's request to a ``DashboardRequest``, calling
/// ``respond(to:)`` and converting the ``DashboardResponse`` back.
///
/// Pages: queues with counts (the history's too), charts of the last hour and pause/resume; jobs
/// by queue, state (completed and cancelled included) and text; a job with its details, its
/// history (finishing time, run time, every attempt's error, output), retry, cancel and remove;
/// bulk retry and remove with a confirmation; every queue's stored schedules with pause/resume;
/// `api/queues` (JSON) and `metrics` (Prometheus text).
///
/// Security model:
/// - ``DashboardConfiguration/authorize`` (the host application's check) runs on every request
///   inside the mount path, after the `Host` check; a denied request never reaches the store. ``DashboardConfiguration/token`` adds a built-in sign-in:
///   `Authorization: Bearer TOKEN`, or a session cookie set by the sign-in form (a random
///   per-instance value, never the token itself; `HttpOnly`, `SameSite=Strict`). Comparisons are
///   constant-time.
/// - With ``DashboardConfiguration/allowedHosts``, the `Host` header must name one of them (or the
///   ``DashboardConfiguration/publicOrigin`` host), so a web page that rebinds its own host name
///   to the server's address (DNS rebinding) is refused.
/// - Every change is a POST carrying a per-instance random form token; a POST whose `Origin` is
///   neither the `Host` it was sent to (by host and port, `http` or `https`: a TLS proxy in front)
///   nor the public origin, or whose `Sec-Fetch-Site` is not `same-origin`, is refused too.
/// - Every response carries ``securityHeaders``: a strict Content-Security-Policy
///   (`default-src 'self'`, no inline script or style, `frame-ancestors 'none'`),
///   `X-Content-Type-Options: nosniff`, `Referrer-Policy: same-origin` and
///   `Cache-Control: no-store`. Every text from the store (payloads, errors, queue names) is
///   HTML-escaped; credentials in job details are redacted.
public final class Dashboard: Sendable {
  let store: any JobStore
  let configuration: DashboardConfiguration
  /// The mount path, checked: "" or `/a/b`.
  let base: String
  /// The form token every POST must carry (random per instance, shown only to allowed users).
  let formToken = randomToken()
  /// The session cookie's value, set by the sign-in form (random per instance).
  let session = randomToken()
  let clock = SystemJobClock()
  /// The pages, rendered with links under ``base``.
  let pages: DashboardPages

  static let cookieName = "conveyor_session"
  /// Jobs shown per page.
  static let pageSize = 50
  /// The most jobs one page reads from the store while filtering by text or by ready/scheduled.
  static let readLimit = 500

  /// A dashboard over `store`, configured by `configuration`.
  ///
  /// - Throws: ``DashboardConfigurationError`` when the mount path is not `""` or a plain path
  ///   such as `/admin/jobs`.
  public init(store: any JobStore, configuration: DashboardConfiguration = DashboardConfiguration()) throws {
    self.store = store
    self.configuration = configuration
    base = try configuration.checkedMountPath()
    // An empty or short token would let anyone guess in: the CLI asks for 16 characters too.
    if let token = configuration.token, token.count < 16 {
      throw DashboardConfigurationError(
        description:
          "the dashboard's token must be at least 16 characters (it has \(token.count)); use a random one, "
          + "e.g. from `openssl rand -hex 16`, or nil for no built-in sign-in")
    }
    pages = DashboardPages(base: base, signInHint: configuration.signInHint)
  }

  var secretHeaders: Set<String> { configuration.secretHeaders }

  // MARK: requests

  /// Answers one request: the mount prefix, the `Host` check, the host application's check, the
  /// built-in sign-in, the form checks of a POST, then the page or action; ``securityHeaders``
  /// are added to whatever came out, refusals included.
  public func respond(to request: DashboardRequest) async -> DashboardResponse {
    var response = await route(request)
    response.headers += Self.securityHeaders
    return response
  }

  /// The header fields every response carries: send them on your server's own refusals of
  /// dashboard requests too (a body too large, a timeout).
  public static let securityHeaders: [(name: String, value: String)] = [
    (
      "Content-Security-Policy",
      "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
        + "form-action 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'"
    ),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    // Not `no-referrer`: under it Chromium sends `Origin: null` with form posts, which the
    // cross-site check must refuse. `same-origin` keeps URLs from leaving the dashboard.
    ("Referrer-Policy", "same-origin"),
    ("Cache-Control", "no-store"),
    ("Cross-Origin-Opener-Policy", "same-origin"),
    ("Cross-Origin-Resource-Policy", "same-origin"),
  ]

  /// The path inside the mount prefix (`/` for the prefix itself), or nil when outside it.
  func localPath(_ path: String) -> String? {
    if base.isEmpty { return path.hasPrefix("/") ? path : nil }
    if path == base { return "/" }
    guard path.hasPrefix(base + "/") else { return nil }
    return String(path.dropFirst(base.count))
  }

  private func route(_ request: DashboardRequest) async -> DashboardResponse {
    // Outside the prefix nothing is the dashboard's, whatever the method.
    guard let path = localPath(request.path) else {
      return .text(404, "not found")
    }
    // Two `Host` fields name no one host (RFC 9112, 3.2): a server or proxy in front may go by
    // either.
    if request.headers.lazy.filter({ $0.name.lowercased() == "host" }).count > 1 {
      return .text(400, "a request must carry one Host header field")
    }
    guard ["GET", "HEAD", "POST"].contains(request.method) else {
      var refusal = DashboardResponse.text(405, "method not allowed")
      refusal.headers.append(("Allow", "GET, HEAD, POST"))  // RFC 9110, 15.5.6
      return refusal
    }
    if configuration.allowedHosts != nil, !hostIsAllowed(request.header("Host")) {
      return .text(421, "this dashboard answers only to its own host names (Host header refused)")
    }
    if case .deny(let response) = await configuration.authorize(request) { return response }
    if path.hasPrefix("/static/") { return DashboardAssets.response(for: path) }
    if configuration.token != nil && path == "/login" {
      return request.method == "POST" ? signIn(request) : pages.signIn(message: nil)
    }
    guard isAuthorized(request) else {
      if request.method == "GET" && path != "/metrics" && !path.hasPrefix("/api/") {
        var page = pages.signIn(message: nil)
        page.status = 401
        return page
      }
      return DashboardResponse(
        status: 401,
        headers: [("WWW-Authenticate", "Bearer"), ("Content-Type", "text/plain; charset=utf-8")],
        body: Data("a token is required\n".utf8))
    }
    do {
      if request.method == "POST" {
        if let refusal = refuseCrossSite(request) { return refusal }
        return try await post(path, form: request.form)
      }
      return try await get(path, query: request.queryItems)
    } catch let error as DashboardError {
      return pages.message(status: error.status, title: "Refused", text: error.text)
    } catch {
      return pages.message(status: 500, title: "Storage error", text: configuration.errorText(error))
    }
  }

  private func get(_ path: String, query: HTTPForm) async throws -> DashboardResponse {
    switch path {
    case "/": return try await queuesPage(notice: query["notice"])
    case "/jobs": return try await jobsPage(query)
    case "/schedules": return try await schedulesPage(notice: query["notice"])
    case "/confirm": return try await confirmPage(query)
    case "/metrics": return try await metrics()
    case "/api/queues": return try await queuesJSON()
    case "/api/activity": return try await activityFragment()
    default:
      if path.hasPrefix("/jobs/"), let id = Int64(path.dropFirst("/jobs/".count)), id > 0 {
        return try await jobPage(JobID(id), notice: query["notice"])
      }
      return pages.message(status: 404, title: "Not found", text: "No page at \(path).")
    }
  }

  private func post(_ path: String, form: HTTPForm) async throws -> DashboardResponse {
    switch path {
    case "/queues/pause", "/queues/resume":
      let queue = try queueName(form["queue"])
      try await store.setPaused(path == "/queues/pause", queue: queue)
      return redirect("/?notice=" + (path == "/queues/pause" ? "paused" : "resumed"))
    case "/schedules/pause", "/schedules/resume":
      return try await setSchedulePaused(path == "/schedules/pause", form: form)
    case "/bulk": return try await bulk(form)
    default:
      let parts = path.split(separator: "/")
      guard parts.count == 3, parts[0] == "jobs", let raw = Int64(parts[1]), raw > 0,
        ["retry", "cancel", "remove"].contains(parts[2])
      else { return pages.message(status: 404, title: "Not found", text: "No action at \(path).") }
      let id = JobID(raw)
      guard let record = try await store.job(id) else {
        return pages.message(status: 404, title: "Not found", text: "Job \(id) is gone.")
      }
      if parts[2] == "retry" {
        let count = try await store.requeueDead([id], queue: record.queue, clock: clock)
        return redirect("/jobs/\(id)?notice=" + (count == 1 ? "requeued" : "not-requeued"))
      }
      if parts[2] == "cancel" {
        // A waiting or running job becomes cancelled; a finished one is left as it is. The answer
        // says which, in words, on the job's page.
        let result = try await store.cancel([id], queue: record.queue, clock: clock).first ?? .notFound
        guard result != .notFound else {
          return pages.message(status: 404, title: "Not found", text: "Job \(id) is gone: removed or pruned.")
        }
        return redirect("/jobs/\(id)?notice=" + DashboardPages.noticeKey(result))
      }
      _ = try await store.remove([id], queue: record.queue)
      return redirect("/jobs?queue=\(HTTPForm.encode(record.queue))&notice=removed")
    }
  }

  // MARK: checks

  /// Whether a `Host` header names one of ``DashboardConfiguration/allowedHosts`` (the port
  /// left out meaning 80, as browsers do), or the public origin's host a proxy passed on.
  private func hostIsAllowed(_ header: String?) -> Bool {
    guard let header, let (host, headerPort) = DashboardOrigin.splitHost(header) else { return false }
    if let publicOrigin = configuration.publicOrigin, publicOrigin.matches(host: host, port: headerPort) {
      return true
    }
    return (configuration.allowedHosts ?? []).contains { allowed in
      guard let (allowedHost, allowedPort) = DashboardOrigin.splitHost(allowed) else { return false }
      return allowedHost == host && (allowedPort ?? 80) == (headerPort ?? 80)
    }
  }

  private func isAuthorized(_ request: DashboardRequest) -> Bool {
    guard let token = configuration.token else { return true }
    // The scheme name is case-insensitive (RFC 9110, 11.1).
    if let authorization = request.header("Authorization"), authorization.lowercased().hasPrefix("bearer ") {
      return constantTimeEquals(String(authorization.dropFirst("bearer ".count)), token)
    }
    for cookie in request.headers where cookie.name.lowercased() == "cookie" {
      for pair in cookie.value.split(separator: ";") {
        let parts = pair.trimmingCharacters(in: .whitespaces).split(separator: "=", maxSplits: 1)
        if parts.count == 2, parts[0] == Self.cookieName, constantTimeEquals(String(parts[1]), session) {
          return true
        }
      }
    }
    return false
  }

  /// The sign-in form's POST: the token for a session cookie.
  private func signIn(_ request: DashboardRequest) -> DashboardResponse {
    if let refusal = refuseCrossOrigin(request) { return refusal }
    guard let token = configuration.token, constantTimeEquals(request.form["token"] ?? "", token) else {
      var page = pages.signIn(message: "That token is not right.")
      page.status = 401
      return page
    }
    var response = redirect("/")
    // `Secure` when browsers reach the dashboard over https (a TLS proxy in front): the
    // public origin says so, or the sign-in form was posted from an https page (a proxy that
    // keeps `Host` needs no public origin; its `Origin` was checked to be this dashboard's).
    // Without it the browser would also send the cookie in clear to an http URL of the host.
    let fromHTTPS = request.header("Origin").flatMap(DashboardOrigin.init)?.scheme == "https"
    let secure = configuration.publicOrigin?.scheme == "https" || fromHTTPS ? "; Secure" : ""
    response.headers.append(
      (
        "Set-Cookie",
        "\(Self.cookieName)=\(session); Path=\(base.isEmpty ? "/" : base); HttpOnly; SameSite=Strict\(secure)"
      ))
    return response
  }

  /// Refuses a POST from another site: by `Sec-Fetch-Site`, `Origin`, content type and form token.
  private func refuseCrossSite(_ request: DashboardRequest) -> DashboardResponse? {
    if let refusal = refuseCrossOrigin(request) { return refusal }
    guard constantTimeEquals(request.form["csrf"] ?? "", formToken) else {
      return pages.message(
        status: 403, title: "Refused", text: "The form token is missing or out of date: reload the page.")
    }
    return nil
  }

  private func refuseCrossOrigin(_ request: DashboardRequest) -> DashboardResponse? {
    let refused = pages.message(
      status: 403, title: "Refused", text: "Cross-site requests are refused.")
    if let site = request.header("Sec-Fetch-Site"), site != "same-origin" { return refused }
    if let origin = request.header("Origin"), !isSameOrigin(origin, host: request.header("Host")) {
      return refused
    }
    let type = request.header("Content-Type")?.lowercased() ?? ""
    guard type.hasPrefix("application/x-www-form-urlencoded") else {
      return pages.message(status: 415, title: "Refused", text: "Actions are sent as forms.")
    }
    return nil
  }

  /// Whether an `Origin` header is this dashboard's: the public origin, or the `Host` the request
  /// was sent to, by host and port, over `http` or `https` (a TLS proxy that keeps the `Host`).
  /// `null` and any other origin are not.
  func isSameOrigin(_ header: String, host: String?) -> Bool {
    guard let origin = DashboardOrigin(header) else { return false }
    if let publicOrigin = configuration.publicOrigin, origin == publicOrigin { return true }
    guard let host, let (name, hostPort) = DashboardOrigin.splitHost(host) else { return false }
    return origin.matches(host: name, port: hostPort)
  }

  func redirect(_ location: String) -> DashboardResponse {
    DashboardResponse(status: 303, headers: [("Location", base + location)])
  }

  /// A queue name from a form or query: the rules of a queue identifier.
  /// A queue name from a link or a form: any name a store may hold (another program's, one
  /// stored before today's rules), not only those `JobQueue` accepts for a new queue; bounded, so
  /// a request cannot make the store look for a megabyte of name.
  func queueName(_ text: String?) throws -> String {
    guard let text, !text.isEmpty else { throw DashboardError(status: 400, text: "No queue named.") }
    guard text.utf8.count <= Self.longestQueueName else {
      throw DashboardError(status: 400, text: "Not a queue name: longer than \(Self.longestQueueName) bytes.")
    }
    return text
  }

  /// The longest queue name a request may name.
  static let longestQueueName = 1024
}

/// A request the dashboard refuses, with the status and the text shown.
struct DashboardError: Error {
  var status: Int
  var text: String
}

/// Equal strings, compared in time that depends only on their lengths.
func constantTimeEquals(_ given: String, _ expected: String) -> Bool {
  let a = Array(given.utf8)
  let b = Array(expected.utf8)
  var difference = UInt8(a.count == b.count ? 0 : 1)
  for index in 0..<b.count {
    difference |= (index < a.count ? a[index] : 0) ^ b[index]
  }
  return difference == 0
}

/// 32 random bytes from the system's secure generator, as hex.
func randomToken() -> String {
  var generator = SystemRandomNumberGenerator()
  return (0..<32).map { _ in String(format: "%02x", UInt8.random(in: 0...255, using: &generator)) }.joined()
}
