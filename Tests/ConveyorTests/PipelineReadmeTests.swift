import Conveyor
import ConveyorTestSupport
import Dispatch
import Testing

// The examples of the "Pipelines" guide (Sources/Conveyor/Conveyor.docc/RunningPipelines.md),
// verbatim, so they are compiled and run.

private struct Order: Sendable {
  var id: Int
  var total = 0
  var charged = false
}

private func loadOrder(_ id: Int) async throws -> Order { Order(id: id) }

@Suite("Guide snippets: pipelines")
struct PipelineReadmeTests {
  @Test func homogeneousPipeline() async throws {
    // RunningPipelines.md example 1 begins
    let checkout = Pipeline(defaultValue: Order(id: 0))
      .then { order in try await loadOrder(order.id) }
      .then { order in
        var order = order
        order.total = 42
        return order
      }
      .then { order in
        try Task.checkCancellation()  // steps may check; the pipeline checks between steps
        var order = order
        order.charged = true
        return order
      }

    // async/await: the first error is thrown, later steps never run.
    let order = try await checkout.run(from: Order(id: 7))
    // order.id == 7, order.total == 42, order.charged == true

    // Completion handler: called once, on the chosen queue; the handle cancels this run only.
    let handle = checkout.execute(from: Order(id: 8)) { result in
      switch result {
      case .success(let order): print("charged order \(order.id)")
      case .failure(let error): print("checkout failed: \(error)")
      }
    }
    _ = handle  // keep it to call handle.cancel()
    // RunningPipelines.md example 1 ends
    #expect(order.id == 7 && order.total == 42 && order.charged)
  }

  @Test func runnerAndTypedPipeline() async throws {
    // RunningPipelines.md example 2 begins
    // Tasks one after another (the next starts when the previous completed), or a few at once.
    let downloads = (1...10).map { page in
      AnyAsyncTask<String, any Error> { "page \(page)" }
    }
    let pages = try await AsyncTaskRunner(downloads, mode: .concurrent(width: 3)).run()
    // pages == ["page 1", ..., "page 10"], in input order

    // Steps that change type.
    let wordCount = Pipeline.start(with: { (text: String) in text.split(separator: " ") })
      .then { words in words.count }
    let count = try await wordCount.run("one two three")  // 3
    // RunningPipelines.md example 2 ends
    #expect(pages == (1...10).map { "page \($0)" })
    #expect(count == 3)
  }

  @Test func aStepWithADeadline() async throws {
    var timedOut: StepTimeoutError?
    // RunningPipelines.md example 3 begins
    let legacySend: @Sendable (Int, @escaping @Sendable (Result<Int, any Error>) -> Void) -> Void = {
      _, _ in  // a callback API that, this time, never calls back
    }
    let guarded = Pipeline(defaultValue: 1)
      .then(Pipeline.step(timeout: .milliseconds(100), Pipeline.step(legacySend)))
    do {
      _ = try await guarded.run()
    } catch let timeout as StepTimeoutError {
      print(timeout)  // the step did not finish within 0.1 seconds
      // RunningPipelines.md example 3 ends
      timedOut = timeout
    }
    #expect(timedOut == StepTimeoutError(limit: .milliseconds(100)))
  }
}
