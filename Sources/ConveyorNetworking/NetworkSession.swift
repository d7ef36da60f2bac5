import Foundation
import Synchronization

#if canImport(FoundationNetworking)
  import FoundationNetworking
#endif

/// A `URLSession` whose delegate reports each task's result, and a download's progress, to the
/// closure given when the task was made. Network operations run on one.
///
/// Why not a plain `URLSession`: on Linux (swift-corelibs-foundation) per-task delegates are
/// ignored and `URLSessionTask.progress` never moves, so download progress is only seen by the
/// session's own delegate. `NetworkSession` is that delegate, on Apple platforms and Linux alike.
///
/// ```swift
/// let configuration = URLSessionConfiguration.default
/// configuration.httpAdditionalHeaders = ["User-Agent": "my-app/1.0"]
/// let session = NetworkSession(configuration: configuration)
/// let operation = NetworkDataOperation(request: URLRequest(url: url), session: session)
/// ```
///
/// Redirects (301, 302, 303, 307, 308; at most 20 in a row) are followed as `URLSession` follows
/// them, and the operation sees the final response. A redirect to another origin (scheme, host or
/// port) drops the `Authorization`, `Cookie` and `Proxy-Authorization` headers, as curl and
/// browsers do, so credentials meant for one server never reach another.
///
/// A `401` asking for credentials (`WWW-Authenticate`) is answered without any: the task ends
/// with that response at once, instead of waiting for credentials forever (as
/// swift-corelibs-foundation would).
///
/// Tasks made directly on ``urlSession`` without these methods get no callbacks here.
///
/// ## An existing `URLSession`
///
/// ``init(urlSession:)`` wraps a session you already have, with its own delegate (certificate
/// pinning, authentication challenges, metrics): the operations then make completion-handler
/// tasks on it, and its delegate keeps answering challenges and redirects. What the wrapper then
/// cannot do, because it is not the session's delegate: report download progress, keep only
/// `keepingAtMost` bytes while receiving (the body is cut after it arrived), strip credentials on
/// a cross-origin redirect, or end a `401` that waits for credentials on Linux (answer
/// challenges in your delegate). On Linux a failed download may leave its partial file in the
/// temporary folder, and a session with a `URLCache` can trap when a task is cancelled while the
/// cache is read (see ``init(configuration:)``): give it `urlCache = nil`. The wrapper never
/// invalidates the session.
public final class NetworkSession: Sendable {
  /// A session with the default configuration, shared by operations given no other.
  public static let shared = NetworkSession()

  /// The underlying session. For a session made by ``init(configuration:)`` its delegate belongs
  /// to `NetworkSession`; do not replace it.
  public let urlSession: URLSession
  /// The delegate routing callbacks to tasks; nil for a session given to ``init(urlSession:)``.
  private let router: TaskRouter?
  /// `Authorization`, `Cookie` and `Proxy-Authorization` from the configuration's
  /// `httpAdditionalHeaders`, added to each request that does not set them itself.
  private let sessionCredentials: [String: String]

  /// `request` with the session's credential headers added where it has none of its own.
  private func withSessionCredentials(_ request: URLRequest) -> URLRequest {
    guard !sessionCredentials.isEmpty else { return request }
    var request = request
    for (name, value) in sessionCredentials where request.value(forHTTPHeaderField: name) == nil {
      request.setValue(value, forHTTPHeaderField: name)
    }
    return request
  }

  /// Creates a session.
  ///
  /// On Linux the session never uses a `URLCache`, whatever `configuration` says:
  /// swift-corelibs-foundation reads the cache on a background queue before a task's protocol
  /// exists, and a `cancel()` landing in that window makes it trap the process ("Trying to access
  /// a behaviour for a task that in not in the registry"). Operations cancel their tasks, so the
  /// cache goes.
  ///
  /// - Parameter configuration: timeouts, headers, caching, cookies; copied by `URLSession`.
  public init(configuration: URLSessionConfiguration = .default) {
    var configuration = configuration
    #if canImport(FoundationNetworking)
      configuration = configuration.copy() as? URLSessionConfiguration ?? configuration
      configuration.urlCache = nil
      configuration.requestCachePolicy = .reloadIgnoringLocalCacheData
    #endif
    // Credentials set for the whole session would be added to every request after a redirect
    // dropped them (URLSession adds the configuration's headers last). They are taken out of the
    // configuration and added to each request instead, where a cross-origin redirect drops them.
    var sessionCredentials: [String: String] = [:]
    if let headers = configuration.httpAdditionalHeaders {
      var kept: [AnyHashable: Any] = [:]
      for (name, value) in headers {
        if let text = name as? String, Self.credentialHeaders.contains(text.lowercased()),
          let value = value as? String
        {
          sessionCredentials[text] = value
        } else {
          kept[name] = value
        }
      }
      if !sessionCredentials.isEmpty {
        let copy = configuration.copy() as? URLSessionConfiguration ?? configuration
        copy.httpAdditionalHeaders = kept
        configuration = copy
      }
    }
    self.sessionCredentials = sessionCredentials
    let router = TaskRouter()
    let delegateQueue = OperationQueue()
    delegateQueue.maxConcurrentOperationCount = 1
    delegateQueue.name = "conveyor.network-session"
    self.router = router
    self.urlSession = URLSession(configuration: configuration, delegate: router, delegateQueue: delegateQueue)
  }

