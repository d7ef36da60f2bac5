import Foundation

/// What `--database` (or `CONVEYOR_DATABASE`) names: an SQLite file, or a PostgreSQL server by
/// URL or libpq connection string.
///
/// A text that looks like a database string but is not one this tool accepts (`postgress://…`,
/// `POSTGRES:/host`, `HOST=db`, `file:jobs?mode=memory`, a path holding `password=`) is refused
/// with the accepted forms, never opened as an SQLite file: that would create a local file
/// named after the string (password included), and the jobs would never reach the server.
/// Messages name only the scheme or the keyword at fault, never the value.
enum DatabaseLocation: Equatable {
  /// An SQLite file.
  case sqlite(path: String)
  /// A PostgreSQL server: the text libpq is given (a URL's scheme in lower case, as libpq needs).
  case postgres(String)

  static let acceptedForms =
    "give a file path (e.g. jobs.sqlite), a postgres:// or postgresql:// URL, "
    + "or a libpq connection string such as 'host=db dbname=app user=worker'"

  /// The keywords of a libpq connection string (PostgreSQL 17's `PQconndefaults`).
  static let libpqKeywords: Set<String> = [
    "host", "hostaddr", "port", "dbname", "user", "password", "passfile", "require_auth",
    "channel_binding", "connect_timeout", "client_encoding", "options", "application_name",
    "fallback_application_name", "keepalives", "keepalives_idle", "keepalives_interval",
    "keepalives_count", "tcp_user_timeout", "replication", "gssencmode", "sslmode", "sslnegotiation",
    "requiressl", "sslcompression", "sslcert", "sslkey", "sslpassword", "sslcertmode", "sslrootcert",
    "sslcrl", "sslcrldir", "sslsni", "requirepeer", "ssl_min_protocol_version", "ssl_max_protocol_version",
    "krbsrvname", "gsslib", "gssdelegation", "service", "target_session_attrs", "load_balance_hosts",
  ]

  /// Classifies `text`; throws ``UsageError`` for a near miss.
  init(_ text: String) throws {
    let trimmed = Substring(text).drop { $0 == " " || $0 == "\t" || $0 == "\n" }
    if let scheme = Self.scheme(of: trimmed) {
      let rest = trimmed.dropFirst(scheme.count + 1)
      let lowered = scheme.lowercased()
      if rest.hasPrefix("//") {
        guard lowered == "postgres" || lowered == "postgresql" else {
          let hint =
            ["file", "sqlite", "sqlite3"].contains(lowered) ? " (for an SQLite file, give its path)" : ""
          throw UsageError(
            description: "the database \(printable(String(scheme.prefix(40))))://… is neither a file path "
              + "nor a PostgreSQL URL\(hint); \(Self.acceptedForms)")
        }
        self = .postgres(lowered + ":" + rest)
        return
      }
      if Self.isDatabaseScheme(lowered) {
        throw UsageError(
          description: "the database \(printable(String(scheme.prefix(40)))):… is not a URL this tool "
            + "accepts (a PostgreSQL URL starts with postgres:// or postgresql://; SQLite URIs are not "
            + "taken); \(Self.acceptedForms)")
      }
    }
    if Self.startsWithKeyword(trimmed) {
      let keys = Self.keys(of: trimmed)
      if let unknown = keys.first(where: { !Self.libpqKeywords.contains($0) }) {
        throw UsageError(
          description: "the database looks like a libpq connection string, but "
            + "\"\(printable(String(unknown.prefix(40))))\" is not one of its keywords (host, port, "
            + "dbname, user, password, passfile, sslmode, …, in lower case); \(Self.acceptedForms). "
            + "For a file whose name starts with a word and '=', write ./ before it")
      }
      self = .postgres(text)
      return
    }
    if text.contains("://") || Self.holdsKeywordValue(text) || Secrets.scrub(text) != text {
      throw UsageError(
        description: "the database path holds a URL or connection-string part (\"://\", "
          + "\"user:password@\" or \"keyword=\"); it is not opened as a file; \(Self.acceptedForms)")
    }
    self = .sqlite(path: text)
  }

  /// The text before the first `:` when it is a URL scheme (`ALPHA *(ALPHA / DIGIT / + - .)`).
  static func scheme(of text: Substring) -> Substring? {
    guard let colon = text.firstIndex(of: ":") else { return nil }
    let scheme = text[..<colon]
    guard let first = scheme.unicodeScalars.first, first.isASCII, first.properties.isAlphabetic,
      scheme.unicodeScalars.allSatisfy({
        $0.isASCII
          && ($0.properties.isAlphabetic || ("0"..."9").contains($0) || "+-.".unicodeScalars.contains($0))
      })
    else { return nil }
    return scheme
  }

