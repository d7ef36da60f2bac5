import Conveyor
import Foundation

/// A request the host server received for the dashboard, read in full.
///
/// Build one from your framework's request: the method, the target exactly as sent (path and
/// query, still percent-encoded, mount prefix included), every header field and the body.
public struct DashboardRequest: Sendable {
  /// The method, e.g. `GET`, as sent (methods are case-sensitive).
  public var method: String
  /// The request target as sent: path and query, e.g. `/admin/jobs/jobs?queue=outbox`.
  public var target: String
  /// The header fields in the order they came, names as sent.
  public var headers: [(name: String, value: String)]
  /// The body (form posts are at most a few kilobytes; the host server bounds it).
  public var body: Data

  /// Creates a request.
  public init(method: String, target: String, headers: [(name: String, value: String)], body: Data = Data()) {
    self.method = method
    self.target = target
    self.headers = headers
    self.body = body
  }

  /// The value of the first field named `name` (case-insensitive), or nil.
  public func header(_ name: String) -> String? {
    headers.first { $0.name.caseInsensitiveCompare(name) == .orderedSame }?.value
  }

  /// The target before `?`, still percent-encoded.
  var path: String { String(target.prefix { $0 != "?" }) }

  /// The query's fields.
  var queryItems: HTTPForm {
    guard let mark = target.firstIndex(of: "?") else { return HTTPForm(encoded: "") }
    return HTTPForm(encoded: String(target[target.index(after: mark)...]))
  }

  /// The body's fields, decoded as `application/x-www-form-urlencoded`.
  var form: HTTPForm { HTTPForm(encoded: String(decoding: body, as: UTF8.self)) }
}

/// What the dashboard answers: send it back as it is.
///
/// Every response, refusals included, carries ``Dashboard/securityHeaders``. The host server
/// adds `Content-Length` and its own framing; a response to `HEAD` should be sent without its
/// body.
public struct DashboardResponse: Sendable {
  /// The status code.
  public var status: Int
  /// Header fields in order (`Set-Cookie` may be among them).
  public var headers: [(name: String, value: String)]
  /// The body.
  public var body: Data

  /// Creates a response.
  public init(status: Int = 200, headers: [(name: String, value: String)] = [], body: Data = Data()) {
    self.status = status
    self.headers = headers
    self.body = body
  }

  /// The value of the first field named `name` (case-insensitive), or nil.
  public func header(_ name: String) -> String? {
    headers.first { $0.name.caseInsensitiveCompare(name) == .orderedSame }?.value
  }

  /// A response with a UTF-8 text body and its content type.
  static func text(_ status: Int, _ text: String, contentType: String = "text/plain; charset=utf-8")
    -> DashboardResponse
  {
    DashboardResponse(status: status, headers: [("Content-Type", contentType)], body: Data(text.utf8))
  }
}

/// The answer of the host application's authorization hook
/// (``DashboardConfiguration/authorize``).
public enum DashboardAuthorization: Sendable {
  /// The request goes on to the dashboard.
  case allow
  /// The request is answered with this response (a 401, 403 or a redirect to the app's sign-in
  /// page) and never reaches the store. The dashboard adds its security headers to it.
  case deny(DashboardResponse)
}

/// What a job is, as the host application describes it for the job's page
/// (``DashboardConfiguration/describe``).
///
/// The dashboard redacts what it shows: header values named in
/// ``DashboardConfiguration/secretHeaders``, a URL's password and credential-like query values.
public enum DashboardJobDetails: Sendable {
  /// An HTTP request the job sends.
  case httpRequest(method: String, url: URL, headers: [(name: String, value: String)], body: Data?)
  /// A command the job runs.
  case command(arguments: [String], workingDirectory: String?, timeout: Double?)
  /// Anything else, as a sentence.
  case text(String)
}

/// A web origin, `scheme://host[:port]`, compared as browsers compare them: scheme and host in
/// lower case, the port the scheme's default when none is written.
public struct DashboardOrigin: Equatable, Sendable {
  /// `http` or `https`.
  public var scheme: String
  /// The host in lower case, an IPv6 address without brackets.
  public var host: String
  /// The port (the scheme's default when none was written).
  public var port: Int

  /// An origin from its parts; nil unless the scheme is `http` or `https`, the host is not empty
  /// and the port is between 1 and 65535.
  public init?(scheme: String, host: String, port: Int?) {
    let scheme = scheme.lowercased()
    guard scheme == "http" || scheme == "https", !host.isEmpty else { return nil }
    let port = port ?? (scheme == "https" ? 443 : 80)
    guard (1...65_535).contains(port) else { return nil }
    self.scheme = scheme
    self.host = Self.bare(host.lowercased())
    self.port = port
  }

