import Conveyor
import Foundation

#if canImport(FoundationNetworking)
  import FoundationNetworking
#endif

/// An HTTP request stored as a job: what a durable outbox keeps until the server took it.
///
/// Deliver jobs with ``HTTPDelivery`` (or the `JobQueue` initialiser taking one). The item is
/// stored as plain JSON, headers included: add credentials at send time with
/// ``HTTPDelivery/prepare`` instead.
///
/// ```swift
/// let request = try HTTPRequest.post(
///   URL(string: "https://api.example.com/orders")!, json: ["sku": "A-42", "quantity": "2"])
/// try await outbox.add(request)
/// ```
public struct HTTPRequest: Queueable, Hashable {
  /// The method, e.g. `GET`, `POST`, `DELETE`.
  public var method: String
  /// The URL.
  public var url: URL
  /// Headers to send. An `Idempotency-Key` given here replaces the one ``HTTPDelivery`` derives.
  public var headers: [String: String]
  /// The body, if any.
  public var body: Data?
  /// Seconds the whole attempt may take (``HTTPDelivery`` cancels it then, and the job is
  /// retried); also URLSession's limit on silence. Nil: only the session's silence limit (60 s).
  public var timeout: TimeInterval?
  /// While a job with this key is pending or running, adding another one with the same key
  /// returns the existing job. Nil: never deduplicated.
  public var deduplicationKey: String?

  /// Creates a request.
  ///
  /// - Parameters:
  ///   - method: The method; upper-cased. Default `GET`.
  ///   - url: The URL.
  ///   - headers: Headers to send.
  ///   - body: The body.
  ///   - timeout: Seconds before an attempt times out; nil for the session's default.
  ///   - deduplicationKey: See ``deduplicationKey``.
  public init(
    method: String = "GET", url: URL, headers: [String: String] = [:], body: Data? = nil,
    timeout: TimeInterval? = nil, deduplicationKey: String? = nil
  ) {
    self.method = method.uppercased()
    self.url = url
    self.headers = headers
    self.body = body
    self.timeout = timeout
    self.deduplicationKey = deduplicationKey
  }

  /// A `GET` request.
  public static func get(_ url: URL, headers: [String: String] = [:]) -> HTTPRequest {
    HTTPRequest(method: "GET", url: url, headers: headers)
  }

  /// A `DELETE` request.
  public static func delete(_ url: URL, headers: [String: String] = [:]) -> HTTPRequest {
    HTTPRequest(method: "DELETE", url: url, headers: headers)
  }

  /// A request whose body is `value` encoded as JSON (`Content-Type: application/json`).
  ///
  /// - Parameters:
  ///   - method: Default `POST`.
  ///   - url: The URL.
  ///   - value: The body, encoded with `encoder`.
  ///   - headers: More headers.
  ///   - encoder: Default: a `JSONEncoder` with sorted keys.
  /// - Throws: The encoder's error.
  public static func json(
    _ method: String = "POST", _ url: URL, _ value: some Encodable, headers: [String: String] = [:],
    encoder: JSONEncoder? = nil
  ) throws -> HTTPRequest {
    let encoder =
      encoder
      ?? {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        return encoder
      }()
    var headers = headers
    headers["Content-Type"] = "application/json"
    return HTTPRequest(method: method, url: url, headers: headers, body: try encoder.encode(value))
  }

  /// A `POST` whose body is `value` encoded as JSON (`Content-Type: application/json`).
  ///
  /// - Throws: The encoder's error.
  public static func post(
    _ url: URL, json value: some Encodable, headers: [String: String] = [:]
  ) throws -> HTTPRequest {
    try json("POST", url, value, headers: headers)
  }

  /// A `POST` whose body is the parameters form-encoded
  /// (`Content-Type: application/x-www-form-urlencoded`), in the given order.
  public static func post(
    _ url: URL, form parameters: KeyValuePairs<String, String>, headers: [String: String] = [:]
  ) -> HTTPRequest {
    var headers = headers
    headers["Content-Type"] = "application/x-www-form-urlencoded"
    let body = parameters.map { formEncode($0.key) + "=" + formEncode($0.value) }.joined(separator: "&")
    return HTTPRequest(method: "POST", url: url, headers: headers, body: Data(body.utf8))
  }

