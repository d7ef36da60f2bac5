import Conveyor
import Foundation
import Synchronization

#if canImport(FoundationNetworking)
  import FoundationNetworking
#endif

/// A typed operation that sends one request on a ``NetworkSession``, checks the HTTP status and
/// turns the task's result into a `Success` (or a ``NetworkError``).
///
/// Use ``NetworkDataOperation`` or ``NetworkDownloadOperation``; subclass this class for other
/// task kinds (uploads, streams): override ``createTask(with:using:)`` and ``evaluate(_:response:)``
/// and have the task report to ``complete(with:response:error:)``.
///
/// Steps, each at most once:
/// 1. ``prepareRequest(_:)`` adjusts the request (adds a token, a header); a throw fails with
///    ``NetworkError/preparation(_:)`` and nothing is sent.
/// 2. ``createTask(with:using:)`` makes the `URLSessionTask`; the operation resumes it.
/// 3. When the task ends: a transport error fails with ``NetworkError/transport(_:)``; a status
///    outside ``acceptedStatusCodes`` fails with ``NetworkError/httpStatus(_:)`` carrying the
///    headers and the first ``bodyExcerptLimit`` bytes of the body; otherwise
///    ``evaluate(_:response:)`` makes the value.
///
/// `cancel()` cancels the task; neither handler runs and waiters get `OperationError.cancelled`.
///
/// On Linux the request's `timeoutInterval` is rounded up to whole seconds, because
/// swift-corelibs-foundation truncates it (a 0.5 s timeout would fire at once).
// @unchecked Sendable: mutable settings live in `settings` and the running task in `slot`,
// both `Mutex`es; the rest is immutable. The superclass guards its own state.
open class NetworkOperation<Success: Sendable, TaskResult>: AsyncOperation<Success, NetworkError>,
  @unchecked Sendable
{
  private struct Settings {
    var acceptedStatusCodes = Set(200..<300)
    var bodyExcerptLimit = 4096
    var prepare: (@Sendable (inout URLRequest) throws -> Void)?
  }

  private struct Slot {
    var task: URLSessionTask?
    var cancelled = false
  }

  /// The request as given, before ``prepareRequest(_:)``.
  public let request: URLRequest
  /// The session the task runs on.
  public let session: NetworkSession
  private let settings = Mutex(Settings())
  private let slot = Mutex(Slot())

  /// Creates an operation for `request` on `session`.
  ///
  /// - Parameters:
  ///   - request: The request to send.
  ///   - session: The session; ``NetworkSession/shared`` by default.
  public init(request: URLRequest, session: NetworkSession = .shared) {
    self.request = request
    self.session = session
    super.init()
  }

  // MARK: Configuration

  /// Statuses that count as success. Default `200..<300`; others fail with
  /// ``NetworkError/httpStatus(_:)``. Set before the operation starts.
  public var acceptedStatusCodes: Set<Int> {
    get { settings.withLock { $0.acceptedStatusCodes } }
    set { settings.withLock { $0.acceptedStatusCodes = newValue } }
  }

  /// How many bytes of an unaccepted response's body ``NetworkError/HTTPStatus`` keeps. Default
  /// 4096.
  public var bodyExcerptLimit: Int {
    get { settings.withLock { $0.bodyExcerptLimit } }
    set { settings.withLock { $0.bodyExcerptLimit = max(0, newValue) } }
  }

  /// Adjusts the request just before it is sent, without subclassing; the default
  /// ``prepareRequest(_:)`` applies it. A thrown error fails the operation with
  /// ``NetworkError/preparation(_:)``.
  ///
  /// ```swift
  /// operation.prepare = { request in
  ///   request.setValue("Bearer \(try tokens.current())", forHTTPHeaderField: "Authorization")
  /// }
  /// ```
  public var prepare: (@Sendable (inout URLRequest) throws -> Void)? {
    get { settings.withLock { $0.prepare } }
    set { settings.withLock { $0.prepare = newValue } }
  }

  // MARK: Override points

  /// Returns the request to send. The default applies ``prepare``.
  ///
  /// - Parameter request: ``request``.
  /// - Returns: The request to send.
  /// - Throws: ``NetworkError``; the operation fails with it and sends nothing.
  open func prepareRequest(_ request: URLRequest) throws(NetworkError) -> URLRequest {
    guard let prepare else { return request }
    var prepared = request
    do {
      try prepare(&prepared)
    } catch {
      throw .preparation(NetworkError.Underlying(error))
    }
    return prepared
  }

  /// Makes the suspended task that sends `request`; the operation resumes it. Subclasses must
  /// override it and make the task report to ``complete(with:response:error:)``.
  ///
  /// - Parameters:
  ///   - request: The prepared request.
  ///   - session: ``session``.
  /// - Returns: A suspended task.
  open func createTask(with request: URLRequest, using session: NetworkSession) -> URLSessionTask {
    preconditionFailure("\(type(of: self)) must override createTask(with:using:)")
  }

  /// Turns an accepted response into the value. Subclasses must override it.
  ///
  /// - Parameters:
  ///   - result: The task's result (body data, downloaded file…).
  ///   - response: The HTTP response; its status is one of ``acceptedStatusCodes``.
  /// - Returns: The operation's value.
  /// - Throws: ``NetworkError``, usually ``NetworkError/evaluation(_:)``.
  open func evaluate(_ result: TaskResult, response: HTTPURLResponse) throws(NetworkError) -> Success {
    preconditionFailure("\(type(of: self)) must override evaluate(_:response:)")
  }

  /// The start of the body in `result`, for ``NetworkError/HTTPStatus``. Default: empty.
  ///
  /// - Parameters:
  ///   - result: The task's result.
  ///   - limit: At most this many bytes are wanted.
  /// - Returns: The first bytes of the body and whether there were more.
  open func bodyExcerpt(of result: TaskResult, limit: Int) -> (bytes: Data, truncated: Bool) {
    (Data(), false)
  }

  /// Called once the outcome is decided (or the operation was cancelled), to release what
  /// `result` holds, e.g. delete a temporary file. Default: nothing.
  ///
  /// - Parameter result: The task's result.
  open func cleanUp(_ result: TaskResult) {}

  // MARK: Running

  /// Prepares the request, makes the task and resumes it; subclasses override the steps, not this.
  open override func main() {
    var prepared: URLRequest
    do {
      prepared = try prepareRequest(request)
    } catch {
      finish(throwing: error)
      return
    }
    #if !canImport(Darwin)
      // swift-corelibs-foundation truncates the timeout to whole seconds: 0.5 s would time out at
      // once, 1.5 s after 1 s. Round up so a request never gets less time than asked for.
      prepared.timeoutInterval = prepared.timeoutInterval.rounded(.up)
    #endif
    let task = createTask(with: prepared, using: session)
    let keep = slot.withLock { slot -> Bool in
      if slot.cancelled { return false }
      slot.task = task
      return true
    }
    if keep { task.resume() } else { task.cancel() }
  }

  /// Cancels the operation and its task; no handler runs. Subclasses that override it must call
  /// `super`.
  open override func cancel() {
    super.cancel()
    guard isCancelled else { return }
    let task = slot.withLock { slot -> URLSessionTask? in
      slot.cancelled = true
      defer { slot.task = nil }
      return slot.task
    }
    task?.cancel()
  }

  /// Decides the outcome from what the task reported; tasks made by ``createTask(with:using:)``
  /// call it exactly once. Ignored after `cancel()`.
  ///
  /// - Parameters:
  ///   - result: The task's result; nil on error.
  ///   - response: The response, if any arrived.
  ///   - error: The task's error, if any.
  public final func complete(with result: TaskResult?, response: URLResponse?, error: (any Error)?) {
    slot.withLock { $0.task = nil }
    defer { if let result { cleanUp(result) } }
    if isCancelled { return }
    if let error {
      finish(throwing: .fromTask(error))
      return
    }
    guard let response else {
      finish(throwing: .emptyResponse)
      return
    }
    guard let http = response as? HTTPURLResponse else {
      finish(throwing: .invalidResponse("not an HTTP response (\(type(of: response)))"))
      return
    }
    guard let result else {
      finish(throwing: .emptyResponse)
      return
    }
    let (accepted, limit) = settings.withLock { ($0.acceptedStatusCodes, $0.bodyExcerptLimit) }
    guard accepted.contains(http.statusCode) else {
      let excerpt = bodyExcerpt(of: result, limit: limit)
      finish(
        throwing: .httpStatus(
          NetworkError.HTTPStatus(
            statusCode: http.statusCode, headers: http.stringHeaders, bodyExcerpt: excerpt.bytes,
            bodyIsTruncated: excerpt.truncated, url: http.url)))
      return
    }
    do {
      finish(returning: try evaluate(result, response: http))
    } catch {
      finish(throwing: error)
    }
  }
}

