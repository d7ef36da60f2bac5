import ConveyorOperationKit
import Foundation
import LoopbackHTTPServer
import Synchronization
import Testing

#if canImport(FoundationNetworking)
  import FoundationNetworking
#endif

// The example of this module's landing page (ConveyorOperationKit.md), verbatim between the
// markers, against a server on 127.0.0.1. `MyObject` is the old README's (OperationKitReadmeTests.swift).

@Suite("Guide snippets: OperationKit drop-in", .timeLimit(.minutes(10)))
struct OperationKitGuideSnippetTests {
  @Test func theLandingPageExampleFetchesAndDecodes() async throws {
    let server = try LoopbackHTTPServer { _, _ in .ok(#"{"name":"Ada"}"#) }
    defer { server.stop() }
    let url = server.url("/object")
    let queue = OperationQueue()
    // The example prints what it received; here `print` records it instead.
    let received = Mutex<MyObject?>(nil)
    @Sendable func print(_ object: MyObject) { received.withLock { $0 = object } }

    // ConveyorOperationKit.md example begins
    let operation = NetworkDataOperation(url: url, urlSession: .shared) { data, response in
      return try JSONDecoder().decode(MyObject.self, from: data)
    }
    operation.successHandler = { myObject in print(myObject) }
    queue.addOperation(operation)
    // ConveyorOperationKit.md example ends

    await withCheckedContinuation { continuation in queue.addBarrierBlock { continuation.resume() } }
    // Finished after its handler: what the handler stored is there.
    #expect(received.withLock { $0 } == MyObject(name: "Ada"))
  }
}