  /// Checks that the request can go on the wire as it is meant: ``HTTPDelivery`` refuses (the
  /// job is dead) a request this throws for, before anything is sent. Call it before adding a
  /// request built from outside input, to refuse it at once.
  ///
  /// - The URL is `http://` or `https://` (the scheme in lower case), has a host, and any port is
  ///   in 1...65535.
  /// - The method is an RFC 9110 token (`A-Z a-z 0-9 ! # $ % & ' * + - . ^ _ ` | ~`), so it cannot
  ///   carry spaces, CR or LF onto the request line.
  /// - Header names are tokens, each name once (compared case-insensitively: join the values of a
  ///   repeated header with `", "`); header values hold no control character but tab (no CR,
  ///   LF or NUL, so no header can be smuggled in).
  /// - `Content-Length`, `Transfer-Encoding` and `Host` are not given: URLSession sets them from
  ///   the body and the URL, and a value given by hand could disagree with them.
  /// - `GET` and `HEAD` have no body (URLSession on Linux refuses to send one).
  /// - ``timeout``, if given, is a number of seconds above 0 and at most one year.
  ///
  /// ```swift
  /// let request = HTTPRequest(method: method, url: url, headers: headers)
  /// try request.validate()  // InvalidHTTPRequest: "header name "X\r\nY" ..."
  /// try await outbox.add(request)
  /// ```
  ///
  /// - Throws: ``InvalidHTTPRequest`` saying what is wrong and what is allowed.
  public func validate() throws(InvalidHTTPRequest) {
    guard let scheme = url.scheme, scheme == "http" || scheme == "https" else {
      throw InvalidHTTPRequest(
        "the URL \(url.redactedForLogs) must start with http:// or https:// (in lower case)")
    }
    guard let host = url.host, !host.isEmpty else {
      throw InvalidHTTPRequest("the URL \(url.redactedForLogs) has no host")
    }
    if let port = url.port, !(1...65_535).contains(port) {
      throw InvalidHTTPRequest("the URL's port \(port) is not in 1...65535")
    }
    guard Self.isToken(method) else {
      throw InvalidHTTPRequest(
        "the method \(Self.quoted(method)) is not an HTTP method: use letters, digits and !#$%&'*+-.^_`|~")
    }
    var seen = Set<String>()
    for (name, value) in headers.sorted(by: { $0.key < $1.key }) {
      guard Self.isToken(name) else {
        throw InvalidHTTPRequest(
          "the header name \(Self.quoted(name)) is not a token: use letters, digits and !#$%&'*+-.^_`|~")
      }
      let lowered = name.lowercased()
      guard seen.insert(lowered).inserted else {
        throw InvalidHTTPRequest(
          "the header \(name) is given twice (names ignore case); join its values with \", \"")
      }
      guard !Self.setByURLSession.contains(lowered) else {
        throw InvalidHTTPRequest(
          "the header \(name) cannot be given: it is set from the body and the URL")
      }
      guard value.unicodeScalars.allSatisfy(Self.isFieldValueScalar) else {
        throw InvalidHTTPRequest(
          "the value of header \(name) has a control character (CR, LF, NUL, ...); "
            + "only visible characters, spaces and tabs are allowed")
      }
    }
    if body != nil, method == "GET" || method == "HEAD" {
      throw InvalidHTTPRequest("a \(method) request cannot have a body; use POST, PUT or PATCH to send one")
    }
    if let timeout, !(timeout > 0 && timeout <= 31_536_000) {
      throw InvalidHTTPRequest("the timeout must be a number of seconds above 0 and at most a year")
    }
  }

  /// Headers URLSession sets itself, lower-cased; ``validate()`` refuses them.
  static let setByURLSession: Set<String> = ["content-length", "transfer-encoding", "host"]

  /// Whether `text` is an RFC 9110 token: one or more of `tchar`.
  static func isToken(_ text: String) -> Bool {
    !text.isEmpty
      && text.unicodeScalars.allSatisfy { scalar in
        scalar.isASCII
          && (("A"..."Z").contains(scalar) || ("a"..."z").contains(scalar) || ("0"..."9").contains(scalar)
            || "!#$%&'*+-.^_`|~".unicodeScalars.contains(scalar))
      }
  }

  /// Whether a header value may hold `scalar`: anything but a control character (C0 except tab,
  /// DEL, C1), so the value stays on its line.
  static func isFieldValueScalar(_ scalar: Unicode.Scalar) -> Bool {
    switch scalar.value {
    case 0x09: true
    case 0x00...0x1F, 0x7F...0x9F: false
    default: true
    }
  }

  /// `text` quoted, its control characters escaped, for an error message.
  static func quoted(_ text: String) -> String {
    "\""
      + text.unicodeScalars.map {
        isFieldValueScalar($0) && $0 != "\t" && $0 != "\""
          ? String($0) : "\\u{\(String($0.value, radix: 16))}"
      }.joined() + "\""
  }

  /// The `URLRequest` to send: method, URL, headers, body and timeout.
  public var urlRequest: URLRequest {
    var request = URLRequest(url: url)
    request.httpMethod = method
    for (name, value) in headers { request.setValue(value, forHTTPHeaderField: name) }
    request.httpBody = body
    if let timeout { request.timeoutInterval = timeout }
    return request
  }

  private static func formEncode(_ text: String) -> String {
    let allowed = CharacterSet(
      charactersIn: "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._* ")
    // Percent-encoding UTF-8 text cannot fail; the fallback keeps the text rather than crash.
    let encoded = text.addingPercentEncoding(withAllowedCharacters: allowed) ?? text
    return encoded.replacingOccurrences(of: " ", with: "+")
  }
}

/// Why ``HTTPRequest/validate()`` refused a request: what is wrong and what is allowed.
public struct InvalidHTTPRequest: Error, Sendable, Hashable, CustomStringConvertible {
  /// The explanation, e.g. `the header name "X\r\nY" is not a token: …`.
  public var description: String

  /// Creates the error.
  public init(_ description: String) { self.description = description }
}
