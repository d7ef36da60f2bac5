import Foundation

/// Decodes job payloads: the same value and the same error as a default `JSONDecoder`, at a
/// fraction of its cost for the plain JSON that job payloads are made of.
///
/// A queue decodes every job it runs, so `JSONDecoder`'s fixed cost per call (about 3 µs for a
/// one-field struct on the benchmark machine) was a large part of a no-op job's cost. This type
/// tries a small decoder first and hands anything it is not certain of to `JSONDecoder`:
///
/// - It only ever *succeeds* on input where `JSONDecoder` succeeds with the same value. Every doubt
///   is a fallback: a parse error, a type mismatch, a missing key, an error thrown by the type's
///   own `init(from:)`, duplicate keys, keys with escapes or non-ASCII bytes (`JSONDecoder` matches
///   keys by Unicode canonical equivalence), numbers it does not parse exactly the same way (a
///   fraction or exponent for an integer, `-0`, `Float`, results that underflow or overflow),
///   `Data`, `URL`, `Decimal`, 128-bit integers, `superDecoder`, nesting deeper than 256 and
///   payloads over 1 MiB.
/// - So every error a job sees is `JSONDecoder`'s own, and a type's `init(from:)` may run twice
///   for one payload (once here, once in `JSONDecoder`) when the first run throws.
///
/// One instance per worker; not `Sendable` (it counts its fallbacks).
final class PayloadDecoder {
  private let fallbackDecoder = JSONDecoder()
  /// How many decodes went to `JSONDecoder`: tests use it to prove the fast path ran.
  private(set) var fallbacks = 0

  /// Payloads larger than this go to `JSONDecoder` directly.
  static let largestFastPayload = 1 << 20

  func decode<T: Decodable>(_ type: T.Type, from data: Data) throws -> T {
    if let value = Self.fastDecode(type, from: data) { return value }
    fallbacks += 1
    return try fallbackDecoder.decode(type, from: data)
  }

  /// The same for callers on any thread, with their own `JSONDecoder` to fall back to.
  static func decode<T: Decodable>(_ type: T.Type, from data: Data, fallback: JSONDecoder) throws -> T {
    try fastDecode(type, from: data) ?? fallback.decode(type, from: data)
  }

  /// The fast path alone: nil when it is not certain to match `JSONDecoder`.
  static func fastDecode<T: Decodable>(_ type: T.Type, from data: Data) -> T? {
    guard data.count <= largestFastPayload else { return nil }
    // The bytes are copied so the tape owns them: a type's `init(from:)` may keep its decoder.
    var parser = JSONTapeParser(bytes: [UInt8](data))
    guard parser.parseDocument() else { return nil }
    let document = JSONTape(bytes: parser.bytes, nodes: parser.nodes)
    // Any error here means "not certain": the caller decodes again with `JSONDecoder`, whose error
    // (if any) is the one a job sees. Nothing is stored or read here, so nothing is lost.
    guard let value = try? document.decode(type, at: 0, path: nil), !document.uncertain else {
      return nil
    }
    return value
  }
}

/// Thrown inside the fast path for "not certain": the caller falls back to `JSONDecoder`, so this
/// never reaches a user.
private struct NotCertain: Error {}

/// One JSON value in document order. A container's members follow it; `after` is the index of
/// the node after its whole subtree.
struct JSONNode {
  enum Kind: UInt8 { case null, `true`, `false`, integer, number, string, escapedString, array, object }
  var kind: Kind
  /// For strings, the bytes between the quotes; for numbers, the literal.
  var start: Int
  var end: Int
  var after: Int
  /// Elements of an array, members of an object.
  var count: Int
}

/// A strict RFC 8259 parser into a flat list of nodes. It refuses (returns false) more than JSON
/// does: invalid UTF-8 or lone surrogates anywhere, object keys with escapes or non-ASCII bytes,
/// duplicate keys, objects of over 64 members and nesting over 256.
struct JSONTapeParser {
  let bytes: [UInt8]
  var nodes: [JSONNode] = []
  private var index = 0
  static let maximumDepth = 256
  static let maximumMembers = 64

  init(bytes: [UInt8]) {
    self.bytes = bytes
    nodes.reserveCapacity(8)
  }

  mutating func parseDocument() -> Bool {
    guard parseValue(depth: 0) else { return false }
    skipWhitespace()
    return index == bytes.count
  }