  /// Parses an origin as an `Origin` header writes it (`https://host:port`); nil for `null` or
  /// anything else.
  public init?(_ header: String) {
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
  public var text: String {
    let shownHost = host.contains(":") ? "[\(host)]" : host
    let defaultPort = scheme == "https" ? 443 : 80
    return "\(scheme)://\(shownHost)" + (port == defaultPort ? "" : ":\(port)")
  }
}

/// A ``DashboardConfiguration`` the dashboard cannot work with.
public struct DashboardConfigurationError: Error, CustomStringConvertible {
  /// What is wrong and what to do.
  public var description: String
}

/// How a ``Dashboard`` is mounted, who may use it, and how it shows jobs.
public struct DashboardConfiguration: Sendable {
  /// The path prefix the dashboard is mounted under: `""` (the default) for the root, or a path
  /// such as `/admin/jobs` (no trailing `/`). Every link, form action, asset URL, redirect and
  /// cookie path the dashboard emits carries it; a request whose path is outside it is
  /// answered 404.
  public var mountPath: String

  /// The host application's check, run on every request inside ``mountPath`` (assets and the
  /// built-in sign-in included) after the ``allowedHosts`` check: use the app's own sessions,
  /// API keys or roles here. A request it
  /// denies never reaches the store. The default allows every request.
  public var authorize: @Sendable (DashboardRequest) async -> DashboardAuthorization

  /// A shared token, for a dashboard without an app's sign-in in front (what
  /// `conveyor dashboard --token` uses): when set, every request but the assets and the sign-in
  /// page needs `Authorization: Bearer TOKEN` or the session cookie the built-in sign-in form
  /// sets (a random per-instance value, never the token; `HttpOnly`, `SameSite=Strict`).
  /// Compared in constant time. Nil (the default) turns the built-in sign-in off.
  /// At least 16 characters: a shorter one (or an empty one) is refused when the dashboard is
  /// created.
  public var token: String?

  /// The sentence the built-in sign-in page shows above the token field: where users find the
  /// token.
  public var signInHint: String

  /// Header names (lower case) whose values are never shown in a job's details or payload.
  public var secretHeaders: Set<String>

  /// The origin browsers reach the dashboard at, when the `Host` header a request arrives with
  /// does not say it (a TLS proxy that rewrites `Host`). A form post's `Origin` must be this or
  /// the request's own `Host`; an `https` origin makes the session cookie `Secure`.
  public var publicOrigin: DashboardOrigin?

  /// The `Host` header values the dashboard answers to, as `host` or `host:port` (no port: 80;
  /// an IPv6 address in brackets), besides ``publicOrigin``'s host; any other `Host` is answered
  /// 421. Set it when the server may be reached through a host name an attacker controls (DNS
  /// rebinding of a loopback server). Nil (the default) leaves `Host` to the host server.
  public var allowedHosts: [String]?

  /// How the store is named at the foot of the queues page (keep passwords out of it); nil
  /// shows nothing.
  public var storeDescription: String?

  /// A one-line summary of a job for the jobs list, from the start of its payload (the summary's
  /// `record.payload` is at most its first 16 KiB; read more from the store if needed, within a
  /// bound). It is HTML-escaped and cut to 300 characters; keep credentials out of it.
  /// The default gives the payload's size.
  public var summarize: @Sendable (_ job: JobSummary, _ store: any JobStore) async throws -> String

  /// What a job's whole payload (at most 256 KiB) is, for the job's page; nil when the
  /// application does not know. The default knows nothing: the page shows the payload as JSON.
  public var describe: @Sendable (_ payload: Data) -> DashboardJobDetails?

  /// The text a page shows for an error the store threw (keep credentials out of it: a
  /// database URL with its password). The default is the error's description.
  public var errorText: @Sendable (any Error) -> String

  /// The header names whose values are never shown unless configured otherwise.
  public static let defaultSecretHeaders: Set<String> = [
    "authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key", "x-auth-token",
  ]

  /// A configuration mounted at `mountPath` that allows every request; set the other
  /// properties as needed.
  public init(mountPath: String = "") {
    self.mountPath = mountPath
    authorize = { _ in .allow }
    token = nil
    signInHint = "This dashboard needs its access token."
    secretHeaders = Self.defaultSecretHeaders
    publicOrigin = nil
    allowedHosts = nil
    storeDescription = nil
    summarize = { job, _ in "\(job.payloadSize) bytes of payload" }
    describe = { _ in nil }
    errorText = { String(describing: $0) }
  }

  /// Checks the mount path: empty, or `/` followed by segments of letters, digits, `-`, `.`,
  /// `_` and `~`, without a trailing `/`.
  func checkedMountPath() throws -> String {
    let path = mountPath
    if path.isEmpty { return path }
    let segments = path.split(separator: "/", omittingEmptySubsequences: false)
    guard path.hasPrefix("/"), segments.count >= 2,
      segments.dropFirst().allSatisfy({ segment in
        !segment.isEmpty && segment != "." && segment != ".."
          && segment.unicodeScalars.allSatisfy {
            $0.isASCII && (CharacterSet.alphanumerics.contains($0) || "-._~".unicodeScalars.contains($0))
          }
      })
    else {
      throw DashboardConfigurationError(
        description:
          "the dashboard's mount path must be \"\" or a path such as \"/admin/jobs\" (letters, digits, "
          + "-, ., _, ~ between slashes, no trailing slash); got \"\(path)\"")
    }
    return path
  }
}
