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
