import Foundation

/// How a ``JobQueue`` behaves: a `Sendable` struct of settings with defaults.
///
/// ```swift
/// var configuration = JobQueueConfiguration(identifier: "api-requests")
/// configuration.concurrency = 4
/// configuration.retryPolicy = .exponential(initial: .seconds(2), maximum: .seconds(120))
/// configuration.maxAttempts = 8
/// ```
public struct JobQueueConfiguration: Sendable {
  /// The queue's name in its store: 1–128 characters of `A-Z a-z 0-9 . _ -`.
  public var identifier: String
  /// The delay before a failed job runs again. Default: 15 seconds, fixed.
  public var retryPolicy: RetryPolicy
  /// Attempts after which a failing job is dead (kept, inspectable, re-queueable). Nil: unlimited.
  ///
  /// A claim counts an attempt when it is made; a claim given back unstarted (a shutdown, a job
  /// claimed ahead that could not start in time, a claim answered too late to start) gives it
  /// back. A claim whose lease lapsed before its worker gave it back, and that another worker
  /// then rescued, stays counted: the store cannot tell it from a worker that crashed while
  /// running the job. So a job can lose an attempt it never ran when its worker stalls past its
  /// lease; with `maxAttempts` 1 it is then dead without having run.
  public var maxAttempts: Int?
  /// Jobs handled at once by this queue instance. 1 (the default) keeps FIFO order.
  public var concurrency: Int
  /// Extra ready jobs claimed in the same store transaction beyond the free handler slots, held
  /// under this worker's lease until a slot frees. 0 (the default) claims only what can run now,
  /// which shares work fairly between workers; a larger value trades fairness for fewer
  /// transactions. A prefetched job counts as running until it starts or is handed back, with
  /// the costs ``claimsAhead`` lists: a duplicate added meanwhile is stored, ``JobQueue/clear()``
  /// leaves it, and a process that dies leaves it an attempt it never ran.
  public var prefetch: Int
  /// Whether a worker that has just run a short job claims one job ahead, with `prefetch` 0.
  /// Default false: a speed-up for queues of very short jobs that gives up three guarantees, so
  /// a queue opts in.
  ///
  /// A worker whose job took less than 1 ms (decoding and handler), on a store whose calls take
  /// 10 µs or more (SQLite, PostgreSQL), claims its next job and the one after it in one store
  /// call. While it runs the first, the queue records its outcome, so on a busy queue of short
  /// jobs the store's transaction and the handler overlap: on SQLite a worker at concurrency 1
  /// handled about 1.3 times as many no-op jobs per second.
  ///
  /// On a store whose calls take less (the in-memory store), handing an outcome to the queue costs
  /// more than the call, so the worker claims its next job and fifteen more in one call instead,
  /// and records their outcomes with its next claim: a sixteenth of the calls. Jobs as short as
  /// the one before run well within the 50 ms hold below; an outcome so left waits at most until
  /// that hold passes (the queue records it then, whatever the worker is doing). A store's calls
  /// count as cheap by the cheapest of a worker's recent ones, so a few calls slowed by a busy
  /// machine do not switch it. A clock that does not move (a manual test clock) times every call
  /// at zero, and then nothing is claimed ahead.
  ///
  /// A job claimed ahead is held under this worker's lease, as a prefetched one is. If no slot
  /// frees within 50 ms of its claim (measured by ``clock``: the job running took longer than the
  /// ones before it), the queue hands it back, ready in its old place with its attempt given
  /// back, for any worker to take. It is handed back at once when the queue is paused or shuts
  /// down, and when its delegate goes away, within those 50 ms. A job is never claimed ahead
  /// after one that took 1 ms or longer, so long jobs are shared between workers as without it.
  ///
  /// What it gives up, as `prefetch` does: until it is handed back or starts, a job claimed
  /// ahead counts as running, not waiting.
  /// - **Deduplication**: a duplicate added meanwhile is stored beside it; if it is then handed
  ///   back, both run.
  /// - **``JobQueue/clear()``** leaves it, and it runs.
  /// - **Attempts**: if its process dies, it keeps the attempt its claim counted, though it never
  ///   ran. (Ignored when ``maxAttempts`` is 1, where such a job would die without running.)
  ///
  /// These cannot be kept without a store call between the claim and the handler's start, which
  /// is the very wait this overlaps. Ignored when `prefetch` is above 0.
  public var claimsAhead: Bool
  /// Whether the queue starts working as soon as it is created. Default true; false waits for
  /// ``JobQueue/start()``.
  public var autoStart: Bool
  /// Whether the queue may ask iOS, tvOS or visionOS for background time while jobs run.
  /// Default true. `JobQueue` itself does not act on it yet on any platform; ConveyorBismuth's
  /// `Bismuth.Queue` does, where UIKit exists. A job interrupted by suspension is handed out
  /// again after its lease, as after a crash.
  public var canRunInBackground: Bool
  /// How long a claimed job stays with this worker without a heartbeat. The queue heartbeats every
  /// third of it while a handler runs; a job whose worker died is handed out again after it.
  /// Default 60 seconds.
  public var leaseDuration: Duration
  /// How often an idle worker looks for jobs that other processes added. Jobs added through this
  /// queue instance wake it at once. Default 1 second.
  public var pollInterval: Duration
  /// The longest one attempt of a job may run; nil (the default): no limit. A job's own limit
  /// (`add(_:timeLimit:)`, ``NewJob/timeLimit``) overrides it. Between 1 ms and
  /// ``longestTimeLimit``.
  ///
  /// When it passes, the handler's task is cancelled and the attempt is recorded at once as
  /// failed with the error "timed out after …"; the retry policy and ``maxAttempts`` decide
  /// what comes next, without waiting for the handler to return. Whatever that handler does
  /// later is not recorded (its claim is over), and it keeps its worker slot until it returns: a
  /// handler that ignores cancellation holds a slot, and the job may meanwhile run again
  /// elsewhere. One that has not returned ``timeLimitGrace`` after its limit is reported
  /// ``JobQueueEvent/stuck(_:after:)`` and logged as an error, once.
  ///
  /// Measured by ``clock`` from the handler's start (decoding excluded).
  public var timeLimit: Duration?
  /// How long after its time limit a handler that has not returned is reported stuck. Default 10
  /// seconds; between zero and ``longestTimeLimit``.
  public var timeLimitGrace: Duration
  /// How long finished jobs are kept as history, by status, and how often the queue prunes
  /// older ones (``JobRetention``). Default ``JobRetention/default``: completed 1 day, cancelled
  /// 7 days, dead 30 days.
  public var retention: JobRetention
  /// What a job of an ordering key that dies does to the later jobs of its key (see
  /// <doc:OrderingKeys>). Default ``DeadHeadPolicy/holdsKey``: they wait until an operator
  /// re-queues or removes it.
  public var deadHeadPolicy: DeadHeadPolicy = .holdsKey
  /// The time source. Default: ``SystemJobClock``.
  public var clock: any JobClock
  /// Receives the queue's log records. Payloads are never logged. Default: nil (silent).
  public var log: (@Sendable (LogRecord) -> Void)?
  /// How often a running queue gives its activity counts to the store (``QueueActivity``).
  /// Internal: tests shorten it.
  var activityFlushInterval: Duration = .seconds(5)
  /// The longest a stopping queue waits to give its activity counts to the store. Internal:
  /// tests shorten it.
  var activityHandoverLimit: Duration = .seconds(5)
  /// The shortest store call worth overlapping with the next job (see ``claimsAhead``).
  /// Internal: tests with a manual clock, whose calls all take no time, set it to zero.
  var claimAheadStoreCallFloor = QueueState.cheapStoreCall
  /// The longest job after which a worker claims ahead (see ``claimsAhead``). Internal: tests
  /// that must claim ahead on a loaded machine raise it.
  var claimAheadJobCeiling = QueueState.shortJob
  /// How often the lease keeper asks the store whether the claims it holds are still current
  /// (``LeaseKeeper/checkInterval``). Package-wide for tests: a test that must prove a
  /// cancellation arrived by the store's notice, not by this check, makes it longer than the test.
  package var claimCheckInterval = Duration.milliseconds(500)
  /// Where the queue's tasks run and how it waits in real time; a simulation replaces it.
  package var runtime = QueueRuntime.production

