import ConveyorNetworking
import ConveyorOperationKit
import Foundation
import LoopbackHTTPServer
import Testing

#if canImport(FoundationNetworking)
  import FoundationNetworking
#endif

/// A session of the user's own, with its own delegate and no URL cache (see
/// NetworkSession(urlSession:) on Linux).
final class OwnDelegate: NSObject, URLSessionDelegate, Sendable {}
func ownSession() -> URLSession {
  let configuration = URLSessionConfiguration.ephemeral
  configuration.urlCache = nil
  return URLSession(configuration: configuration, delegate: OwnDelegate(), delegateQueue: nil)
}

/// `NetworkDataOperation` and `NetworkDownloadOperation` over real HTTP on loopback, on
/// `URLSession.shared` and on a session of the user's own.
@Suite("OperationKit drop-in: network operations", .timeLimit(.minutes(10)))
struct NetworkOperationTests {
  @Test("an existing URLSession: a 404 reaches failureHandler on callbackQueue with status and body")
  func notFoundOnOwnSession() async throws {
    let server = try LoopbackHTTPServer(always: .status(404, "no such thing"))
    defer { server.stop() }
    let operation = NetworkDataOperation(url: server.url("/x"), urlSession: ownSession()) { data, _ in data }
    let callbacks = makeCallbackQueue()
    operation.callbackQueue = callbacks
    let seen = Box<(Int, String, Bool)?>(nil)
    let succeeded = Box(false)
    operation.successHandler = { _ in succeeded.current = true }
    operation.failureHandler = { error in
      let onQueue = DispatchQueue.getSpecific(key: callbackKey) == "callbacks"
      if case .httpStatus(let status) = error {
        seen.current = (status.statusCode, String(decoding: status.bodyExcerpt, as: UTF8.self), onQueue)
      } else {
        seen.current = (-1, "\(error)", onQueue)
      }
    }
    await runOnQueue([operation])
    #expect(!succeeded.current)
    #expect(seen.current?.0 == 404)
    #expect(seen.current?.1 == "no such thing")
    #expect(seen.current?.2 == true)
  }

  @Test(
    "download whose evaluate throws leaves no temporary file (shared and own session)",
    arguments: [false, true])
  func downloadEvaluateThrows(ownSessionUsed: Bool) async throws {
    let server = try LoopbackHTTPServer(always: .ok(String(repeating: "z", count: 10_000)))
    defer { server.stop() }
    let temporary = Box<URL?>(nil)
    let session = ownSessionUsed ? ownSession() : URLSession.shared
    let operation = NetworkDownloadOperation<URL>(url: server.url("/f"), urlSession: session) {
      tempURL, _ in
      temporary.current = tempURL
      throw ParseError(text: "bad file")
    }
    let failed = Box(false)
    operation.failureHandler = { error in
      if case .evaluation = error { failed.current = true }
    }
    await runOnQueue([operation])
    #expect(failed.current)
    let file = try #require(temporary.current)
    #expect(!FileManager.default.fileExists(atPath: file.path), "left \(file.path)")
  }

  @Test(
    "an existing URLSession: a dependent sees what the predecessor's successHandler stored",
    arguments: 0..<10)
  func dependentOnOwnSession(run: Int) async throws {
    let server = try LoopbackHTTPServer(always: .ok("{\"name\":\"n\(run)\"}"))
    defer { server.stop() }
    let stored = Box<String?>(nil)
    let fetch = NetworkDataOperation(url: server.url("/o"), urlSession: ownSession()) { data, _ in
      try JSONDecoder().decode(MyObject.self, from: data)
    }
    fetch.successHandler = { object in
      Thread.sleep(forTimeInterval: 0.01)
      stored.current = object.name
    }
    let readBack = Box<String?>("unset")
    let dependent = BlockOperation { readBack.current = stored.current }
    dependent.addDependency(fetch)
    await runOnQueue([fetch, dependent])
    #expect(readBack.current == "n\(run)")
  }
}
