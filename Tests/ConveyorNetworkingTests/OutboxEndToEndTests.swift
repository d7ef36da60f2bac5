import Conveyor
import ConveyorNetworking
import ConveyorSQLite
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

/// Answers 503 to the first `failures` attempts of each request (told apart by Idempotency-Key),
/// then 200.
func flakyServer(failures: Int) throws -> TestHTTPServer {
  let attempts = Mutex<[String: Int]>([:])
  return try TestHTTPServer { request, _ in
    let key = request.header("idempotency-key") ?? ""
    let attempt = attempts.withLock { attempts -> Int in
      attempts[key, default: 0] += 1
      return attempts[key, default: 0]
    }
    return attempt <= failures ? .status(503, "warming up") : .ok("done")
  }
}

@Suite("HTTP outbox end to end on SQLite", .timeLimit(.minutes(10)))
struct OutboxEndToEndTests {
  @Test func threeRequestsSurviveARestartAndAreDeliveredInOrderDespite503s() async throws {
    let server = try flakyServer(failures: 2)
    defer { server.stop() }
    let folder = try TemporaryFolder()
    let path = folder.file("outbox.sqlite").path
    var configuration = JobQueueConfiguration(identifier: "api-outbox")
    configuration.retryPolicy = .fixed(.milliseconds(20))
    configuration.maxAttempts = 5

    // Queued by one process that stops before delivering anything...
    configuration.autoStart = false
    let producer = try JobQueue(
      configuration: configuration, store: try SQLiteJobStore(path: path), delivery: HTTPDelivery())
    try await producer.add(contentsOf: [
      .get(server.url("/items")),
      try .post(server.url("/items"), json: ["name": "pencil", "quantity": "3"]),
      .delete(server.url("/items/42")),
    ])
    await producer.shutdown(gracePeriod: .seconds(1))
    #expect(server.requests.isEmpty)

    // ...and delivered by the next one, on a fresh connection to the same file.
    configuration.autoStart = true
    let outbox = try JobQueue(
      configuration: configuration, store: try SQLiteJobStore(path: path), delivery: HTTPDelivery())
    try await within(.seconds(90), "outbox finished") { await outbox.waitUntilFinished() }
    await outbox.shutdown(gracePeriod: .seconds(1))

    let requests = server.requests
    #expect(requests.count == 9)  // 3 requests × (2 × 503 + 1 × 200)
    let keys = requests.map { $0.header("idempotency-key") ?? "" }
    let distinctKeys = keys.reduce(into: [String]()) { if !$0.contains($1) { $0.append($1) } }
    #expect(distinctKeys.count == 3)
    for key in distinctKeys {
      let attempts = requests.filter { $0.header("idempotency-key") == key }
      #expect(attempts.count == 3)  // the key stays the same across retries
      #expect(Set(attempts.map { "\($0.method) \($0.path) \($0.bodyText)" }).count == 1)
    }
    // Each round reaches the server in queue order; so do the successful deliveries.
    let calls = requests.map { "\($0.method) \($0.path)" }
    let order = ["GET /items", "POST /items", "DELETE /items/42"]
    #expect(calls == order + order + order)
    #expect(requests[1].bodyText == #"{"name":"pencil","quantity":"3"}"#)
    #expect(requests[1].header("content-type") == "application/json")
    let counts = try await outbox.count()
    #expect(counts.total == 0)
  }

