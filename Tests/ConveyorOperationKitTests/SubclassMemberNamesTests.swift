import ConveyorOperationKit
import Foundation
import Testing

#if canImport(FoundationNetworking)
  import FoundationNetworking
#endif

// Subclasses declaring members the old kit's base classes did not have. Each declaration would
// fail to compile ("cannot override a property", "overriding declaration requires an 'override'
// keyword") if a drop-in class showed a member of that name, as they did when they inherited
// Conveyor's operations (`result`, `value`, `run()`, `finish(returning:)`, `request`,
// `session`…). The test is that this file compiles; the checks below only use the members.

// @unchecked Sendable: only immutable stored properties.
final class AsyncWithOwnNames: AsyncOperation<Int, ParseError>, @unchecked Sendable {
  let result: Bool?
  let value: String
  let error: ParseError?
  let task: Int = 0
  let finishesAfterHandlers = "mine"
  let core = "mine"
  let transfer = "mine"

  init(result: Bool?) {
    self.result = result
    self.value = "mine"
    self.error = nil
  }

  func run() -> String { "mine" }
  func finish(returning value: Int) -> String { "mine \(value)" }
  func finish(throwing error: ParseError) -> String { "mine \(error.text)" }
  func attach(_ task: Int) -> Int { task }
  func complete(_ outcome: Int) -> Int { outcome }
  func execute() -> Int { 1 }

  override func main() {
    finish(withResult: result == true ? 1 : 0)
  }
}

// @unchecked Sendable: only immutable stored properties.
final class SyncWithOwnNames: SyncOperation<Int, ParseError>, @unchecked Sendable {
  let result: Bool?
  let value = 2
  let state = "mine"
  let decided = "mine"

  init(result: Bool?) {
    self.result = result
  }

  func run() -> Int { value }
  func execute() -> Int { value }
  func finish(returning value: Int) -> Int { value }

  override func main() {
    finish(withResult: result == true ? run() : 0)
  }
}

// @unchecked Sendable: only immutable stored properties.
final class DataWithOwnNames: NetworkDataOperation<Data>, @unchecked Sendable {
  let result: Bool? = nil
  let value = 3
  let request = "mine"
  let session = "mine"
  let prepare = "mine"
  let bodyLimit = "mine"
  let acceptedStatusCodes = "mine"
  let transfer = "mine"

  func run() -> Int { value }
  func createTask() -> String { request }
}

// @unchecked Sendable: only immutable stored properties.
final class DownloadWithOwnNames: NetworkDownloadOperation<URL>, @unchecked Sendable {
  let result: Bool? = nil
  let value = 4
  let request = "mine"
  let session = "mine"
  let progressHandler = "mine"
  let acceptedStatusCodes = "mine"

  func cleanUp() -> String { session }
}

// The old kit declared `successHandler`, `failureHandler` and `callbackQueue` as `open var`s and
// read them through `self` when it finished, so a subclass could override them: one queue for
// all its handlers, or a handler that logs before calling the one set.

/// Fixes its own callback queue by overriding the getter.
// @unchecked Sendable: only immutable stored properties.
final class AsyncWithOwnCallbackQueue: AsyncOperation<Int, ParseError>, @unchecked Sendable {
  let ownQueue = makeCallbackQueue()
  override var callbackQueue: DispatchQueue {
    get { ownQueue }
    set {}
  }
  override func main() {
    DispatchQueue.global().async { self.finish(withResult: 1) }
  }
}

/// Fixes its own callback queue by overriding the getter.
// @unchecked Sendable: only immutable stored properties.
final class SyncWithOwnCallbackQueue: SyncOperation<Int, ParseError>, @unchecked Sendable {
  let ownQueue = makeCallbackQueue()
  override var callbackQueue: DispatchQueue {
    get { ownQueue }
    set {}
  }
  override func main() {
    finish(withResult: 1)
  }
}

/// Logs each value before calling the handler that was set.
// @unchecked Sendable: only immutable stored properties (the box is Sendable).
final class AsyncLoggingSuccess: AsyncOperation<Int, ParseError>, @unchecked Sendable {
  let log = Box<[String]>([])
  override var successHandler: (@Sendable (Int) -> Void)? {
    get {
      let handler = super.successHandler
      let log = log
      return { value in
        log.current.append("success \(value)")
        handler?(value)
      }
    }
    set { super.successHandler = newValue }
  }
  override func main() {
    DispatchQueue.global().async { self.finish(withResult: 7) }
  }
}

@Suite("OperationKit drop-in: subclasses may use names the old classes did not have")
struct SubclassMemberNamesTests {
  @Test("an AsyncOperation subclass with its own result, value, run() and finish(returning:) runs")
  func asyncSubclassRuns() async {
    let operation = AsyncWithOwnNames(result: true)
    let received = Box<Int?>(nil)
    operation.callbackQueue = makeCallbackQueue()
    operation.successHandler = { received.current = $0 }
    await runOnQueue([operation])
    #expect(received.current == 1)
    #expect(operation.result == true)
    #expect(operation.value == "mine" && operation.run() == "mine")
    #expect(operation.finish(returning: 5) == "mine 5")
  }

  @Test("a SyncOperation subclass with its own result and value runs")
  func syncSubclassRuns() {
    let operation = SyncWithOwnNames(result: true)
    let received = Box<Int?>(nil)
    operation.successHandler = { received.current = $0 }
    operation.start()
    #expect(received.current == 2)
    #expect(operation.result == true)
  }

  @Test("network subclasses keep the old initialiser and their own request, session and result")
  func networkSubclassesKeepTheirNames() throws {
    let url = try #require(URL(string: "http://127.0.0.1:9/nothing"))
    let data = DataWithOwnNames(url: url, urlSession: .shared) { data, _ in data }
    let download = DownloadWithOwnNames(url: url, urlSession: .shared) { location, _ in location }
    #expect(data.url == url && data.request == "mine" && data.result == nil)
    #expect(download.url == url && download.session == "mine" && download.result == nil)
  }

  @Test("an AsyncOperation subclass that overrides callbackQueue gets its handler on that queue")
  func asyncOverriddenCallbackQueue() async {
    let operation = AsyncWithOwnCallbackQueue()
    let ranOn = Box<String?>(nil)
    operation.successHandler = { _ in
      ranOn.current = DispatchQueue.getSpecific(key: callbackKey) ?? "another queue"
    }
    await runOnQueue([operation])
    #expect(ranOn.current == "callbacks")
  }

  @Test("a SyncOperation subclass that overrides callbackQueue gets its handler on that queue")
  func syncOverriddenCallbackQueue() async {
    let operation = SyncWithOwnCallbackQueue()
    let ranOn = Box<String?>(nil)
    operation.successHandler = { _ in
      ranOn.current = DispatchQueue.getSpecific(key: callbackKey) ?? "another queue"
    }
    await runOnQueue([operation])
    #expect(ranOn.current == "callbacks")
  }

  @Test("a subclass that overrides successHandler has its override called")
  func overriddenSuccessHandler() async {
    let operation = AsyncLoggingSuccess()
    let received = Box<Int?>(nil)
    operation.callbackQueue = makeCallbackQueue()
    operation.successHandler = { received.current = $0 }
    await runOnQueue([operation])
    #expect(received.current == 7)
    #expect(operation.log.current == ["success 7"])
  }
}