  /// Creates a configuration with the defaults above.
  public init(
    identifier: String, retryPolicy: RetryPolicy = .fixed(.seconds(15)), maxAttempts: Int? = nil,
    concurrency: Int = 1, prefetch: Int = 0, claimsAhead: Bool = false, autoStart: Bool = true,
    canRunInBackground: Bool = true,
    leaseDuration: Duration = .seconds(60), pollInterval: Duration = .seconds(1), timeLimit: Duration? = nil,
    timeLimitGrace: Duration = .seconds(10), retention: JobRetention = .default,
    clock: any JobClock = SystemJobClock(), log: (@Sendable (LogRecord) -> Void)? = nil
  ) {
    self.identifier = identifier
    self.retryPolicy = retryPolicy
    self.maxAttempts = maxAttempts
    self.concurrency = concurrency
    self.prefetch = prefetch
    self.claimsAhead = claimsAhead
    self.autoStart = autoStart
    self.canRunInBackground = canRunInBackground
    self.leaseDuration = leaseDuration
    self.pollInterval = pollInterval
    self.timeLimit = timeLimit
    self.timeLimitGrace = timeLimitGrace
    self.retention = retention
    self.clock = clock
    self.log = log
  }

  /// Checks every setting, and that the lease outlasts `store`'s longest lock wait; throws
  /// ``JobQueueError`` naming the first bad one and how to fix it.
  public func validate(for store: any JobStore) throws(JobQueueError) {
    try validate()
    let wait = store.maximumLockWait
    if wait > .zero && leaseDuration < wait * 2 {
      throw .invalidConfiguration(
        "leaseDuration (\(leaseDuration)) must be at least twice the store's longest lock wait (\(wait), "
          + "\(store.maximumLockWaitSetting)): a worker waiting for the lock could lose a job it is "
          + "still running. Lengthen the lease or shorten \(store.maximumLockWaitSetting)")
    }
  }

