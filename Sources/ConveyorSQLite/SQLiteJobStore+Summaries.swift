import CSQLite
import Conveyor
import Foundation

// Listing jobs with the start of each payload only (`JobSummaryListing`). The rows are the pages
// `listPage` (SQLiteJobStore+Listing.swift) finds, by the same statements with the payload column
// left out: `length(payload)` comes from the record's header, so SQLite reads no payload byte for
// it. The payload's first bytes are then read with SQLite's incremental blob I/O, which reads
// those bytes (and the pages they sit on) and no more: `substr(payload, …)` would load the whole
// value first. The last error is selected as `substr(last_error, 1, n)`: SQLite loads one row's
// error at a time to cut it, and the page holds only the cut ones (an application can record an
// error of any size; a page of a hundred 2 MB errors held 200 MB).

extension SQLiteJobStore: JobSummaryListing {
  /// The page `jobs(queue:status:after:limit:)` returns, each payload read up to its first
  /// `payloadPrefix` bytes only.
  public func readJobSummaries(
    queue: String, status: JobStatus?, after: JobID?, limit: Int, payloadPrefix: Int, errorPrefix: Int
  ) async throws -> [JobSummary] {
    guard limit > 0 else { return [] }
    let after = after?.rawValue ?? Int64.min
    return try await connection.perform { db in
      try db.transaction(immediate: false) {
        try Self.summaryPage(
          db, queue: queue, status: status, after: after, limit: limit, payloadPrefix: payloadPrefix,
          errorPrefix: errorPrefix)
      }
    }
  }

  /// The job `job(_:)` finds, its payload read up to its first `payloadPrefix` bytes only and its
  /// last error up to its first `errorPrefix` Unicode scalars.
  public func readJobSummary(_ id: JobID, payloadPrefix: Int, errorPrefix: Int) async throws -> JobSummary? {
    try await connection.perform { db in
      try db.transaction(immediate: false) {
        var found: JobSummary?
        try db.query(SummarySQL.rows(SQL.job, errorPrefix: errorPrefix), .integer(id.rawValue)) {
          found = try Self.summary($0, db: db, payloadPrefix: payloadPrefix)
        }
        return found
      }
    }
  }

  /// `listPage` with summaries: the same two steps, the same statements, no payload read whole.
  static func summaryPage(
    _ db: Connection, queue: String, status: JobStatus?, after: Int64, limit: Int, payloadPrefix: Int,
    errorPrefix: Int
  ) throws -> [JobSummary] {
    var summaries: [JobSummary] = []
    func add(_ row: Statement) throws {
      summaries.append(try summary(row, db: db, payloadPrefix: payloadPrefix))
    }
    if let status, status == .completed || status == .cancelled {
      try historyPage(
        db, queue: queue, status: status, after: after, limit: limit,
        statement: { SummarySQL.rows($0, errorPrefix: errorPrefix) }, row: add)
      return summaries
    }
    if status == .running || status == .dead {
      try db.query(
        SummarySQL.rows(SQL.list(status), errorPrefix: errorPrefix), .text(queue), .integer(after),
        .integer(Int64(limit)), row: add)
      return summaries
    }
    try db.query(
      SummarySQL.windowed(status, errorPrefix: errorPrefix), .text(queue), .integer(after),
      .integer(ListingSQL.window),
      .integer(Int64(limit)), row: add)
    summaries.sort { $0.id < $1.id }
    if summaries.count >= limit { return summaries }
    var seen: (count: Int64, last: Int64) = (0, after)
    try db.query(ListingSQL.windowEnd, .integer(after), .integer(ListingSQL.window)) {
      seen = ($0.int64(0), $0.isNull(1) ? after : $0.int64(1))
    }
    if seen.count < ListingSQL.window { return summaries }
    var ids: [Int64] = []
    try db.query(
      ListingSQL.idsAfter(status), .text(queue), .integer(seen.last), .integer(Int64(limit - summaries.count))
    ) { ids.append($0.int64(0)) }
    for id in ids {
      try db.query(SummarySQL.rows(SQL.job, errorPrefix: errorPrefix), .integer(id), row: add)
    }
    return summaries
  }

