import Foundation

/// Runs durable workflows (``Workflow``) on a job store: each run is a job whose payload holds its
/// history, so a crash, a deploy or a machine's loss resumes it at its next step on any worker
/// sharing the store.
///
/// ```swift
/// let store = try await SQLiteJobStore.open(path: "jobs.sqlite")
/// let workflows = try WorkflowQueue(
///   configuration: JobQueueConfiguration(identifier: "checkout"), store: store,
///   workflows: [Checkout(payments: payments)])
/// let run = try await workflows.add(Checkout(payments: payments), input: order)
/// // later, in any process:
/// if case .completed(let receipt?) = try await workflows.status(of: run.id, as: Checkout.self) { … }
/// ```
///
/// The queue's workers are a ``JobQueue`` of ``WorkflowRun`` items (``jobs``): start, pause,
/// count, cancel and shut it down there. Its configuration's ``JobQueueConfiguration/maxAttempts``
/// must be nil: each step counts its own attempts (``WorkflowStepPolicy``), and a run's job is
/// claimed again after each sleep and retry. So must its ``JobQueueConfiguration/timeLimit``: each
/// step has its own (``WorkflowStepPolicy/timeLimit``).
///
/// How a run ends: it completes with the workflow's output (``WorkflowRunStatus/completed(_:)``);
/// it is dead when its code throws (a ``WorkflowStepFailure`` it lets through, any other error) or
/// breaks a rule (``WorkflowError``), with the reason as its last error and its history kept, so
/// ``JobQueue/requeueDead(_:)`` resumes it after a fix; it is cancelled by
/// ``JobQueue/cancel(_:)-(JobID)`` (a running step's task is cancelled, and no later step runs). A
/// run whose workflow this process does not know (code removed, or a worker of an older deploy)
/// waits and is tried again every minute (`unknownWorkflowDelay`), the reason as its last error.
public final class WorkflowQueue: Sendable {
  /// The queue whose jobs are the runs.
  public let jobs: JobQueue<WorkflowRun>
  private let names: Set<String>

  typealias Entry = @Sendable (Data, WorkflowContext) async throws -> JobResult

  /// The longest workflow name, in UTF-8 bytes.
  public static let maximumNameBytes = 200

  /// Creates a queue running the given workflows (started as the configuration's
  /// ``JobQueueConfiguration/autoStart`` says, or by `jobs.start()`).
  ///
  /// - Parameters:
  ///   - configuration: The queue's settings (``JobQueueConfiguration/maxAttempts`` nil).
  ///   - store: Where the runs live.
  ///   - workflows: The workflows this process runs, each with its own name.
  ///   - unknownWorkflowDelay: How long a run of a workflow this queue was not given waits before
  ///     it is tried again (by whichever worker claims it then). Default one minute.
  /// - Throws: ``WorkflowError/invalidName(_:)`` when two workflows share a name or a name is
  ///   empty or longer than ``maximumNameBytes``; ``JobQueueError/invalidConfiguration(_:)`` for a
  ///   configuration with ``JobQueueConfiguration/maxAttempts`` or ``JobQueueConfiguration/timeLimit``
  ///   set, and as ``JobQueue`` does;
  ///   ``JobQueueError/checkpointsUnsupported`` for a store that keeps no checkpoints.
  public init(
    configuration: JobQueueConfiguration, store: any JobStore, workflows: [any Workflow],
    unknownWorkflowDelay: Duration = .seconds(60)
  ) throws {
    guard store.keepsCheckpoints else { throw JobQueueError.checkpointsUnsupported }
    guard configuration.timeLimit == nil else {
      throw JobQueueError.invalidConfiguration(
        "a workflow queue's timeLimit must be nil: give each step its own (WorkflowStepPolicy.timeLimit); a "
          + "limit on a whole resumption would cut it between steps, where nothing tells a cut from a crash")
    }
    guard configuration.maxAttempts == nil else {
      throw JobQueueError.invalidConfiguration(
        "a workflow queue's maxAttempts must be nil: each step counts its own attempts "
          + "(WorkflowStepPolicy.maxAttempts), and a run is claimed again after each sleep and retry")
    }
    var entries: [String: Entry] = [:]
    for workflow in workflows {
      let name = workflow.name
      guard !name.isEmpty, name.utf8.count <= Self.maximumNameBytes else {
        throw WorkflowError.invalidName(
          "\"\(name.prefix(40))\" takes \(name.utf8.count) bytes; use 1 to \(Self.maximumNameBytes)")
      }
      guard entries[name] == nil else {
        throw WorkflowError.invalidName("two workflows are named \"\(name)\"; give each its own name")
      }
      entries[name] = Self.entry(workflow)
    }
    names = Set(entries.keys)
    let clock = configuration.clock
    let registry = entries
    jobs = try JobQueue(configuration: configuration, store: store) { run, job in
      try await Self.resume(
        run, job: job, entry: registry[run.workflow], store: store, clock: clock,
        unknown: unknownWorkflowDelay)
    }
  }

  /// Starts a run; returns after the store committed it. The run's ID is the result's `id`.
  ///
  /// - Parameters:
  ///   - workflow: A workflow given to this queue (matched by ``Workflow/name``).
  ///   - input: The run's input, stored as JSON.
  ///   - key: While a waiting or running run has this key, nothing is added and its ID comes back
  ///     (`outcome` `.existing`): one run per order, per user. Nil (the default): no key.
  ///   - priority: Higher runs first among ready jobs of the queue.
  ///   - delay: The run starts no sooner than this.
  /// - Throws: ``WorkflowError/unknownWorkflow(_:)`` for a workflow this queue was not given;
  ///   ``JobQueueError/encodingFailed(_:)`` when the input does not encode.
  @discardableResult
  public func add<W: Workflow>(
    _ workflow: W, input: W.Input, key: String? = nil, priority: Int = 0, delay: Duration = .zero
  ) async throws -> EnqueueResult {
    guard names.contains(workflow.name) else { throw WorkflowError.unknownWorkflow(workflow.name) }
    let data: Data
    do { data = try JSONEncoder().encode(input) } catch {
      throw JobQueueError.encodingFailed(String(describing: error))
    }
    return try await jobs.add(
      WorkflowRun(workflow: workflow.name, input: data, key: key), priority: priority, delay: delay)
  }

