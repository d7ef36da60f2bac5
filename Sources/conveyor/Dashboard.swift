import Conveyor
import ConveyorHTTPServer
import ConveyorSQLite
import Foundation
import Synchronization

/// `conveyor dashboard`: a web page over the store, served by ``HTTPServer``.
///
/// Security model:
/// - Loopback by default. Any other address needs a token (`--token` or
///   `CONVEYOR_DASHBOARD_TOKEN`), checked on every request: `Authorization: Bearer TOKEN`, or a
///   session cookie set by the sign-in form (a random per-process value, never the token itself;
///   `HttpOnly`, `SameSite=Strict`). Comparisons are constant-time.
/// - On loopback the `Host` header must name the loopback address and port (or the `--public-url`
///   host), so a web page that rebinds its own host name to 127.0.0.1 (DNS rebinding) is refused.
/// - Every change is a POST carrying a per-process random form token; a POST whose `Origin` is
///   neither the `Host` it was sent to (by host and port, `http` or `https`: a TLS proxy in front)
///   nor the `--public-url`, or whose `Sec-Fetch-Site` is not `same-origin`, is refused too.
/// - Every response carries a strict Content-Security-Policy (`default-src 'self'`, no inline
///   script or style, `frame-ancestors 'none'`), `X-Content-Type-Options: nosniff`,
///   `Referrer-Policy: same-origin` and `Cache-Control: no-store`. Every text from the store (payloads,
///   errors, queue names) is HTML-escaped; credentials in stored HTTP jobs are redacted.
struct Dashboard: Sendable {
  let store: any JobStore
  /// The database as pages show it: a path, or a PostgreSQL URL without its password.
  let database: String
  /// The access token; nil on loopback without one.
  let token: String?
  /// Whether the server listens on a loopback address.
  let loopback: Bool
  /// Header names whose values are never shown (lower-cased).
  let secretHeaders: Set<String>
  /// The form token every POST must carry (random per process, shown only to signed-in users).
  let formToken = randomToken()
  /// The session cookie's value, set by the sign-in form (random per process).
  let session = randomToken()
  /// The port, set once the server is bound (for the `Host` check).
  let port: UInt16
  /// The address it listens on, as given: a loopback `Host` header may name it.
  var listenHost = "127.0.0.1"
  /// The origin browsers reach the dashboard at when it differs from the listening address
  /// (`--public-url`, e.g. a TLS proxy's `https://dash.example.com`).
  var publicOrigin: WebOrigin?
  let clock = SystemJobClock()

  static let defaultSecretHeaders: Set<String> = [
    "authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key", "x-auth-token",
  ]
  static let cookieName = "conveyor_session"
  /// Jobs shown per page.
  static let pageSize = 50
  /// The most jobs one page reads from the store while filtering by text or by ready/scheduled.
  static let readLimit = 500

  // MARK: the command

  static let spec = CommandSpec(
    name: "dashboard", operands: "", summary: "a web page with queues, jobs, actions and /metrics",
    options: [
      OptionSpec(
        names: ["--listen"], value: "HOST:PORT",
        help: "address to serve on (default 127.0.0.1:8080; port 0 picks a free one)"),
      OptionSpec(
        names: ["--token"], value: "TOKEN",
        help: "required off loopback (or $CONVEYOR_DASHBOARD_TOKEN); at least 16 characters"),
      OptionSpec(
        names: ["--token-file"], value: "PATH",
        help: "the token, read from a file (not shown by ps, unlike --token)"),
      OptionSpec(
        names: ["--public-url"], value: "URL",
        help: "the address browsers use, behind a proxy (e.g. https://dash.example.com)"),
      OptionSpec(
        names: ["--secret-header"], value: "NAME",
        help: "another header whose value is never shown; repeat for more"),
    ],
    details: """
      Serves every queue of the database. Open the printed URL in a browser; with a token, sign in
      with it (scripts send 'Authorization: Bearer TOKEN'). /metrics serves Prometheus text.
      Behind a reverse proxy (TLS), pass --public-url with the address browsers use.
      Authorization, Proxy-Authorization, Cookie, Set-Cookie, X-Api-Key and X-Auth-Token values are
      never shown. Stops on SIGINT or SIGTERM. Exit code 1 if the address cannot be used.
      """)

