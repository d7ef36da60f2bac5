import ConveyorPostgres
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
        guard !text.utf8.contains(0) else {
          throw UsageError(description: "the database URL holds a NUL character; \(Self.acceptedForms)")
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
      // Read by libpq itself, so that a string libpq takes is taken (a newer libpq's keywords,
      // backslash escapes); one it refuses is explained without showing any value.
      if !text.utf8.contains(0), LibPQConnectionString.options(text) != nil {
        self = .postgres(text)
        return
      }
      throw UsageError(
        description: "the database looks like a libpq connection string, but "
          + Self.conninfoProblem(in: text, keywords: LibPQConnectionString.keywords).explanation
          + "; \(Self.acceptedForms). For a file whose name starts with a word and '=', write ./ before it")
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
      return LibPQConnectionString.keywords.contains(word[..<equals].lowercased())
    }
  }

  /// What libpq finds wrong with a connection string, as its own parser (`conninfo_parse`) reads
  /// it: `key = value` pairs separated by spaces; a value quoted with `'` (`\'` and `\\` inside)
  /// or running to the next space, a backslash taking the next character as it is.
  enum ConninfoProblem: Equatable {
    /// A word not followed by `=`.
    case missingEquals(word: String)
    /// A keyword libpq does not take.
    case unknownKeyword(String)
    /// The word right after the value of a secret (`password`) is not a `key=value` pair, or not
    /// one with a keyword libpq takes (`isPair`): most likely the rest of a value holding an
    /// unquoted space, so it is never shown.
    case wordAfterSecret(keyword: String, isPair: Bool)
    /// A quoted value without its closing quote.
    case unterminatedQuote
    /// None of these: libpq refused the string for another reason.
    case other

    /// The problem as a message says it: the word at fault is shown, at most 40 characters of it
    /// and escaped, unless it may be part of a password.
    var explanation: String {
      switch self {
      case .missingEquals(let word):
        "\"\(printable(String(word.prefix(40))))\" is not followed by '=' (write key=value pairs "
          + "separated by spaces; quote a value holding a space, 'like this', or write \\ before the space)"
      case .unknownKeyword(let keyword):
        "\"\(printable(String(keyword.prefix(40))))\" is not one of its keywords (host, port, dbname, user, "
          + "password, passfile, sslmode, …, in lower case)"
      case .wordAfterSecret(let keyword, let isPair):
        "the word after the value of \(keyword) is not \(isPair ? "one of its keywords" : "a key=value pair") "
          + "(not shown: it may be part of the \(keyword)); quote a value holding a space ('like this', "
          + "with \\' and \\\\ inside), or write \\ before the space"
      case .unterminatedQuote:
        "a value quoted with ' has no closing quote (write \\' for a quote inside it)"
      case .other:
        "libpq cannot read it (its text is not shown: it may hold a password)"
      }
    }
  }

  /// The first problem libpq's parser meets in `text`, in its order: each pair is read, then its
  /// keyword checked against `keywords`. Values are skipped, never kept.
  static func conninfoProblem(in text: String, keywords: Set<String>) -> ConninfoProblem {
    let bytes = Array(text.utf8)
    guard !bytes.contains(0) else { return .other }
    // C's isspace in the C locale, as libpq uses it.
    func isSpace(_ byte: UInt8) -> Bool { byte == 0x20 || (0x09...0x0D).contains(byte) }
    let equals = UInt8(ascii: "=")
    let quote = UInt8(ascii: "'")
    let backslash = UInt8(ascii: "\\")
    var index = 0
    var previous: String?
    func afterSecret() -> String? {
      previous.flatMap { LibPQConnectionString.secretKeywords.contains($0) ? $0 : nil }
    }
    while index < bytes.count {
      if isSpace(bytes[index]) {
        index += 1
        continue
      }
      let start = index
      while index < bytes.count, bytes[index] != equals, !isSpace(bytes[index]) { index += 1 }
      let keyword = String(decoding: bytes[start..<index], as: UTF8.self)
      while index < bytes.count, isSpace(bytes[index]) { index += 1 }
      guard index < bytes.count, bytes[index] == equals else {
        return afterSecret().map { .wordAfterSecret(keyword: $0, isPair: false) }
          ?? .missingEquals(word: keyword)
      }
      index += 1
      while index < bytes.count, isSpace(bytes[index]) { index += 1 }
      if index < bytes.count, bytes[index] == quote {
        index += 1
        while true {
          guard index < bytes.count else { return .unterminatedQuote }
          if bytes[index] == backslash {
            index += 2
          } else if bytes[index] == quote {
            index += 1
            break
          } else {
            index += 1
          }
        }
      } else {
        while index < bytes.count {
          if isSpace(bytes[index]) {
            index += 1
            break
          }
          index += bytes[index] == backslash ? 2 : 1
        }
      }
      guard keywords.contains(keyword) else {
        return afterSecret().map { .wordAfterSecret(keyword: $0, isPair: true) } ?? .unknownKeyword(keyword)
      }
      previous = keyword
    }
    return .other
  }

  /// Whether a text given as the database carries a password, as libpq reads it: a URL's
  /// `user:password@` (spaces and all) or a `password` parameter however spelt
  /// (`?pass%77ord=`), a connection string's `password` or `sslpassword`. A text libpq cannot
  /// read carries one when scrubbing it changes it.
  static func holdsPassword(_ text: String) -> Bool {
    if let options = LibPQConnectionString.options(normalizedScheme(text)) {
      return LibPQConnectionString.secretKeywords.contains { options[$0]?.isEmpty == false }
    }
    return Secrets.scrub(text) != text
  }

  /// `text` with a URL scheme in lower case, as libpq needs it (`POSTGRES://` → `postgres://`).
  private static func normalizedScheme(_ text: String) -> String {
    let trimmed = Substring(text).drop { $0 == " " || $0 == "\t" || $0 == "\n" }
    guard let scheme = scheme(of: trimmed), trimmed.dropFirst(scheme.count + 1).hasPrefix("//") else {
      return text
    }
    return scheme.lowercased() + trimmed.dropFirst(scheme.count)
  }
}

