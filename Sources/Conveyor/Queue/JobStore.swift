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
/// A job waits (`pending`), runs (`running`), and finishes `completed`, `cancelled` or `dead`.
/// Finished jobs are kept as history for their queue's ``JobRetention``, then pruned.
public enum JobStatus: String, Sendable, Codable, CaseIterable, Hashable {
  /// Waiting to run: ready when its run date has come, scheduled before that.
  case pending
  /// Claimed by a worker that holds a lease on it.
  case running
  /// Failed for good (attempts exhausted, discarded, or undecodable); kept until re-queued,
  /// purged, or pruned by its retention.
  case dead
  /// Handled: the handler returned ``JobResult/handled``. Kept as history until pruned.
  case completed
  /// Cancelled before it finished (``JobStore/cancel(_:queue:clock:)``). Kept as history until pruned.
  case cancelled

  /// Whether a job with this status is finished (completed, cancelled or dead): it never runs
  /// again unless a dead one is re-queued.
  public var isFinished: Bool { self == .dead || self == .completed || self == .cancelled }

  /// The statuses of finished jobs, which history keeps: completed, cancelled, dead.
  public static let finished: [JobStatus] = [.completed, .cancelled, .dead]
}

/// When a new job may first run.
public enum RunTime: Sendable, Hashable {
  /// As soon as a worker is free.
  case now
  /// This long after the store commits the job, measured by the store's clock while it holds its
  /// lock (a database server's own clock for a shared store).
  case after(Duration)
  /// Not before this date.
  case at(Date)
}

/// A job to insert into a store.
public struct NewJob: Sendable, Hashable {
  /// The encoded item.
  public var payload: Data
  /// Higher runs first among ready jobs. Default 0.
  public var priority: Int
  /// When the job may first run.
  public var runTime: RunTime
  /// When set, the job is not inserted while another *waiting* job (ready or scheduled, not
  /// running) in the same queue has the same key; the waiting job's ID is returned instead. A job
  /// that is already running may have read old data, so a new job with its key is stored and runs
  /// after it. Keys are compared byte for byte (a precomposed and a decomposed "é" are two keys).
  /// PostgreSQL refuses a key that, with its queue name, takes more than about 2,700 bytes in its
  /// index (after compression): keep keys short, or pass a hash of a long one.
  public var deduplicationKey: String?
  /// Which jobs of ``deduplicationKey`` stop this one from being stored. Default
  /// ``DeduplicationScope/waiting`` (above). Ignored without a key.
  public var deduplicationScope: DeduplicationScope = .waiting
  /// What to do with the existing job of ``deduplicationKey`` within the scope: keep it
  /// (``DeduplicationConflict/useExisting``, the default) or, while it waits, give it this job's
  /// payload, priority, run time and time limit (``DeduplicationConflict/replace``). Ignored
  /// without a key.
  public var onConflict: DeduplicationConflict = .useExisting
  /// The longest one attempt of this job may run, overriding the queue's
  /// ``JobQueueConfiguration/timeLimit``; nil: the queue's. Stored in whole milliseconds (a
  /// limit under 1 ms is stored as 1 ms); ``JobQueue`` checks it is between 1 ms and
  /// ``JobQueueConfiguration/longestTimeLimit`` before it reaches a store.
  public var timeLimit: Duration?
  /// When set, the job runs only after every earlier job of its queue with the same key has
  /// finished, one at a time, in the order they were added (see <doc:OrderingKeys>). Until then
  /// it is *held* (``JobRecord/isHeld``): waiting, but not claimable. A key is 1 to
  /// ``OrderingKey/maximumBytes`` UTF-8 bytes without NUL, compared byte for byte; stores refuse
  /// other keys with ``JobQueueError/invalidOrderingKey(_:)``.
  public var orderingKey: String?
  /// The key whose concurrency limit binds this job (``QueueLimits/keyConcurrency``, and
  /// ``QueueLimits/keyConcurrencyOverrides``): while as many jobs of the key run as its limit
  /// allows, a claim that reaches this job holds it (``JobRecord/isHeldByLimit``) until one of
  /// them stops running (see <doc:ConcurrencyLimits>). Nil: only the queue's limits bind it. A
  /// key follows ``LimitKey``'s rules; stores refuse others with
  /// ``JobQueueError/invalidLimitKey(_:)``.
  public var limitKey: String?
  /// The key whose turn the job takes among the queue's ready jobs of its priority (fair shares,
  /// see <doc:ConcurrencyLimits>): each key's jobs take turns with the other keys', so one key's
  /// backlog delays the others' jobs by at most one job of the key in turn. Nil: the job keeps
  /// its place by run date. A key follows ``FairnessKey``'s rules; stores refuse others, and a job
  /// that also has an ordering key, with ``JobQueueError/invalidFairnessKey(_:)``. A job replaced
  /// by a duplicate (``DeduplicationConflict/replace``) keeps its fairness key, as its ordering
  /// key.
  public var fairnessKey: String?

  /// Describes a job to insert.
  public init(
    payload: Data, priority: Int = 0, runTime: RunTime = .now, deduplicationKey: String? = nil,
    deduplicationScope: DeduplicationScope = .waiting, onConflict: DeduplicationConflict = .useExisting,
    timeLimit: Duration? = nil, orderingKey: String? = nil, limitKey: String? = nil,
    fairnessKey: String? = nil
  ) {
    self.limitKey = limitKey
    self.fairnessKey = fairnessKey
    self.payload = payload
    self.priority = priority
    self.runTime = runTime
    self.deduplicationKey = deduplicationKey
    self.deduplicationScope = deduplicationScope
    self.onConflict = onConflict
    self.timeLimit = timeLimit
    self.orderingKey = orderingKey
  }

  /// Whether this job has a key with a scope or a conflict choice other than the defaults: the
  /// stores take it one at a time, by ``deduplicationScope`` and ``onConflict``.
  package var hasDeduplicationOptions: Bool {
    deduplicationKey != nil && (deduplicationScope != .waiting || onConflict != .useExisting)
  }

