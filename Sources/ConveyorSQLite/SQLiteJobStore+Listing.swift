import Conveyor

// Listing a queue's waiting jobs (or all its jobs) in ID order without walking the whole table,
// and without an index on (queue, id) over every status (each claim and enqueue would pay for it:
// +30% per claim, +50% per insert).
//
// Two steps, each bounded:
// 1. A window of the table in ID order from `after` (``ListingSQL/window`` rows at most): a queue
//    that holds a fair share of the rows fills its page here, reading about what it shows.
// 2. When the window ends before the page is full, the rest comes from the queue's own partial
//    indexes: the IDs of its ready, scheduled and held jobs (`jobs_ready`, `jobs_scheduled`, `jobs_held`, read
//    without touching the table) and, for all states, of its running and dead jobs (`jobs_running`,
//    `jobs_dead`, a seek each), merged in ID order; then one primary-key lookup per job shown.
//
// So a page costs at most the window plus one index entry per waiting job of that queue (what
// `counts` reads too), never the other queues' rows: a small queue beside a million other jobs
// reads a few hundred rows, not a million.

extension SQLiteJobStore {
  /// A page of the queue's jobs with status `status` (nil: any), IDs above `after`, in ID order.
  static func listPage(_ db: Connection, queue: String, status: JobStatus?, after: Int64, limit: Int) throws
    -> [JobRecord]
  {
    var records: [JobRecord] = []
    if let status, status == .completed || status == .cancelled {
      try historyPage(
        db, queue: queue, status: status, after: after, limit: limit, statement: { $0 },
        row: { records.append(try record($0)) })
      return records
    }
    if status == .running || status == .dead {
      try db.query(SQL.list(status), .text(queue), .integer(after), .integer(Int64(limit))) {
        records.append(try record($0))
      }
      return records
    }
    try db.query(
      ListingSQL.windowed(status), .text(queue), .integer(after), .integer(ListingSQL.window),
      .integer(Int64(limit))
    ) { records.append(try record($0)) }
    records.sort { $0.id < $1.id }
    if records.count >= limit { return records }
    // Where the window ended; a window shorter than its size reached the end of the table.
    var seen: (count: Int64, last: Int64) = (0, after)
    try db.query(ListingSQL.windowEnd, .integer(after), .integer(ListingSQL.window)) {
      seen = ($0.int64(0), $0.isNull(1) ? after : $0.int64(1))
    }
    if seen.count < ListingSQL.window { return records }
    var ids: [Int64] = []
    try db.query(
      ListingSQL.idsAfter(status), .text(queue), .integer(seen.last), .integer(Int64(limit - records.count))
    ) { ids.append($0.int64(0)) }
    for id in ids {
      try db.query(SQL.job, .integer(id)) { records.append(try record($0)) }
    }
    return records
  }
}

extension SQLiteJobStore {
  /// A page of completed or cancelled jobs in the order they finished, after the job `after`
  /// (from the oldest when that job is not one of them, or gone): a range of the status's index (`jobs_completed`, …)
  /// from the cursor, whatever the size of the history. `statement` may rewrite the selected
  /// columns.
  static func historyPage(
    _ db: Connection, queue: String, status: JobStatus, after: Int64, limit: Int,
    statement: (String) -> String, row: (Statement) throws -> Void
  ) throws {
    var cursor: Int64?
    try db.query(SQL.finishedAt, .integer(after), .text(SQL.stored(status)[0]), .text(queue)) {
      cursor = $0.isNull(0) ? nil : $0.int64(0)
    }
    if let cursor {
      try db.query(
        statement(SQL.history(status, after: true)), .text(queue), .integer(cursor), .integer(after),
        .integer(Int64(limit)), row: row)
    } else {
      try db.query(
        statement(SQL.history(status, after: false)), .text(queue), .integer(Int64(limit)), row: row)
    }
  }
}

/// The statements of `SQLiteJobStore+Listing.swift`.
enum ListingSQL {
  /// The most table rows the first step reads.
  static let window: Int64 = 256

  /// The filter of a listing's status (waiting: ready, scheduled or held; nil: every status).
  static func filter(_ status: JobStatus?) -> String {
    status == nil ? "" : "AND +status IN ('ready', 'scheduled', 'held')"
  }

  /// The queue's jobs among the next `window` rows of the table in ID order (the caller sorts
  /// the few rows, so SQLite needs no sorter). The window names the columns it keeps: SQLite reads
  /// every column of a subquery's rows, and `*` read those no record holds. Parameters: queue,
  /// after, window, limit.
  static func windowed(_ status: JobStatus?) -> String {
    """
    SELECT \(SQL.columns) FROM (SELECT \(SQL.columns) FROM jobs WHERE id > ?2 ORDER BY id LIMIT ?3)
    WHERE queue = ?1 \(filter(status)) LIMIT ?4
    """
  }

  /// How many rows the window held and its last ID. Parameters: after, window.
  static let windowEnd = """
    SELECT count(*), max(id) FROM (SELECT id FROM jobs WHERE id > ?1 ORDER BY id LIMIT ?2)
    """

  /// The IDs of the queue's jobs after an ID, from its partial indexes (no table row is read), in
  /// ID order. Parameters: queue, after, limit.
  static func idsAfter(_ status: JobStatus?) -> String {
    // The history's arms read the queue's part of `jobs_completed` and `jobs_cancelled` and sort it: only when the
    // window held other queues' rows.
    let statuses =
      status == nil
      ? ["ready", "scheduled", "held", "running", "dead", "completed", "cancelled"]
      : ["ready", "scheduled", "held"]
    let arms = statuses.map { "SELECT id FROM jobs WHERE queue = ?1 AND status = '\($0)' AND id > ?2" }
    return arms.joined(separator: "\nUNION ALL\n") + "\nORDER BY id LIMIT ?3"
  }
}
