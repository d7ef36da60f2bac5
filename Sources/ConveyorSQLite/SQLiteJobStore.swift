import CSQLite
import Conveyor
import Foundation

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#elseif canImport(Darwin)
  import Darwin
#endif

/// A durable `JobStore` in one SQLite file, shared safely by several processes.
///
/// The file uses write-ahead logging, so readers never block the writer; every change is one
/// `BEGIN IMMEDIATE` transaction, so processes on the same file take turns through SQLite's lock
/// (waiting up to ``Options/busyTimeout``). Handled jobs are deleted; dead jobs are kept.
/// No call makes Swift's cooperative thread pool wait for a lock: the hot calls (``enqueue(_:queue:clock:)``,
/// ``settleAndClaim(_:queue:limit:lease:clock:)``, ``isPaused(queue:)``, ``nextWake(queue:clock:)``)
/// run their short transaction on the caller's thread when the connection is free, with SQLite's
/// busy timeout off, and move to a thread owned by the store when another process holds the lock;
/// every other call runs on that thread. So do hot calls that are large (many jobs, large
/// payloads), and every call when ``Options/synchronous`` is ``Synchronous/full`` (each commit
/// syncs the disk). WAL checkpoints also run on the store's thread: the connection's automatic
/// checkpoint, which SQLite would run inside a commit, is replaced by one the commit submits there.
///
/// ```swift
/// let store = try SQLiteJobStore(path: SQLiteJobStore.defaultDatabaseURL(name: "outbox").path)
/// let results = try await store.enqueue([NewJob(payload: data, runAt: .now)], queue: "mail", now: .now)
/// ```
///
/// Opening a file that is not a Conveyor database (another application's SQLite file, a file of
/// another kind, a damaged file, or one written by a newer Conveyor) throws
/// ``SQLiteJobStoreError`` and leaves the file byte-for-byte untouched.
public final class SQLiteJobStore: JobStore {
  /// How hard SQLite works to make each commit survive a power loss.
  public enum Synchronous: String, Sendable, Hashable, CaseIterable {
    /// WAL with `synchronous=NORMAL`: a commit survives a crash of the process; a power loss may
    /// undo the last commits, never corrupt the file. The default.
    case normal = "NORMAL"
    /// WAL with `synchronous=FULL`: every commit is flushed to the disk before it returns.
    case full = "FULL"
  }

  /// How the store opens its file.
  public struct Options: Sendable, Hashable {
    /// The durability of each commit. Default ``Synchronous/normal``.
    public var synchronous: Synchronous
    /// How long a call waits for another connection's lock before failing with `SQLITE_BUSY`.
    /// Default 5 seconds.
    public var busyTimeout: Duration

    /// Creates options.
    ///
    /// - Parameters:
    ///   - synchronous: The durability of each commit.
    ///   - busyTimeout: How long to wait for another connection's lock.
    public init(synchronous: Synchronous = .normal, busyTimeout: Duration = .seconds(5)) {
      self.synchronous = synchronous
      self.busyTimeout = busyTimeout
    }
  }

  /// The `PRAGMA application_id` marking a Conveyor database: the bytes "Cnvy".
  public static let applicationID: Int32 = 0x436E_7679
  /// The schema version this build writes and reads (`PRAGMA user_version`).
  ///
  /// Version 2 added claim tokens and the ready/scheduled states; version 3 the activity table
  /// (``recordActivity(_:)``); version 4 the place a retried job takes among ready ones; version
  /// 5 a job's own time limit; version 6 the history of finished jobs; version 7 an index of the
  /// running and completed jobs with a deduplication key; version 8 stored schedules; version 9
  /// ordering keys and the held state; version 10 the queues' stored limits; version 11 their
  /// rates; version 12 limits per key; version 13 rates per key. An older database is
  /// migrated when it is opened, in one transaction, keeping every job.
  public static let schemaVersion: Int32 = 14

  /// The database file's path.
  public let path: String
  /// The options the store was opened with.
  public let options: Options
  let connection: SerializedConnection
  /// Enqueue calls waiting to be committed together.
  let groups = EnqueueGroups()

  /// Opens the Conveyor database at `path`, creating it (mode 0600) when it does not exist.
  ///
  /// Blocks the calling thread while the file is opened and checked; from an `async` context
  /// prefer ``open(path:options:)``.
  ///
  /// - Parameters:
  ///   - path: The database file. Its folder must exist.
  ///   - options: Durability and lock-wait settings.
  /// - Throws: ``SQLiteJobStoreError`` when the file is not a usable Conveyor database (the file
  ///   is left untouched), or ``SQLiteError`` when SQLite fails.
  public init(path: String, options: Options = .init()) throws {
    self.path = path
    self.options = options
    try PathCheck.refuseSpecialFiles(path)
    // A database this call built and linked into place is known to be ours.
    if try !Self.createIfMissing(path) { try Self.refuseForeignFile(path, within: options.busyTimeout) }
    let raw = try Connection(path: PathCheck.sqliteFilename(path), create: false)
    try Self.prepare(raw, path: path, options: options)
    connection = try SerializedConnection(label: "Conveyor.SQLiteJobStore", connection: raw) {
      SQLiteJobStoreError(
        code: .closed, path: path,
        message: "this store was closed; open the database again to use it")
    }
  }

  /// Opens the database named `name` at ``defaultDatabaseURL(name:)``.
  ///
  /// - Parameters:
  ///   - name: The database name, `[A-Za-z0-9._-]`, 1 to 128 characters. Default "conveyor".
  ///   - options: Durability and lock-wait settings.
  public convenience init(name: String = "conveyor", options: Options = .init()) throws {
    try self.init(path: Self.defaultDatabaseURL(name: name).path, options: options)
  }

  /// Opens the Conveyor database at `path` without blocking the caller's thread, or any thread
  /// of the cooperative pool: the opening (which may wait up to ``Options/busyTimeout`` for
  /// another connection's lock) runs on a thread of its own.
  ///
  /// - Parameters:
  ///   - path: The database file. Its folder must exist.
  ///   - options: Durability and lock-wait settings.
  public static func open(path: String, options: Options = .init()) async throws -> SQLiteJobStore {
    try await onOwnThread(name: "conveyor-sqlite-open") { try SQLiteJobStore(path: path, options: options) }
  }

  /// Closes the database once the calls already made have finished, and returns when it is closed.
  ///
  /// Closing the last connection to the file folds its WAL file into it and deletes the WAL and
  /// shared-memory files, so the database is one self-contained file afterwards (for copying or
  /// moving it, say). Calls made after `close()` throw ``SQLiteJobStoreError`` with code
  /// ``SQLiteJobStoreError/Code/closed``; closing again does nothing. Without `close()`, the
  /// database closes shortly after the store is released. Stop every `JobQueue` using the store
  /// first: a running queue's calls would fail.
  public func close() async {
    await connection.close()
  }

  /// The default location of the database named `name`, creating its folder (mode 0700).
  ///
  /// Linux: `$XDG_DATA_HOME/conveyor/<name>.sqlite`, falling back to
  /// `~/.local/share/conveyor/<name>.sqlite`. Apple platforms: `Application Support/conveyor/`.
  /// Never a cache folder, which the system may purge.
  ///
  /// - Parameter name: `[A-Za-z0-9._-]`, 1 to 128 characters, not "." or "..". Default "conveyor".
  /// - Throws: ``SQLiteJobStoreError`` with code `invalidName` or `cannotCreate`.
  public static func defaultDatabaseURL(name: String = "conveyor") throws -> URL {
    try defaultDatabaseURL(name: name, environment: ProcessInfo.processInfo.environment)
  }

  /// The default location of the database named `name`, as ``defaultDatabaseURL(name:)`` says,
  /// without creating its folder on Linux (on Apple platforms, Application Support is created if
  /// missing): for looking at a database without making anything, as
  /// ``schemaStatus(path:)`` does.
  public static func defaultDatabaseURLWithoutCreating(name: String = "conveyor") throws -> URL {
    try defaultDatabaseURL(
      name: name, environment: ProcessInfo.processInfo.environment, creatingFolder: false)
  }

  /// ``defaultDatabaseURL(name:)`` reading `XDG_DATA_HOME` and `HOME` from `environment`, so
  /// tests need not change the process's environment while other threads read it.
  static func defaultDatabaseURL(name: String, environment: [String: String], creatingFolder: Bool = true)
    throws
    -> URL
  {
    try validate(name: name)
    let folder = try defaultFolder(environment: environment)
    if creatingFolder { try makeFolders(folder) }
    return URL(fileURLWithPath: PathCheck.joined(folder, "\(name).sqlite"), isDirectory: false)
  }

  /// Creates `path` and its missing parents (mode 0700), like `mkdir -p`, with plain system calls.
  private static func makeFolders(_ path: String) throws {
    var prefix = ""
    for component in path.split(separator: "/", omittingEmptySubsequences: true) {
      prefix += "/" + component
      guard mkdir(prefix, 0o700) != 0, errno != EEXIST else { continue }
      let reason = String(cString: strerror(errno))
      throw SQLiteJobStoreError(
        code: .cannotCreate, path: path,
        message: "cannot create the database folder (\(reason) for \(prefix)); "
          + "check the permissions of its parent or pass an explicit path")
    }
    var info = stat()
    guard stat(path, &info) == 0, info.st_mode & S_IFMT == S_IFDIR else {
      throw SQLiteJobStoreError(
        code: .cannotCreate, path: path,
        message: "the database folder is not a folder; move what is there aside or pass an explicit path")
    }
  }

