import Conveyor
import ConveyorNetworking
import ConveyorSQLite
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

#if canImport(FoundationNetworking)
  import FoundationNetworking
#endif

// The README's "HTTP outbox" example, verbatim from here to the end marker.

/// Queues three API calls durably and delivers them, retrying until the server takes them.
func sendOutbox(api: URL, databasePath: String) async throws {
  let store = try SQLiteJobStore(path: databasePath)
  var configuration = JobQueueConfiguration(identifier: "api-outbox")
  configuration.retryPolicy = .exponential(initial: .seconds(1), maximum: .seconds(300))
  configuration.maxAttempts = 10  // then the job is dead: kept, inspectable, re-queueable
  let outbox = try JobQueue(configuration: configuration, store: store, delivery: HTTPDelivery())

  // Each `add` returns once the request is committed to the database.
  try await outbox.add(.get(api.appendingPathComponent("items")))
  try await outbox.add(.post(api.appendingPathComponent("items"), json: ["name": "pencil", "quantity": "3"]))
  try await outbox.add(.delete(api.appendingPathComponent("items/42")))

  await outbox.waitUntilFinished()  // delivered, or dead after a 4xx or 10 attempts
  for job in try await outbox.jobs(in: .dead) {
    print("gave up on job \(job.id): \(job.lastError ?? "")")
  }
  await outbox.shutdown()
}

/// An item of the example API.
struct CatalogItem: Decodable, Sendable {
  var name: String
}

/// Fetches one item as JSON, then downloads its photo into `folder`.
func fetchItem(api: URL, into folder: URL) async throws -> (CatalogItem, URL) {
  let fetch = NetworkDataOperation(request: URLRequest(url: api.appendingPathComponent("items/42"))) {
    data, _ in try JSONDecoder().decode(CatalogItem.self, from: data)
  }
  let item = try await fetch.run()  // throws OperationError<NetworkError>

  let download = NetworkDownloadOperation(
    request: URLRequest(url: api.appendingPathComponent("items/42/photo")),
    destination: folder.appendingPathComponent("photo.jpg"))
  download.progressHandler = { written, expected in
    print("photo: \(written) of \(expected.map(String.init) ?? "?") bytes")
  }
  return (item, try await download.run())
}

// End of the README example.

@Suite("README: HTTP outbox", .timeLimit(.minutes(10)))
struct ReadmeHTTPOutboxTests {
  @Test func theExampleDeliversEveryRequest() async throws {
    // The server is busy on the first call and says when to come back: right away.
    let first = Atomic<Bool>(true)
    let server = try TestHTTPServer { _, _ in
      first.exchange(false, ordering: .acquiringAndReleasing)
        ? .status(503, "busy", headers: [("Retry-After", "0")]) : .status(200, "ok")
    }
    defer { server.stop() }
    let folder = try TemporaryFolder()

    try await within(.seconds(90), "README example") {
      try await sendOutbox(api: server.url("/api"), databasePath: folder.file("outbox.sqlite").path)
    }

    // The retried GET may go out before or after the others: a job waiting for its retry never
    // blocks the ones behind it.
    let calls = server.requests.map { "\($0.method) \($0.path)" }
    #expect(
      calls.sorted() == ["DELETE /api/items/42", "GET /api/items", "GET /api/items", "POST /api/items"])
    let gets = server.requests.filter { $0.method == "GET" }
    #expect(gets[0].header("idempotency-key") == gets[1].header("idempotency-key"))
  }

  @Test func theOperationsExampleFetchesAndDownloads() async throws {
    let server = try TestHTTPServer { request, _ in
      request.path == "/api/items/42" ? .ok(#"{"name":"pencil"}"#) : Reply(body: pattern(70_000))
    }
    defer { server.stop() }
    let folder = try TemporaryFolder()
    let (item, photo) = try await within { try await fetchItem(api: server.url("/api"), into: folder.url) }
    #expect(item.name == "pencil")
    #expect(try Data(contentsOf: photo) == pattern(70_000))
  }
}
