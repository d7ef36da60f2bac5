import Foundation

/// An item a ``JobQueue`` can store: encoded as JSON into the job's payload.
///
/// ```swift
/// struct Upload: Queueable {
///   var fileID: String
///   var deduplicationKey: String? { fileID }  // one pending upload per file
/// }
///
/// struct RefreshSearchIndex: Queueable {
///   var userID: String
///   var deduplicationKey: String? { userID }
///   var onConflict: DeduplicationConflict { .replace }  // each add pushes the one waiting job later
/// }
/// ```
public protocol Queueable: Codable, Sendable {
  /// While a *waiting* job has this key, adding another item with the same key stores nothing and
  /// returns the waiting job's ID (`EnqueueResult.outcome` is `.existing`). A job that is already
  /// running does not count: it may have read old data, so the new item is stored and runs after
  /// it. ``deduplicationScope`` widens this; ``onConflict`` replaces the waiting job instead. Nil
  /// (the default) never deduplicates.
  var deduplicationKey: String? { get }
  /// Which jobs of ``deduplicationKey`` stop a new one: ``DeduplicationScope/waiting`` (the
  /// default), ``DeduplicationScope/waitingOrRunning`` (one at a time), or
  /// ``DeduplicationScope/completedWithin(_:)`` (at most one per period).
  var deduplicationScope: DeduplicationScope { get }
  /// What an add does with the existing job of ``deduplicationKey``:
  /// ``DeduplicationConflict/useExisting`` (the default) or ``DeduplicationConflict/replace``,
  /// which gives a waiting job the new payload and run time (a debounce).
  var onConflict: DeduplicationConflict { get }
  /// Jobs of one queue with the same ordering key run one at a time, in the order they were
  /// added, across every process sharing the store: a later job waits while an earlier one waits
  /// for a retry, and while an earlier one is dead (see <doc:OrderingKeys>). Nil (the default):
  /// no order. At most ``OrderingKey/maximumBytes`` UTF-8 bytes, not empty, no NUL.
  var orderingKey: String? { get }
  /// The key whose concurrency limit binds the job (``QueueLimits/keyConcurrency``), e.g. the host
  /// an outbox job calls: at most that many jobs of one key run at once across every process
  /// sharing the store (see <doc:ConcurrencyLimits>). Nil (the default): only the queue's limits.
  /// At most ``LimitKey/maximumBytes`` UTF-8 bytes, not empty, no NUL.
  var limitKey: String? { get }
  /// The key whose turn the job takes among the queue's ready jobs (fair shares), e.g. a tenant:
  /// each key's jobs take turns with the other keys', so one key's backlog delays the others' by
  /// at most one job in turn (see <doc:ConcurrencyLimits>). Nil (the default): the job keeps its
  /// place by run date. At most ``FairnessKey/maximumBytes`` UTF-8 bytes, not empty, no NUL, and
  /// not with an ``orderingKey``.
  var fairnessKey: String? { get }
}

extension Queueable {
  /// No deduplication.
  public var deduplicationKey: String? { nil }
  /// Only waiting jobs count.
  public var deduplicationScope: DeduplicationScope { .waiting }
  /// The existing job is kept.
  public var onConflict: DeduplicationConflict { .useExisting }
  /// No order.
  public var orderingKey: String? { nil }
  /// No limit key.
  public var limitKey: String? { nil }
  /// No fairness key.
  public var fairnessKey: String? { nil }
}

/// What a handler knows about the job it is handling.
public struct JobContext: Sendable, Hashable {
  /// The job's ID in its store.
  public var id: JobID
  /// The queue's identifier.
  public var queue: String
  /// Which attempt this is: 1 the first time the job is handled.
  public var attempts: Int
  /// When the job was first committed.
  public var createdAt: Date
  /// The error recorded by the previous attempt, if any.
  public var lastError: String?
  /// The fencing token of this claim (``JobRecord/claimToken``): each claim of the job gets a
  /// greater one. Pass it to a system the handler writes to, so it can refuse a write from an
  /// older claim whose lease lapsed; ``JobStore/checkpoint(_:payload:queue:)`` takes it with ``id``.
  public var claimToken: Int64

  /// Creates a context.
  public init(
    id: JobID, queue: String, attempts: Int, createdAt: Date, lastError: String? = nil, claimToken: Int64 = 0
  ) {
    self.id = id
    self.queue = queue
    self.attempts = attempts
    self.createdAt = createdAt
    self.lastError = lastError
    self.claimToken = claimToken
  }

