import Conveyor
import ConveyorTestSupport
import Foundation
import Testing

@testable import ConveyorNetworking

#if canImport(FoundationNetworking)
  import FoundationNetworking
#endif

let fixedNow = Date(timeIntervalSince1970: 1_750_000_000)

func context(id: Int64 = 7, attempts: Int = 1) -> JobContext {
  JobContext(
    id: JobID(id), queue: "outbox", attempts: attempts,
    createdAt: Date(timeIntervalSince1970: 1_700_000_000.5))
}

func httpDate(_ date: Date) -> String {
  let formatter = DateFormatter()
  formatter.locale = Locale(identifier: "en_US_POSIX")
  formatter.timeZone = TimeZone(identifier: "GMT")
  formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss 'GMT'"
  return formatter.string(from: date)
}

@Suite("HTTPDelivery against a local HTTP server", .timeLimit(.minutes(10)))
struct HTTPDeliveryTests {
  func deliver(_ reply: Reply, _ request: (TestHTTPServer) throws -> HTTPRequest = { .get($0.url("/x")) })
    async throws -> (JobResult, TestHTTPServer)
  {
    let server = try TestHTTPServer(always: reply)
    var delivery = HTTPDelivery(session: NetworkSession())
    delivery.now = { fixedNow }
    let item = try request(server)
    let configured = delivery
    let result = try await within { await configured.deliver(item, context: context()) }
    server.stop()
    return (result, server)
  }

  @Test func successIsHandledAndCarriesTheIdempotencyKey() async throws {
    let (result, server) = try await deliver(.status(204))
    #expect(result == .handled)
    #expect(server.requests.first?.header("idempotency-key") == "outbox-7-1700000000500")
    #expect(HTTPDelivery.idempotencyKey(for: context()) == "outbox-7-1700000000500")
  }

  @Test func anIdempotencyKeyGivenByTheItemIsKept() async throws {
    let (result, server) = try await deliver(.ok()) {
      .get($0.url("/x"), headers: ["idempotency-key": "mine"])
    }
    #expect(result == .handled)
    #expect(server.requests.first?.header("idempotency-key") == "mine")
  }

  @Test(arguments: [400, 401, 403, 404, 409, 410, 422])
  func otherClientErrorsAreDiscardedWithStatusAndBody(status: Int) async throws {
    let (result, server) = try await deliver(.status(status, "reason \(status)"))
    #expect(result == .discard(reason: "GET \(server.url("/x")): HTTP \(status): reason \(status)"))
  }

  @Test(arguments: [500, 502, 503, 504])
  func serverErrorsAreRetriedByPolicy(status: Int) async throws {
    let (result, server) = try await deliver(.status(status, "down"))
    #expect(result == .retry(reason: "GET \(server.url("/x")): HTTP \(status): down"))
  }

  @Test func retryAfterInSecondsIsHonouredFor429() async throws {
    let (result, server) = try await deliver(.status(429, "slow down", headers: [("Retry-After", "7")]))
    #expect(result == .retry(after: .seconds(7), reason: "GET \(server.url("/x")): HTTP 429: slow down"))
  }

  @Test func retryAfterAsAnHTTPDateIsHonouredFor408() async throws {
    let later = httpDate(fixedNow.addingTimeInterval(120))
    let (result, server) = try await deliver(.status(408, "", headers: [("Retry-After", later)]))
    #expect(result == .retry(after: .seconds(120), reason: "GET \(server.url("/x")): HTTP 408"))
  }

  @Test func retryAfterOn503IsHonouredAndCapped() async throws {
    let (result, server) = try await deliver(.status(503, "", headers: [("Retry-After", "999999999")]))
    #expect(result == .retry(after: .seconds(86_400), reason: "GET \(server.url("/x")): HTTP 503"))
  }

  @Test func unparseableRetryAfterFallsBackToThePolicy() async throws {
    let (result, server) = try await deliver(.status(429, "", headers: [("Retry-After", "soon")]))
    #expect(result == .retry(reason: "GET \(server.url("/x")): HTTP 429"))
  }

  @Test func longErrorBodiesAreCutInTheReason() async throws {
    let (result, _) = try await deliver(.status(400, String(repeating: "e", count: 50_000)))
    #expect(result.description.count < 700)
    #expect(result.description.hasSuffix("e…"))
  }

  @Test func transportErrorsAreRetried() async throws {
    let port = closedPort()
    let url = URL(string: "http://127.0.0.1:\(port)/x")!
    let result = try await within { await HTTPDelivery().deliver(.get(url), context: context()) }
    #expect(result.description.hasPrefix("retry: GET \(url): transport error"))
  }

