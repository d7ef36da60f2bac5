import CLibPQ
import Foundation

/// What the store knows of a connection string: a description without the password, and the
/// secrets to scrub from libpq's messages.
struct ConnectionInfo: Sendable {
  /// `user@host:port/dbname`, from the parts the string gives.
  var target: String
  var scrubber: Scrubber

  init(_ url: String) throws {
    var secrets: [String] = []
    // The password as written in a URL (percent-encoded, perhaps), found without libpq so that
    // even a string libpq cannot parse is scrubbed.
    if let scheme = url.range(of: "://") {
      let rest = url[scheme.upperBound...]
      let authority = rest.prefix { $0 != "/" && $0 != "?" }
      if let at = authority.lastIndex(of: "@"), let colon = authority[..<at].firstIndex(of: ":") {
        let raw = String(authority[authority.index(after: colon)..<at])
        secrets.append(raw)
        if let decoded = raw.removingPercentEncoding { secrets.append(decoded) }
      }
    }
    if let environment = ProcessInfo.processInfo.environment["PGPASSWORD"] { secrets.append(environment) }
    var error: UnsafeMutablePointer<CChar>?
    guard let options = PQconninfoParse(url, &error) else {
      // libpq's message quotes the part it could not read, which may be a password given in any
      // form (`?password=`, `password=…`): only its kind of problem is kept, never the text.
      if let error { PQfreemem(error) }
      throw PostgresError(
        code: .invalidURL,
        message: "cannot read the connection string (its text is not shown: it may hold a password); "
          + "pass a postgres:// URL with percent-encoded parts, or a libpq conninfo string such as "
          + "\"host=localhost dbname=app\"")
    }
    defer { PQconninfoFree(options) }
    let values = Connection.values(of: options)
    for keyword in LibPQConnectionString.secretKeywords {
      if let secret = values[keyword] { secrets.append(secret) }
    }
    scrubber = Scrubber(secrets: secrets)
    let environment = ProcessInfo.processInfo.environment
    let host = values["host"] ?? environment["PGHOST"] ?? "localhost"
    let port = values["port"] ?? environment["PGPORT"] ?? "5432"
    let user = values["user"] ?? environment["PGUSER"]
    let database = values["dbname"] ?? environment["PGDATABASE"] ?? user ?? ""
    target = "\(user.map { $0 + "@" } ?? "")\(host):\(port)/\(database)"
  }
}

/// A connection string (a `postgres://` URL or a `key=value` conninfo string) read by libpq
/// itself, for tools that check one before connecting (the `conveyor` command): exactly what
/// libpq will read, with its quoting, backslash escapes, percent-decoding and keyword list, so
/// that no guess about the syntax can show or miss a password.
package enum LibPQConnectionString {
  /// The options `text` sets, as libpq reads them (`PQconninfoParse`: no defaults, no
  /// environment), or nil when libpq cannot read it. libpq's own message is never kept: it quotes
  /// the text it could not read, which may be a password.
  package static func options(_ text: String) -> [String: String]? {
    guard !text.utf8.contains(0) else { return nil }
    var error: UnsafeMutablePointer<CChar>?
    guard let options = PQconninfoParse(text, &error) else {
      if let error { PQfreemem(error) }
      return nil
    }
    defer { PQconninfoFree(options) }
    return Connection.values(of: options)
  }

  /// The keywords this libpq takes (`PQconndefaults`), so that a newer libpq's keywords are
  /// taken; PostgreSQL 17's when libpq cannot list them.
  package static let keywords: Set<String> = {
    guard let options = PQconndefaults() else { return fallbackKeywords }
    defer { PQconninfoFree(options) }
    var found: Set<String> = []
    var option = options
    while let keyword = option.pointee.keyword {
      found.insert(String(cString: keyword))
      option += 1
    }
    return found.isEmpty ? fallbackKeywords : found
  }()

  /// The options whose values are secrets: `password`, and `sslpassword` (a client key's).
  package static let secretKeywords: Set<String> = ["password", "sslpassword"]

  /// The keywords of PostgreSQL 17's `PQconndefaults`.
  static let fallbackKeywords: Set<String> = [
    "host", "hostaddr", "port", "dbname", "user", "password", "passfile", "require_auth",
    "channel_binding", "connect_timeout", "client_encoding", "options", "application_name",
    "fallback_application_name", "keepalives", "keepalives_idle", "keepalives_interval",
    "keepalives_count", "tcp_user_timeout", "replication", "gssencmode", "sslmode", "sslnegotiation",
    "requiressl", "sslcompression", "sslcert", "sslkey", "sslpassword", "sslcertmode", "sslrootcert",
    "sslcrl", "sslcrldir", "sslsni", "requirepeer", "ssl_min_protocol_version", "ssl_max_protocol_version",
    "krbsrvname", "gsslib", "gssdelegation", "service", "target_session_attrs", "load_balance_hosts",
  ]
}
