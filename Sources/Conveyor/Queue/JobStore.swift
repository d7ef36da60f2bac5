import Foundation

/// Identifies a stored job.
///
/// A store assigns IDs when it commits a job. They are unique within one store and increase in
/// insertion order, so sorting by ID is sorting by arrival.
public struct JobID: RawRepresentable, Hashable, Comparable, Sendable, Codable, CustomStringConvertible {
  /// The store's integer key for the job.
  public var rawValue: Int64

  /// Wraps a store key.
  public init(rawValue: Int64) { self.rawValue = rawValue }

  /// Wraps a store key.
  public init(_ rawValue: Int64) { self.rawValue = rawValue }

  /// The key as decimal digits.
  public var description: String { String(rawValue) }

  /// Orders by insertion.
  public static func < (lhs: JobID, rhs: JobID) -> Bool { lhs.rawValue < rhs.rawValue }

  /// Decodes the bare integer.
  public init(from decoder: any Decoder) throws {
    rawValue = try decoder.singleValueContainer().decode(Int64.self)
  }

  /// Encodes the bare integer.
  public func encode(to encoder: any Encoder) throws {
    var container = encoder.singleValueContainer()
    try container.encode(rawValue)
  }
}

/// Where a stored job is in its life.
///
/// Handled jobs are deleted, so there is no "done" status: a job is waiting, being worked on, or
/// dead and kept for inspection.
public enum JobStatus: String, Sendable, Codable, CaseIterable, Hashable {
  /// Waiting to run: ready when its run date has come, scheduled before that.
  case pending
  /// Claimed by a worker that holds a lease on it.
  case running
  /// Failed for good (attempts exhausted, discarded, or undecodable); kept until re-queued or purged.
  case dead
}

/// A job to insert into a store.
public struct NewJob: Sendable, Hashable {
  /// The encoded item.
  public var payload: Data
  /// Higher runs first among ready jobs. Default 0.
  public var priority: Int
  /// The job is not handed out before this date.
  public var runAt: Date
  /// When set, the job is not inserted while another pending or running job in the same queue has
  /// the same key; the existing job's ID is returned instead.
  public var deduplicationKey: String?

  /// Describes a job to insert.
  public init(payload: Data, priority: Int = 0, runAt: Date, deduplicationKey: String? = nil) {
    self.payload = payload
    self.priority = priority
    self.runAt = runAt
    self.deduplicationKey = deduplicationKey
  }
}

/// The outcome of inserting one ``NewJob``.
public struct EnqueueResult: Sendable, Hashable {
  /// The new job's ID, or the ID of the pending or running job with the same deduplication key.
  public var id: JobID
  /// `false` when a job with the same deduplication key was already waiting or running.
  public var inserted: Bool

  /// Creates a result.
  public init(id: JobID, inserted: Bool) {
    self.id = id
    self.inserted = inserted
  }
}

/// A stored job as a store reports it.
public struct JobRecord: Sendable, Hashable, Identifiable {
  /// The job's ID.
  public var id: JobID
  /// The queue the job belongs to.
  public var queue: String
  /// The encoded item.
  public var payload: Data
  /// Where the job is in its life.
  public var status: JobStatus
  /// Higher runs first among ready jobs.
  public var priority: Int
  /// How many times the job was handed to a handler (counted when claimed).
  public var attempts: Int
  /// The earliest date the job may run (for a running job: when it was claimed).
  public var runAt: Date
  /// When the job was first committed.
  public var createdAt: Date
  /// The last error recorded for the job: a thrown error, a retry reason, a decode failure.
  public var lastError: String?
  /// The job's deduplication key, if any.
  public var deduplicationKey: String?
  /// For a running job, the worker holding it.
  public var leaseOwner: String?
  /// For a running job, when the lease runs out unless it is heartbeated.
  public var leaseExpiresAt: Date?

  /// Creates a record.
  public init(
    id: JobID, queue: String, payload: Data, status: JobStatus, priority: Int, attempts: Int,
    runAt: Date, createdAt: Date, lastError: String? = nil, deduplicationKey: String? = nil,
    leaseOwner: String? = nil, leaseExpiresAt: Date? = nil
  ) {
    self.id = id
    self.queue = queue
    self.payload = payload
    self.status = status
    self.priority = priority
    self.attempts = attempts
    self.runAt = runAt
    self.createdAt = createdAt
    self.lastError = lastError
    self.deduplicationKey = deduplicationKey
    self.leaseOwner = leaseOwner
    self.leaseExpiresAt = leaseExpiresAt
  }
}

/// A worker's claim on jobs: who holds them and until when.
public struct Lease: Sendable, Hashable {
  /// Identifies the worker (unique per process and queue instance).
  public var owner: String
  /// The lease ends at this date unless heartbeated.
  public var expiresAt: Date

  /// Creates a lease.
  public init(owner: String, expiresAt: Date) {
    self.owner = owner
    self.expiresAt = expiresAt
  }
}

/// What a worker reports for a job it holds.
///
/// A settlement applies only while `owner` still holds the job's lease. A job whose lease ran out
/// and was handed to another worker, or that was removed meanwhile, is left alone and its ID is
/// reported in ``ClaimBatch/staleSettlements``.
public struct JobSettlement: Sendable, Hashable {
  /// What to do with the job.
  public enum Action: Sendable, Hashable {
    /// Handled: delete the job.
    case complete
    /// Put the job back as pending, to run at the given date, recording the error if any.
    case retry(at: Date, error: String?)
    /// Mark the job dead with the given reason.
    case kill(error: String)
    /// Give the job back untouched (it was claimed but never handed to a handler): pending again,
    /// its attempt count lowered by the one its claim added.
    case release
  }

