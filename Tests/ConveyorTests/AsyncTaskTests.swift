import Conveyor
import ConveyorTestSupport
import Dispatch
import Testing

/// A conformer that implements only the completion-handler requirement.
private struct DelayedDouble: AsyncTask {
  var input: Int

  func execute(completion: @escaping @Sendable (Result<Int, PipeTestError>) -> Void) {
    let input = input
    DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(2)) {
      if input < 0 {
        completion(.failure(.boom(input)))
      } else {
        completion(.success(input * 2))
      }
    }
  }
}

@Suite("AsyncTask")
struct AsyncTaskTests {
  @Test func asyncClosureTaskRunsAndExecutes() async throws {
    let task = AnyAsyncTask<Int, Never> { 6 * 7 }
    #expect(await task.run() == 42)
    let (result, calls) = await pipeAwaitCompletion {
      (done: @escaping @Sendable (Result<Int, any Error>) -> Void) in
      task.execute { result in done(.success(result.get())) }
    }
    #expect(try result.get() == 42)
    #expect(calls == 1)
  }

  @Test func typedFailureIsThrownAsItsOwnType() async throws {
    let task = AnyAsyncTask<Int, PipeTestError> { () throws(PipeTestError) -> Int in throw .boom(1) }
    do {
      _ = try await task.run()
      Issue.record("expected a failure")
    } catch {
      #expect(error == .boom(1))  // `error` is a PipeTestError: typed throws
    }
  }

  @Test func callbackTaskCompletingTwiceIsHonouredOnce() async throws {
    let task = AnyAsyncTask<Int, Never>(execute: { done in
      DispatchQueue.global().async {
        done(.success(1))
        done(.success(2))
      }
    })
    #expect(await task.run() == 1)
    let (result, calls) = await pipeAwaitCompletion {
      (done: @escaping @Sendable (Result<Int, any Error>) -> Void) in
      task.execute { result in done(.success(result.get())) }
    }
    #expect(try result.get() == 1)
    #expect(calls == 1)
  }

  @Test func conformerGetsTheDefaultAsyncRun() async throws {
    #expect(try await DelayedDouble(input: 21).run() == 42)
    await #expect(throws: PipeTestError.boom(-1)) { try await DelayedDouble(input: -1).run() }
    #expect(try await AnyAsyncTask(DelayedDouble(input: 4)).run() == 8)
  }

  @Test func asyncClosureTaskSeesCancellationOfTheAwaitingTask() async throws {
    let started = Gate()
    let task = AnyAsyncTask<Bool, any Error> {
      started.open()
      try await Task.sleep(for: .seconds(30))
      return true
    }
    let run = Task { try await task.run() }
    await started.wait()
    run.cancel()
    await #expect(throws: CancellationError.self) { try await run.value }
  }
}
