import Conveyor
import ConveyorNetworking
import Foundation

#if canImport(FoundationNetworking)
  import FoundationNetworking
#endif

/// The typed operation kit's data operation: `NetworkDataOperation(url:urlSession:evaluate:)`,
/// on ConveyorNetworking's `NetworkDataOperation`.
///
/// ```swift
/// let operation = NetworkDataOperation(url: url, urlSession: .shared) { data, response in
///   return try JSONDecoder().decode(MyObject.self, from: data)
/// }
/// operation.successHandler = { myObject in … }
/// ```
///
/// Differences on purpose: the HTTP status is checked (only `200..<300` succeeds; see
/// `acceptedStatusCodes`), and `failureHandler` receives a typed `NetworkError` (transport,
/// HTTP status with the body, invalid or empty response, evaluation) instead of an `NSError`.
/// A given `URLSession` is used as is, with its own delegate (see
/// `NetworkSession.init(urlSession:)`); `URLSession.shared` means Conveyor's shared
/// `NetworkSession`. The operation finishes after its handler ran.
// @unchecked Sendable: adds no stored properties; see ConveyorNetworking's `NetworkOperation`,
// which guards its settings and task with `Mutex`es.
open class NetworkDataOperation<ResultType: Sendable>: ConveyorNetworking.NetworkDataOperation<ResultType>,
  @unchecked Sendable
{
  /// Creates an operation that fetches `url` on `urlSession` and evaluates the body of an accepted
  /// response.
  ///
  /// - Parameters:
  ///   - url: The URL to fetch (a GET; adjust the request with `prepare`).
  ///   - urlSession: Any session, with or without a delegate of its own.
  ///   - evaluate: Makes the value from the body and response; a thrown error fails the operation
  ///     with `NetworkError.evaluation`.
  public init(
    url: URL, urlSession: URLSession,
    evaluate: @escaping @Sendable (Data, HTTPURLResponse) throws -> ResultType
  ) {
    super.init(
      request: URLRequest(url: url), session: .wrapping(urlSession), evaluate: evaluate)
    finishesAfterHandlers = true
  }

  /// The URL the operation fetches.
  public var url: URL { request.url! }
  /// The session the operation runs on (for `URLSession.shared`, Conveyor's shared session).
  public var urlSession: URLSession { session.urlSession }
}

extension NetworkSession {
  /// Conveyor's shared session for `URLSession.shared` (no URL cache on Linux, download progress,
  /// credentials dropped on cross-origin redirects); any other session wrapped as it is, keeping
  /// its delegate.
  static func wrapping(_ urlSession: URLSession) -> NetworkSession {
    urlSession === URLSession.shared ? .shared : NetworkSession(urlSession: urlSession)
  }
}

/// The typed operation kit's download operation: `NetworkDownloadOperation<T>(url:urlSession:evaluate:)`,
/// whose evaluate closure gets the temporary file (move it to keep it), on ConveyorNetworking's
/// `NetworkDownloadOperation`.
///
/// ```swift
/// let operation = NetworkDownloadOperation<URL>(url: url, urlSession: .shared) { tempURL, response in
///   try FileManager.default.moveItem(at: tempURL, to: finalFileURL)
///   return finalFileURL
/// }
/// ```
///
/// The same differences as ``NetworkDataOperation`` apply; the temporary file is deleted if the
/// evaluation did not move it.
// @unchecked Sendable: adds no stored properties; see ConveyorNetworking's
// `NetworkDownloadOperation`, which guards its state with `Mutex`es.
open class NetworkDownloadOperation<ResultType: Sendable>:
  ConveyorNetworking.NetworkDownloadOperation<ResultType>, @unchecked Sendable
{
  /// Creates an operation that downloads `url` on `urlSession` and evaluates the temporary file
  /// of an accepted response.
  ///
  /// - Parameters:
  ///   - url: The URL to download.
  ///   - urlSession: Any session, with or without a delegate of its own.
  ///   - evaluate: Makes the value from the temporary file (which it must move to keep) and the
  ///     response.
  public init(
    url: URL, urlSession: URLSession,
    evaluate: @escaping @Sendable (URL, HTTPURLResponse) throws -> ResultType
  ) {
    super.init(
      request: URLRequest(url: url), session: .wrapping(urlSession), evaluate: evaluate)
    finishesAfterHandlers = true
  }

  /// The URL the operation downloads.
  public var url: URL { request.url! }
  /// The session the operation runs on (for `URLSession.shared`, Conveyor's shared session).
  public var urlSession: URLSession { session.urlSession }
}
