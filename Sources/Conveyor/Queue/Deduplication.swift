import Foundation

/// Which jobs with the same deduplication key stop a new one from being stored
/// (``NewJob/deduplicationScope``, ``Queueable/deduplicationScope``).
///
/// Every scope compares keys within one queue, byte for byte. A job of the key found in the
/// scope is "the existing job": its ID comes back, and ``DeduplicationConflict`` says whether it
/// is kept as it is or, while it waits, replaced.
public enum DeduplicationScope: Sendable, Hashable, CustomStringConvertible {
  /// A job of the key that waits (ready or scheduled) stops a new one. The default. A running
  /// job does not count: it may have read old data, so the new job is stored and runs after it.
  case waiting
  /// A job of the key that waits or runs stops a new one: at most one job of the key is in the
  /// queue at a time.
  case waitingOrRunning
  /// A job of the key that waits, runs, or completed within `period` before the add stops a new
  /// one: "at most one per period". Cancelled and dead jobs do not count (they did not do the
  /// work). The completed jobs are read from the history, so the queue's
  /// ``JobRetention/completed`` must keep them at least `period`: ``JobQueue`` refuses the add
  /// otherwise. `period` is between 1 ms and 100 years.
  case completedWithin(Duration)

  /// The scope as written in Swift, such as `completedWithin(3600.0 seconds)`.
  public var description: String {
    switch self {
    case .waiting: "waiting"
    case .waitingOrRunning: "waitingOrRunning"
    case .completedWithin(let period): "completedWithin(\(period))"
    }
  }

  /// The longest ``completedWithin(_:)`` period: 100 years, as for retention.
  public static let longestPeriod = JobStoreTime.longestDelay

  /// Why this scope cannot be used, or nil.
  package var problem: String? {
    guard case .completedWithin(let period) = self else { return nil }
    if period < .milliseconds(1) || period > Self.longestPeriod {
      return "deduplicationScope .completedWithin(\(period)) is out of range: give a period "
        + "between 1 ms and 100 years"
    }
    return nil
  }

  /// The earliest finishing time, in the stores' milliseconds since 1970, of a completed job
  /// that still counts at `now` (milliseconds); nil for the scopes that leave completed jobs out.
  package func completedSince(now: Int64) -> Int64? {
    guard case .completedWithin(let period) = self else { return nil }
    // Both within the stores' range (year 1 to 9999, and 100 years): no overflow.
    return now - JobStoreTime.milliseconds(period)
  }

  /// Whether running jobs count.
  package var includesRunning: Bool { self != .waiting }
}

/// What an add does when it finds an existing job of its deduplication key
/// (``NewJob/onConflict``, ``Queueable/onConflict``).
public enum DeduplicationConflict: Sendable, Hashable {
  /// Store nothing; return the existing job's ID (``EnqueueOutcome/existing``). The default.
  case useExisting
  /// When the existing job waits, give it the new job's payload, priority, run time and time
  /// limit (``EnqueueOutcome/replaced``): a debounce, where each add pushes the one waiting job
  /// later and it runs once with the newest payload. It keeps its ID, attempts, errors and
  /// creation time. A running or completed job cannot be replaced (it may have read its
  /// payload): with ``DeduplicationScope/waiting`` a new job is stored, with a wider scope the
  /// existing job's ID comes back.
  case replace
}

/// What an add did with one job (``EnqueueResult/outcome``).
public enum EnqueueOutcome: Sendable, Hashable {
  /// A new job was stored.
  case inserted
  /// A job of the same deduplication key was found; nothing was stored or changed.
  case existing
  /// A waiting job of the same deduplication key was given the new payload and run time
  /// (``DeduplicationConflict/replace``).
  case replaced
}
