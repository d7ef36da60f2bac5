import ConveyorOperationKit
import Foundation
import Synchronization
import Testing

// The typed operation kit's own tests (AyncOperationTests.swift, SyncOperationTests.swift), with
// their mocks as the kit wrote them: only the import changed, Swift 6 asks the subclasses to
// restate `@unchecked Sendable`, and expectations became polls. The mocks declare
// `let result: Bool?`, a name the old base classes did not have. Where the drop-in differs on
// purpose (the migration guide says why), the test checks the documented behaviour instead and
// says so.

/// The old AsyncOperation mock: finishes 0.15 s after it started, with `result` or an error.
// @unchecked Sendable: `onExecute` is set before the operation is queued and only read after.
private class MockAsyncOperation: AsyncOperation<Bool, NSError>, @unchecked Sendable {
  let result: Bool?
  var onExecute: (() -> Void)?

  init(result: Bool?) {
    self.result = result
  }

  override func main() {
    self.onExecute?()

    DispatchQueue.global(qos: .background).asyncAfter(deadline: .now() + 0.15) { [weak self] in
      if let result = self?.result {
        self?.finish(withResult: result)
      } else {
        self?.finish(withError: NSError(domain: "com.example.test", code: 0, userInfo: nil))
      }
    }
  }
}

/// The old SyncOperation mock: finishes inside `main()`.
// @unchecked Sendable: only an immutable stored property.
private class MockSyncOperation: SyncOperation<Bool, NSError>, @unchecked Sendable {
  let result: Bool?

  init(result: Bool?) {
    self.result = result
  }

  override func main() {
    if let result = self.result {
      self.finish(withResult: result)
    } else {
      self.finish(withError: NSError(domain: "com.example.test", code: 0, userInfo: nil))
    }
  }
}

/// Counts what happened to an operation, from any thread.
private final class Record: Sendable {
  private let counts = Mutex([String: Int]())
  func note(_ event: String) { counts.withLock { $0[event, default: 0] += 1 } }
  subscript(_ event: String) -> Int { counts.withLock { $0[event, default: 0] } }
}

/// The old tests' queue: operations run on a background global queue.
private func backgroundQueue() -> OperationQueue {
  let queue = OperationQueue()
  queue.underlyingQueue = DispatchQueue.global(qos: .background)
  return queue
}

/// Polls `condition` until it holds, up to a generous bound (a real hang blows through it).
private func within(_ seconds: Double = 20, _ condition: () -> Bool) async -> Bool {
  let deadline = Date().addingTimeInterval(seconds)
  while Date() < deadline {
    if condition() { return true }
    try? await Task.sleep(for: .milliseconds(5))
  }
  return condition()
}

@Suite("OperationKit drop-in: the old kit's own tests", .timeLimit(.minutes(10)))
struct OldKitOwnTests {
  @Test("AsyncOperation: properties before the start")
  func asyncProperties() {
    let operation = MockAsyncOperation(result: nil)
    #expect(operation.isConcurrent)
    #expect(operation.isAsynchronous)
    #expect(!operation.isExecuting)
    #expect(!operation.isFinished)
  }

  @Test("AsyncOperation: success runs successHandler, then the operation is finished")
  func asyncSuccess() async {
    let record = Record()
    let operation = MockAsyncOperation(result: true)
    operation.callbackQueue = makeCallbackQueue()
    operation.successHandler = { operationResult in
      if operationResult == true { record.note("success") }
      if DispatchQueue.getSpecific(key: callbackKey) == "callbacks" { record.note("on queue") }
    }
    operation.failureHandler = { _ in record.note("failure") }
    operation.onExecute = { [unowned operation] in
      if operation.isExecuting && !operation.isFinished { record.note("executing") }
    }
    backgroundQueue().addOperation(operation)
    #expect(await within { operation.isFinished })
    #expect(record["success"] == 1 && record["on queue"] == 1 && record["executing"] == 1)
    #expect(record["failure"] == 0)
    #expect(!operation.isExecuting)
  }

  @Test("AsyncOperation: failure runs failureHandler on callbackQueue")
  func asyncFailure() async {
    let record = Record()
    let operation = MockAsyncOperation(result: nil)
    operation.callbackQueue = makeCallbackQueue()
    operation.successHandler = { _ in record.note("success") }
    operation.failureHandler = { _ in
      if DispatchQueue.getSpecific(key: callbackKey) == "callbacks" { record.note("failure on queue") }
    }
    backgroundQueue().addOperation(operation)
    #expect(await within { operation.isFinished })
    #expect(record["failure on queue"] == 1 && record["success"] == 0)
    #expect(!operation.isExecuting)
  }

