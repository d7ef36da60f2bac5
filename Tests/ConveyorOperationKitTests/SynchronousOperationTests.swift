import ConveyorOperationKit
import Foundation
import Testing
import XCTest

/// A synchronous subclass whose `main()` may return without calling `finish`.
// @unchecked Sendable: only immutable stored properties.
final class MaybeFinish: SyncOperation<Int, ParseError>, @unchecked Sendable {
  let finishes: Bool
  init(finishes: Bool) {
    self.finishes = finishes
    super.init()
  }
  override func main() {
    if finishes { finish(withResult: 1) }
  }
}

@Suite("OperationKit drop-in: SyncOperation is synchronous, as in the old kit", .timeLimit(.minutes(10)))
struct SynchronousOperationTests {
  @Test("a main() that returns without calling finish finishes the operation, with no handler run")
  func mainWithoutFinishFinishes() async {
    let ran = Box(false)
    let operation = MaybeFinish(finishes: false)
    operation.successHandler = { _ in ran.current = true }
    let dependentRan = Box(false)
    let dependent = BlockOperation { dependentRan.current = true }
    dependent.addDependency(operation)
    await runOnQueue([operation, dependent])
    #expect(operation.isFinished)
    #expect(dependentRan.current)
    #expect(!ran.current)
  }

  @Test("finish runs the handler before main() goes on, so the operation finishes after it")
  func handlerRunsInsideFinish() {
    let order = Box<[String]>([])
    // @unchecked Sendable: only immutable stored properties (the box is Sendable).
    final class Steps: SyncOperation<Int, ParseError>, @unchecked Sendable {
      let order: Box<[String]>
      init(order: Box<[String]>) {
        self.order = order
        super.init()
      }
      override func main() {
        finish(withResult: 1)
        order.current.append("after finish")
      }
    }
    let operation = Steps(order: order)
    operation.callbackQueue = makeCallbackQueue()
    operation.successHandler = { _ in order.current.append("handler") }
    operation.start()
    #expect(order.current == ["handler", "after finish"])
    #expect(operation.isFinished)
  }

  @Test("a callbackQueue that runs the operation itself gets the handler inline, without a deadlock")
  func handlerOnTheOperationsOwnQueue() async {
    let queue = makeCallbackQueue()
    let operations = OperationQueue()
    operations.underlyingQueue = queue
    operations.maxConcurrentOperationCount = 1
    let onQueue = Box(false)
    let operation = MaybeFinish(finishes: true)
    operation.callbackQueue = queue
    operation.successHandler = { _ in
      onQueue.current = DispatchQueue.getSpecific(key: callbackKey) == "callbacks"
    }
    operations.addOperation(operation)
    #expect(await finishes(operation))
    #expect(onQueue.current)
  }

  @Test("a dependent sees what a synchronous predecessor's handler stored", arguments: 0..<10)
  func dependentSeesSynchronousHandlerState(run: Int) async {
    let stored = Box<Int?>(nil)
    let first = Parse("\(run)")
    first.callbackQueue = makeCallbackQueue()
    first.successHandler = { value in
      Thread.sleep(forTimeInterval: 0.01)
      stored.current = value
    }
    let readBack = Box<Int?>(nil)
    let second = BlockOperation { readBack.current = stored.current }
    second.addDependency(first)
    await runOnQueue([first, second])
    #expect(readBack.current == run)
  }
}

/// XCTest runs its tests on the main thread (Swift Testing runs main-actor tests on whichever
/// thread serves the main queue, which on Linux is not the main thread).
final class SyncOperationOnTheMainThreadTests: XCTestCase {
  /// Started on the main thread inside another queue's block, with `callbackQueue = .main`: the
  /// main thread runs this block, not the main queue, so a synchronous wait for the main queue
  /// would never end. On Linux each read of `DispatchQueue.main` gives a new object, so the old
  /// `queue === DispatchQueue.main` check never saw the main queue, and the operation hung.
  func testAMainQueueHandlerRunsInlineOnTheMainThread() throws {
    try XCTSkipUnless(Thread.isMainThread, "XCTest did not run this test on the main thread")
    let operation = MaybeFinish(finishes: true)
    let ran = Box(false)
    operation.callbackQueue = .main
    operation.successHandler = { _ in ran.current = true }
    DispatchQueue(label: "operation-kit-tests.other").sync { operation.start() }
    XCTAssertTrue(ran.current)
    XCTAssertTrue(operation.isFinished)
  }

  /// The same outside any block, as in a tool's top-level code.
  func testAMainQueueHandlerRunsInlineOutsideAnyBlock() throws {
    try XCTSkipUnless(Thread.isMainThread, "XCTest did not run this test on the main thread")
    let operation = MaybeFinish(finishes: true)
    let ran = Box(false)
    operation.callbackQueue = .main
    operation.successHandler = { _ in ran.current = true }
    operation.start()
    XCTAssertTrue(ran.current)
    XCTAssertTrue(operation.isFinished)
  }
}