  /// The claim this context describes: the job and its ``claimToken``.
  public var claim: ClaimReference { ClaimReference(id: id, token: claimToken) }
}

/// What a handler tells the queue about a job.
///
/// A thrown error counts as ``retry`` and is recorded as the job's last error.
public struct JobResult: Sendable, Hashable, CustomStringConvertible {
  enum Kind: Sendable, Hashable {
    /// `output`: the encoded output, or why it could not be stored.
    case handled(output: Result<Data, OutputError>?)
    case retry(after: Duration?, reason: String?)
    case discard(reason: String)
    /// A workflow run waits until the delay has passed (a sleep, or a step's retry whose error
    /// `reason` is), the attempt kept. Decided and stored by the run's history, so a shutdown
    /// settles it too, rather than give the run back.
    case wait(after: Duration, reason: String?)
    /// A workflow run is given back, its attempt returned: a store error kept it from saving.
    case giveBack(reason: String)
  }

  let kind: Kind

  /// Why an output was not stored.
  struct OutputError: Error, Hashable {
    let message: String
  }

  /// The job is done: it is kept as ``JobStatus/completed`` for the queue's ``JobRetention``.
  public static let handled = JobResult(kind: .handled(output: nil))

  /// The job is done, with an output kept in its history (``JobRecord/output``; read it back with
  /// ``JobQueue/output(of:as:)``), encoded as JSON.
  ///
  /// An output that does not encode, or whose JSON exceeds ``JobHistory/maximumOutputBytes``, is
  /// not stored: the job still completes without output (its work is done and must not run
  /// again), and the queue logs the reason as an error naming the job.
  public static func handled<Output: Encodable>(output: Output) -> JobResult {
    let encoded: Result<Data, OutputError>
    do {
      let data = try JSONEncoder().encode(output)
      if data.count > JobHistory.maximumOutputBytes {
        encoded = .failure(
          OutputError(
            message: "the output was not stored: its JSON takes \(data.count) bytes, more than the "
              + "\(JobHistory.maximumOutputBytes) a job may keep; store large results elsewhere and "
              + "return their location"))
      } else {
        encoded = .success(data)
      }
    } catch {
      encoded = .failure(
        OutputError(message: "the output was not stored: it does not encode as JSON: \(error)"))
    }
    return JobResult(kind: .handled(output: encoded))
  }

  /// Try again after the delay the queue's ``RetryPolicy`` gives (dead once `maxAttempts` is reached).
  public static let retry = JobResult(kind: .retry(after: nil, reason: nil))

  /// Try again after `delay` instead of the policy's delay (dead once `maxAttempts` is reached).
  ///
  /// - Parameters:
  ///   - delay: how long to wait before the job is ready again.
  ///   - reason: recorded as the job's last error.
  public static func retry(after delay: Duration, reason: String? = nil) -> JobResult {
    JobResult(kind: .retry(after: delay, reason: reason))
  }

  /// Try again after the policy's delay, recording `reason` as the job's last error.
  public static func retry(reason: String) -> JobResult {
    JobResult(kind: .retry(after: nil, reason: reason))
  }

  /// Give up on the job: it becomes dead with `reason`, kept for inspection and re-queueing.
  public static func discard(reason: String) -> JobResult {
    JobResult(kind: .discard(reason: reason))
  }

  /// The run waits `delay`, recording `reason` if any: a workflow's durable sleep, or its step's
  /// retry. Settled even when a shutdown cut the handler short: the run's history holds it.
  static func wait(after delay: Duration, reason: String? = nil) -> JobResult {
    JobResult(kind: .wait(after: delay, reason: reason))
  }

  /// The run is given back ready, its attempt returned, recording `reason`.
  static func giveBack(reason: String) -> JobResult {
    JobResult(kind: .giveBack(reason: reason))
  }

  /// A short text for logs.
  public var description: String {
    switch kind {
    case .handled(nil): "handled"
    case .handled(.success(let data)): "handled with \(data.count) bytes of output"
    case .handled(.failure(let error)): "handled; \(error.message)"
    case .retry(let delay, let reason):
      "retry" + (delay.map { " after \($0)" } ?? "") + (reason.map { ": \($0)" } ?? "")
    case .discard(let reason): "discard: \(reason)"
    case .wait(let delay, let reason): "wait for \(delay)" + (reason.map { ": \($0)" } ?? "")
    case .giveBack(let reason): "give back: \(reason)"
    }
  }
}