  /// Decodes a row selected with ``SummarySQL/columns`` and reads its payload's first bytes.
  private static func summary(_ row: Statement, db: Connection, payloadPrefix: Int) throws -> JobSummary {
    var record = try record(row)
    let size = Int(row.int64(SummarySQL.sizeColumn))
    record.payload = try readPrefix(db, id: record.id.rawValue, count: min(size, payloadPrefix))
    return JobSummary(record: record, payloadSize: size)
  }

  /// The first `count` bytes of a job's payload, read with incremental blob I/O.
  private static func readPrefix(_ db: Connection, id: Int64, count: Int) throws -> Data {
    guard count > 0 else { return Data() }
    var blob: OpaquePointer?
    let opened = sqlite3_blob_open(db.handle, "main", "jobs", "payload", id, 0, &blob)
    defer { sqlite3_blob_close(blob) }
    guard opened == SQLITE_OK, let blob else {
      throw SQLiteError(
        code: .init(rawValue: opened),
        message: "cannot read job \(id)'s payload: "
          + String(cString: sqlite3_errmsg(db.handle)))
    }
    let length = min(count, Int(sqlite3_blob_bytes(blob)))
    var bytes = Data(count: length)
    let read = bytes.withUnsafeMutableBytes {
      sqlite3_blob_read(blob, $0.baseAddress, Int32(clamping: length), 0)
    }
    guard read == SQLITE_OK else {
      throw SQLiteError(
        code: .init(rawValue: read),
        message: "cannot read job \(id)'s payload: "
          + String(cString: sqlite3_errmsg(db.handle)))
    }
    return bytes
  }
}

/// The statements of `SQLiteJobStore+Summaries.swift`: the listing's, with the payload column
/// replaced and the last error cut.
enum SummarySQL {
  /// ``SQL/columns`` with an empty payload, the last error's first `errorPrefix` characters, no
  /// list of errors and no output (a page holds none of them), then the payload's length.
  static func columns(errorPrefix: Int) -> String {
    SQL.columns.replacingOccurrences(of: "payload,", with: "NULL,")
      .replacingOccurrences(of: "last_error,", with: "\(cutError(errorPrefix)),")
      .replacingOccurrences(of: "errors,", with: "NULL,")
      .replacingOccurrences(of: "output", with: "NULL") + ", length(payload)"
  }

  /// The last error's first `errorPrefix` characters (code points). The count is written into the
  /// statement, an integer from this code, so the statements keep their parameters; the few
  /// counts callers use make few statements. SQLite's `substr` reads its length as a 32-bit
  /// integer (a larger one wraps to a negative length): from `Int32.max` on, the error is whole.
  static func cutError(_ errorPrefix: Int) -> String {
    errorPrefix >= Int(Int32.max) ? "last_error" : "substr(last_error, 1, \(max(0, errorPrefix)))"
  }

  /// Where the payload's length is.
  static let sizeColumn: Int32 = 22

  /// `statement` (one selecting ``SQL/columns`` from `jobs`) selecting ``columns(errorPrefix:)``
  /// instead.
  static func rows(_ statement: String, errorPrefix: Int) -> String {
    statement.replacingOccurrences(of: SQL.columns, with: columns(errorPrefix: errorPrefix))
  }

  /// ``ListingSQL/windowed(_:)`` with summaries. The window names its columns, the payload's
  /// length among them and the error already cut, where the listing's takes `*`: SQLite runs the
  /// window as a subquery whose every column it reads, and `*` loaded each payload whole.
  /// Parameters: queue, after, window, limit.
  static func windowed(_ status: JobStatus?, errorPrefix: Int) -> String {
    let kept = SQL.columns.replacingOccurrences(of: "payload, ", with: "")
      .replacingOccurrences(of: "last_error,", with: "\(cutError(errorPrefix)) AS last_error,")
      .replacingOccurrences(of: "errors,", with: "NULL AS errors,")
      .replacingOccurrences(of: "output", with: "NULL AS output")
    let outer = SQL.columns.replacingOccurrences(of: "payload,", with: "NULL,") + ", payload_length"
    return """
      SELECT \(outer) FROM (
        SELECT \(kept), length(payload) AS payload_length FROM jobs WHERE id > ?2 ORDER BY id LIMIT ?3)
      WHERE queue = ?1 \(ListingSQL.filter(status)) LIMIT ?4
      """
  }
}