  /// The longest lease, poll interval and delay accepted: one day.
  public static let longestInterval = Duration.seconds(86_400)
  /// The longest time limit accepted: seven days. Work that may run longer is better split, or
  /// run without a limit.
  public static let longestTimeLimit = Duration.seconds(7 * 86_400)

  /// Why a time limit (the queue's or one job's, named `name`) is refused; nil when it is fine.
  static func problem(timeLimit: Duration, name: String) -> String? {
    guard timeLimit < .milliseconds(1) || timeLimit > longestTimeLimit else { return nil }
    return "\(name) must be between 1 ms and 7 days (or nil for no limit), got \(timeLimit)"
  }

  /// Checks every setting; throws ``JobQueueError`` naming the first bad one and how to fix it.
  public func validate() throws(JobQueueError) {
    try Self.validate(identifier: identifier)
    if let maxAttempts, maxAttempts < 1 {
      throw .invalidConfiguration("maxAttempts must be at least 1 (or nil for unlimited), got \(maxAttempts)")
    }
    if concurrency < 1 || concurrency > 10_000 {
      throw .invalidConfiguration("concurrency must be between 1 and 10000, got \(concurrency)")
    }
    if prefetch < 0 || prefetch > 10_000 {
      throw .invalidConfiguration("prefetch must be between 0 and 10000, got \(prefetch)")
    }
    if leaseDuration < .milliseconds(30) || leaseDuration > Self.longestInterval {
      throw .invalidConfiguration("leaseDuration must be between 30 ms and 1 day, got \(leaseDuration)")
    }
    if pollInterval < .milliseconds(1) || pollInterval > Self.longestInterval {
      throw .invalidConfiguration("pollInterval must be between 1 ms and 1 day, got \(pollInterval)")
    }
    if let timeLimit, let problem = Self.problem(timeLimit: timeLimit, name: "timeLimit") {
      throw .invalidConfiguration(problem)
    }
    if timeLimitGrace < .zero || timeLimitGrace > Self.longestTimeLimit {
      throw .invalidConfiguration("timeLimitGrace must be between 0 and 7 days, got \(timeLimitGrace)")
    }
    try retention.validate()
  }

  /// Checks a queue identifier: 1–128 characters of `A-Z a-z 0-9 . _ -`.
  public static func validate(identifier: String) throws(JobQueueError) {
    let allowed = identifier.utf8.allSatisfy { byte in
      (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A)
        || byte == 0x2E || byte == 0x5F || byte == 0x2D
    }
    guard !identifier.isEmpty, identifier.utf8.count <= 128, allowed else {
      throw .invalidIdentifier(identifier)
    }
  }
}

/// What a job of an ordering key that dies (its attempts spent, its payload undecodable, or
/// discarded by its handler) does to the later jobs of its key.
public enum DeadHeadPolicy: String, Sendable, Hashable, Codable, CaseIterable {
  /// The dead job keeps its key: the later jobs wait until an operator re-queues it (it runs first
  /// again) or removes it. The default: a DELETE never overtakes a POST that failed for good.
  case holdsKey
  /// The dead job leaves its key, and the next job of the key runs. Its ordering key is cleared
  /// (``JobRecord/orderingKey`` is nil from then on), so a re-queue runs it outside its key's
  /// order, beside the key's other jobs. For keys whose jobs do not depend on each other's
  /// success, only on not running at once.
  case releasesKey
}