  // MARK: - JobStore

  /// Commits new jobs to a queue in one transaction, in order, skipping duplicates by key.
  ///
  /// Returns once the jobs are committed. A small call (at most 32 jobs and 64 KiB of payloads and
  /// keys) made while no other add is under way commits on the caller's thread (with no wait for
  /// another process's lock: if one holds it, the call moves to the store's thread and waits
  /// there); a larger call commits on the store's thread. Calls that arrive while another add is
  /// under way wait and are committed together, in one transaction: by the caller whose add was
  /// under way, on its thread, once its own add committed, or on the store's thread. When a call
  /// of a group fails, the group is rolled back and each of its calls runs again alone, so one
  /// call's failure fails only that call. A call cancelled once it waits for its group is
  /// committed all the same, and so are the calls waiting behind a cancelled caller.
  public func enqueue(_ jobs: [NewJob], queue: String, clock: any JobClock) async throws -> [EnqueueResult] {
    if jobs.isEmpty { return [] }
    try OrderingKey.check(jobs)
    // A connection whose commits sync the disk runs nothing inline: its adds go straight to the
    // group on the store's thread, with no leader to linger for followers on the pool.
    if Self.isSmall(jobs), connection.runsInline, groups.lead() {
      let followers: [EnqueueGroups.Request]
      switch await groups.gather(with: jobs, queue: queue, clock: clock) {
      case .followers(let gathered): followers = gathered
      case .takenOver(let slot): return try await slot.valueIgnoringCancellation
      }
      // From here no suspension until the lead ends (`yields: false`): the calls queued behind a
      // leader wait for its task alone, which must not wait for its executor meanwhile (the wait
      // for followers above yields only where that adds no dependency; see `gather`). Not
      // cancellable with followers: their jobs are in the same transaction.
      let calls = [(jobs, queue, clock)] + followers.map { ($0.jobs, $0.queue, $0.clock) }
      let outcome = await connection.tryInline(
        { db in try Self.commitInline(calls, db: db) }, waitingForInlineCalls: true,
        cancellable: followers.isEmpty, yields: false)
      switch outcome {
      case .success(let results)?:
        if !followers.isEmpty { groups.countGroup() }
        for (follower, result) in zip(followers, results.dropFirst()) {
          follower.resume(returning: result)
        }
        await yieldAfterLead(ledOthers: await commitQueuedBehindLeader() || !followers.isEmpty)
        return results[0]
      case .failure(let error)? where followers.isEmpty:
        // A lone call's own error is its answer.
        await yieldAfterLead(ledOthers: await commitQueuedBehindLeader())
        throw error
      default:
        // Busy, a checkpoint waits, closed, or (with followers) a call failed: the group, this
        // call with it, goes to the connection's thread, which reports each call's own error.
        break
      }
      if groups.handOver(followers) { connection.submit { [self] db in flushEnqueueGroups(db) } }
    }
    try Task.checkCancellation()
    let priority = Task.currentPriority
    let prefersExecutor = withUnsafeCurrentTask { $0?.unownedTaskExecutor != nil }
    return try await withUnsafeThrowingContinuation { continuation in
      let request = EnqueueGroups.Request(
        jobs: jobs, queue: queue, clock: clock, completion: .continuation(continuation), priority: priority,
        prefersExecutor: prefersExecutor)
      if groups.add(request) { connection.submit { [self] db in flushEnqueueGroups(db) } }
    }
  }

  /// The most jobs, settlements or claimed jobs a call handles on the caller's thread: a larger
  /// call is many statements, so it runs on the store's thread, leaving the cooperative pool free.
  static let inlineRowLimit = 32
  /// The most payload bytes an enqueue commits on the caller's thread.
  static let inlineByteLimit = 64 * 1_024

  /// Whether an enqueue of `jobs` is small enough to commit on the caller's thread.
  static func isSmall(_ jobs: [NewJob]) -> Bool {
    guard jobs.count <= inlineRowLimit else { return false }
    var total = 0
    for job in jobs {
      total += bytes(of: job)
      if total > inlineByteLimit { return false }
    }
    return true
  }

  /// The bytes of a job that count towards ``inlineByteLimit``: its payload and its key.
  static func bytes(of job: NewJob) -> Int { job.payload.count + (job.deduplicationKey?.utf8.count ?? 0) }

  static func runAt(_ runTime: RunTime, now: Int64) -> Int64 {
    switch runTime {
    case .now: now
    case .after(let delay): millis(now, adding: delay)
    case .at(let date): millis(date)
    }
  }

  /// Applies settlements, then claims up to `limit` ready jobs, in one `BEGIN IMMEDIATE` transaction.
  ///
  /// Runs on the caller's thread when the connection is free and the call is small (at most 32
  /// settlements and a `limit` of at most 32), as ``enqueue(_:queue:clock:)`` does; otherwise on
  /// the store's thread.
  ///
  /// The clock is read once the transaction holds the write lock, so a wait for the lock never
  /// shortens the lease.
  public func settleAndClaim(
    _ settlements: [JobSettlement], queue: String, limit: Int, lease: Lease, clock: any JobClock
  ) async throws -> ClaimBatch {
    let small = settlements.count <= Self.inlineRowLimit && limit <= Self.inlineRowLimit
    let body: @Sendable (Connection) throws -> ClaimBatch = { db in
      try db.transaction(immediate: true) {
        let wall = clock.now()
        let now = millis(wall)
        var stale: [ClaimReference] = []
        var retryDates: [JobID: Date] = [:]
        for settlement in settlements {
          guard try Self.settle(settlement, queue: queue, now: now, db: db) else {
            stale.append(settlement.claim)
            continue
          }
          if case .retry(let delay, _) = settlement.action {
            retryDates[settlement.id] = date(millis(now, adding: delay))
          }
        }
        let flags = try ClaimFlags(queue: queue, db: db)
        let paused = flags.paused
        var limit = limit
        // The places the concurrency limit left before this claim (nil: no limit).
        var places: Int?
        if let concurrency = flags.concurrency, limit > 0, !paused {
          // The write transaction holds the file's lock, so no other claim can count meanwhile.
          let running = try Self.runningCount(queue: queue, concurrency: concurrency, db: db)
          limit = QueueLimits(concurrency: Int(concurrency)).claimable(limit, running: running)
          places = Int(concurrency) - running
        }
        // The starts the rate limit gives, under the same lock; `nextStart` when it cut the claim.
        // To the microsecond, not the stored dates' millisecond (see `InMemoryJobStore`).
        let micros = RateLimit.microseconds(wall)
        let rate = limit > 0 && !paused ? flags.rate : nil
        if let rate { limit = rate.take(limit, tat: flags.rateTime, now: micros).starts }
        guard limit > 0, !paused else {
          return ClaimBatch(
            claimed: [], staleSettlements: stale, paused: paused, retryDates: retryDates,
            full: places.map { $0 <= 0 } ?? false,
            nextStart: try rate.flatMap {
              try Self.takeStarts(0, rate: $0, flags: flags, now: micros, db: db)
            })
        }
        try db.run(SQL.promote, .text(queue), .integer(now))
        let expires = millis(now, adding: lease.duration)
        // Read the ready rows first, then update them one by one (no `RETURNING`, no
        // `UPDATE … WHERE id IN (SELECT …)`: both were several times slower).
        var claimed: [JobRecord] = []
        claimed.reserveCapacity(min(limit, 1_024))
        if flags.keyLimits {
          if flags.keyRates { try Self.releaseDueKeys(queue: queue, now: micros, db: db) }
          claimed = try Self.selectWithinKeyLimits(
            queue: queue, limit: limit, rates: flags.keyRates, now: micros, db: db)
        } else {
          try db.query(SQL.selectReady, .text(queue), .integer(Int64(limit))) {
            claimed.append(try Self.record($0))
          }
        }
        for index in claimed.indices {
          let id = claimed[index].id.rawValue
          let changed = try db.run(SQL.claim, .text(lease.owner), .integer(expires), .integer(id))
          guard changed == 1 else {
            throw SQLiteError(code: .error, message: "claimed job \(id) vanished inside its transaction")
          }
          claimed[index].status = .running
          if claimed[index].attempts < Int.max { claimed[index].attempts += 1 }
          claimed[index].claimToken &+= 1
          claimed[index].leaseOwner = lease.owner
          claimed[index].leaseExpiresAt = date(expires)
        }
        return ClaimBatch(
          claimed: claimed, staleSettlements: stale, retryDates: retryDates,
          full: places.map { $0 - claimed.count <= 0 } ?? false,
          nextStart: try rate.flatMap {
            try Self.takeStarts(claimed.count, rate: $0, flags: flags, now: micros, db: db)
          })
      }
    }
    return try await small ? connection.performInline(body) : connection.perform(body)
  }