  @Test func timeoutsAreRetried() async throws {
    let (result, _) = try await deliver(Reply(delay: .seconds(3))) {
      HTTPRequest(url: $0.url("/slow"), timeout: 0.5)
    }
    #expect(result.description.hasPrefix("retry: "))
    // The item's timeout is a deadline for the whole request; URLSession's own (on silence) may
    // fire first.
    #expect(
      result.description.contains("timed out after 0.5 s")
        || result.description.contains("URLError \(URLError.Code.timedOut.rawValue)"))
  }

  @Test func unsupportedURLsAreDiscarded() async throws {
    let result = try await within {
      await HTTPDelivery().deliver(.get(URL(string: "gopher://127.0.0.1/x")!), context: context())
    }
    #expect(result.description.hasPrefix("discard: "))
  }

  @Test func bodiesMethodsAndHeadersArrive() async throws {
    let (result, server) = try await deliver(.status(201)) {
      try .post($0.url("/items"), json: ["name": "pencil"], headers: ["X-Client": "tests"])
    }
    #expect(result == .handled)
    let request = try #require(server.requests.first)
    #expect(request.method == "POST")
    #expect(request.bodyText == #"{"name":"pencil"}"#)
    #expect(request.header("content-type") == "application/json")
    #expect(request.header("x-client") == "tests")

    let (_, formServer) = try await deliver(.ok()) {
      .post($0.url("/form"), form: ["name": "Ada Lovelace", "note": "a&b=c/é"])
    }
    #expect(formServer.requests.first?.bodyText == "name=Ada+Lovelace&note=a%26b%3Dc%2F%C3%A9")
    #expect(formServer.requests.first?.header("content-type") == "application/x-www-form-urlencoded")
  }

  @Test func redirectsAreFollowedAndTheFinalStatusDecides() async throws {
    let server = try TestHTTPServer { request, _ in
      request.path == "/old" ? .status(307, "", headers: [("Location", "/gone")]) : .status(410, "gone")
    }
    defer { server.stop() }
    let result = try await within {
      await HTTPDelivery().deliver(.get(server.url("/old")), context: context())
    }
    #expect(result.description.hasPrefix("discard: GET \(server.url("/old")): HTTP 410"))
    #expect(server.requests.map(\.path) == ["/old", "/gone"])
  }

  @Test func prepareAddsSecretsAtSendTimeAndAThrowRetries() async throws {
    struct TokenUnavailable: Error {}
    let server = try TestHTTPServer(always: .ok())
    defer { server.stop() }
    var delivery = HTTPDelivery(session: NetworkSession())
    delivery.prepare = { request in request.setValue("Bearer s3cret", forHTTPHeaderField: "Authorization") }
    let configured = delivery
    let item = HTTPRequest.get(server.url("/me"))
    #expect(try await within { await configured.deliver(item, context: context()) } == .handled)
    #expect(server.requests.first?.header("authorization") == "Bearer s3cret")
    #expect(!String(decoding: try JSONEncoder().encode(item), as: UTF8.self).contains("s3cret"))

    delivery.prepare = { _ in throw TokenUnavailable() }
    let failing = delivery
    let result = try await within { await failing.deliver(item, context: context()) }
    #expect(result.description.hasPrefix("retry: GET \(server.url("/me")): could not prepare the request"))
    #expect(server.requests.count == 1)
  }

  @Test func retryAfterParsing() {
    let now = fixedNow
    #expect(HTTPDelivery.retryAfter("0", now: now) == .zero)
    #expect(HTTPDelivery.retryAfter(" 42 ", now: now) == .seconds(42))
    #expect(HTTPDelivery.retryAfter(httpDate(now.addingTimeInterval(30)), now: now) == .seconds(30))
    #expect(HTTPDelivery.retryAfter(httpDate(now.addingTimeInterval(-30)), now: now) == .zero)
    #expect(
      HTTPDelivery.retryAfter(
        "Sunday, 06-Nov-94 08:49:37 GMT", now: Date(timeIntervalSince1970: 784_111_777 - 10))
        == .seconds(10))
    #expect(
      HTTPDelivery.retryAfter("Sun Nov  6 08:49:37 1994", now: Date(timeIntervalSince1970: 784_111_777 - 5))
        == .seconds(5))
    #expect(HTTPDelivery.retryAfter("soon", now: now) == nil)
    #expect(HTTPDelivery.retryAfter("-5", now: now) == nil)
    #expect(HTTPDelivery.retryAfter("", now: now) == nil)
  }

  @Test func requestsRoundTripThroughJSON() throws {
    let request = HTTPRequest(
      method: "put", url: URL(string: "https://example.com/a?b=c")!, headers: ["A": "1"],
      body: Data([0, 1, 2]),
      timeout: 12, deduplicationKey: "k")
    #expect(request.method == "PUT")
    let decoded = try JSONDecoder().decode(HTTPRequest.self, from: JSONEncoder().encode(request))
    #expect(decoded == request)
    #expect(decoded.deduplicationKey == "k")
    let urlRequest = decoded.urlRequest
    #expect(urlRequest.httpMethod == "PUT")
    #expect(urlRequest.value(forHTTPHeaderField: "A") == "1")
    #expect(urlRequest.timeoutInterval == 12)
    // An item stored before `timeout` and `deduplicationKey` existed still decodes.
    let minimal = try JSONDecoder().decode(
      HTTPRequest.self, from: Data(#"{"method":"GET","url":"https://example.com","headers":{}}"#.utf8))
    #expect(minimal.timeout == nil && minimal.body == nil)
  }
}
