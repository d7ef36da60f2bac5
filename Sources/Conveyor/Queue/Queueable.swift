import Foundation

/// An item a ``JobQueue`` can store: encoded as JSON into the job's payload.
///
/// ```swift
/// struct Upload: Queueable {
///   var fileID: String
///   var deduplicationKey: String? { fileID }  // one pending upload per file
/// }
/// ```
public protocol Queueable: Codable, Sendable {
  /// While a *waiting* job has this key, adding another item with the same key stores nothing and
  /// returns the waiting job's ID (`EnqueueResult.inserted` is false). A job that is already
  /// running does not count: it may have read old data, so the new item is stored and runs after
  /// it. Nil (the default) never deduplicates.
  var deduplicationKey: String? { get }
}

extension Queueable {
  /// No deduplication.
  public var deduplicationKey: String? { nil }
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

  /// Creates a context.
  public init(id: JobID, queue: String, attempts: Int, createdAt: Date, lastError: String? = nil) {
    self.id = id
    self.queue = queue
    self.attempts = attempts
    self.createdAt = createdAt
    self.lastError = lastError
  }
}

/// What a handler tells the queue about a job.
///
/// A thrown error counts as ``retry`` and is recorded as the job's last error.
public struct JobResult: Sendable, Hashable, CustomStringConvertible {
  enum Kind: Sendable, Hashable {
    case handled
    case retry(after: Duration?, reason: String?)
    case discard(reason: String)
  }

  let kind: Kind

  /// The job is done: it is deleted from the store.
  public static let handled = JobResult(kind: .handled)

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

  /// A short text for logs.
  public var description: String {
    switch kind {
    case .handled: "handled"
    case .retry(let delay, let reason):
      "retry" + (delay.map { " after \($0)" } ?? "") + (reason.map { ": \($0)" } ?? "")
    case .discard(let reason): "discard: \(reason)"
    }
  }
}
