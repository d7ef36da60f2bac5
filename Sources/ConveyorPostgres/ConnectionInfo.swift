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
    if let password = values["password"] { secrets.append(password) }
    scrubber = Scrubber(secrets: secrets)
    let environment = ProcessInfo.processInfo.environment
    let host = values["host"] ?? environment["PGHOST"] ?? "localhost"
    let port = values["port"] ?? environment["PGPORT"] ?? "5432"
    let user = values["user"] ?? environment["PGUSER"]
    let database = values["dbname"] ?? environment["PGDATABASE"] ?? user ?? ""
    target = "\(user.map { $0 + "@" } ?? "")\(host):\(port)/\(database)"
  }
}
