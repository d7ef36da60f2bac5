import Foundation

/// A durable workflow: an async function from a typed input to a typed output whose steps survive
/// crashes.
///
/// A ``WorkflowQueue``'s workers run it. Each ``WorkflowContext/step(_:policy:_:)`` runs once: its
/// result is stored before the run goes on, and when the run resumes (after a crash, a deploy, a
/// sleep or a step's retry, on any worker sharing the store) the steps already stored return
/// their stored results without running again.
///
/// ```swift
/// struct Checkout: Workflow {
///   let payments: Payments
///
///   func run(_ order: Order, context: WorkflowContext) async throws -> Receipt {
///     let charge = try await context.step("charge") { try await payments.charge(order) }
///     try await context.sleep(for: .seconds(3600))  // costs no worker while it waits
///     let shipment = try await context.step("ship") { try await payments.ship(order, charge) }
///     return Receipt(charge: charge, shipment: shipment)
///   }
/// }
/// ```
///
/// **The determinism rule.** A resumed run calls ``run(_:context:)`` again from the start, and
/// the context hands back the stored results of the steps it already took; so the code *outside*
/// steps must ask for the same steps, with the same names, in the same order, every time it runs
/// with the same input and step results. Do anything that may differ between two runs (read the
/// clock, draw a random number, read a file or the network, look at a global) inside a step,
/// whose result is stored, and call the context's methods one at a time. A run whose code asks
/// for another step than its history holds (a step renamed, added or moved by a deploy) stops:
/// it is dead with a ``WorkflowError/historyMismatch(run:position:stored:requested:)`` error and
/// its history kept, so a deploy that restores the old order can re-queue it.
public protocol Workflow: Sendable {
  /// What a run starts from, stored as JSON with the run.
  associatedtype Input: Codable & Sendable
  /// What a run ends with, stored as JSON as the run's job output (at most
  /// ``JobHistory/maximumOutputBytes``).
  associatedtype Output: Codable & Sendable

  /// The name the run is stored under, which finds this workflow's code when the run resumes:
  /// keep it across deploys. 1 to 200 bytes. Default: the type's name.
  var name: String { get }

  /// The workflow's code: called at the start of a run and again each time it resumes.
  func run(_ input: Input, context: WorkflowContext) async throws -> Output
}

extension Workflow {
  /// The type's name, e.g. `Checkout`.
  public var name: String { String(describing: Self.self) }
}

/// How a workflow step is retried and bounded in time.
public struct WorkflowStepPolicy: Sendable {
  /// How many times the step may run before it fails for good (counting runs a crashed or
  /// stopped worker did not finish). At least 1. Default 5.
  public var maxAttempts: Int
  /// How long the run waits after a failed attempt before the next one (the run costs no worker
  /// while it waits). Default: exponential from 1 s to 5 minutes.
  public var retryPolicy: RetryPolicy
  /// The longest one attempt may run; nil (the default): no limit of its own. When it passes the
  /// step's task is cancelled, the run waits for it to return, and the attempt fails with
  /// "timed out after …".
  public var timeLimit: Duration?

  /// Creates a policy.
  public init(
    maxAttempts: Int = 5,
    retryPolicy: RetryPolicy = .exponential(initial: .seconds(1), maximum: .seconds(300)),
    timeLimit: Duration? = nil
  ) {
    self.maxAttempts = maxAttempts
    self.retryPolicy = retryPolicy
    self.timeLimit = timeLimit
  }

  /// Five attempts, exponential delays from 1 s to 5 minutes, no time limit.
  public static let standard = WorkflowStepPolicy()

  /// One attempt: the step's first error is its result.
  public static let once = WorkflowStepPolicy(maxAttempts: 1)
}

/// A step that failed for good: thrown into the workflow's code by
/// ``WorkflowContext/step(_:policy:_:)`` when its last attempt failed, and again, from the stored
/// history, each time the run resumes. Catch it to go on without the step (a compensation); let it
/// escape and the run is dead with its text.
public struct WorkflowStepFailure: Error, Sendable, Hashable, CustomStringConvertible {
  /// The step's name.
  public var step: String
  /// How many attempts ran.
  public var attempts: Int
  /// The last attempt's error, as text.
  public var message: String

  /// `step "charge" failed after 5 attempt(s): …`.
  public var description: String {
    "step \"\(step)\" failed after \(attempts) attempt(s): \(message)"
  }
}

/// Why a workflow run stopped (it is then dead, its history kept) or could not start.
public enum WorkflowError: Error, Sendable, Hashable, CustomStringConvertible {
  /// The code asked for another step than the run's history holds at this position: the
  /// workflow's code changed (a step renamed, added, removed or moved) while the run was under
  /// way, or it is not deterministic (see ``Workflow``).
  case historyMismatch(run: JobID, position: Int, stored: String, requested: String)
  /// A stored step result no longer decodes as the type the code asks for.
  case undecodableResult(run: JobID, step: String, message: String)
  /// The run's input no longer decodes as the workflow's input type.
  case undecodableInput(run: JobID, workflow: String, message: String)
  /// The code called a context method while another was under way (inside a step, or from two
  /// tasks at once): steps run one at a time.
  case overlappingSteps(run: JobID, step: String, running: String)
  /// Two workflows with one name were given to a queue, or a name is empty or too long.
  case invalidName(String)
  /// A workflow of this name is not among those the queue was given.
  case unknownWorkflow(String)

  /// Says what happened and what to do.
  public var description: String {
    switch self {
    case .historyMismatch(let run, let position, let stored, let requested):
      "run \(run): the code asked for \(requested) at position \(position + 1) of its history, which "
        + "holds \(stored): the workflow's steps changed while the run was under way, or the code outside "
        + "steps is not deterministic. The run is dead with its history kept: deploy code that asks for "
        + "the stored steps in order, then re-queue it"
    case .undecodableResult(let run, let step, let message):
      "run \(run): the stored result of step \"\(step)\" does not decode as the type the code asks for "
        + "(\(message)). The run is dead with its history kept: deploy code that reads the stored type, "
        + "then re-queue it"
    case .undecodableInput(let run, let workflow, let message):
      "run \(run): its input does not decode as the input of workflow \"\(workflow)\" (\(message)). The "
        + "run is dead with its input kept"
    case .overlappingSteps(let run, let step, let running):
      "run \(run): \(step) was called while \(running) was under way; call a workflow's steps, sleeps "
        + "and signals one at a time, never from inside a step"
    case .invalidName(let message): "invalid workflow name: \(message)"
    case .unknownWorkflow(let name):
      "no workflow named \"\(name)\" was given to this workflow queue; pass it to WorkflowQueue's "
        + "initializer"
    }
  }
}
