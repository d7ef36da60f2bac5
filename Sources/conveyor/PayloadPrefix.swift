import Foundation

/// What a listing shows of an outbox job, read from the start of its stored JSON only: an HTTP
/// job's method and URL, or a command's arguments.
///
/// `add` stores what a summary needs first (``summaryMembersFirst(_:)``): the job's kind before its
/// key, the method and URL before the headers and the body, the arguments before the rest; every
/// other member smallest first. So the first few KiB of a payload hold the summary, whatever the
/// body's or the key's size; a URL longer than that is shown as far as it is read, once its
/// host is (``shownStart(ofURL:)``). (`JSONEncoder` writes members in no fixed order, and the
/// previous build wrote the key first when smaller than the kind: a job stored so may need more
/// of its payload, which ``OutboxJob/summary(of:in:)`` reads within a bound.) The scanner reads
/// JSON tokens until its input ends and keeps the strings at those places; it never traps,
/// recurses at most ``maximumDepth`` levels, and takes time linear in its input.
struct PayloadPrefix {
  /// How many bytes of a payload listings read.
  static let listedBytes = 16 * 1024
  /// Nesting deeper than this ends the scan (an outbox job nests five levels).
  static let maximumDepth = 32

  /// The HTTP method, when its string is whole.
  private(set) var method: String?
  /// The URL, when its string is whole.
  private(set) var url: String?
  /// Whether an `http` job's URL string started but the input ended inside it.
  private(set) var urlCut = false
  /// The start of a URL cut by the end of the input.
  private(set) var urlStart: String?
  /// Whether the job is an `http` or `exec` one, as far as the input shows.
  private(set) var kind: String?
  /// The command's arguments whose strings are whole.
  private(set) var arguments: [String] = []
  /// Whether the arguments' array ended within the input.
  private(set) var argumentsClosed = false
  /// Whether the input held one whole JSON value and nothing but spaces after it.
  private(set) var isWholeDocument = false

  private let bytes: [UInt8]
  private var index = 0
  /// What a kept string held when the input ended inside it.
  private var partial = ""

  /// Scans `data`, the start of a payload (or all of it).
  init(_ data: some Collection<UInt8>) {
    bytes = Array(data)
    do {
      try value(path: [])
      skipSpaces()
      isWholeDocument = index == bytes.count
    } catch {
      // The input ended, or is not JSON: what was read so far stands.
    }
  }

  /// Whether what was read holds all a summary shows: an HTTP job's method and URL, or a command's
  /// whole argument list.
  var holdsWholeSummary: Bool {
    switch kind {
    case "http": method != nil && url != nil
    case "exec": argumentsClosed
    default: false
    }
  }

  /// The summary listings show, or nil when what was read is not an outbox job. `complete` says
  /// whether the input was the whole payload.
  func summary(complete: Bool) -> String? {
    if complete && !isWholeDocument { return nil }
    switch kind {
    case "http":
      guard let method else { return complete ? nil : "http (a request whose start is too long to show)" }
      if let url {
        guard let parsed = URL(string: url) else { return complete ? nil : "http \(method) (URL)" }
        return "http \(method) \(OutboxJob.withoutSecrets(parsed))"
      }
      if urlCut, let shown = urlStart.flatMap(Self.shownStart(ofURL:)) { return "http \(method) \(shown)" }
      return urlCut || !complete ? "http \(method) (a URL too long to show)" : nil
    case "exec":
      guard !arguments.isEmpty || argumentsClosed else {
        return complete ? nil : "exec (a command whose start is too long to show)"
      }
      let shown = "exec " + arguments.map(OutboxJob.quoted).joined(separator: " ")
      return argumentsClosed ? shown : shown + " …"
    default:
      return nil
    }
  }