  /// Describes a job to insert that runs at a date.
  public init(
    payload: Data, priority: Int = 0, runAt: Date, deduplicationKey: String? = nil,
    timeLimit: Duration? = nil,
    orderingKey: String? = nil, limitKey: String? = nil, fairnessKey: String? = nil
  ) {
    self.init(
      payload: payload, priority: priority, runTime: .at(runAt), deduplicationKey: deduplicationKey,
      timeLimit: timeLimit, orderingKey: orderingKey, limitKey: limitKey, fairnessKey: fairnessKey)
  }

  /// ``timeLimit`` as the stores keep it: whole milliseconds, at least 1; nil when unset.
  package var timeLimitMilliseconds: Int64? {
    timeLimit.map { max(1, JobStoreTime.milliseconds($0)) }
  }
}

/// The outcome of inserting one ``NewJob``.
public struct EnqueueResult: Sendable, Hashable {
  /// The new job's ID, or the ID of the existing job with the same deduplication key.
  public var id: JobID
  /// What the add did: stored a new job, found an existing one of the key, or replaced a
  /// waiting one's payload and run time.
  public var outcome: EnqueueOutcome

  /// Whether a new job was stored (``outcome`` is ``EnqueueOutcome/inserted``).
  public var inserted: Bool { outcome == .inserted }

  /// Creates a result.
  public init(id: JobID, outcome: EnqueueOutcome) {
    self.id = id
    self.outcome = outcome
  }

  /// Creates a result: inserted, or an existing job's ID.
  public init(id: JobID, inserted: Bool) {
    self.init(id: id, outcome: inserted ? .inserted : .existing)
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
  /// How many times the job was handed to a handler (counted when claimed; a claim given back
  /// unused, or interrupted by a shutdown, does not count).
  public var attempts: Int
  /// The earliest date the job may run. A claim leaves it as it was, so a job given back or
  /// rescued keeps its place in the order.
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
  /// How many times the job has been claimed; never lowered. For a running job it identifies the
  /// current claim (see ``claim``): an outcome or heartbeat applies only to that claim.
  public var claimToken: Int64
  /// The job's own time limit (``NewJob/timeLimit``); nil: the queue's applies.
  public var timeLimit: Duration?
  /// For a finished job (completed, cancelled or dead), when it finished, by the store's clock.
  public var finishedAt: Date?
  /// The errors of the job's failed attempts, oldest first: each retry's and the final one's
  /// (``JobHistory/maximumErrors`` kept at most, the latest; each cut to
  /// ``JobHistory/maximumErrorBytes``).
  public var errors: [String]
  /// How long the handler of the job's latest recorded attempt ran; nil before one is recorded.
  public var runDuration: Duration?
  /// For a completed job, the output its handler returned (``JobResult/handled(output:)``),
  /// encoded as JSON; nil when it returned none.
  public var output: Data?
  /// The job's ordering key (``NewJob/orderingKey``), if any.
  public var orderingKey: String?
  /// Whether the job waits behind an earlier unfinished (or dead) job of its ordering key: its
  /// status is ``JobStatus/pending`` but no worker may claim it until the jobs before it finish.
  public var isHeld: Bool
  /// The job's limit key (``NewJob/limitKey``), if any.
  public var limitKey: String?
  /// Whether the job is held because its limit key's concurrency limit was reached when a claim
  /// reached it (``isHeld`` is then true too): it becomes claimable again when a running job of
  /// its key stops running, or when the queue's limits are set again.
  public var isHeldByLimit: Bool
  /// The job's fairness key (``NewJob/fairnessKey``), if any.
  public var fairnessKey: String?

  /// Creates a record.
  public init(
    id: JobID, queue: String, payload: Data, status: JobStatus, priority: Int, attempts: Int,
    runAt: Date, createdAt: Date, lastError: String? = nil, deduplicationKey: String? = nil,
    leaseOwner: String? = nil, leaseExpiresAt: Date? = nil, claimToken: Int64 = 0, timeLimit: Duration? = nil,
    finishedAt: Date? = nil, errors: [String] = [], runDuration: Duration? = nil, output: Data? = nil,
    orderingKey: String? = nil, isHeld: Bool = false, limitKey: String? = nil, isHeldByLimit: Bool = false,
    fairnessKey: String? = nil
  ) {
    self.limitKey = limitKey
    self.fairnessKey = fairnessKey
    self.isHeldByLimit = isHeldByLimit
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
    self.claimToken = claimToken
    self.timeLimit = timeLimit
    self.finishedAt = finishedAt
    self.errors = errors
    self.runDuration = runDuration
    self.output = output
    self.orderingKey = orderingKey
    self.isHeld = isHeld
  }

  /// The claim this record describes: the job and its ``claimToken``.
  public var claim: ClaimReference { ClaimReference(id: id, token: claimToken) }
}

/// Names one claim of one job: the fencing token every outcome and heartbeat carries.
///
/// Each claim of a job gets a new token. A worker whose lease lapsed, and whose job was then
/// handed out again (even to the same worker), holds an old token: its outcome and heartbeats are
/// refused, so they can never settle the newer claim.
public struct ClaimReference: Sendable, Hashable, CustomStringConvertible {
  /// The job.
  public var id: JobID
  /// The claim's token (``JobRecord/claimToken`` when it was claimed).
  public var token: Int64

  /// Creates a reference.
  public init(id: JobID, token: Int64) {
    self.id = id
    self.token = token
  }

  /// `id#token`.
  public var description: String { "\(id)#\(token)" }
}

/// What a worker asks for when it claims or heartbeats: who it is and how long a lease lasts.
///
/// The store computes each expiry from its own clock while it holds its lock, so the time spent
/// waiting for the lock never shortens a lease (and a lease is never committed already expired).
public struct Lease: Sendable, Hashable {
  /// Identifies the worker (unique per process and queue instance); shown in listings.
  public var owner: String
  /// How long a claim or heartbeat keeps the job, from the moment the store commits it.
  public var duration: Duration

