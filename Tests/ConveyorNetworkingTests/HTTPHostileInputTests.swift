import Conveyor
import ConveyorSQLite
import ConveyorTestSupport
import Foundation
import Testing

@testable import ConveyorNetworking

#if canImport(FoundationNetworking)
  import FoundationNetworking
#endif

/// What a hostile server or a malformed item can do to a delivery, checked on the wire.
@Suite("HTTP delivery under hostile input", .timeLimit(.minutes(10)))
struct HTTPHostileInputTests {
  @Test func aCrossOriginRedirectDropsCredentialsAddedByTheItemAndByPrepare() async throws {
    let elsewhere = try TestHTTPServer(always: .ok())
    defer { elsewhere.stop() }
    let origin = try TestHTTPServer(
      always: .status(302, "", headers: [("Location", elsewhere.url("/landed").absoluteString)]))
    defer { origin.stop() }
    var delivery = HTTPDelivery(session: NetworkSession())
    delivery.prepare = { request in request.setValue("Bearer prepared", forHTTPHeaderField: "Authorization") }
    let configured = delivery
    let item = HTTPRequest.get(
      origin.url("/start"),
      headers: ["Cookie": "session=s3cret", "Proxy-Authorization": "Basic x", "X-A": "1"])
    #expect(try await within { await configured.deliver(item, context: context()) } == .handled)
    #expect(origin.requests.first?.header("authorization") == "Bearer prepared")
    let landed = try #require(elsewhere.requests.first)
    #expect(landed.header("authorization") == nil)
    #expect(landed.header("cookie") == nil)
    #expect(landed.header("proxy-authorization") == nil)
    #expect(landed.header("x-a") == "1")
  }