  /// Wraps an existing session, keeping its delegate (see "An existing `URLSession`" above).
  ///
  /// ```swift
  /// let pinned = URLSession(configuration: .default, delegate: PinningDelegate(), delegateQueue: nil)
  /// let operation = NetworkDataOperation(request: URLRequest(url: url), session: NetworkSession(urlSession: pinned))
  /// ```
  ///
  /// - Parameter urlSession: the session; it is not invalidated when the wrapper goes away.
  public init(urlSession: URLSession) {
    self.router = nil
    self.sessionCredentials = [:]  // the session adds its own headers
    self.urlSession = urlSession
  }

  deinit {
    // A session keeps its delegate alive until invalidated; running tasks still finish. A session
    // given to `init(urlSession:)` belongs to its owner.
    if router != nil { urlSession.finishTasksAndInvalidate() }
  }

  /// Makes a suspended data task whose body, response and error go to `completion` once.
  ///
  /// - Parameters:
  ///   - request: The request.
  ///   - limit: Keep at most this many bytes of the body; the rest is received and dropped, so a
  ///     huge body takes no memory. Nil (the default) keeps the whole body.
  ///   - completion: Called on the session's delegate queue with the body (nil on error), the
  ///     response and the error.
  /// - Returns: The task; call `resume()` to start it.
  public func dataTask(
    with request: URLRequest, keepingAtMost limit: Int? = nil,
    completion: @escaping @Sendable (Data?, URLResponse?, (any Error)?) -> Void
  ) -> URLSessionDataTask {
    guard let router else {
      return urlSession.dataTask(with: request) { data, response, error in
        completion(limit.map { limit in data.map { Data($0.prefix(limit)) } } ?? data, response, error)
      }
    }
    let task = urlSession.dataTask(with: withSessionCredentials(request))
    router.register(task.taskIdentifier, .data(body: Data(), limit: limit, completion: completion))
    return task
  }

  /// Makes a suspended download task.
  ///
  /// - Parameters:
  ///   - request: The request.
  ///   - progress: Called on the session's delegate queue with the bytes written so far and the
  ///     expected total (nil when the server did not say).
  ///   - completion: Called once on the session's delegate queue. On success it gets the
  ///     temporary file, which exists only until `completion` returns (move it away inside), and
  ///     the response; on failure nil, the response if any, and the error.
  /// - Returns: The task; call `resume()` to start it.
  ///
  /// On Linux, swift-corelibs-foundation leaves the partial file of a download that fails, is
  /// cancelled or is cut short in the temporary folder (`<UUID>.tmp`) and does not say where;
  /// ``NetworkDownloadOperation`` streams into a file of its own instead, which it always removes.
  public func downloadTask(
    with request: URLRequest,
    progress: (@Sendable (_ written: Int64, _ expected: Int64?) -> Void)? = nil,
    completion: @escaping @Sendable (URL?, URLResponse?, (any Error)?) -> Void
  ) -> URLSessionDownloadTask {
    guard let router else {
      return urlSession.downloadTask(with: request) { location, response, error in
        completion(location, response, error)
      }
    }
    let task = urlSession.downloadTask(with: withSessionCredentials(request))
    router.register(task.taskIdentifier, .download(progress: progress, completion: completion))
    return task
  }

  /// The headers a redirect to another origin drops: they carry credentials for the first one.
  public static let credentialHeaders: Set<String> = ["authorization", "cookie", "proxy-authorization"]

