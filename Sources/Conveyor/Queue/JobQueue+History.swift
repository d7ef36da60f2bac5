import Foundation

// The history of finished jobs: purging by hand, and pruning by the queue's `JobRetention`.

extension JobQueue {
  /// Deletes this queue's finished jobs of `status` (completed, cancelled or dead) that finished
  /// more than `age` ago (zero: all of them), in batches that each hold the store's write lock
  /// briefly; returns how many.
  ///
  /// - Throws: ``JobQueueError/invalidConfiguration(_:)`` for an unfinished status (use
  ///   ``cancel(_:)-(JobID)`` or ``clear()`` for those) or a negative age.
  @discardableResult
  public func purge(_ status: JobStatus, olderThan age: Duration = .zero) async throws -> Int {
    guard status.isFinished else {
      throw JobQueueError.invalidConfiguration(
        "purge deletes finished jobs (completed, cancelled, dead), not \(status.rawValue) ones; "
          + "cancel or clear those instead")
    }
    guard age >= .zero else {
      throw JobQueueError.invalidConfiguration("purge's age must not be negative, got \(age)")
    }
    return try await Self.prune(store: store, queue: identifier, status: status, olderThan: age, clock: clock)
  }

  /// Prunes the history now as ``JobQueueConfiguration/retention`` says (a started queue also does
  /// it every ``JobRetention/interval``); returns how many jobs were deleted.
  @discardableResult
  public func pruneHistory() async throws -> Int {
    var deleted = 0
    for status in JobStatus.finished {
      let age: Duration
      switch configuration.retention.period(for: status) {
      case .none?: age = .zero
      case .for(let period)?: age = period
      case .forever?, nil: continue
      }
      deleted += try await Self.prune(
        store: store, queue: identifier, status: status, olderThan: age, clock: clock)
    }
    return deleted
  }

  /// The most finished jobs one pruning call deletes: a batch holds SQLite's write lock for a
  /// few milliseconds.
  package static var pruneBatch: Int { 500 }

  /// Deletes in batches until a batch comes back short, yielding between batches so claims and
  /// adds get the store in between.
  package static func prune(
    store: any JobStore, queue: String, status: JobStatus, olderThan age: Duration, clock: any JobClock
  ) async throws -> Int {
    var deleted = 0
    while true {
      let batch = try await store.prune(
        queue: queue, status: status, olderThan: age, limit: pruneBatch, clock: clock)
      deleted += batch
      if batch < pruneBatch { return deleted }
      await Task.yield()
    }
  }

  /// Prunes the history every ``JobRetention/interval`` (the first pass 10 seconds after the
  /// queue starts, or sooner with a shorter interval) until cancelled; nil when the retention
  /// keeps everything forever. A failed pass is logged and tried again at the next interval.
  func pruneHistoryPeriodically() -> Task<Void, Never>? {
    let retention = configuration.retention
    guard JobStatus.finished.contains(where: { retention.period(for: $0) != .forever }) else { return nil }
    let runtime = configuration.runtime
    return Task(executorPreference: runtime.executor) { [weak self] in
      var wait = min(retention.interval, .seconds(10))
      while !Task.isCancelled {
        do { try await runtime.sleep(wait) } catch { return }
        wait = retention.interval
        guard let self else { return }
        do {
          let deleted = try await self.pruneHistory()
          if deleted > 0 { self.log(.debug, "pruned finished jobs", ["jobs": String(deleted)]) }
        } catch {
          self.log(.warning, "could not prune finished jobs; trying again in \(retention.interval): \(error)")
        }
      }
    }
  }
}