/// Errors a ``JobQueue`` reports before touching the store.
public enum JobQueueError: Error, Hashable, CustomStringConvertible {
  /// The identifier is empty, longer than 128 characters, or has a character outside
  /// `A-Z a-z 0-9 . _ -`.
  case invalidIdentifier(String)
  /// A configuration value is out of range; the text names it.
  case invalidConfiguration(String)
  /// The item could not be encoded as JSON; nothing was stored.
  case encodingFailed(String)
  /// A run date that is not a finite date; nothing was stored. The text says what to pass.
  case invalidSchedule(String)
  /// A job's time limit is out of range; nothing was stored. The text says what is allowed.
  case invalidTimeLimit(String)
  /// An item's deduplication scope cannot be kept: a period out of range, or one longer than
  /// the queue keeps completed jobs. Nothing was stored; the text says what to change.
  case invalidDeduplication(String)
  /// An ordering key breaks ``OrderingKey``'s rules (empty, too long, or with NUL); nothing was
  /// stored. The text says what to pass.
  case invalidOrderingKey(String)
  /// A limit key breaks ``LimitKey``'s rules (empty, too long, or with NUL), or the store keeps
  /// no limits per key; nothing was stored. The text says what to pass.
  case invalidLimitKey(String)
  /// A fairness key breaks ``FairnessKey``'s rules (empty, too long, or with NUL), its job also
  /// has an ordering key, or the store keeps no fair shares; nothing was stored. The text says
  /// what to pass.
  case invalidFairnessKey(String)
  /// Limits out of range (``QueueLimits/problem``); the stored limits were left as they were.
  case invalidLimits(String)
  /// The store keeps no checkpoints (``JobStore/checkpoint(_:payload:queue:)``), which durable
  /// workflows need: use `InMemoryJobStore`, `SQLiteJobStore` or `PostgresJobStore`.
  case checkpointsUnsupported

  /// Says what is wrong and what to do.
  public var description: String {
    switch self {
    case .invalidIdentifier(let identifier):
      "invalid queue identifier \"\(identifier)\": use 1 to 128 characters from A-Z, a-z, 0-9, '.', '_' and '-'"
    case .invalidConfiguration(let message): "invalid queue configuration: \(message)"
    case .encodingFailed(let message): "could not encode the item as JSON (nothing was stored): \(message)"
    case .invalidSchedule(let message): "invalid schedule (nothing was stored): \(message)"
    case .invalidTimeLimit(let message): "invalid time limit (nothing was stored): \(message)"
    case .invalidDeduplication(let message): "invalid deduplication (nothing was stored): \(message)"
    case .invalidOrderingKey(let message): "invalid ordering key (nothing was stored): \(message)"
    case .invalidLimitKey(let message): "invalid limit key (nothing was stored): \(message)"
    case .invalidFairnessKey(let message): "invalid fairness key (nothing was stored): \(message)"
    case .invalidLimits(let message): "invalid limits (the stored limits were kept): \(message)"
    case .checkpointsUnsupported:
      "this store keeps no checkpoints, which workflows need: use InMemoryJobStore, SQLiteJobStore or "
        + "PostgresJobStore"
    }
  }
}

/// One log message from a queue.
public struct LogRecord: Sendable, Hashable {
  /// How much the message matters.
  public enum Level: Int, Sendable, Hashable, Comparable {
    /// Step-by-step detail.
    case debug
    /// Normal events worth keeping.
    case info
    /// Something went wrong and was handled (a lost lease, a retried store error).
    case warning
    /// Something went wrong that needs a person.
    case error

    /// Orders by severity.
    public static func < (lhs: Level, rhs: Level) -> Bool { lhs.rawValue < rhs.rawValue }
  }

  /// The severity.
  public var level: Level
  /// The message; never contains payloads.
  public var message: String
  /// Structured fields such as `queue` and `job`.
  public var metadata: [String: String]

  /// Creates a record.
  public init(level: Level, message: String, metadata: [String: String] = [:]) {
    self.level = level
    self.message = message
    self.metadata = metadata
  }
}

/// What a queue is doing.
public enum JobQueueState: String, Sendable, Hashable, Codable {
  /// Not started, or shut down.
  case stopped
  /// Started, with no handler running.
  case idle
  /// At least one handler is running.
  case running
  /// Paused: no new job is claimed (by any worker on the store); running handlers finish.
  case paused
}

/// Something that happened in a queue, as reported by ``JobQueue/events``.
public enum JobQueueEvent: Sendable, Hashable {
  /// A job was committed (not reported for an item deduplicated onto an existing job).
  case enqueued(JobID)
  /// A handler started on a job; `attempt` is 1 the first time.
  case started(JobID, attempt: Int)
  /// A job was handled and deleted.
  case succeeded(JobID)
  /// A job will run again at the date; `error` is the recorded reason.
  case retryScheduled(JobID, at: Date, error: String?)
  /// A job is dead: attempts exhausted, discarded, or undecodable.
  case died(JobID, reason: String)
  /// A handler ran past its time limit and had not returned `after` (its limit plus
  /// ``JobQueueConfiguration/timeLimitGrace``) since it started: it ignores cancellation and
  /// holds a worker slot. Reported once per attempt. The attempt itself was recorded as timed
  /// out when the limit passed.
  case stuck(JobID, after: Duration)
  /// No pending or running job is left in the queue.
  case finished
  /// The queue's ``JobQueueState`` changed.
  case stateChanged(JobQueueState)
}
