/// The bounds a server holds every connection and request to.
public struct HTTPServerLimits: Sendable, Hashable {
  /// The longest request line (method, target, version) in bytes; longer is 414.
  public var maximumRequestLine = 8192
  /// The largest head (request line and every header field) in bytes; larger is 431.
  public var maximumHeadSize = 16_384
  /// The most header fields; more is 431.
  public var maximumHeaderCount = 100
  /// The largest body in bytes; a larger `Content-Length` is 413, refused before it is read.
  public var maximumBodySize = 1 << 20
  /// How long a whole request (head and body) may take to arrive once its first byte came;
  /// longer is 408, then the connection closes. A client sending a byte a second is cut off here.
  public var requestTimeout: Duration = .seconds(10)
  /// How long a request head may take to arrive: from the moment the connection is served for its
  /// first request, from its first byte for a later one on a kept-alive connection. Longer is 408
  /// (a connection that sent nothing is closed quietly), then the connection closes. A browser
  /// sends its head in one piece at once; a client that opens connections and sends a byte now and
  /// then holds each slot this long, not ``idleTimeout`` plus ``requestTimeout``.
  public var headTimeout: Duration = .seconds(3)
  /// How long a kept-alive connection may wait for its next request; then it closes quietly.
  public var idleTimeout: Duration = .seconds(5)
  /// How long sending a response may block on a client that does not read.
  public var writeTimeout: Duration = .seconds(10)
  /// Connections served at once (one thread each); a connection beyond it is answered 503 and closed.
  public var maximumConnections = 32
  /// Connections served at once for one peer: one IPv4 address, or one IPv6 /64 network (what one
  /// machine is usually given). A connection beyond it is answered 503 and closed, so one client
  /// cannot take every slot. Behind a reverse proxy every connection comes from the proxy: keep it
  /// at most ``maximumConnections``.
  public var maximumConnectionsPerPeer = 8
  /// Requests served on one connection before it is closed.
  public var maximumRequestsPerConnection = 1000

  /// The defaults.
  public init() {}
}

/// A request head read off the wire, before its body.
struct RequestHead: Equatable {
  var method: String
  var target: String
  var version: String
  var headers: [Header]
  /// The body's length from `Content-Length`, 0 without one.
  var contentLength: Int

  struct Header: Equatable {
    var name: String
    var value: String
  }

  /// Whether the connection stays open after the response, by version and `Connection`.
  var keepAlive: Bool {
    let tokens = headers.filter { $0.name.lowercased() == "connection" }
      .flatMap { $0.value.lowercased().split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) } }
    if tokens.contains("close") { return false }
    return version == "HTTP/1.1" || tokens.contains("keep-alive")
  }

  /// Whether the client waits for `100 Continue` before sending the body.
  var expectsContinue: Bool {
    headers.contains { $0.name.lowercased() == "expect" && $0.value.lowercased() == "100-continue" }
  }
}

/// What ``RequestHeadParser/parse(_:limits:)`` makes of the bytes received so far.
enum HeadParseResult: Equatable {
  /// More bytes are needed.
  case incomplete
  /// A head, and how many bytes of the buffer it took (with the blank line and any leading CR LFs).
  case complete(RequestHead, length: Int)
  /// The request is refused with this status; the connection is closed after the answer.
  case failure(status: Int, reason: String)
}

