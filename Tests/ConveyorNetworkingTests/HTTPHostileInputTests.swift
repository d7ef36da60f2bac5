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
@Suite("HTTP delivery under hostile input", .timeLimit(.minutes(1)))
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
    let result = try await within(.seconds(10)) {
      await HTTPDelivery(session: NetworkSession()).deliver(.get(server.url("/x")), context: context())
    }
    #expect(result.description.hasPrefix("discard: GET \(server.url("/x")): HTTP 401"), "\(result)")
  }
}
