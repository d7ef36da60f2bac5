import Foundation

/// Limits stored with a queue, which every worker of every process sharing the store obeys.
///
/// Set them with ``JobQueue/setLimits(_:)`` (or `conveyor limits set`); read them with
/// ``JobQueue/limits()``. They are kept in the store beside the queue's jobs and its pause flag,
/// so a process started later, or running on another machine against the same PostgreSQL
/// database, obeys the same limits without being told.
///
/// ```swift
/// try await queue.setLimits(QueueLimits(concurrency: 3))  // at most 3 run at once, everywhere
/// ```
///
/// ## Concurrency
///
/// ``concurrency`` bounds how many of the queue's jobs are *running* at once: claimed by a
/// worker and not yet settled. The store counts them when it claims, inside the claim's
/// transaction, so the bound holds across processes and machines, not per process. A job a
/// worker prefetched (``JobQueueConfiguration/prefetch``) or claimed ahead takes a place though
/// its handler has not started, so handlers running never outnumber the limit.
///
/// The limit is exceeded only by a job whose lease lapsed: when a worker stops heart-beating for
/// longer than its lease (stopped, partitioned, or hung past it), its job is handed to another
/// worker and counted once, while the first worker's handler, if it ever resumes, runs beside it
/// until its outcome is refused. A killed worker's job keeps its place until its lease lapses,
/// then runs again.
///
/// Lowering the limit below the number running stops nothing: no job is claimed until fewer than
/// the new limit run. A worker waiting for a free place claims when one of its own jobs finishes,
/// and otherwise looks again at each ``JobQueueConfiguration/pollInterval``.
public struct QueueLimits: Sendable, Hashable, Codable {
  /// The most jobs of the queue that may run at once across every worker, or nil for no bound
  /// (each queue then runs up to its own ``JobQueueConfiguration/concurrency``). From 1 to
  /// ``maximumConcurrency``.
  public var concurrency: Int?

  /// The largest ``concurrency`` a store keeps.
  public static let maximumConcurrency = 1_000_000

  /// Limits; nil leaves that limit off.
  ///
  /// - Parameter concurrency: The most jobs of the queue running at once, across every worker.
  public init(concurrency: Int? = nil) {
    self.concurrency = concurrency
  }

  /// Whether no limit is set.
  public var isEmpty: Bool { concurrency == nil }

  /// Why these limits cannot be stored, or nil when they can.
  public var problem: String? {
    if let concurrency, !(1...Self.maximumConcurrency).contains(concurrency) {
      return "a concurrency limit must be from 1 to \(Self.maximumConcurrency), not \(concurrency); "
        + "pause the queue to stop claims, or pass nil to remove the limit"
    }
    return nil
  }

  /// Throws ``JobQueueError/invalidLimits(_:)`` when ``problem`` names one.
  package func check() throws {
    if let problem { throw JobQueueError.invalidLimits(problem) }
  }

  /// How many jobs a claim may take when `running` jobs of the queue already run and the worker
  /// asked for `wanted`.
  package func claimable(_ wanted: Int, running: Int) -> Int {
    guard let concurrency else { return wanted }
    return max(0, min(wanted, concurrency - running))
  }
}
