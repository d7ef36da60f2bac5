import Conveyor
import Foundation

// Workers' per-minute counts (the dashboard's charts) and the age of the oldest ready job.
//
// Which index each statement uses:
// - `activity` is keyed by (queue, minute): a recording upserts one row per queue and minute.
// - `activity_minute (minute)`: the dashboard's read of the last hour (one row per queue and
//   minute), and the pruning of minutes older than a day.
// - The oldest ready job: `jobs_ready (queue, priority DESC, run_at, id)` holds, for each priority
//   level, its oldest run date first; a recursive query seeks each level's first entry (a loose
//   index scan, at most ``PostgresJobStore/oldestReadyLevels`` levels), and
//   `jobs_scheduled (queue, run_at)` gives a due job not yet promoted.

extension PostgresJobStore {
  /// The most priority levels ``oldestReadyRunDate(queue:clock:)`` visits; a queue whose ready
  /// jobs have more distinct priorities gets the oldest among the highest this many levels.
  public static let oldestReadyLevels = 100

  /// Keeps activity: true.
  public var recordsActivity: Bool { true }

  /// Adds the counts to the stored minutes in one statement and deletes minutes older than
  /// `QueueActivity.retention` (`QueueActivity.retentionCutoff(recording:now:)`). A call whose
  /// connection breaks while it commits is sent again, so its counts may be added twice: the
  /// charts are a picture, not an audit.
  public func recordActivity(_ activity: [QueueActivity]) async throws {
    // By the name as it is stored (a NUL becomes U+FFFD), byte for byte, as the table's key
    // compares it (`String` takes a precomposed and a decomposed "é" for one name): two rows of
    // one key in the statement would fail it.
    var merged: [ExactText: [Date: QueueActivity]] = [:]
    for row in activity where !row.isEmpty {
      merged[ExactText(Self.storable(row.queue)), default: [:]][
        row.minute, default: QueueActivity(queue: row.queue, minute: row.minute)
      ]
      .add(row)
    }
    let rows = merged.values.flatMap(\.values)
    guard !rows.isEmpty else { return }
    let sql = self.sql
    let parameters: [PostgresValue] = [
      .textArray(rows.map { Self.storable($0.queue) }), .timestampArray(rows.map(\.minute)),
      .int64Array(rows.map(\.succeeded)), .int64Array(rows.map(\.retried)), .int64Array(rows.map(\.died)),
      .int64Array(rows.map(\.started)), .int64Array(rows.map(\.waitMillisecondsTotal)),
      .int64Array(rows.map(\.waitMillisecondsMax)), .int64Array(rows.map(\.stuck)),
      .timestamp(QueueActivity.retentionCutoff(recording: rows)),
    ]
    try await connection.perform(idempotent: true) { db in
      try db.transaction {
        try db.execute(sql.recordActivity, Array(parameters.dropLast()))
        try db.execute(sql.pruneActivity, [parameters[parameters.count - 1]])
      }
    }
  }

  /// Every queue's minutes from the one holding `since`, sorted by queue (byte for byte) and
  /// minute.
  public func activity(since: Date, limit: Int) async throws -> [QueueActivity] {
    guard limit > 0 else { return [] }
    let sql = self.sql
    let from = QueueActivity.minute(containing: since)
    return try await connection.perform(idempotent: true) { db in
      let result = try db.execute(sql.readActivity, [.timestamp(from), .int64(Int64(limit))])
      let rows = (0..<result.count).map { row in
        QueueActivity(
          queue: result.text(row, 0) ?? "", minute: result.date(row, 1) ?? from,
          succeeded: result.int64(row, 2), retried: result.int64(row, 3), died: result.int64(row, 4),
          started: result.int64(row, 5), waitMillisecondsTotal: result.int64(row, 6),
          waitMillisecondsMax: result.int64(row, 7), stuck: result.int64(row, 8))
      }
      return rows.sorted { (ExactText($0.queue), $0.minute) < (ExactText($1.queue), $1.minute) }
    }
  }