  /// Creates a lease request.
  public init(owner: String, duration: Duration) {
    self.owner = owner
    self.duration = duration
  }
}

/// What a worker reports for a job it holds.
///
/// A settlement applies only while its claim is current: the job is running under the same
/// ``ClaimReference/token``. A job whose lease ran out and was claimed again, or that was removed,
/// is left alone and its claim is reported in ``ClaimBatch/staleSettlements``.
public struct JobSettlement: Sendable, Hashable {
  /// What to do with the job.
  public enum Action: Sendable, Hashable {
    /// Handled: the job becomes ``JobStatus/completed`` (or is deleted, when
    /// ``JobSettlement/keepsHistory`` is false).
    case complete
    /// Put the job back as waiting, to run after `delay` (from the store's clock while it holds
    /// its lock), recording the error if any.
    case retry(after: Duration, error: String?)
    /// Mark the job dead with the given reason (or delete it, when ``JobSettlement/keepsHistory``
    /// is false).
    case kill(error: String)
    /// Give the job back: ready again in its old place, its attempt count lowered by the one its
    /// claim added. For a job claimed but never started, and for a handler interrupted by a
    /// shutdown (the attempt was not the job's fault), with `error` recorded when given.
    case release(error: String?)
  }

  /// The claim settled.
  public var claim: ClaimReference
  /// What to do.
  public var action: Action
  /// How long the handler ran this attempt, stored as the job's ``JobRecord/runDuration``; nil
  /// when no handler ran (the stored value is kept).
  public var runDuration: Duration?
  /// For ``Action/complete``, the handler's encoded output (at most
  /// ``JobHistory/maximumOutputBytes``), stored as ``JobRecord/output``.
  public var output: Data?
  /// Whether a job that finishes by this settlement (completed or dead) is kept as history;
  /// false deletes it (the queue's ``JobRetention`` keeps none of that status).
  public var keepsHistory: Bool
  /// For ``Action/kill(error:)`` of a job in its ordering key's line: whether the dead job leaves
  /// its key (its ``JobRecord/orderingKey`` is cleared) and the next job of the key may run, as
  /// ``DeadHeadPolicy/releasesKey`` asks. False (the default) keeps the key held by the dead job.
  /// Ignored for other actions. A store written before this flag keeps the key held.
  public var releasesOrderingKey = false
  /// Whether the claimed record had an ordering key: a hint a store may use to pick the statement
  /// it tries first. A store's outcome never depends on it.
  package var ordered = false

  /// The job settled.
  public var id: JobID { claim.id }

  /// Creates a settlement.
  public init(
    claim: ClaimReference, action: Action, runDuration: Duration? = nil, output: Data? = nil,
    keepsHistory: Bool = true
  ) {
    self.claim = claim
    self.action = action
    self.runDuration = runDuration
    self.output = output
    self.keepsHistory = keepsHistory
  }
}

/// The result of ``JobStore/settleAndClaim(_:queue:limit:lease:clock:)``.
public struct ClaimBatch: Sendable, Hashable {
  /// Jobs now held under the lease, in claim order (priority descending, run date, ID).
  public var claimed: [JobRecord]
  /// Settlements that did not apply because their claim was no longer current.
  public var staleSettlements: [ClaimReference]
  /// Whether the queue's stored pause flag was set (in which case nothing was claimed).
  public var paused: Bool
  /// Whether the queue's running jobs filled its ``QueueLimits/concurrency`` when the claim
  /// ended: another claim would take nothing until a place frees, and a queue does not try
  /// before its next poll unless one of its own jobs settles. False for a store that keeps no
  /// limits, and when the call claimed nothing because it was asked for nothing.
  public var full: Bool
  /// The run date the store gave each job it rescheduled with ``JobSettlement/Action/retry(after:error:)``.
  public var retryDates: [JobID: Date]
  /// When the queue's ``QueueLimits/rate`` gives its next start, when the claim left it none (it
  /// took the last, or found none): a queue does not claim again before then (or its next poll),
  /// unless one of its own jobs settles. Nil when a start is left, when the claim was asked for
  /// nothing or stopped before the rate (paused, full), and for a store that keeps no rate.
  public var nextStart: Date?

  /// Creates a batch.
  public init(
    claimed: [JobRecord], staleSettlements: [ClaimReference] = [], paused: Bool = false,
    retryDates: [JobID: Date] = [:], full: Bool = false, nextStart: Date? = nil
  ) {
    self.claimed = claimed
    self.staleSettlements = staleSettlements
    self.paused = paused
    self.retryDates = retryDates
    self.full = full
    self.nextStart = nextStart
  }
}

/// How many jobs of one limit key (``NewJob/limitKey``) run, and how many a claim held because the
/// key was at its limit (``JobRecord/isHeldByLimit``): a row of ``JobStore/limitKeyUsage(queue:limit:)``.
public struct LimitKeyUsage: Sendable, Hashable, Codable {
  /// The limit key.
  public var key: String
  /// The key's running jobs (lapsed leases not yet rescued among them).
  public var running: Int
  /// The key's jobs held for its limit.
  public var held: Int

  /// Creates a row.
  public init(key: String, running: Int, held: Int) {
    self.key = key
    self.running = running
    self.held = held
  }