  @Test func aRequestWaitingForItsRetryDoesNotHoldBackTheOthers() async throws {
    // The server is down for its first two answers, whatever they are: GET and POST get 503 and
    // wait 50 ms; DELETE, ready meanwhile, goes first. FIFO holds among first attempts and among
    // jobs on the same retry schedule, not across a retry.
    let answered = Mutex(0)
    let server = try TestHTTPServer { _, _ in
      let count = answered.withLock { count -> Int in
        count += 1
        return count
      }
      return count <= 2 ? .status(503, "down") : .ok()
    }
    defer { server.stop() }
    let folder = try TemporaryFolder()
    var configuration = JobQueueConfiguration(identifier: "api-outbox")
    configuration.retryPolicy = .fixed(.milliseconds(50))
    configuration.autoStart = false
    let outbox = try JobQueue(
      configuration: configuration, store: try SQLiteJobStore(path: folder.file("o.sqlite").path),
      delivery: HTTPDelivery())
    try await outbox.add(contentsOf: [
      .get(server.url("/items")), .post(server.url("/items"), form: ["name": "pencil"]),
      .delete(server.url("/items/42")),
    ])
    outbox.start()
    // A hang bound, not a speed check: a few hundred milliseconds on a quiet machine.
    try await within(.seconds(90), "outbox finished") { await outbox.waitUntilFinished() }
    await outbox.shutdown(gracePeriod: .seconds(1))
    #expect(
      server.requests.map { "\($0.method) \($0.path)" } == [
        "GET /items", "POST /items", "DELETE /items/42", "GET /items", "POST /items",
      ])
  }

  @Test func aRejectedRequestIsDeadWithStatusAndBodyAndTheRestGoOn() async throws {
    let server = try TestHTTPServer { request, _ in
      request.path == "/bad" ? .status(422, "quantity must be positive") : .ok()
    }
    defer { server.stop() }
    let folder = try TemporaryFolder()
    var configuration = JobQueueConfiguration(identifier: "api-outbox")
    configuration.retryPolicy = .fixed(.milliseconds(10))
    let outbox = try JobQueue(
      configuration: configuration, store: try SQLiteJobStore(path: folder.file("o.sqlite").path),
      delivery: HTTPDelivery())
    try await outbox.add(.post(server.url("/bad"), form: ["quantity": "-1"]))
    try await outbox.add(.get(server.url("/good")))
    try await within(.seconds(90), "outbox finished") { await outbox.waitUntilFinished() }
    await outbox.shutdown(gracePeriod: .seconds(1))

    #expect(server.requests.map(\.path) == ["/bad", "/good"])
    let dead = try await outbox.jobs(in: .dead)
    #expect(dead.count == 1)
    let reason = try #require(dead.first?.lastError)
    #expect(reason.contains("HTTP 422"))
    #expect(reason.contains("quantity must be positive"))
    #expect(try outbox.item(of: dead[0]).url == server.url("/bad"))
  }

  @Test func retryAfterDelaysTheJobOnTheQueueClock() async throws {
    let attempts = Mutex(0)
    let server = try TestHTTPServer { _, _ in
      attempts.withLock { $0 += 1 }
      return attempts.withLock { $0 } == 1 ? .status(429, "", headers: [("Retry-After", "30")]) : .ok()
    }
    defer { server.stop() }
    let clock = ManualJobClock()
    var configuration = JobQueueConfiguration(identifier: "api-outbox")
    configuration.clock = clock
    let outbox = try JobQueue(
      configuration: configuration, store: InMemoryJobStore(), delivery: HTTPDelivery())
    let events = EventRecorder(outbox.events)
    let id = try await outbox.add(.get(server.url("/limited"))).id
    try await events.wait(for: "retry scheduled") {
      $0.contains { if case .retryScheduled = $0 { true } else { false } }
    }
    guard
      case .retryScheduled(id, let at, _)? = events.events.first(where: {
        if case .retryScheduled = $0 { true } else { false }
      })
    else { throw ServerError("no retry event") }
    #expect(at == clock.now().addingTimeInterval(30))
    clock.advance(by: .seconds(29))
    try await Task.sleep(for: .milliseconds(100))
    #expect(server.requests.count == 1)
    clock.advance(by: .seconds(1))
    try await events.wait(for: "delivered") { $0.contains(.succeeded(id)) }
    #expect(server.requests.count == 2)
    await outbox.shutdown(gracePeriod: .seconds(1))
  }
}
