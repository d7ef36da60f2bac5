import ConveyorOperationKit
import Foundation
import LoopbackHTTPServer
import Synchronization
import Testing

#if canImport(FoundationNetworking)
  import FoundationNetworking
#endif

// The typed operation kit's README and documented behaviour, compiled against the drop-in
// module: the only change is `import ConveyorOperationKit` instead of `import OperationKit`
// (and, under Swift 6, subclasses restating `@unchecked Sendable`).

struct MyObject: Decodable, Sendable, Equatable {
  var name: String
}

struct ParseError: Error, Equatable {
  var text: String
}

/// A value a handler stores and a test (or a dependent operation) reads.
final class Box<Value: Sendable>: Sendable {
  private let value: Mutex<Value>
  init(_ value: Value) { self.value = Mutex(value) }
  var current: Value {
    get { value.withLock { $0 } }
    set { value.withLock { $0 = newValue } }
  }
}

/// A callback queue the handlers must run on, recognisable from inside.
let callbackKey = DispatchSpecificKey<String>()
func makeCallbackQueue() -> DispatchQueue {
  let queue = DispatchQueue(label: "operation-kit-tests.callbacks")
  queue.setSpecific(key: callbackKey, value: "callbacks")
  return queue
}

/// Runs `operations` on an `OperationQueue` and returns once all finished.
func runOnQueue(_ operations: [Operation]) async {
  let queue = OperationQueue()
  for operation in operations { queue.addOperation(operation) }
  await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
    queue.addBarrierBlock { continuation.resume() }
  }
}

// MARK: Subclasses as the README describes them

/// An asynchronous subclass: `main()` finishes later, from another thread.
// @unchecked Sendable: only immutable stored properties.
final class DelayedAnswer: AsyncOperation<Int, ParseError>, @unchecked Sendable {
  let answer: Int
  init(_ answer: Int) {
    self.answer = answer
    super.init()
  }
  override func main() {
    DispatchQueue.global().async { self.finish(withResult: self.answer) }
  }
}

/// A synchronous subclass reading what its predecessor's `successHandler` stored.
// @unchecked Sendable: only immutable stored properties (the box is Sendable).
final class Doubler: SyncOperation<Int, ParseError>, @unchecked Sendable {
  let input: Box<Int?>
  init(input: Box<Int?>) {
    self.input = input
    super.init()
  }
  override func main() {
    guard let value = input.current else {
      finish(withError: ParseError(text: "the predecessor's handler had not run"))
      return
    }
    finish(withResult: value * 2)
  }
}

/// A synchronous subclass that fails.
// @unchecked Sendable: only immutable stored properties.
final class Parse: SyncOperation<Int, ParseError>, @unchecked Sendable {
  let text: String
  init(_ text: String) {
    self.text = text
    super.init()
  }
  override func main() {
    if let number = Int(text) {
      finish(withResult: number)
    } else {
      finish(withError: ParseError(text: text))
    }
  }
}

/// A session delegate of the app's own (it could pin certificates); this one refuses redirects.
final class NoRedirects: NSObject, URLSessionTaskDelegate, Sendable {
  let refused = Mutex(0)
  func urlSession(
    _ session: URLSession, task: URLSessionTask, willPerformHTTPRedirection response: HTTPURLResponse,
    newRequest request: URLRequest, completionHandler: @escaping @Sendable (URLRequest?) -> Void
  ) {
    refused.withLock { $0 += 1 }
    completionHandler(nil)
  }
}

/// A data operation subclassed as the old kit had it: its own `required` initialiser, typed with
/// the old `NetworkResponseEvaluation`.
// @unchecked Sendable: only immutable stored properties.
final class NamedDataOperation: NetworkDataOperation<String>, @unchecked Sendable {
  let label: String

  required init(url: URL, urlSession: URLSession, evaluate: @escaping NetworkResponseEvaluation) {
    label = "named"
    super.init(url: url, urlSession: urlSession, evaluate: evaluate)
  }
}

/// Makes any data operation class through its `required` initialiser, as generic code written
/// for the old kit may.
func makeDataOperation<Operation: NetworkDataOperation<String>>(
  _ type: Operation.Type, url: URL
) -> Operation {
  type.init(url: url, urlSession: .shared) { data, _ in String(decoding: data, as: UTF8.self) }
}

@Suite("OperationKit drop-in (README)")
struct OperationKitReadmeTests {
  let server: LoopbackHTTPServer

