import ConveyorTestSupport
import Dispatch
import Foundation
import Synchronization
import Testing

@testable import Conveyor

/// These run on swift-corelibs-foundation's `OperationQueue` on Linux, which has had bugs with
/// dependencies of asynchronous operations; each test would hang (and hit the time limit) if a
/// dependent never became ready.
@Suite("Operations on OperationQueue", .timeLimit(.minutes(10)))
struct OperationQueueTests {
  /// An async operation that appends `name` to `log` and finishes later on another queue.
  private func delayed(_ name: String, _ log: Log<String>, after seconds: Double = 0.01) -> AsyncOperation<
    String, Never
  > {
    AsyncOperation { operation in
      DispatchQueue.global().asyncAfter(deadline: .now() + seconds) {
        log.append(name)
        operation.finish(returning: name)
      }
    }
  }

  @Test func chainOfAsyncDependenciesRunsInOrder() async throws {
    let log = Log<String>()
    let queue = OperationQueue()
    queue.maxConcurrentOperationCount = 4
    let operations = (0..<5).map { delayed("op\($0)", log) }
    for (previous, next) in zip(operations, operations.dropFirst()) { next.addDependency(previous) }
    for operation in operations.reversed() { queue.addOperation(operation) }
    #expect(try await operations.last!.value == "op4")
    #expect(log.all == ["op0", "op1", "op2", "op3", "op4"])
    #expect(await eventually { queue.operationCount == 0 })
    #expect(operations.allSatisfy { $0.isFinished && !$0.isExecuting })
  }

  @Test func waitUntilAllOperationsAreFinishedReturns() async {
    let log = Log<String>()
    let queue = OperationQueue()
    let first = delayed("a", log)
    let second = SyncOperation<Int, Never> {
      log.append("b")
      return 2
    }
    second.addDependency(first)
    for operation in [second, first] { queue.addOperation(operation) }
    await withCheckedContinuation { continuation in
      // A thread of its own: blocking one of Dispatch's few workers would delay the operations.
      Thread {
        queue.waitUntilAllOperationsAreFinished()
        continuation.resume()
      }.start()
    }
    #expect(log.all == ["a", "b"])
    #expect(first.isFinished && second.isFinished)
  }

  @Test func cancelledRunningDependencyLetsDependentsRun() async throws {
    let queue = OperationQueue()
    let blocker = AsyncOperation<Int, Never> { _ in }  // never finishes by itself
    let dependent = SyncOperation<String, Never> { "ran" }
    dependent.addDependency(blocker)
    for operation in [blocker, dependent] { queue.addOperation(operation) }
    #expect(await eventually { blocker.isExecuting })
    #expect(!dependent.isFinished)
    blocker.cancel()
    #expect(try await dependent.value == "ran")
    await #expect(throws: OperationError<Never>.cancelled) { try await blocker.value }
  }

  @Test func dependencyCancelledBeforeStartLetsDependentsRun() async throws {
    let queue = OperationQueue()
    queue.isSuspended = true
    let ran = Counter()
    let dependency = AsyncOperation<Int, Never> { operation in
      ran.increment()
      operation.finish(returning: 1)
    }
    let dependent = AsyncOperation<String, Never> { "ran" }
    dependent.addDependency(dependency)
    for operation in [dependency, dependent] { queue.addOperation(operation) }
    dependency.cancel()
    queue.isSuspended = false
    #expect(try await dependent.value == "ran")
    #expect(await eventually { dependency.isFinished })
    #expect(ran.value == 0)
  }

  @Test func prioritiesOrderReadyOperations() async throws {
    let queue = OperationQueue()
    queue.maxConcurrentOperationCount = 1
    queue.isSuspended = true
    let log = Log<String>()
    let priorities: [(String, Operation.QueuePriority)] = [
      ("veryLow", .veryLow), ("normal", .normal), ("veryHigh", .veryHigh), ("high", .high),
    ]
    let operations = priorities.map { name, priority in
      let operation = AsyncOperation<Void, Never> { operation in
        log.append(name)
        operation.finish(returning: ())
      }
      operation.queuePriority = priority
      return operation
    }
    for operation in operations { queue.addOperation(operation) }
    queue.isSuspended = false
    for operation in operations { try await operation.value }
    #expect(log.all == ["veryHigh", "high", "normal", "veryLow"])
  }

