import ConveyorOperationKit
import Foundation
import Testing

/// Records whether `main()` ran.
// @unchecked Sendable: only immutable stored properties (the box is Sendable).
final class NeverToRun: AsyncOperation<Int, ParseError>, @unchecked Sendable {
  let ran = Box(false)
  override func main() {
    ran.current = true
    finish(withResult: 1)
  }
}

// A documented difference (the migration guide, "Cancelling before the start"): the old
// AsyncOperation became finished inside `cancel()`, even in a queue that had not started it;
// Foundation's queues (on Apple platforms and on Linux) require an operation they hold to be
// started by them before it is finished. The drop-in finishes a cancelled operation when it is
// started, which its queue does at once.
@Suite("OperationKit drop-in: an operation cancelled before it starts", .timeLimit(.minutes(2)))
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
  }

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
}