  /// The order of ``JobStore/limitKeyUsage(queue:limit:)``: most held first, then most running,
  /// then the keys' bytes.
  package static func precedes(_ a: Self, _ b: Self) -> Bool {
    if a.held != b.held { return a.held > b.held }
    if a.running != b.running { return a.running > b.running }
    return a.key.utf8.lexicographicallyPrecedes(b.key.utf8)
  }
}

/// How many jobs a queue holds, by status.
public struct JobCounts: Sendable, Hashable, Codable {
  /// Waiting jobs whose run date has come.
  public var ready: Int
  /// Waiting jobs whose run date is later (a delay or a retry).
  public var scheduled: Int
  /// Jobs held by a worker.
  public var running: Int
  /// Dead jobs.
  public var dead: Int
  /// Completed jobs kept as history.
  public var completed: Int
  /// Cancelled jobs kept as history.
  public var cancelled: Int
  /// Waiting jobs held behind an earlier job of their ordering key (``JobRecord/isHeld``),
  /// counted in neither ``ready`` nor ``scheduled``.
  public var held: Int

  /// Creates counts.
  public init(
    ready: Int = 0, scheduled: Int = 0, running: Int = 0, dead: Int = 0, completed: Int = 0,
    cancelled: Int = 0, held: Int = 0
  ) {
    self.ready = ready
    self.scheduled = scheduled
    self.running = running
    self.dead = dead
    self.completed = completed
    self.cancelled = cancelled
    self.held = held
  }

  /// Decodes counts; the history's counts are 0 when absent (counts encoded before they existed).
  public init(from decoder: any Decoder) throws {
    let container = try decoder.container(keyedBy: CodingKeys.self)
    ready = try container.decode(Int.self, forKey: .ready)
    scheduled = try container.decode(Int.self, forKey: .scheduled)
    running = try container.decode(Int.self, forKey: .running)
    dead = try container.decode(Int.self, forKey: .dead)
    completed = try container.decodeIfPresent(Int.self, forKey: .completed) ?? 0
    cancelled = try container.decodeIfPresent(Int.self, forKey: .cancelled) ?? 0
    held = try container.decodeIfPresent(Int.self, forKey: .held) ?? 0
  }

  /// Jobs still to be handled: ready, scheduled, held and running.
  public var unfinished: Int { ready + scheduled + held + running }
  /// Jobs not handled: unfinished and dead (what the queue holds besides its history of
  /// completed and cancelled jobs).
  public var total: Int { unfinished + dead }
  /// Finished jobs kept: completed, cancelled and dead.
  public var finished: Int { completed + cancelled + dead }
}

/// How many jobs of some statuses a queue holds, and the highest of their IDs (nil: none), as
/// ``JobStore/tally(queue:statuses:)`` reads them.
public struct JobTally: Sendable, Hashable {
  /// How many jobs.
  public var count: Int
  /// The highest of their IDs.
  public var highestID: JobID?

  /// Creates a tally.
  public init(count: Int, highestID: JobID?) {
    self.count = count
    self.highestID = highestID
  }
}

/// When a queue next needs a worker, as ``JobStore/nextWake(queue:clock:)`` reports it.
public struct WakeHint: Sendable, Hashable {
  /// The earliest run date of a waiting job (in the past when one is ready), or nil.
  public var nextRun: Date?
  /// The earliest lease expiry of a running job, or nil.
  public var nextLeaseExpiry: Date?
  /// Whether the queue's stored pause flag is set.
  public var paused: Bool
  /// The earliest ``StoredSchedule/nextDue`` of the queue's schedules that fire, or nil: when
  /// the queue should call ``JobStore/fireDueSchedules(queue:clock:)``. Schedules do not keep a
  /// queue from being finished.
  public var nextScheduleDue: Date?

  /// Creates a hint.
  public init(
    nextRun: Date? = nil, nextLeaseExpiry: Date? = nil, paused: Bool = false, nextScheduleDue: Date? = nil
  ) {
    self.nextRun = nextRun
    self.nextLeaseExpiry = nextLeaseExpiry
    self.paused = paused
    self.nextScheduleDue = nextScheduleDue
  }

  /// True when the queue holds no waiting and no running job: it is finished.
  public var isFinished: Bool { nextRun == nil && nextLeaseExpiry == nil }
}

/// Durable storage for job queues.
///
/// A store holds any number of queues, each named by its identifier. Methods that need the time
/// take the queue's ``JobClock`` and read it while they hold the store's lock, so a call that
/// waited for the lock never commits a lease or run date computed before the wait. A store with a
/// clock of its own (a database server) may use that instead, for every worker alike. Every store
/// must pass the shared conformance suite (`ConveyorTestSupport.JobStoreConformance`).
///
/// Methods that change jobs are atomic: when one throws, nothing it was asked to change changed.
///
/// A waiting job is *ready* once its run date has come and *scheduled* before that; ready jobs are
/// handed out by priority (higher first), then run date, then place, then ID. A job's place is
/// kept when it is released or rescued; a job retried straight into the ready state (a retry with
/// no delay) takes a place behind every ready job of its priority and run date, so it runs after
/// every job that was ready when it was retried, and jobs retried one after another run in that
/// order. Run dates come from the clock: after the wall clock is stepped back, a job retried with
/// no delay has an earlier run date than the jobs added before the step, and goes before them.
public protocol JobStore: Sendable {
  /// Commits new jobs to a queue in one transaction, in order.
  ///
  /// Returns one result per job, in the same order. A job whose deduplication key matches a job
  /// of the queue within its ``NewJob/deduplicationScope`` (by default a waiting, not running,
  /// one), or an earlier job of the same batch, is not inserted; with
  /// ``DeduplicationConflict/replace`` a waiting match takes its payload, priority, run time and
  /// time limit instead. Jobs are taken in order, so a later job of the batch sees what an
  /// earlier one did.
  func enqueue(_ jobs: [NewJob], queue: String, clock: any JobClock) async throws -> [EnqueueResult]

  /// Applies settlements, then claims up to `limit` ready jobs under `lease`, in one transaction.
  ///
  /// Each claimed job becomes running with its attempt count and ``JobRecord/claimToken`` raised
  /// by one and its lease ending `lease.duration` after the store's clock reading under its lock;
  /// its run date is kept. A paused queue applies the settlements but claims nothing and reports
  /// ``ClaimBatch/paused``. Under a stored ``QueueLimits/concurrency`` it claims no more than
  /// the places left (the limit less the queue's running jobs, counted after the settlements).
  /// `limit` may be 0.
  func settleAndClaim(
    _ settlements: [JobSettlement], queue: String, limit: Int, lease: Lease, clock: any JobClock
  ) async throws -> ClaimBatch

