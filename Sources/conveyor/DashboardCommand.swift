import Conveyor
import ConveyorDashboard
import ConveyorHTTPServer
import ConveyorSQLite
import Foundation
import Synchronization

/// `conveyor dashboard`: the ``Dashboard`` library over the database, served by ``HTTPServer``.
///
/// The library holds the pages and the security checks (see ``Dashboard``); this command adds
/// what a server of its own needs: loopback by default, any other address only with a token
/// (`--token`, `--token-file` or `CONVEYOR_DASHBOARD_TOKEN`: the library's built-in sign-in), the
/// `Host` check of a loopback server (DNS rebinding), `--public-url` for a TLS proxy in front,
/// the outbox's job summaries and details, and error texts without database passwords.
enum DashboardCommand {
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
      server = try HTTPServer(host: host, port: port, refusalHeaders: Dashboard.securityHeaders) { request in
        guard let dashboard = bound.withLock({ $0 }) else { return .text(503, "starting") }
        return await respond(dashboard, to: request)
      }
    } catch {
      printError("conveyor: \(printable(String(describing: error)))")
      return ExitCode.failure.rawValue
    }
    let configuration = Self.configuration(
      token: token, secretHeaders: extraSecrets, publicOrigin: publicOrigin,
      database: context.databaseDescription, host: host, port: server.port)
    // Mounted at the root: the only configuration error (a malformed mount path) cannot occur.
    let dashboard = try Dashboard(store: store, configuration: configuration)
    bound.withLock { $0 = dashboard }
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
        data = try handle.read(upToCount: Self.longestTokenLine + 1) ?? Data()
      } catch {
        throw UsageError(
          description: "cannot read --token-file \"\(printable(file))\": \(error.localizedDescription)")
      }
      // The first line, without its line break and surrounding spaces (`echo TOKEN > file`),
      // taken whole: a longer one is refused, never cut.
      let text = String(decoding: data, as: UTF8.self)
      if data.count > Self.longestTokenLine, !text.contains(where: \.isNewline) {
        throw UsageError(
          description: "the first line of --token-file \"\(printable(file))\" is longer than "
            + "\(Self.longestTokenLine) bytes; put the token alone on the file's first line")
      }
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

  /// The longest first line of a token file read (a token is at least 16 characters).
  static let longestTokenLine = 64 * 1024

  /// Parses `--public-url`: `http` or `https`, a host, an optional port, no path but `/`.
  ///
  /// The host is kept as browsers send it in `Host` and `Origin`: in ASCII, an internationalised
  /// name in its `xn--` form (`https://bücher.example` is `xn--bcher-kva.example`, mapped and
  /// encoded by Foundation's IDNA, as browsers do), never decoded to Unicode. A host holding
  /// anything but letters, digits, `-`, `.` and `_` (or an IPv6 address in brackets), such as a
  /// percent-encoded control character, is refused.
  static func publicOrigin(_ text: String) throws -> DashboardOrigin {
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
    guard let origin = DashboardOrigin(scheme: scheme, host: host, port: components.port) else {
      throw invalid
    }
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

  /// The library's configuration for a server listening on `host` (as given) and `port`: the
  /// token's built-in sign-in, the secret headers, and on loopback the `Host` check (the
  /// loopback names and the listening address, with the port; DNS rebinding).
  static func configuration(
    token: String?, secretHeaders: [String] = [], publicOrigin: DashboardOrigin? = nil, database: String,
    host: String, port: UInt16
  ) -> DashboardConfiguration {
    var configuration = DashboardConfiguration()
    configuration.token = token
    configuration.signInHint = "This dashboard needs its token (--token or CONVEYOR_DASHBOARD_TOKEN)."
    configuration.secretHeaders = DashboardConfiguration.defaultSecretHeaders.union(secretHeaders)
    configuration.publicOrigin = publicOrigin
    configuration.storeDescription = database
    if isLoopback(host) {
      // The port is left out of `Host` only when it is 80, as browsers do.
      configuration.allowedHosts = [
        "127.0.0.1", "localhost", "[::1]", host.contains(":") ? "[\(host)]" : host,
      ]
      .map { "\($0):\(port)" }
    }
    configuration.summarize = { listed, store in
      try await OutboxJob.summary(of: listed, in: store) ?? "(not an outbox job)"
    }
    configuration.describe = describe
    configuration.errorText = { Secrets.scrub(String(describing: $0)) }
    return configuration
  }

  /// One request of ``HTTPServer`` through the library, and its answer back.
  static func respond(_ dashboard: Dashboard, to request: HTTPServerRequest) async -> HTTPServerResponse {
    let response = await dashboard.respond(
      to: DashboardRequest(
        method: request.method, target: request.target, headers: request.headers, body: request.body))
    return HTTPServerResponse(status: response.status, headers: response.headers, body: response.body)
  }

  /// What an outbox job is, for its page (the library redacts secret headers and URL
  /// credentials).
  @Sendable static func describe(_ payload: Data) -> DashboardJobDetails? {
    let job: OutboxJob
    do {
      job = try JSONDecoder().decode(OutboxJob.self, from: payload)
    } catch {
      return .text("Not an outbox job (\(error.localizedDescription)); its payload is shown below.")
    }
    switch job.kind {
    case .http(let request):
      return .httpRequest(
        method: request.method, url: request.url,
        headers: request.headers.map { (name: $0.key, value: $0.value) }, body: request.body)
    case .exec(let command):
      return .command(
        arguments: command.arguments, workingDirectory: command.workingDirectory, timeout: command.timeout)
    }
  }
}