  private mutating func skipWhitespace() {
    while index < bytes.count {
      switch bytes[index] {
      case 0x20, 0x09, 0x0A, 0x0D: index += 1
      default: return
      }
    }
  }

  private mutating func append(_ kind: JSONNode.Kind, _ start: Int, _ end: Int) {
    nodes.append(JSONNode(kind: kind, start: start, end: end, after: nodes.count + 1, count: 0))
  }

  private mutating func literal(_ word: String, _ kind: JSONNode.Kind) -> Bool {
    let count = word.utf8.count
    guard bytes.count - index >= count, bytes[index..<index + count].elementsEqual(word.utf8) else {
      return false
    }
    append(kind, index, index + count)
    index += count
    return true
  }

  private mutating func parseValue(depth: Int) -> Bool {
    skipWhitespace()
    guard index < bytes.count else { return false }
    switch bytes[index] {
    case UInt8(ascii: "{"): return depth < Self.maximumDepth && parseObject(depth: depth)
    case UInt8(ascii: "["): return depth < Self.maximumDepth && parseArray(depth: depth)
    case UInt8(ascii: "\""): return parseString(asKey: false)
    case UInt8(ascii: "t"): return literal("true", .true)
    case UInt8(ascii: "f"): return literal("false", .false)
    case UInt8(ascii: "n"): return literal("null", .null)
    case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return parseNumber()
    default: return false
    }
  }

  private mutating func parseArray(depth: Int) -> Bool {
    parseContainer(.array, closedBy: UInt8(ascii: "]")) { parser, _, _ in parser.parseValue(depth: depth + 1)
    }
  }

  private mutating func parseObject(depth: Int) -> Bool {
    parseContainer(.object, closedBy: UInt8(ascii: "}")) { parser, object, count in
      parser.skipWhitespace()
      guard parser.index < parser.bytes.count, parser.bytes[parser.index] == UInt8(ascii: "\""),
        count < Self.maximumMembers
      else { return false }
      let key = parser.nodes.count
      guard parser.parseString(asKey: true), parser.isNewKey(key, inObjectAt: object) else { return false }
      parser.skipWhitespace()
      guard parser.index < parser.bytes.count, parser.bytes[parser.index] == UInt8(ascii: ":") else {
        return false
      }
      parser.index += 1
      return parser.parseValue(depth: depth + 1)
    }
  }

  /// An array or an object at `index`: `member` parses one element, or one key and its value
  /// (given the container's node and the members so far); the container's node gets its member
  /// count and the index of the node after it.
  private mutating func parseContainer(
    _ kind: JSONNode.Kind, closedBy close: UInt8, member: (inout JSONTapeParser, Int, Int) -> Bool
  ) -> Bool {
    let position = nodes.count
    append(kind, index, index)
    index += 1
    skipWhitespace()
    var count = 0
    if index < bytes.count, bytes[index] == close {
      index += 1
    } else {
      while true {
        guard member(&self, position, count) else { return false }
        count += 1
        skipWhitespace()
        guard index < bytes.count else { return false }
        if bytes[index] == UInt8(ascii: ",") {
          index += 1
        } else if bytes[index] == close {
          index += 1
          break
        } else {
          return false
        }
      }
    }
    nodes[position].count = count
    nodes[position].after = nodes.count
    return true
  }

  /// Whether the key at `key` differs from every earlier key of its object. Keys are plain ASCII
  /// here, so equal bytes are equal strings.
  private func isNewKey(_ key: Int, inObjectAt object: Int) -> Bool {
    let new = nodes[key]
    var earlier = object + 1
    while earlier < key {
      let old = nodes[earlier]
      if old.end - old.start == new.end - new.start,
        bytes[old.start..<old.end].elementsEqual(bytes[new.start..<new.end])
      {
        return false
      }
      earlier = nodes[earlier + 1].after
    }
    return true
  }

  private mutating func parseString(asKey: Bool) -> Bool {
    index += 1
    let start = index
    var escaped = false
    while index < bytes.count {
      let byte = bytes[index]
      switch byte {
      case UInt8(ascii: "\""):
        append(escaped ? .escapedString : .string, start, index)
        index += 1
        return true
      case UInt8(ascii: "\\"):
        guard !asKey, skipEscape() else { return false }
        escaped = true
      case 0..<0x20:
        return false
      case 0x80...:
        guard !asKey, skipUTF8Sequence() else { return false }
      default:
        index += 1
      }
    }
    return false
  }