  @Test func maxConcurrentOperationCountHoldsForAsyncOperations() async throws {
    let queue = OperationQueue()
    queue.maxConcurrentOperationCount = 2
    let running = Mutex((now: 0, peak: 0))
    let operations = (0..<20).map { _ in
      AsyncOperation<Void, Never> { operation in
        running.withLock {
          $0.now += 1
          $0.peak = max($0.peak, $0.now)
        }
        DispatchQueue.global().asyncAfter(deadline: .now() + 0.002) {
          running.withLock { $0.now -= 1 }
          operation.finish(returning: ())
        }
      }
    }
    for operation in operations { queue.addOperation(operation) }
    for operation in operations { try await operation.value }
    #expect(running.withLock { $0.peak } <= 2)
  }

  @Test func valueAwaitsAnEnqueuedOperationWithoutStartingItTwice() async throws {
    let queue = OperationQueue()
    let ran = Counter()
    let operation = AsyncOperation<Int, Never> {
      ran.increment()
      return 7
    }
    async let first = operation.value
    async let second = operation.value
    queue.addOperation(operation)
    #expect(try await first == 7)
    #expect(try await second == 7)
    #expect(ran.value == 1)
  }

  @Test func cancelAllOperationsFinishesEverything() async throws {
    let queue = OperationQueue()
    queue.maxConcurrentOperationCount = 2
    let handled = Counter()
    let callbacks = DispatchQueue(label: "test.callbacks")
    let operations = (0..<50).map { _ in
      let operation = AsyncOperation<Int, Never> { _ in }  // only cancel ends them
      operation.callbackQueue = callbacks
      operation.successHandler = { _ in handled.increment() }
      return operation
    }
    for operation in operations { queue.addOperation(operation) }
    queue.cancelAllOperations()
    #expect(await eventually { queue.operationCount == 0 })
    await drain(callbacks)
    #expect(operations.allSatisfy { $0.isFinished && $0.isCancelled })
    #expect(handled.value == 0)
  }

  /// `finish` on a queued operation before it started: nobody sees the value until the
  /// operation's dependencies have finished and the queue started it.
  @Test func aValueGivenBeforeTheStartIsDeliveredAfterTheDependencies() async throws {
    let queue = OperationQueue()
    let dependency = AsyncOperation<Int, Never> { _ in }  // finished by hand below
    let dependent = AsyncOperation<Int, Never> { operation in operation.finish(returning: 2) }
    let handled = Log<Int>()
    dependent.successHandler = { handled.append($0) }
    dependent.addDependency(dependency)
    queue.addOperation(dependency)
    queue.addOperation(dependent)

    dependent.finish(returning: 1)

    #expect(dependent.result == nil, "seen before its dependency finished")
    #expect(!dependent.isFinished)
    try await eventually("the dependency started") { dependency.isExecuting }
    dependency.finish(returning: 0)
    #expect(try await dependent.value == 1)
    #expect(dependency.isFinished)
    #expect(dependent.result == .success(1))
    try await eventually("the handler ran") { handled.all == [1] }
    #expect(await eventually { queue.operationCount == 0 })
  }

  /// `cancel()` after such an early `finish` still cancels: the operation never ran and nobody
  /// saw its value, and `Operation.cancel()` is called, so the queue does not wait for the
  /// dependency to drop it.
  @Test func cancelAfterAnEarlyFinishCancels() async throws {
    let queue = OperationQueue()
    let dependency = AsyncOperation<Int, Never> { _ in }  // never finishes on its own
    let dependent = AsyncOperation<Int, Never> { _ in Issue.record("the dependent ran") }
    dependent.successHandler = { _ in Issue.record("the success handler ran") }
    dependent.addDependency(dependency)
    queue.addOperation(dependency)
    queue.addOperation(dependent)

    dependent.finish(returning: 1)
    dependent.cancel()

    #expect(dependent.isCancelled)
    await #expect(throws: OperationError<Never>.cancelled) { try await dependent.value }
    #expect(dependent.result == nil)
    #expect(await eventually { dependent.isFinished }, "the queue dropped it while its dependency runs")
    dependency.cancel()
    #expect(await eventually { queue.operationCount == 0 })
  }

  #if canImport(Glibc)
    /// A cancelled operation is finished by its queue at once, before its dependencies, and may
    /// then be freed while they are pending. Foundation on Linux keeps it on their books,
    /// unretained, and read it when a dependency finished: the process crashed (signal 11). The
    /// operation now takes itself off their books when it is freed.
    @Test func aCancelledOperationFreedBeforeItsDependencyFinishedIsNotReadByIt() {
      #expect(
        finishDependencyAfterFreeingItsCancelledDependent {
          AsyncOperation<Int, Never> { operation in operation.finish(returning: 1) }
        })
      #expect(finishDependencyAfterFreeingItsCancelledDependent { SyncOperation<Int, Never> { 1 } })
    }
  #endif
}