  /// What a listing shows of a URL of which only `start` was read: its scheme, host and port and
  /// its path as far as it was read ("…" after it), or "?…" for a query begun; nil until the
  /// whole host was read (up to the `/`, `?` or `#` after it), since a cut user information could
  /// show part of a password. User information is never shown.
  static func shownStart(ofURL start: String) -> String? {
    guard let separator = start.range(of: "://"),
      let hostEnd = start[separator.upperBound...].firstIndex(where: { "/?#".contains($0) })
    else { return nil }
    let queryStart = start[hostEnd...].firstIndex { $0 == "?" || $0 == "#" }
    var head = start[..<(queryStart ?? start.endIndex)]
    // A percent escape cut short is left out.
    if let percent = head.suffix(2).firstIndex(of: "%") { head = head[..<percent] }
    guard let url = URL(string: String(head)) else { return nil }
    return OutboxJob.withoutSecrets(url) + (queryStart == nil ? "…" : "?…")
  }

  // MARK: scanning

  private enum Stop: Error { case end, invalid }

  private mutating func skipSpaces() {
    while index < bytes.count, [0x20, 0x09, 0x0A, 0x0D].contains(bytes[index]) { index += 1 }
  }

  private mutating func next() throws(Stop) -> UInt8 {
    guard index < bytes.count else { throw .end }
    defer { index += 1 }
    return bytes[index]
  }

  private mutating func peek() throws(Stop) -> UInt8 {
    skipSpaces()
    guard index < bytes.count else { throw .end }
    return bytes[index]
  }

  private mutating func value(path: [String]) throws(Stop) {
    guard path.count <= Self.maximumDepth else { throw .invalid }
    switch try peek() {
    case UInt8(ascii: "{"): try object(path: path)
    case UInt8(ascii: "["): try array(path: path)
    case UInt8(ascii: "\""):
      let captured = wanted(path)
      let isArgument = path.count == 5 && path.starts(with: ["kind", "exec", "_0", "arguments"])
      let isURL = path == ["kind", "http", "_0", "url"]
      if isURL { urlCut = true }
      let text: String?
      do {
        text = try string(keeping: captured)
      } catch .end where isArgument || isURL {
        // An argument cut by the end of the input is shown as far as it goes; a URL only from
        // what `shownStart(ofURL:)` finds safe (a cut one could show part of a password).
        if isURL { urlStart = partial } else if !partial.isEmpty { arguments.append(partial) }
        throw .end
      }
      if isURL { urlCut = false }
      guard captured, let text else { return }
      if path == ["kind", "http", "_0", "method"] { method = text }
      if path == ["kind", "http", "_0", "url"] { url = text }
      if isArgument { arguments.append(text) }
    default:
      // A number, true, false or null: its characters, whatever they are, up to a delimiter.
      let start = index
      while index < bytes.count, !",}] \t\n\r".utf8.contains(bytes[index]) { index += 1 }
      if index == start { throw .invalid }
      if index == bytes.count { throw .end }
    }
  }

  /// Whether the string at `path` is one a summary shows.
  private func wanted(_ path: [String]) -> Bool {
    path == ["kind", "http", "_0", "method"] || path == ["kind", "http", "_0", "url"]
      || (path.count == 5 && path.starts(with: ["kind", "exec", "_0", "arguments"]))
  }

  private mutating func object(path: [String]) throws(Stop) {
    index += 1  // {
    if try peek() == UInt8(ascii: "}") {
      index += 1
      return
    }
    while true {
      guard try peek() == UInt8(ascii: "\"") else { throw .invalid }
      // Keys are short in an outbox job; a long one is read (to skip it) but not kept.
      let key = try string(keeping: path.count < 4) ?? ""
      guard try peek() == UInt8(ascii: ":") else { throw .invalid }
      index += 1
      if path == ["kind"] && (key == "http" || key == "exec") { kind = key }
      try value(path: path + [key])
      switch try peek() {
      case UInt8(ascii: ","): index += 1
      case UInt8(ascii: "}"):
        index += 1
        return
      default: throw .invalid
      }
    }
  }

