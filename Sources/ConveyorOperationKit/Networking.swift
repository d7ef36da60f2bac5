import Conveyor
import ConveyorNetworking
import Foundation
import Synchronization

#if canImport(FoundationNetworking)
  import FoundationNetworking
#endif

/// The typed operation kit's data operation: `NetworkDataOperation(url:urlSession:evaluate:)`.
///
/// ```swift
/// let operation = NetworkDataOperation(url: url, urlSession: .shared) { data, response in
///   return try JSONDecoder().decode(MyObject.self, from: data)
/// }
/// operation.successHandler = { myObject in … }
/// ```
///
/// Its members are the old class's and ``AsyncOperation``'s, nothing more; the transfer is made
/// by ConveyorNetworking's `NetworkDataOperation`, which this operation starts in `main()` and
/// cancels with `cancel()`.
///
/// Differences on purpose: the HTTP status is checked (only `acceptedStatusCodes`, by default
/// `200..<300`, succeed), and `failureHandler` receives a typed `NetworkError` (transport, HTTP
/// status with the body, invalid or empty response, preparation, evaluation) instead of an
/// `NSError`. A given `URLSession` is used as is, with its own delegate; `URLSession.shared`
/// means Conveyor's shared `NetworkSession`. The operation finishes after its handler ran.
// @unchecked Sendable: `transfer` is a `Mutex`; the rest is immutable. The superclass guards its
// own state.
open class NetworkDataOperation<ResultType: Sendable>: AsyncOperation<ResultType, NetworkError>,
  @unchecked Sendable
{
  /// The evaluate closure's type, under the old kit's name.
  public typealias NetworkResponseEvaluation = @Sendable (Data, HTTPURLResponse) throws -> ResultType

  /// The closure given to the initialiser, in a `Sendable` box.
  private struct Evaluation: Sendable {
    var evaluate: NetworkResponseEvaluation
  }

  /// The URL the operation fetches.
  public let url: URL
  /// The session the operation runs on.
  public let urlSession: URLSession
  private let evaluation: Evaluation
  private let accepted: Set<Int>
  private let transfer = Mutex<ConveyorNetworking.NetworkDataOperation<ResultType>?>(nil)

  /// Creates an operation that fetches `url` on `urlSession` and evaluates the body of a response
  /// whose status is in `200..<300`: the old kit's initialiser, `required` as it was there.
  ///
  /// - Parameters:
  ///   - url: The URL to fetch (a GET; adjust the request in ``prepareRequest(_:)``).
  ///   - urlSession: Any session, with or without a delegate of its own.
  ///   - evaluate: Makes the value from the body and response; a thrown error fails the operation
  ///     with `NetworkError.evaluation`.
  public required init(url: URL, urlSession: URLSession, evaluate: @escaping NetworkResponseEvaluation) {
    self.url = url
    self.urlSession = urlSession
    self.evaluation = Evaluation(evaluate: evaluate)
    self.accepted = Set(200..<300)
    super.init()
  }

  /// Creates an operation that fetches `url` on `urlSession` and evaluates the body of an accepted
  /// response.
  ///
  /// - Parameters:
  ///   - url: The URL to fetch (a GET; adjust the request in ``prepareRequest(_:)``).
  ///   - urlSession: Any session, with or without a delegate of its own.
  ///   - acceptedStatusCodes: The statuses that count as success; others fail with
  ///     `NetworkError.httpStatus` (the old kit accepted every status: pass `Set(100..<600)` for
  ///     that).
  ///   - evaluate: Makes the value from the body and response; a thrown error fails the operation
  ///     with `NetworkError.evaluation`.
  public init(
    url: URL, urlSession: URLSession, acceptedStatusCodes: Set<Int>,
    evaluate: @escaping NetworkResponseEvaluation
  ) {
    self.url = url
    self.urlSession = urlSession
    self.evaluation = Evaluation(evaluate: evaluate)
    self.accepted = acceptedStatusCodes
    super.init()
  }

  /// Adjusts the request before it is sent (a header, a method, a body). Default: nothing. A
  /// thrown error fails the operation with `NetworkError.preparation` and nothing is sent.
  ///
  /// - Parameter request: The request for ``url``, to change in place.
  open func prepareRequest(_ request: inout URLRequest) throws {}

  /// Runs the evaluate closure given to the initialiser.
  ///
  /// - Parameters:
  ///   - result: The response body.
  ///   - response: The HTTP response, with an accepted status.
  /// - Returns: The operation's value.
  public final func evaluate(result: Data, response: HTTPURLResponse) throws -> ResultType {
    try evaluation.evaluate(result, response)
  }

  /// Sends the request; the operation finishes with the evaluated value or the error.
  open override func main() {
    let evaluation = evaluation
    let operation = ConveyorNetworking.NetworkDataOperation<ResultType>(
      request: URLRequest(url: url), session: .wrapping(urlSession)
    ) { data, response in
      try evaluation.evaluate(data, response)
    }
    NetworkTransfer.forward(operation, acceptedStatusCodes: accepted, to: self) { [weak self] request in
      try self?.prepareRequest(&request)
    }
    transfer.withLock { $0 = operation }
    // A `cancel()` that came before the transfer was kept above did not see it.
    if isCancelled { operation.cancel() }
    operation.start()
  }

  /// Cancels the operation and its transfer; no handler runs. Subclasses that override it must
  /// call `super`.
  open override func cancel() {
    super.cancel()
    transfer.withLock { $0 }?.cancel()
  }
}

