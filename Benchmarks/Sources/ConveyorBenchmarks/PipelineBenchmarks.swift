import Conveyor

/// A step the optimiser cannot see through: an `async` closure called through an array.
private typealias BenchStep = @Sendable (Int) async throws -> Int

func runPipelineBenchmarks() async throws {
  section("Pipeline")
  let count = 100_000
  let steps: [BenchStep] = Array(repeating: { $0 &+ 1 }, count: count)
  let pipeline = Pipeline(defaultValue: 0, steps: steps)

  // Baseline: the same 100k awaits of the same closures in a plain loop.
  var baselineResult = 0
  let baseline = try await best(repeats: 5) {
    var value = 0
    for step in steps { value = try await step(value) }
    baselineResult = value
  }

  var pipelineResult = 0
  let measured = try await best(repeats: 5) {
    pipelineResult = try await pipeline.run()
  }
  precondition(baselineResult == count && pipelineResult == count, "benchmark computed the wrong value")

  Comparison(
    name: "Pipeline.run, 100k async steps",
    count: count,
    seconds: measured,
    baselineName: "plain loop of 100k awaits",
    baselineSeconds: baseline,
    goal: 0.5
  ).print()

  // Steps with a time limit: each runs in a task of its own beside a timer that is cancelled when
  // the step returns. The baseline is the same step in a task of its own without a timer, so the
  // ratio is the timer's own cost (a Dispatch timer source made and cancelled per step).
  let limited = 10_000
  let timedStep = Pipeline<Int>.step(timeout: .seconds(3_600)) { $0 &+ 1 }
  let timedSeconds = try await best(repeats: 5) {
    var value = 0
    for _ in 0..<limited { value = try await timedStep(value) }
    precondition(value == limited)
  }
  let untimedSeconds = await best(repeats: 5) {
    var value = 0
    for _ in 0..<limited {
      let current = value
      value = await Task { current &+ 1 }.value
    }
    precondition(value == limited)
  }
  Comparison(
    name: "Pipeline.step(timeout:), 10k steps",
    count: limited,
    seconds: timedSeconds,
    baselineName: "the step in a task of its own, no timer",
    baselineSeconds: untimedSeconds,
    goal: nil
  ).print()

  // Completion-handler form: one Task per run, not per step.
  let handlerSeconds = try await best(repeats: 5) {
    let value = try await withCheckedThrowingContinuation { continuation in
      pipeline.execute { continuation.resume(with: $0) }
    }
    precondition(value == count)
  }
  Comparison(
    name: "Pipeline.execute(completion:), 100k steps",
    count: count,
    seconds: handlerSeconds,
    baselineName: "plain loop of 100k awaits",
    baselineSeconds: baseline,
    goal: 0.5
  ).print()

  // The sequential runner over 100k async closure tasks. Each closure captures its index, so
  // each has a context of its own on the heap: awaiting 100k distinct closures costs more than
  // awaiting one closure 100k times (the loop above), whoever awaits them. The fair baseline is a
  // plain loop over the same closures, collecting the values. The runner awaits a closure that
  // cannot throw as it was given (`AnyAsyncTask.plainWork`): making it throwing, as it did
  // before, put a thunk, one more async frame, in front of every call.
  let bodies: [@Sendable () async -> Int] = (0..<count).map { index in { index } }
  let tasks = bodies.map { AnyAsyncTask<Int, Never>($0) }
  let runner = AsyncTaskRunner<Int, Never>(tasks)
  let sameClosures = await best(repeats: 5) {
    var values: [Int] = []
    values.reserveCapacity(bodies.count)
    for body in bodies { values.append(await body()) }
    precondition(values.count == count)
  }
  let runnerSeconds = try await best(repeats: 5) {
    let values = try await runner.run()
    precondition(values.count == count)
  }
  Comparison(
    name: "AsyncTaskRunner.run, 100k sequential tasks",
    count: count,
    seconds: runnerSeconds,
    baselineName: "plain loop over the same 100k closures",
    baselineSeconds: sameClosures,
    goal: 0.5
  ).print()
  Comparison(
    name: "AsyncTaskRunner.run, 100k sequential tasks",
    count: count,
    seconds: runnerSeconds,
    baselineName: "plain loop of 100k awaits",
    baselineSeconds: baseline,
    goal: nil
  ).print()
}
