import Foundation

/// A stored job as a listing shows it: its record with only the start of its payload, and the
/// payload's whole size.
///
/// A listing that needs a few fields of each payload (an HTTP job's method and URL, say) reads
/// summaries instead of records, so its memory is bounded by the page, never by the payloads: a
/// page of a hundred 64 MiB jobs reads a hundred prefixes.
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

  /// A summary of a whole record: its payload cut to its first `payloadPrefix` bytes.
  public init(cutting record: JobRecord, to payloadPrefix: Int) {
    var cut = record
    if record.payload.count > payloadPrefix {
      cut.payload = Data(record.payload.prefix(max(0, payloadPrefix)))
    }
    self.init(record: cut, payloadSize: record.payload.count)
  }

  /// The job's ID.
  public var id: JobID { record.id }

  /// Whether ``record``'s payload is the whole payload.
  public var isPayloadComplete: Bool { record.payload.count == payloadSize }
}

/// A store that reads only the start of each payload for ``JobStore/jobSummaries(queue:status:after:limit:payloadPrefix:)``
/// and ``JobStore/jobSummary(_:payloadPrefix:)``. Stores without it are served by reading whole
/// records and cutting their payloads (the in-memory store holds them already).
public protocol JobSummaryListing: JobStore {
  /// ``JobStore/jobs(queue:status:after:limit:)`` with each payload read from storage up to its
  /// first `payloadPrefix` bytes, never further.
  func readJobSummaries(queue: String, status: JobStatus?, after: JobID?, limit: Int, payloadPrefix: Int)
    async throws -> [JobSummary]

  /// ``JobStore/job(_:)`` with the payload read from storage up to its first `payloadPrefix` bytes.
  func readJobSummary(_ id: JobID, payloadPrefix: Int) async throws -> JobSummary?
}

extension JobStore {
  /// Lists jobs as ``jobs(queue:status:after:limit:)`` does (same order, same pages), each with
  /// only the first `payloadPrefix` bytes of its payload and the payload's whole size.
  ///
  /// A ``JobSummaryListing`` store (SQLite, PostgreSQL) reads only those bytes, so a page takes at
  /// most `limit × payloadPrefix` bytes of payload whatever the payloads' sizes; another store's
  /// whole records are read and their payloads cut.
  ///
  /// - Parameters:
  ///   - queue: The queue.
  ///   - status: Only jobs of this status; nil for all.
  ///   - after: Only jobs with a greater ID; nil from the first.
  ///   - limit: At most this many jobs.
  ///   - payloadPrefix: How many bytes of each payload to read; negative counts as 0.
  public func jobSummaries(queue: String, status: JobStatus?, after: JobID?, limit: Int, payloadPrefix: Int)
    async throws -> [JobSummary]
  {
    let prefix = max(0, payloadPrefix)
    if let listing = self as? any JobSummaryListing {
      return try await listing.readJobSummaries(
        queue: queue, status: status, after: after, limit: limit, payloadPrefix: prefix)
    }
    return try await jobs(queue: queue, status: status, after: after, limit: limit).map {
      JobSummary(cutting: $0, to: prefix)
    }
  }

  /// The job with this ID as ``job(_:)`` finds it, with only the first `payloadPrefix` bytes of
  /// its payload (read no further on a ``JobSummaryListing`` store), or nil.
  public func jobSummary(_ id: JobID, payloadPrefix: Int) async throws -> JobSummary? {
    let prefix = max(0, payloadPrefix)
    if let listing = self as? any JobSummaryListing {
      return try await listing.readJobSummary(id, payloadPrefix: prefix)
    }
    return try await job(id).map { JobSummary(cutting: $0, to: prefix) }
  }
}
