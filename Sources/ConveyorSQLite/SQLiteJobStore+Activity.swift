import Conveyor
import Foundation

// Workers' per-minute counts (the dashboard's charts) and the age of the oldest ready job.
//
// Which index each statement uses:
// - `activity` is keyed by (queue, minute): a recording upserts one row per queue and minute.
// - `activity_minute (minute)`: the dashboard's read of the last hour (one row per queue and
//   minute), and the pruning of minutes older than a day.
// - The oldest ready job: `jobs_ready (queue, priority DESC, run_at, id)` holds, for each priority
//   level, its oldest run date first. One seek per level finds each level's first entry (at most
//   ``SQLiteJobStore/oldestReadyLevels`` levels), and one seek of `jobs_scheduled (queue, run_at)`
//   finds a due job not yet promoted. No statement reads more than a few index entries.

extension SQLiteJobStore {
  /// The most priority levels ``oldestReadyRunDate(queue:clock:)`` visits; a queue whose ready
  /// jobs have more distinct priorities gets the oldest among the highest this many levels.
  public static let oldestReadyLevels = 100

  /// Keeps activity: true.
  public var recordsActivity: Bool { true }

  /// Adds the counts to the stored minutes in one transaction and deletes minutes older than
  /// `QueueActivity.retention` (`QueueActivity.retentionCutoff(recording:now:)`).
  public func recordActivity(_ activity: [QueueActivity]) async throws {
    let rows = activity.filter { !$0.isEmpty }
    guard !rows.isEmpty else { return }
    let cutoff = millis(QueueActivity.retentionCutoff(recording: rows))
    try await connection.perform { db in
      try db.transaction(immediate: true) {
        for row in rows {
          try db.run(
            ActivitySQL.record, .text(row.queue), .integer(millis(row.minute)), .integer(row.succeeded),
            .integer(row.retried), .integer(row.died), .integer(row.started),
            .integer(row.waitMillisecondsTotal), .integer(row.waitMillisecondsMax), .integer(row.stuck))
        }
        try db.run(ActivitySQL.prune, .integer(cutoff))
      }
    }
  }

  /// Every queue's minutes from the one holding `since`, sorted by queue (byte for byte) and
  /// minute.
  public func activity(since: Date, limit: Int) async throws -> [QueueActivity] {
    guard limit > 0 else { return [] }
    let from = millis(QueueActivity.minute(containing: since))
    return try await connection.perform { db in
      var rows: [QueueActivity] = []
      try db.query(ActivitySQL.read, .integer(from), .integer(Int64(limit))) { row in
        rows.append(
          QueueActivity(
            queue: row.text(0) ?? "", minute: date(row.int64(1)), succeeded: row.int64(2),
            retried: row.int64(3), died: row.int64(4), started: row.int64(5),
            waitMillisecondsTotal: row.int64(6), waitMillisecondsMax: row.int64(7), stuck: row.int64(8)))
      }
      return rows.sorted { (ExactText($0.queue), $0.minute) < (ExactText($1.queue), $1.minute) }
    }
  }

  /// The earliest run date among the queue's ready jobs (and scheduled jobs already due): one
  /// seek of `jobs_ready` per priority level, one of `jobs_scheduled`.
  public func oldestReadyRunDate(queue: String, clock: any JobClock) async throws -> Date? {
    try await connection.perform { db in
      try db.transaction(immediate: false) {
        let now = millis(clock.now())
        var oldest: Int64?
        var level: Int64?
        for _ in 0..<Self.oldestReadyLevels {
          var found: (priority: Int64, runAt: Int64)?
          if let above = level {
            try db.query(ActivitySQL.firstReadyBelow, .text(queue), .integer(above)) {
              found = ($0.int64(0), $0.int64(1))
            }
          } else {
            try db.query(ActivitySQL.firstReady, .text(queue)) { found = ($0.int64(0), $0.int64(1)) }
          }
          guard let found else { break }
          oldest = min(oldest ?? found.runAt, found.runAt)
          level = found.priority
        }
        if let due = try db.scalar(SQL.nextScheduled, .text(queue)), due <= now {
          oldest = min(oldest ?? due, due)
        }
        return oldest.map(date)
      }
    }
  }
}

/// The statements of `SQLiteJobStore+Activity.swift`.
enum ActivitySQL {
  /// Parameters: queue, minute, succeeded, retried, died, started, total wait, longest wait, stuck.
  static let record = """
    INSERT INTO activity (queue, minute, succeeded, retried, died, started, wait_total_ms, wait_max_ms, stuck)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (queue, minute) DO UPDATE SET
      succeeded = activity.succeeded + excluded.succeeded,
      retried = activity.retried + excluded.retried,
      died = activity.died + excluded.died,
      started = activity.started + excluded.started,
      wait_total_ms = activity.wait_total_ms + excluded.wait_total_ms,
      wait_max_ms = max(activity.wait_max_ms, excluded.wait_max_ms),
      stuck = activity.stuck + excluded.stuck
    """
  /// A range of `activity_minute`.
  static let prune = "DELETE FROM activity WHERE minute < ?"
  /// A range of `activity_minute`, newest first (a limit keeps the latest minutes); the caller
  /// sorts the rows by queue and minute.
  static let read = """
    SELECT queue, minute, succeeded, retried, died, started, wait_total_ms, wait_max_ms, stuck
    FROM activity WHERE minute >= ? ORDER BY minute DESC LIMIT ?
    """
  /// The first entry of `jobs_ready`: the highest priority level's oldest run date.
  static let firstReady = """
    SELECT priority, run_at FROM jobs WHERE queue = ? AND status = 'ready'
    ORDER BY priority DESC, coalesce(turn, run_at) LIMIT 1
    """
  /// The first entry of the next lower priority level.
  static let firstReadyBelow = """
    SELECT priority, run_at FROM jobs WHERE queue = ? AND status = 'ready' AND priority < ?
    ORDER BY priority DESC, coalesce(turn, run_at) LIMIT 1
    """
}
