import Conveyor
import ConveyorTestSupport
import Dispatch
import Foundation
import Testing

/// The examples of the "Typed operations" guide (Sources/Conveyor/Conveyor.docc/TypedOperations.md),
/// verbatim between the markers, so they compile and run.
@Suite("Guide snippets: typed operations", .timeLimit(.minutes(10)))
struct OperationReadmeTests {
  struct FetchError: Error { var reason: String }

  @Test func queueWithDependencies() async throws {
    // TypedOperations.md example 1 begins
    let queue = OperationQueue()

    let fetch = AsyncOperation<String, FetchError> { () async throws(FetchError) -> String in
      try? await Task.sleep(for: .milliseconds(10))  // checks Task.isCancelled for you
      return "payload"
    }
    let measure = SyncOperation<Int, FetchError> { () throws(FetchError) -> Int in
      guard case .success(let text)? = fetch.result else { throw FetchError(reason: "no input") }
      return text.count
    }
    measure.addDependency(fetch)
    measure.successHandler = { length in print("length:", length) }  // runs on callbackQueue

    queue.addOperation(fetch)
    queue.addOperation(measure)
    let length = try await measure.value  // waits; the queue starts it
    // TypedOperations.md example 1 ends
    #expect(length == 7)
  }

  @Test func standaloneRunAndCancel() async throws {
    // TypedOperations.md example 2 begins
    let answer = AsyncOperation<Int, Never> { operation in
      DispatchQueue.global().async { operation.finish(returning: 42) }
    }
    let value = try await answer.run()  // starts it, then waits: 42

    let slow = AsyncOperation<Int, Never> { operation in
      DispatchQueue.global().asyncAfter(deadline: .now() + 60) { operation.finish(returning: 1) }
    }
    slow.successHandler = { _ in print("never printed: cancelled") }
    slow.start()
    slow.cancel()  // isFinished at once; dependents may run
    do {
      _ = try await slow.value
    } catch .cancelled {
      print("cancelled")
    } catch .failed(let never) {
      switch never {}
    }
    // TypedOperations.md example 2 ends
    #expect(value == 42)
    #expect(slow.isFinished && slow.isCancelled && slow.result == nil)
  }
}