/// A network operation that loads the response body into memory and evaluates it.
///
/// ```swift
/// struct User: Decodable, Sendable { var name: String }
///
/// let operation = NetworkDataOperation(request: URLRequest(url: userURL)) { data, _ in
///   try JSONDecoder().decode(User.self, from: data)  // a throw becomes .evaluation
/// }
/// let user = try await operation.run()
/// ```
// @unchecked Sendable: adds only the immutable `evaluator` and `bodyLimit`; see `NetworkOperation`.
open class NetworkDataOperation<Success: Sendable>: NetworkOperation<Success, Data>, @unchecked Sendable {
  /// Turns the body and response into the value.
  public typealias Evaluator = @Sendable (Data, HTTPURLResponse) throws -> Success

  private struct Box: Sendable {
    var evaluate: Evaluator
  }

  private let evaluator: Box
  /// The most bytes of the body kept in memory; nil for all of them.
  public let bodyLimit: Int?

  /// Creates an operation that evaluates the body of an accepted response.
  ///
  /// - Parameters:
  ///   - request: The request.
  ///   - session: The session; ``NetworkSession/shared`` by default.
  ///   - bodyLimit: Keep at most this many bytes of the body (the evaluator and the error's
  ///     excerpt see only them; the rest is received and dropped), so a server cannot fill the
  ///     memory. Nil (the default) keeps the whole body.
  ///   - evaluate: Makes the value; a thrown ``NetworkError`` is kept as is, any other error
  ///     becomes ``NetworkError/evaluation(_:)``.
  public init(
    request: URLRequest, session: NetworkSession = .shared, bodyLimit: Int? = nil,
    evaluate: @escaping Evaluator
  ) {
    self.evaluator = Box(evaluate: evaluate)
    self.bodyLimit = bodyLimit.map { max(0, $0) }
    super.init(request: request, session: session)
  }

