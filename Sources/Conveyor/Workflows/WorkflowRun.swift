import Foundation

/// A workflow run as its job stores it: which workflow, its input and its history.
///
/// The job's payload is this value as JSON. A ``WorkflowQueue`` writes it again (a checkpoint,
/// ``JobStore/checkpoint(_:payload:queue:)``) each time a step finishes, fails or the run sleeps,
/// and a worker that resumes the run reads it once, with its claim.
public struct WorkflowRun: Queueable, Hashable {
  /// The workflow's ``Workflow/name``.
  public var workflow: String
  /// The run's input, as JSON.
  public var input: Data
  /// The steps and sleeps the run took, in order; the last may be under way (a step waiting for
  /// its next attempt).
  public var history: [WorkflowEvent]
  /// While a waiting run has this key, adding another run with it returns the waiting run (see
  /// ``WorkflowQueue/add(_:input:key:priority:delay:)``).
  public var key: String?
  /// The job attempt (claim count) that wrote the latest checkpoint: with ``suspended``, tells a
  /// resumed run how many of the claims since ended without one (a worker crashed or was killed).
  var checkpointAttempt: Int
  /// Whether the latest checkpoint ended its attempt on purpose (a sleep, a step's retry).
  var suspended: Bool

  /// Makes a new run's first payload.
  init(workflow: String, input: Data, key: String?) {
    self.workflow = workflow
    self.input = input
    self.history = []
    self.key = key
    self.checkpointAttempt = 0
    self.suspended = true
  }

  /// The run a job's payload holds, or nil when the payload is not a workflow run's (a tool that
  /// shows any job, such as `conveyor show` and the dashboard, tells runs apart with it).
  public init?(payload: Data) {
    guard let run = try? JSONDecoder().decode(WorkflowRun.self, from: payload) else { return nil }
    self = run
  }

  /// `payload` with its checkpoint noting `attempt` and a claim to follow on purpose, every other
  /// member kept as it is (a newer deploy's included); nil when it is not a run's JSON object.
  static func noting(attempt: Int, in payload: Data) -> Data? {
    guard var object = (try? JSONSerialization.jsonObject(with: payload)) as? [String: Any],
      object["workflow"] is String, object["history"] is [Any]
    else { return nil }
    object["checkpointAttempt"] = attempt
    object["suspended"] = true
    return try? JSONSerialization.data(withJSONObject: object)
  }

  /// One run per key among waiting and running runs.
  public var deduplicationKey: String? { key }
  /// A running run counts too: two runs with one key never overlap.
  public var deduplicationScope: DeduplicationScope { .waitingOrRunning }
}

/// One entry of a run's history: a step (finished, or failed and waiting for its next attempt)
/// or a sleep.
public struct WorkflowEvent: Codable, Sendable, Hashable {
  /// What the entry records.
  public enum Kind: String, Codable, Sendable, Hashable {
    /// ``WorkflowContext/step(_:policy:_:)``.
    case step
    /// ``WorkflowContext/sleep(for:name:)`` or ``WorkflowContext/sleep(until:name:)``.
    case sleep
  }

  /// A step or a sleep.
  public var kind: Kind
  /// The step's name, or the sleep's.
  public var name: String
  /// Whether the step finished (with a result or for good with an error); a sleep is finished
  /// once recorded.
  public var finished: Bool
  /// A finished step's result, as JSON; nil for a failed step and a sleep.
  public var result: Data?
  /// The error of the step's latest failed attempt (for a finished step without a result: the
  /// error it failed with for good).
  public var error: String?
  /// How many attempts of the step failed, crashed workers' included.
  public var failedAttempts: Int
  /// When the step's latest attempt started (by the queue's clock).
  public var startedAt: Date?
  /// When the step finished, or when the sleep ends.
  public var finishedAt: Date?

  /// Where the entry stands at `now`: `completed` (a step with its result), `failed` (a step that
  /// failed for good), `retrying` (a step that failed an attempt and waits for the next),
  /// `sleeping` (a sleep not over at `now`) or `slept`.
  public func state(at now: Date) -> String {
    switch kind {
    case .step: finished ? (result != nil ? "completed" : "failed") : "retrying"
    case .sleep: (finishedAt.map { $0 > now } ?? false) ? "sleeping" : "slept"
    }
  }

  /// A description like `step "charge"` or `sleep "sleep"`, as errors name entries.
  public var label: String { "\(kind.rawValue) \"\(name)\"" }

  init(kind: Kind, name: String) {
    self.kind = kind
    self.name = name
    self.finished = false
    self.failedAttempts = 0
  }
}