  /// Extends the leases of the given claims; returns those still current.
  public func heartbeat(_ claims: [ClaimReference], queue: String, lease: Lease, clock: any JobClock)
    async throws -> [ClaimReference]
  {
    if claims.isEmpty { return [] }
    return try await connection.perform { db in
      try db.transaction(immediate: true) {
        let expires = millis(millis(clock.now()), adding: lease.duration)
        return try claims.filter {
          try db.run(
            SQL.heartbeat, .integer(expires), .integer($0.id.rawValue), .text(queue), .integer($0.token)) > 0
        }
      }
    }
  }

  /// Keeps checkpoints: true.
  public var keepsCheckpoints: Bool { true }

  /// Replaces a running job's payload under its claim, the checkpoint a handler resumes from (a
  /// durable workflow's history); false, writing nothing, when the claim is no longer current.
  public func checkpoint(_ claim: ClaimReference, payload: Data, queue: String) async throws -> Bool {
    try await connection.perform { db in
      try db.run(
        SQL.checkpoint, .blob(payload), .integer(claim.id.rawValue), .text(queue), .integer(claim.token)) > 0
    }
  }

  /// Makes running jobs whose lease ran out ready again, in their old place; returns how many.
  public func rescueExpiredLeases(queue: String, clock: any JobClock) async throws -> Int {
    try await connection.perform { db in
      try db.transaction(immediate: true) {
        try db.run(SQL.rescue, .text(queue), .integer(millis(clock.now())))
      }
    }
  }

  /// Counts the queue's jobs by status, each count a range of an index.
  ///
  /// Counting reads every counted job's index entry: about 0.15 s per million jobs.
  public func counts(queue: String, clock: any JobClock) async throws -> JobCounts {
    try await connection.perform { db in
      try db.transaction(immediate: false) {
        let now = millis(clock.now())
        func count(_ status: String) throws -> Int {
          Int(try db.scalar(SQL.count(status), .text(queue)) ?? 0)
        }
        let due = Int(try db.scalar(SQL.countDue, .text(queue), .integer(now)) ?? 0)
        return JobCounts(
          ready: try count("ready") + due, scheduled: try count("scheduled") - due,
          running: try count("running"), dead: try count("dead"), completed: try count("completed"),
          cancelled: try count("cancelled"), held: try count("held"))
      }
    }
  }

  /// Lists jobs in ID order, one page at a time; only the page is read into memory, and never the
  /// other queues' rows beyond a small window (see `SQLiteJobStore+Listing.swift`).
  public func jobs(queue: String, status: JobStatus?, after: JobID?, limit: Int) async throws -> [JobRecord] {
    guard limit > 0 else { return [] }
    let after = after?.rawValue ?? Int64.min
    return try await connection.perform { db in
      try db.transaction(immediate: false) {
        try Self.listPage(db, queue: queue, status: status, after: after, limit: limit)
      }
    }
  }

  /// The job with this ID, in whichever queue it is, or nil: one primary-key lookup.
  ///
  /// - Parameter id: The job's ID.
  /// - Returns: The stored record, or nil when no job has that ID (handled, removed, never added).
  public func job(_ id: JobID) async throws -> JobRecord? {
    try await connection.perform { db in
      var found: JobRecord?
      try db.query(SQL.job, .integer(id.rawValue)) { found = try Self.record($0) }
      return found
    }
  }

  /// Deletes the given jobs whatever their status; returns how many existed.
  public func remove(_ ids: [JobID], queue: String) async throws -> Int {
    if ids.isEmpty { return 0 }
    return try await connection.perform { db in
      try db.transaction(immediate: true) {
        var keys: [String] = []
        let removed = try Set(ids).reduce(0) { count, id in
          if let key = try db.scalarText(SQL.orderingKeyOf, .integer(id.rawValue), .text(queue)) {
            keys.append(key)
          }
          return count + (try db.run(SQL.remove, .integer(id.rawValue), .text(queue)))
        }
        try Self.advanceLines(keys, queue: queue, now: nil, db: db)
        return removed
      }
    }
  }

  /// Cancels unfinished jobs; see `JobStore.cancel(_:queue:clock:)`. One write transaction: a
  /// primary-key read and delete per ID.
  public func cancel(_ ids: [JobID], queue: String?, clock: any JobClock) async throws -> [CancelResult] {
    if ids.isEmpty { return [] }
    return try await connection.perform { db in
      try db.transaction(immediate: true) {
        let now = millis(clock.now())
        return try ids.map { id -> CancelResult in
          var found: (key: String?, status: String, queue: String)?
          try db.query(SQL.orderingKeyOf, .integer(id.rawValue), queue.map(SQLiteValue.text) ?? .null) {
            found = ($0.text(0), $0.text(1) ?? "", $0.text(2) ?? "")
          }
          guard let found else { return .notFound }
          switch found.status {
          case "ready", "scheduled", "held", "running":
            try db.run(SQL.cancel, .integer(now), .integer(id.rawValue))
            if let key = found.key { try Self.advanceLines([key], queue: found.queue, now: now, db: db) }
            return found.status == "running" ? .cancelledRunning : .cancelledWaiting
          case "completed": return .alreadyCompleted
          case "cancelled": return .alreadyCancelled
          default: return .alreadyDead
          }
        }
      }
    }
  }

  /// The claims still current; see `JobStore.currentClaims(_:queue:)`. One read transaction:
  /// a primary-key lookup per claim.
  public func currentClaims(_ claims: [ClaimReference], queue: String) async throws -> [ClaimReference] {
    if claims.isEmpty { return [] }
    return try await connection.perform { db in
      try db.transaction(immediate: false) {
        try claims.filter {
          try db.scalar(SQL.isCurrent, .integer($0.id.rawValue), .text(queue), .integer($0.token)) != nil
        }
      }
    }
  }

  /// Deletes every job of the queue whose status is in `statuses`; returns how many.
  public func clear(queue: String, statuses: Set<JobStatus>) async throws -> Int {
    let stored = statuses.flatMap(SQL.stored)
    if stored.isEmpty { return 0 }
    return try await connection.perform { db in
      try db.transaction(immediate: true) {
        // Every status first, then the lines: a line advanced between two statuses would make a
        // held job of a status already cleared scheduled, and leave it.
        var keys: [String] = []
        let cleared = try stored.reduce(0) {
          $0 + (try Self.delete(SQL.clear($1), .text(queue), keys: &keys, db: db))
        }
        try Self.advanceLines(keys, queue: queue, now: nil, db: db)
        return cleared
      }
    }
  }

  /// How many of the queue's jobs have these statuses, and the highest of their IDs, in one
  /// snapshot (each status's count and highest ID from its partial index).
  public func tally(queue: String, statuses: Set<JobStatus>) async throws -> JobTally {
    let stored = statuses.flatMap(SQL.stored)
    return try await connection.perform { db in
      try db.transaction(immediate: false) {
        var tally = JobTally(count: 0, highestID: nil)
        for status in stored {
          try db.query(SQL.tally(status), .text(queue)) { row in
            tally.count += row.int(0)
            if !row.isNull(1) {
              tally.highestID = max(tally.highestID ?? JobID(row.int64(1)), JobID(row.int64(1)))
            }
          }
        }
        return tally
      }
    }
  }

  /// Deletes the queue's jobs of these statuses with IDs up to `through` when there are exactly
  /// `expected` of them, in one transaction; nil (and nothing deleted) otherwise.
  public func clear(queue: String, statuses: Set<JobStatus>, through: JobID, expecting expected: Int)
    async throws -> Int?
  {
    let stored = statuses.flatMap(SQL.stored)
    return try await connection.perform { db in
      try db.transaction(immediate: true) {
        var count = 0
        for status in stored {
          count += Int(try db.scalar(SQL.countThrough(status), .text(queue), .integer(through.rawValue)) ?? 0)
        }
        guard count == expected else { return nil }
        var keys: [String] = []
        let cleared = try stored.reduce(0) {
          $0
            + (try Self.delete(
              SQL.clearThrough($1), .text(queue), .integer(through.rawValue), keys: &keys, db: db))
        }
        try Self.advanceLines(keys, queue: queue, now: nil, db: db)
        return cleared
      }
    }
  }

  /// Deletes a batch of old finished jobs; see `JobStore.prune(queue:status:olderThan:limit:clock:)`.
  /// One short write transaction: a range of the status's index (`jobs_completed`, …), oldest first.
  public func prune(
    queue: String, status: JobStatus, olderThan age: Duration, limit: Int, clock: any JobClock
  )
    async throws -> Int
  {
    guard status.isFinished, limit > 0 else { return 0 }
    let stored = SQL.stored(status)[0]
    return try await connection.perform { db in
      try db.transaction(immediate: true) {
        guard age > .zero else {
          return try Self.deleteAdvancing(
            SQL.pruneAll(stored), .text(queue), .integer(Int64(limit)), queue: queue, db: db)
        }
        let before = millis(clock.now()) &- JobStoreTime.milliseconds(age)
        return try Self.deleteAdvancing(
          SQL.prune(stored), .text(queue), .integer(before), .integer(Int64(limit)), queue: queue, db: db)
      }
    }
  }

