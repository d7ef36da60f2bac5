import Conveyor
import ConveyorTestSupport
import Dispatch
import Synchronization
import Testing

/// An error the pipeline tests throw on purpose.
enum PipeTestError: Error, Equatable {
  case boom(Int)
}

/// Awaits a completion-handler call, counting how many times it fires (after a grace period).
func pipeAwaitCompletion<Value: Sendable>(
  grace: Duration = .milliseconds(50),
  _ start: (@escaping @Sendable (Result<Value, any Error>) -> Void) -> Void
) async -> (result: Result<Value, any Error>, calls: Int) {
  let calls = Counter()
  let result = await withCheckedContinuation {
    (continuation: CheckedContinuation<Result<Value, any Error>, Never>) in
    start { result in
      if calls.increment() == 1 { continuation.resume(returning: result) }
    }
  }
  try? await Task.sleep(for: grace)
  return (result, calls.value)
}

@Suite("Pipeline")
struct PipelineTests {
  @Test func eachStepReceivesThePreviousValue() async throws {
    let pipeline = Pipeline(defaultValue: [Int]())
      .then { $0 + [1] }
      .then { $0 + [$0.count + 1] }
      .then { values in
        await Task.yield()
        return values + [values.reduce(0, +)]
      }
    #expect(try await pipeline.run() == [1, 2, 3])
    #expect(try await pipeline.run(from: [10]) == [10, 1, 3, 14])
  }

  @Test func emptyPipelineReturnsItsStartingValue() async throws {
    #expect(try await Pipeline(defaultValue: 7).run() == 7)
    #expect(try await Pipeline(defaultValue: 7).run(from: 8) == 8)
  }

  @Test func firstErrorStopsTheRunAndLaterStepsNeverStart() async throws {
    let recorder = Log<String>()
    let pipeline = Pipeline(defaultValue: 0)
      .then {
        recorder.append("a")
        return $0 + 1
      }
      .then { _ in
        recorder.append("b")
        throw PipeTestError.boom(2)
      }
      .then {
        recorder.append("c")
        return $0
      }
    await #expect(throws: PipeTestError.boom(2)) { try await pipeline.run() }
    #expect(recorder.all == ["a", "b"])
  }