/// Parses a request head from bytes: a pure function of the buffer and the limits, so every
/// refusal is tested with plain values.
enum RequestHeadParser {
  /// Parses `buffer` (the bytes received on the connection that are not yet part of a request).
  static func parse(_ buffer: [UInt8], limits: HTTPServerLimits) -> HeadParseResult {
    // Empty lines before a request line are ignored (RFC 9112 2.2), up to a few.
    var start = 0
    while start + 1 < buffer.count, buffer[start] == cr, buffer[start + 1] == lf, start < 8 { start += 2 }
    guard let lineEnd = find(crlf, in: buffer, from: start) else {
      if buffer.count - start > limits.maximumRequestLine {
        return .failure(status: 414, reason: "request line too long")
      }
      if buffer[start...].contains(lf) { return .failure(status: 400, reason: "bare LF in the request line") }
      return .incomplete
    }
    if lineEnd - start > limits.maximumRequestLine {
      return .failure(status: 414, reason: "request line too long")
    }
    guard let headEnd = find(crlf + crlf, in: buffer, from: lineEnd) else {
      if buffer.count - start > limits.maximumHeadSize {
        return .failure(status: 431, reason: "head too large")
      }
      return .incomplete
    }
    let length = headEnd + 4
    if length - start > limits.maximumHeadSize { return .failure(status: 431, reason: "head too large") }
    let lines = split(Array(buffer[start..<headEnd]))
    for line in lines where line.contains(cr) || line.contains(lf) || line.contains(0) {
      return .failure(status: 400, reason: "CR, LF or NUL inside a line")
    }
    let requestLine = lines[0]
    let parts = requestLine.split(separator: space, omittingEmptySubsequences: false)
    guard parts.count == 3 else { return .failure(status: 400, reason: "malformed request line") }
    let method = Array(parts[0])
    var target = Array(parts[1])
    let version = String(decoding: parts[2], as: UTF8.self)
    guard !method.isEmpty, method.allSatisfy(isToken) else {
      return .failure(status: 400, reason: "malformed method")
    }
    guard target.allSatisfy({ (0x21...0x7E).contains($0) }) else {
      return .failure(status: 400, reason: "malformed target")
    }
    // The absolute form (`GET http://host/path HTTP/1.1`), which a server must accept (RFC 9112
    // 3.2.2): the target's authority stands for the Host field, the rest is the target.
    var authority: [UInt8]?
    if target.first != UInt8(ascii: "/") {
      guard let (host, path) = absoluteForm(target) else {
        return .failure(status: 400, reason: "malformed target")
      }
      authority = host
      target = path
    }
    guard version == "HTTP/1.1" || version == "HTTP/1.0" else {
      let looksLikeHTTP =
        version.count == 8 && version.hasPrefix("HTTP/")
        && version.utf8.dropFirst(5).enumerated().allSatisfy {
          $0.offset == 1 ? $0.element == UInt8(ascii: ".") : (0x30...0x39).contains($0.element)
        }
      return .failure(status: looksLikeHTTP ? 505 : 400, reason: "unsupported version")
    }
    var headers: [RequestHead.Header] = []
    for line in lines.dropFirst() {
      if headers.count >= limits.maximumHeaderCount {
        return .failure(status: 431, reason: "too many fields")
      }
      guard let colon = line.firstIndex(of: UInt8(ascii: ":")) else {
        return .failure(status: 400, reason: "a field without a colon")
      }
      let name = line[..<colon]
      guard !name.isEmpty, name.allSatisfy(isToken) else {
        // Also refuses obsolete line folding (a line starting with a space or tab).
        return .failure(status: 400, reason: "malformed field name")
      }
      var value = line[(colon + 1)...]
      while let first = value.first, first == space || first == tab { value = value.dropFirst() }
      while let last = value.last, last == space || last == tab { value = value.dropLast() }
      guard value.allSatisfy({ $0 == tab || $0 >= 0x20 && $0 != 0x7F }) else {
        return .failure(status: 400, reason: "control character in a field value")
      }
      headers.append(
        .init(name: String(decoding: name, as: UTF8.self), value: String(decoding: value, as: UTF8.self)))
    }
    if headers.contains(where: { $0.name.lowercased() == "transfer-encoding" }) {
      return .failure(status: 501, reason: "transfer codings are not supported; send Content-Length")
    }
    let lengths = Set(headers.filter { $0.name.lowercased() == "content-length" }.map(\.value))
    var contentLength = 0
    if let text = lengths.first {
      guard lengths.count == 1, !text.isEmpty, text.count <= 18,
        text.utf8.allSatisfy({ (0x30...0x39).contains($0) }),
        let value = Int(text)
      else { return .failure(status: 400, reason: "malformed Content-Length") }
      contentLength = value
    }
    if contentLength > limits.maximumBodySize { return .failure(status: 413, reason: "body too large") }
    let hosts = headers.filter { $0.name.lowercased() == "host" }
    if version == "HTTP/1.1" && hosts.count != 1 || hosts.count > 1 {
      return .failure(status: 400, reason: "HTTP/1.1 needs exactly one Host field")
    }
    if let authority {
      let value = String(decoding: authority, as: UTF8.self)
      headers.removeAll { $0.name.lowercased() == "host" }
      headers.append(.init(name: "Host", value: value))
    }
    let head = RequestHead(
      method: String(decoding: method, as: UTF8.self), target: String(decoding: target, as: UTF8.self),
      version: version, headers: headers, contentLength: contentLength)
    return .complete(head, length: length)
  }

