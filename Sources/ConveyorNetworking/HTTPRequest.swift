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
  /// Seconds to wait for the server before the attempt fails as a timeout (and is retried).
  /// Nil: the session's default (60 s).
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
