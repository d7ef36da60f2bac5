import Conveyor
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import ConveyorNetworking

#if canImport(FoundationNetworking)
  import FoundationNetworking
#endif

/// The operation's error, or nil if it succeeded.
func failure<Success>(
  of operation: NetworkOperation<Success, some Any>, limit: Duration = .seconds(15)
) async throws -> OperationError<NetworkError>? {
  try await within(limit, "network operation") { () async -> OperationError<NetworkError>? in
    do throws(OperationError<NetworkError>) {
      _ = try await operation.run()
      return nil
    } catch {
      return error
    }
  }
}

/// Unwraps `.failed(error)`.
func networkError(_ error: OperationError<NetworkError>?) throws -> NetworkError {
  guard case .failed(let networkError)? = error else {
    throw ServerError("expected a NetworkError, got \(String(describing: error))")
  }
  return networkError
}

// Three minutes, a guard against hangs only: beside the other suites on two cores,
// `cancelRacingCompletionNeverRunsAHandlerAfterCancel` (60 operations in turn) once took over one.
@Suite("Network operations against a local HTTP server", .timeLimit(.minutes(10)))
struct NetworkOperationTests {
  @Test func dataOperationReturnsTheBodyAndRunsTheSuccessHandlerOnce() async throws {
    let server = try TestHTTPServer(always: .ok("hello"))
    defer { server.stop() }
    let operation = NetworkDataOperation(request: URLRequest(url: server.url("/greeting")))
    let handled = Log<Data>()
    operation.successHandler = { handled.append($0) }
    operation.failureHandler = { _ in Issue.record("failure handler ran") }

    let data = try await within { try await operation.run() }

    #expect(String(decoding: data, as: UTF8.self) == "hello")
    try await eventually("success handler") { handled.count == 1 }
    #expect(server.requests.map(\.path) == ["/greeting"])
  }