  @Test func a401AskingForBasicCredentialsIsDiscardedAtOnce() async throws {
    let server = try TestHTTPServer(
      always: .status(401, "no", headers: [("WWW-Authenticate", #"Basic realm="x""#)]))
    defer { server.stop() }
    let result = try await within(.seconds(60)) {
      await HTTPDelivery(session: NetworkSession()).deliver(.get(server.url("/x")), context: context())
    }
    #expect(result.description.hasPrefix("discard: GET \(server.url("/x")): HTTP 401"), "\(result)")
  }

  // MARK: 4, 5. smuggling and framing headers are refused before anything is sent

  static let smuggled: [HTTPRequest] = {
    let url = URL(string: "http://127.0.0.1:1/x")!
    return [
      HTTPRequest(method: "GET /admin HTTP/1.1\r\nX-Injected: 1\r\n\r\nGET", url: url),
      HTTPRequest(method: "GET", url: url, headers: ["X-A\r\nX-Injected": "1"]),
      HTTPRequest(method: "GET", url: url, headers: ["X-A": "1\r\nX-Injected: 1"]),
      HTTPRequest(method: "GET", url: url, headers: ["X-A": "1\nX-Injected: 1"]),
      HTTPRequest(method: "GET", url: url, headers: ["X-A": "1\u{0}2"]),
      HTTPRequest(method: "POST", url: url, headers: ["Content-Length": "1"], body: Data("abcdef".utf8)),
      HTTPRequest(method: "POST", url: url, headers: ["transfer-encoding": "chunked"], body: Data("a".utf8)),
      HTTPRequest(method: "GET", url: url, headers: ["Host": "internal.example"]),
    ]
  }()

  @Test(arguments: 0..<smuggled.count)
  func aRequestThatCouldSmuggleIsDiscardedAndNothingIsSent(index: Int) async throws {
    let server = try TestHTTPServer(always: .ok())
    defer { server.stop() }
    var item = Self.smuggled[index]
    item.url = server.url("/x")
    let configured = item
    let result = try await within(.seconds(60)) {
      await HTTPDelivery(session: NetworkSession()).deliver(configured, context: context())
    }
    #expect(result.description.hasPrefix("discard: "), "\(result)")
    #expect(result.description.contains("invalid request"), "\(result)")
    #expect(!result.description.contains("\r") && !result.description.contains("\n"))
    #expect(server.requests.isEmpty, "sent: \(server.requests.map(\.headers))")
  }

  // MARK: 10. validation at add time

  @Test func validateSaysWhatIsAllowed() throws {
    let url = URL(string: "https://example.com/x")!
    #expect(throws: Never.self) { try HTTPRequest.post(url, json: ["a": "b"]).validate() }
    #expect(throws: Never.self) {
      try HTTPRequest(method: "PATCH", url: url, headers: ["X-A": "é\tz"]).validate()
    }
    let refused: [(HTTPRequest, String)] = [
      (HTTPRequest(url: URL(string: "ftp://example.com/x")!), "must start with http:// or https://"),
      (HTTPRequest(url: URL(string: "HTTP://example.com/x")!), "must start with http:// or https://"),
      (HTTPRequest(url: URL(string: "http://example.com:99999/x")!), "port 99999 is not in 1...65535"),
      (HTTPRequest(method: "GÉT", url: url), "is not an HTTP method"),
      (HTTPRequest(method: "", url: url), "is not an HTTP method"),
      (HTTPRequest(url: url, body: Data("x".utf8)), "a GET request cannot have a body"),
      (HTTPRequest(method: "HEAD", url: url, body: Data()), "a HEAD request cannot have a body"),
      (HTTPRequest(url: url, headers: ["X-A": "1", "x-a": "2"]), "is given twice"),
      (HTTPRequest(url: url, headers: ["X-A": "\u{1B}[2J"]), "has a control character"),
      (HTTPRequest(url: url, timeout: .infinity), "the timeout must be"),
      (HTTPRequest(url: url, timeout: -1), "the timeout must be"),
    ]
    for (request, message) in refused {
      #expect {
        try request.validate()
      } throws: { error in
        (error as? InvalidHTTPRequest)?.description.contains(message) == true
      }
    }
  }

  // MARK: 9. deduplication keys are bound with their length

  @Test func keysThatDifferAfterANULAreDifferentKeys() async throws {
    let folder = try TemporaryFolder()
    let store = try SQLiteJobStore(path: folder.file("outbox.sqlite").path)
    let queue = try JobQueue(
      configuration: .init(identifier: "outbox", autoStart: false), store: store, delivery: HTTPDelivery())
    let url = URL(string: "http://127.0.0.1:1/x")!
    let first = try await queue.add(HTTPRequest(url: url, deduplicationKey: "k\0a"))
    let second = try await queue.add(HTTPRequest(url: url, deduplicationKey: "k\0b"))
    let again = try await queue.add(HTTPRequest(url: url, deduplicationKey: "k\0a"))
    #expect(first.inserted && second.inserted && first.id != second.id)
    #expect(!again.inserted && again.id == first.id)
    #expect(try await queue.count().ready == 2)
    let keys = try await queue.jobs(in: .pending).map { try queue.item(of: $0).deduplicationKey }
    #expect(keys == ["k\0a", "k\0b"])
    await store.close()
  }

  // MARK: 11, 12. bounded memory, whole-request deadline

  @Test func onlyTheExcerptOfAHugeErrorBodyIsKept() async throws {
    let server = try TestHTTPServer(always: .status(500, String(repeating: "x", count: 4_000_000)))
    defer { server.stop() }
    let operation = NetworkDataOperation<Data>(
      request: URLRequest(url: server.url("/x")), session: NetworkSession(), bodyLimit: 100
    ) { data, _ in data }
    operation.bodyExcerptLimit = 50
    await #expect {
      try await operation.run()
    } throws: { error in
      guard case .failed(.httpStatus(let status)) = error as? OperationError<NetworkError> else {
        return false
      }
      return status.bodyExcerpt.count == 50 && status.bodyIsTruncated
    }
    let ok = try TestHTTPServer(always: .ok(String(repeating: "y", count: 1000)))
    defer { ok.stop() }
    let body = try await NetworkDataOperation<Data>(
      request: URLRequest(url: ok.url("/y")), session: NetworkSession(), bodyLimit: 10
    ) { data, _ in data }.run()
    #expect(body == Data(String(repeating: "y", count: 10).utf8))
  }

  @Test func theTimeoutIsADeadlineForTheWholeRequestNotJustSilence() async throws {
    // Headers at once, then one byte every 200 ms for 40 s: never silent for a whole second.
    let server = try TestHTTPServer(
      always: Reply(
        status: 200, body: Data(repeating: 0x41, count: 200), chunkSize: 1, pause: .milliseconds(200)))
    defer { server.stop() }
    let result = try await within(.seconds(30)) {
      await HTTPDelivery(session: NetworkSession()).deliver(
        HTTPRequest(url: server.url("/drip"), timeout: 1), context: context())
    }
    // The deadline ends it after 1 s; on a machine so loaded that the drip pauses for a second,
    // URLSession's own timeout for silence (also 1 s) may end it first: either way, long before
    // the 40 s the drip lasts, and retried.
    let description = result.description
    #expect(
      description.hasPrefix("retry: GET \(server.url("/drip")): timed out after 1.0 s")
        || (description.hasPrefix("retry: GET \(server.url("/drip")): ") && description.contains("-1001")),
      "\(result)")
  }
}