  /// Extends the leases of the given claims to `lease.duration` from now; returns the claims that
  /// are still current (the others lapsed, were claimed again, settled or removed).
  func heartbeat(_ claims: [ClaimReference], queue: String, lease: Lease, clock: any JobClock)
    async throws -> [ClaimReference]

  /// Replaces the payload of a job running under `claim`: a checkpoint its handler resumes from
  /// when the job runs again (after a crash, a lapsed lease, a retry or a release). Returns false,
  /// writing nothing, when the claim is no longer current (the job was settled, claimed again,
  /// cancelled or removed): a worker whose lease lapsed cannot overwrite the next claim's
  /// progress. A lapsed lease nobody rescued yet is still the claim's, as for ``heartbeat(_:queue:lease:clock:)``.
  ///
  /// The payload must still decode as the queue's item type. Durable workflows store their
  /// history this way (see <doc:Workflows>).
  func checkpoint(_ claim: ClaimReference, payload: Data, queue: String) async throws -> Bool

  /// Whether ``checkpoint(_:payload:queue:)`` keeps checkpoints (a ``WorkflowQueue`` refuses a
  /// store that does not).
  var keepsCheckpoints: Bool { get }

  /// Makes running jobs whose lease ran out (expiry at or before now) ready again, in their old
  /// place; returns how many. Their attempt count stays: the attempt was made by a worker that
  /// vanished.
  func rescueExpiredLeases(queue: String, clock: any JobClock) async throws -> Int

  /// Counts the queue's jobs by status.
  func counts(queue: String, clock: any JobClock) async throws -> JobCounts

  /// Lists jobs a page at a time, at most `limit`, filtered by status when `status` is not nil.
  /// Never reads more than the page from storage.
  ///
  /// Pages of ``JobStatus/completed`` and ``JobStatus/cancelled`` jobs are in the order the jobs
  /// finished (``JobRecord/finishedAt``, then ID), from the one after the job `after` names;
  /// other pages are in ID order, from the first ID greater than `after`. Either way, pass the
  /// last job of the previous page as `after`. (A history page whose `after` job was pruned
  /// meanwhile starts again from the oldest kept.)
  func jobs(queue: String, status: JobStatus?, after: JobID?, limit: Int) async throws -> [JobRecord]

  /// The job with this ID, of whatever queue, or nil: one primary-key lookup.
  func job(_ id: JobID) async throws -> JobRecord?

  /// Deletes the given jobs whatever their status; returns how many existed.
  func remove(_ ids: [JobID], queue: String) async throws -> Int

  /// Deletes every job of the queue whose status is in `statuses`; returns how many.
  func clear(queue: String, statuses: Set<JobStatus>) async throws -> Int

  /// Cancels jobs that have not finished, in one transaction: each waiting or running job among
  /// `ids` (of `queue`, or of any queue when nil) becomes ``JobStatus/cancelled`` with its
  /// finishing time, so it never runs again and a running one's outcome is refused. A finished
  /// job is left as it is. Returns one result per ID, in order (an ID given twice is cancelled
  /// once; the second answer is ``CancelResult/alreadyCancelled``).
  ///
  /// A running job's worker learns it at its next ``currentClaims(_:queue:)`` check or heartbeat,
  /// and cancels the handler's task; sooner with a store that announces cancellations
  /// (``cancellations(queue:)``), which announces only the cancels that commit.
  func cancel(_ ids: [JobID], queue: String?, clock: any JobClock) async throws -> [CancelResult]

  /// Of `claims`, those still current for `queue`: the job is running under that claim token,
  /// whatever its lease says. Reads only. A queue asks about its claims twice a second while it
  /// holds any (and at once on a ``cancellations(queue:)`` notice about one of them), and cancels
  /// the handlers of claims that are no longer current (cancelled,
  /// removed, or handed to another worker after their lease lapsed). Default: every claim (the
  /// store cannot tell; handlers then learn nothing before their heartbeat).
  func currentClaims(_ claims: [ClaimReference], queue: String) async throws -> [ClaimReference]

  /// How many of the queue's jobs have a status in `statuses`, and the highest of their IDs, read
  /// in one snapshot: what an operator confirms before ``clear(queue:statuses:through:expecting:)``.
  func tally(queue: String, statuses: Set<JobStatus>) async throws -> JobTally

  /// Deletes the queue's jobs whose status is in `statuses` and whose ID is at most `through`, in
  /// one transaction, only when exactly `expected` such jobs are there; returns how many were
  /// deleted, or nil when their number differs (then nothing is deleted).
  ///
  /// With a ``JobTally`` read before, it deletes exactly the jobs counted, or nothing: a job added
  /// since has a higher ID, and a job that started or came back since changes the number.
  func clear(queue: String, statuses: Set<JobStatus>, through: JobID, expecting expected: Int) async throws
    -> Int?

  /// Deletes up to `limit` of the queue's finished jobs with status `status` that finished more
  /// than `age` ago by the store's clock (zero: all of them), oldest first, in one short
  /// transaction; returns how many. Call it again while it returns `limit`: each call holds the
  /// store's write lock only for its batch. Safe while other processes prune the same queue.
  /// Returns 0 for an unfinished status (`pending`, `running`), which is never pruned.
  func prune(queue: String, status: JobStatus, olderThan age: Duration, limit: Int, clock: any JobClock)
    async throws -> Int

