import Conveyor
import Foundation
import Synchronization
import Testing

@testable import ConveyorNetworking

#if canImport(FoundationNetworking)
  import FoundationNetworking
#endif

/// `NetworkSession`'s promise that credentials meant for one server never reach another: the
/// `Authorization`, `Cookie` and `Proxy-Authorization` headers and a URL's userinfo are dropped on
/// a redirect to another origin, whoever set them.
@Suite("NetworkSession: credentials on redirects", .timeLimit(.minutes(10)))
struct RedirectCredentialsTests {
  /// Sends `url` with a data operation on a fresh session and returns the status.
  private func fetch(_ url: URL, session: NetworkSession = NetworkSession()) async throws -> Int {
    let operation = NetworkDataOperation<Int>(request: URLRequest(url: url), session: session) {
      _, response in
      response.statusCode
    }
    return try await within { try await operation.run() }
  }

  // Failed before the fix: credentials given as userinfo in the URL (`http://user:secret@host/...`) are sent as
  // `Authorization: Basic ...` to ANOTHER origin when the first server answers with a
  // scheme-relative redirect (`Location: //other-host:port/path`). swift-corelibs-foundation builds
  // the redirected URL from the original URL's components (userinfo included) and only swaps host
  // and port; NetworkSession.redirect(_:from:) strips credential *headers* only, never the URL's
  // user and password. Promise (NetworkSession docs, issue 8): "credentials meant for one server
  // never reach another". Where: Sources/ConveyorNetworking/NetworkSession.swift, redirect(_:from:).
  @Test func userinfoCredentialsDoNotFollowASchemeRelativeCrossOriginRedirect() async throws {
    let elsewhere = try TestHTTPServer(always: .ok())
    defer { elsewhere.stop() }
    let origin = try TestHTTPServer(
      always: .status(302, "", headers: [("Location", "//127.0.0.1:\(elsewhere.port)/landed")]))
    defer { origin.stop() }
    let url = try #require(URL(string: "http://user:s3cret@127.0.0.1:\(origin.port)/start"))
    #expect(try await fetch(url) == 200)
    #expect(origin.requests.first?.header("authorization") != nil, "the origin itself gets the credentials")
    let landed = try #require(elsewhere.requests.first)
    #expect(
      landed.header("authorization") == nil,
      "another origin received \(landed.header("authorization") ?? "") (user:s3cret)")
  }

  // An absolute Location carries no userinfo, so nothing leaks.
  @Test func userinfoCredentialsDoNotFollowAnAbsoluteCrossOriginRedirect() async throws {
    let elsewhere = try TestHTTPServer(always: .ok())
    defer { elsewhere.stop() }
    let origin = try TestHTTPServer(
      always: .status(307, "", headers: [("Location", elsewhere.url("/landed").absoluteString)]))
    defer { origin.stop() }
    let url = try #require(URL(string: "http://user:s3cret@127.0.0.1:\(origin.port)/start"))
    #expect(try await fetch(url) == 200)
    #expect(elsewhere.requests.first?.header("authorization") == nil)
  }

  // Failed before the fix: an `Authorization` header set session-wide (URLSessionConfiguration
  // .httpAdditionalHeaders, the configuration NetworkSession's own docs show) is sent to another
  // origin after a redirect: swift-corelibs-foundation merges the configuration's headers into
  // every request it sends, after the delegate stripped the request's. Promise (NetworkSession):
  // "A redirect to another origin drops the Authorization, Cookie and Proxy-Authorization
  // headers ... so credentials meant for one server never reach another". Where: NetworkSession
  // .redirect(_:from:) only looks at request.allHTTPHeaderFields.
  @Test func sessionWideCredentialsDoNotFollowACrossOriginRedirect() async throws {
    let elsewhere = try TestHTTPServer(always: .ok())
    defer { elsewhere.stop() }
    let origin = try TestHTTPServer(
      always: .status(302, "", headers: [("Location", elsewhere.url("/landed").absoluteString)]))
    defer { origin.stop() }
    let configuration = URLSessionConfiguration.default
    configuration.httpAdditionalHeaders = ["Authorization": "Bearer session-wide", "Cookie": "sid=1"]
    let session = NetworkSession(configuration: configuration)
    #expect(try await fetch(origin.url("/start"), session: session) == 200)
    #expect(origin.requests.first?.header("authorization") == "Bearer session-wide")
    let landed = try #require(elsewhere.requests.first)
    #expect(landed.header("authorization") == nil, "leaked: \(landed.header("authorization") ?? "")")
    #expect(landed.header("cookie") == nil, "leaked: \(landed.header("cookie") ?? "")")
  }

  // Cross-origin, then back to the first origin: the credentials stay dropped; and a
  // header name spelled in odd case is dropped too.
  @Test func credentialsStayDroppedWhenAChainComesBackToTheFirstOrigin() async throws {
    let back = Mutex<URL?>(nil)
    let elsewhere = try TestHTTPServer { _, _ in
      .status(302, "", headers: [("Location", back.withLock { $0 }!.absoluteString)])
    }
    defer { elsewhere.stop() }
    let origin = try TestHTTPServer { request, _ in
      request.path == "/back"
        ? .ok() : .status(301, "", headers: [("Location", elsewhere.url("/hop").absoluteString)])
    }
    defer { origin.stop() }
    back.withLock { $0 = origin.url("/back") }
    var request = URLRequest(url: origin.url("/start"))
    request.setValue("Bearer x", forHTTPHeaderField: "aUtHoRiZaTiOn")
    request.setValue("k=v", forHTTPHeaderField: "COOKIE")
    let operation = NetworkDataOperation<Int>(request: request, session: NetworkSession()) { _, response in
      response.statusCode
    }
    #expect(try await within { try await operation.run() } == 200)
    let seen = origin.requests + elsewhere.requests
    #expect(seen.count == 3)
    #expect(seen.filter { $0.header("authorization") != nil }.map(\.path) == ["/start"])
    #expect(seen.filter { $0.header("cookie") != nil }.map(\.path) == ["/start"])
  }
}
