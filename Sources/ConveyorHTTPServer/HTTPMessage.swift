import Foundation

/// A request the server read in full: head and body.
public struct HTTPServerRequest: Sendable {
  /// The method, e.g. `GET`, as sent (methods are case-sensitive).
  public var method: String
  /// The request target as sent, e.g. `/jobs?queue=outbox`.
  public var target: String
  /// `HTTP/1.1` or `HTTP/1.0`.
  public var version: String
  /// The header fields in the order they came, names as sent.
  public var headers: [(name: String, value: String)]
  /// The body (empty without `Content-Length`).
  public var body: Data

  /// Creates a request; the server builds them, tests may too.
  public init(
    method: String, target: String, version: String = "HTTP/1.1", headers: [(name: String, value: String)],
    body: Data = Data()
  ) {
    self.method = method
    self.target = target
    self.version = version
    self.headers = headers
    self.body = body
  }

  /// The target before `?`, still percent-encoded.
  public var path: String { String(target.prefix { $0 != "?" }) }

  /// The target after `?`, or nil.
  public var query: String? {
    guard let mark = target.firstIndex(of: "?") else { return nil }
    return String(target[target.index(after: mark)...])
  }

  /// The value of the first field named `name` (case-insensitive), or nil.
  public func header(_ name: String) -> String? {
    headers.first { $0.name.caseInsensitiveCompare(name) == .orderedSame }?.value
  }

  /// The query's fields, decoded as `application/x-www-form-urlencoded`.
  public var queryItems: HTTPForm { HTTPForm(encoded: query ?? "") }

  /// The body's fields, decoded as `application/x-www-form-urlencoded`.
  public var form: HTTPForm { HTTPForm(encoded: String(decoding: body, as: UTF8.self)) }
}

/// Fields of an `application/x-www-form-urlencoded` text: a query string or a form's body.
public struct HTTPForm: Sendable, Hashable {
  /// The decoded fields in order; a name may repeat.
  public var fields: [Field]

  /// One decoded field.
  public struct Field: Sendable, Hashable {
    /// The decoded name.
    public var name: String
    /// The decoded value.
    public var value: String
  }

  /// Decodes `name=value&…`: `+` is a space, `%XX` a byte; malformed escapes are kept as text.
  public init(encoded: String) {
    fields = encoded.split(separator: "&", omittingEmptySubsequences: true).map { pair in
      let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
      return Field(
        name: Self.decode(parts[0]), value: parts.count > 1 ? Self.decode(parts[1]) : "")
    }
  }

  /// The first value of `name`, or nil.
  public subscript(name: String) -> String? {
    fields.first { $0.name == name }?.value
  }

  /// Every value of `name`, in order.
  public func values(_ name: String) -> [String] {
    fields.filter { $0.name == name }.map(\.value)
  }

  /// Percent-encodes `text` for a query or form value (everything but unreserved characters).
  public static func encode(_ text: String) -> String {
    var result = ""
    for byte in text.utf8 {
      switch byte {
      case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
        UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"),
        UInt8(ascii: "~"):
        result.unicodeScalars.append(Unicode.Scalar(byte))
      default:
        result +=
          "%" + String(byte >> 4, radix: 16, uppercase: true)
          + String(byte & 0xF, radix: 16, uppercase: true)
      }
    }
    return result
  }

  private static func decode(_ text: Substring) -> String {
    var bytes: [UInt8] = []
    var iterator = Array(text.utf8)[...]
    while let byte = iterator.popFirst() {
      if byte == UInt8(ascii: "+") {
        bytes.append(UInt8(ascii: " "))
      } else if byte == UInt8(ascii: "%"), iterator.count >= 2,
        let high = hexValue(iterator[iterator.startIndex]),
        let low = hexValue(iterator[iterator.startIndex + 1])
      {
        bytes.append(high << 4 | low)
        iterator = iterator.dropFirst(2)
      } else {
        bytes.append(byte)
      }
    }
    return String(decoding: bytes, as: UTF8.self)
  }

  private static func hexValue(_ byte: UInt8) -> UInt8? {
    switch byte {
    case UInt8(ascii: "0")...UInt8(ascii: "9"): byte - UInt8(ascii: "0")
    case UInt8(ascii: "a")...UInt8(ascii: "f"): byte - UInt8(ascii: "a") + 10
    case UInt8(ascii: "A")...UInt8(ascii: "F"): byte - UInt8(ascii: "A") + 10
    default: nil
    }
  }
}

/// What the server sends back.
public struct HTTPServerResponse: Sendable {
  /// The status code.
  public var status: Int
  /// Header fields in order. The server sets `Content-Length`, `Connection` and `Date` itself and
  /// drops fields of those names given here.
  public var headers: [(name: String, value: String)]
  /// The body (not sent for `HEAD` requests, nor for 204 and 304).
  public var body: Data

  /// Creates a response.
  public init(status: Int = 200, headers: [(name: String, value: String)] = [], body: Data = Data()) {
    self.status = status
    self.headers = headers
    self.body = body
  }

  /// A response with a UTF-8 text body and its content type.
  public static func text(_ status: Int, _ text: String, contentType: String = "text/plain; charset=utf-8")
    -> HTTPServerResponse
  {
    HTTPServerResponse(status: status, headers: [("Content-Type", contentType)], body: Data(text.utf8))
  }

  /// The standard reason phrase of `status`, or `Status`.
  public static func reason(_ status: Int) -> String {
    switch status {
    case 100: "Continue"
    case 200: "OK"
    case 201: "Created"
    case 204: "No Content"
    case 303: "See Other"
    case 304: "Not Modified"
    case 400: "Bad Request"
    case 401: "Unauthorized"
    case 403: "Forbidden"
    case 404: "Not Found"
    case 405: "Method Not Allowed"
    case 408: "Request Timeout"
    case 409: "Conflict"
    case 411: "Length Required"
    case 413: "Content Too Large"
    case 414: "URI Too Long"
    case 415: "Unsupported Media Type"
    case 421: "Misdirected Request"
    case 431: "Request Header Fields Too Large"
    case 500: "Internal Server Error"
    case 501: "Not Implemented"
    case 503: "Service Unavailable"
    case 505: "HTTP Version Not Supported"
    default: "Status"
    }
  }
}
