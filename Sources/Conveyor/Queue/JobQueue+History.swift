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
    return try await prune(status, olderThan: age)
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
      deleted += try await prune(status, olderThan: age)
    }
    return deleted
  }

  /// The most finished jobs one pruning call deletes: a batch holds SQLite's write lock for a
  /// few milliseconds.
  package static var pruneBatch: Int { 500 }

  /// Deletes in batches until a batch comes back short. After each full batch it rests as long as
  /// the batch took (at most 50 ms), so pruning takes at most about half of the store's time and a
  /// claim waits for one batch at most, however large the history.
  private func prune(_ status: JobStatus, olderThan age: Duration) async throws -> Int {
    let runtime = configuration.runtime
    var deleted = 0
    while true {
      let start = runtime.elapsed()
      let batch = try await store.prune(
        queue: identifier, status: status, olderThan: age, limit: Self.pruneBatch, clock: clock)
      deleted += batch
      if batch < Self.pruneBatch { return deleted }
      try await runtime.sleep(min(runtime.elapsed() - start, .milliseconds(50)))
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
