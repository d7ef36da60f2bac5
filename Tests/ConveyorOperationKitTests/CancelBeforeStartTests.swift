import ConveyorOperationKit
import ConveyorTestSupport
import Foundation
import Testing

#if canImport(Glibc)
  import Glibc
#endif

/// Records whether `main()` ran.
// @unchecked Sendable: only immutable stored properties (the box is Sendable).
final class NeverToRun: AsyncOperation<Int, ParseError>, @unchecked Sendable {
  let ran = Box(false)
  override func main() {
    ran.current = true
    finish(withResult: 1)
  }
}

/// Finishes from another thread.
// @unchecked Sendable: no stored properties.
final class RacingOp: ConveyorOperationKit.AsyncOperation<Int, ParseError>, @unchecked Sendable {
  override func main() {
    DispatchQueue.global().async { self.finish(withResult: 1) }
  }
}

/// Never finishes by itself: the test finishes it from outside.
// @unchecked Sendable: no stored properties.
final class FinishedFromOutside: AsyncOperation<Int, ParseError>, @unchecked Sendable {
  override func main() {}
}

// A documented difference (the migration guide, "Cancelling before the start"): the old
// AsyncOperation became finished inside `cancel()`, even in a queue that had not started it;
// Foundation's queues (on Apple platforms and on Linux) require an operation they hold to be
// started by them before it is finished. The drop-in finishes a cancelled operation when it is
// started, which its queue does at once.
// Five minutes: the race of cancel() and an early finish runs 30 rounds of 50,000 operations when
// nothing is wrong, which takes half a minute alone and more in a full run.
@Suite("OperationKit drop-in: an operation cancelled before or as it starts", .timeLimit(.minutes(10)))
struct CancelBeforeStartTests {
  @Test("queued: cancelled at once, finished when the queue starts it, main() and handlers never run")
  func queued() async {
    let operation = NeverToRun()
    let handled = Box(false)
    operation.successHandler = { _ in handled.current = true }
    let completed = Box(false)
    operation.completionBlock = { completed.current = true }
    let gate = BlockOperation { Thread.sleep(forTimeInterval: 0.2) }
    operation.addDependency(gate)  // so that the queue has not started it when it is cancelled
    let queue = OperationQueue()
    queue.addOperation(gate)
    queue.addOperation(operation)
    operation.cancel()
    #expect(operation.isCancelled)
    #expect(!operation.isExecuting)
    // Not finished inside cancel(): the queue finishes it when it starts it. Wait for that with
    // the completion block, `waitUntilFinished()` or the queue, as a user who relied on the old
    // behaviour does.
    await withCheckedContinuation { continuation in
      DispatchQueue.global().async {
        operation.waitUntilFinished()
        continuation.resume()
      }
    }
    #expect(operation.isFinished)
    try? await Task.sleep(for: .milliseconds(50))
    #expect(completed.current)
    #expect(!operation.ran.current)
    #expect(!handled.current)
    // The gate is still pending when this test returns and frees the operation: see
    // `freedBeforeItsDependencyFinished`.
  }

  #if canImport(Glibc)
    @Test("freed before its dependency finished: the dependency's finish does not read it (Linux)")
    func freedBeforeItsDependencyFinished() {
      #expect(finishDependencyAfterFreeingItsCancelledDependent { NeverToRun() })
      #expect(finishDependencyAfterFreeingItsCancelledDependent { MaybeFinish(finishes: true) })
    }
  #endif

  @Test("in no queue: finished when start() is called, without running main()")
  func standalone() {
    let operation = NeverToRun()
    operation.cancel()
    #expect(operation.isCancelled)
    #expect(!operation.isFinished)
    operation.start()
    #expect(operation.isFinished)
    #expect(!operation.ran.current)
  }

  @Test("cancel() racing a finish given before the start: cancelled, no handler runs when it starts")
  func cancelRacingAnEarlyFinish() async {
    let handlers = Box(0)
    let notCancelled = Box(0)
    let callbacks = makeCallbackQueue()
    var rounds = 0
    while rounds < 30 && handlers.current == 0 && notCancelled.current == 0 {
      rounds += 1
      // The whole round on a Dispatch thread: making, starting and freeing 50,000 operations
      // would hold one of the few threads of Swift's cooperative pool for long.
      await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
        DispatchQueue.global().async {
          let count = 50_000
          let operations = (0..<count).map { _ in
            let operation = FinishedFromOutside()
            operation.callbackQueue = callbacks
            operation.successHandler = { _ in handlers.current += 1 }
            return operation
          }
          DispatchQueue.concurrentPerform(iterations: count * 2) { index in
            let operation = operations[index / 2]
            if index.isMultiple(of: 2) { operation.finish(withResult: index) } else { operation.cancel() }
          }
          // Every cancel() returned before any start.
          for operation in operations { operation.start() }
          notCancelled.current += operations.filter { !$0.isCancelled }.count
          continuation.resume()
        }
      }
      await withCheckedContinuation { continuation in callbacks.async { continuation.resume() } }
    }
    #expect(
      handlers.current == 0,
      "successHandler ran for operations cancelled before they started (round \(rounds))")
    #expect(
      notCancelled.current == 0,
      "operations cancelled before they started are not cancelled (round \(rounds))")
  }

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