  /// Makes a data task on `session` reporting to ``NetworkOperation/complete(with:response:error:)``.
  ///
  /// The evaluation runs on a global queue, not on the session's serial delegate queue, so a slow
  /// decode does not hold up the session's other tasks.
  open override func createTask(with request: URLRequest, using session: NetworkSession) -> URLSessionTask {
    session.dataTask(with: request, keepingAtMost: bodyLimit) { data, response, error in
      DispatchQueue.global().async {
        self.complete(with: data, response: response, error: error)
      }
    }
  }

  /// Runs the evaluate closure.
  open override func evaluate(_ result: Data, response: HTTPURLResponse) throws(NetworkError) -> Success {
    try NetworkError.wrappingEvaluation { try evaluator.evaluate(result, response) }
  }

  /// The first `limit` bytes of the body.
  open override func bodyExcerpt(of result: Data, limit: Int) -> (bytes: Data, truncated: Bool) {
    (Data(result.prefix(limit)), result.count > limit)
  }
}

extension NetworkDataOperation where Success == Data {
  /// Creates an operation whose value is the body of an accepted response.
  ///
  /// - Parameters:
  ///   - request: The request.
  ///   - session: The session; ``NetworkSession/shared`` by default.
  public convenience init(request: URLRequest, session: NetworkSession = .shared) {
    self.init(request: request, session: session) { data, _ in data }
  }
}

/// A network operation that downloads the response body to a temporary file and evaluates it.
///
/// The evaluate closure gets the temporary file's URL and must move (or read) the file before it
/// returns: the file is deleted afterwards. It runs on the session's serial delegate queue (the
/// file only exists during that callback), so keep it short: move the file, do the rest later.
/// The convenience initialiser ``init(request:destination:overwrite:session:)`` moves it to a
/// destination for you.
///
/// Nothing is left behind: the body streams into a file of the operation's own in the temporary
/// folder (`conveyor-download-<UUID>.part`, mode 0600), which is deleted on every path. After a
/// success, an unaccepted status, a failed or throwing evaluation, it is gone before the outcome
/// is delivered; after a transport error or a transfer cut short, before the task reports; after
/// `cancel()` (which finishes the operation at once), as soon as the task has stopped.
///
/// ```swift
/// let download = NetworkDownloadOperation(
///   request: URLRequest(url: archiveURL), destination: folder.appendingPathComponent("archive.zip"))
/// download.progressHandler = { written, expected in print(written, expected ?? -1) }
/// let file = try await download.run()
/// ```
// @unchecked Sendable: adds the immutable `evaluator` and `progress`, a `Mutex`; see
// `NetworkOperation`.
open class NetworkDownloadOperation<Success: Sendable>: NetworkOperation<Success, URL>, @unchecked Sendable {
  /// Turns the temporary file and response into the value; must move the file to keep it.
  public typealias Evaluator = @Sendable (URL, HTTPURLResponse) throws -> Success

  private struct Box: Sendable {
    var evaluate: Evaluator
  }

  private let evaluator: Box
  private let progress = Mutex<(@Sendable (Int64, Int64?) -> Void)?>(nil)

