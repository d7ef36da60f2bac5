import Foundation
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// `conveyor dashboard`'s HTTP server on a raw socket: what it refuses before a page is asked for
/// (malformed and smuggling requests, too many idle clients), with the security headers every
/// response carries, and the loopback addresses it answers on.
@Suite(.timeLimit(.minutes(10))) struct DashboardConnectionTests {
  // Failed before the fix: README "Every response carries `Content-Security-Policy: …` … They also carry
  // `X-Content-Type-Options: nosniff` …" and Dashboard.swift's "Every response carries a strict
  // Content-Security-Policy". The refusals the HTTP server writes itself (400/408/413/414/431/501/505
  // in Connection.refuse, 503 in HTTPServer.refuseBusy) bypass Dashboard.respond and carry none of
  // the security headers.
  @Test func refusalsWrittenByTheServerCarryTheSecurityHeaders() async throws {
    let sandbox = try Sandbox()
    let dashboard = try await DashboardProcess.start(sandbox)
    let port = dashboard.port
    let requests = [
      "GET / HTTP/1.1\r\nConnection: close\r\n\r\n",  // no Host: 400
      "GET /\u{7F} HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\n\r\n",  // malformed target: 400
      "POST / HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nContent-Length: 99999999\r\n\r\n",  // 413
      "POST / HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",  // 501
    ]
    for raw in requests {
      let response = try #require(
        DashboardProcess.Response(parsing: await onThread { exchange(port: port, Array(raw.utf8)) }))
      #expect(response.status >= 400)
      #expect(
        response.headers["content-security-policy"]?.contains("default-src 'self'") == true,
        "a \(response.status) without Content-Security-Policy: \(response.headers)")
      #expect(response.headers["x-content-type-options"] == "nosniff", "a \(response.status) without nosniff")
    }
  }

  // Smuggling shapes are refused, and the server goes on serving on other connections.
  @Test func smugglingShapesAreRefusedAndServingGoesOn() async throws {
    let sandbox = try Sandbox()
    let dashboard = try await DashboardProcess.start(sandbox)
    let port = dashboard.port
    let host = "Host: 127.0.0.1:\(port)\r\n"
    let cases: [(String, Int)] = [
      ("POST /bulk HTTP/1.1\r\n\(host)Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 501),
      ("POST /bulk HTTP/1.1\r\n\(host)Content-Length: 4\r\nContent-Length: 5\r\n\r\nabcde", 400),
      ("POST /bulk HTTP/1.1\r\n\(host)Content-Length: 4, 4\r\n\r\nabcd", 400),
      ("POST /bulk HTTP/1.1\r\n\(host) Transfer-Encoding: chunked\r\n\r\n", 400),
      ("GET / HTTP/1.1\r\n\(host)\(host)\r\n", 400),
    ]
    for (raw, status) in cases {
      let response = try #require(
        DashboardProcess.Response(parsing: await onThread { exchange(port: port, Array(raw.utf8)) }))
      #expect(response.status == status, "\(raw.debugDescription) → \(response.status)")
    }
    #expect(try await dashboard.get("/").status == 200)
  }

  // 32 clients that connect and send nothing take every slot (the 33rd is answered 503), but
  // the idle timeout frees them and a legitimate client is served again.
  @Test func idleClientsHoldingEverySlotAreDroppedAndServingResumes() async throws {
    let sandbox = try Sandbox()
    let dashboard = try await DashboardProcess.start(sandbox)
    let port = dashboard.port
    var idle: [Int32] = []
    for _ in 0..<32 {
      if let fd = await onThread({ connectLoopback(port: port) }) { idle.append(fd) }
    }
    defer { for fd in idle { close(fd) } }
    try await Task.sleep(for: .milliseconds(300))
    let busy = DashboardProcess.Response(
      parsing:
        await onThread {
          exchange(
            port: port, Array("GET / HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nConnection: close\r\n\r\n".utf8))
        })
    // 503 while every slot is held; on a loaded machine the idle timeout may already have freed
    // one (connecting 32 clients can take that long), so only a refusal that is not 503 or 200
    // is wrong here. The point is the next part: serving resumes.
    #expect(busy == nil || busy?.status == 503 || busy?.status == 200, "\(String(describing: busy))")
    // A generous bound a hang would blow through: the idle timeout is 5 s.
    var served = false
    for _ in 0..<60 where !served {
      try await Task.sleep(for: .milliseconds(500))
      served = (try? await dashboard.get("/"))?.status == 200
    }
    #expect(served, "no client served after the idle clients timed out")
  }

  // Failed before the fix: the dashboard takes any 127.x address as loopback (Dashboard.isLoopback: `127.` prefix,
  // so no token is needed) and prints `dashboard: http://127.0.0.2:PORT/`, but the DNS-rebinding
  // check (Dashboard.hostIsLoopback) accepts only `127.0.0.1:PORT`, `localhost:PORT` and
  // `[::1]:PORT`: every request to the printed URL is refused 421, the dashboard is unusable.
  @Test func aDashboardOnAnotherLoopbackAddressAnswersAtItsPrintedURL() async throws {
    let sandbox = try Sandbox()
    let running = try sandbox.start(["dashboard", "--listen", "127.0.0.2:0"])
    let line = try await running.waitForLine("the dashboard's URL") { $0.hasPrefix("dashboard: http://") }
    let text = line.dropFirst("dashboard: ".count).prefix { $0 != " " }
    let url = try #require(URL(string: String(text)))
    #expect(url.host == "127.0.0.2")
    let port = try #require(url.port.flatMap { UInt16(exactly: $0) })
    let raw = "GET / HTTP/1.1\r\nHost: 127.0.0.2:\(port)\r\nConnection: close\r\n\r\n"
    let bytes = await onThread { exchange(port: port, address: "127.0.0.2", Array(raw.utf8)) }
    let response = try #require(DashboardProcess.Response(parsing: bytes))
    #expect(
      response.status == 200, "the printed URL answers \(response.status): \(response.body.prefix(200))")
  }
}