  /// The request to send for a redirect from `origin` to `request`: unchanged within one origin
  /// (same scheme, host and port), without ``credentialHeaders`` to another.
  ///
  /// - Parameters:
  ///   - request: The redirected request URLSession proposes.
  ///   - origin: The URL that answered with the redirect.
  /// - Returns: The request to send.
  public static func redirect(_ request: URLRequest, from origin: URL?) -> URLRequest {
    guard let origin, let target = request.url, !isSameOrigin(origin, target) else { return request }
    var stripped = request
    // URLSession builds a relative redirect's URL from the original one, user and password
    // included; they are credentials for the first origin too.
    if var components = URLComponents(url: target, resolvingAgainstBaseURL: false),
      components.user != nil || components.password != nil
    {
      components.user = nil
      components.password = nil
      stripped.url = components.url ?? target
    }
    for name in (request.allHTTPHeaderFields ?? [:]).keys
    where credentialHeaders.contains(name.lowercased()) {
      stripped.setValue(nil, forHTTPHeaderField: name)
    }
    return stripped
  }

  /// Whether two URLs share scheme, host and port (the default port of the scheme if none).
  static func isSameOrigin(_ first: URL, _ second: URL) -> Bool {
    func origin(_ url: URL) -> (String, String, Int?) {
      let scheme = url.scheme?.lowercased() ?? ""
      let port = url.port ?? (scheme == "https" ? 443 : scheme == "http" ? 80 : nil)
      return (scheme, url.host?.lowercased() ?? "", port)
    }
    return origin(first) == origin(second)
  }

  /// Makes a suspended task that downloads the body into a temporary file of its own and removes
  /// that file however the task ends: after `completion` returns on success, before `completion`
  /// on failure, cancellation or a transfer cut short. ``NetworkDownloadOperation`` uses it.
  ///
  /// A data task streamed to a file, not a `URLSessionDownloadTask`: on Linux the latter leaves
  /// its partial file in the temporary folder whenever it fails. See `DownloadFile`.
  ///
  /// - Parameters:
  ///   - request: The request.
  ///   - progress: As for ``downloadTask(with:progress:completion:)``.
  ///   - completion: As for ``downloadTask(with:progress:completion:)``; a file that cannot be
  ///     written fails the task with `URLError.cannotWriteToFile`.
  /// - Returns: The task; call `resume()` to start it.
  func fileDownloadTask(
    with request: URLRequest,
    progress: (@Sendable (_ written: Int64, _ expected: Int64?) -> Void)?,
    completion: @escaping @Sendable (URL?, URLResponse?, (any Error)?) -> Void
  ) -> URLSessionTask {
    guard let router else {
      // Not the session's delegate: a download task with a completion handler, whose file the
      // operation moves or deletes during the completion.
      return downloadTask(with: request, completion: completion)
    }
    let task = urlSession.dataTask(with: withSessionCredentials(request))
    router.register(task.taskIdentifier, .file(DownloadFile(), progress: progress, completion: completion))
    return task
  }

  /// Cancels every task and invalidates the session; it cannot make tasks afterwards.
  public func invalidateAndCancel() {
    urlSession.invalidateAndCancel()
  }
}

/// The session delegate: routes callbacks to the closures registered per task identifier.
private final class TaskRouter: NSObject, Sendable, URLSessionDataDelegate, URLSessionDownloadDelegate {
  enum Entry {
    case data(body: Data, limit: Int?, completion: @Sendable (Data?, URLResponse?, (any Error)?) -> Void)
    case download(
      progress: (@Sendable (Int64, Int64?) -> Void)?,
      completion: @Sendable (URL?, URLResponse?, (any Error)?) -> Void)
    /// A data task streamed into `file` (see `NetworkSession.fileDownloadTask`).
    case file(
      DownloadFile, progress: (@Sendable (Int64, Int64?) -> Void)?,
      completion: @Sendable (URL?, URLResponse?, (any Error)?) -> Void)
  }

  private let entries = Mutex<[Int: Entry]>([:])
  /// The 401 responses of tasks cancelled because they asked for credentials, by task identifier.
  private let unauthorized = Mutex<[Int: URLResponse]>([:])

  func register(_ identifier: Int, _ entry: Entry) {
    entries.withLock { $0[identifier] = entry }
  }