  @Test func evaluateDecodesJSON() async throws {
    struct Item: Decodable, Sendable, Equatable { var name: String }
    let server = try TestHTTPServer(always: .status(200, #"{"name":"pencil"}"#))
    defer { server.stop() }
    let operation = NetworkDataOperation(request: URLRequest(url: server.url("/item"))) { data, response in
      #expect(response.statusCode == 200)
      return try JSONDecoder().decode(Item.self, from: data)
    }
    #expect(try await within { try await operation.run() } == Item(name: "pencil"))
  }

  @Test func unacceptedStatusFailsWithStatusHeadersAndBodyExcerpt() async throws {
    let server = try TestHTTPServer(always: .status(404, "no such item", headers: [("X-Trace", "abc")]))
    defer { server.stop() }
    let operation = NetworkDataOperation(request: URLRequest(url: server.url("/missing?token=secret")))
    let failures = Log<NetworkError>()
    operation.failureHandler = { failures.append($0) }

    let error = try networkError(try await failure(of: operation))

    guard case .httpStatus(let status) = error else { throw ServerError("got \(error)") }
    #expect(status.statusCode == 404)
    #expect(status.header("x-trace") == "abc")
    #expect(status.bodyText == "no such item")
    #expect(!status.bodyIsTruncated)
    #expect(!error.isTransient)
    #expect(error.description.contains("404"))
    #expect(!error.description.contains("no such item"))
    #expect(!error.description.contains("secret"))  // the query is not in the message
    #expect(error.debugDescription.contains("no such item"))
    try await eventually("failure handler") { failures.count == 1 }
    #expect(failures.all == [error])
  }

  @Test func largeErrorBodyKeepsOnlyAnExcerpt() async throws {
    let body = String(repeating: "x", count: 100_000)
    let server = try TestHTTPServer(always: .status(500, body))
    defer { server.stop() }
    let operation = NetworkDataOperation(request: URLRequest(url: server.url("/big-error")))
    operation.bodyExcerptLimit = 1000

    let error = try networkError(try await failure(of: operation))

    guard case .httpStatus(let status) = error else { throw ServerError("got \(error)") }
    #expect(status.bodyExcerpt.count == 1000)
    #expect(status.bodyIsTruncated)
    #expect(error.isTransient)
    #expect(error.description.count < 200)
    #expect(error.debugDescription.count < 700)
  }

  @Test func acceptedStatusCodesAreConfigurable() async throws {
    let server = try TestHTTPServer(always: .status(404, "fine"))
    defer { server.stop() }
    let operation = NetworkDataOperation(request: URLRequest(url: server.url("/x")))
    operation.acceptedStatusCodes = [200, 404]
    #expect(try await within { try await operation.run() } == Data("fine".utf8))

    let strict = NetworkDataOperation(request: URLRequest(url: server.url("/x")))
    strict.acceptedStatusCodes = [201]
    let error = try networkError(try await failure(of: strict))
    #expect(
      error
        == .httpStatus(
          .init(
            statusCode: 404, headers: headersOf(error), bodyExcerpt: Data("fine".utf8),
            url: server.url("/x"))))
  }

  @Test func closedPortIsATransportError() async throws {
    let port = closedPort()
    let operation = NetworkDataOperation(request: URLRequest(url: URL(string: "http://127.0.0.1:\(port)/")!))
    let error = try networkError(try await failure(of: operation))
    guard case .transport(let transport) = error else { throw ServerError("got \(error)") }
    #expect(transport.code == .cannotConnectToHost)
    #expect(error.isTransient)
  }

  @Test func garbageOnTheWireIsAnInvalidResponse() async throws {
    let server = try TestHTTPServer(always: Reply(raw: Data("this is not http\r\n\r\n".utf8)))
    defer { server.stop() }
    let operation = NetworkDataOperation(request: URLRequest(url: server.url("/garbage")))
    let error = try networkError(try await failure(of: operation))
    guard case .invalidResponse = error else { throw ServerError("got \(error)") }
    #expect(error.isTransient)
  }

  @Test func connectionClosedWithoutAnswerIsAnEmptyResponse() async throws {
    let server = try TestHTTPServer(always: Reply(raw: Data()))
    defer { server.stop() }
    let operation = NetworkDataOperation(request: URLRequest(url: server.url("/silent")))
    let error = try networkError(try await failure(of: operation))
    #expect(error == .emptyResponse)
    #expect(error.isTransient)
  }

  @Test func nonHTTPResponseIsAnInvalidResponse() async throws {
    // A data: URL answers with a plain URLResponse.
    let operation = NetworkDataOperation(request: URLRequest(url: URL(string: "data:text/plain,hello")!))
    let error = try networkError(try await failure(of: operation))
    guard case .invalidResponse(let message) = error else { throw ServerError("got \(error)") }
    #expect(message.contains("not an HTTP response"))
  }

  @Test func evaluationErrorIsWrappedWithItsType() async throws {
    struct Rejected: Error, CustomStringConvertible {
      var description: String { "the body is not what we want" }
    }
    let server = try TestHTTPServer(always: .ok("body"))
    defer { server.stop() }
    let operation = NetworkDataOperation<Int>(request: URLRequest(url: server.url("/x"))) { _, _ in
      throw Rejected()
    }
    let error = try networkError(try await failure(of: operation))
    guard case .evaluation(let underlying) = error else { throw ServerError("got \(error)") }
    #expect(underlying.error is Rejected)
    #expect(underlying.typeName.hasSuffix("Rejected"))
    #expect(underlying.message == "the body is not what we want")
    #expect(!error.isTransient)
  }

  @Test func evaluateMayThrowANetworkErrorAsIs() async throws {
    let server = try TestHTTPServer(always: .ok(""))
    defer { server.stop() }
    let operation = NetworkDataOperation<Data>(request: URLRequest(url: server.url("/x"))) { data, _ in
      if data.isEmpty { throw NetworkError.emptyResponse }
      return data
    }
    #expect(try networkError(try await failure(of: operation)) == .emptyResponse)
  }

  @Test func prepareAdjustsTheRequestAndAThrowSendsNothing() async throws {
    struct NoToken: Error {}
    let server = try TestHTTPServer(always: .ok())
    defer { server.stop() }
    let operation = NetworkDataOperation(request: URLRequest(url: server.url("/a")))
    operation.prepare = { request in request.setValue("Bearer t0k3n", forHTTPHeaderField: "Authorization") }
    _ = try await within { try await operation.run() }
    #expect(server.requests.first?.header("authorization") == "Bearer t0k3n")

    let failing = NetworkDataOperation(request: URLRequest(url: server.url("/b")))
    failing.prepare = { _ in throw NoToken() }
    let error = try networkError(try await failure(of: failing))
    guard case .preparation(let underlying) = error else { throw ServerError("got \(error)") }
    #expect(underlying.error is NoToken)
    #expect(server.requests.map(\.path) == ["/a"])
  }

  @Test func subclassOverridesPrepareRequest() async throws {
    // @unchecked Sendable: no stored properties; the superclasses guard theirs with `Mutex`es.
    final class Versioned: NetworkDataOperation<Data>, @unchecked Sendable {
      override func prepareRequest(_ request: URLRequest) throws(NetworkError) -> URLRequest {
        var request = try super.prepareRequest(request)
        request.setValue("2", forHTTPHeaderField: "API-Version")
        return request
      }
    }
    let server = try TestHTTPServer(always: .ok())
    defer { server.stop() }
    let operation = Versioned(request: URLRequest(url: server.url("/v"))) { data, _ in data }
    _ = try await within { try await operation.run() }
    #expect(server.requests.first?.header("api-version") == "2")
  }

  @Test func subclassMakesItsOwnTaskThroughCreateTask() async throws {
    // An upload operation: the override point makes an upload task and reports to complete(…).
    // @unchecked Sendable: `body` is immutable; the superclasses guard theirs with `Mutex`es.
    final class Upload: NetworkOperation<String, Data>, @unchecked Sendable {
      let body: Data
      init(request: URLRequest, body: Data, session: NetworkSession) {
        self.body = body
        super.init(request: request, session: session)
      }
      override func createTask(with request: URLRequest, using session: NetworkSession) -> URLSessionTask {
        session.urlSession.uploadTask(with: request, from: body) { data, response, error in
          self.complete(with: data, response: response, error: error)
        }
      }
      override func evaluate(_ result: Data, response: HTTPURLResponse) throws(NetworkError) -> String {
        String(decoding: result, as: UTF8.self)
      }
      override func bodyExcerpt(of result: Data, limit: Int) -> (bytes: Data, truncated: Bool) {
        (Data(result.prefix(limit)), result.count > limit)
      }
    }
    let server = try TestHTTPServer { request, _ in
      request.path == "/full" ? .status(507, "disk full") : .status(201, "stored \(request.body.count) bytes")
    }
    defer { server.stop() }
    var request = URLRequest(url: server.url("/upload"))
    request.httpMethod = "PUT"
    let upload = Upload(request: request, body: pattern(10_000), session: NetworkSession())
    #expect(try await within { try await upload.run() } == "stored 10000 bytes")
    #expect(server.requests.first?.method == "PUT")
    #expect(server.requests.first?.body == pattern(10_000))

    request.url = server.url("/full")
    let full = Upload(request: request, body: Data("x".utf8), session: NetworkSession())
    let error = try networkError(try await failure(of: full))
    guard case .httpStatus(let status) = error else { throw ServerError("got \(error)") }
    #expect(status.statusCode == 507)
    #expect(status.bodyText == "disk full")
  }

  @Test func slowServerTimesOut() async throws {
    // Bounds far apart: only "timed out well before the server answered" matters, and a loaded
    // machine can take seconds longer than the timeout.
    let server = try TestHTTPServer(always: Reply(body: Data("late".utf8), delay: .seconds(120)))
    defer { server.stop() }
    var request = URLRequest(url: server.url("/slow"))
    request.timeoutInterval = 0.5
    let started = ContinuousClock.now
    // Slow tests get their own session, so they do not hold the shared one's connections.
    let operation = NetworkDataOperation(request: request, session: NetworkSession())
    let error = try networkError(try await failure(of: operation))
    #expect(error == .transport(.init(code: .timedOut, message: transportMessage(error))))
    #expect(ContinuousClock.now - started < .seconds(60))  // the server answers after 120 s
    #expect(ContinuousClock.now - started > .seconds(0.4))  // not at once (Linux rounds 0.5 s up to 1 s)
  }

  @Test func redirectsAreFollowed() async throws {
    let server = try TestHTTPServer { request, _ in
      request.path == "/old" ? .status(302, "", headers: [("Location", "/new")]) : .ok("moved here")
    }
    defer { server.stop() }
    let operation = NetworkDataOperation(request: URLRequest(url: server.url("/old"))) { data, response in
      (String(decoding: data, as: UTF8.self), response.url?.path)
    }
    let (body, path) = try await within { try await operation.run() }
    #expect(body == "moved here")
    #expect(path == "/new")
    #expect(server.requests.map(\.path) == ["/old", "/new"])
  }

  @Test func cancelBeforeStartSendsNothingAndRunsNoHandler() async throws {
    let server = try TestHTTPServer(always: .ok())
    defer { server.stop() }
    let operation = NetworkDataOperation(request: URLRequest(url: server.url("/never")))
    operation.successHandler = { _ in Issue.record("success handler ran") }
    operation.failureHandler = { _ in Issue.record("failure handler ran") }
    operation.cancel()
    #expect(try await failure(of: operation) == .cancelled)
    try await Task.sleep(for: .milliseconds(100))
    #expect(server.requests.isEmpty)
  }

  /// Alone this cancel ends within milliseconds. Beside the other suites on a 2-core machine it
  /// measured 2.4–6.2 s, and once 13.2 s; the server answers after 120 s and the bound is 60 s:
  /// what is checked is that the cancel does not wait for the answer.
  @Test func cancelWhileWaitingForTheServerEndsAtOnce() async throws {
    let server = try TestHTTPServer(always: Reply(body: Data("late".utf8), delay: .seconds(120)))
    defer { server.stop() }
    let operation = NetworkDataOperation(
      request: URLRequest(url: server.url("/slow")), session: NetworkSession())
    operation.successHandler = { _ in Issue.record("success handler ran") }
    operation.failureHandler = { _ in Issue.record("failure handler ran") }
    operation.start()
    try await eventually("request arrived") { server.requests.count == 1 }
    let started = ContinuousClock.now
    operation.cancel()
    #expect(try await failure(of: operation) == .cancelled)
    #expect(ContinuousClock.now - started < .seconds(60), "well before the server answers")
    #expect(operation.result == nil)
    try await Task.sleep(until: started + .seconds(20.5))  // the late answer must not reach a handler
  }

  @Test func cancelRacingCompletionNeverRunsAHandlerAfterCancel() async throws {
    let server = try TestHTTPServer(always: .ok("x"))
    defer { server.stop() }
    let session = NetworkSession()
    let successes = Log<Int>()
    let failures = Log<Int>()
    var operations: [NetworkDataOperation<Data>] = []
    for index in 0..<60 {
      let operation = NetworkDataOperation(
        request: URLRequest(url: server.url("/\(index)")), session: session)
      operation.successHandler = { _ in successes.append(index) }
      operation.failureHandler = { _ in failures.append(index) }
      operation.start()
      if index % 3 != 0 {
        // Cancel at different points: before the answer, around it, after it.
        try await Task.sleep(for: .microseconds(Int64(index % 7) * 300))
        operation.cancel()
      }
      operations.append(operation)
    }
    let finished = operations
    for operation in finished { _ = try await failure(of: operation) }
    // Handlers run on the callback queue, after the results are set.
    let succeeded = finished.filter { !$0.isCancelled }.count
    try await eventually("every success handler ran") { successes.all.count >= succeeded }
    try await Task.sleep(for: .milliseconds(100))  // room for a handler that should not run
    #expect(failures.all.isEmpty)
    for (index, operation) in finished.enumerated() {
      if operation.isCancelled {
        #expect(operation.result == nil)
        #expect(!successes.all.contains(index), "operation \(index) was cancelled but its handler ran")
      } else {
        #expect(successes.all.filter { $0 == index }.count == 1, "operation \(index) succeeded")
      }
    }
    #expect(finished.enumerated().allSatisfy { $0.offset % 3 != 0 || !$0.element.isCancelled })
  }

  @Test func postSendsTheBody() async throws {
    let server = try TestHTTPServer(always: .status(201, "created"))
    defer { server.stop() }
    var request = URLRequest(url: server.url("/items"))
    request.httpMethod = "POST"
    request.httpBody = Data(String(repeating: "b", count: 5000).utf8)
    let post = NetworkDataOperation(request: request)
    _ = try await within { try await post.run() }
    #expect(server.requests.first?.method == "POST")
    #expect(server.requests.first?.body.count == 5000)
  }

  @Test func runsOnAnOperationQueueWithDependencies() async throws {
    let server = try TestHTTPServer(always: .ok("payload"))
    defer { server.stop() }
    let folder = try TemporaryFolder()
    let fetch = NetworkDataOperation(request: URLRequest(url: server.url("/data")))
    let target = folder.url.appendingPathComponent("copy.txt")
    let write = SyncOperation<URL, FileOperationError> { () throws(FileOperationError) -> URL in
      guard case .success(let data)? = fetch.result else {
        throw .other(path: target.path, message: "no data")
      }
      return try FileOperation.write(data, to: target).runNow()
    }
    write.addDependency(fetch)
    let queue = OperationQueue()
    queue.addOperation(fetch)
    queue.addOperation(write)
    let written = try await within { try await write.value }
    #expect(try Data(contentsOf: written) == Data("payload".utf8))
  }
}

extension SyncOperation {
  /// Starts the operation on the calling thread and returns its result (for use inside another
  /// synchronous operation).
  func runNow() throws(Failure) -> Success {
    start()
    switch result {
    case .success(let value)?: return value
    case .failure(let error)?: throw error
    case nil: preconditionFailure("cancelled")
    }
  }
}

func headersOf(_ error: NetworkError) -> [String: String] {
  if case .httpStatus(let status) = error { return status.headers }
  return [:]
}

func transportMessage(_ error: NetworkError) -> String {
  if case .transport(let transport) = error { return transport.message }
  return ""
}
