import Foundation
import LoopbackHTTPServer
import Testing

/// `add http` jobs delivered by `conveyor work` to a server on 127.0.0.1.
@Suite struct HTTPJobTests {
  @Test func headersAndBodiesAreSentAsGiven() async throws {
    let sandbox = try Sandbox()
    let server = try LoopbackHTTPServer { _, _ in .ok() }
    defer { server.stop() }
    let bodyFile = sandbox.path("body.bin")
    let fileBody = Data([0x00, 0xFF, 0x0A, 0x41] + Array("binary body".utf8))
    try fileBody.write(to: URL(fileURLWithPath: bodyFile))

    try await sandbox.add([
      "http", "post", server.url("/orders").absoluteString, "-H", "Content-Type: application/json",
      "--header", "X-Trace:  abc 123 ", "--data", #"{"sku":"A-42"}"#,
    ])
    try await sandbox.add(["http", "PUT", server.url("/files/1?v=2").absoluteString, "--data-file", bodyFile])
    let work = try await sandbox.run(["work", "--until-empty"])
    #expect(work.status == 0, "\(work)")

    let requests = server.requests
    try #require(requests.count == 2)
    #expect(requests[0].method == "POST")
    #expect(requests[0].target == "/orders")
    #expect(requests[0].header("Content-Type") == "application/json")
    #expect(requests[0].header("X-Trace") == "abc 123")
    #expect(requests[0].bodyText == #"{"sku":"A-42"}"#)
    #expect(requests[1].method == "PUT")
    #expect(requests[1].target == "/files/1?v=2")
    #expect(requests[1].body == fileBody)
    let keys = requests.compactMap { $0.header("Idempotency-Key") }
    #expect(keys.count == 2 && keys[0] != keys[1])
  }

  @Test func a503IsRetriedWithTheSameIdempotencyKeyUntilDelivered() async throws {
    let sandbox = try Sandbox()
    let server = try LoopbackHTTPServer { _, index in index < 2 ? .status(503, "busy") : .ok() }
    defer { server.stop() }
    let id = try await sandbox.add(["http", "POST", server.url("/hooks").absoluteString, "--data", "x=1"])

    let work = try await sandbox.run(["work", "--until-empty", "--json"])
    #expect(work.status == 0, "\(work)")
    let events = try work.objects()
    let retries = events.filter { $0["event"] as? String == "retry_scheduled" }
    #expect(retries.count == 2)
    #expect(retries.allSatisfy { ($0["error"] as? String)?.contains("HTTP 503: busy") == true })
    #expect(events.contains { $0["event"] as? String == "succeeded" && $0["job"] as? Int == id })

    let requests = server.requests
    #expect(requests.count == 3)
    #expect(requests.allSatisfy { $0.bodyText == "x=1" })
    let keys = Set(requests.map { $0.header("Idempotency-Key") })
    #expect(keys.count == 1)
    let key = try #require(keys.first ?? nil)
    #expect(key.hasPrefix("outbox-\(id)-"))
    #expect(try await sandbox.counts() == counts())
  }

  @Test func a404IsDeadWithTheStatusInTheListing() async throws {
    let sandbox = try Sandbox()
    let server = try LoopbackHTTPServer { _, _ in .status(404, "no such order") }
    defer { server.stop() }
    let id = try await sandbox.add(["http", "DELETE", server.url("/orders/9?token=secret").absoluteString])

    let work = try await sandbox.run(["work", "--until-empty"])
    #expect(work.status == 1, "\(work)")
    #expect(work.stdout.contains("1 dead"))
    #expect(server.requests.count == 1)

    let table = try await sandbox.succeed(["list", "--status", "dead"]).stdout
    #expect(table.contains("http DELETE http://127.0.0.1:\(server.port)/orders/9?…"))
    #expect(table.contains("last error: DELETE"))
    #expect(table.contains("HTTP 404: no such order"))
    #expect(!table.contains("secret"))
    let dead = try await sandbox.listed(["--status", "dead"])
    #expect(dead.map { $0["id"] as? Int } == [id])
    #expect((dead.first?["lastError"] as? String)?.contains("HTTP 404") == true)
  }

  @Test func listingsLeaveOutCredentialsQueriesHeadersAndBodies() async throws {
    let sandbox = try Sandbox()
    try await sandbox.add([
      "http", "POST", "http://alice:s3cret-pw@127.0.0.1:9/hooks?token=s3cret-token", "-H",
      "Authorization: Bearer s3cret-header", "--data", "s3cret-body",
    ])
    let table = try await sandbox.succeed(["list"]).stdout
    let json = try await sandbox.succeed(["list", "--json"]).stdout
    for listing in [table, json] {
      #expect(listing.contains("http POST http://127.0.0.1:9/hooks?…"))
      #expect(!listing.contains("s3cret"), "\(listing)")
    }
  }

  @Test func anUnreachableServerFailsTheAttempt() async throws {
    let sandbox = try Sandbox()
    // Port 1 (tcpmux) is privileged and unused: the connection is refused. A port freed by a
    // stopped server could be taken at once by another test's server.
    try await sandbox.add(["http", "GET", "http://127.0.0.1:1/gone"])
    let work = try await sandbox.run(["work", "--until-empty", "--max-attempts", "1", "--json"])
    #expect(work.status == 1, "\(work)")
    let died = try #require(try work.objects().first { $0["event"] as? String == "died" })
    #expect((died["error"] as? String)?.contains("GET http://127.0.0.1:1/gone") == true, "\(died)")
  }
}