/// Scrubs passwords out of any text before it is shown: a URL's `user:password@`, and the value
/// of any parameter whose name ends with `password` (a connection string's keyword or a URL's
/// query parameter, in any case, percent-encoded or not).
///
/// It reads values as libpq does, and masks rather more than less: a quoted value to its closing
/// quote (`\'` inside), an unquoted one to the next space, a backslash keeping the next character
/// in it (`password=se\ cret`); a URL's password from the first `:` of its user information to
/// the last `@` before the path, spaces included (libpq takes `user:pass word@`).
enum Secrets {
  static let mask = "[redacted]"

  static func scrub(_ text: String) -> String {
    scrubKeywordValues(scrubWords(scrubURLs(text)))
  }

  /// `scheme://user:password@host` → `scheme://user:[redacted]@host`: in what follows each `://`
  /// up to the next `/` (libpq's user information runs to the first `@`, spaces and all), what
  /// lies between the first `:` and the last `@`.
  private static func scrubURLs(_ text: String) -> String {
    var result = ""
    var rest = Substring(text)
    while let separator = rest.range(of: "://") {
      result += rest[..<separator.upperBound]
      rest = rest[separator.upperBound...]
      let authority = rest.prefix { $0 != "/" }
      if let at = authority.lastIndex(of: "@"), let colon = authority[..<at].firstIndex(of: ":") {
        result += authority[...colon] + mask
        rest = rest[at...]
      }
    }
    return result + rest
  }

  /// `user:password@host` alone: in each word (between spaces and `/`) holding an `@`, what lies
  /// between its first `:` and its last `@` is masked.
  private static func scrubWords(_ text: String) -> String {
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

  /// Characters that end a parameter's name, looking back from its `=`.
  private static let nameDelimiters: Set<Unicode.Scalar> = [
    " ", "\t", "\n", "\r", "&", "?", ";", ",", "\"", "'", "=", "/", "(", ")", "<", ">",
  ]

  /// `password=value`, `password = 'va lue'`, `?pass%77ord=value&` with the value masked: every
  /// `=` whose name (spaces allowed before the `=`), percent-decoded and in lower case, ends with
  /// `password`.
  private static func scrubKeywordValues(_ text: String) -> String {
    let scalars = Array(text.unicodeScalars)
    var result = String.UnicodeScalarView()
    var index = 0
    func isBlank(_ scalar: Unicode.Scalar) -> Bool { scalar == " " || scalar == "\t" }
    while index < scalars.count {
      let scalar = scalars[index]
      result.append(scalar)
      index += 1
      guard scalar == "=" else { continue }
      var end = index - 1
      while end > 0, isBlank(scalars[end - 1]) { end -= 1 }
      var start = end
      while start > 0, !nameDelimiters.contains(scalars[start - 1]) { start -= 1 }
      var name = String(String.UnicodeScalarView(scalars[start..<end]))
      name = (name.removingPercentEncoding ?? name).lowercased()
      guard name.hasSuffix("password") else { continue }
      while index < scalars.count, isBlank(scalars[index]) {
        result.append(scalars[index])
        index += 1
      }
      result.append(contentsOf: mask.unicodeScalars)
      if index < scalars.count, scalars[index] == "'" {
        index += 1
        while index < scalars.count, scalars[index] != "'" { index += scalars[index] == "\\" ? 2 : 1 }
        index += 1
      } else {
        while index < scalars.count, !" \t\n\r&#\"".unicodeScalars.contains(scalars[index]) {
          index += scalars[index] == "\\" ? 2 : 1
        }
      }
    }
    return String(result)
  }
}