  /// Skips one escape at `index`; refuses unknown escapes and unpaired surrogates.
  private mutating func skipEscape() -> Bool {
    guard index + 1 < bytes.count else { return false }
    switch bytes[index + 1] {
    case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"), UInt8(ascii: "b"), UInt8(ascii: "f"),
      UInt8(ascii: "n"), UInt8(ascii: "r"), UInt8(ascii: "t"):
      index += 2
      return true
    case UInt8(ascii: "u"):
      guard let unit = JSONTape.hexUnit(bytes, at: index + 2) else { return false }
      index += 6
      switch unit {
      case 0xD800...0xDBFF:
        guard index + 1 < bytes.count, bytes[index] == UInt8(ascii: "\\"),
          bytes[index + 1] == UInt8(ascii: "u"),
          let low = JSONTape.hexUnit(bytes, at: index + 2), (0xDC00...0xDFFF).contains(low)
        else { return false }
        index += 6
        return true
      case 0xDC00...0xDFFF:
        return false
      default:
        return true
      }
    default:
      return false
    }
  }

  /// Skips one well-formed UTF-8 sequence of two to four bytes at `index` (no overlong forms, no
  /// surrogates, nothing above U+10FFFF).
  private mutating func skipUTF8Sequence() -> Bool {
    let lead = bytes[index]
    let length: Int
    var secondRange: ClosedRange<UInt8> = 0x80...0xBF
    switch lead {
    case 0xC2...0xDF: length = 2
    case 0xE0:
      length = 3
      secondRange = 0xA0...0xBF
    case 0xE1...0xEC, 0xEE...0xEF: length = 3
    case 0xED:
      length = 3
      secondRange = 0x80...0x9F
    case 0xF0:
      length = 4
      secondRange = 0x90...0xBF
    case 0xF1...0xF3: length = 4
    case 0xF4:
      length = 4
      secondRange = 0x80...0x8F
    default: return false
    }
    guard bytes.count - index >= length, secondRange.contains(bytes[index + 1]) else { return false }
    for offset in 2..<length where !(0x80...0xBF).contains(bytes[index + offset]) { return false }
    index += length
    return true
  }

  private mutating func parseNumber() -> Bool {
    let start = index
    if bytes[index] == UInt8(ascii: "-") { index += 1 }
    guard index < bytes.count else { return false }
    if bytes[index] == UInt8(ascii: "0") {
      index += 1
    } else {
      guard skipDigits() else { return false }
    }
    var integer = true
    if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
      index += 1
      integer = false
      guard skipDigits() else { return false }
    }
    if index < bytes.count, bytes[index] == UInt8(ascii: "e") || bytes[index] == UInt8(ascii: "E") {
      index += 1
      integer = false
      if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") {
        index += 1
      }
      guard skipDigits() else { return false }
    }
    append(integer ? .integer : .number, start, index)
    return true
  }

  /// Skips one or more digits.
  private mutating func skipDigits() -> Bool {
    let start = index
    while index < bytes.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[index]) { index += 1 }
    return index > start
  }
}

/// A parsed payload and the `Decoder` machinery over it. Everything it refuses throws
/// `NotCertain`, which sends the payload to `JSONDecoder`.
final class JSONTape {
  let bytes: [UInt8]
  let nodes: [JSONNode]

  /// Set by every refusal. A type's `init(from:)` may catch an error and go on (`try?` with a
  /// default), so a refusal can hide inside a success: such a success is not certain either.
  private(set) var uncertain = false

  fileprivate func refuse() -> NotCertain {
    uncertain = true
    return NotCertain()
  }

  init(bytes: [UInt8], nodes: [JSONNode]) {
    self.bytes = bytes
    self.nodes = nodes
  }

  static func hexUnit(_ bytes: [UInt8], at index: Int) -> UInt16? {
    guard bytes.count - index >= 4 else { return nil }
    var unit: UInt16 = 0
    for offset in 0..<4 {
      let byte = bytes[index + offset]
      let digit: UInt8
      switch byte {
      case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = byte - UInt8(ascii: "0")
      case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = byte - UInt8(ascii: "a") + 10
      case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = byte - UInt8(ascii: "A") + 10
      default: return nil
      }
      unit = unit << 4 | UInt16(digit)
    }
    return unit
  }