  static func run(_ arguments: inout Arguments, _ context: CLI.Context) async throws -> Int32 {
    let listen = arguments.option("--listen") ?? "127.0.0.1:8080"
    let token = try Self.token(arguments)
    let extraSecrets = arguments.options("--secret-header").map { $0.lowercased() }
    let publicOrigin = try arguments.option("--public-url").map(Self.publicOrigin)
    try arguments.finish()
    let (host, port) = try parseListen(listen)
    let loopback = isLoopback(host)
    if !loopback && token == nil {
      throw UsageError(
        description:
          "serving on \(host) (not loopback) needs a token: pass --token or set CONVEYOR_DASHBOARD_TOKEN")
    }
    let store = try context.openStore()
    let bound = Mutex<Dashboard?>(nil)
    let server: HTTPServer
    do {
      server = try HTTPServer(host: host, port: port, refusalHeaders: Self.securityHeaders) { request in
        guard let dashboard = bound.withLock({ $0 }) else { return .text(503, "starting") }
        return await dashboard.respond(to: request)
      }
    } catch {
      printError("conveyor: \(printable(String(describing: error)))")
      return ExitCode.failure.rawValue
    }
    bound.withLock {
      $0 = Dashboard(
        store: store, database: context.databaseDescription, token: token, loopback: loopback,
        secretHeaders: defaultSecretHeaders.union(extraSecrets), port: server.port, listenHost: host,
        publicOrigin: publicOrigin)
    }
    let shownHost = host.contains(":") ? "[\(host)]" : host
    output(
      "dashboard: http://\(shownHost):\(server.port)/ (database \(shown(context.databaseDescription)))")
    if let publicOrigin { output("dashboard: browsers use \(publicOrigin.text)/") }
    if token != nil { output("sign in with the token; scripts send 'Authorization: Bearer TOKEN'") }
    let stop = AsyncStream<Void>.makeStream()
    let signals = SignalWatcher { _ in stop.continuation.finish() }
    for await _ in stop.stream {}
    signals.cancel()
    output("dashboard: stopping")
    // The grace period bounds the whole exit: requests still running when it ends are answered
    // 503, and a store that does not close by then (PostgreSQL down, its calls retrying) is left
    // to the process's exit.
    let deadline = ContinuousClock.now + Self.gracePeriod
    // `stop` waits for requests in progress, whose handlers need the cooperative pool: wait on a
    // thread of its own, not on one of the pool's.
    await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
      Thread {
        server.stop(gracePeriod: Self.gracePeriod)
        continuation.resume()
      }.start()
    }
    if !(await context.close(within: max(.milliseconds(500), ContinuousClock.now.duration(to: deadline)))) {
      printError("conveyor: the database did not close in time (requests still waiting for it); exiting")
    }
    return ExitCode.success.rawValue
  }

  /// How long a stop lets requests in progress finish.
  static let gracePeriod = Duration.seconds(5)

  /// The token from `--token`, `--token-file` or `CONVEYOR_DASHBOARD_TOKEN`, checked; warns when
  /// it was given on the command line, where every user of the machine can read it.
  static func token(_ arguments: Arguments) throws -> String? {
    let given = arguments.option("--token")
    let file = arguments.option("--token-file")
    // Warned of first: a --token is on the command line whatever else is wrong.
    if given != nil {
      CLI.warnOfSecretOnCommandLine(
        "--token is on the command line, where every user of this machine can read it (ps, /proc); "
          + "use --token-file PATH or CONVEYOR_DASHBOARD_TOKEN instead")
    }
    if given != nil && file != nil { throw UsageError(description: "use --token or --token-file, not both") }
    var token = given
    if let file {
      guard let handle = FileHandle(forReadingAtPath: file) else {
        throw UsageError(description: "cannot read --token-file \"\(printable(file))\"")
      }
      defer { closeQuietly(handle) }
      let data: Data
      do {
        data = try handle.read(upToCount: 4096) ?? Data()
      } catch {
        throw UsageError(
          description: "cannot read --token-file \"\(printable(file))\": \(error.localizedDescription)")
      }
      // The first line, without its line break and surrounding spaces (`echo TOKEN > file`).
      let text = String(decoding: data, as: UTF8.self)
      token = String(text.prefix { $0 != "\n" && $0 != "\r\n" && $0 != "\r" }).trimmingCharacters(
        in: .whitespaces)
    } else if given == nil {
      let environment = ProcessInfo.processInfo.environment["CONVEYOR_DASHBOARD_TOKEN"]
      token = environment?.isEmpty == false ? environment : nil
    }
    if let token, token.count < 16 {
      throw UsageError(description: "the dashboard token must be at least 16 characters")
    }
    return token
  }

  /// Parses `--public-url`: `http` or `https`, a host, an optional port, no path but `/`.
  ///
  /// The host is kept as browsers send it in `Host` and `Origin`: in ASCII, an internationalised
  /// name in its `xn--` form (`https://bücher.example` is `xn--bcher-kva.example`, mapped and
  /// encoded by Foundation's IDNA, as browsers do), never decoded to Unicode. A host holding
  /// anything but letters, digits, `-`, `.` and `_` (or an IPv6 address in brackets), such as a
  /// percent-encoded control character, is refused.
  static func publicOrigin(_ text: String) throws -> WebOrigin {
    let invalid = UsageError(
      description: "--public-url must be the address browsers use, such as https://dash.example.com "
        + "or http://10.0.0.5:8080, without a path; got \"\(printable(text))\"")
    guard let components = URLComponents(string: text), let scheme = components.scheme,
      components.user == nil, components.password == nil, components.query == nil,
      components.fragment == nil, components.path.isEmpty || components.path == "/"
    else { throw invalid }
    let host = components.encodedHost ?? ""
    guard isHostAsBrowsersSendIt(host) else {
      throw UsageError(
        description: "--public-url must name a host by name (an internationalised one in Unicode or "
          + "in its xn-- form) or by IP address, without percent-encoding; got \"\(printable(text))\"")
    }
    guard let origin = WebOrigin(scheme: scheme, host: host, port: components.port) else { throw invalid }
    return origin
  }

  /// Whether `host` is an ASCII host name (letters, digits, `-`, `.`, `_`) or an IPv6 address in
  /// brackets: what browsers write in `Host` and `Origin`.
  static func isHostAsBrowsersSendIt(_ host: String) -> Bool {
    guard !host.isEmpty, host.unicodeScalars.allSatisfy(\.isASCII) else { return false }
    if host.hasPrefix("[") {
      return host.count > 2 && host.hasSuffix("]")
        && host.dropFirst().dropLast().allSatisfy { $0.isHexDigit || $0 == ":" || $0 == "." }
    }
    return host.allSatisfy { $0.isLetter || $0.isNumber || $0 == "-" || $0 == "." || $0 == "_" }
  }

  /// `HOST:PORT`, `[IPv6]:PORT` or `PORT` (on 127.0.0.1).
  static func parseListen(_ text: String) throws -> (String, UInt16) {
    let invalid = UsageError(
      description: "--listen must be HOST:PORT, [IPV6]:PORT or PORT, got \"\(printable(text))\"")
    var host = "127.0.0.1"
    var portText = text
    if text.hasPrefix("[") {
      guard let close = text.firstIndex(of: "]"), text[text.index(after: close)...].hasPrefix(":") else {
        throw invalid
      }
      host = String(text[text.index(after: text.startIndex)..<close])
      portText = String(text[text.index(close, offsetBy: 2)...])
    } else if let colon = text.lastIndex(of: ":") {
      host = String(text[..<colon])
      portText = String(text[text.index(after: colon)...])
    }
    guard !host.isEmpty, let port = UInt16(portText) else { throw invalid }
    return (host, port)
  }

  /// `localhost`, `::1`, or a numeric IPv4 address in 127.0.0.0/8 (not a host name that merely
  /// starts with "127.").
  static func isLoopback(_ host: String) -> Bool {
    if host == "localhost" || host == "::1" { return true }
    let octets = host.split(separator: ".", omittingEmptySubsequences: false)
    return octets.count == 4 && octets[0] == "127"
      && octets.allSatisfy { $0.count <= 3 && UInt8($0) != nil }
  }

  // MARK: requests

  /// Answers one request: checks, then the route, then the security headers on whatever came out.
  func respond(to request: HTTPServerRequest) async -> HTTPServerResponse {
    var response = await route(request)
    response.headers += Self.securityHeaders
    return response
  }

  static let securityHeaders: [(name: String, value: String)] = [
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

  private func route(_ request: HTTPServerRequest) async -> HTTPServerResponse {
    guard ["GET", "HEAD", "POST"].contains(request.method) else {
      return .text(405, "method not allowed")
    }
    if loopback, !hostIsAllowed(request.header("Host")) {
      return .text(421, "this dashboard answers only to its loopback address (Host header refused)")
    }
    let path = request.path
    if path.hasPrefix("/static/") { return DashboardAssets.response(for: path) }
    if token != nil && path == "/login" {
      return request.method == "POST" ? signIn(request) : DashboardPages.signIn(message: nil)
    }
    guard isAuthorized(request) else {
      if request.method == "GET" && path != "/metrics" && !path.hasPrefix("/api/") {
        var page = DashboardPages.signIn(message: nil)
        page.status = 401
        return page
      }
      return HTTPServerResponse(
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
      return DashboardPages.message(status: error.status, title: "Refused", text: error.text)
    } catch {
      return DashboardPages.message(
        status: 500, title: "Storage error", text: Secrets.scrub(String(describing: error)))
    }
  }

  private func get(_ path: String, query: HTTPForm) async throws -> HTTPServerResponse {
    switch path {
    case "/": return try await queuesPage(notice: query["notice"])
    case "/jobs": return try await jobsPage(query)
    case "/confirm": return try await confirmPage(query)
    case "/metrics": return try await metrics()
    case "/api/queues": return try await queuesJSON()
    case "/api/activity": return try await activityFragment()
    default:
      if path.hasPrefix("/jobs/"), let id = Int64(path.dropFirst("/jobs/".count)), id > 0 {
        return try await jobPage(JobID(id), notice: query["notice"])
      }
      return DashboardPages.message(status: 404, title: "Not found", text: "No page at \(path).")
    }
  }

  private func post(_ path: String, form: HTTPForm) async throws -> HTTPServerResponse {
    switch path {
    case "/queues/pause", "/queues/resume":
      let queue = try queueName(form["queue"])
      try await store.setPaused(path == "/queues/pause", queue: queue)
      return redirect("/?notice=" + (path == "/queues/pause" ? "paused" : "resumed"))
    case "/bulk": return try await bulk(form)
    default:
      let parts = path.split(separator: "/")
      guard parts.count == 3, parts[0] == "jobs", let raw = Int64(parts[1]), raw > 0,
        ["retry", "remove"].contains(parts[2])
      else { return DashboardPages.message(status: 404, title: "Not found", text: "No action at \(path).") }
      let id = JobID(raw)
      guard let record = try await store.job(id) else {
        return DashboardPages.message(status: 404, title: "Not found", text: "Job \(id) is gone.")
      }
      if parts[2] == "retry" {
        let count = try await store.requeueDead([id], queue: record.queue, clock: clock)
        return redirect("/jobs/\(id)?notice=" + (count == 1 ? "requeued" : "not-requeued"))
      }
      _ = try await store.remove([id], queue: record.queue)
      return redirect("/jobs?queue=\(HTTPForm.encode(record.queue))&notice=removed")
    }
  }

  // MARK: checks

  /// Whether a `Host` header names this loopback server: its loopback address and port (the port
  /// left out when it is 80, as browsers do), or the `--public-url` host a proxy passed on.
  private func hostIsAllowed(_ header: String?) -> Bool {
    guard let header, let (host, headerPort) = WebOrigin.splitHost(header) else { return false }
    if let publicOrigin, publicOrigin.matches(host: host, port: headerPort) { return true }
    guard (headerPort ?? 80) == Int(port) else { return false }
    let listening = listenHost.lowercased()
    return ["127.0.0.1", "localhost", "::1", listening].contains(host)
  }

  private func isAuthorized(_ request: HTTPServerRequest) -> Bool {
    guard let token else { return true }
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
  private func signIn(_ request: HTTPServerRequest) -> HTTPServerResponse {
    if let refusal = refuseCrossOrigin(request) { return refusal }
    guard let token, constantTimeEquals(request.form["token"] ?? "", token) else {
      var page = DashboardPages.signIn(message: "That token is not right.")
      page.status = 401
      return page
    }
    var response = redirect("/")
    // `Secure` when browsers reach the dashboard over https (a TLS proxy in front): the
    // `--public-url` says so, or the sign-in form was posted from an https page (a proxy that
    // keeps `Host` needs no `--public-url`; its `Origin` was checked to be this dashboard's).
    // Without it the browser would also send the cookie in clear to an http URL of the host.
    let fromHTTPS = request.header("Origin").flatMap(WebOrigin.init)?.scheme == "https"
    let secure = publicOrigin?.scheme == "https" || fromHTTPS ? "; Secure" : ""
    response.headers.append(
      ("Set-Cookie", "\(Self.cookieName)=\(session); Path=/; HttpOnly; SameSite=Strict\(secure)"))
    return response
  }

  /// Refuses a POST from another site: by `Sec-Fetch-Site`, `Origin`, content type and form token.
  private func refuseCrossSite(_ request: HTTPServerRequest) -> HTTPServerResponse? {
    if let refusal = refuseCrossOrigin(request) { return refusal }
    guard constantTimeEquals(request.form["csrf"] ?? "", formToken) else {
      return DashboardPages.message(
        status: 403, title: "Refused", text: "The form token is missing or out of date: reload the page.")
    }
    return nil
  }

  private func refuseCrossOrigin(_ request: HTTPServerRequest) -> HTTPServerResponse? {
    let refused = DashboardPages.message(
      status: 403, title: "Refused", text: "Cross-site requests are refused.")
    if let site = request.header("Sec-Fetch-Site"), site != "same-origin" { return refused }
    if let origin = request.header("Origin"), !isSameOrigin(origin, host: request.header("Host")) {
      return refused
    }
    let type = request.header("Content-Type")?.lowercased() ?? ""
    guard type.hasPrefix("application/x-www-form-urlencoded") else {
      return DashboardPages.message(status: 415, title: "Refused", text: "Actions are sent as forms.")
    }
    return nil
  }

  /// Whether an `Origin` header is this dashboard's: the `--public-url`, or the `Host` the request
  /// was sent to, by host and port, over `http` or `https` (a TLS proxy that keeps the `Host`).
  /// `null` and any other origin are not.
  func isSameOrigin(_ header: String, host: String?) -> Bool {
    guard let origin = WebOrigin(header) else { return false }
    if let publicOrigin, origin == publicOrigin { return true }
    guard let host, let (name, hostPort) = WebOrigin.splitHost(host) else { return false }
    return origin.matches(host: name, port: hostPort)
  }

  func redirect(_ location: String) -> HTTPServerResponse {
    HTTPServerResponse(status: 303, headers: [("Location", location)])
  }

  /// A queue name from a form or query: the rules of a queue identifier.
  func queueName(_ text: String?) throws -> String {
    guard let text else { throw DashboardError(status: 400, text: "No queue named.") }
    do {
      try JobQueueConfiguration.validate(identifier: text)
    } catch {
      throw DashboardError(status: 400, text: "Not a queue name: \(text)")
    }
    return text
  }
}

/// A web origin, `scheme://host[:port]`, compared as browsers compare them: scheme and host in
/// lower case, the port the scheme's default when none is written.
struct WebOrigin: Equatable, Sendable {
  var scheme: String
  var host: String
  var port: Int

  init?(scheme: String, host: String, port: Int?) {
    let scheme = scheme.lowercased()
    guard scheme == "http" || scheme == "https", !host.isEmpty else { return nil }
    let port = port ?? (scheme == "https" ? 443 : 80)
    guard (1...65_535).contains(port) else { return nil }
    self.scheme = scheme
    self.host = Self.bare(host.lowercased())
    self.port = port
  }

  /// Parses an `Origin` header (`https://host:port`); nil for `null` or anything else.
  init?(_ header: String) {
    guard let separator = header.range(of: "://"),
      let (host, port) = Self.splitHost(String(header[separator.upperBound...]))
    else { return nil }
    self.init(scheme: String(header[..<separator.lowerBound]), host: host, port: port)
  }

  /// `host[:port]` or `[v6]:port`, as a `Host` header or an origin's end gives it: the host in
  /// lower case without brackets, and the port if written; nil when malformed.
  static func splitHost(_ text: String) -> (host: String, port: Int?)? {
    let text = text.lowercased()
    var host = text
    var portText: Substring?
    if text.hasPrefix("[") {
      guard let close = text.firstIndex(of: "]") else { return nil }
      host = String(text[text.index(after: text.startIndex)..<close])
      let rest = text[text.index(after: close)...]
      if !rest.isEmpty {
        guard rest.hasPrefix(":") else { return nil }
        portText = rest.dropFirst()
      }
    } else if let colon = text.lastIndex(of: ":") {
      host = String(text[..<colon])
      portText = text[text.index(after: colon)...]
      // An IPv6 address is written in brackets; a bare one is malformed.
      guard !host.contains(":") else { return nil }
    }
    guard !host.isEmpty, !host.contains("/"), !host.contains("@") else { return nil }
    guard let portText else { return (host, nil) }
    guard portText.count <= 5, let port = Int(portText), (1...65_535).contains(port) else { return nil }
    return (host, port)
  }

  private static func bare(_ host: String) -> String {
    host.hasPrefix("[") && host.hasSuffix("]") ? String(host.dropFirst().dropLast()) : host
  }

  /// Whether a `Host` header's host and port name this origin (no port: the scheme's default).
  func matches(host: String, port: Int?) -> Bool {
    self.host == Self.bare(host) && self.port == (port ?? (scheme == "https" ? 443 : 80))
  }

  /// `scheme://host[:port]`, the port written only when it is not the scheme's default.
  var text: String {
    let shownHost = host.contains(":") ? "[\(host)]" : host
    let defaultPort = scheme == "https" ? 443 : 80
    return "\(scheme)://\(shownHost)" + (port == defaultPort ? "" : ":\(port)")
  }
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