  /// Makes dead jobs ready again, now, attempts reset to zero; `ids` nil means every dead job of
  /// the queue. Returns how many. Jobs that are not dead are left alone.
  ///
  /// A dead job whose deduplication key a waiting job holds stays dead: re-queueing it would
  /// queue the same work twice. Of dead jobs sharing a key, the oldest (lowest ID) is re-queued
  /// and the others stay dead.
  func requeueDead(_ ids: [JobID]?, queue: String, clock: any JobClock) async throws -> Int

  /// Stores whether the queue is paused; every worker on the store obeys it.
  func setPaused(_ paused: Bool, queue: String) async throws

  /// Whether the queue is paused.
  func isPaused(queue: String) async throws -> Bool

  /// The limits stored with the queue (empty when none were set).
  func limits(queue: String) async throws -> QueueLimits

  /// Replaces the queue's stored limits; every worker on the store obeys them from its next
  /// claim. A store that keeps limits enforces them in ``settleAndClaim(_:queue:limit:lease:clock:)``:
  /// a claim never takes the queue's running jobs past ``QueueLimits/concurrency``, counted inside
  /// the claim's transaction. Limits with a ``QueueLimits/problem`` throw
  /// ``JobQueueError/invalidLimits(_:)`` and leave the stored ones as they were.
  func setLimits(_ limits: QueueLimits, queue: String) async throws

  /// Whether the store keeps and enforces ``QueueLimits/rate``: its claims take no more starts
  /// than the rate gives, and report ``ClaimBatch/nextStart``. ``JobQueue/setLimits(_:)`` refuses
  /// a rate for a store that does not. Default false (a store written before rates existed).
  var keepsRateLimits: Bool { get }

  /// Whether the store keeps and enforces limits per key (``QueueLimits/keyConcurrency``,
  /// ``QueueLimits/keyConcurrencyOverrides``) and stores each job's ``NewJob/limitKey``: a claim
  /// never takes the running jobs of a limit key past its limit, counted inside the claim's
  /// transaction, and holds the jobs it reaches of a key at its limit (``JobRecord/isHeldByLimit``)
  /// until a job of the key stops running or the limits are set again. ``JobQueue`` refuses limit
  /// keys and limits per key for a store that does not. Default false.
  var keepsKeyLimits: Bool { get }

  /// Whether the store keeps each job's ``NewJob/fairnessKey`` and claims by fair shares: within
  /// a priority, a job with a fairness key takes its key's next turn when it becomes ready (added,
  /// retried or promoted), the later of one millisecond after its key's previous turn and the place
  /// of the first job of its priority that is ready or held by its limit key (with none: the later
  /// of the job's run date and the latest turn any key of the queue took); a job without one keeps
  /// its run date as its place. `FairTurns` states the rule in full. ``JobQueue`` refuses fairness
  /// keys for a store that does not. Default false.
  var keepsFairShares: Bool { get }

  /// The queue's limit keys that have running jobs or jobs held for their key's limit, with those
  /// counts: most held first, then most running, then by the keys' bytes; at most `limit` keys.
  /// Keys are told apart byte for byte, as claims tell them. It reads every running job with a
  /// limit key and every held one (two index ranges on SQLite and PostgreSQL): about as long as
  /// ``counts(queue:clock:)`` takes for as many jobs. Default: none (a store that keeps no limits per
  /// key holds no job for one).
  func limitKeyUsage(queue: String, limit: Int) async throws -> [LimitKeyUsage]

  /// When something in the queue will next need a worker: the earliest waiting run date and the
  /// earliest lease expiry, as dates of `clock` (both nil when the queue holds neither a waiting
  /// nor a running job), and the stored pause flag. While the queue's running jobs fill its
  /// ``QueueLimits/concurrency``, no waiting job needs a worker: the run date is nil. While its
  /// ``QueueLimits/rate`` gives no start, the run date is no earlier than the next start.
  func nextWake(queue: String, clock: any JobClock) async throws -> WakeHint

  /// The names of queues that hold jobs, a stored pause flag or stored ``QueueLimits``, sorted.
  func queueNames() async throws -> [String]

  /// The longest a call may wait for a lock held by another connection before it fails (SQLite's
  /// busy timeout). A queue's lease must be longer, or a worker blocked on the lock could lose a
  /// job it is still running. Default zero.
  var maximumLockWait: Duration { get }

  /// The setting a user changes to change ``maximumLockWait`` (such as
  /// `SQLiteJobStore.Options.busyTimeout`), named in the error that refuses a lease too short for
  /// it. Default: "the store's maximum lock wait".
  var maximumLockWaitSetting: String { get }

  /// Suspends until the store learns that `queue` may have new work (a job added, the queue
  /// resumed), or `timeout` passes, or the task is cancelled; returns whether it learned of work.
  ///
  /// A queue's loop calls this repeatedly while it runs and wakes up when it returns true, so a
  /// store that hears of other processes' changes (PostgreSQL's `LISTEN`) makes idle workers
  /// start new jobs at once. Polling remains the fallback. The default hears of nothing: it
  /// sleeps for `timeout` and returns false.
  func waitForWork(queue: String, timeout: Duration) async -> Bool

  /// The store's announcements that running jobs of `queue` were cancelled, from this process or
  /// any other (PostgreSQL's `NOTIFY`), or nil when the store announces none (the default).
  ///
  /// A running queue subscribes once, while it runs: on each notice it asks
  /// ``currentClaims(_:queue:)`` about the claims it holds among the notice's jobs (all of them
  /// when the notice names none), and cancels the handlers of claims no longer current, without
  /// waiting for its next periodic check. Nothing is read when no notice names a job it holds.
  /// The periodic check stays the fallback for a notice that never comes (a lost connection, a
  /// full buffer), so a store may drop notices, but must announce only cancels that committed.
  /// Ending the iteration (cancelling the task that iterates) ends the subscription.
  func cancellations(queue: String) -> AsyncStream<CancellationNotice>?

  /// Whether the store keeps ``QueueActivity`` (``recordActivity(_:)`` stores it). Queues count
  /// activity only for a store that keeps it. Default false.
  var recordsActivity: Bool { get }

