import Foundation

/// How long a queue keeps its finished jobs, by status, before pruning them.
///
/// Finished jobs (``JobStatus/completed``, ``JobStatus/cancelled``, ``JobStatus/dead``) stay in
/// the store as history: ``JobQueue/job(_:)``, `conveyor show` and the dashboard show them with
/// their finishing time, attempts, errors, run time and output. A started queue deletes those
/// older than their status's period in the background, in small batches (``interval``); with
/// several processes on one store, each prunes by its own configuration, so the shortest period
/// wins.
///
/// The defaults keep completed jobs 1 day, cancelled jobs 7 days and dead jobs 30 days.
public struct JobRetention: Sendable, Hashable {
  /// How long one status's finished jobs are kept.
  public enum Period: Sendable, Hashable {
    /// Not kept: a job that completes (or dies) is deleted at once, as no history was kept
    /// before; a cancelled job is deleted at the queue's next pruning pass.
    case none
    /// Kept until deleted by hand (`remove`, `purge`, `clear`).
    case forever
    /// Kept this long after the job finished (more than zero, at most 100 years).
    case `for`(Duration)

    /// Kept this many days. A count beyond what a duration holds gives one ``JobRetention/validate()``
    /// refuses, rather than wrapping around to another period.
    public static func days(_ days: Int) -> Period {
      let (seconds, overflow) = Int64(clamping: days).multipliedReportingOverflow(by: 86_400)
      return .for(.seconds(overflow ? (days < 0 ? Int64.min : Int64.max) : seconds))
    }
  }

  /// How long completed jobs are kept. Default 1 day.
  public var completed: Period
  /// How long cancelled jobs are kept. Default 7 days.
  public var cancelled: Period
  /// How long dead jobs are kept. Default 30 days: long enough to notice, inspect and re-queue
  /// them, short enough that a failure storm does not fill the disk.
  public var dead: Period
  /// How often a started queue prunes (first a few seconds after it starts). Default 1 minute.
  public var interval: Duration

  /// Creates a retention.
  public init(
    completed: Period = .days(1), cancelled: Period = .days(7), dead: Period = .days(30),
    interval: Duration = .seconds(60)
  ) {
    self.completed = completed
    self.cancelled = cancelled
    self.dead = dead
    self.interval = interval
  }

  /// Completed 1 day, cancelled 7 days, dead 30 days, pruned every minute.
  public static let `default` = JobRetention()

  /// Everything kept until deleted by hand: nothing is pruned.
  public static let forever = JobRetention(completed: .forever, cancelled: .forever, dead: .forever)

  /// The period of a finished status; nil for an unfinished one.
  public func period(for status: JobStatus) -> Period? {
    switch status {
    case .completed: completed
    case .cancelled: cancelled
    case .dead: dead
    case .pending, .running: nil
    }
  }

  /// Whether jobs that finish with `status` are kept at all (not ``Period/none``).
  public func keeps(_ status: JobStatus) -> Bool { period(for: status) != JobRetention.Period.none }

  /// Checks every period is positive and at most 100 years, and the interval at least 1 second.
  public func validate() throws(JobQueueError) {
    for (name, period) in [("completed", completed), ("cancelled", cancelled), ("dead", dead)] {
      guard case .for(let duration) = period else { continue }
      guard duration > .zero, duration <= JobStoreTime.longestDelay else {
        throw .invalidConfiguration(
          "retention.\(name) is \(duration); give a period above zero and at most 100 years, "
            + "or .none to keep no \(name) jobs, or .forever")
      }
    }
    guard interval >= .seconds(1), interval <= .seconds(86_400) else {
      throw .invalidConfiguration(
        "retention.interval is \(interval); prune between every second and once a day")
    }
  }
}

/// The bounds of what a finished job's history holds.
public enum JobHistory {
  /// The most errors a job keeps (``JobRecord/errors``): the latest ones.
  public static let maximumErrors = 20
  /// The most bytes of UTF-8 one kept error holds; a longer one is cut, on a character boundary,
  /// and ends with "…".
  public static let maximumErrorBytes = 4_096
  /// The most bytes of JSON a job's output (``JobResult/handled(output:)``) may take. A larger
  /// output is not stored: the job still completes, with the reason recorded as its last error.
  public static let maximumOutputBytes = 65_536

  /// `error` cut to ``maximumErrorBytes`` of UTF-8, on a Unicode scalar boundary, ending with "…"
  /// when cut.
  public static func bounded(_ error: String) -> String {
    let utf8 = error.utf8
    guard utf8.count > maximumErrorBytes else { return error }
    // "…" takes 3 bytes.
    var end = utf8.index(utf8.startIndex, offsetBy: maximumErrorBytes - 3)
    while end > utf8.startIndex && UTF8.isContinuation(utf8[end]) { end = utf8.index(before: end) }
    return String(decoding: utf8[..<end], as: UTF8.self) + "…"
  }

  /// `errors` with `error` appended (bounded), keeping the latest ``maximumErrors``.
  package static func appending(_ error: String?, to errors: [String]) -> [String] {
    guard let error else { return errors }
    return Array((errors + [bounded(error)]).suffix(maximumErrors))
  }
}
