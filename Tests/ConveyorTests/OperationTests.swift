import ConveyorTestSupport
import Dispatch
import Foundation
import Synchronization
import Testing

@testable import Conveyor

@Suite("AsyncOperation", .timeLimit(.minutes(10)))
struct AsyncOperationTests {
  @Test func asyncClosureReturnsValue() async throws {
    let operation = AsyncOperation<Int, TestError> { () async throws(TestError) -> Int in 42 }
    #expect(operation.isAsynchronous)
    #expect(try await operation.run() == 42)
    #expect(operation.isFinished)
    #expect(!operation.isExecuting)
    #expect(try operation.result?.get() == 42)
  }

  @Test func asyncClosureThrowsTypedFailure() async {
    let operation = AsyncOperation<Int, TestError> { () async throws(TestError) -> Int in
      throw TestError(code: 7)
    }
    await #expect(throws: OperationError.failed(TestError(code: 7))) { try await operation.run() }
    #expect(operation.result.map { if case .failure(let error) = $0 { error.code } else { 0 } } == 7)
  }

  /// The outcome is kept type-erased inside the operation; values that are optionals, existentials
  /// or errors that are existentials come back as they went in.
  @Test func optionalAndExistentialValuesAndErrorsComeBackAsGiven() async throws {
    let none = AsyncOperation<Int?, Never> { $0.finish(returning: nil) }
    let callbacks = DispatchQueue(label: "test.callbacks")
    none.callbackQueue = callbacks
    let handled = Mutex<[Int?]>([])
    none.successHandler = { value in handled.withLock { $0.append(value) } }
    #expect(try await none.run() == nil)
    #expect(none.result.map { if case .success(let value) = $0 { value == nil } else { false } } == true)
    await drain(callbacks)
    #expect(handled.withLock { $0 } == [nil])

    let nested = AsyncOperation<Int??, Never> { $0.finish(returning: .some(nil)) }
    let nestedValue = try await nested.run()
    #expect(nestedValue == .some(nil))

    let existential = AsyncOperation<any Sendable, any Error> { operation in
      operation.finish(returning: 5 as any Sendable)
    }
    #expect(try await existential.run() as? Int == 5)

    let anyError = AsyncOperation<Int, any Error> { $0.finish(throwing: TestError(code: 9)) }
    do {
      _ = try await anyError.run()
      Issue.record("did not fail")
    } catch .failed(let error) {
      #expect(error as? TestError == TestError(code: 9))
    } catch {
      Issue.record("cancelled")
    }
    let handler = anyError.failureHandler
    #expect(handler == nil)
  }

  @Test func handlerFormFinishesFromAnotherQueue() async throws {
    let callbacks = DispatchQueue(label: "test.callbacks")
    let operation = AsyncOperation<String, Never> { operation in
      DispatchQueue.global().asyncAfter(deadline: .now() + 0.01) {
        operation.finish(returning: "done")
      }
    }
    operation.callbackQueue = callbacks
    try await confirmation { handled in
      operation.successHandler = { value in
        dispatchPrecondition(condition: .onQueue(callbacks))
        #expect(value == "done")
        handled()
      }
      let value = try await operation.run()
      #expect(value == "done")
      await drain(callbacks)
    }
  }

  @Test func failureHandlerRunsOnceWithTheError() async {
    let callbacks = DispatchQueue(label: "test.callbacks")
    let operation = AsyncOperation<Int, TestError> { $0.finish(throwing: TestError(code: 3)) }
    operation.callbackQueue = callbacks
    await confirmation { failed in
      operation.failureHandler = { error in
        #expect(error == TestError(code: 3))
        failed()
      }
      operation.successHandler = { _ in Issue.record("success handler ran") }
      await #expect(throws: OperationError.failed(TestError(code: 3))) { try await operation.run() }
      await drain(callbacks)
    }
  }

  @Test func secondFinishIsIgnored() async throws {
    let callbacks = DispatchQueue(label: "test.callbacks")
    let operation = AsyncOperation<Int, TestError> { operation in
      operation.finish(returning: 1)
      operation.finish(returning: 2)
      operation.finish(throwing: TestError(code: 1))
      operation.cancel()
    }
    operation.callbackQueue = callbacks
    try await confirmation(expectedCount: 1) { handled in
      operation.successHandler = { _ in handled() }
      operation.failureHandler = { _ in Issue.record("failure handler ran") }
      let value = try await operation.run()
      #expect(value == 1)
      await drain(callbacks)
    }
    #expect(try operation.result?.get() == 1)
    #expect(!operation.isCancelled)
  }