  /// The job settled.
  public var id: JobID
  /// The worker that holds the job.
  public var owner: String
  /// What to do.
  public var action: Action

  /// Creates a settlement.
  public init(id: JobID, owner: String, action: Action) {
    self.id = id
    self.owner = owner
    self.action = action
  }
}

/// The result of ``JobStore/settleAndClaim(_:queue:limit:lease:now:)``.
public struct ClaimBatch: Sendable, Hashable {
  /// Jobs now held under the lease, in claim order (priority descending, run date, ID).
  public var claimed: [JobRecord]
  /// Settlements that did not apply because the worker no longer held the job.
  public var staleSettlements: [JobID]
  /// Whether the queue's stored pause flag was set (in which case nothing was claimed).
  public var paused: Bool

  /// Creates a batch.
  public init(claimed: [JobRecord], staleSettlements: [JobID] = [], paused: Bool = false) {
    self.claimed = claimed
    self.staleSettlements = staleSettlements
    self.paused = paused
  }
}

/// How many jobs a queue holds, by status.
public struct JobCounts: Sendable, Hashable, Codable {
  /// Pending jobs whose run date has come.
  public var ready: Int
  /// Pending jobs waiting for a later run date (a delay or a retry).
  public var scheduled: Int
  /// Jobs held by a worker.
  public var running: Int
  /// Dead jobs.
  public var dead: Int

  /// Creates counts.
  public init(ready: Int = 0, scheduled: Int = 0, running: Int = 0, dead: Int = 0) {
    self.ready = ready
    self.scheduled = scheduled
    self.running = running
    self.dead = dead
  }

  /// Jobs still to be handled: ready, scheduled and running.
  public var unfinished: Int { ready + scheduled + running }
  /// Every job the queue holds.
  public var total: Int { unfinished + dead }
}

/// Durable storage for job queues.
///
/// A store holds any number of queues, each named by its identifier. Every method takes the
/// current date from its caller (the queue's clock), so stores and tests agree on time. Every
/// store must pass the shared conformance suite (`ConveyorTestSupport.JobStoreConformance`).
///
/// Methods that change jobs are atomic: when one throws, nothing it was asked to change changed.
public protocol JobStore: Sendable {
  /// Commits new jobs to a queue in one transaction, in order.
  ///
  /// Returns one result per job, in the same order. A job whose deduplication key matches a
  /// pending or running job of the queue (or an earlier job of the same batch) is not inserted.
  func enqueue(_ jobs: [NewJob], queue: String, now: Date) async throws -> [EnqueueResult]

  /// Applies settlements, then claims up to `limit` ready jobs under `lease`, in one transaction.
  ///
  /// Claiming picks pending jobs with `runAt <= now`, highest priority first, then earliest run
  /// date, then lowest ID; each claimed job has its attempt count raised by one and becomes
  /// running. A paused queue applies the settlements but claims nothing and reports
  /// ``ClaimBatch/paused``. `limit` may be 0.
  func settleAndClaim(
    _ settlements: [JobSettlement], queue: String, limit: Int, lease: Lease, now: Date
  ) async throws -> ClaimBatch

  /// Extends the lease on jobs `lease.owner` holds; returns the IDs it still holds.
  func heartbeat(_ ids: [JobID], queue: String, lease: Lease) async throws -> [JobID]

  /// Returns running jobs whose lease ran out before `now` to pending, ready at once; returns how
  /// many. Their attempt count stays (the attempt was made).
  func rescueExpiredLeases(queue: String, now: Date) async throws -> Int

  /// Counts the queue's jobs by status.
  func counts(queue: String, now: Date) async throws -> JobCounts

  /// Lists jobs in ID order, a page at a time: those with IDs greater than `after`, at most `limit`,
  /// filtered by status when `status` is not nil.
  func jobs(queue: String, status: JobStatus?, after: JobID?, limit: Int) async throws -> [JobRecord]

  /// Deletes the given jobs whatever their status; returns how many existed.
  func remove(_ ids: [JobID], queue: String) async throws -> Int

  /// Deletes every job of the queue whose status is in `statuses`; returns how many.
  func clear(queue: String, statuses: Set<JobStatus>) async throws -> Int

  /// Makes dead jobs pending again, ready at `now`, attempts reset to zero; `ids` nil means every
  /// dead job of the queue. Returns how many. Jobs that are not dead are left alone.
  ///
  /// A dead job whose deduplication key a pending or running job holds stays dead: re-queueing it
  /// would run the same work twice. Of dead jobs sharing a key, the oldest (lowest ID) is
  /// re-queued and the others stay dead.
  func requeueDead(_ ids: [JobID]?, queue: String, now: Date) async throws -> Int

  /// Stores whether the queue is paused; every worker on the store obeys it.
  func setPaused(_ paused: Bool, queue: String) async throws

  /// Whether the queue is paused.
  func isPaused(queue: String) async throws -> Bool

  /// The earliest date something will need a worker: the earliest pending run date, or the
  /// earliest lease expiry of a running job. Nil when the queue holds neither.
  func nextWakeDate(queue: String) async throws -> Date?

  /// The names of queues that hold jobs or a stored pause flag, sorted.
  func queueNames() async throws -> [String]
}