  /// Where a run is, with its output once it completed.
  ///
  /// - Throws: the decoding error when the stored output is not the workflow's output type.
  public func status<W: Workflow>(of run: JobID, as workflow: W.Type) async throws -> WorkflowRunStatus<
    W.Output
  > {
    guard let record = try await jobs.job(run) else { return .notFound }
    switch record.status {
    case .pending: return .waiting
    case .running: return .running
    case .completed: return .completed(try jobs.output(of: record, as: W.Output.self))
    case .dead: return .dead(record.lastError ?? "")
    case .cancelled: return .cancelled
    }
  }

  /// The run's stored state (workflow, input and history), or nil when the queue holds no such job.
  public func run(_ id: JobID) async throws -> WorkflowRun? {
    guard let record = try await jobs.job(id) else { return nil }
    return try jobs.item(of: record)
  }

  // MARK: Running

  private static func entry<W: Workflow>(_ workflow: W) -> Entry {
    { input, context in
      let decoded: W.Input
      do { decoded = try JSONDecoder().decode(W.Input.self, from: input) } catch {
        throw WorkflowError.undecodableInput(
          run: context.run, workflow: workflow.name, message: String(describing: error))
      }
      return .handled(output: try await workflow.run(decoded, context: context))
    }
  }

  /// Runs (or resumes) one run's code under its claim; what the job's outcome is.
  private static func resume(
    _ run: WorkflowRun, job: JobContext, entry: Entry?, store: any JobStore, clock: any JobClock,
    unknown delay: Duration
  ) async throws -> JobResult {
    guard let entry else { return try await waitForCode(run, job: job, store: store, delay: delay) }
    let context = WorkflowContext(run: run, job: job, store: store, clock: clock)
    let returned: Result<JobResult, any Error>
    do { returned = .success(try await entry(run.input, context)) } catch { returned = .failure(error) }
    // What the context saw comes first: the code may have caught the error that said it.
    if let failure = context.failure { return await die(failure.description, context) }
    switch context.suspension {
    case .sleep(let delay): return .wait(after: delay)
    case .retry(let delay, let reason): return .wait(after: delay, reason: reason)
    case .giveBack(let reason): return .giveBack(reason: reason)
    case .lost: return .wait(after: .zero)  // the claim is gone: the store ignores this outcome
    case nil: break
    }
    switch returned {
    case .success(let result): return result
    case .failure(let error):
      // A shutdown or a cancelled run: the queue gives the job back, or the store already
      // cancelled it. (A `CancellationError` the code throws of its own is an error like another.)
      if Task.isCancelled { throw error }
      if let error = error as? WorkflowError { return await die(error.description, context) }
      if let error = error as? WorkflowStepFailure { return await die(error.description, context) }
      return await die("the workflow's code threw: \(error)", context)
    }
  }

  /// The run dies with `reason`, noting first that a re-queue starts its attempts again.
  private static func die(_ reason: String, _ context: WorkflowContext) async -> JobResult {
    await context.saveBeforeDeath()
    return .discard(reason: reason)
  }

  /// A run of a workflow this process was not given waits a minute. Its checkpoint notes the
  /// claim, so that a worker that knows the workflow does not take the claims of workers that do
  /// not for crashes. The note is made in the stored JSON itself, which a newer deploy may have
  /// written with fields this one does not know.
  private static func waitForCode(
    _ run: WorkflowRun, job: JobContext, store: any JobStore, delay: Duration
  ) async throws -> JobResult {
    let reason = WorkflowError.unknownWorkflow(run.workflow).description
    // The crashes before this claim stay counted.
    let noted = job.attempts - WorkflowContext.crashes(attempts: job.attempts, run: run)
    do {
      if let record = try await store.job(job.id), record.claimToken == job.claimToken,
        let payload = WorkflowRun.noting(attempt: noted, in: record.payload)
      {
        guard try await store.checkpoint(job.claim, payload: payload, queue: job.queue) else {
          return .wait(after: .zero)  // the claim is gone: the store ignores this outcome
        }
      }
    } catch {
      if Task.isCancelled { throw error }
      // Not noted: given back with its attempt, so that it is not taken for a crash either.
      return .giveBack(reason: "\(reason) (and its claim could not be noted: \(error))")
    }
    return .wait(after: delay, reason: reason)
  }
}

/// Where a workflow run is (``WorkflowQueue/status(of:as:)``).
public enum WorkflowRunStatus<Output: Sendable>: Sendable {
  /// Not started yet, or between two resumptions (sleeping, waiting for a step's retry).
  case waiting
  /// A worker runs it now.
  case running
  /// Done; the workflow's output (nil when it was too large to store, see ``JobHistory/maximumOutputBytes``).
  case completed(Output?)
  /// Stopped for good, with the reason; its history is kept, and re-queueing it resumes it.
  case dead(String)
  /// Cancelled.
  case cancelled
  /// No run of this queue has this ID (never added, or removed or pruned).
  case notFound
}

extension WorkflowRunStatus: Equatable where Output: Equatable {}