  /// Makes dead jobs ready again, now, attempts reset to zero; returns how many.
  public func requeueDead(_ ids: [JobID]?, queue: String, clock: any JobClock) async throws -> Int {
    try await connection.perform { db in
      try db.transaction(immediate: true) {
        let now = millis(clock.now())
        // One at a time, oldest first: of dead jobs sharing a key only the first may go back.
        func requeue(_ id: Int64) throws -> Int {
          try db.run(SQL.requeueOne, .integer(now), .text(queue), .integer(id))
        }
        guard let ids else {
          var keyed: [Int64] = []
          try db.query(SQL.deadWithKey, .text(queue)) { keyed.append($0.int64(0)) }
          let unkeyed = try db.run(SQL.requeueAllWithoutKey, .integer(now), .text(queue))
          return try keyed.reduce(unkeyed) { try $0 + requeue($1) }
        }
        return try Set(ids).sorted().reduce(0) { try $0 + requeue($1.rawValue) }
      }
    }
  }

  /// Stores whether the queue is paused; every process on the file obeys it at its next claim.
  public func setPaused(_ paused: Bool, queue: String) async throws {
    _ = try await connection.perform { db in
      try db.run(paused ? SQL.pause : SQL.resume, .text(queue))
    }
  }

  /// Whether the queue is paused.
  public func isPaused(queue: String) async throws -> Bool {
    try await connection.performInline { db in try db.scalar(SQL.isPaused, .text(queue)) != nil }
  }

  /// The stored limits; see `JobStore.limits(queue:)`.
  public func limits(queue: String) async throws -> QueueLimits {
    try await connection.perform { db in
      var limits = QueueLimits()
      try db.transaction(immediate: false) {
        try db.query(SQL.limits, .text(queue)) { row in
          limits.concurrency = row.isNull(0) ? nil : row.int(0)
          limits.rate = row.isNull(1) ? nil : RateLimit(perSecond: row.double(1), burst: row.int(2))
          limits.keyConcurrency = row.isNull(3) ? nil : row.int(3)
          limits.keyRate = row.isNull(4) ? nil : RateLimit(perSecond: row.double(4), burst: row.int(5))
        }
        try db.query(SQL.keyOverrides, .text(queue)) { row in
          limits.keyConcurrencyOverrides[row.text(0) ?? ""] = row.int(1)
        }
        try db.query(SQL.keyRateOverrides, .text(queue)) { row in
          limits.keyRateOverrides[row.text(0) ?? ""] = RateLimit(perSecond: row.double(1), burst: row.int(2))
        }
      }
      return limits
    }
  }

  /// Keeps and enforces rate limits: true.
  public var keepsRateLimits: Bool { true }

  /// Keeps and enforces limits per key: true.
  public var keepsKeyLimits: Bool { true }
  /// Keeps fairness keys and claims by fair shares (schema 14: `jobs.turn`, taken by triggers).
  public var keepsFairShares: Bool { true }

  /// The keys with running or held jobs; see `JobStore.limitKeyUsage(queue:limit:)`.
  public func limitKeyUsage(queue: String, limit: Int) async throws -> [LimitKeyUsage] {
    guard limit > 0 else { return [] }
    return try await connection.perform { db in
      var rows: [LimitKeyUsage] = []
      try db.query(SQL.limitKeyUsage, .text(queue), .integer(Int64(limit))) { row in
        rows.append(LimitKeyUsage(key: row.text(0) ?? "", running: row.int(1), held: row.int(2)))
      }
      return rows
    }
  }

  /// Stores limits; see `JobStore.setLimits(_:queue:)`. In one transaction; every job held for
  /// its key's limit becomes ready again (the next claims hold those whose key is still at its
  /// limit).
  public func setLimits(_ limits: QueueLimits, queue: String) async throws {
    try limits.check()
    _ = try await connection.perform { db in
      try db.transaction(immediate: true) {
        try db.run(
          SQL.setLimits, .text(queue), limits.concurrency.map { .integer(Int64($0)) } ?? .null,
          limits.rate.map { .real($0.perSecond) } ?? .null,
          limits.rate.map { .integer(Int64($0.burst)) } ?? .null,
          limits.keyConcurrency.map { .integer(Int64($0)) } ?? .null,
          limits.keyRate.map { .real($0.perSecond) } ?? .null,
          limits.keyRate.map { .integer(Int64($0.burst)) } ?? .null)
        try db.run(SQL.deleteKeyOverrides, .text(queue))
        for (key, limit) in limits.keyConcurrencyOverrides {
          try db.run(SQL.insertKeyOverride, .text(queue), .text(key), .integer(Int64(limit)))
        }
        try db.run(SQL.deleteKeyRateOverrides, .text(queue))
        for (key, rate) in limits.keyRateOverrides {
          try db.run(
            SQL.insertKeyRateOverride, .text(queue), .text(key), .real(rate.perSecond),
            .integer(Int64(rate.burst)))
        }
        try db.run(SQL.unparkAll, .text(queue))
        // Buckets are kept while the queue has a rate per key (setting limits does not refill them).
        if !limits.hasKeyRates { try db.run(SQL.deleteKeyBuckets, .text(queue)) }
      }
    }
  }

  /// When the queue next needs a worker: a ready job (or the earliest scheduled run date) and the
  /// earliest lease expiry; no run date while the running jobs fill the concurrency limit.
  public func nextWake(queue: String, clock: any JobClock) async throws -> WakeHint {
    try await connection.performInline { db in
      try db.transaction(immediate: false) {
        // A ready job is due now, whatever its date says (the wall clock may have stepped back).
        let ready = try db.scalar(SQL.anyReady, .text(queue)).map { min($0, millis(clock.now())) }
        let run = try ready ?? db.scalar(SQL.nextScheduled, .text(queue))
        // The pause flag and the limits in one read of the queue's row, as a claim reads them.
        let flags = try ClaimFlags(queue: queue, db: db)
        let paused = flags.paused
        // A key whose rate holds jobs needs a worker when its bucket gives its next start.
        let keyDue =
          flags.keyRates
          ? try db.scalar(SQL.earliestKeyDue, .text(queue), .integer(RateLimit.microseconds(clock.now())))
            .map(RateLimit.date) : nil
        var nextRun = [run.map(date), keyDue].compactMap { $0 }.min()
        if nextRun != nil, let concurrency = flags.concurrency,
          try Self.runningCount(queue: queue, concurrency: concurrency, db: db) >= concurrency
        {
          nextRun = nil
        }
        // No waiting job needs a worker before the rate gives its next start (to the microsecond).
        if let due = nextRun, let rate = flags.rate,
          let start = rate.nextStart(tat: flags.rateTime, now: RateLimit.microseconds(clock.now()))
        {
          nextRun = max(due, RateLimit.date(start))
        }
        let expiry = try db.scalar(SQL.nextExpiry, .text(queue))
        let scheduleDue = try db.scalar(SQL.nextScheduleDue, .text(queue))
        return WakeHint(
          nextRun: nextRun, nextLeaseExpiry: expiry.map(date), paused: paused,
          nextScheduleDue: scheduleDue.map(date))
      }
    }
  }

  /// The names of queues that hold jobs, are paused or have limits, sorted; reads the `queues`
  /// table and one index seek per queue.
  public func queueNames() async throws -> [String] {
    try await connection.perform { db in
      var names: [String] = []
      try db.query(SQL.queueNames) { names.append($0.text(0) ?? "") }
      return names
    }
  }

  /// The busy timeout: a queue's lease must be longer.
  public var maximumLockWait: Duration { options.busyTimeout }

  /// `SQLiteJobStore.Options.busyTimeout`.
  public var maximumLockWaitSetting: String { "SQLiteJobStore.Options.busyTimeout" }

  /// The SQLite virtual-machine steps a claim of one job reads (promotion, the keys due under rates
  /// per key, and selection), without changing anything: tests check that a claim's cost does not grow with the backlog.
  func claimSteps(queue: String, now: Date) async throws -> Int {
    try await connection.perform { db in
      let statements = [
        SQL.promote, SQL.selectReady, SQL.keyLimit, SQL.keyRunningCount, SQL.park, SQL.dueKeys, SQL.unparkKey,
        SQL.keyHasParked, SQL.setKeyDue, SQL.deleteFullBuckets, SQL.keyRate, SQL.keyBucket,
      ]
      for sql in statements {
        _ = sqlite3_stmt_status(try db.statement(sql).handle, SQLITE_STMTSTATUS_VM_STEP, 1)
      }
      try db.execute("SAVEPOINT measure")
      // A test hook that must change nothing: undoing the promotion is best effort (a failure
      // here could only leave due jobs promoted, which the next claim does anyway).
      defer { try? db.execute("ROLLBACK TO measure; RELEASE measure") }
      try db.run(SQL.promote, .text(queue), .integer(millis(now)))
      let flags = try ClaimFlags(queue: queue, db: db)
      if flags.keyRates { try Self.releaseDueKeys(queue: queue, now: RateLimit.microseconds(now), db: db) }
      if flags.keyLimits {
        _ = try Self.selectWithinKeyLimits(
          queue: queue, limit: 1, rates: flags.keyRates, now: RateLimit.microseconds(now), db: db)
      } else {
        try db.query(SQL.selectReady, .text(queue), .integer(1)) { _ in }
      }
      return try statements.reduce(0) {
        $0 + Int(sqlite3_stmt_status(try db.statement($1).handle, SQLITE_STMTSTATUS_VM_STEP, 1))
      }
    }
  }