  init() throws {
    server = try LoopbackHTTPServer { request, _ in
      switch request.path {
      case "/object": .ok(#"{"name":"Ada"}"#)
      case "/file": .ok("downloaded bytes")
      case "/moved": .status(302, "", headers: [("Location", "/object")])
      default: .status(404, "no such thing")
      }
    }
  }

  @Test("NetworkDataOperation(url:urlSession:) evaluates the body; successHandler runs on callbackQueue")
  func dataOperation() async throws {
    let url = server.url("/object")
    let received = Box<MyObject?>(nil)
    let onCallbackQueue = Box(false)
    let operation = NetworkDataOperation(url: url, urlSession: .shared) { data, response in
      return try JSONDecoder().decode(MyObject.self, from: data)
    }
    operation.callbackQueue = makeCallbackQueue()
    operation.successHandler = { myObject in
      received.current = myObject
      onCallbackQueue.current = DispatchQueue.getSpecific(key: callbackKey) == "callbacks"
    }
    operation.failureHandler = { error in Issue.record("unexpected failure: \(error)") }
    await runOnQueue([operation])
    // Finished after the handler: what it stored is there once the queue is done.
    #expect(received.current == MyObject(name: "Ada"))
    #expect(onCallbackQueue.current)
    #expect(operation.url == url)
  }

  @Test("a subclass with the old required init(url:urlSession:evaluate:) is made through its type")
  func requiredInitialiser() async throws {
    let operation = makeDataOperation(NamedDataOperation.self, url: server.url("/object"))
    let received = Box<String?>(nil)
    operation.callbackQueue = makeCallbackQueue()
    operation.successHandler = { body in received.current = body }
    await runOnQueue([operation])
    #expect(operation.label == "named")
    #expect(received.current == #"{"name":"Ada"}"#)
  }

  @Test("a 404 is a failure: failureHandler gets the status and body, successHandler never runs")
  func notFoundFails() async throws {
    let failure = Box<String?>(nil)
    let operation = NetworkDataOperation(url: server.url("/missing"), urlSession: .shared) { data, _ in
      String(decoding: data, as: UTF8.self)
    }
    operation.callbackQueue = makeCallbackQueue()
    operation.successHandler = { body in Issue.record("a 404 succeeded with \(body)") }
    operation.failureHandler = { error in
      #expect(DispatchQueue.getSpecific(key: callbackKey) == "callbacks")
      if case .httpStatus(let status) = error {
        failure.current = "\(status.statusCode): \(String(decoding: status.bodyExcerpt, as: UTF8.self))"
      } else {
        failure.current = "other: \(error)"
      }
    }
    await runOnQueue([operation])
    #expect(failure.current == "404: no such thing")
  }

  @Test("NetworkDownloadOperation<URL> hands the temporary file to evaluate, which moves it")
  func downloadOperation() async throws {
    let folder = FileManager.default.temporaryDirectory.appendingPathComponent(
      "OperationKitReadmeTests-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(at: folder) }
    let finalFileURL = folder.appendingPathComponent("file.txt")
    let fileManager = FileManager.default
    let saved = Box<URL?>(nil)

    let operation = NetworkDownloadOperation<URL>(url: server.url("/file"), urlSession: .shared) {
      tempURL, response in
      try fileManager.moveItem(at: tempURL, to: finalFileURL)
      return finalFileURL
    }
    operation.callbackQueue = makeCallbackQueue()
    operation.successHandler = { fileURL in
      #expect(DispatchQueue.getSpecific(key: callbackKey) == "callbacks")
      saved.current = fileURL
    }
    operation.failureHandler = { error in Issue.record("unexpected failure: \(error)") }
    await runOnQueue([operation])
    #expect(saved.current == finalFileURL)
    #expect(try String(contentsOf: finalFileURL, encoding: .utf8) == "downloaded bytes")
  }

  @Test("a download's 404 is a failure and leaves no file at the destination")
  func downloadNotFound() async throws {
    let destination = FileManager.default.temporaryDirectory.appendingPathComponent(
      "never-\(UUID().uuidString)")
    let failed = Box(false)
    let operation = NetworkDownloadOperation<URL>(url: server.url("/missing"), urlSession: .shared) {
      tempURL, _ in
      try FileManager.default.moveItem(at: tempURL, to: destination)
      return destination
    }
    operation.callbackQueue = makeCallbackQueue()
    operation.failureHandler = { error in
      if case .httpStatus(let status) = error, status.statusCode == 404 { failed.current = true }
    }
    await runOnQueue([operation])
    #expect(failed.current)
    #expect(!FileManager.default.fileExists(atPath: destination.path))
  }

  @Test("an existing URLSession keeps its own delegate: it refused the redirect, so the 302 fails")
  func existingSessionDelegate() async throws {
    let delegate = NoRedirects()
    let configuration = URLSessionConfiguration.ephemeral
    configuration.urlCache = nil  // see NetworkSession(urlSession:) on Linux
    let session = URLSession(configuration: configuration, delegate: delegate, delegateQueue: nil)
    defer { session.finishTasksAndInvalidate() }
    let status = Box<Int?>(nil)
    let operation = NetworkDataOperation(url: server.url("/moved"), urlSession: session) { data, _ in data }
    operation.failureHandler = { error in
      if case .httpStatus(let http) = error { status.current = http.statusCode }
    }
    await runOnQueue([operation])
    #expect(delegate.refused.withLock { $0 } == 1)
    #expect(status.current == 302)
    #expect(operation.urlSession === session)
  }

  @Test("a dependent operation sees what its predecessor's successHandler stored", arguments: 0..<20)
  func dependentSeesHandlerState(run: Int) async throws {
    let stored = Box<Int?>(nil)
    let first = DelayedAnswer(21 + run)
    first.callbackQueue = makeCallbackQueue()
    first.successHandler = { value in
      // A slow handler: a dependent started before it returned would find nothing stored. (The
      // pause only makes such a bug visible; the test passes however long the handler takes.)
      Thread.sleep(forTimeInterval: 0.02)
      stored.current = value
    }
    let second = Doubler(input: stored)
    second.addDependency(first)
    let doubled = Box<Int?>(nil)
    second.successHandler = { value in doubled.current = value }
    second.failureHandler = { error in Issue.record("\(error.text)") }
    await runOnQueue([first, second])
    #expect(doubled.current == (21 + run) * 2)
  }

  @Test("finish racing the start: the operation is never finished before its successHandler ran")
  func finishRacingTheStartFinishesAfterTheHandler() async {
    let finishedFirst = Box(0)
    let callbacks = makeCallbackQueue()
    var rounds = 0
    while rounds < 30 && finishedFirst.current == 0 {
      rounds += 1
      // The whole round on a Dispatch thread: making and freeing 50,000 operations would hold one
      // of the few threads of Swift's cooperative pool for long.
      await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
        DispatchQueue.global().async {
          let count = 50_000
          let ran = Mutex([Bool](repeating: false, count: count))
          let operations = (0..<count).map { index in
            let operation = FinishedFromOutside()
            operation.callbackQueue = callbacks
            operation.successHandler = { _ in ran.withLock { $0[index] = true } }
            return operation
          }
          DispatchQueue.concurrentPerform(iterations: count * 2) { index in
            let operation = operations[index / 2]
            if index.isMultiple(of: 2) {
              operation.finish(withResult: index)
            } else {
              operation.start()
              // Read in this order: an operation finished after its handler can never be seen
              // finished with the handler not run.
              if operation.isFinished && !ran.withLock({ $0[index / 2] }) { finishedFirst.current += 1 }
            }
          }
          continuation.resume()
        }
      }
      await withCheckedContinuation { continuation in callbacks.async { continuation.resume() } }
    }
    #expect(finishedFirst.current == 0, "isFinished was true before successHandler had run (round \(rounds))")
  }

  @Test("SyncOperation: main() calls finish(withError:); failureHandler runs, then the operation is finished")
  func syncOperationFailure() async throws {
    let failure = Box<ParseError?>(nil)
    let parse = Parse("forty-two")
    parse.callbackQueue = makeCallbackQueue()
    parse.successHandler = { _ in Issue.record("parsed nonsense") }
    parse.failureHandler = { error in failure.current = error }
    await runOnQueue([parse])
    #expect(failure.current == ParseError(text: "forty-two"))
    #expect(parse.isFinished)
  }

  @Test("a second finish is ignored: the handler runs once")
  func finishTwice() async throws {
    let calls = Box(0)
    let received = Box<[Int]>([])
    let parse = Parse("7")
    parse.callbackQueue = makeCallbackQueue()
    parse.successHandler = { value in
      calls.current += 1
      received.current.append(value)
    }
    await runOnQueue([parse])
    parse.finish(withResult: 8)
    parse.finish(withError: ParseError(text: "late"))
    await withCheckedContinuation { continuation in parse.callbackQueue.async { continuation.resume() } }
    #expect(calls.current == 1)
    #expect(received.current == [7])
  }
}
