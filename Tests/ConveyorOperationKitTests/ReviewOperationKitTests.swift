import ConveyorNetworking
import ConveyorOperationKit
import Foundation
import LoopbackHTTPServer
import Synchronization
import Testing

#if canImport(FoundationNetworking)
  import FoundationNetworking
#endif

// Review of the OperationKit drop-in (issue 10): adversarial probes. Tests marked "// DEFECT:"
// fail on the reviewed code; the others held.

/// Finishes from another thread and records handler runs.
// @unchecked Sendable: only immutable stored properties (the counter is a Mutex).
final class RacingOp: ConveyorOperationKit.AsyncOperation<Int, ParseError>, @unchecked Sendable {
  override func main() {
    DispatchQueue.global().async { self.finish(withResult: 1) }
  }
}

/// A session of the user's own, with its own delegate and no URL cache (see
/// NetworkSession(urlSession:) on Linux).
final class OwnDelegate: NSObject, URLSessionDelegate, Sendable {}
func ownSession() -> URLSession {
  let configuration = URLSessionConfiguration.ephemeral
  configuration.urlCache = nil
  return URLSession(configuration: configuration, delegate: OwnDelegate(), delegateQueue: nil)
}

/// Waits for `operation` to become finished, up to a generous bound; returns whether it did.
func finishes(_ operation: Operation, within seconds: Double = 20) async -> Bool {
  let deadline = Date().addingTimeInterval(seconds)
  while Date() < deadline {
    if operation.isFinished { return true }
    try? await Task.sleep(for: .milliseconds(5))
  }
  return operation.isFinished
}

@Suite("OperationKit drop-in: review", .timeLimit(.minutes(2)))
struct ReviewOperationKitTests {
  @Test("cancel() racing finish(withResult:): always finishes; no handler runs for a cancelled operation")
  func cancelRacingFinish() async {
    let handlerOnCancelled = Box(0)
    let unfinished = Box(0)
    for _ in 0..<300 {
      let operation = RacingOp()
      operation.callbackQueue = makeCallbackQueue()
      operation.successHandler = { _ in
        if operation.isCancelled { handlerOnCancelled.current += 1 }
      }
      let queue = OperationQueue()
      queue.addOperation(operation)
      operation.cancel()
      if !(await finishes(operation)) { unfinished.current += 1 }
    }
    #expect(unfinished.current == 0)
    #expect(handlerOnCancelled.current == 0)
  }

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

  @Test("a cancelled operation not yet started finishes, runs no handler, and its dependent runs")
  func cancelledBeforeStart() async {
    let operation = RacingOp()
    let ran = Box(false)
    operation.successHandler = { _ in ran.current = true }
    operation.failureHandler = { _ in ran.current = true }
    operation.cancel()
    let dependentRan = Box(false)
    let dependent = BlockOperation { dependentRan.current = true }
    dependent.addDependency(operation)
    await runOnQueue([operation, dependent])
    try? await Task.sleep(for: .milliseconds(100))
    #expect(!ran.current)
    #expect(dependentRan.current)
  }
}
