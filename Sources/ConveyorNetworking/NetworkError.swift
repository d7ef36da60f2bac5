import Foundation

#if canImport(FoundationNetworking)
  import FoundationNetworking
#endif

/// Why a network operation produced no value.
///
/// Every case carries plain values, so errors compare with `==` in tests and travel across
/// threads. `description` says what happened in one line and never contains a response body;
/// `debugDescription` adds a short excerpt of it.
///
/// Cancellation is not a case: a cancelled operation throws `OperationError.cancelled`.
///
/// ```swift
/// do {
///   let data = try await NetworkDataOperation(request: request).run()
///   print(data.count, "bytes")
/// } catch {
///   switch error {
///   case .failed(.httpStatus(let status)) where status.statusCode == 404: print("missing:", status.bodyText)
///   case .failed(let failure): print("failed:", failure, failure.isTransient ? "(try again)" : "")
///   case .cancelled: print("cancelled")
///   }
/// }
/// ```
public enum NetworkError: Error, Hashable, CustomStringConvertible, CustomDebugStringConvertible {
  /// The request never got an HTTP answer: no connection, DNS failure, timeout, TLS failure,
  /// connection lost. Usually worth retrying.
  case transport(Transport)
  /// The server answered with a status outside the operation's accepted status codes.
  case httpStatus(HTTPStatus)
  /// The answer was not a valid HTTP response (garbage on the wire, or a non-HTTP URL scheme).
  case invalidResponse(String)
  /// The server closed the connection without answering (as reported on Linux; Apple platforms
  /// may report a transport error), or the task ended with neither a result nor an error.
  case emptyResponse
  /// The operation's `prepareRequest` (or its `prepare` closure) threw; nothing was sent.
  case preparation(Underlying)
  /// The response was accepted but the evaluate closure threw.
  case evaluation(Underlying)

  /// A transport failure: the `URLError` code and its message.
  public struct Transport: Hashable, Sendable {
    /// The `URLError` code, e.g. `.timedOut`, `.cannotConnectToHost`.
    public var code: URLError.Code
    /// The system's message for it.
    public var message: String

    /// Creates a transport failure.
    public init(code: URLError.Code, message: String) {
      self.code = code
      self.message = message
    }
  }

  /// An HTTP status the operation did not accept, with the headers and the start of the body.
  public struct HTTPStatus: Hashable, Sendable {
    /// The status code, e.g. 404.
    public var statusCode: Int
    /// The response headers; look them up case-insensitively with ``header(_:)``.
    public var headers: [String: String]
    /// At most the operation's `bodyExcerptLimit` bytes from the start of the body.
    public var bodyExcerpt: Data
    /// Whether the body was longer than ``bodyExcerpt``.
    public var bodyIsTruncated: Bool
    /// The URL that answered (after redirects).
    public var url: URL?

    /// Creates an HTTP status failure.
    public init(
      statusCode: Int, headers: [String: String] = [:], bodyExcerpt: Data = Data(),
      bodyIsTruncated: Bool = false, url: URL? = nil
    ) {
      self.statusCode = statusCode
      self.headers = headers
      self.bodyExcerpt = bodyExcerpt
      self.bodyIsTruncated = bodyIsTruncated
      self.url = url
    }

    /// The value of a header, matched case-insensitively.
    public func header(_ name: String) -> String? {
      if let value = headers[name] { return value }
      let lowered = name.lowercased()
      return headers.first { $0.key.lowercased() == lowered }?.value
    }

    /// The body excerpt as text (invalid UTF-8 replaced), "…" appended when truncated.
    public var bodyText: String {
      String(decoding: bodyExcerpt, as: UTF8.self) + (bodyIsTruncated ? "…" : "")
    }
  }

  /// An error thrown by user code, kept with its type name and description so that
  /// `NetworkError` stays `Hashable`. Two values are equal when type name and message are.
  public struct Underlying: Hashable, Sendable {
    /// The thrown error.
    public let error: any Error
    /// The error's type, e.g. `DecodingError`.
    public let typeName: String
    /// `String(describing: error)`.
    public let message: String