  // Differs on purpose: the old test expected `isFinished` right after `cancel()`; the drop-in
  // finishes a queued operation when its queue starts it (see cancelledBeforeStart… below).
  @Test("AsyncOperation: cancelled before the start, it never executes, runs no handler and finishes")
  func asyncCancellationBeforeStart() async {
    let record = Record()
    let operation = MockAsyncOperation(result: true)
    operation.onExecute = { record.note("executed") }
    operation.successHandler = { _ in record.note("handler") }
    operation.failureHandler = { _ in record.note("handler") }
    operation.completionBlock = { record.note("completion") }
    // Held until the cancel: a queue left running may start the operation first (it did
    // under load), and then the test would check a cancel while it runs.
    let queue = backgroundQueue()
    queue.isSuspended = true
    queue.addOperation(operation)
    operation.cancel()
    #expect(!operation.isExecuting)
    #expect(operation.isCancelled)
    queue.isSuspended = false
    #expect(await within { record["completion"] == 1 })
    #expect(operation.isFinished)
    #expect(record["executed"] == 0 && record["handler"] == 0)
  }

  @Test(
    "AsyncOperation: cancelled while it runs, it finishes at once and runs no handler",
    arguments: [true, false])
  func asyncCancellationWhileRunning(succeeds: Bool) async {
    let record = Record()
    let operation = MockAsyncOperation(result: succeeds ? true : nil)
    operation.successHandler = { _ in record.note("handler") }
    operation.failureHandler = { _ in record.note("handler") }
    operation.completionBlock = { record.note("completion") }
    operation.onExecute = { record.note("executed") }
    backgroundQueue().addOperation(operation)
    #expect(await within { record["executed"] == 1 })
    operation.cancel()
    #expect(await within { record["completion"] == 1 })
    try? await Task.sleep(for: .milliseconds(300))  // past the mock's finish, 0.15 s after the start
    #expect(!operation.isExecuting)
    #expect(operation.isFinished)
    // On a machine slow enough for the mock's finish to come first, the late cancel changes
    // nothing and the handler ran: never both.
    #expect(record["handler"] == (operation.isCancelled ? 0 : 1))
  }

  @Test("SyncOperation: properties")
  func syncProperties() {
    let operation = MockSyncOperation(result: true)
    #expect(!operation.isConcurrent)
    #expect(!operation.isAsynchronous)
  }

  @Test("SyncOperation: start() runs main(), the handler on callbackQueue, and returns finished")
  func syncSuccess() {
    let record = Record()
    let operation = MockSyncOperation(result: true)
    operation.callbackQueue = makeCallbackQueue()
    operation.successHandler = { operationResult in
      if operationResult && DispatchQueue.getSpecific(key: callbackKey) == "callbacks" {
        record.note("success on queue")
      }
    }
    operation.failureHandler = { _ in record.note("failure") }
    operation.start()
    // Synchronous, as in the old kit: the handler has run and the operation is finished.
    #expect(record["success on queue"] == 1 && record["failure"] == 0)
    #expect(operation.isFinished)
  }

  @Test("SyncOperation: failure runs failureHandler before start() returns")
  func syncFailure() {
    let record = Record()
    let operation = MockSyncOperation(result: nil)
    operation.successHandler = { _ in record.note("success") }
    operation.failureHandler = { _ in record.note("failure") }
    operation.start()
    #expect(record["failure"] == 1 && record["success"] == 0)
    #expect(operation.isFinished)
  }

  @Test(
    "SyncOperation: cancelled right after being queued, it runs no handler and completes",
    arguments: [true, false])
  func syncCancellation(succeeds: Bool) async {
    let record = Record()
    let operation = MockSyncOperation(result: succeeds ? true : nil)
    operation.successHandler = { _ in record.note("handler") }
    operation.failureHandler = { _ in record.note("handler") }
    operation.completionBlock = { record.note("completion") }
    backgroundQueue().addOperation(operation)
    operation.cancel()
    #expect(await within { record["completion"] == 1 })
    // The queue may have started it before the cancel: then the handler ran first, and the
    // cancel, coming after `finish`, changed nothing.
    #expect(record["handler"] == (operation.isCancelled ? 0 : 1))
  }
}