  /// The SQLite virtual-machine steps of a claim's count of the queue's running jobs under its
  /// stored concurrency limit (0 without one), for tests: the count must read no more than the
  /// limit's worth of entries, however many jobs run.
  func runningCountSteps(queue: String) async throws -> Int {
    try await connection.perform { db in
      guard let concurrency = try db.scalar(SQL.concurrency, .text(queue)) else { return 0 }
      let statement = try db.statement(SQL.runningCount).handle
      _ = sqlite3_stmt_status(statement, SQLITE_STMTSTATUS_VM_STEP, 1)
      _ = try Self.runningCount(queue: queue, concurrency: concurrency, db: db)
      return Int(sqlite3_stmt_status(statement, SQLITE_STMTSTATUS_VM_STEP, 1))
    }
  }

  /// Takes `count` starts from the queue's rate bucket (stores its time when it changed); returns
  /// the next start when the bucket has none left.
  private static func takeStarts(_ count: Int, rate: RateLimit, flags: ClaimFlags, now: Int64, db: Connection)
    throws -> Date?
  {
    let taken = rate.take(count, tat: flags.rateTime, now: now)
    if taken.mustStore { try db.run(SQL.setRateTime, .text(flags.queue), .integer(taken.tat)) }
    return taken.next > now ? RateLimit.date(taken.next) : nil
  }

  /// A queue's row as a claim reads it (`SQL.claimFlags`): no row means no flag and no limits.
  struct ClaimFlags {
    var queue: String
    var paused = false
    var concurrency: Int64?
    var rate: RateLimit?
    /// The rate's stored time (microseconds since 1970), nil before the first start.
    var rateTime: Int64?
    /// Whether a limit per key is set (the queue's or an override; a concurrency or a rate).
    var keyLimits = false
    /// Whether a rate per key is set (the queue's or an override).
    var keyRates = false

    init(queue: String, db: Connection) throws {
      self.queue = queue
      try db.query(SQL.claimFlags, .text(queue)) { row in
        paused = row.int64(0) != 0
        concurrency = row.isNull(1) ? nil : row.int64(1)
        rate = row.isNull(2) ? nil : RateLimit(perSecond: row.double(2), burst: row.int(3))
        rateTime = row.isNull(4) ? nil : row.int64(4)
        keyRates = row.int64(6) != 0
        keyLimits = row.int64(5) != 0 || keyRates
      }
    }
  }

  /// The ready jobs a claim of `limit` takes under the queue's limits per key, in claim order,
  /// inside the claim's write transaction: a job whose key already runs its limit's worth (this
  /// claim's among them), or whose key's rate gives no start at `now` (microseconds), is held
  /// instead (`SQL.park`), and the claim reads on past it. Each held job leaves the ready index,
  /// so a key at its limit costs the claims after it nothing until a job of the key stops running
  /// (`SQL.version12`'s triggers make the first held one ready) or its rate's next start comes
  /// (`releaseDueKeys`). The starts taken are stored in the keys' buckets (`key_buckets`) with,
  /// for a key whose rate held a job, when its next start is due.
  private static func selectWithinKeyLimits(
    queue: String, limit: Int, rates: Bool, now: Int64, db: Connection
  ) throws -> [JobRecord] {
    var taken: [JobRecord] = []
    var takenIDs: Set<JobID> = []
    // Per key, by its bytes (as SQLite compares them; `String` takes canonically equivalent
    // spellings for one key): its limit (nil: none) and the jobs of it running, this claim's among
    // them; its rate (nil: none), its bucket's time, whether that changed, and when the rate holds
    // a job, when its next start is due.
    var keys: [ExactText: KeyState] = [:]
    func select() throws {
      // The jobs taken stay ready until the caller claims them, so each read starts with them. The
      // first reads what the claim wants, as a claim without limits per key does; once it held
      // jobs, each read goes past the jobs taken by a window twice the last (at most 256), so a
      // claim that holds many jobs reads few times, and one that holds none reads no more than usual.
      var extra = 0
      while true {
        let window = limit + extra
        var batch: [JobRecord] = []
        try db.query(SQL.selectReady, .text(queue), .integer(Int64(window))) {
          batch.append(try Self.record($0))
        }
        for record in batch where !takenIDs.contains(record.id) {
          guard let key = record.limitKey else {
            taken.append(record)
            takenIDs.insert(record.id)
            if taken.count == limit { return }
            continue
          }
          var state = try keys[ExactText(key)] ?? KeyState(queue: queue, key: key, rates: rates, db: db)
          if state.takes(now: now) {
            taken.append(record)
            takenIDs.insert(record.id)
          } else {
            try db.run(SQL.park, .integer(record.id.rawValue))
          }
          keys[ExactText(key)] = state
          if taken.count == limit { return }
        }
        // A short read was every ready job there was.
        if batch.count < window { return }
        extra = min(max(extra * 2, 8), 256)
      }
    }
    try select()
    for (key, state) in keys where state.changed || state.due != nil {
      try db.run(
        SQL.storeKeyBucket, .text(queue), .text(key.text), .integer(state.tat ?? now),
        state.due.map { .integer($0) } ?? .null, .integer(now))
    }
    return taken
  }

  /// A limit key as a claim under limits per key sees it.
  private struct KeyState {
    /// The key's concurrency limit (nil: none) and its running jobs, this claim's among them.
    var limit: Int64?
    var running: Int64 = 0
    /// The key's rate (nil: none) and its bucket's stored time (nil: full).
    var rate: RateLimit?
    var tat: Int64?
    /// Whether ``tat`` changed, and when the rate held a job, when its next start is due.
    var changed = false
    var due: Int64?

    init(queue: String, key: String, rates: Bool, db: Connection) throws {
      limit = try db.scalar(SQL.keyLimit, .text(queue), .text(key))
      running =
        try limit.map { try db.scalar(SQL.keyRunningCount, .text(queue), .text(key), .integer($0)) ?? 0 } ?? 0
      if rates {
        rate = try SQLiteJobStore.keyRate(queue: queue, key: key, db: db)
        if rate != nil { tat = try db.scalar(SQL.keyBucket, .text(queue), .text(key)) }
      }
    }

    /// Whether the claim may take a job of the key at `now` (microseconds): under its limit and
    /// given a start by its rate, both then counted; when the rate gives none, ``due`` notes its
    /// next start.
    mutating func takes(now: Int64) -> Bool {
      if let limit, running >= limit { return false }
      if let rate {
        let start = rate.take(1, tat: tat, now: now)
        if start.mustStore {
          tat = start.tat
          changed = true
        }
        guard start.starts > 0 else {
          due = min(due ?? start.next, start.next)
          return false
        }
      }
      running += 1
      return true
    }
  }

  /// The rate of limit key `key`: its override, else the queue's rate per key; nil for none.
  static func keyRate(queue: String, key: String, db: Connection) throws -> RateLimit? {
    var rate: RateLimit?
    try db.query(SQL.keyRate, .text(queue), .text(key)) { row in
      if !row.isNull(0) { rate = RateLimit(perSecond: row.double(0), burst: row.int(1)) }
    }
    return rate
  }

  /// Makes ready the jobs held by keys whose rate gives starts again by `now` (microseconds), or
  /// whose due time a later clock noted (the clock stepped back since), in the claim's transaction
  /// before it reads the ready jobs: as many of each key's, in claim order, as its bucket gives (at
  /// least one; the claim holds again any still over a limit). A key with more held is due again
  /// when its bucket gives the start after those. At most `SQL.maximumKeysReleased` keys a claim; a
  /// key left is still due, so the queue's next wake is now. Then up to 16 buckets full for a day
  /// and holding nothing are deleted (as good as no row).
  private static func releaseDueKeys(queue: String, now: Int64, db: Connection) throws {
    var due: [(key: String, tat: Int64)] = []
    try db.query(SQL.dueKeys, .text(queue), .integer(now)) { due.append(($0.text(0) ?? "", $0.int64(1))) }
    for (key, tat) in due {
      let rate = try keyRate(queue: queue, key: key, db: db)
      let starts = rate.map { max(1, $0.take(RateLimit.maximumBurst, tat: tat, now: now).starts) } ?? 1
      try db.run(SQL.unparkKey, .text(queue), .text(key), .integer(Int64(starts)))
      let more = try db.scalar(SQL.keyHasParked, .text(queue), .text(key)) != nil
      let next = more ? rate.map { max(now + 1, $0.take(starts, tat: tat, now: now).next) } : nil
      try db.run(SQL.setKeyDue, .text(queue), .text(key), next.map { .integer($0) } ?? .null, .integer(now))
    }
    try db.run(SQL.deleteFullBuckets, .text(queue), .integer(now))
  }

  /// The number of prepared statements the connection holds (tests check they are reused).
  func cachedStatementCount() async throws -> Int {
    try await connection.perform { $0.cachedStatementCount }
  }

