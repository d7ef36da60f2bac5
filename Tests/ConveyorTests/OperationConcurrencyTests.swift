import ConveyorTestSupport
import Dispatch
import Foundation
import Synchronization
import Testing

@testable import Conveyor

/// Races `start()`, `finish(…)` and `cancel()` from many threads and checks that each operation
/// completes exactly once.
// Five minutes: the two races of a finish given before the start run 30 rounds of 50,000
// operations when nothing is wrong, which takes half a minute alone and more in a full run.
@Suite("Operation races", .timeLimit(.minutes(10)))
struct OperationConcurrencyTests {
  @Test func manyConcurrentFinishesCallTheHandlerOnce() async throws {
    let callbacks = DispatchQueue(label: "test.callbacks")
    let handled = Counter()
    let operation = AsyncOperation<Int, Never> { _ in }
    operation.callbackQueue = callbacks
    operation.successHandler = { _ in handled.increment() }
    await concurrentlyPerform(iterations: 1000) { index in
      if index.isMultiple(of: 10) { operation.start() }
      operation.finish(returning: index)
    }
    await drain(callbacks)
    #expect(handled.value == 1)
    #expect(operation.isFinished && !operation.isExecuting)
    #expect(operation.result != nil)
  }

  @Test func startFinishAndCancelRaceOnThousandOperations() async {
    let callbacks = DispatchQueue(label: "test.callbacks")
    let handled = Counter()
    let count = 1000
    let operations = (0..<count).map { _ in
      let operation = AsyncOperation<Int, TestError> { _ in }
      operation.callbackQueue = callbacks
      operation.successHandler = { _ in handled.increment() }
      operation.failureHandler = { _ in handled.increment() }
      return operation
    }
    await concurrentlyPerform(iterations: count * 4) { index in
      let operation = operations[index / 4]
      switch index % 4 {
      case 0: operation.start()
      case 1: operation.finish(returning: index)
      case 2: operation.finish(throwing: TestError(code: index))
      default: if index.isMultiple(of: 8) { operation.cancel() }
      }
    }
    for operation in operations { operation.start() }  // harmless if already started
    await drain(callbacks)
    let completed = operations.filter { $0.result != nil }.count
    let cancelled = operations.filter { $0.isCancelled }.count
    #expect(completed + cancelled == count)
    #expect(handled.value == completed)
    #expect(operations.allSatisfy { $0.isFinished && !$0.isExecuting })
    #expect(operations.allSatisfy { !($0.isCancelled && $0.result != nil) })
  }

  @Test func syncOperationsRacingStartAndCancel() async {
    let callbacks = DispatchQueue(label: "test.callbacks")
    let handled = Counter()
    let executed = Counter()
    let count = 1000
    let operations = (0..<count).map { _ in
      let operation = SyncOperation<Int, Never> {
        executed.increment()
        return 1
      }
      operation.callbackQueue = callbacks
      operation.successHandler = { _ in handled.increment() }
      return operation
    }
    await concurrentlyPerform(iterations: count * 3) { index in
      let operation = operations[index / 3]
      if index % 3 == 2 { operation.cancel() } else { operation.start() }
    }
    await drain(callbacks)
    let succeeded = operations.filter { $0.result != nil }.count
    #expect(executed.value <= count)
    #expect(handled.value == succeeded)
    #expect(operations.allSatisfy { $0.isFinished })
    #expect(operations.allSatisfy { $0.isCancelled != ($0.result != nil) })
  }

  @Test func raceOnAnOperationQueue() async throws {
    let queue = OperationQueue()
    queue.maxConcurrentOperationCount = 8
    let callbacks = DispatchQueue(label: "test.callbacks")
    let handled = Counter()
    let operations = (0..<1000).map { index in
      let operation = AsyncOperation<Int, Never> { operation in
        DispatchQueue.global().async { operation.finish(returning: index) }
      }
      operation.callbackQueue = callbacks
      operation.successHandler = { _ in handled.increment() }
      return operation
    }
    for (previous, next) in zip(operations, operations.dropFirst()) where next.hashValue % 3 == 0 {
      next.addDependency(previous)
    }
    for operation in operations { queue.addOperation(operation) }
    await concurrentlyPerform(iterations: 1000) { index in
      if index.isMultiple(of: 7) { operations[index].cancel() }
    }
    for operation in operations { _ = try? await operation.value }
    #expect(await eventually { queue.operationCount == 0 })
    let succeeded = operations.filter { $0.result != nil }.count
    // `value` can return (on another thread) just before the handler is dispatched.
    #expect(await eventually { handled.value == succeeded })
    await drain(callbacks)
    #expect(handled.value == succeeded)
    #expect(operations.allSatisfy { $0.isFinished })
    #expect(operations.allSatisfy { $0.isCancelled != ($0.result != nil) })
  }

  /// `finish` on an operation not started yet, racing `cancel()`: the documented rule is that a
  /// value given before the start is held until the start, and that `cancel()` until then still
  /// cancels it. So once both calls returned, and before anyone started the operation, it must be
  /// cancelled, whichever call came first; its start then delivers nothing.
  @Test func cancelRacingAFinishBeforeTheStartStillCancels() async {
    let notCancelled = Atomic<Int>(0)
    var rounds = 0
    while rounds < 30 && notCancelled.load(ordering: .relaxed) == 0 {
      rounds += 1
      // A round of synchronous work on a Dispatch thread (see `onADispatchThread`).
      let missed = await onADispatchThread {
        let count = 50_000
        let operations = (0..<count).map { _ in AsyncOperation<Int, Never> { _ in } }
        DispatchQueue.concurrentPerform(iterations: count * 2) { index in
          let operation = operations[index / 2]
          if index.isMultiple(of: 2) { operation.finish(returning: index) } else { operation.cancel() }
        }
        var missed = 0
        for operation in operations {
          operation.start()
          if !operation.isCancelled || operation.result != nil { missed += 1 }
        }
        return missed
      }
      notCancelled.add(missed, ordering: .relaxed)
    }
    #expect(
      notCancelled.load(ordering: .relaxed) == 0,
      "cancel() returned before the start and the operation still delivered its value (round \(rounds))")
  }

  /// `finish` on an operation not started yet, racing its `start()`: once `isFinished` is true
  /// the outcome must be there (dependents start on `isFinished` and read `result`).
  @Test func finishRacingTheStartIsNeverFinishedWithoutItsOutcome() async {
    let finishedEmpty = Atomic<Int>(0)
    var rounds = 0
    while rounds < 30 && finishedEmpty.load(ordering: .relaxed) == 0 {
      rounds += 1
      // A round of synchronous work on a Dispatch thread (see `onADispatchThread`).
      await onADispatchThread {
        let count = 50_000
        let operations = (0..<count).map { _ in AsyncOperation<Int, Never> { _ in } }
        DispatchQueue.concurrentPerform(iterations: count * 2) { index in
          let operation = operations[index / 2]
          if index.isMultiple(of: 2) {
            operation.finish(returning: index)
          } else {
            operation.start()
            // Read in this order: an operation whose outcome is recorded before `isFinished` is
            // published can never be seen finished with no result.
            if operation.isFinished && operation.result == nil && !operation.isCancelled {
              finishedEmpty.add(1, ordering: .relaxed)
            }
          }
        }
      }
    }
    #expect(
      finishedEmpty.load(ordering: .relaxed) == 0,
      "isFinished was true while result was nil and the operation not cancelled (round \(rounds))")
  }
}