  @Test func executeOperationsReportsTheFinalValueOnceOnTheCallbackQueue() async throws {
    let key = DispatchSpecificKey<String>()
    let queue = DispatchQueue(label: "pipeline.callback")
    queue.setSpecific(key: key, value: "callback")
    let onQueue = Counter()
    let pipeline = Pipeline(defaultValue: 2, callbackQueue: queue)
    let (result, calls) = await pipeAwaitCompletion {
      (done: @escaping @Sendable (Result<Int, any Error>) -> Void) in
      pipeline.executeOperations([
        { $0 * 3 },
        Pipeline.step { value, finish in
          DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(5)) {
            finish(.success(value + 1))
          }
        },
      ]) { result in
        if DispatchQueue.getSpecific(key: key) == "callback" { onQueue.increment() }
        done(result)
      }
    }
    #expect(try result.get() == 7)
    #expect(calls == 1)
    #expect(onQueue.value == 1)
  }

  @Test func executeOperationsReportsTheError() async throws {
    let pipeline = Pipeline(defaultValue: 1)
    let (result, calls) = await pipeAwaitCompletion {
      (done: @escaping @Sendable (Result<Int, any Error>) -> Void) in
      pipeline.executeOperations([{ $0 }, { _ in throw PipeTestError.boom(1) }, { $0 }], completion: done)
    }
    #expect(throws: PipeTestError.boom(1)) { try result.get() }
    #expect(calls == 1)
  }

  @Test func callbackStepCompletingTwiceIsHonouredOnce() async throws {
    let pipeline = Pipeline(defaultValue: 1).then(
      Pipeline.step { value, finish in
        finish(.success(value + 1))
        finish(.success(value + 100))
      })
    #expect(try await pipeline.run() == 2)
  }

  @Test(.timeLimit(.minutes(10)))
  func manyConcurrentRunsOfTheSamePipelineAreIndependent() async throws {
    let pipeline = Pipeline(defaultValue: 0)
      .then { value in
        await Task.yield()
        return value + 1
      }
      .then(
        Pipeline.step { value, finish in
          DispatchQueue.global().async { finish(.success(value * 2)) }
        }
      )
      .then { value in
        if value % 14 == 0 { throw PipeTestError.boom(value) }
        return value
      }
    let runs = 500
    let outcomes = await withTaskGroup(of: (Int, Result<Int, any Error>).self) { group in
      for start in 0..<runs {
        group.addTask {
          do {
            return (start, .success(try await pipeline.run(from: start)))
          } catch {
            return (start, .failure(error))
          }
        }
      }
      var outcomes: [Int: Result<Int, any Error>] = [:]
      for await (start, outcome) in group { outcomes[start] = outcome }
      return outcomes
    }
    #expect(outcomes.count == runs)
    for (start, outcome) in outcomes {
      let expected = (start + 1) * 2
      if expected % 14 == 0 {
        #expect(throws: PipeTestError.boom(expected)) { try outcome.get() }
      } else {
        #expect(try outcome.get() == expected)
      }
    }
  }

  @Test(.timeLimit(.minutes(10)))
  func cancellingOneRunLeavesConcurrentRunsOfTheSamePipelineAlone() async throws {
    let pipeline = Pipeline(defaultValue: 0)
      .then { value in
        // The runs to be cancelled wait until they are, however slowly the test thread gets to
        // them; the others finish soon.
        try await Task.sleep(for: value.isMultiple(of: 2) ? .seconds(30) : .milliseconds(20))
        return value + 1
      }
      .then { $0 * 10 }
    let results = Log<String>()
    let finished = Counter()
    let allDone = Gate()
    let runs = 100
    var handles: [RunHandle] = []
    for start in 0..<runs {
      handles.append(
        pipeline.execute(from: start) { result in
          switch result {
          case .success(let value): results.append("\(start)=\(value)")
          case .failure(let error): results.append("\(start)!\(error is CancellationError)")
          }
          if finished.increment() == runs { allDone.open() }
        })
    }
    for (index, handle) in handles.enumerated() where index.isMultiple(of: 2) { handle.cancel() }
    await allDone.wait()
    try await Task.sleep(for: .milliseconds(50))
    #expect(finished.value == runs)
    let expected = (0..<runs).map { $0.isMultiple(of: 2) ? "\($0)!true" : "\($0)=\(($0 + 1) * 10)" }
    #expect(results.all.sorted() == expected.sorted())
  }

  @Test(.timeLimit(.minutes(10)))
  func cancellingTheAwaitingTaskCancelsTheRunningStep() async throws {
    let recorder = Log<String>()
    let started = Gate()
    let pipeline = Pipeline(defaultValue: 0)
      .then { $0 + 1 }
      .then { value in
        recorder.append("sleeping")
        started.open()
        do {
          try await Task.sleep(for: .seconds(30))
        } catch {
          recorder.append(error is CancellationError ? "saw cancellation" : "other error")
          throw error
        }
        return value
      }
      .then { value in
        recorder.append("after")
        return value
      }
    let run = Task { try await pipeline.run() }
    await started.wait()
    run.cancel()
    await #expect(throws: CancellationError.self) { try await run.value }
    #expect(recorder.all == ["sleeping", "saw cancellation"])
  }

  @Test(.timeLimit(.minutes(10)))
  func aStepIgnoringCancellationStillEndsTheRunWithCancellation() async throws {
    let recorder = Log<String>()
    let started = Gate()
    let release = Gate()
    let pipeline = Pipeline(defaultValue: 0)
      .then { value in
        started.open()
        await release.wait()
        recorder.append("cancelled=\(Task.isCancelled)")
        return value + 1
      }
      .then { value in
        recorder.append("after")
        return value
      }
    let run = Task { try await pipeline.run() }
    await started.wait()
    run.cancel()
    release.open()
    await #expect(throws: CancellationError.self) { try await run.value }
    #expect(recorder.all == ["cancelled=true"])
  }

  @Test(.timeLimit(.minutes(10)))
  func handleCancelEndsAPendingCallbackStepAtOnce() async throws {
    let started = Gate()
    let lateGoes = Gate()
    let late = Counter()
    let pipeline = Pipeline(defaultValue: 0)
      .then(
        Pipeline.step { value, finish in
          started.open()
          // Completes only after the run reported its cancellation, so the run cannot have waited
          // for it; it must not be reported either. (A timer of 8 s was used before: on a loaded
          // CI machine the cancel once took longer to arrive.)
          Task {
            await lateGoes.wait()
            late.increment()
            finish(.success(value))
          }
        })
    let seen = Log<String>()
    let (result, calls) = await pipeAwaitCompletion(grace: .zero) {
      (done: @escaping @Sendable (Result<Int, any Error>) -> Void) in
      let handle = pipeline.execute { result in
        seen.append("late completions so far: \(late.value)")
        done(result)
      }
      Task {
        await started.wait()
        handle.cancel()
        #expect(handle.isCancelled)
      }
    }
    #expect(throws: CancellationError.self) { try result.get() }
    #expect(calls == 1)
    // The step's late completion comes and must not be reported: the completion ran once, before it.
    lateGoes.open()
    try await eventually("the late completion", timeout: .seconds(90)) { late.value == 1 }
    try await Task.sleep(for: .milliseconds(100))
    #expect(seen.all == ["late completions so far: 0"])
  }

  @Test func typedPipelineChangesTypeBetweenSteps() async throws {
    let pipeline = Pipeline.start(with: { (text: String) in text.count })
      .then { $0 * 2 }
      .then { "\($0) characters, doubled" }
    #expect(try await pipeline.run("four") == "8 characters, doubled")
    let (result, calls) = await pipeAwaitCompletion {
      (done: @escaping @Sendable (Result<String, any Error>) -> Void) in
      pipeline.execute("abc", completion: done)
    }
    #expect(try result.get() == "6 characters, doubled")
    #expect(calls == 1)
  }

  @Test func typedPipelineStopsAtTheFirstError() async throws {
    let recorder = Log<String>()
    let pipeline = Pipeline.start(with: { (value: Int) -> String in
      recorder.append("first")
      throw PipeTestError.boom(value)
    })
    .then { text -> Int in
      recorder.append("second")
      return text.count
    }
    await #expect(throws: PipeTestError.boom(3)) { try await pipeline.run(3) }
    #expect(recorder.all == ["first"])
  }

  @Test(.timeLimit(.minutes(10)))
  func typedPipelineCancelledInTheMiddleNeverStartsTheNextStep() async throws {
    let recorder = Log<String>()
    let started = Gate()
    let release = Gate()
    let pipeline = Pipeline.start(with: { (value: Int) -> Int in
      recorder.append("first")
      started.open()
      await release.wait()
      return value + 1
    })
    .then { value -> String in
      recorder.append("second")
      return "\(value)"
    }
    let run = Task { try await pipeline.run(1) }
    await started.wait()
    run.cancel()
    release.open()
    await #expect(throws: CancellationError.self) { try await run.value }
    #expect(recorder.all == ["first"])
  }

  /// A step whose completion never comes holds the run until it is cancelled; a time limit ends it.
  @Test(.timeLimit(.minutes(10)))
  func aStepWithATimeLimitThatNeverCompletesFailsTheRun() async throws {
    let recorder = Log<String>()
    let pipeline = Pipeline(defaultValue: 1)
      .then(Pipeline.step(timeout: .milliseconds(50), Pipeline.step { _, _ in recorder.append("started") }))
      .then { value in
        recorder.append("after")
        return value
      }
    await #expect(throws: StepTimeoutError(limit: .milliseconds(50))) { try await pipeline.run() }
    #expect(!recorder.all.contains("after"))
  }

  /// Even an `async` step that ignores cancellation cannot hold the run past its limit.
  @Test(.timeLimit(.minutes(10)))
  func aTimeLimitDoesNotWaitForAStepThatIgnoresCancellation() async throws {
    let release = Gate()
    let pipeline = Pipeline(defaultValue: 1).then(
      Pipeline.step(timeout: .milliseconds(50)) { value in
        await release.wait()
        return value
      })
    await #expect(throws: StepTimeoutError.self) { try await pipeline.run() }
    release.open()
  }

  @Test(.timeLimit(.minutes(10)))
  func aStepWithinItsTimeLimitPassesItsValueOrErrorOn() async throws {
    let pipeline = Pipeline(defaultValue: 1)
      .then(Pipeline.step(timeout: .seconds(60)) { $0 + 1 })
      .then(Pipeline.step(timeout: .seconds(60), Pipeline.step { value, done in done(.success(value * 10)) }))
    #expect(try await pipeline.run() == 20)
    let failing = Pipeline(defaultValue: 1).then(
      Pipeline.step(timeout: .seconds(60)) { _ in throw PipeTestError.boom(3) })
    await #expect(throws: PipeTestError.boom(3)) { try await failing.run() }
  }

  @Test(.timeLimit(.minutes(10)))
  func cancellingARunEndsABoundedStepAtOnce() async throws {
    let started = Gate()
    let pipeline = Pipeline(defaultValue: 1).then(
      Pipeline.step(timeout: .seconds(600), Pipeline.step { _, _ in started.open() }))
    let run = Task { try await pipeline.run() }
    await started.wait()
    run.cancel()
    await #expect(throws: CancellationError.self) { try await run.value }
  }
}