    /// Wraps an error.
    public init(_ error: any Error) {
      self.error = error
      self.typeName = String(reflecting: type(of: error))
      self.message = String(describing: error)
    }

    /// Equal when type name and message are.
    public static func == (lhs: Underlying, rhs: Underlying) -> Bool {
      lhs.typeName == rhs.typeName && lhs.message == rhs.message
    }

    /// Hashes type name and message.
    public func hash(into hasher: inout Hasher) {
      hasher.combine(typeName)
      hasher.combine(message)
    }
  }

  /// One line saying what happened, without the body.
  public var description: String {
    switch self {
    case .transport(let transport):
      "transport error (URLError \(transport.code.rawValue)): \(transport.message)"
    case .httpStatus(let status):
      "HTTP status \(status.statusCode) (\(HTTPURLResponse.localizedString(forStatusCode: status.statusCode)))"
        + (status.url.map { " from \($0.redactedForLogs)" } ?? "")
    case .invalidResponse(let message): "invalid response: \(message)"
    case .emptyResponse: "empty response: the server closed the connection without answering"
    case .preparation(let underlying): "could not prepare the request: \(underlying.message)"
    case .evaluation(let underlying): "could not evaluate the response: \(underlying.message)"
    }
  }

  /// The description plus, for an HTTP status, up to 512 bytes of the body.
  public var debugDescription: String {
    guard case .httpStatus(let status) = self, !status.bodyExcerpt.isEmpty else { return description }
    let excerpt = status.bodyExcerpt.prefix(512)
    let truncated = status.bodyIsTruncated || excerpt.count < status.bodyExcerpt.count
    return description + "; body: " + String(decoding: excerpt, as: UTF8.self) + (truncated ? "…" : "")
  }

  /// The HTTP statuses after which trying again later may succeed: 408, 425, 429 and 5xx.
  public static let transientStatusCodes: Set<Int> = Set([408, 425, 429]).union(500..<600)

  /// Whether trying again later may succeed: transport failures (except a malformed or
  /// unsupported URL, and a server demanding authentication), invalid and empty responses, and
  /// the ``transientStatusCodes``.
  public var isTransient: Bool {
    switch self {
    case .transport(let transport):
      ![.badURL, .unsupportedURL, .userAuthenticationRequired].contains(transport.code)
    case .httpStatus(let status):
      Self.transientStatusCodes.contains(status.statusCode)
    case .invalidResponse, .emptyResponse: true
    case .preparation, .evaluation: false
    }
  }

  /// Maps an error reported by a `URLSessionTask`.
  static func fromTask(_ error: any Error) -> NetworkError {
    let nsError = error as NSError
    let code: URLError.Code
    if let urlError = error as? URLError {
      code = urlError.code
    } else if nsError.domain == NSURLErrorDomain, let known = URLError.Code(rawValue: nsError.code) {
      code = known
    } else {
      code = .unknown
    }
    let message = nsError.localizedDescription
    // swift-corelibs-foundation reports curl's messages: "Empty reply from server" (-1011) when
    // the connection closed without an answer, and "Received HTTP/0.9 when not allowed" (-1002)
    // when the answer was not HTTP. Apple platforms report those as other codes (often
    // `.networkConnectionLost`), which stay transport errors.
    switch code {
    case .zeroByteResource:
      return .emptyResponse
    case .badServerResponse where message.localizedCaseInsensitiveContains("empty reply"):
      return .emptyResponse
    case .badServerResponse:
      return .invalidResponse("the server's answer is not valid HTTP: \(message)")
    case .unsupportedURL where message.contains("HTTP/0.9"):
      return .invalidResponse("the server's answer is not valid HTTP: \(message)")
    default:
      return .transport(Transport(code: code, message: message))
    }
  }
}

extension URL {
  /// Scheme, host, port and path only: no user, password or query, which may hold secrets.
  var redactedForLogs: String {
    guard var components = URLComponents(url: self, resolvingAgainstBaseURL: false) else {
      return "a URL"
    }
    components.user = nil
    components.password = nil
    components.query = nil
    components.fragment = nil
    return components.string ?? "a URL"
  }
}
