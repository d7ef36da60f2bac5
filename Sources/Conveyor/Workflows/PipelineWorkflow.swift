/// A ``Pipeline`` run as a durable workflow: each step's value is stored as the run goes, so a
/// crash resumes the run at the step after the last one stored, on any worker.
///
/// The one change from an in-process pipeline: give the pipeline a name with
/// ``Pipeline/workflow(named:policy:)`` and add runs to a ``WorkflowQueue`` instead of calling
/// ``Pipeline/run(from:)``. The value must be `Codable` (it is stored between steps).
///
/// ```swift
/// let resize = Pipeline(defaultValue: Image.empty)
///   .then { try await download($0) }
///   .then { try await shrink($0) }
///   .workflow(named: "resize")
/// let workflows = try WorkflowQueue(configuration: configuration, store: store, workflows: [resize])
/// try await workflows.add(resize, input: image)
/// ```
///
/// The steps are named by position and count ("step 2 of 3"): a deploy that adds or removes a
/// step stops the runs under way with ``WorkflowError/historyMismatch(run:position:stored:requested:)``
/// rather than hand them another step's stored value. (One that reorders steps and keeps their
/// count is not seen: finish or cancel the runs under way first.)
public struct PipelineWorkflow<Value: Codable & Sendable>: Workflow {
  /// The name runs are stored under.
  public let name: String
  /// The steps.
  public let pipeline: Pipeline<Value>
  /// Every step's attempts, retry delays and time limit.
  public let policy: WorkflowStepPolicy

  /// Makes a workflow of a pipeline.
  public init(name: String, pipeline: Pipeline<Value>, policy: WorkflowStepPolicy = .standard) {
    self.name = name
    self.pipeline = pipeline
    self.policy = policy
  }

  /// Runs the steps in order, each a workflow step; returns the last step's value.
  public func run(_ input: Value, context: WorkflowContext) async throws -> Value {
    var value = input
    let count = pipeline.steps.count
    for (index, step) in pipeline.steps.enumerated() {
      let current = value
      value = try await context.step("step \(index + 1) of \(count)", policy: policy) {
        try await step(current)
      }
    }
    return value
  }
}

extension Pipeline where Value: Codable {
  /// This pipeline as a durable workflow named `name` (see ``PipelineWorkflow``).
  public func workflow(named name: String, policy: WorkflowStepPolicy = .standard) -> PipelineWorkflow<Value>
  {
    PipelineWorkflow(name: name, pipeline: self, policy: policy)
  }
}