  private static let cr = UInt8(ascii: "\r")
  private static let lf = UInt8(ascii: "\n")
  private static let space = UInt8(ascii: " ")
  private static let tab = UInt8(ascii: "\t")
  private static let crlf: [UInt8] = [cr, lf]

  /// RFC 9110 `tchar`.
  private static func isToken(_ byte: UInt8) -> Bool {
    switch byte {
    case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
      UInt8(ascii: "0")...UInt8(ascii: "9"):
      true
    default: "!#$%&'*+-.^_`|~".utf8.contains(byte)
    }
  }

  /// Splits an absolute-form target, `http://authority/path?query` (the scheme in any case), into
  /// its authority and its origin-form rest (`/` when the path is empty); nil for another scheme,
  /// an empty authority, or one with user information (RFC 9110 4.2.4).
  static func absoluteForm(_ target: [UInt8]) -> (authority: [UInt8], path: [UInt8])? {
    let lowered = target.prefix(8).map { $0 | 0x20 }
    let schemeLength: Int
    if lowered.starts(with: Array("http://".utf8)) {
      schemeLength = 7
    } else if lowered.starts(with: Array("https://".utf8)) {
      schemeLength = 8
    } else {
      return nil
    }
    let rest = target.dropFirst(schemeLength)
    let end = rest.firstIndex {
      $0 == UInt8(ascii: "/") || $0 == UInt8(ascii: "?") || $0 == UInt8(ascii: "#")
    }
    let authority = Array(rest[..<(end ?? rest.endIndex)])
    guard !authority.isEmpty, !authority.contains(UInt8(ascii: "@")) else { return nil }
    var path = Array(rest[(end ?? rest.endIndex)...])
    if path.first == UInt8(ascii: "#") { path = [] }
    if path.first != UInt8(ascii: "/") { path.insert(UInt8(ascii: "/"), at: 0) }
    return (authority, path)
  }

  /// The index where `needle` first starts in `buffer` at or after `from`.
  static func find(_ needle: [UInt8], in buffer: [UInt8], from: Int) -> Int? {
    guard buffer.count >= needle.count, from <= buffer.count - needle.count else { return nil }
    var index = max(from, 0)
    while index <= buffer.count - needle.count {
      if buffer[index] == needle[0] {
        var matched = true
        for offset in 1..<needle.count where buffer[index + offset] != needle[offset] {
          matched = false
          break
        }
        if matched { return index }
      }
      index += 1
    }
    return nil
  }

  /// Splits on CR LF.
  private static func split(_ bytes: [UInt8]) -> [ArraySlice<UInt8>] {
    var lines: [ArraySlice<UInt8>] = []
    var start = 0
    while let end = find(crlf, in: bytes, from: start) {
      lines.append(bytes[start..<end])
      start = end + 2
    }
    lines.append(bytes[start...])
    return lines
  }
}
