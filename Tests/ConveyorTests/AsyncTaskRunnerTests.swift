import Conveyor
import ConveyorTestSupport
import Dispatch
import Synchronization
import Testing

/// A completion-handler task that records its start and end and completes later on another queue.
private func recordedTask(
  _ index: Int,
  delay: Int,
  recorder: Log<String>,
  failing: Bool = false
) -> AnyAsyncTask<Int, PipeTestError> {
  AnyAsyncTask(execute: { done in
    recorder.append("start \(index)")
    DispatchQueue(label: "task.\(index)").asyncAfter(deadline: .now() + .milliseconds(delay)) {
      recorder.append("end \(index)")
      done(failing ? .failure(.boom(index)) : .success(index))
    }
  })
}

/// Tracks how many tasks run at once.
private final class InFlight: Sendable {
  private let state = Mutex((now: 0, peak: 0))

  func enter() {
    state.withLock {
      $0.now += 1
      $0.peak = max($0.peak, $0.now)
    }
  }

  func leave() {
    state.withLock { $0.now -= 1 }
  }

  var peak: Int {
    state.withLock { $0.peak }
  }
}

@Suite("AsyncTaskRunner")
struct AsyncTaskRunnerTests {
  @Test(.timeLimit(.minutes(10)))
  func sequentialRunStartsEachTaskOnlyAfterThePreviousCompleted() async throws {
    let recorder = Log<String>()
    // Later tasks are quicker: had they started together, they would end first.
    let count = 12
    let tasks = (0..<count).map { recordedTask($0, delay: (count - $0) * 2, recorder: recorder) }
    let runner = AsyncTaskRunner<Int, PipeTestError>(tasks)
    #expect(try await runner.run() == Array(0..<count))
    #expect(recorder.all == (0..<count).flatMap { ["start \($0)", "end \($0)"] })
  }

  @Test(.timeLimit(.minutes(10)))
  func sequentialCompletionFiresOnceOnTheChosenQueue() async throws {
    let key = DispatchSpecificKey<String>()
    let queue = DispatchQueue(label: "runner.callback")
    queue.setSpecific(key: key, value: "callback")
    let recorder = Log<String>()
    let tasks = (0..<5).map { recordedTask($0, delay: 3, recorder: recorder) }
    let runner = AsyncTaskRunner<Int, PipeTestError>(tasks, callbackQueue: queue)
    let onQueue = Counter()
    let (result, calls) = await pipeAwaitCompletion {
      (done: @escaping @Sendable (Result<[Int], any Error>) -> Void) in
      runner.execute { result in
        if DispatchQueue.getSpecific(key: key) == "callback" { onQueue.increment() }
        done(result)
      }
    }
    #expect(try result.get() == [0, 1, 2, 3, 4])
    #expect(calls == 1)
    #expect(onQueue.value == 1)
    #expect(recorder.all == (0..<5).flatMap { ["start \($0)", "end \($0)"] })
  }

  @Test(.timeLimit(.minutes(10)))
  func sequentialFirstErrorStopsAndLaterTasksNeverStart() async throws {
    let recorder = Log<String>()
    let tasks = (0..<6).map { recordedTask($0, delay: 1, recorder: recorder, failing: $0 == 2) }
    let runner = AsyncTaskRunner<Int, PipeTestError>(tasks)
    let (result, calls) = await pipeAwaitCompletion {
      (done: @escaping @Sendable (Result<[Int], any Error>) -> Void) in
      runner.execute(completion: done)
    }
    #expect(throws: PipeTestError.boom(2)) { try result.get() }
    #expect(calls == 1)
    #expect(recorder.all == ["start 0", "end 0", "start 1", "end 1", "start 2", "end 2"])
  }

  @Test(.timeLimit(.minutes(10)))
  func cancellingInTheMiddleStopsTheRunAndOnlyThatRun() async throws {
    let recorder = Log<String>()
    let thirdStarted = Gate()
    // Both runs hold at the third task until the cancel is made, so the cancelled run cannot
    // finish first on a slow machine.
    let cancelled = Gate()
    let tasks = (0..<10).map { index in
      AnyAsyncTask<Int, any Error> {
        recorder.append("start \(index)")
        if index == 2 {
          thirdStarted.open()
          await cancelled.wait()
        }
        try await Task.sleep(for: .milliseconds(10))
        return index
      }
    }
    let runner = AsyncTaskRunner<Int, any Error>(tasks)
    let other = Task { try await runner.run() }  // same runner, a second independent run
    let (result, calls) = await pipeAwaitCompletion {
      (done: @escaping @Sendable (Result<[Int], any Error>) -> Void) in
      let handle = runner.execute(completion: done)
      Task {
        await thirdStarted.wait()
        handle.cancel()
        cancelled.open()
      }
    }
    #expect(throws: CancellationError.self) { try result.get() }
    #expect(calls == 1)
    #expect(try await other.value == Array(0..<10))
  }