  /// Adds workers' per-minute counts to what the store holds for the same queue and minute (sums,
  /// and the larger maximum wait), and deletes minutes older than ``QueueActivity/retention``.
  /// Queues call it every few seconds and when they stop, never per job. Default: nothing.
  func recordActivity(_ activity: [QueueActivity]) async throws

  /// Every queue's stored activity of the minutes from the one holding `since` on, sorted by
  /// queue and then minute: the latest `limit` rows when there are more (one range of an index on
  /// the minute, so a read of the last hour costs one row per queue and minute). Default: none.
  func activity(since: Date, limit: Int) async throws -> [QueueActivity]

  /// The run date of the queue's ready job that has waited longest (the earliest run date among
  /// jobs whose run date has come and that no worker holds), as a date of `clock`; nil when none is
  /// ready or the store cannot tell without reading every ready job. Default nil.
  func oldestReadyRunDate(queue: String, clock: any JobClock) async throws -> Date?

  /// Stores `schedules` for `queue` in one transaction, each new one counting its slots from the
  /// clock's now and each stored one keeping its last slot, with the jobs of the slots a changed
  /// schedule had due (see ``ScheduleBook`` for the rules).
  /// With ``ScheduleOrigin/declared``, `schedules` is the whole of what the code declares: the
  /// queue's other declared schedules become inactive. Default: throws
  /// ``ScheduleError/unsupported(_:)``.
  func saveSchedules(
    _ schedules: [ScheduleDefinition], queue: String, origin: ScheduleOrigin, clock: any JobClock
  )
    async throws -> ScheduleSaveSummary

  /// The schedules of `queue`, or of every queue when nil, sorted by queue and name. Default: none.
  func schedules(queue: String?) async throws -> [StoredSchedule]

  /// Pauses or resumes the schedule `name` of `queue` in one transaction, with the jobs of the
  /// slots a pause finds due (see ``StoredSchedule/pausing(_:now:)``). Returns those jobs (none
  /// for a resume); nil when there is no schedule of that name. Default: nil.
  func changeSchedulePause(_ paused: Bool, name: String, queue: String, clock: any JobClock) async throws
    -> [JobID]?

  /// Deletes the schedule `name` of `queue` (the jobs it added stay); false when there is none.
  /// Default: false.
  func removeSchedule(name: String, queue: String) async throws -> Bool

  /// Fires the queue's schedules that are due by the clock: for each, in one transaction with the
  /// jobs it adds, advances its last slot (``StoredSchedule/firing(now:)``), so that however many
  /// processes call this at once each slot's job is added once. A schedule the store cannot read
  /// back (a row written by a newer release, say) is not fired and no longer due, rather than
  /// failing the call. Default: nothing fired, nothing due.
  func fireDueSchedules(queue: String, clock: any JobClock) async throws -> ScheduleFiring
}

extension JobStore {
  /// No lock waits: zero.
  public var maximumLockWait: Duration { .zero }

  /// "the store's maximum lock wait".
  public var maximumLockWaitSetting: String { "the store's maximum lock wait" }

  /// Hears of nothing: sleeps for `timeout` (or until cancelled) and returns false.
  public func waitForWork(queue: String, timeout: Duration) async -> Bool {
    try? await Task.sleep(for: max(timeout, .milliseconds(1)))
    return false
  }

  /// Announces nothing: nil (queues rely on their periodic check of their claims).
  public func cancellations(queue: String) -> AsyncStream<CancellationNotice>? { nil }

  /// Keeps no activity: false.
  public var recordsActivity: Bool { false }

  /// Keeps nothing.
  public func recordActivity(_ activity: [QueueActivity]) async throws {}

  /// Keeps nothing: none.
  public func activity(since: Date, limit: Int) async throws -> [QueueActivity] { [] }

  /// Keeps no limits: none.
  public func limits(queue: String) async throws -> QueueLimits { QueueLimits() }

  /// Keeps no rate limits: false.
  public var keepsRateLimits: Bool { false }

  /// Keeps no limits per key: false.
  public var keepsKeyLimits: Bool { false }

  /// Keeps no fairness keys.
  public var keepsFairShares: Bool { false }

  /// Keeps no checkpoints: false.
  public var keepsCheckpoints: Bool { false }

  /// Keeps no checkpoints: throws ``JobQueueError/checkpointsUnsupported``.
  public func checkpoint(_ claim: ClaimReference, payload: Data, queue: String) async throws -> Bool {
    throw JobQueueError.checkpointsUnsupported
  }

  /// Keeps no limits per key: none.
  public func limitKeyUsage(queue: String, limit: Int) async throws -> [LimitKeyUsage] { [] }

  /// Keeps no limits: throws ``JobQueueError/invalidLimits(_:)``.
  public func setLimits(_ limits: QueueLimits, queue: String) async throws {
    throw JobQueueError.invalidLimits(
      "\(type(of: self)) keeps no limits; use a store that does (in-memory, SQLite, PostgreSQL)")
  }

  /// Cannot tell: nil.
  public func oldestReadyRunDate(queue: String, clock: any JobClock) async throws -> Date? { nil }

  /// Keeps no schedules: throws ``ScheduleError/unsupported(_:)``.
  public func saveSchedules(
    _ schedules: [ScheduleDefinition], queue: String, origin: ScheduleOrigin, clock: any JobClock
  ) async throws -> ScheduleSaveSummary {
    throw ScheduleError.unsupported(
      "\(type(of: self)) keeps no schedules; use a store that does (SQLite, PostgreSQL)")
  }

  /// Keeps no schedules: none.
  public func schedules(queue: String?) async throws -> [StoredSchedule] { [] }

  /// Keeps no schedules: nil.
  public func changeSchedulePause(_ paused: Bool, name: String, queue: String, clock: any JobClock)
    async throws -> [JobID]?
  { nil }