/// The typed operation kit's download operation: `NetworkDownloadOperation<T>(url:urlSession:evaluate:)`,
/// whose evaluate closure gets the temporary file (move it to keep it).
///
/// ```swift
/// let operation = NetworkDownloadOperation<URL>(url: url, urlSession: .shared) { tempURL, response in
///   try FileManager.default.moveItem(at: tempURL, to: finalFileURL)
///   return finalFileURL
/// }
/// ```
///
/// Its members are the old class's and ``AsyncOperation``'s, nothing more; the transfer is made
/// by ConveyorNetworking's `NetworkDownloadOperation`. The same differences as
/// ``NetworkDataOperation`` apply; the temporary file is deleted if the evaluation did not move
/// it.
// @unchecked Sendable: `transfer` is a `Mutex`; the rest is immutable. The superclass guards its
// own state.
open class NetworkDownloadOperation<ResultType: Sendable>: AsyncOperation<ResultType, NetworkError>,
  @unchecked Sendable
{
  /// The evaluate closure's type, under the old kit's name.
  public typealias NetworkResponseEvaluation = @Sendable (URL, HTTPURLResponse) throws -> ResultType

  /// The closure given to the initialiser, in a `Sendable` box.
  private struct Evaluation: Sendable {
    var evaluate: NetworkResponseEvaluation
  }

  /// The URL the operation downloads.
  public let url: URL
  /// The session the operation runs on.
  public let urlSession: URLSession
  private let evaluation: Evaluation
  private let accepted: Set<Int>
  private let transfer = Mutex<ConveyorNetworking.NetworkDownloadOperation<ResultType>?>(nil)

  /// Creates an operation that downloads `url` on `urlSession` and evaluates the temporary file
  /// of a response whose status is in `200..<300`: the old kit's initialiser, `required` as it
  /// was there.
  ///
  /// - Parameters:
  ///   - url: The URL to download (a GET; adjust the request in ``prepareRequest(_:)``).
  ///   - urlSession: Any session, with or without a delegate of its own.
  ///   - evaluate: Makes the value from the temporary file (which it must move to keep) and the
  ///     response.
  public required init(url: URL, urlSession: URLSession, evaluate: @escaping NetworkResponseEvaluation) {
    self.url = url
    self.urlSession = urlSession
    self.evaluation = Evaluation(evaluate: evaluate)
    self.accepted = Set(200..<300)
    super.init()
  }

  /// Creates an operation that downloads `url` on `urlSession` and evaluates the temporary file
  /// of an accepted response.
  ///
  /// - Parameters:
  ///   - url: The URL to download (a GET; adjust the request in ``prepareRequest(_:)``).
  ///   - urlSession: Any session, with or without a delegate of its own.
  ///   - acceptedStatusCodes: The statuses that count as success; others fail with
  ///     `NetworkError.httpStatus`.
  ///   - evaluate: Makes the value from the temporary file (which it must move to keep) and the
  ///     response.
  public init(
    url: URL, urlSession: URLSession, acceptedStatusCodes: Set<Int>,
    evaluate: @escaping NetworkResponseEvaluation
  ) {
    self.url = url
    self.urlSession = urlSession
    self.evaluation = Evaluation(evaluate: evaluate)
    self.accepted = acceptedStatusCodes
    super.init()
  }

  /// Adjusts the request before it is sent. Default: nothing. A thrown error fails the operation
  /// with `NetworkError.preparation` and nothing is sent.
  ///
  /// - Parameter request: The request for ``url``, to change in place.
  open func prepareRequest(_ request: inout URLRequest) throws {}

  /// Runs the evaluate closure given to the initialiser.
  ///
  /// - Parameters:
  ///   - result: The temporary file; move it to keep it.
  ///   - response: The HTTP response, with an accepted status.
  /// - Returns: The operation's value.
  public final func evaluate(result: URL, response: HTTPURLResponse) throws -> ResultType {
    try evaluation.evaluate(result, response)
  }

  /// Sends the request; the operation finishes with the evaluated value or the error.
  open override func main() {
    let evaluation = evaluation
    let operation = ConveyorNetworking.NetworkDownloadOperation<ResultType>(
      request: URLRequest(url: url), session: .wrapping(urlSession)
    ) { location, response in
      try evaluation.evaluate(location, response)
    }
    NetworkTransfer.forward(operation, acceptedStatusCodes: accepted, to: self) { [weak self] request in
      try self?.prepareRequest(&request)
    }
    transfer.withLock { $0 = operation }
    if isCancelled { operation.cancel() }
    operation.start()
  }

  /// Cancels the operation and its transfer; no handler runs. Subclasses that override it must
  /// call `super`.
  open override func cancel() {
    super.cancel()
    transfer.withLock { $0 }?.cancel()
  }
}