  func decode<T: Decodable>(_ type: T.Type, at node: Int, path: CodingPathNode?) throws -> T {
    // The types `JSONDecoder` treats apart from their own `Decodable` conformance (Date is one too,
    // but its default strategy calls `Date(from:)`, which is what happens here).
    if T.self == Data.self || T.self == URL.self || T.self == Decimal.self || T.self == Float.self {
      throw refuse()
    }
    return try T(from: TapeDecoder(tape: self, node: node, path: path))
  }

  func node(_ index: Int) -> JSONNode { nodes[index] }

  func isNull(_ index: Int) -> Bool { nodes[index].kind == .null }

  func bool(_ index: Int) throws -> Bool {
    switch nodes[index].kind {
    case .true: return true
    case .false: return false
    default: throw refuse()
    }
  }

  func string(_ index: Int) throws -> String {
    let node = nodes[index]
    switch node.kind {
    case .string:
      return bytes.withUnsafeBufferPointer {
        String(decoding: UnsafeBufferPointer(rebasing: $0[node.start..<node.end]), as: UTF8.self)
      }
    case .escapedString:
      return try unescape(node.start..<node.end)
    default:
      throw refuse()
    }
  }

  /// The text of a string the parser checked (its escapes are known and its surrogates paired);
  /// anything else is refused rather than trusted.
  private func unescape(_ range: Range<Int>) throws -> String {
    var out: [UInt8] = []
    out.reserveCapacity(range.count)
    var index = range.lowerBound
    while index < range.upperBound {
      let byte = bytes[index]
      guard byte == UInt8(ascii: "\\") else {
        out.append(byte)
        index += 1
        continue
      }
      guard index + 1 < range.upperBound else { throw refuse() }
      let escape = bytes[index + 1]
      index += 2
      switch escape {
      case UInt8(ascii: "b"): out.append(0x08)
      case UInt8(ascii: "f"): out.append(0x0C)
      case UInt8(ascii: "n"): out.append(0x0A)
      case UInt8(ascii: "r"): out.append(0x0D)
      case UInt8(ascii: "t"): out.append(0x09)
      case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): out.append(escape)
      case UInt8(ascii: "u"):
        guard let unit = Self.hexUnit(bytes, at: index) else { throw refuse() }
        index += 4
        var value = UInt32(unit)
        if (0xD800...0xDBFF).contains(unit) {
          guard let low = Self.hexUnit(bytes, at: index + 2), (0xDC00...0xDFFF).contains(low) else {
            throw refuse()
          }
          index += 6
          value = 0x10000 + (value - 0xD800) << 10 + (UInt32(low) - 0xDC00)
        }
        guard let scalar = Unicode.Scalar(value) else { throw refuse() }
        out.append(contentsOf: String(scalar).utf8)
      default:
        throw refuse()
      }
    }
    return String(decoding: out, as: UTF8.self)
  }

  func integer<T: FixedWidthInteger>(_ type: T.Type, _ index: Int) throws -> T {
    let node = nodes[index]
    guard node.kind == .integer else { throw refuse() }
    var position = node.start
    let negative = bytes[position] == UInt8(ascii: "-")
    if negative { position += 1 }
    var magnitude: UInt64 = 0
    while position < node.end {
      let (times10, overflow1) = magnitude.multipliedReportingOverflow(by: 10)
      let (sum, overflow2) = times10.addingReportingOverflow(UInt64(bytes[position] - UInt8(ascii: "0")))
      guard !overflow1, !overflow2 else { throw refuse() }
      magnitude = sum
      position += 1
    }
    if negative {
      // "-0" is left to JSONDecoder.
      guard magnitude > 0, T.isSigned else { throw refuse() }
      if magnitude == UInt64(Int64.max) + 1 {
        guard let value = T(exactly: Int64.min) else { throw refuse() }
        return value
      }
      guard magnitude <= UInt64(Int64.max), let value = T(exactly: -Int64(magnitude)) else { throw refuse() }
      return value
    }
    guard let value = T(exactly: magnitude) else { throw refuse() }
    return value
  }

  func double(_ index: Int) throws -> Double {
    let node = nodes[index]
    guard node.kind == .integer || node.kind == .number else { throw refuse() }
    let text = bytes.withUnsafeBufferPointer {
      String(decoding: UnsafeBufferPointer(rebasing: $0[node.start..<node.end]), as: UTF8.self)
    }
    guard let value = Double(text), value.isFinite, value == 0 || value.isNormal else { throw refuse() }
    if value == 0 {
      // A literal that underflows to zero is an error in JSONDecoder: only literal zeros pass.
      var position = node.start
      while position < node.end, bytes[position] != UInt8(ascii: "e"), bytes[position] != UInt8(ascii: "E") {
        if (UInt8(ascii: "1")...UInt8(ascii: "9")).contains(bytes[position]) { throw refuse() }
        position += 1
      }
    }
    return value
  }

  /// The value node of `key` in the object at `object`, or nil. A non-ASCII key is not certain:
  /// `JSONDecoder` compares keys by canonical equivalence.
  func member(_ key: String, inObjectAt object: Int) throws -> Int? {
    var key = key
    return try key.withUTF8 { wanted in
      guard wanted.allSatisfy({ $0 < 0x80 }) else { throw refuse() }
      var candidate = object + 1
      let end = nodes[object].after
      while candidate < end {
        let name = nodes[candidate]
        if name.end - name.start == wanted.count, bytes[name.start..<name.end].elementsEqual(wanted) {
          return candidate + 1
        }
        candidate = nodes[candidate + 1].after
      }
      return nil
    }
  }

  /// The keys of the object at `object`, in document order.
  func keys(ofObjectAt object: Int) -> [String] {
    var keys: [String] = []
    var candidate = object + 1
    let end = nodes[object].after
    while candidate < end {
      // Keys are plain ASCII without escapes (the parser refuses others), so this cannot fail.
      keys.append((try? string(candidate)) ?? "")
      candidate = nodes[candidate + 1].after
    }
    return keys
  }
}

