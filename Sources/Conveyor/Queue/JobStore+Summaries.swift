import Foundation

/// A stored job as a listing shows it: its record with only the start of its payload (and, if
/// asked, of its last error), and the payload's whole size.
///
/// A listing that needs a few fields of each payload (an HTTP job's method and URL, say) reads
/// summaries instead of records, so its memory is bounded by the page, never by the payloads or
/// the errors: a page of a hundred 64 MiB jobs reads a hundred prefixes.
public struct JobSummary: Sendable, Hashable, Identifiable {
  /// The job's record; its `payload` holds the payload's first bytes only (as many as asked for,
  /// or fewer when the payload is shorter).
  public var record: JobRecord
  /// The size of the whole payload, in bytes.
  public var payloadSize: Int

  /// Creates a summary.
  public init(record: JobRecord, payloadSize: Int) {
    self.record = record
    self.payloadSize = payloadSize
  }

  /// A summary of a whole record: its payload cut to its first `payloadPrefix` bytes, its last
  /// error to its first `errorPrefix` Unicode scalars (``errorPrefix(_:_:)``), and without its
  /// list of errors and its output (read those with `JobStore.job(_:)`).
  public init(cutting record: JobRecord, to payloadPrefix: Int, errorPrefix: Int = .max) {
    var cut = record
    if record.payload.count > payloadPrefix {
      cut.payload = Data(record.payload.prefix(max(0, payloadPrefix)))
    }
    cut.lastError = record.lastError.map { Self.errorPrefix($0, errorPrefix) }
    // A summary holds the last error only: no list of errors, no output.
    cut.errors = []
    cut.output = nil
    self.init(record: cut, payloadSize: record.payload.count)
  }

  /// The first `count` Unicode scalars of `error` (none for a negative count): what every store
  /// reads of a last error for a summary (SQLite's `substr` and PostgreSQL's `left` count
  /// characters as code points). Each scalar is at most 4 bytes in UTF-8, so the prefix is at most
  /// `4 × count` bytes, whatever the error holds.
  public static func errorPrefix(_ error: String, _ count: Int) -> String {
    guard count < error.unicodeScalars.count else { return error }
    return String(String.UnicodeScalarView(error.unicodeScalars.prefix(max(0, count))))
  }

  /// The job's ID.
  public var id: JobID { record.id }

  /// Whether ``record``'s payload is the whole payload.
  public var isPayloadComplete: Bool { record.payload.count == payloadSize }
}

/// A store that reads only the start of each payload (and of each last error) for
/// ``JobStore/jobSummaries(queue:status:after:limit:payloadPrefix:errorPrefix:)`` and
/// ``JobStore/jobSummary(_:payloadPrefix:errorPrefix:)``. Stores without it are served by reading
/// whole records and cutting them (the in-memory store holds them already).
public protocol JobSummaryListing: JobStore {
  /// ``JobStore/jobs(queue:status:after:limit:)`` with each payload read from storage up to its
  /// first `payloadPrefix` bytes, never further, and each last error to its first `errorPrefix`
  /// Unicode scalars (``JobSummary/errorPrefix(_:_:)``).
  func readJobSummaries(
    queue: String, status: JobStatus?, after: JobID?, limit: Int, payloadPrefix: Int, errorPrefix: Int
  ) async throws -> [JobSummary]

  /// ``JobStore/job(_:)`` with the payload read from storage up to its first `payloadPrefix` bytes
  /// and the last error to its first `errorPrefix` Unicode scalars.
  func readJobSummary(_ id: JobID, payloadPrefix: Int, errorPrefix: Int) async throws -> JobSummary?
}

extension JobStore {
  /// Lists jobs as ``jobs(queue:status:after:limit:)`` does (same order, same pages), each with
  /// only the first `payloadPrefix` bytes of its payload and the payload's whole size, and only
  /// the first `errorPrefix` Unicode scalars of its last error.
  ///
  /// A ``JobSummaryListing`` store (SQLite, PostgreSQL) reads only those bytes, so a page takes at
  /// most `limit × (payloadPrefix + 4 × errorPrefix)` bytes whatever the payloads' and errors'
  /// sizes; another store's whole records are read and cut. To learn whether an error was cut,
  /// ask for one scalar more than is shown.
  ///
  /// - Parameters:
  ///   - queue: The queue.
  ///   - status: Only jobs of this status; nil for all.
  ///   - after: Only jobs with a greater ID; nil from the first.
  ///   - limit: At most this many jobs.
  ///   - payloadPrefix: How many bytes of each payload to read; negative counts as 0.
  ///   - errorPrefix: How many Unicode scalars of each last error to read (whole errors by
  ///     default); negative counts as 0.
  public func jobSummaries(
    queue: String, status: JobStatus?, after: JobID?, limit: Int, payloadPrefix: Int, errorPrefix: Int = .max
  ) async throws -> [JobSummary] {
    let prefix = max(0, payloadPrefix)
    let errorPrefix = max(0, errorPrefix)
    if let listing = self as? any JobSummaryListing {
      return try await listing.readJobSummaries(
        queue: queue, status: status, after: after, limit: limit, payloadPrefix: prefix,
        errorPrefix: errorPrefix)
    }
    return try await jobs(queue: queue, status: status, after: after, limit: limit).map {
      JobSummary(cutting: $0, to: prefix, errorPrefix: errorPrefix)
    }
  }

  /// The job with this ID as ``job(_:)`` finds it, with only the first `payloadPrefix` bytes of
  /// its payload and the first `errorPrefix` Unicode scalars of its last error (read no further
  /// on a ``JobSummaryListing`` store), or nil.
  public func jobSummary(_ id: JobID, payloadPrefix: Int, errorPrefix: Int = .max) async throws -> JobSummary?
  {
    let prefix = max(0, payloadPrefix)
    let errorPrefix = max(0, errorPrefix)
    if let listing = self as? any JobSummaryListing {
      return try await listing.readJobSummary(id, payloadPrefix: prefix, errorPrefix: errorPrefix)
    }
    return try await job(id).map { JobSummary(cutting: $0, to: prefix, errorPrefix: errorPrefix) }
  }
}