/// Connects a ConveyorNetworking operation to the drop-in operation that started it.
enum NetworkTransfer {
  /// Sets up `transfer` to prepare its request with `prepare` and to finish `owner` with its
  /// outcome. The handlers run on a global queue (they only hand the outcome on); `owner`'s own
  /// handler then runs on its `callbackQueue`.
  static func forward<ResultType: Sendable, TaskResult>(
    _ transfer: ConveyorNetworking.NetworkOperation<ResultType, TaskResult>,
    acceptedStatusCodes: Set<Int>,
    to owner: AsyncOperation<ResultType, NetworkError>,
    prepare: @escaping @Sendable (inout URLRequest) throws -> Void
  ) {
    transfer.acceptedStatusCodes = acceptedStatusCodes
    transfer.prepare = prepare
    transfer.callbackQueue = .global()
    transfer.successHandler = { value in owner.finish(withResult: value) }
    transfer.failureHandler = { error in owner.finish(withError: error) }
  }
}

extension NetworkSession {
  /// Conveyor's shared session for `URLSession.shared` (no URL cache on Linux, download progress,
  /// credentials dropped on cross-origin redirects); any other session wrapped as it is, keeping
  /// its delegate.
  static func wrapping(_ urlSession: URLSession) -> NetworkSession {
    urlSession === URLSession.shared ? .shared : NetworkSession(urlSession: urlSession)
  }
}