  func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive data: Data) {
    let streamed = entries.withLock { entries -> DownloadFile? in
      switch entries[dataTask.taskIdentifier] {
      case .data(var body, let limit, let completion):
        let room = limit.map { max(0, $0 - body.count) } ?? data.count
        guard room > 0 else { return nil }
        entries[dataTask.taskIdentifier] = nil  // keep `body` uniquely referenced while appending
        body.append(room < data.count ? data.prefix(room) : data)
        entries[dataTask.taskIdentifier] = .data(body: body, limit: limit, completion: completion)
        return nil
      case .file(let file, _, _):
        return file
      default:
        return nil
      }
    }
    if var file = streamed { stream(data, into: &file, for: dataTask) }
  }

  /// Writes a streamed download's bytes outside the lock (callbacks for one task come one at a
  /// time, on the serial delegate queue), then stores the file's new state and reports progress.
  private func stream(_ data: Data, into file: inout DownloadFile, for task: URLSessionDataTask) {
    let written = file.append(data)
    let progress = entries.withLock { entries -> (@Sendable (Int64, Int64?) -> Void)? in
      guard case .file(_, let progress, let completion) = entries[task.taskIdentifier] else { return nil }
      entries[task.taskIdentifier] = .file(file, progress: progress, completion: completion)
      return progress
    }
    guard written else {
      task.cancel()  // the completion reports the file's failure, not the cancellation
      return
    }
    let expected = task.response?.expectedContentLength ?? -1
    progress?(file.written, expected > 0 ? expected : nil)
  }

  func urlSession(
    _ session: URLSession, downloadTask: URLSessionDownloadTask, didWriteData bytesWritten: Int64,
    totalBytesWritten: Int64, totalBytesExpectedToWrite: Int64
  ) {
    let entry = entries.withLock { $0[downloadTask.taskIdentifier] }
    guard case .download(let progress?, _) = entry else { return }
    progress(totalBytesWritten, totalBytesExpectedToWrite > 0 ? totalBytesExpectedToWrite : nil)
  }

  func urlSession(
    _ session: URLSession, downloadTask: URLSessionDownloadTask, didFinishDownloadingTo location: URL
  ) {
    // The file is deleted when this method returns (on Apple platforms), so the completion runs
    // here, synchronously; `didCompleteWithError` then finds no entry.
    let entry = entries.withLock { $0.removeValue(forKey: downloadTask.taskIdentifier) }
    guard case .download(_, let completion) = entry else { return }
    completion(location, downloadTask.response, nil)
  }

  func urlSession(_ session: URLSession, task: URLSessionTask, didCompleteWithError error: (any Error)?) {
    let entry = entries.withLock { $0.removeValue(forKey: task.taskIdentifier) }
    let refused = unauthorized.withLock { $0.removeValue(forKey: task.taskIdentifier) }
    switch entry {
    case .data(let body, _, let completion)?:
      if let refused {
        completion(Data(), refused, nil)  // the 401 itself; its body was not kept
      } else {
        completion(error == nil ? body : nil, task.response, error)
      }
    case .download(_, let completion)?:
      if let refused {
        completion(nil, refused, URLError(.userAuthenticationRequired))
      } else {
        completion(nil, task.response, error)
      }
    case .file(var file, _, let completion)?:
      if let refused {
        file.remove()
        completion(nil, refused, URLError(.userAuthenticationRequired))
      } else if error == nil, file.close() {
        completion(file.url, task.response, nil)
        file.remove()
      } else {
        file.remove()
        completion(nil, task.response, file.failure.map { $0 as any Error } ?? error)
      }
    case nil:
      break
    }
  }

  func urlSession(
    _ session: URLSession, task: URLSessionTask, willPerformHTTPRedirection response: HTTPURLResponse,
    newRequest request: URLRequest, completionHandler: @escaping @Sendable (URLRequest?) -> Void
  ) {
    completionHandler(NetworkSession.redirect(request, from: response.url ?? task.currentRequest?.url))
  }

  func urlSession(
    _ session: URLSession, task: URLSessionTask, didReceive challenge: URLAuthenticationChallenge,
    completionHandler: @escaping @Sendable (URLSession.AuthChallengeDisposition, URLCredential?) -> Void
  ) {
    #if canImport(FoundationNetworking)
      // swift-corelibs-foundation waits forever for a credential nobody gives. Keep the 401 and
      // end the task; `didCompleteWithError` reports the 401 as the task's response.
      if let response = challenge.failureResponse {
        unauthorized.withLock { $0[task.taskIdentifier] = response }
      }
      completionHandler(.cancelAuthenticationChallenge, nil)
    #else
      completionHandler(.performDefaultHandling, nil)
    #endif
  }
}