  /// The earliest run date among the queue's ready jobs (and scheduled jobs already due), as a
  /// date of `clock` (moved by the difference between it and the server's clock with
  /// ``Clock/database``).
  public func oldestReadyRunDate(queue: String, clock: any JobClock) async throws -> Date? {
    let sql = self.sql
    let now: PostgresValue = options.clock == .caller ? .timestamp(clock.now()) : .timestamp(nil)
    let (serverNow, oldest) = try await connection.perform(idempotent: true) { db in
      let row = try db.execute(sql.oldestReady, [.text(queue), now, .int64(Int64(Self.oldestReadyLevels))])
      return (row.date(0, 0), row.date(0, 1))
    }
    guard let oldest else { return nil }
    if options.clock == .database, let serverNow {
      return oldest.addingTimeInterval(clock.now().timeIntervalSince(serverNow))
    }
    return oldest
  }
}

extension SQL {
  /// Adds a batch (no queue and minute twice) to the stored minutes. Parameters: queues, minutes,
  /// succeeded, retried, died, started, total waits, longest waits, stuck handlers.
  var recordActivity: String {
    """
    INSERT INTO \(schema).activity AS a
      (queue, minute, succeeded, retried, died, started, wait_total_ms, wait_max_ms, stuck)
    SELECT * FROM unnest($1::text[], $2::timestamptz[], $3::int8[], $4::int8[], $5::int8[], $6::int8[],
      $7::int8[], $8::int8[], $9::int8[])
    ON CONFLICT (queue, minute) DO UPDATE SET
      succeeded = a.succeeded + excluded.succeeded,
      retried = a.retried + excluded.retried,
      died = a.died + excluded.died,
      started = a.started + excluded.started,
      wait_total_ms = a.wait_total_ms + excluded.wait_total_ms,
      wait_max_ms = greatest(a.wait_max_ms, excluded.wait_max_ms),
      stuck = a.stuck + excluded.stuck
    """
  }

  /// A range of `activity_minute`. Parameter: the cutoff.
  var pruneActivity: String { "DELETE FROM \(schema).activity WHERE minute < $1" }

  /// A range of `activity_minute`, newest first (a limit keeps the latest minutes); the store
  /// sorts the rows by queue and minute. Parameters: the first minute, the most rows.
  var readActivity: String {
    """
    SELECT queue, minute, succeeded, retried, died, started, wait_total_ms, wait_max_ms, stuck
    FROM \(schema).activity WHERE minute >= $1 ORDER BY minute DESC LIMIT $2
    """
  }

  /// The server's time and the earliest run date among ready jobs (one `jobs_ready` seek per
  /// priority level, at most $3 levels) and due scheduled ones (one `jobs_scheduled` seek).
  /// Parameters: queue, now, levels.
  var oldestReady: String {
    """
    WITH RECURSIVE levels (priority, run_at, n) AS (
      (SELECT priority, run_at, 1 FROM \(schema).jobs WHERE queue = $1 AND status = 'ready'
        ORDER BY priority DESC, run_at LIMIT 1)
      UNION ALL
      SELECT next.priority, next.run_at, levels.n + 1 FROM levels,
        LATERAL (SELECT priority, run_at FROM \(schema).jobs
          WHERE queue = $1 AND status = 'ready' AND priority < levels.priority
          ORDER BY priority DESC, run_at LIMIT 1) AS next
      WHERE levels.n < $3
    ), n AS (SELECT \(Self.now(2)) AS now)
    SELECT n.now, least(
      (SELECT min(run_at) FROM levels),
      (SELECT run_at FROM \(schema).jobs WHERE queue = $1 AND status = 'scheduled' AND run_at <= n.now
        ORDER BY run_at LIMIT 1))
    FROM n
    """
  }
}