  private mutating func array(path: [String]) throws(Stop) {
    index += 1  // [
    let isArguments = path == ["kind", "exec", "_0", "arguments"]
    if try peek() == UInt8(ascii: "]") {
      index += 1
      if isArguments { argumentsClosed = true }
      return
    }
    var position = 0
    while true {
      try value(path: path + [String(position)])
      position += 1
      switch try peek() {
      case UInt8(ascii: ","): index += 1
      case UInt8(ascii: "]"):
        index += 1
        if isArguments { argumentsClosed = true }
        return
      default: throw .invalid
      }
    }
  }

  /// Reads a string (at its opening quote); returns its text when `keeping`, else skips it.
  private mutating func string(keeping: Bool) throws(Stop) -> String? {
    index += 1  // "
    var scalars = String.UnicodeScalarView()
    var utf8: [UInt8] = []
    func flush() {
      guard !utf8.isEmpty else { return }
      scalars.append(contentsOf: String(decoding: utf8, as: UTF8.self).unicodeScalars)
      utf8.removeAll(keepingCapacity: true)
    }
    while true {
      guard index < bytes.count else {
        if keeping {
          flush()
          partial = String(scalars)
        }
        throw .end
      }
      let byte = try next()
      switch byte {
      case UInt8(ascii: "\""):
        guard keeping else { return nil }
        flush()
        return String(scalars)
      case UInt8(ascii: "\\"):
        let escape = try next()
        guard keeping else {
          if escape == UInt8(ascii: "u") { for _ in 0..<4 { _ = try next() } }
          continue
        }
        flush()
        switch escape {
        case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): scalars.append(Unicode.Scalar(escape))
        case UInt8(ascii: "b"): scalars.append("\u{8}")
        case UInt8(ascii: "f"): scalars.append("\u{C}")
        case UInt8(ascii: "n"): scalars.append("\n")
        case UInt8(ascii: "r"): scalars.append("\r")
        case UInt8(ascii: "t"): scalars.append("\t")
        case UInt8(ascii: "u"):
          var unit = try hex4()
          if (0xD800...0xDBFF).contains(unit) {
            // A high surrogate: its low half must follow as another \u escape.
            guard try next() == UInt8(ascii: "\\"), try next() == UInt8(ascii: "u") else { throw .invalid }
            let low = try hex4()
            guard (0xDC00...0xDFFF).contains(low) else { throw .invalid }
            unit = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00)
          }
          guard let scalar = Unicode.Scalar(unit) else { throw .invalid }
          scalars.append(scalar)
        default: throw .invalid
        }
      default:
        if byte < 0x20 { throw .invalid }
        if keeping { utf8.append(byte) }
      }
    }
  }

  private mutating func hex4() throws(Stop) -> UInt32 {
    var value: UInt32 = 0
    for _ in 0..<4 {
      let byte = try next()
      let digit: UInt8
      switch byte {
      case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = byte - UInt8(ascii: "0")
      case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = byte - UInt8(ascii: "a") + 10
      case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = byte - UInt8(ascii: "A") + 10
      default: throw .invalid
      }
      value = value << 4 | UInt32(digit)
    }
    return value
  }
}

extension PayloadPrefix {
  /// The members a summary reads, written first in each object in this order: an outbox job's
  /// kind (before its key, however long), an HTTP request's method and URL, a command's
  /// arguments.
  static let summaryMembers = ["kind", "method", "url", "arguments"].map { Array("\"\($0)\"".utf8) }

  /// `json` (one JSON value, as `JSONEncoder` writes it) with each object's members written
  /// ``summaryMembers`` first, then smallest first (ties in their order), every value's bytes
  /// otherwise as they were: the same value to any decoder. Nil when `json` is not one JSON value
  /// or nests deeper than ``maximumDepth``.
  static func summaryMembersFirst(_ json: Data) -> Data? {
    let bytes = [UInt8](json)
    var output: [UInt8] = []
    output.reserveCapacity(bytes.count)
    var index = 0
    guard reordered(bytes, &index, depth: 0, into: &output) else { return nil }
    while index < bytes.count, [0x20, 0x09, 0x0A, 0x0D].contains(bytes[index]) { index += 1 }
    guard index == bytes.count else { return nil }
    return Data(output)
  }