  @Test func cancelBeforeStartNeverRunsMain() async {
    let ran = Counter()
    let operation = AsyncOperation<Int, Never> { operation in
      ran.increment()
      operation.finish(returning: 1)
    }
    operation.successHandler = { _ in Issue.record("success handler ran") }
    operation.cancel()
    #expect(operation.isCancelled)
    #expect(!operation.isFinished)  // an OperationQueue finishes it by calling start()
    await #expect(throws: OperationError<Never>.cancelled) { try await operation.value }
    operation.start()
    #expect(operation.isFinished)
    #expect(ran.value == 0)
    #expect(operation.result == nil)
  }

  @Test func cancelDuringWorkFinishesPromptlyAndCancelsTheTask() async throws {
    let (started, startedContinuation) = AsyncStream.makeStream(of: Void.self)
    let (ended, endedContinuation) = AsyncStream.makeStream(of: Bool.self)
    let operation = AsyncOperation<Int, Never> {
      startedContinuation.yield()
      try? await Task.sleep(for: .seconds(30))
      endedContinuation.yield(Task.isCancelled)
      return 1
    }
    operation.successHandler = { _ in Issue.record("success handler ran") }
    operation.start()
    #expect(operation.isExecuting)
    for await _ in started { break }
    operation.cancel()
    #expect(operation.isFinished)
    #expect(!operation.isExecuting)
    var sawCancellation = false
    for await cancelled in ended {
      sawCancellation = cancelled
      break
    }
    #expect(sawCancellation)
    await #expect(throws: OperationError<Never>.cancelled) { try await operation.value }
  }

  @Test func handlerWorkCanObserveIsCancelled() async {
    let observed = Counter()
    let operation = AsyncOperation<Int, Never> { operation in
      Thread {
        while !operation.isCancelled { usleep(100) }
        observed.increment()
        operation.finish(returning: 1)  // ignored: already cancelled
      }.start()
    }
    operation.start()
    operation.cancel()
    #expect(operation.isFinished)
    #expect(await eventually { observed.value == 1 })
    #expect(operation.result == nil)
  }

  @Test func valueDoesNotStartAStandaloneOperation() async throws {
    let operation = AsyncOperation<Int, Never> { 5 }
    let waiter = Task { try await operation.value }
    try await Task.sleep(for: .milliseconds(50))
    #expect(!operation.isExecuting && !operation.isFinished)
    #expect(try await operation.run() == 5)
    #expect(try await waiter.value == 5)
  }

  @Test func startingTwiceRunsMainOnce() async throws {
    let ran = Counter()
    let operation = AsyncOperation<Int, Never> { operation in
      ran.increment()
      operation.finish(returning: 1)
    }
    operation.start()
    operation.start()
    #expect(try await operation.run() == 1)
    #expect(ran.value == 1)
  }

  @Test func cancellingTheRunningTaskCancelsTheOperation() async {
    let operation = AsyncOperation<Int, Never> {
      try? await Task.sleep(for: .seconds(30))
      return 1
    }
    let runner = Task { try await operation.run() }
    #expect(await eventually { operation.isExecuting })
    runner.cancel()
    await #expect(throws: OperationError<Never>.cancelled) { try await runner.value }
    #expect(operation.isCancelled && operation.isFinished)
  }

  @Test func subclassOverridingMain() async throws {
    final class Doubler: AsyncOperation<Int, TestError>, @unchecked Sendable {
      let input: Int
      init(_ input: Int) {
        self.input = input
        super.init()
      }
      override func main() {
        DispatchQueue.global().async { [self] in
          if input < 0 { finish(throwing: TestError(code: input)) } else { finish(returning: input * 2) }
        }
      }
    }
    #expect(try await Doubler(21).run() == 42)
    await #expect(throws: OperationError.failed(TestError(code: -1))) { try await Doubler(-1).run() }
  }

  @Test func subclassWithNeverFailureOverridingMain() async throws {
    final class Tick: AsyncOperation<Int, Never>, @unchecked Sendable {
      override func main() {
        DispatchQueue.global().async { self.finish(returning: 1) }
      }
    }
    let tick = Tick()
    #expect(tick.isAsynchronous)
    #expect(try await tick.run() == 1)
    #expect(tick.isFinished && !tick.isExecuting)
    #expect(tick.result == .success(1))
  }