  /// How many of the queue's jobs run, counted up to `concurrency` (its stored limit): a claim
  /// needs no more to know whether a place is left.
  static func runningCount(queue: String, concurrency: Int64, db: Connection) throws -> Int {
    Int(try db.scalar(SQL.runningCount, .text(queue), .integer(concurrency)) ?? 0)
  }

  // MARK: - Settling and decoding

  /// Applies one settlement; false when its claim is no longer current.
  private static func settle(_ settlement: JobSettlement, queue: String, now: Int64, db: Connection) throws
    -> Bool
  {
    let id = SQLiteValue.integer(settlement.claim.id.rawValue)
    let queueName = queue
    let queue = SQLiteValue.text(queue)
    let token = SQLiteValue.integer(settlement.claim.token)
    var changed: Int
    let ran = settlement.runDuration.map { SQLiteValue.integer(JobStoreTime.milliseconds($0)) } ?? .null
    // A job that completes or is deleted leaves its ordering key's line, and the next job of the
    // key may run. The statement for a job in no line runs first: the usual job costs what it did
    // before ordering keys; a job in a line then costs a lookup of its key more.
    var key: String?
    switch settlement.action {
    case .complete where !settlement.keepsHistory, .kill where !settlement.keepsHistory:
      changed = try db.run(SQL.deleteHeldOutOfLine, id, queue, token)
      if changed == 0, let found = try db.scalarText(SQL.orderingKeyOf, id, queue) {
        key = found
        changed = try db.run(SQL.deleteHeld, id, queue, token)
      }
    case .complete where settlement.ordered:
      // The claim had an ordering key: the statement for a job in a line first, then the next job
      // of its key found through the completed job (no lookup of the key before).
      let output = settlement.output.map(SQLiteValue.blob) ?? .null
      changed = try db.run(SQL.completeInLine, .integer(now), ran, output, id, queue, token)
      if changed > 0 {
        try advanceLine(of: settlement.claim.id.rawValue, queue: queueName, now: now, db: db)
      } else {
        changed = try db.run(SQL.completeOutOfLine, .integer(now), ran, output, id, queue, token)
      }
    case .complete:
      let output = settlement.output.map(SQLiteValue.blob) ?? .null
      changed = try db.run(SQL.completeOutOfLine, .integer(now), ran, output, id, queue, token)
      if changed == 0, let found = try db.scalarText(SQL.orderingKeyOf, id, queue) {
        key = found
        changed = try db.run(SQL.complete, .integer(now), ran, output, id, queue, token)
      }
    case .retry(let delay, let error):
      let runAt = millis(now, adding: delay)
      if runAt <= now { try db.run(SQL.nextRetryPlace, queue) }
      changed = try db.run(
        SQL.retry, .integer(runAt), .integer(now), error.map { .text(JobHistory.bounded($0)) } ?? .null, id,
        token, queue, ran)
    case .kill(let error):
      let error = SQLiteValue.text(JobHistory.bounded(error))
      if settlement.releasesOrderingKey, let found = try db.scalarText(SQL.orderingKeyOf, id, queue) {
        changed = try db.run(SQL.killReleasingKey, error, .integer(now), ran, id, queue, token)
        if changed > 0 { key = found }
      } else {
        changed = try db.run(SQL.kill, error, .integer(now), ran, id, queue, token)
      }
    case .release(let error):
      changed = try db.run(
        SQL.release, error.map { .text(JobHistory.bounded($0)) } ?? .null, id, queue, token)
    }
    if let key, changed > 0 { try advanceLines([key], queue: queueName, now: now, db: db) }
    return changed > 0
  }

  /// Decodes a row selected with ``SQL/columns``.
  static func record(_ row: Statement) throws -> JobRecord {
    let statusText = row.text(3) ?? ""
    let status: JobStatus
    switch statusText {
    case "ready", "scheduled", "held": status = .pending
    case "running": status = .running
    case "dead": status = .dead
    case "completed": status = .completed
    case "cancelled": status = .cancelled
    default:
      throw SQLiteError(
        code: .corrupt, message: "job \(row.int64(0)) has an unknown status '\(statusText)'", sql: row.sql)
    }
    return JobRecord(
      id: JobID(row.int64(0)), queue: row.text(1) ?? "", payload: row.data(2), status: status,
      priority: row.int(4), attempts: row.int(5), runAt: date(row.int64(6)), createdAt: date(row.int64(7)),
      lastError: row.text(8), deduplicationKey: row.text(9), leaseOwner: row.text(10),
      leaseExpiresAt: row.isNull(11) ? nil : date(row.int64(11)), claimToken: row.int64(12),
      timeLimit: JobStoreTime.timeLimit(milliseconds: row.isNull(13) ? nil : row.int64(13)),
      finishedAt: row.isNull(14) ? nil : date(row.int64(14)), errors: try errors(row, 15),
      runDuration: row.isNull(16) ? nil : .milliseconds(row.int64(16)),
      output: row.isNull(17) ? nil : row.data(17), orderingKey: row.text(18), isHeld: statusText == "held",
      limitKey: row.text(19), isHeldByLimit: statusText == "held" && row.int64(20) == 1,
      fairnessKey: row.text(21))
  }

  // MARK: - Ordering keys

  /// After jobs of these ordering keys left their lines (finished or deleted), lets each line's
  /// first job, if held, run next (see `SQL.lineHead`): ready when its run date has come by `now`,
  /// else scheduled (without a `now`, always scheduled: the next claim makes it ready when due).
  /// Inside the caller's write transaction; one index seek per key.
  static func advanceLines(_ keys: some Sequence<String>, queue: String, now: Int64?, db: Connection) throws {
    for key in Set(keys) {
      var head: (id: Int64, status: String, ready: Bool)?
      try db.query(SQL.lineHead, .text(queue), .text(key)) {
        head = ($0.int64(0), $0.text(1) ?? "", $0.int64(2) <= max(now ?? .min, $0.int64(3)))
      }
      guard let head, head.status == "held" else { continue }
      try db.run(SQL.unhold, .integer(head.id), .text(head.ready ? "ready" : "scheduled"))
    }
  }

  /// ``advanceLines(_:queue:now:db:)`` for the key of job `id`, which just left its line.
  static func advanceLine(of id: Int64, queue: String, now: Int64, db: Connection) throws {
    var head: (id: Int64, status: String, ready: Bool)?
    try db.query(SQL.lineHeadAfter, .text(queue), .integer(id)) {
      head = ($0.int64(0), $0.text(1) ?? "", $0.int64(2) <= max(now, $0.int64(3)))
    }
    guard let head, head.status == "held" else { return }
    try db.run(SQL.unhold, .integer(head.id), .text(head.ready ? "ready" : "scheduled"))
  }

  /// Runs a `DELETE … RETURNING` of each deleted job's key while it was in its line, adding the
  /// keys to `keys`; returns how many jobs were deleted.
  static func delete(_ sql: String, _ values: SQLiteValue..., keys: inout [String], db: Connection) throws
    -> Int
  {
    var deleted = 0
    try db.query(sql, values) { row in
      deleted += 1
      if let key = row.text(0) { keys.append(key) }
    }
    return deleted
  }

  /// Runs a `DELETE … RETURNING ordering_key`, then advances the lines of the deleted jobs' keys;
  /// returns how many jobs were deleted.
  static func deleteAdvancing(_ sql: String, _ values: SQLiteValue..., queue: String, db: Connection) throws
    -> Int
  {
    var deleted = 0
    var keys: [String] = []
    try db.query(sql, values) { row in
      deleted += 1
      if let key = row.text(0) { keys.append(key) }
    }
    try advanceLines(keys, queue: queue, now: nil, db: db)
    return deleted
  }

  /// A JSON array of strings (``SQL/appendError(_:)``) as a list; NULL as none.
  private static func errors(_ row: Statement, _ column: Int32) throws -> [String] {
    guard !row.isNull(column) else { return [] }
    let text = row.data(column)
    do {
      return try JSONDecoder().decode([String].self, from: text)
    } catch {
      throw SQLiteError(
        code: .corrupt,
        message: "job \(row.int64(0)) has a list of errors that is not a JSON array of strings",
        sql: row.sql)
    }
  }
}

// MARK: - Opening