  /// Copies the value at `index` into `output`, objects' members reordered; advances `index`.
  private static func reordered(_ bytes: [UInt8], _ index: inout Int, depth: Int, into output: inout [UInt8])
    -> Bool
  {
    func skipSpaces() {
      while index < bytes.count, [0x20, 0x09, 0x0A, 0x0D].contains(bytes[index]) { index += 1 }
    }
    skipSpaces()
    guard index < bytes.count, depth <= maximumDepth else { return false }
    switch bytes[index] {
    case UInt8(ascii: "{"):
      index += 1
      var members: [(key: ArraySlice<UInt8>, value: [UInt8])] = []
      skipSpaces()
      if index < bytes.count, bytes[index] == UInt8(ascii: "}") {
        index += 1
      } else {
        while true {
          skipSpaces()
          let keyStart = index
          guard index < bytes.count, bytes[index] == UInt8(ascii: "\""), skipString(bytes, &index) else {
            return false
          }
          let key = bytes[keyStart..<index]
          skipSpaces()
          guard index < bytes.count, bytes[index] == UInt8(ascii: ":") else { return false }
          index += 1
          var value: [UInt8] = []
          guard reordered(bytes, &index, depth: depth + 1, into: &value) else { return false }
          members.append((key, value))
          skipSpaces()
          guard index < bytes.count else { return false }
          if bytes[index] == UInt8(ascii: ",") {
            index += 1
            continue
          }
          guard bytes[index] == UInt8(ascii: "}") else { return false }
          index += 1
          break
        }
      }
      func rank(_ key: ArraySlice<UInt8>) -> Int {
        summaryMembers.firstIndex { $0.elementsEqual(key) } ?? summaryMembers.count
      }
      let sorted = members.enumerated().sorted {
        (rank($0.element.key), $0.element.value.count, $0.offset)
          < (rank($1.element.key), $1.element.value.count, $1.offset)
      }
      output.append(UInt8(ascii: "{"))
      for (position, member) in sorted.enumerated() {
        if position > 0 { output.append(UInt8(ascii: ",")) }
        output += member.element.key
        output.append(UInt8(ascii: ":"))
        output += member.element.value
      }
      output.append(UInt8(ascii: "}"))
      return true
    case UInt8(ascii: "["):
      index += 1
      output.append(UInt8(ascii: "["))
      skipSpaces()
      if index < bytes.count, bytes[index] == UInt8(ascii: "]") {
        index += 1
        output.append(UInt8(ascii: "]"))
        return true
      }
      while true {
        guard reordered(bytes, &index, depth: depth + 1, into: &output) else { return false }
        skipSpaces()
        guard index < bytes.count else { return false }
        let byte = bytes[index]
        index += 1
        output.append(byte)
        if byte == UInt8(ascii: "]") { return true }
        guard byte == UInt8(ascii: ",") else { return false }
      }
    case UInt8(ascii: "\""):
      let start = index
      guard skipString(bytes, &index) else { return false }
      output += bytes[start..<index]
      return true
    default:
      let start = index
      while index < bytes.count, !",}] \t\n\r".utf8.contains(bytes[index]) { index += 1 }
      guard index > start else { return false }
      output += bytes[start..<index]
      return true
    }
  }

  /// Moves `index` past the string starting at it (its quotes included); false if it never ends.
  private static func skipString(_ bytes: [UInt8], _ index: inout Int) -> Bool {
    index += 1
    while index < bytes.count {
      switch bytes[index] {
      case UInt8(ascii: "\""):
        index += 1
        return true
      case UInt8(ascii: "\\"): index += 2
      default: index += 1
      }
    }
    return false
  }
}