  @Test func finishedWhenDecidedNotWhenMainReturns() async throws {
    let operation = AsyncOperation<Int, Never> { _ in }
    operation.start()
    #expect(operation.isExecuting && !operation.isFinished)  // main() returned, still running
    operation.finish(returning: 3)
    #expect(operation.isFinished && !operation.isExecuting)
    #expect(try await operation.value == 3)
  }

  @Test func completionBlockRunsAfterFinish() async {
    let operation = AsyncOperation<Int, Never> { $0.finish(returning: 1) }
    await confirmation { completed in
      let (done, continuation) = AsyncStream.makeStream(of: Void.self)
      operation.completionBlock = {
        completed()
        continuation.finish()
      }
      _ = try? await operation.run()
      for await _ in done {}
    }
  }
}

@Suite("SyncOperation", .timeLimit(.minutes(10)))
struct SyncOperationTests {
  @Test func closureReturnsValue() async throws {
    let operation = SyncOperation<Int, Never> { 6 * 7 }
    #expect(!operation.isAsynchronous)
    #expect(try await operation.run() == 42)
    #expect(operation.isFinished)
  }

  @Test func closureThrowsTypedFailureAndCallsFailureHandler() async {
    let callbacks = DispatchQueue(label: "test.callbacks")
    let operation = SyncOperation<Int, TestError> { () throws(TestError) -> Int in
      throw TestError(code: 9)
    }
    operation.callbackQueue = callbacks
    await confirmation { failed in
      operation.failureHandler = { error in
        #expect(error.code == 9)
        failed()
      }
      await #expect(throws: OperationError.failed(TestError(code: 9))) { try await operation.run() }
      await drain(callbacks)
    }
  }

  @Test func subclassOverridingExecute() async throws {
    final class Sum: SyncOperation<Int, Never>, @unchecked Sendable {
      override func execute() -> Int { (1...10).reduce(0, +) }
    }
    #expect(try await Sum().run() == 55)
  }

  @Test func cancelBeforeStartNeverExecutes() async {
    let ran = Counter()
    let operation = SyncOperation<Int, Never> {
      ran.increment()
      return 1
    }
    operation.cancel()
    await #expect(throws: OperationError<Never>.cancelled) { try await operation.run() }
    #expect(operation.isFinished)
    #expect(ran.value == 0)
  }

  @Test func cancelDuringExecuteFinishesWhenExecuteReturns() async {
    let release = Mutex(false)
    let operationBox = Mutex<SyncOperation<Int, Never>?>(nil)
    let sawCancel = Counter()
    let operation = SyncOperation<Int, Never> {
      while operationBox.withLock({ $0?.isCancelled }) != true { usleep(100) }
      sawCancel.increment()
      while !release.withLock({ $0 }) { usleep(100) }
      return 1
    }
    operationBox.withLock { $0 = operation }
    Thread { operation.start() }.start()
    #expect(await eventually { operation.isExecuting })
    operation.cancel()
    await #expect(throws: OperationError<Never>.cancelled) { try await operation.value }
    #expect(await eventually { sawCancel.value == 1 })
    #expect(operation.isExecuting && !operation.isFinished)  // execute() has not returned yet
    release.withLock { $0 = true }
    #expect(await eventually { operation.isFinished })
    #expect(!operation.isExecuting)
    #expect(operation.result == nil)
  }

  @Test func cancelDuringExecuteDiscardsTheValue() async {
    let callbacks = DispatchQueue(label: "test.callbacks")
    let operationBox = Mutex<SyncOperation<Int, Never>?>(nil)
    let operation = SyncOperation<Int, Never> {
      while operationBox.withLock({ $0?.isCancelled }) != true { usleep(100) }
      return 1
    }
    operationBox.withLock { $0 = operation }
    operation.callbackQueue = callbacks
    operation.successHandler = { _ in Issue.record("success handler ran") }
    Thread { operation.start() }.start()
    #expect(await eventually { operation.isExecuting })
    operation.cancel()
    await #expect(throws: OperationError<Never>.cancelled) { try await operation.value }
    #expect(await eventually { operation.isFinished })
    await drain(callbacks)
    #expect(operation.result == nil)
  }
}

@Suite("OperationError")
struct OperationErrorTests {
  @Test func describesCancellationAndFailure() {
    #expect(OperationError<TestError>.cancelled.description == "cancelled")
    #expect(
      OperationError.failed(TestError(code: 4)).description == "failed: \(TestError(code: 4))")
    #expect(String(describing: OperationError.failed(TestError(code: 4))) == "failed: TestError(code: 4)")
    #expect("\(OperationError<Never>.cancelled)" == "cancelled")
  }
}