extension SQLiteJobStore {
  /// Creates a complete, empty Conveyor database at `path` when no file is there.
  ///
  /// The database is built in a new file beside `path` (mode 0600, so SQLite never creates it
  /// 0644) and hard-linked into place, which fails rather than replaces when another process got
  /// there first. So a file at `path` is never a Conveyor database half-made by a concurrent
  /// open.
  ///
  /// An empty file is created instead, and ``prepare(_:path:options:)`` installs the schema
  /// under SQLite's locks, when the file system has no hard links, and when a `-wal` or
  /// `-journal` file of a deleted database is still beside `path`: SQLite discards those only
  /// beside an empty database, and would replay them into a complete one.
  ///
  /// A crash mid-build can leave a hidden `.conveyor-new-…` file (and its `-journal`) in the
  /// folder. Delete it, never open it: right after the link it is a second name of the database.
  ///
  /// A symbolic link to a file that does not exist yet (made to a data volume before the first
  /// run) is followed, as SQLite follows it: the database is created where the link leads, and
  /// opened through the link. A link the system would refuse to follow (another user's, in a
  /// sticky folder such as `/tmp`), or a chain of links too long, is refused before anything is
  /// created, saying so.
  ///
  /// - Returns: Whether the file at `path` is a complete database this call built.
  fileprivate static func createIfMissing(_ path: String) throws -> Bool {
    var info = stat()
    guard stat(path, &info) != 0 else { return false }
    let target = try creatableTarget(missing: path, statError: errno)
    let through = target == path ? "" : " (where the symbolic link leads: \(target))"
    if stat(target + "-wal", &info) == 0 || stat(target + "-journal", &info) == 0 {
      try createEmptyFile(target, reportingAs: path, detail: through, mayExist: true)
      return false
    }
    // A short name in the same folder: `link` needs the same file system, and a name derived
    // from a long database name could pass the file system's limit.
    // (Plain bytes, never Foundation's path calls: see `PathCheck`.)
    let random = String(UInt64.random(in: 0...UInt64.max), radix: 16)
    let building = PathCheck.joined(PathCheck.folder(of: target), ".conveyor-new-\(random)")
    // Near SQLite's limit on a path, the longer name of the file built could pass it where the
    // database's own does not: then the empty file is made in place instead.
    if case .resolved(let full) = PathCheck.fullPath(building), full.utf8.count > PathCheck.longestFullPath {
      try createEmptyFile(target, reportingAs: path, detail: through, mayExist: true)
      return false
    }
    try createEmptyFile(building, reportingAs: path, detail: through)
    defer { for suffix in ["", "-wal", "-shm", "-journal"] { unlink(building + suffix) } }
    try build(PathCheck.sqliteFilename(building))
    if link(building, target) == 0 { return true }
    if errno != EEXIST { try createEmptyFile(target, reportingAs: path, detail: through, mayExist: true) }
    return false
  }

  /// Where a database at `path`, which `stat` could not find (`statError`, its `errno`), would be
  /// created (the end of its symbolic links); throws, creating nothing, when it surely cannot be:
  /// links that loop or that the system refuses to follow, or a path that cannot be examined.
  static func creatableTarget(missing path: String, statError: Int32) throws -> String {
    guard statError != ELOOP else {
      throw SQLiteJobStoreError(
        code: .unusableLink, path: path,
        message:
          "this path leads through symbolic links that loop (or through too many of them); pass the path "
          + "of the database file itself, or mend the links")
    }
    guard statError == ENOENT else {
      let reason = String(cString: strerror(statError))
      throw SQLiteJobStoreError(
        code: .cannotCreate, path: path,
        message:
          "cannot examine the database file (\(reason)); check that its folder exists and is accessible")
    }
    // `path` may be a symbolic link whose target does not exist yet: the file is made there.
    let chain = PathCheck.followLinks(path)
    if let refusal = chain.refusal {
      throw SQLiteJobStoreError(
        code: .unusableLink, path: path,
        message:
          "this is a symbolic link to a database file not made yet, and \(refusal); nothing was created. "
          + "Pass the path of the database file itself, or replace the link")
    }
    return chain.end
  }

  /// Installs the schema in a file only this process knows, and leaves it in WAL mode with
  /// everything checkpointed into the file (the connection closes before this returns).
  private static func build(_ path: String) throws {
    let db = try Connection(path: path, create: false)
    try db.transaction(immediate: true) { try db.execute(SQL.schema) }
    try db.execute("PRAGMA journal_mode = WAL")
  }

  /// Creates an empty file with mode 0600; with `mayExist`, an existing file is no error. An
  /// error names `reported`, the database path the caller asked for, and adds `detail`.
  private static func createEmptyFile(
    _ path: String, reportingAs reported: String, detail: String = "", mayExist: Bool = false
  ) throws {
    let descriptor = createExclusively(path)
    if descriptor >= 0 {
      closeDescriptor(descriptor)
    } else if !(mayExist && errno == EEXIST) {
      let reason = String(cString: strerror(errno))
      throw SQLiteJobStoreError(
        code: .cannotCreate, path: reported,
        message:
          "cannot create the database file\(detail) (\(reason)); check that its folder exists and is writable"
      )
    }
  }

  /// Throws for a file that is not empty and not a Conveyor database, looking at it through an
  /// immutable read-only connection: a read-write connection could roll back another
  /// application's hot journal, changing the file it refuses.
  ///
  /// A file with a WAL file beside it is left to the read-write check in `prepare`: an immutable
  /// connection ignores the WAL, so it could see a Conveyor database that another process is
  /// creating half-written. That check reads through the WAL and never checkpoints it on close
  /// before the file is known to be ours.
  ///
  /// The immutable connection takes no lock, so it can also read a file that another connection
  /// is writing in rollback-journal mode (another Conveyor process installing the schema into a
  /// pre-made empty file spills pages before it commits), and see it damaged or foreign. A
  /// refusal made while a `-journal` file is beside the file, or while the file changed under
  /// the reading, decides nothing: the look is repeated, with growing pauses, until it is made on
  /// a still file or `timeout` has passed; then its answer stands (a hot journal left by a crash
  /// stays unread and untouched).
  static func refuseForeignFile(_ path: String, within timeout: Duration) throws {
    let deadline = ContinuousClock.now + timeout
    var pause = Duration.milliseconds(1)
    while true {
      guard fileSize(path) > 0, fileSize(path + "-wal") == 0 else { return }
      let before = FileSnapshot(path)
      do {
        _ = try inspect(try Connection(inspecting: PathCheck.sqliteFilename(path)), path: path)
        return
      } catch {
        let after = FileSnapshot(path)
        let unsettled = before != after || before.hasJournal || after.hasJournal
        guard unsettled, ContinuousClock.now + pause < deadline else { throw error }
        Thread.sleep(forTimeInterval: pause / .seconds(1))
        pause = min(pause * 2, .milliseconds(50))
      }
    }
  }

  /// What shows that a file is being written: its size, change time and inode, and whether a
  /// rollback journal is beside it.
  private struct FileSnapshot: Equatable {
    var size: Int64 = -1
    var changed: timespec = timespec()
    var inode: UInt64 = 0
    var hasJournal: Bool

    init(_ path: String) {
      var info = stat()
      if stat(path, &info) == 0 {
        size = Int64(info.st_size)
        #if canImport(Darwin)
          changed = info.st_ctimespec
        #else
          changed = info.st_ctim
        #endif
        inode = UInt64(info.st_ino)
      }
      hasJournal = stat(path + "-journal", &info) == 0
    }

    static func == (a: Self, b: Self) -> Bool {
      a.size == b.size && a.changed.tv_sec == b.changed.tv_sec && a.changed.tv_nsec == b.changed.tv_nsec
        && a.inode == b.inode && a.hasJournal == b.hasJournal
    }
  }

  /// The size of the file at `path`, or 0 when it cannot be examined (missing, no permission):
  /// the size only decides whether to look before opening, and SQLite reports an unreadable file.
  private static func fileSize(_ path: String) -> Int64 {
    var info = stat()
    return stat(path, &info) == 0 ? Int64(info.st_size) : 0
  }

  /// Checks the file is a Conveyor database (or empty), sets the pragmas, installs the schema.
  ///
  /// Nothing is written before the file is known to be empty or a Conveyor database.
  fileprivate static func prepare(_ db: Connection, path: String, options: Options) throws {
    // Until the file is known to be ours, closing must not checkpoint a WAL file into it (a
    // foreign database whose content is still only in its WAL file looks empty to
    // `refuseForeignFile`).
    conveyor_sqlite_db_config_no_checkpoint_on_close(db.handle, 1)
    db.setLockWait(milliseconds: milliseconds(options.busyTimeout))
    let kind = try inspect(db, path: path)
    conveyor_sqlite_db_config_no_checkpoint_on_close(db.handle, 0)  // ours (or empty) from here
    if kind != .current {
      try db.transaction(immediate: true) {
        // Another process may have installed or migrated the schema while this one waited.
        switch try inspect(db, path: path) {
        case .empty: try db.execute(SQL.schema)
        case .version1:
          try migrateFromVersion1(db)
          fallthrough
        case .version2:
          try db.execute(SQL.migrate2to3)
          fallthrough
        case .version3:
          try db.execute(SQL.migrate3to4)
          fallthrough
        case .version4:
          try db.execute(SQL.migrate4to5)
          fallthrough
        case .version5:
          try migrateFromVersion5(db)
          fallthrough
        case .version6:
          try db.execute(SQL.migrate6to7)
          fallthrough
        case .version7:
          try db.execute(SQL.migrate7to8)
          fallthrough
        case .version8:
          try migrateFromVersion8(db)
          fallthrough
        case .version9:
          try db.execute(SQL.migrate9to10)
          fallthrough
        case .version10:
          try db.execute(SQL.migrate10to11)
          fallthrough
        case .version11:
          try db.execute(SQL.migrate11to12)
          fallthrough
        case .version12:
          try db.execute(SQL.migrate12to13)
          fallthrough
        case .version13:
          try db.execute(SQL.migrate13to14)
        case .current: break
        }
      }
    }
    try switchToWAL(db, within: options.busyTimeout)
    try db.execute("PRAGMA synchronous = \(options.synchronous.rawValue)")
    try db.execute("PRAGMA foreign_keys = ON")
  }

