import Conveyor
import Foundation

// Listing jobs with the start of each payload only (`JobSummaryListing`): the listing's
// statements with `substring(payload FROM 1 FOR n)` and `octet_length(payload)` for the payload,
// so the server sends at most n bytes of each (and reads no more of a payload stored
// uncompressed out of line), and `left(last_error, m)` for the last error, so that it sends at
// most m characters of each error whatever an application recorded.

extension PostgresJobStore: JobSummaryListing {
  /// The page `jobs(queue:status:after:limit:)` returns, each payload sent up to its first
  /// `payloadPrefix` bytes only.
  public func readJobSummaries(
    queue: String, status: JobStatus?, after: JobID?, limit: Int, payloadPrefix: Int, errorPrefix: Int
  ) async throws -> [JobSummary] {
    guard limit > 0 else { return [] }
    if let status, status == .completed || status == .cancelled {
      let text = SummarySQL.history(sql.history(Self.stored(status)[0]))
      let parameters: [PostgresValue] = [
        .text(queue), .int64(after?.rawValue ?? 0), .int64(Int64(limit)),
        .int64(Int64(min(max(payloadPrefix, 0), Int(Int32.max)))),
        .int64(Int64(min(max(errorPrefix, 0), Int(Int32.max)))),
      ]
      return try await connection.perform(idempotent: true) { db in
        let rows = try db.execute(text, parameters, prepared: false)
        return try (0..<rows.count).map { try Self.summary(rows, $0) }
      }
    }
    let text = SummarySQL.list(sql.schema)
    let statuses: PostgresValue = status.map { .textArray(Self.stored($0)) } ?? .null(oid: 1009)
    let parameters: [PostgresValue] = [
      .text(queue), .int64(after?.rawValue ?? Int64.min), .int64(Int64(limit)), statuses,
      .int64(Int64(min(max(payloadPrefix, 0), Int(Int32.max)))),
      .int64(Int64(min(max(errorPrefix, 0), Int(Int32.max)))),
    ]
    return try await connection.perform(idempotent: true) { db in
      // Not prepared, as the listing is not.
      let rows = try db.execute(text, parameters, prepared: false)
      return try (0..<rows.count).map { try Self.summary(rows, $0) }
    }
  }

  /// The job `job(_:)` finds, its payload sent up to its first `payloadPrefix` bytes only and its
  /// last error up to its first `errorPrefix` characters.
  public func readJobSummary(_ id: JobID, payloadPrefix: Int, errorPrefix: Int) async throws -> JobSummary? {
    let text = SummarySQL.job(sql.schema)
    let parameters: [PostgresValue] = [
      .int64(id.rawValue), .int64(Int64(min(max(payloadPrefix, 0), Int(Int32.max)))),
      .int64(Int64(min(max(errorPrefix, 0), Int(Int32.max)))),
    ]
    return try await connection.perform(idempotent: true) { db in
      let rows = try db.execute(text, parameters, prepared: false)
      return rows.count > 0 ? try Self.summary(rows, 0) : nil
    }
  }

  private static func summary(_ rows: QueryResult, _ row: Int) throws -> JobSummary {
    JobSummary(
      record: try record(rows, row), payloadSize: Int(clamping: rows.int64(row, SummarySQL.sizeColumn)))
  }
}

/// The statements of `PostgresJobStore+Summaries.swift`.
enum SummarySQL {
  /// ``SQL/columns`` with the payload's first `$n` bytes for the payload, the last error's
  /// first `$m` characters for the error, and no list of errors or output (a page holds neither),
  /// then the payload's size.
  static func columns(prefixParameter: Int, errorParameter: Int) -> String {
    SQL.columns.replacingOccurrences(
      of: "payload,", with: "substring(payload FROM 1 FOR $\(prefixParameter)::integer) AS payload,"
    )
    .replacingOccurrences(
      of: "last_error,", with: "left(last_error, $\(errorParameter)::integer) AS last_error,"
    )
    .replacingOccurrences(of: "errors,", with: "NULL::text AS errors,")
    .replacingOccurrences(of: "output", with: "NULL::bytea AS output")
      + ", octet_length(payload)::bigint AS payload_size"
  }

  /// Where the payload's size is.
  static let sizeColumn = 22

  /// `SQL.list` with summaries. Parameters: queue, after, limit, statuses, payload prefix, error
  /// prefix.
  static func list(_ schema: String) -> String {
    """
    SELECT \(SQL.columns("page")), page.payload_size FROM
      unnest(coalesce($4::text[], ARRAY['ready', 'scheduled', 'held', 'running', 'dead', 'completed', 'cancelled']))
        AS wanted (status)
      CROSS JOIN LATERAL (
        SELECT \(columns(prefixParameter: 5, errorParameter: 6)) FROM \(schema).jobs
        WHERE queue = $1 AND status = wanted.status AND id > $2
        ORDER BY id LIMIT $3
      ) AS page
    ORDER BY page.id LIMIT $3
    """
  }

  /// `SQL.history` (`statement`) with summaries. Parameters: queue, after, limit, payload
  /// prefix, error prefix.
  static func history(_ statement: String) -> String {
    statement.replacingOccurrences(
      of: "SELECT \(SQL.columns) FROM", with: "SELECT \(columns(prefixParameter: 4, errorParameter: 5)) FROM")
  }

  /// `SQL.job` with a summary. Parameters: id, payload prefix, error prefix.
  static func job(_ schema: String) -> String {
    "SELECT \(columns(prefixParameter: 2, errorParameter: 3)) FROM \(schema).jobs WHERE id = $1"
  }
}
