import Conveyor
import Foundation
import Synchronization
import Testing

@Suite("finishesAfterHandlers")
struct FinishAfterHandlersTests {
  /// Runs `operations` on an `OperationQueue` and returns once all finished.
  func run(_ operations: [Operation]) async {
    let queue = OperationQueue()
    for operation in operations { queue.addOperation(operation) }
    await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
      queue.addBarrierBlock { continuation.resume() }
    }
  }

  @Test(
    "a SyncOperation or AsyncOperation that finishes after its handler: the dependent sees what it stored",
    arguments: [false, true])
  func dependentSeesHandler(async: Bool) async {
    let stored = Mutex<Int?>(nil)
    let first: TypedOperation<Int, Never> =
      async
      ? AsyncOperation<Int, Never> { operation in
        DispatchQueue.global().async { operation.finish(returning: 7) }
      }
      : SyncOperation<Int, Never> { 7 }
    first.finishesAfterHandlers = true
    first.successHandler = { value in
      Thread.sleep(forTimeInterval: 0.02)  // a dependent started early would find nothing stored
      stored.withLock { $0 = value }
    }
    let second = SyncOperation<Int?, Never> { stored.withLock { $0 } }
    second.addDependency(first)
    await run([first, second])
    #expect(second.result.map { $0.get() } == .some(7))
    #expect(first.isFinished)
  }

  @Test("without a handler, or after cancel(), the operation finishes as usual")
  func noHandler() async {
    let plain = SyncOperation<Int, Never> { 1 }
    plain.finishesAfterHandlers = true
    await run([plain])
    #expect(plain.isFinished)

    let cancelled = AsyncOperation<Int, Never> { _ in }
    cancelled.finishesAfterHandlers = true
    cancelled.successHandler = { _ in Issue.record("a cancelled operation's handler ran") }
    let queue = OperationQueue()
    queue.addOperation(cancelled)
    cancelled.cancel()
    await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
      queue.addBarrierBlock { continuation.resume() }
    }
    #expect(cancelled.isFinished)
  }
}