  /// Pauses or resumes the schedule `name` of `queue` (see
  /// ``changeSchedulePause(_:name:queue:clock:)``); false when there is none.
  public func setSchedulePaused(_ paused: Bool, name: String, queue: String, clock: any JobClock) async throws
    -> Bool
  {
    try await changeSchedulePause(paused, name: name, queue: queue, clock: clock) != nil
  }

  /// Keeps no schedules: false.
  public func removeSchedule(name: String, queue: String) async throws -> Bool { false }

  /// Keeps no schedules: nothing fired, nothing due.
  public func fireDueSchedules(queue: String, clock: any JobClock) async throws -> ScheduleFiring {
    ScheduleFiring(added: [], nextDue: nil)
  }

  /// Cannot tell: every claim.
  public func currentClaims(_ claims: [ClaimReference], queue: String) async throws -> [ClaimReference] {
    claims
  }
}

/// A store's announcement that running jobs of a queue were cancelled
/// (``JobStore/cancellations(queue:)``).
public struct CancellationNotice: Sendable, Hashable {
  /// The running jobs cancelled, or nil when the notice does not name them (too many for one
  /// notice, or the store may have missed some, as after a reconnect): a queue then checks every
  /// claim it holds.
  public var jobs: Set<JobID>?

  /// A notice naming `jobs`, or naming none (nil).
  public init(jobs: Set<JobID>?) {
    self.jobs = jobs
  }

  /// Whether the notice may concern the job: it names it, or names none.
  public func concerns(_ job: JobID) -> Bool { jobs?.contains(job) ?? true }
}

/// What ``JobStore/cancel(_:queue:clock:)`` did with one job.
public enum CancelResult: String, Sendable, Hashable, Codable {
  /// The job was waiting (ready or scheduled); it is cancelled and will never run.
  case cancelledWaiting
  /// The job was running; it is cancelled. Its worker cancels the handler's task when it next
  /// checks its claims (within about a second; at once when the store announces cancellations,
  /// as PostgreSQL does), ignores the handler's outcome, and the job is not retried.
  case cancelledRunning
  /// The job is dead, so already finished; nothing changed. Delete it with `remove` or `purge`.
  case alreadyDead
  /// The job already completed; nothing changed.
  case alreadyCompleted
  /// The job was already cancelled; nothing changed.
  case alreadyCancelled
  /// No such job (of the queue given): it was removed or pruned, or never existed. Nothing
  /// changed.
  case notFound

  /// Whether this call cancelled the job.
  public var cancelled: Bool { self == .cancelledWaiting || self == .cancelledRunning }
}

/// Conversions every store uses, so all of them round and clamp times the same way.
public enum JobStoreTime {
  /// The latest date a store keeps: the end of year 9999. Later dates (and infinity) are clamped.
  public static let latest = Date(timeIntervalSince1970: 253_402_300_799)
  /// The earliest date a store keeps: the start of year 1. Earlier dates are clamped.
  public static let earliest = Date(timeIntervalSince1970: -62_135_596_800)
  /// The longest delay a store applies: 100 years. Longer ones are clamped.
  public static let longestDelay = Duration.seconds(100 * 365 * 86_400)

  /// Whole milliseconds since 1970, rounded to the nearest and clamped to
  /// ``earliest``...``latest``; NaN becomes 1970-01-01.
  public static func milliseconds(_ date: Date) -> Int64 {
    let seconds = date.timeIntervalSince1970
    guard seconds.isFinite else {
      return seconds.isNaN ? 0 : milliseconds(seconds > 0 ? latest : earliest)
    }
    let clamped = min(max(seconds, earliest.timeIntervalSince1970), latest.timeIntervalSince1970)
    return Int64((clamped * 1000).rounded())
  }

  /// The date `milliseconds` after 1970.
  public static func date(milliseconds: Int64) -> Date {
    Date(timeIntervalSince1970: Double(milliseconds) / 1000)
  }

  /// `date` rounded to whole milliseconds and clamped as stores keep it.
  public static func normalized(_ date: Date) -> Date {
    Self.date(milliseconds: milliseconds(date))
  }

  /// ``normalized(_:)``, but never later than `date`: the whole millisecond at or before it.
  /// Every store judges a schedule's slots by it (saving, pausing, resuming and firing), so a slot
  /// (a whole millisecond) is never fired up to half a millisecond before its time, nor taken as
  /// passed at a save or a resume just before it, as rounding did.
  public static func normalizedDown(_ date: Date) -> Date {
    let rounded = normalized(date)
    return rounded > date ? Self.date(milliseconds: milliseconds(rounded) - 1) : rounded
  }

  /// A duration in whole milliseconds, clamped to 0...``longestDelay``.
  public static func milliseconds(_ duration: Duration) -> Int64 {
    let clamped = min(max(duration, .zero), longestDelay)
    let (seconds, attoseconds) = clamped.components
    return seconds * 1000 + attoseconds / 1_000_000_000_000_000
  }

  /// A stored time limit (``NewJob/timeLimitMilliseconds``) as a duration; nil for none, and for
  /// a value no store writes (zero or negative: the queue's limit applies).
  package static func timeLimit(milliseconds: Int64?) -> Duration? {
    guard let milliseconds, milliseconds > 0 else { return nil }
    return .milliseconds(milliseconds)
  }

  /// A duration in seconds to whole milliseconds, as messages say it: "30 s", "0.25 s".
  package static func secondsText(_ duration: Duration) -> String {
    let milliseconds = milliseconds(duration)
    if milliseconds % 1000 == 0 { return "\(milliseconds / 1000) s" }
    return "\(Double(milliseconds) / 1000) s"
  }

  /// `date` moved by `duration` (clamped to 0...``longestDelay``), rounded to whole milliseconds.
  public static func date(_ date: Date, adding duration: Duration) -> Date {
    let base = milliseconds(date)
    return Self.date(milliseconds: min(base &+ milliseconds(duration), milliseconds(latest)))
  }
}