/// A coding path as a chain from the innermost key outwards, made into an array only when a
/// `codingPath` is read: a nested decode costs one small object, not a copy of the whole path
/// (which made a long array deep in a payload quadratic).
final class CodingPathNode {
  let parent: CodingPathNode?
  let key: any CodingKey

  init(parent: CodingPathNode?, key: any CodingKey) {
    self.parent = parent
    self.key = key
  }

  static func keys(_ node: CodingPathNode?) -> [any CodingKey] {
    var keys: [any CodingKey] = []
    var node = node
    while let current = node {
      keys.append(current.key)
      node = current.parent
    }
    return keys.reversed()
  }
}

/// A position in an array, as `JSONDecoder` names it in coding paths.
private struct IndexKey: CodingKey {
  let intValue: Int?
  var stringValue: String { "Index \(intValue ?? 0)" }
  init(index: Int) { intValue = index }
  init?(stringValue: String) { nil }
  init?(intValue: Int) { self.intValue = intValue }
}

private struct TapeDecoder: Decoder {
  let tape: JSONTape
  let node: Int
  let path: CodingPathNode?
  var codingPath: [any CodingKey] { CodingPathNode.keys(path) }
  var userInfo: [CodingUserInfoKey: Any] { [:] }

  func container<Key: CodingKey>(keyedBy type: Key.Type) throws -> KeyedDecodingContainer<Key> {
    guard tape.node(node).kind == .object else { throw tape.refuse() }
    return KeyedDecodingContainer(TapeKeyedContainer<Key>(tape: tape, object: node, path: path))
  }

  func unkeyedContainer() throws -> any UnkeyedDecodingContainer {
    guard tape.node(node).kind == .array else { throw tape.refuse() }
    return TapeUnkeyedContainer(tape: tape, array: node, path: path)
  }

  func singleValueContainer() throws -> any SingleValueDecodingContainer {
    TapeSingleValueContainer(tape: tape, node: node, path: path)
  }
}

private struct TapeSingleValueContainer: SingleValueDecodingContainer {
  let tape: JSONTape
  let node: Int
  let path: CodingPathNode?
  var codingPath: [any CodingKey] { CodingPathNode.keys(path) }