  /// Sets WAL mode, retrying for up to `timeout` while another connection holds a lock: SQLite
  /// answers a journal-mode change that needs the exclusive lock with `SQLITE_BUSY` at once,
  /// without calling the busy handler. On a database already in WAL mode it is a no-op.
  private static func switchToWAL(_ db: Connection, within timeout: Duration) throws {
    let deadline = ContinuousClock.now + timeout
    var pause = Duration.milliseconds(1)
    while true {
      do {
        return try db.execute("PRAGMA journal_mode = WAL")
      } catch let error as SQLiteError
        where (error.code.primary == .busy || error.code.primary == .locked)
        && ContinuousClock.now + pause < deadline
      {
        Thread.sleep(forTimeInterval: pause / .seconds(1))
        pause = min(pause * 2, .milliseconds(50))
      }
    }
  }

  enum FileKind {
    case empty, version1, version2, version3, version4, version5, version6, version7, version8, version9,
      version10, version11, version12, version13, current
  }

  /// Rebuilds a version 8 database as version 9 inside the caller's transaction, keeping every
  /// job and the `AUTOINCREMENT` counter.
  private static func migrateFromVersion8(_ db: Connection) throws {
    let sequence = try db.scalar(SQL.sequence, .text("jobs")) ?? 0
    try db.execute(SQL.migrate8to9)
    try db.execute(SQL.setSequence.replacingOccurrences(of: "?", with: String(sequence)))
  }

  /// Rebuilds a version 5 database as version 6 inside the caller's transaction, keeping every
  /// job and the `AUTOINCREMENT` counter.
  private static func migrateFromVersion5(_ db: Connection) throws {
    let sequence = try db.scalar(SQL.sequence, .text("jobs")) ?? 0
    try db.execute(SQL.migrate5to6(now: millis(Date())))
    try db.execute(SQL.setSequence.replacingOccurrences(of: "?", with: String(sequence)))
    // Version 5 kept a last error whole: the list of errors it starts is bounded as every error
    // recorded since, a batch of jobs at a time.
    var after: Int64 = 0
    while true {
      var batch: [(id: Int64, error: String)] = []
      try db.query(SQL.longErrors, .integer(after)) { batch.append(($0.int64(0), $0.text(1) ?? "")) }
      for job in batch { try db.run(SQL.setErrors, .text(JobHistory.bounded(job.error)), .integer(job.id)) }
      guard let last = batch.last else { return }
      after = last.id
    }
  }

  /// Rebuilds a version 1 database as version 2 inside the caller's transaction, keeping every
  /// job and the `AUTOINCREMENT` counter (so no ID of a deleted job is ever reused).
  private static func migrateFromVersion1(_ db: Connection) throws {
    let sequence = try db.scalar(SQL.sequence, .text("jobs")) ?? 0
    try db.execute(SQL.migrate1to2)
    try db.execute(SQL.setSequence.replacingOccurrences(of: "?", with: String(sequence)))
  }

  /// Reads the header and schema without writing; throws for anything but an empty or a Conveyor file.
  static func inspect(_ db: Connection, path: String) throws -> FileKind {
    // SQLite reads a file shorter than its header as an empty database (and a store would then
    // write a database over it); no database file is shorter than a page of 512 bytes.
    let size = fileSize(path)
    if size > 0 && size < 512 {
      throw SQLiteJobStoreError(
        code: .notADatabase, path: path,
        message: "this file is not an SQLite database (\(size) bytes, less than any database page), so it "
          + "was left untouched; pass the path of a Conveyor database, or a new path to create one")
    }
    let applicationID: Int64
    let version: Int64
    let objects: Int64
    do {
      // One statement, so one snapshot: read separately, the header and the schema could come
      // from before and after another process installs the schema.
      var header: (Int64, Int64, Int64) = (0, 0, 0)
      try db.query(SQL.inspect) { header = ($0.int64(0), $0.int64(1), $0.int64(2)) }
      (applicationID, version, objects) = header
    } catch let error as SQLiteError {
      switch error.code {
      case .notADatabase:
        throw SQLiteJobStoreError(
          code: .notADatabase, path: path,
          message: "this file is not an SQLite database, so it was left untouched; "
            + "pass the path of a Conveyor database, or a new path to create one")
      case .corrupt:
        throw SQLiteJobStoreError(
          code: .corrupt, path: path,
          message: "this database is damaged (\(error.message)); it was left untouched. "
            + "Restore it from a backup, or move it aside so a new database is created")
      default:
        throw error
      }
    }
    if applicationID == 0 && version == 0 && objects == 0 { return .empty }
    guard applicationID == Int64(Self.applicationID) else {
      throw SQLiteJobStoreError(
        code: .foreignDatabase, path: path,
        message: "this is another application's SQLite database (application_id \(applicationID), "
          + "\(objects) schema objects), so it was left untouched; choose another path for Conveyor")
    }
    guard version <= Int64(Self.schemaVersion) else {
      throw SQLiteJobStoreError(
        code: .newerSchema, path: path,
        message: "this Conveyor database has schema version \(version), newer than the version "
          + "\(Self.schemaVersion) this build knows; it was left untouched. Upgrade Conveyor to open it")
    }
    if version == 1 { return .version1 }
    if version == 2 { return .version2 }
    if version == 3 { return .version3 }
    if version == 4 { return .version4 }
    if version == 5 { return .version5 }
    if version == 6 { return .version6 }
    if version == 7 { return .version7 }
    if version == 8 { return .version8 }
    if version == 9 { return .version9 }
    if version == 10 { return .version10 }
    if version == 11 { return .version11 }
    if version == 12 { return .version12 }
    if version == 13 { return .version13 }
    guard version == Int64(Self.schemaVersion) else {
      throw SQLiteJobStoreError(
        code: .unsupportedSchema, path: path,
        message: "this Conveyor database has schema version \(version), which this build cannot "
          + "open; it was left untouched. Move it aside so a new database is created")
    }
    return .current
  }

  private static func validate(name: String) throws {
    let allowed = Set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-".utf8)
    let valid =
      (1...128).contains(name.utf8.count) && name.utf8.allSatisfy(allowed.contains) && name != "."
      && name != ".."
    guard valid else {
      throw SQLiteJobStoreError(
        code: .invalidName, path: name,
        message: "a database name must be 1 to 128 characters from A-Z, a-z, 0-9, '.', '_' and '-' "
          + "(and not '.' or '..'); pass a name such as \"conveyor\" or an explicit path")
    }
  }

  /// The absolute path of the default database folder. Plain strings, never Foundation's path
  /// calls (see `PathCheck`): `HOME` and `XDG_DATA_HOME` are whatever the environment holds.
  private static func defaultFolder(environment: [String: String]) throws -> String {
    #if canImport(Darwin)
      let support: URL
      do {
        support = try FileManager.default.url(
          for: .applicationSupportDirectory, in: .userDomainMask, appropriateFor: nil, create: true)
      } catch {
        throw SQLiteJobStoreError(
          code: .cannotCreate, path: "Application Support",
          message: "cannot locate Application Support (\(error.localizedDescription)); pass an explicit path")
      }
      return PathCheck.joined(support.path, "conveyor")
    #else
      // A relative XDG_DATA_HOME is ignored, as the XDG specification says.
      if let data = environment["XDG_DATA_HOME"], data.hasPrefix("/"), !data.utf8.contains(0) {
        return PathCheck.joined(data, "conveyor")
      }
      let home = environment["HOME"].flatMap { $0.isEmpty ? nil : $0 } ?? NSHomeDirectory()
      guard home.hasPrefix("/"), !home.utf8.contains(0) else {
        throw SQLiteJobStoreError(
          code: .cannotCreate, path: home,
          message: "HOME is not an absolute path, so the default database folder is unknown; "
            + "set HOME or XDG_DATA_HOME to an absolute path, or pass an explicit path")
      }
      return PathCheck.joined(home, ".local/share/conveyor")
    #endif
  }
}

/// Closes a file descriptor (`close` inside the store's methods names ``SQLiteJobStore/close()``).
private func closeDescriptor(_ descriptor: Int32) {
  close(descriptor)
}

/// Opens `path` for creation only, failing with `EEXIST` when it exists; mode 0600.
private func createExclusively(_ path: String) -> Int32 {
  open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
}

/// Whole milliseconds since 1970, rounded and clamped: how the store keeps dates.
func millis(_ date: Date) -> Int64 { JobStoreTime.milliseconds(date) }

/// `milliseconds` moved by `duration`, both clamped as every store clamps them.
func millis(_ milliseconds: Int64, adding duration: Duration) -> Int64 {
  JobStoreTime.milliseconds(
    JobStoreTime.date(JobStoreTime.date(milliseconds: milliseconds), adding: duration))
}

/// The date `milliseconds` after 1970.
func date(_ milliseconds: Int64) -> Date { JobStoreTime.date(milliseconds: milliseconds) }

/// A duration in whole milliseconds, clamped to `Int32`.
private func milliseconds(_ duration: Duration) -> Int32 {
  Int32(clamping: JobStoreTime.milliseconds(duration))
}