  /// Creates an operation that evaluates the downloaded file of an accepted response.
  ///
  /// - Parameters:
  ///   - request: The request.
  ///   - session: The session; ``NetworkSession/shared`` by default.
  ///   - evaluate: Makes the value from the temporary file, which it must move to keep; a thrown
  ///     ``NetworkError`` is kept as is, any other error becomes ``NetworkError/evaluation(_:)``.
  public init(
    request: URLRequest, session: NetworkSession = .shared, evaluate: @escaping Evaluator
  ) {
    self.evaluator = Box(evaluate: evaluate)
    super.init(request: request, session: session)
  }

  /// Called with the bytes written so far and the expected total (nil if unknown), on the
  /// session's delegate queue, while the body downloads. Set it before the operation starts.
  ///
  /// Each call checks `isCancelled` first, so no call starts once `cancel()` has taken effect.
  /// `cancel()` does not wait for a call the delegate queue is already making: one that passed
  /// the check a moment before may still run while or just after `cancel()` returns. (Waiting
  /// would deadlock a handler that waits for the thread calling `cancel()`.)
  public var progressHandler: (@Sendable (_ written: Int64, _ expected: Int64?) -> Void)? {
    get { progress.withLock { $0 } }
    set { progress.withLock { $0 = newValue } }
  }

  /// Makes a task on `session` that streams the body into a temporary file and reports to
  /// ``NetworkOperation/complete(with:response:error:)``.
  open override func createTask(with request: URLRequest, using session: NetworkSession) -> URLSessionTask {
    let handler = progressHandler.map { handler in
      { @Sendable [weak self] (written: Int64, expected: Int64?) in
        guard let self, !self.isCancelled else { return }
        handler(written, expected)
      }
    }
    return session.fileDownloadTask(with: request, progress: handler) { location, response, error in
      self.complete(with: location, response: response, error: error)
    }
  }

  /// Runs the evaluate closure, then deletes the temporary file if it is still there, so it is
  /// gone before anyone sees the outcome.
  open override func evaluate(_ result: URL, response: HTTPURLResponse) throws(NetworkError) -> Success {
    defer { cleanUp(result) }
    return try NetworkError.wrappingEvaluation { try evaluator.evaluate(result, response) }
  }

  /// The first `limit` bytes of the downloaded file, which is then deleted (the excerpt is all
  /// that is kept of an unaccepted response).
  open override func bodyExcerpt(of result: URL, limit: Int) -> (bytes: Data, truncated: Bool) {
    defer { cleanUp(result) }
    do {
      // Mapped, so only the pages of the excerpt are read.
      let bytes = try Data(contentsOf: result, options: .alwaysMapped)
      return (Data(bytes.prefix(limit)), bytes.count > limit)
    } catch {
      return (Data("(body unreadable: \(error))".utf8), false)
    }
  }

  /// Deletes the temporary file if the evaluation left it in place (the session deletes it too
  /// once the operation is done with it).
  open override func cleanUp(_ result: URL) {
    guard FileManager.default.fileExists(atPath: result.path) else { return }
    do {
      try FileManager.default.removeItem(at: result)
    } catch {
      // Nothing depends on this file any more and the outcome is already decided; a temporary
      // file that could not be removed is left to the system's temporary-folder cleanup.
    }
  }
}

extension NetworkDownloadOperation where Success == URL {
  /// Creates an operation that moves the downloaded file to `destination` and returns it.
  ///
  /// - Parameters:
  ///   - request: The request.
  ///   - destination: Where the file goes; its folder must exist.
  ///   - overwrite: Whether an existing file at `destination` is replaced. Default false: it
  ///     fails with ``NetworkError/evaluation(_:)`` wrapping ``FileOperationError/destinationExists(path:)``,
  ///     checked atomically by the rename that puts the file in place (see
  ///     ``FileOperation/move(from:to:overwrite:)``), so of two downloads racing to one
  ///     destination one wins and the other fails.
  ///   - session: The session; ``NetworkSession/shared`` by default.
  public convenience init(
    request: URLRequest, destination: URL, overwrite: Bool = false, session: NetworkSession = .shared
  ) {
    self.init(request: request, session: session) { location, _ in
      try FileOperations.move(from: location, to: destination, overwrite: overwrite)
      return destination
    }
  }
}

extension HTTPURLResponse {
  /// The headers as strings.
  var stringHeaders: [String: String] {
    var headers: [String: String] = [:]
    for (key, value) in allHeaderFields {
      headers[String(describing: key)] = String(describing: value)
    }
    return headers
  }
}

extension NetworkError {
  /// Runs an evaluate closure: a `NetworkError` it throws passes through, any other error becomes
  /// ``NetworkError/evaluation(_:)``.
  static func wrappingEvaluation<Success>(_ body: () throws -> Success) throws(NetworkError) -> Success {
    do {
      return try body()
    } catch let error as NetworkError {
      throw error
    } catch {
      throw .evaluation(NetworkError.Underlying(error))
    }
  }
}