  @Test(.timeLimit(.minutes(10)), arguments: [1, 3, 8])
  func concurrentRunRespectsTheWidthAndKeepsInputOrder(width: Int) async throws {
    let inFlight = InFlight()
    let tasks = (0..<40).map { index in
      AnyAsyncTask<Int, Never>(execute: { done in
        inFlight.enter()
        DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(Int.random(in: 1...6))) {
          inFlight.leave()
          done(.success(index * index))
        }
      })
    }
    let runner = AsyncTaskRunner<Int, Never>(tasks, mode: .concurrent(width: width))
    #expect(try await runner.run() == (0..<40).map { $0 * $0 })
    #expect(inFlight.peak <= width)
    #expect(inFlight.peak >= 1)
  }

  @Test(.timeLimit(.minutes(10)))
  func concurrentRunWithSeveralFailuresCompletesOnceAndStartsNothingMore() async throws {
    for _ in 0..<50 {
      let started = Log<String>()
      let width = 5
      // The first `width` tasks all fail at about the same moment; the rest must never start.
      let tasks = (0..<20).map { index in
        AnyAsyncTask<Int, any Error> {
          started.append("\(index)")
          if index < width {
            await Task.yield()
            throw PipeTestError.boom(index)
          }
          return index
        }
      }
      let runner = AsyncTaskRunner<Int, any Error>(tasks, mode: .concurrent(width: width))
      let (result, calls) = await pipeAwaitCompletion(grace: .milliseconds(5)) {
        (done: @escaping @Sendable (Result<[Int], any Error>) -> Void) in
        runner.execute(completion: done)
      }
      #expect(calls == 1)
      let error = try #require(result.failure as? PipeTestError)
      #expect((0..<width).map { PipeTestError.boom($0) }.contains(error))
      #expect(started.all.allSatisfy { Int($0)! < width })
    }
  }

  @Test(.timeLimit(.minutes(10)))
  func concurrentFailureCancelsTheRunningTasks() async throws {
    let recorder = Log<String>()
    let sleeperStarted = Gate()
    let tasks: [any AsyncTask<Int, any Error>] = [
      AnyAsyncTask {
        await sleeperStarted.wait()
        throw PipeTestError.boom(0)
      },
      AnyAsyncTask {
        sleeperStarted.open()
        do {
          try await Task.sleep(for: .seconds(30))
        } catch {
          recorder.append(error is CancellationError ? "cancelled" : "other")
          throw error
        }
        return 1
      },
      AnyAsyncTask {
        recorder.append("third started")
        return 2
      },
    ]
    let runner = AsyncTaskRunner(tasks, mode: .concurrent(width: 2))
    await #expect(throws: PipeTestError.boom(0)) { try await runner.run() }
    #expect(recorder.all == ["cancelled"])
  }

  /// A conforming type of its own, run through both its `run()` and its `execute`.
  struct Doubler: AsyncTask {
    var input: Int
    func execute(completion: @escaping @Sendable (Result<Int, Never>) -> Void) {
      completion(.success(input * 2))
    }
  }

  @Test func tasksOfAnyTypeRunAndAreReturnedAsGiven() async throws {
    var runner = AsyncTaskRunner<Int, Never>([Doubler(input: 1), AnyAsyncTask { 7 }])
    runner.tasks.append(Doubler(input: 5))
    #expect(try await runner.run() == [2, 7, 10])
    #expect(runner.tasks.map { ($0 as? Doubler)?.input } == [1, nil, 5])
    #expect(runner.tasks[1] is AnyAsyncTask<Int, Never>)
    runner.mode = .concurrent(width: 2)
    #expect(try await runner.run() == [2, 7, 10])
    let values = try await withCheckedThrowingContinuation { continuation in
      runner.execute { continuation.resume(with: $0) }
    }
    #expect(values == [2, 7, 10])
  }

  /// Closures that cannot throw are kept as written (awaited without a thunk); mixed with
  /// throwing ones and callback tasks they still run in order, and the first error stops the run.
  @Test func nonThrowingAndThrowingClosuresRunInOrderAndTheFirstErrorStops() async throws {
    let log = Log<Int>()
    let plain = AnyAsyncTask<Int, PipeTestError> {
      log.append(1)
      return 1
    }
    let throwing = AnyAsyncTask<Int, PipeTestError> { () async throws(PipeTestError) -> Int in
      log.append(2)
      return 2
    }
    let failing = AnyAsyncTask<Int, PipeTestError> { () async throws(PipeTestError) -> Int in
      log.append(3)
      throw .boom(3)
    }
    let never = AnyAsyncTask<Int, PipeTestError> {
      log.append(4)
      return 4
    }
    #expect(try await plain.run() == 1)
    #expect(try await AsyncTaskRunner([plain, throwing, plain]).run() == [1, 2, 1])
    await #expect(throws: PipeTestError.boom(3)) {
      try await AsyncTaskRunner([plain, failing, never]).run()
    }
    #expect(log.all == [1, 1, 2, 1, 1, 3])
    let neverFails = AnyAsyncTask<Int, Never> { 6 * 7 }
    #expect(await neverFails.run() == 42)
  }
}

extension Result {
  fileprivate var failure: Failure? {
    if case .failure(let error) = self { return error }
    return nil
  }
}