  func decodeNil() -> Bool { tape.isNull(node) }
  func decode(_ type: Bool.Type) throws -> Bool { try tape.bool(node) }
  func decode(_ type: String.Type) throws -> String { try tape.string(node) }
  func decode(_ type: Double.Type) throws -> Double { try tape.double(node) }
  func decode(_ type: Float.Type) throws -> Float { throw tape.refuse() }
  func decode(_ type: Int.Type) throws -> Int { try tape.integer(type, node) }
  func decode(_ type: Int8.Type) throws -> Int8 { try tape.integer(type, node) }
  func decode(_ type: Int16.Type) throws -> Int16 { try tape.integer(type, node) }
  func decode(_ type: Int32.Type) throws -> Int32 { try tape.integer(type, node) }
  func decode(_ type: Int64.Type) throws -> Int64 { try tape.integer(type, node) }
  func decode(_ type: UInt.Type) throws -> UInt { try tape.integer(type, node) }
  func decode(_ type: UInt8.Type) throws -> UInt8 { try tape.integer(type, node) }
  func decode(_ type: UInt16.Type) throws -> UInt16 { try tape.integer(type, node) }
  func decode(_ type: UInt32.Type) throws -> UInt32 { try tape.integer(type, node) }
  func decode(_ type: UInt64.Type) throws -> UInt64 { try tape.integer(type, node) }
  func decode(_ type: Int128.Type) throws -> Int128 { throw tape.refuse() }
  func decode(_ type: UInt128.Type) throws -> UInt128 { throw tape.refuse() }
  func decode<T: Decodable>(_ type: T.Type) throws -> T {
    try tape.decode(type, at: node, path: path)
  }
}

private struct TapeKeyedContainer<Key: CodingKey>: KeyedDecodingContainerProtocol {
  let tape: JSONTape
  let object: Int
  let path: CodingPathNode?
  var codingPath: [any CodingKey] { CodingPathNode.keys(path) }

  var allKeys: [Key] { tape.keys(ofObjectAt: object).compactMap { Key(stringValue: $0) } }

  /// A key that cannot be looked up with certainty marks the whole decode uncertain (the answer
  /// given here is then thrown away).
  func contains(_ key: Key) -> Bool { (try? tape.member(key.stringValue, inObjectAt: object)) != nil }

  private func value(_ key: Key) throws -> Int {
    guard let node = try tape.member(key.stringValue, inObjectAt: object) else { throw tape.refuse() }
    return node
  }

  func decodeNil(forKey key: Key) throws -> Bool { tape.isNull(try value(key)) }
  func decode(_ type: Bool.Type, forKey key: Key) throws -> Bool { try tape.bool(value(key)) }
  func decode(_ type: String.Type, forKey key: Key) throws -> String { try tape.string(value(key)) }
  func decode(_ type: Double.Type, forKey key: Key) throws -> Double { try tape.double(value(key)) }
  func decode(_ type: Float.Type, forKey key: Key) throws -> Float { throw tape.refuse() }
  func decode(_ type: Int.Type, forKey key: Key) throws -> Int { try tape.integer(type, value(key)) }
  func decode(_ type: Int8.Type, forKey key: Key) throws -> Int8 { try tape.integer(type, value(key)) }
  func decode(_ type: Int16.Type, forKey key: Key) throws -> Int16 { try tape.integer(type, value(key)) }
  func decode(_ type: Int32.Type, forKey key: Key) throws -> Int32 { try tape.integer(type, value(key)) }
  func decode(_ type: Int64.Type, forKey key: Key) throws -> Int64 { try tape.integer(type, value(key)) }
  func decode(_ type: UInt.Type, forKey key: Key) throws -> UInt { try tape.integer(type, value(key)) }
  func decode(_ type: UInt8.Type, forKey key: Key) throws -> UInt8 { try tape.integer(type, value(key)) }
  func decode(_ type: UInt16.Type, forKey key: Key) throws -> UInt16 { try tape.integer(type, value(key)) }
  func decode(_ type: UInt32.Type, forKey key: Key) throws -> UInt32 { try tape.integer(type, value(key)) }
  func decode(_ type: UInt64.Type, forKey key: Key) throws -> UInt64 { try tape.integer(type, value(key)) }
  func decode(_ type: Int128.Type, forKey key: Key) throws -> Int128 { throw tape.refuse() }
  func decode(_ type: UInt128.Type, forKey key: Key) throws -> UInt128 { throw tape.refuse() }
  func decode<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T {
    try tape.decode(type, at: value(key), path: CodingPathNode(parent: path, key: key))
  }

  func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type, forKey key: Key) throws
    -> KeyedDecodingContainer<NestedKey>
  {
    try TapeDecoder(tape: tape, node: value(key), path: CodingPathNode(parent: path, key: key)).container(
      keyedBy: type)
  }

  func nestedUnkeyedContainer(forKey key: Key) throws -> any UnkeyedDecodingContainer {
    try TapeDecoder(tape: tape, node: value(key), path: CodingPathNode(parent: path, key: key))
      .unkeyedContainer()
  }

  func superDecoder() throws -> any Decoder { throw tape.refuse() }
  func superDecoder(forKey key: Key) throws -> any Decoder { throw tape.refuse() }
}

