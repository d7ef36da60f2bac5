import Conveyor
import Foundation
import Testing

/// `Pipeline.step(timeout:_:)` bounds a step whose completion never comes.
@Suite("Pipeline: a step with a time limit", .timeLimit(.minutes(10)))
struct PipelineStepTimeoutTests {
  // A pipeline step whose completion never comes is bounded by step(timeout:).
  @Test func aStepThatNeverCallsBackIsBounded() async throws {
    let pipeline = Pipeline(defaultValue: 1)
      .then(Pipeline.step(timeout: .milliseconds(200), Pipeline.step { _, _ in }))
    let outcome = try await within(.seconds(60)) { () -> String in
      do {
        _ = try await pipeline.run()
        return "finished"
      } catch let error as StepTimeoutError {
        return "\(error.limit)"
      }
    }
    #expect(outcome == "\(Duration.milliseconds(200))")
  }
}