  /// A scheme a database URL was meant to have: a spelling of postgres, or an SQLite URI's.
  private static func isDatabaseScheme(_ lowered: String) -> Bool {
    lowered.hasPrefix("postg")
      || ["pg", "pgsql", "psql", "file", "sqlite", "sqlite3"].contains(lowered)
  }

  /// Whether `text` starts with `word=` (spaces allowed around `=`), a connection string's shape.
  private static func startsWithKeyword(_ text: Substring) -> Bool {
    let word = text.prefix { $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "_") }
    guard let first = word.first, first.isLetter || first == "_" else { return false }
    return text.dropFirst(word.count).drop { $0 == " " || $0 == "\t" }.first == "="
  }

  /// Whether a libpq keyword followed by `=` starts `text` or a word of it (after a space).
  private static func holdsKeywordValue(_ text: String) -> Bool {
    text.split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "\n" }).contains { word in
      guard let equals = word.firstIndex(of: "=") else { return false }
      return libpqKeywords.contains(word[..<equals].lowercased())
    }
  }

  /// The keywords of a connection string, in order: `key = value` pairs, values quoted with `'`
  /// (backslash escapes) or running to the next space. Values are skipped, never kept.
  static func keys(of text: Substring) -> [String] {
    var keys: [String] = []
    var rest = text[...]
    func skipSpaces() { rest = rest.drop { $0 == " " || $0 == "\t" || $0 == "\n" || $0 == "\r" } }
    while true {
      skipSpaces()
      guard !rest.isEmpty else { return keys }
      let key = rest.prefix { $0 != "=" && $0 != " " && $0 != "\t" && $0 != "\n" && $0 != "\r" }
      keys.append(String(key))
      rest = rest.dropFirst(key.count)
      skipSpaces()
      guard rest.first == "=" else { return keys }
      rest = rest.dropFirst()
      skipSpaces()
      if rest.first == "'" {
        rest = rest.dropFirst()
        while let character = rest.first, character != "'" {
          rest = rest.dropFirst(character == "\\" ? 2 : 1)
        }
        rest = rest.dropFirst()
      } else {
        rest = rest.drop { $0 != " " && $0 != "\t" && $0 != "\n" && $0 != "\r" }
      }
    }
  }

  /// Whether a PostgreSQL connection text carries a password: a URL's `user:password@`, or a
  /// `password` keyword or query parameter.
  static func holdsPassword(_ text: String) -> Bool {
    Secrets.scrub(text) != text
  }
}

/// Scrubs passwords out of any text before it is shown: a URL's `user:password@`, and the value
/// of `password=` (a connection string's keyword or a URL's query parameter, in any case).
enum Secrets {
  static let mask = "[redacted]"

  static func scrub(_ text: String) -> String {
    scrubKeywordValues(scrubUserInfo(text))
  }

  /// `user:password@host` → `user:[redacted]@host`, in a URL (`scheme://user:password@host`) or
  /// alone: in each word (between spaces and `/`) holding an `@`, what lies between its first `:`
  /// and its last `@` is masked.
  private static func scrubUserInfo(_ text: String) -> String {
    var result = ""
    var word = ""
    func flush() {
      if let at = word.lastIndex(of: "@"), let colon = word[..<at].firstIndex(of: ":") {
        result += word[...colon] + mask + word[at...]
      } else {
        result += word
      }
      word = ""
    }
    for character in text {
      if character == "/" || character.isWhitespace {
        flush()
        result.append(character)
      } else {
        word.append(character)
      }
    }
    flush()
    return result
  }

  /// `password=value`, `password = 'va lue'` or `?password=value&` with the value masked.
  private static func scrubKeywordValues(_ text: String) -> String {
    var result = ""
    var rest = Substring(text)
    while let found = rest.range(of: "password", options: .caseInsensitive) {
      result += rest[..<found.upperBound]
      rest = rest[found.upperBound...]
      let spaces = rest.prefix { $0 == " " || $0 == "\t" }
      guard rest.dropFirst(spaces.count).first == "=" else { continue }
      rest = rest.dropFirst(spaces.count + 1)
      let gap = rest.prefix { $0 == " " || $0 == "\t" }
      result += spaces + "=" + gap + mask
      rest = rest.dropFirst(gap.count)
      if rest.first == "'" {
        rest = rest.dropFirst()
        while let character = rest.first, character != "'" {
          rest = rest.dropFirst(character == "\\" ? 2 : 1)
        }
        rest = rest.dropFirst()
      } else {
        rest = rest.drop { !" \t\n\r&#\"".contains($0) }
      }
    }
    return result + rest
  }
}