private struct TapeUnkeyedContainer: UnkeyedDecodingContainer {
  let tape: JSONTape
  let path: CodingPathNode?
  var codingPath: [any CodingKey] { CodingPathNode.keys(path) }
  private let elementCount: Int
  private(set) var currentIndex = 0
  /// The node of the element at `currentIndex`.
  private var next: Int

  init(tape: JSONTape, array: Int, path: CodingPathNode?) {
    self.tape = tape
    self.path = path
    elementCount = tape.node(array).count
    next = array + 1
  }

  var count: Int? { elementCount }
  var isAtEnd: Bool { currentIndex >= elementCount }

  /// Decodes the next element with `body` and moves past it only if that succeeds, as
  /// `JSONDecoder` does: a type whose `init(from:)` threw can be tried again, or skipped, by the
  /// caller (the "lossy array" decoders rely on it).
  private mutating func decodeNext<R>(_ body: (JSONTape, Int) throws -> R) throws -> R {
    guard !isAtEnd else { throw tape.refuse() }
    let value = try body(tape, next)
    next = tape.node(next).after
    currentIndex += 1
    return value
  }

  private var elementPath: CodingPathNode { CodingPathNode(parent: path, key: IndexKey(index: currentIndex)) }

  mutating func decodeNil() throws -> Bool {
    guard !isAtEnd else { throw tape.refuse() }
    guard tape.isNull(next) else { return false }
    return try decodeNext { _, _ in true }
  }

  mutating func decode(_ type: Bool.Type) throws -> Bool { try decodeNext { try $0.bool($1) } }
  mutating func decode(_ type: String.Type) throws -> String { try decodeNext { try $0.string($1) } }
  mutating func decode(_ type: Double.Type) throws -> Double { try decodeNext { try $0.double($1) } }
  mutating func decode(_ type: Float.Type) throws -> Float { throw tape.refuse() }
  mutating func decode(_ type: Int.Type) throws -> Int { try decodeNext { try $0.integer(type, $1) } }
  mutating func decode(_ type: Int8.Type) throws -> Int8 { try decodeNext { try $0.integer(type, $1) } }
  mutating func decode(_ type: Int16.Type) throws -> Int16 { try decodeNext { try $0.integer(type, $1) } }
  mutating func decode(_ type: Int32.Type) throws -> Int32 { try decodeNext { try $0.integer(type, $1) } }
  mutating func decode(_ type: Int64.Type) throws -> Int64 { try decodeNext { try $0.integer(type, $1) } }
  mutating func decode(_ type: UInt.Type) throws -> UInt { try decodeNext { try $0.integer(type, $1) } }
  mutating func decode(_ type: UInt8.Type) throws -> UInt8 { try decodeNext { try $0.integer(type, $1) } }
  mutating func decode(_ type: UInt16.Type) throws -> UInt16 { try decodeNext { try $0.integer(type, $1) } }
  mutating func decode(_ type: UInt32.Type) throws -> UInt32 { try decodeNext { try $0.integer(type, $1) } }
  mutating func decode(_ type: UInt64.Type) throws -> UInt64 { try decodeNext { try $0.integer(type, $1) } }
  mutating func decode(_ type: Int128.Type) throws -> Int128 { throw tape.refuse() }
  mutating func decode(_ type: UInt128.Type) throws -> UInt128 { throw tape.refuse() }
  mutating func decode<T: Decodable>(_ type: T.Type) throws -> T {
    let path = elementPath
    return try decodeNext { try $0.decode(type, at: $1, path: path) }
  }

  mutating func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type) throws
    -> KeyedDecodingContainer<NestedKey>
  {
    let path = elementPath
    return try decodeNext { try TapeDecoder(tape: $0, node: $1, path: path).container(keyedBy: type) }
  }

  mutating func nestedUnkeyedContainer() throws -> any UnkeyedDecodingContainer {
    let path = elementPath
    return try decodeNext { try TapeDecoder(tape: $0, node: $1, path: path).unkeyedContainer() }
  }

  mutating func superDecoder() throws -> any Decoder { throw tape.refuse() }
}
