import CLibPQ
import Conveyor
import Foundation
import Synchronization

/// A `JobStore` on a PostgreSQL server, shared by any number of worker processes on any number
/// of machines.
///
/// Claims take ready jobs with `FOR UPDATE SKIP LOCKED`, so workers never wait for each other;
/// each worker's outcomes and its next claim go in one transaction (outcomes first). Leases and
/// run dates come from the database's clock (see ``Clock``), so machines whose clocks disagree
/// neither steal each other's jobs nor run scheduled jobs early. The pause flag is stored in the
/// database. Whatever makes a job ready (an `add`, a retry or release, a rescued lease, a resume or
/// re-queue) notifies idle workers through `LISTEN`/`NOTIFY`; polling remains the fallback.
///
/// ```swift
/// let store = try await PostgresJobStore.open(url: "postgres://worker@db.internal/app")
/// let queue = try JobQueue<Email>(configuration: .init(identifier: "mail"), store: store) { email, _ in
///   try await send(email)
///   return .handled
/// }
/// ```
///
/// The schema (default `conveyor`) is created and migrated when the store opens, under an
/// advisory lock, so many processes may start at once. A database whose schema was migrated by a
/// newer Conveyor is refused with ``PostgresError/Code/newerSchema`` and left untouched.
///
/// libpq runs on a thread of the store's own, never on Swift's cooperative pool. A connection that
/// breaks (the server restarts, `pg_terminate_backend`, a network cut) is opened again with backoff
/// for up to ``Options/reconnectTimeout`` and the call is run again, so workers resume unaided.
///
/// Applications can add a job inside their own transaction with the SQL function the migrations
/// install: `SELECT conveyor.enqueue('mail', '{"to":"a@example.com"}')`; the job exists if and only
/// if the transaction commits.
public final class PostgresJobStore: JobStore {
  /// Whose clock dates the store's leases and run dates.
  public enum Clock: Sendable, Hashable {
    /// The database server's (`statement_timestamp()`): one clock for every worker on every
    /// machine. The `clock` arguments of the `JobStore` methods are ignored, except to express
    /// `nextWake(queue:clock:)`'s dates on the caller's clock. The default.
    case database
    /// The `JobClock` each call passes: for tests that drive time by hand, and for workers on one
    /// machine. Workers on machines whose clocks disagree could take each other's jobs early.
    case caller
  }

  /// How the store's connections reach the server.
  public enum Pooling: Sendable, Hashable {
    /// Straight to the server, or through a pooler in session mode (PgBouncer's `pool_mode =
    /// session`): each connection is one server session for its whole life, so the store
    /// prepares its statements once and makes its settings once per session. The default.
    case none
    /// Through a pooler in transaction mode (PgBouncer's `pool_mode = transaction`), where each
    /// transaction may run on another server session and nothing a session holds carries over:
    /// the store prepares no statement (each is sent whole and planned for its values) and makes
    /// its settings (`lock_timeout` and the planner's) for each transaction only, in the same round
    /// trip. `LISTEN` needs a session of its own: the store listens on `listenURL`, a connection
    /// straight to the server (not through the pooler); nil listens nowhere, and idle workers
    /// learn of new jobs by polling (`JobQueueConfiguration.pollInterval`).
    case transaction(listenURL: String?)
  }

  /// How the store connects and where it keeps its tables.
  public struct Options: Sendable, Hashable {
    /// The schema holding the tables (created when missing): a plain lowercase identifier,
    /// `[a-z_][a-z0-9_]*`, at most 50 bytes. Default `conveyor`.
    public var schema: String
    /// Whose clock dates leases and run dates. Default ``Clock/database``.
    public var clock: Clock
    /// With the caller's clock, the shortest time a claim's transaction may have run before it
    /// reached its queue's limit lock (a settlement that waited for an ordering key's lock, a slow
    /// statement) for a rate to count the claim's start from then, not from the caller's reading
    /// before it was sent; the wait for the limit lock itself always counts. Shorter runs are the
    /// usual cost of the statements before, which a caller's clock should not drift by. Nil: never
    /// (tests on a fixed clock). Default 10 ms.
    package var claimDelayCounted: Duration? = .milliseconds(10)
    /// How long a call keeps trying to open a broken connection again before it fails. Default
    /// 60 seconds; not negative. A call always makes one whole attempt to connect (bounded by the
    /// URL's `connect_timeout`, 30 s without one), even when this is zero.
    public var reconnectTimeout: Duration
    /// The longest a statement waits for a row lock another connection holds
    /// (`lock_timeout`). Default 5 seconds; zero waits as long as it takes; at most about 24 days.
    public var lockTimeout: Duration
    /// The longest one call may wait for the server before its connection is given up and the
    /// call tried again on a new one (within ``reconnectTimeout``): a server that stopped
    /// answering, or a network cut that sent no reset, would otherwise hold the call forever.
    /// Default 60 seconds, at least 100 ms; nil waits as long as the server takes. A call that
    /// still gets no answer fails with ``PostgresError/Code/timedOut``. Each statement of opening
    /// the store (its session setup, the wait for another process's migration, each migration)
    /// gets this too, at least 30 seconds. The store's
    /// listening connection gives up a statement unanswered for as long (60 s when nil).
    public var callTimeout: Duration?
    /// How long a caller may wait on its own thread for the answer to its call before it
    /// suspends. Default 400 µs, at most 1 ms (a longer value counts as 1 ms); `.zero` always
    /// suspends at once.
    ///
    /// libpq always runs on the store's thread. When a call is the only one of the process in
    /// flight and its connection's last call took less than this, the calling thread polls for
    /// the answer (yielding the processor between looks) instead of suspending at once. A reply
    /// within the wait then costs no thread wake-ups: on a virtual machine the two wake-ups of a
    /// suspend and resume (the store's thread, then a thread of the cooperative pool) cost more
    /// than the statement. Each call hands its pool thread back within this wait, and no caller
    /// waits while another call of the process is in flight or for 10 ms after calls stopped
    /// overlapping (several workers), so concurrent work keeps the pool and the processors; after
    /// waits add up to a millisecond, the caller that reaches it lets the pool's other tasks run.
    public var answerWait: Duration
    /// How long opening the store keeps trying to connect while the server cannot be reached
    /// yet (refused, unreachable, starting up, shutting down, out of connection slots): a worker
    /// started before its database, as containers often are. Attempts follow each other with
    /// backoff (0.1 s doubling to 5 s). A failure that waiting cannot mend (a wrong password, a
    /// database or role that does not exist, a refused `pg_hba.conf` entry) fails at once. Default
    /// zero: one attempt, so a tool or test learns of a wrong URL at once; set it for a worker
    /// process that may start before its database (`conveyor work` waits 60 seconds by default).
    /// ``PostgresJobStore/open(url:options:onWait:)`` ends the wait at once when its task is
    /// cancelled.
    public var startupWait: Duration
    /// How the connections reach the server: straight (or through a pooler in session mode), or
    /// through a pooler in transaction mode such as PgBouncer's. Default ``Pooling/none``.
    public var pooling: Pooling

    /// Creates options.
    ///
    /// - Parameters:
    ///   - schema: The schema holding the tables.
    ///   - clock: Whose clock dates leases and run dates.
    ///   - reconnectTimeout: How long a call retries a broken connection.
    ///   - lockTimeout: The longest a statement waits for a row lock.
    ///   - callTimeout: The longest one call may wait for the server.
    ///   - answerWait: How long a lone caller may wait on its thread for the answer.
    ///   - startupWait: How long opening waits for a server that cannot be reached yet.
    ///   - pooling: How the connections reach the server.
    public init(
      schema: String = "conveyor", clock: Clock = .database, reconnectTimeout: Duration = .seconds(60),
      lockTimeout: Duration = .seconds(5), callTimeout: Duration? = .seconds(60),
      answerWait: Duration = .microseconds(400), startupWait: Duration = .zero, pooling: Pooling = .none
    ) {
      self.pooling = pooling
      self.startupWait = startupWait
      self.callTimeout = callTimeout
      self.answerWait = answerWait
      self.schema = schema
      self.clock = clock
      self.reconnectTimeout = reconnectTimeout
      self.lockTimeout = lockTimeout
    }
  }

  /// The schema version this build writes and reads (2 added the activity table; 3 left the
  /// store's own inserts to send their wake-up themselves, without the insert trigger; 4 the
  /// place a retried job takes among ready ones; 5 a job's own time limit; 6 the history of
  /// finished jobs; 7 an index of the running and completed jobs with a deduplication key; 8 stored
  /// schedules; 9 ordering keys; 10 the queues' stored limits; 11 their rates; 12 limits per key; 13
  /// rates per key; 14 fair shares).
  public static let schemaVersion = 14

  /// The options the store was opened with.
  public let options: Options
  /// The server, port, database and user, without the password: for messages.
  public let target: String
  let sql: SQL
  let connection: SerializedConnection
  /// Hears of work on the store's channel; nil through a transaction pooler with no `listenURL`.
  let listener: Listener?
  /// Adds waiting to be committed together (see ``enqueue(_:queue:clock:)``).
  let adds = EnqueueGroups()
  /// The queues whose last claim here found rates per key (`SQL.limitLock`'s `keyRated`), or whose
  /// limits this store set with one: only their claims send `SQL.releaseDueKeys`, a statement that
  /// cost a claim of a queue without rates per key a tenth of its speed. A queue that gained rates
  /// per key elsewhere is learned from its next claim here; jobs its rates hold are released by the
  /// claim after (its next wake is due), so the cache costs at most one claim's delay.
  let keyRatedQueues = Mutex<Set<ExactText>>([])

  /// Connects, creates or migrates the schema, and returns the store. Blocks the calling thread
  /// while it connects; from an `async` context prefer ``open(url:options:onWait:)``.
  ///
  /// - Parameters:
  ///   - url: A `postgres://` or `postgresql://` URL, or a libpq conninfo string such as
  ///     `"host=db dbname=app"`. libpq's `PG*` environment variables fill in what it leaves out,
  ///     and its parameters (`sslmode`, `connect_timeout`, …) work as in `psql`.
  ///   - options: The schema, clock and timeouts.
  /// - Throws: ``PostgresError``. A server that cannot be reached yet is tried again with
  ///   backoff for up to ``Options/startupWait`` (by default not at all), then fails with
  ///   ``PostgresError/Code/connectionFailed`` naming the last failure; one that refuses the
  ///   login for good (a wrong password, say) or goes away while the store opens fails at once.
  ///   Each attempt to connect gives up after the URL's `connect_timeout` (30 s without one). Once connected, each statement of the opening
  ///   (the session setup, the wait for another process's migration, each migration) gets
  ///   ``Options/callTimeout``, at least 30 s, and a server that stops answering fails it with
  ///   ``PostgresError/Code/timedOut``; with `callTimeout` nil it waits as long as the server
  ///   takes. Once open, the store reconnects on its own, with backoff. A timeout out of range
  ///   fails with ``PostgresError/Code/invalidOptions``, before any connection is made.
  public convenience init(url: String, options: Options = .init()) throws {
    try self.init(url: url, options: options, isCancelled: { false }, onWait: nil)
  }

  /// Opens the store, waiting for the server as ``Options/startupWait`` allows; `isCancelled` ends
  /// the wait (throwing `CancellationError`); `onWait` hears, once, that the first attempt failed
  /// and the opening waits.
  private init(
    url: String, options: Options, isCancelled: @escaping @Sendable () -> Bool,
    onWait: (@Sendable (PostgresError) -> Void)?
  ) throws {
    try Self.validate(schema: options.schema)
    try Self.validate(options)
    let info = try ConnectionInfo(url)
    self.options = options
    self.target = info.target
    let sql = SQL(schema: options.schema)
    self.sql = sql
    // Whole milliseconds, a positive timeout at least one (PostgreSQL reads 0 as no limit).
    let lockTimeout =
      options.lockTimeout > .zero ? max(1, JobStoreTime.milliseconds(options.lockTimeout)) : 0
    let pooled = options.pooling != .none
    let setup: @Sendable (Connection) throws -> Void = { connection in
      if pooled {
        // Through a transaction pooler: no session state. The same settings, for each
        // transaction (no generic plans: nothing is prepared, so each statement is planned for
        // its values).
        connection.transactionSettings = """
          SELECT set_config('lock_timeout', '\(lockTimeout)ms', true), set_config('enable_seqscan', 'off', true),
            set_config('enable_mergejoin', 'off', true), set_config('\(SQL.storeSessionSetting)', 'on', true)
          """
        return
      }
      // Sent unprepared: a statement of its own, run once per connection.
      try connection.execute(
        "SELECT set_config('lock_timeout', $1, false)", [.text("\(lockTimeout)ms")], prepared: false)
      // The hot statements are prepared and planned once per connection, for every value (a
      // generic plan). Left to choose (`auto`), the server kept planning the insert and the
      // settlement on every call (it costs their generic plans higher than plans for one job),
      // and planning cost more than running them. Rare calls (removing, clearing, re-queueing,
      // listing) are sent unprepared and planned for their values.
      //
      // A plan kept for the life of a connection must stay right as the queue grows from ten
      // jobs to millions, without waiting for an ANALYZE: every statement of the store is
      // written to read its rows through an index, driven by a small set (a limit, an array of
      // IDs), so sequential scans and merge joins (which read a whole table or index) are turned
      // off for the session, and the planner's guess of a small table cannot make one look
      // cheaper. Hash joins stay: joining a batch's jobs with its settlements by hash is linear.
      // `ExplainTests` and the review's growth test check the plans.
      try connection.executeScript(
        """
        SET plan_cache_mode = force_generic_plan;
        SET enable_seqscan = off;
        SET enable_mergejoin = off;
        SET \(SQL.storeSessionSetting) = on
        """)
    }
    // Migrate on the calling thread, on a connection of its own, closed before returning. The
    // wait for another process's migration and the migrations' own locks (an `ALTER TABLE`
    // waits for the transactions using the table) are bounded by `callTimeout` alone:
    // `lockTimeout` bounds the store's calls, not its opening.
    _ = try Self.onOpeningConnection(
      url: url, info: info, options: options, lockTimeout: .zero, isCancelled: isCancelled, onWait: onWait
    ) { migrating, restart in
      try Migrations.apply(sql, schemaName: options.schema, on: migrating, beforeEachStatement: restart)
    }
    connection = SerializedConnection(
      label: "Conveyor.PostgresJobStore", conninfo: url, scrubber: info.scrubber,
      reconnectTimeout: options.reconnectTimeout, callTimeout: options.callTimeout,
      answerWait: options.answerWait, setup: setup)
    let listenURL: String?
    switch options.pooling {
    case .none: listenURL = url
    case .transaction(let direct): listenURL = direct
    }
    listener = try listenURL.map { listenURL in
      Listener(
        conninfo: listenURL, scrubber: try ConnectionInfo(listenURL).scrubber, channel: sql.channel,
        cancelChannel: sql.cancelChannel,
        answerTimeout: options.callTimeout ?? .seconds(60))
    }
  }

  /// The least time opening a store may take for its session setup and migrations, whatever
  /// ``Options/callTimeout`` says.
  static let shortestOpeningLimit = Duration.seconds(30)

  /// Runs `body` on a connection of its own (connected as ``Options/startupWait`` allows, closed
  /// before returning), as the opening does: each statement `body` marks by calling its second
  /// argument gets ``Options/callTimeout``, at least 30 s (a server silent after the handshake
  /// fails with ``PostgresError/Code/timedOut``); lock waits get `lockTimeout` (`.zero`: no
  /// limit); `isCancelled` shuts the socket, and the call throws `CancellationError`.
  static func onOpeningConnection<T>(
    url: String, info: ConnectionInfo, options: Options, lockTimeout: Duration,
    purpose: String = "opening the store: a statement of its session setup or migrations (or the wait for "
      + "another process's migration)",
    isCancelled: @escaping @Sendable () -> Bool, onWait: (@Sendable (PostgresError) -> Void)?,
    _ body: (Connection, _ restartDeadline: () -> Void) throws -> T
  ) throws -> T {
    let connection = try connectWaiting(
      url, scrubber: info.scrubber, wait: options.startupWait, isCancelled: isCancelled, onWait: onWait)
    let limit = options.callTimeout.map { max($0, shortestOpeningLimit) }
    let deadline = limit.map { SocketDeadline(socket: connection.socketDescriptor, after: $0) }
    // Cancelling ends a wait (for another process's migration, a lock) at once: the socket is
    // shut down, and the statement waiting fails.
    let cancelling = CancellationWatch(socket: connection.socketDescriptor, isCancelled: isCancelled)
    // Whole milliseconds, a positive timeout at least one (PostgreSQL reads 0 as no limit).
    let milliseconds = lockTimeout > .zero ? max(1, JobStoreTime.milliseconds(lockTimeout)) : 0
    do {
      return try withExtendedLifetime(connection) {
        defer {
          deadline?.disarm()
          cancelling.disarm()
        }
        if options.pooling != .none {
          connection.transactionSettings = "SELECT set_config('lock_timeout', '\(milliseconds)ms', true)"
        } else {
          try connection.execute(
            "SELECT set_config('lock_timeout', $1, false)", [.text("\(milliseconds)ms")], prepared: false)
        }
        return try body(connection) { deadline?.restart() }
      }
    } catch let error as PostgresError where error.isConnectionLoss && cancelling.fired {
      throw CancellationError()
    } catch let error as PostgresError where error.isConnectionLoss && deadline?.fired == true {
      // Only the failure the shutdown caused: an error of its own (a newer schema) whose
      // rollback then went unanswered stays what it is.
      throw PostgresError(
        code: .timedOut,
        message: "\(purpose) got no answer within \(limit ?? .zero) (callTimeout, at least 30 s), so it "
          + "closed the connection",
        sqlState: error.sqlState, sql: error.sql)
    }
  }

  /// Connects and migrates without blocking the caller's thread, or any thread of the
  /// cooperative pool: the connecting (which may wait for the server up to its connect timeout)
  /// runs on a thread of its own. See ``init(url:options:)``.
  ///
  /// - Parameters:
  ///   - url: A `postgres://` URL or a libpq conninfo string.
  ///   - options: The schema, clock and timeouts.
  ///   - onWait: Called once, on a thread of the store's, when the first attempt to connect failed
  ///     and the opening waits for the server (``Options/startupWait``): say so to the operator.
  ///   Cancelling the calling task ends the wait at once with `CancellationError`.
  public static func open(
    url: String, options: Options = .init(), onWait: (@Sendable (PostgresError) -> Void)? = nil
  ) async throws -> PostgresJobStore {
    let cancelled = Atomic<Bool>(false)
    return try await withTaskCancellationHandler {
      try await onOwnThread(name: "conveyor-postgres-open") {
        try PostgresJobStore(
          url: url, options: options, isCancelled: { cancelled.load(ordering: .relaxed) }, onWait: onWait)
      }
    } onCancel: {
      cancelled.store(true, ordering: .relaxed)
    }
  }

  /// Connects, trying again with backoff (0.1 s doubling to 5 s) while the failure is one that
  /// waiting may mend (``isWorthWaitingFor(_:)``) and `wait` has not passed; `onWait` hears of the
  /// first failure. Cancellation (`isCancelled`, looked at every 50 ms at least) ends it.
  static func connectWaiting(
    _ url: String, scrubber: Scrubber, wait: Duration, isCancelled: () -> Bool,
    onWait: (@Sendable (PostgresError) -> Void)?
  ) throws -> Connection {
    let deadline = ContinuousClock.now + wait
    var pause = Duration.milliseconds(100)
    var said = false
    while true {
      if isCancelled() { throw CancellationError() }
      do {
        return try Connection(conninfo: url, scrubber: scrubber, isCancelled: isCancelled)
      } catch let error as PostgresError where isWorthWaitingFor(error) && ContinuousClock.now < deadline {
        if !said {
          said = true
          onWait?(error)
        }
        let resume = min(ContinuousClock.now + pause, deadline)
        while ContinuousClock.now < resume {
          if isCancelled() { throw CancellationError() }
          Thread.sleep(forTimeInterval: min(0.05, (resume - ContinuousClock.now) / .seconds(1)))
        }
        pause = min(pause * 2, .seconds(5))
      } catch let error as PostgresError where isWorthWaitingFor(error) && said {
        throw PostgresError(
          code: error.code,
          message: "the server could not be reached within startupWait (\(wait)); the last attempt: "
            + error.message, sqlState: error.sqlState, sql: error.sql)
      }
    }
  }

  /// Whether a failure to connect may pass by waiting: anything but a refusal the server gave
  /// for good (authentication, a role or database that does not exist, `pg_hba.conf`, a
  /// connection string or option libpq rejects).
  static func isWorthWaitingFor(_ error: PostgresError) -> Bool {
    guard error.code == .connectionFailed else { return false }
    let permanent = [
      "password authentication failed", "authentication failed", "does not exist", "no pg_hba.conf entry",
      "invalid connection option", "missing \"=\"", "invalid sslmode", "invalid port",
      "invalid integer value",
      "server does not support ssl", "permission denied", "could not allocate",
    ]
    let message = error.message.lowercased()
    return !permanent.contains { message.contains($0.lowercased()) }
  }

  deinit { listener?.stop() }

  /// Closes the connections once the calls already made have finished. Later calls throw
  /// ``PostgresError`` with code ``PostgresError/Code/closed``.
  public func close() async {
    listener?.stop()
    await connection.close()
  }

  /// The longest a statement waits for another connection's row lock: ``Options/lockTimeout``.
  public var maximumLockWait: Duration { options.lockTimeout }

  /// `PostgresJobStore.Options.lockTimeout`.
  public var maximumLockWaitSetting: String { "PostgresJobStore.Options.lockTimeout" }

  /// The time a statement uses: the caller's clock, or NULL for the database's.
  func now(_ clock: any JobClock) -> PostgresValue {
    options.clock == .caller ? .timestamp(clock.now()) : .timestamp(nil)
  }

  // MARK: - JobStore

  /// Commits new jobs to a queue in one transaction, in order, skipping duplicates by key.
  ///
  /// Returns once the jobs are committed. A call made while no other add of this store is under
  /// way runs at once (a lone caller may wait on its own thread for the answer). Calls that arrive
  /// while another add is under way wait for it, then are committed together, in one transaction
  /// (group commit: one commit, so one flush of the server's log, for all of them), each getting
  /// its own jobs' IDs. When a call of a group fails, the group is rolled back and each of its
  /// calls runs again alone, so one call's failure fails only that call. A call cancelled while it
  /// waits for its group is not added and throws `CancellationError`; once its group is under way
  /// it is committed all the same.
  ///
  /// Not run again when the connection breaks while committing (the jobs could be added twice):
  /// that case throws ``PostgresError/Code/commitUnknown`` (to every call of the group).
  public func enqueue(_ jobs: [NewJob], queue: String, clock: any JobClock) async throws -> [EnqueueResult] {
    try OrderingKey.check(jobs)
    if jobs.isEmpty { return [] }
    let call = EnqueueCall(jobs: jobs, queue: queue, now: now(clock))
    let sql = self.sql
    switch adds.arrive(call) {
    case .lead:
      defer { flushWaitingAdds() }
      return try await connection.perform(idempotent: false) { db in try Self.commit(call, sql: sql, db: db) }
    case .follow(let ticket):
      return try await withTaskCancellationHandler {
        try await ticket.promise.valueIgnoringCancellation
      } onCancel: { [adds] in
        if adds.withdraw(ticket) { ticket.promise.fulfil(.failure(CancellationError())) }
      }
    }
  }

  /// Commits the adds that arrived while one was under way, as one group on the store's thread,
  /// then the ones that arrived meanwhile, until none waits.
  private func flushWaitingAdds() {
    let group = adds.leadEnded()
    guard !group.isEmpty else { return }
    let sql = self.sql
    let progress = GroupProgress(count: group.count)
    // Run again after a connection loss, going on from what `progress` holds (see `commitGroup`).
    connection.submit(idempotent: true) { db in
      try Self.commitGroup(group.map(\.call), sql: sql, db: db, progress: progress)
    } completion: { [self] outcome in
      switch outcome {
      case .success(let results):
        for (ticket, result) in zip(group, results) { ticket.promise.fulfil(result) }
      case .failure(let error):
        for ticket in group { ticket.promise.fulfil(.failure(error)) }
      }
      flushWaitingAdds()
    }
  }

  /// One call of ``enqueue(_:queue:clock:)``, ready to commit: its jobs, and which of them share a
  /// deduplication key.
  struct EnqueueCall: Sendable {
    var jobs: [NewJob]
    var queue: String
    var now: PostgresValue
    /// The call's distinct keys, in byte order (the order their locks are taken in).
    var keys: [Data]
    /// The jobs that are not the same as an earlier job of the call.
    var candidates: [Int]
    /// For each job, the earlier job of the call with its key (nil: none).
    var sameAs: [Int?]
    /// The call's distinct ordering keys: the lines whose locks it takes.
    var orderingKeys: [String]
    /// Whether the call takes locks (it has deduplication or ordering keys), so runs in a
    /// transaction of its own.
    var needsLocks: Bool { !keys.isEmpty || !orderingKeys.isEmpty }

    init(jobs: [NewJob], queue: String, now: PostgresValue) {
      self.jobs = jobs
      self.queue = queue
      self.now = now
      // Within the batch, a later job with an earlier job's key is that job. Keys are compared by
      // their bytes, as the database compares them (`String` takes canonically equivalent texts,
      // a precomposed and a decomposed "é", for one key).
      var firstWithKey: [Data: Int] = [:]
      var sameAs: [Int?] = []
      for (index, job) in jobs.enumerated() {
        if let key = job.deduplicationKey.map({ Data($0.utf8) }), let first = firstWithKey[key] {
          sameAs.append(first)
        } else {
          if let key = job.deduplicationKey { firstWithKey[Data(key.utf8)] = index }
          sameAs.append(nil)
        }
      }
      self.sameAs = sameAs
      keys = firstWithKey.keys.sorted { $0.lexicographicallyPrecedes($1) }
      candidates = sameAs.indices.filter { sameAs[$0] == nil }
      orderingKeys = Set(jobs.compactMap(\.orderingKey)).sorted()
    }

    /// The payload and key bytes of the call: what bounds a group.
    var bytes: Int {
      jobs.reduce(0) {
        $0 + $1.payload.count + ($1.deduplicationKey?.utf8.count ?? 0) + ($1.orderingKey?.utf8.count ?? 0)
          + ($1.limitKey?.utf8.count ?? 0)
      }
    }
  }

  /// Commits one call in its own transaction (a call without keys, deduplication or ordering, is
  /// one statement, atomic on its own).
  static func commit(_ call: EnqueueCall, sql: SQL, db: Connection) throws -> [EnqueueResult] {
    do {
      return !call.needsLocks
        ? try insert(call, sql: sql, db: db) : try db.transaction { try insert(call, sql: sql, db: db) }
    } catch let error as PostgresError where error.sqlState == "54000" && !call.keys.isEmpty {
      // An index entry over PostgreSQL's limit: with a key, the key is what made it so.
      let longest = call.keys.map(\.count).max() ?? 0
      throw PostgresError(
        code: error.code,
        message: "a deduplication key of \(longest) bytes is too long for PostgreSQL's index of keys "
          + "(about 2,700 bytes with the queue name, after compression); nothing of this add was "
          + "stored: use a shorter key, such as a hash of it",
        sqlState: error.sqlState, sql: error.sql, detail: error.message)
    }
  }

  /// The outcomes of a group's calls as they become known, kept across the runs of the group's
  /// block: a run after a reconnect goes on with the calls not settled yet.
  final class GroupProgress: Sendable {
    private struct State {
      var together = true
      var outcomes: [Result<[EnqueueResult], any Error>?]
    }
    private let state: Mutex<State>
    init(count: Int) { state = Mutex(State(outcomes: Array(repeating: nil, count: count))) }
    var together: Bool {
      get { state.withLock { $0.together } }
      set { state.withLock { $0.together = newValue } }
    }
    subscript(index: Int) -> Result<[EnqueueResult], any Error>? {
      get { state.withLock { $0.outcomes[index] } }
      set { state.withLock { $0.outcomes[index] = newValue } }
    }
    var all: [Result<[EnqueueResult], any Error>] { state.withLock { $0.outcomes.map { $0! } } }
  }

  /// Commits several calls in one transaction: without keys, their insert statements in one
  /// pipeline (one round trip, one commit); with keys, every call's key locks first (all of them,
  /// in one order, as a single call takes its own: two adds never deadlock), then the calls one
  /// after another. A statement that fails (a trigger's refusal or dropped row, a key too long)
  /// rolls the whole group back, and then each call runs alone, so each gets its own outcome. A
  /// connection lost before the group committed runs it again (the block is run again after the
  /// reconnect); lost while it committed, every call of the group gets ``PostgresError/Code/commitUnknown``.
  /// While the calls run alone, a connection lost during one call's commit gives that call
  /// `commitUnknown`, and the others run on after the reconnect.
  static func commitGroup(_ calls: [EnqueueCall], sql: SQL, db: Connection, progress: GroupProgress) throws
    -> [Result<[EnqueueResult], any Error>]
  {
    if progress.together {
      do {
        let outcomes: [Result<[EnqueueResult], any Error>]
        if !calls.contains(where: \.needsLocks) {
          // Checked statements: a row a trigger drops fails the pipeline, so nothing commits.
          let statements = calls.map {
            insertStatement($0, inserting: $0.candidates, sql: sql, checked: true)
          }
          let results = try db.pipeline(statements)
          outcomes = zip(calls, results).map { call, rows in
            Result {
              try Self.results(
                call, existing: [:], ids: try insertedIDs(rows, expected: call.candidates.count))
            }
          }
        } else {
          outcomes = try db.transaction {
            let pairs = calls.flatMap { call in call.keys.map { (call.queue, $0) } }
            let lines = calls.flatMap { call in call.orderingKeys.map { (call.queue, $0) } }
            try db.execute(
              sql.lockKeysOfQueues,
              [
                .textArray(pairs.map(\.0)), .byteaArray(pairs.map(\.1)), .textArray(lines.map(\.0)),
                .textArray(lines.map(\.1)),
              ])
            return try calls.map { .success(try insert($0, sql: sql, db: db, keysLocked: true)) }
          }
        }
        for (index, outcome) in outcomes.enumerated() { progress[index] = outcome }
        return progress.all
      } catch let error as PostgresError where error.isConnectionLoss {
        guard db.lostDuringCommit else { throw error }
        let unknown = Self.commitUnknown(error)
        for index in calls.indices { progress[index] = .failure(unknown) }
        return progress.all
      } catch {
        progress.together = false
      }
    }
    for (index, call) in calls.enumerated() where progress[index] == nil {
      do {
        progress[index] = .success(try commit(call, sql: sql, db: db))
      } catch let error as PostgresError where error.isConnectionLoss {
        if db.lostDuringCommit { progress[index] = .failure(Self.commitUnknown(error)) }
        throw error
      } catch {
        progress[index] = .failure(error)
      }
    }
    return progress.all
  }

  private static func commitUnknown(_ error: PostgresError) -> PostgresError {
    PostgresError(
      code: .commitUnknown,
      message: "the connection broke while the transaction was committing (\(error.message)); "
        + "whether it committed is unknown", sqlState: error.sqlState, sql: error.sql)
  }

  /// Runs a call's statements on `db` (inside a transaction when it has keys): the key locks and
  /// the look for waiting duplicates, then one insert of the jobs to add.
  static func insert(_ call: EnqueueCall, sql: SQL, db: Connection, keysLocked: Bool = false) throws
    -> [EnqueueResult]
  {
    if call.jobs.contains(where: \.hasDeduplicationOptions) {
      return try insertEach(call, sql: sql, db: db, keysLocked: keysLocked)
    }
    var existing: [Data: Int64] = [:]
    if call.needsLocks, !keysLocked { try lockKeys(call, sql: sql, db: db) }
    if !call.keys.isEmpty {
      let found = try db.execute(sql.findDuplicates, [.text(call.queue), .byteaArray(call.keys)])
      for row in 0..<found.count { existing[found.data(row, 0)] = found.int64(row, 1) }
    }
    let inserting = call.candidates.filter { index in
      call.jobs[index].deduplicationKey.map { existing[Data($0.utf8)] == nil } ?? true
    }
    var ids: [Int64] = []
    if !inserting.isEmpty {
      let statement = insertStatement(call, inserting: inserting, sql: sql)
      ids = try insertedIDs(try db.execute(statement.sql, statement.parameters), expected: inserting.count)
    }
    return try results(call, existing: existing, ids: ids, inserting: inserting)
  }

  /// Takes the locks of a call's deduplication keys and of its ordering keys' lines, in one pass
  /// (``SQL/lockKeys(_:)``).
  private static func lockKeys(_ call: EnqueueCall, sql: SQL, db: Connection) throws {
    try db.execute(
      sql.lockKeys, [.text(call.queue), .byteaArray(call.keys), .textArray(call.orderingKeys)])
  }

  /// Runs a call with a job whose key has a scope or a conflict choice other than the defaults
  /// (inside a transaction, its keys locked), one job at a time in order: each looks for the
  /// existing job of its key within its scope (a waiting one first), then keeps it, replaces it
  /// or inserts a new job. A later job of the call sees what an earlier one stored.
  private static func insertEach(_ call: EnqueueCall, sql: SQL, db: Connection, keysLocked: Bool) throws
    -> [EnqueueResult]
  {
    if !keysLocked { try lockKeys(call, sql: sql, db: db) }
    var results: [EnqueueResult] = []
    results.reserveCapacity(call.jobs.count)
    for (index, job) in call.jobs.enumerated() {
      if let key = job.deduplicationKey.map({ Data($0.utf8) }),
        let result = try resolveDuplicate(job, key: key, call: call, sql: sql, db: db)
      {
        results.append(result)
        continue
      }
      let statement = insertStatement(call, inserting: [index], sql: sql)
      let id = try insertedIDs(try db.execute(statement.sql, statement.parameters), expected: 1)[0]
      results.append(EnqueueResult(id: JobID(id), outcome: .inserted))
    }
    return results
  }

  /// The result for `job` when a job of its key exists within its scope (kept, or replaced
  /// while it waits); nil when none does and the job is to be inserted. The key's lock is held,
  /// so only a worker's claim can move a waiting job on meanwhile: a replace that finds its job
  /// claimed looks again.
  private static func resolveDuplicate(_ job: NewJob, key: Data, call: EnqueueCall, sql: SQL, db: Connection)
    throws -> EnqueueResult?
  {
    let queue = PostgresValue.text(call.queue)
    while true {
      var found: (id: Int64, waiting: Bool)?
      if job.deduplicationScope.includesRunning {
        // Waiting and running jobs in one statement (one snapshot): see ``SQL/findKeyed``.
        var period = PostgresValue.null(oid: PostgresValue.int8OID)
        if case .completedWithin(let duration) = job.deduplicationScope {
          period = .int64(JobStoreTime.milliseconds(duration))
        }
        let keyed = try db.execute(sql.findKeyed, [queue, .bytea(key), call.now, period])
        if !keyed.isNull(0, 0) {
          found = (keyed.int64(0, 0), true)
        } else if !keyed.isNull(0, 1) {
          found = (keyed.int64(0, 1), false)
        }
      } else {
        let waiting = try db.execute(sql.findWaiting, [queue, .bytea(key)])
        found = waiting.isNull(0, 0) ? nil : (id: waiting.int64(0, 0), waiting: true)
      }
      guard let found else { return nil }
      guard found.waiting, job.onConflict == .replace else {
        return EnqueueResult(id: JobID(found.id), outcome: .existing)
      }
      let replaced = try db.execute(
        sql.replaceWaiting,
        [
          .int64(found.id), .bytea(job.payload), .int64(Int64(job.priority)),
          delay(job.runTime).map(PostgresValue.int64) ?? .null(oid: PostgresValue.int8OID),
          .timestamp(date(job.runTime)), call.now, timeLimit(job), queue,
        ])
      if replaced.int64(0, 1) == 1 { return EnqueueResult(id: JobID(found.id), outcome: .replaced) }
      // Found waiting and locked, yet not updated: a trigger dropped the update. Looking again
      // would find it again, forever.
      if replaced.int64(0, 0) == 1 {
        throw PostgresError(
          code: .protocolViolation,
          message: "the waiting job \(found.id) to replace was not updated (a trigger on the jobs table "
            + "dropped the update); nothing of this add was stored")
      }
    }
  }

  /// The statement that inserts the jobs at `inserting` (not empty): one job with scalar
  /// parameters; jobs that share priority and run time without keys with one array; others with
  /// an array per column.
  ///
  /// `checked`: the statement fails (rolling back its transaction) when a trigger drops a row,
  /// where the one-job statement otherwise returns no ID (for a pipeline, which commits before the
  /// IDs are counted).
  private static func insertStatement(_ call: EnqueueCall, inserting: [Int], sql: SQL, checked: Bool = false)
    -> (sql: String, parameters: [PostgresValue])
  {
    let jobs = call.jobs
    let queue = call.queue
    // A job with an ordering key takes the batch statement, the one that finds its line; so does
    // one with a limit key (the statement that stores it).
    let ordered = inserting.contains {
      jobs[$0].orderingKey != nil || jobs[$0].limitKey != nil || jobs[$0].fairnessKey != nil
    }
    if inserting.count == 1, !checked, !ordered, let index = inserting.first {
      let job = jobs[index]
      return (
        sql.insertOne,
        [
          .text(queue), .bytea(job.payload), .int64(Int64(job.priority)),
          delay(job.runTime).map(PostgresValue.int64) ?? .null(oid: PostgresValue.int8OID),
          .timestamp(date(job.runTime)),
          job.deduplicationKey.map { .bytea(Data($0.utf8)) } ?? .null(oid: PostgresValue.byteaOID), call.now,
          timeLimit(job),
        ]
      )
    }
    let first = jobs[inserting[0]]
    let uniform = inserting.allSatisfy { index in
      let job = jobs[index]
      return job.deduplicationKey == nil && job.orderingKey == nil && job.limitKey == nil
        && job.fairnessKey == nil
        && job.priority == first.priority
        && job.runTime == first.runTime
        && job.timeLimitMilliseconds == first.timeLimitMilliseconds
    }
    if uniform {
      return (
        sql.insertUniform,
        [
          .text(queue), .byteaArray(inserting.map { jobs[$0].payload }), .int64(Int64(first.priority)),
          delay(first.runTime).map(PostgresValue.int64) ?? .null(oid: PostgresValue.int8OID),
          .timestamp(date(first.runTime)), call.now, timeLimit(first),
        ]
      )
    }
    return (
      sql.insert,
      [
        .text(queue), .byteaArray(inserting.map { jobs[$0].payload }),
        .int64Array(inserting.map { Int64(jobs[$0].priority) }),
        .int64Array(inserting.map { delay(jobs[$0].runTime) }),
        .timestampArray(inserting.map { date(jobs[$0].runTime) }),
        .byteaArray(inserting.map { jobs[$0].deduplicationKey.map { Data($0.utf8) } }), call.now,
        .int64Array(inserting.map { jobs[$0].timeLimitMilliseconds }),
        .textArray(inserting.map { jobs[$0].orderingKey }), .textArray(inserting.map { jobs[$0].limitKey }),
        .textArray(inserting.map { jobs[$0].fairnessKey }),
      ]
    )
  }

  /// A job's time limit as the inserts take it: milliseconds, or a NULL `int8`.
  private static func timeLimit(_ job: NewJob) -> PostgresValue {
    job.timeLimitMilliseconds.map(PostgresValue.int64) ?? .null(oid: PostgresValue.int8OID)
  }

  /// The IDs an insert statement returned (the batch statements add a NULL row, the wake-up's),
  /// in ascending order, checked to be as many as the jobs inserted.
  private static func insertedIDs(_ rows: QueryResult, expected: Int) throws -> [Int64] {
    let ids = (0..<rows.count).filter { !rows.isNull($0, 0) }.map { rows.int64($0, 0) }.sorted()
    guard ids.count == expected else {
      throw PostgresError(code: .protocolViolation, message: "inserted \(ids.count) jobs of \(expected)")
    }
    return ids
  }

  /// Each job's result: its new ID (`ids`, in the order of `inserting`), the ID of the waiting
  /// job that holds its key (`existing`), or that of the earlier job of the call with its key.
  private static func results(
    _ call: EnqueueCall, existing: [Data: Int64], ids: [Int64], inserting: [Int]? = nil
  ) throws -> [EnqueueResult] {
    let inserting = inserting ?? call.candidates
    var results = [EnqueueResult?](repeating: nil, count: call.jobs.count)
    for (position, index) in inserting.enumerated() {
      results[index] = EnqueueResult(id: JobID(ids[position]), inserted: true)
    }
    for index in call.candidates where results[index] == nil {
      let key = Data(call.jobs[index].deduplicationKey!.utf8)
      results[index] = EnqueueResult(id: JobID(existing[key]!), inserted: false)
    }
    for index in call.jobs.indices {
      if let first = call.sameAs[index] {
        results[index] = EnqueueResult(id: results[first]!.id, inserted: false)
      }
    }
    return results.map { $0! }
  }

  private static func delay(_ runTime: RunTime) -> Int64? {
    if case .after(let delay) = runTime { return JobStoreTime.milliseconds(delay) }
    return nil
  }

  private static func date(_ runTime: RunTime) -> Date? {
    if case .at(let date) = runTime { return date }
    return nil
  }

  /// Applies settlements, then claims up to `limit` ready jobs, in one transaction and one round
  /// trip to the server.
  ///
  /// The statements are pipelined (sent together, run in order as one transaction): the
  /// settlements first, in one statement (and a wake-up when one puts a job back); then due
  /// scheduled jobs are promoted and the pause flag read; then the claim (`FOR UPDATE SKIP
  /// LOCKED`), which takes nothing while the queue is paused. Run again after a reconnect: a
  /// settlement that had committed is then reported stale, and jobs claimed by a commit whose
  /// answer was lost are handed out again when their lease passes.
  public func settleAndClaim(
    _ settlements: [JobSettlement], queue: String, limit: Int, lease: Lease, clock: any JobClock
  ) async throws -> ClaimBatch {
    let sql = self.sql
    let useCaller = options.clock == .caller
    let delayCounted: PostgresValue =
      options.claimDelayCounted.map { .int64(JobStoreTime.milliseconds($0) * 1000) }
      ?? .null(oid: PostgresValue.int8OID)
    let leaseMilliseconds = JobStoreTime.milliseconds(lease.duration)
    // Completions alone (a worker's usual batch) take a smaller statement.
    let completions = Self.completions(settlements)
    // A job put back in the queue (a retry, a release) may be ready now, or sooner than idle
    // workers elsewhere expect: wake them, at commit, as an enqueue does. (When such a settlement
    // turns out stale, the wake-up is spurious, and harmless.)
    let wakes = settlements.contains(where: \.returnsJob)
    let releases = limit > 0 && keyRatedQueues.withLock { $0.contains(ExactText(queue)) }
    return try await connection.perform(idempotent: true) { db in
      let wall = clock.now()
      let now: PostgresValue = useCaller ? .timestamp(wall) : .timestamp(nil)
      // The rate reads the caller's clock to the microsecond (`.timestamp` keeps milliseconds).
      let micros: PostgresValue =
        useCaller ? .int64(RateLimit.microseconds(wall)) : .null(oid: PostgresValue.int8OID)
      var statements: [(sql: String, parameters: [PostgresValue])] = []
      if !settlements.isEmpty {
        let claims: [PostgresValue] = [
          .int64Array(settlements.map(\.claim.id.rawValue)), .int64Array(settlements.map(\.claim.token)),
        ]
        switch completions {
        case .keptAsHistory:
          statements.append(
            (
              sql.complete,
              claims + [
                .text(queue), .int64Array(settlements.map(Self.runMilliseconds)),
                .byteaArray(settlements.map(\.output)), now,
              ]
            ))
        case .deleted: statements.append((sql.completeWithoutHistory, claims + [.text(queue)]))
        case .mixed:
          statements.append((sql.settle, Self.settlementParameters(settlements, now: now, queue: queue)))
        }
        if wakes { statements.append((sql.notify, [.text(queue)])) }
      }
      statements.append(limit > 0 ? (sql.promote, [.text(queue), now]) : (sql.isPaused, [.text(queue)]))
      if limit > 0 {
        // One transaction: the limit's lock when the queue has a limit, then the claim that
        // applies (the other claims nothing; see `SQL.limitLock`).
        let claim: [PostgresValue] = [
          .text(queue), .int64(Int64(limit)), .text(Self.storable(lease.owner)), .int64(leaseMilliseconds),
          now,
        ]
        statements += [
          (
            sql.limitLock,
            [
              .text(queue),
              delayCounted,
            ]
          )
        ]
        if releases { statements.append((sql.releaseDueKeys, [.text(queue), micros])) }
        statements += [
          (sql.claim, claim),
          (sql.limitedClaim, claim + [micros]),
          (sql.keyLimitedClaim, claim + [micros]),
          (sql.limitFull, [.text(queue), micros]),
        ]
      }
      let results = try db.pipeline(statements)
      var stale: [ClaimReference] = []
      var retryDates: [JobID: Date] = [:]
      if !settlements.isEmpty {
        let applied = results[0]
        let claims = Set(
          (0..<applied.count).map {
            ClaimReference(id: JobID(applied.int64($0, 0)), token: applied.int64($0, 1))
          })
        stale = settlements.map(\.claim).filter { !claims.contains($0) }
        // The general statement also returns the run date each retry set, from the database's
        // clock: the date the queue's `.retryScheduled` event reports.
        if completions == .mixed {
          for row in 0..<applied.count {
            if let date = applied.date(row, 2) { retryDates[JobID(applied.int64(row, 0))] = date }
          }
        }
      }
      let flagIndex = statements.count - (limit > 0 ? (releases ? 7 : 6) : 1)
      let flag = results[flagIndex]
      if limit > 0 {
        // `limitLock`'s row (none without limits): whether the queue has rates per key.
        let lock = results[flagIndex + 1]
        let rated = lock.count > 0 && lock.text(0, 3) == "on"
        if rated != releases {
          self.keyRatedQueues.withLock { queues in
            if rated { queues.insert(ExactText(queue)) } else { queues.remove(ExactText(queue)) }
          }
        }
      }
      let pausedBefore = flag.count > 0 && flag.bool(0, 0)
      guard limit > 0 else {
        return ClaimBatch(claimed: [], staleSettlements: stale, paused: pausedBefore, retryDates: retryDates)
      }
      let fullRow = results[statements.count - 1]
      let full = fullRow.count > 0 && fullRow.bool(0, 0)
      // The rate's next start: the caller's clock's time, or with the database's clock a wait
      // from now (the server's clock may not be this one). None when the claim stopped before
      // the rate (paused, or the queue was full before it), as the other stores say.
      let claims = [
        results[statements.count - 4], results[statements.count - 3], results[statements.count - 2],
      ]
      let stoppedBefore = (pausedBefore || full) && claims.allSatisfy { $0.count == 0 }
      let nextStart: Date? =
        fullRow.count > 0 && !fullRow.isNull(0, 1) && !stoppedBefore
        ? Self.rateDate(
          next: fullRow.int64(0, 1), readAt: fullRow.int64(0, 2), clock: clock, caller: useCaller)
        : nil
      // In claim order: each record with its `seq` and place, the columns after the record's
      // (one claim at most took something).
      let sequenced = try claims.flatMap { rows in
        try (0..<rows.count).map {
          (
            record: try Self.record(rows, $0), seq: rows.int64($0, SQL.seqColumn),
            place: rows.date($0, SQL.seqColumn + 1) ?? .distantPast
          )
        }
      }
      let claimed = sequenced.sorted { a, b in
        if a.record.priority != b.record.priority { return a.record.priority > b.record.priority }
        if a.place != b.place { return a.place < b.place }
        if a.seq != b.seq { return a.seq < b.seq }
        return a.record.id < b.record.id
      }.map(\.record)
      // The claim reads the flag again, in a later snapshot: jobs claimed mean the queue was
      // resumed in between, and a claim of nothing after an unpaused read says nothing new.
      return ClaimBatch(
        claimed: claimed, staleSettlements: stale, paused: pausedBefore && claimed.isEmpty,
        retryDates: retryDates, full: full, nextStart: nextStart)
    }
  }

  /// The date of a rate's next start `next` (microseconds since 1970) read at `readAt` by the
  /// statement's clock: itself with the caller's clock, else this clock's now plus the wait.
  private static func rateDate(next: Int64, readAt: Int64, clock: any JobClock, caller: Bool) -> Date {
    caller
      ? RateLimit.date(next) : clock.now().addingTimeInterval(Double(max(0, next - readAt)) / 1_000_000)
  }

  /// Which statement a batch of settlements takes.
  private enum Completions: Equatable {
    /// Completions only, kept as history: `complete`.
    case keptAsHistory
    /// Completions only, none kept: `completeWithoutHistory`.
    case deleted
    /// Anything else: `settle`.
    case mixed
  }

  private static func completions(_ settlements: [JobSettlement]) -> Completions {
    guard let first = settlements.first, case .complete = first.action else { return .mixed }
    let keeps = first.keepsHistory
    for settlement in settlements {
      guard case .complete = settlement.action, settlement.keepsHistory == keeps else { return .mixed }
    }
    return keeps ? .keptAsHistory : .deleted
  }

  private static func runMilliseconds(_ settlement: JobSettlement) -> Int64? {
    settlement.runDuration.map(JobStoreTime.milliseconds)
  }

  private static func settlementParameters(_ settlements: [JobSettlement], now: PostgresValue, queue: String)
    -> [PostgresValue]
  {
    var ids: [Int64?] = []
    var tokens: [Int64?] = []
    var kinds: [Int32] = []
    var delays: [Int64?] = []
    var errors: [String?] = []
    for settlement in settlements {
      ids.append(settlement.claim.id.rawValue)
      tokens.append(settlement.claim.token)
      let keeps = settlement.keepsHistory
      switch settlement.action {
      case .complete:
        kinds.append(keeps ? 0 : 4)
        delays.append(nil)
        errors.append(nil)
      case .retry(let delay, let error):
        kinds.append(1)
        delays.append(JobStoreTime.milliseconds(delay))
        errors.append(error.map { JobHistory.bounded(Self.storable($0)) })
      case .kill(let error):
        // 6: dead, leaving its ordering key (`DeadHeadPolicy.releasesKey`).
        kinds.append(keeps ? (settlement.releasesOrderingKey ? 6 : 2) : 5)
        delays.append(nil)
        errors.append(JobHistory.bounded(Self.storable(error)))
      case .release(let error):
        kinds.append(3)
        delays.append(nil)
        errors.append(error.map { JobHistory.bounded(Self.storable($0)) })
      }
    }
    return [
      .int64Array(ids), .int64Array(tokens), .int32Array(kinds), .int64Array(delays), .textArray(errors), now,
      .text(queue), .int64Array(settlements.map(runMilliseconds)), .byteaArray(settlements.map(\.output)),
    ]
  }

  /// PostgreSQL text cannot hold NUL: it is stored as U+FFFD (errors and owners are for people).
  static func storable(_ text: String) -> String {
    // Looked for in the UTF-8 bytes: Foundation's `contains` cost more than the rest of a claim's
    // parameters together.
    text.utf8.contains(0) ? text.replacingOccurrences(of: "\0", with: "\u{FFFD}") : text
  }

  /// Extends the leases of the given claims; returns those still current.
  public func heartbeat(_ claims: [ClaimReference], queue: String, lease: Lease, clock: any JobClock)
    async throws -> [ClaimReference]
  {
    if claims.isEmpty { return [] }
    let sql = self.sql
    let now = now(clock)
    let milliseconds = JobStoreTime.milliseconds(lease.duration)
    let held = try await connection.perform(idempotent: true) { db -> Set<ClaimReference> in
      let rows = try db.execute(
        sql.heartbeat,
        [
          .int64Array(claims.map(\.id.rawValue)), .int64Array(claims.map(\.token)), .int64(milliseconds), now,
          .text(queue),
        ])
      return Set(
        (0..<rows.count).map { ClaimReference(id: JobID(rows.int64($0, 0)), token: rows.int64($0, 1)) })
    }
    return claims.filter(held.contains)
  }

  /// Keeps checkpoints: true.
  public var keepsCheckpoints: Bool { true }

  /// Replaces a running job's payload under its claim, the checkpoint a handler resumes from (a
  /// durable workflow's history); false, writing nothing, when the claim is no longer current.
  public func checkpoint(_ claim: ClaimReference, payload: Data, queue: String) async throws -> Bool {
    let sql = self.sql
    // Idempotent: writing the same payload twice under the same claim leaves the same row.
    return try await connection.perform(idempotent: true) { db in
      try db.execute(
        sql.checkpoint, [.bytea(payload), .int64(claim.id.rawValue), .int64(claim.token), .text(queue)]
      ).changed > 0
    }
  }

  /// Makes running jobs whose lease ran out (by the store's clock) ready again; returns how many.
  public func rescueExpiredLeases(queue: String, clock: any JobClock) async throws -> Int {
    let sql = self.sql
    let now = now(clock)
    return try await connection.perform(idempotent: true) { db in
      try db.transaction {
        let rescued = try db.execute(sql.rescue, [.text(queue), now]).changed
        // The rescued jobs are ready: wake idle workers elsewhere (this one may be busy).
        if rescued > 0 { try db.execute(sql.notify, [.text(queue)]) }
        return rescued
      }
    }
  }

  /// Counts the queue's jobs by status.
  public func counts(queue: String, clock: any JobClock) async throws -> JobCounts {
    let sql = self.sql
    let now = now(clock)
    return try await connection.perform(idempotent: true) { db in
      let row = try db.execute(sql.counts, [.text(queue), now])
      return JobCounts(
        ready: Int(row.int64(0, 0)), scheduled: Int(row.int64(0, 1)), running: Int(row.int64(0, 2)),
        dead: Int(row.int64(0, 3)), completed: Int(row.int64(0, 4)), cancelled: Int(row.int64(0, 5)),
        held: Int(row.int64(0, 6)))
    }
  }

  /// Lists jobs one page at a time: in ID order, or for completed and cancelled jobs in the order
  /// they finished (see `JobStore.jobs(queue:status:after:limit:)`).
  public func jobs(queue: String, status: JobStatus?, after: JobID?, limit: Int) async throws -> [JobRecord] {
    guard limit > 0 else { return [] }
    let sql = self.sql
    if let status, status == .completed || status == .cancelled {
      let statement = sql.history(Self.stored(status)[0])
      return try await connection.perform(idempotent: true) { db in
        let rows = try db.execute(
          statement, [.text(queue), .int64(after?.rawValue ?? 0), .int64(Int64(limit))], prepared: false)
        return try (0..<rows.count).map { try Self.record(rows, $0) }
      }
    }
    let statuses: PostgresValue = status.map { .textArray(Self.stored($0)) } ?? .null(oid: 1009)
    return try await connection.perform(idempotent: true) { db in
      // Not prepared: listing is not a hot path, and a connection keeps no statement for it.
      let rows = try db.execute(
        sql.list, [.text(queue), .int64(after?.rawValue ?? Int64.min), .int64(Int64(limit)), statuses],
        prepared: false)
      return try (0..<rows.count).map { try Self.record(rows, $0) }
    }
  }

  /// The job with this ID, of whatever queue, or nil: one primary-key lookup.
  public func job(_ id: JobID) async throws -> JobRecord? {
    let sql = self.sql
    return try await connection.perform(idempotent: true) { db in
      let rows = try db.execute(sql.job, [.int64(id.rawValue)])
      return rows.count > 0 ? try Self.record(rows, 0) : nil
    }
  }

  /// Deletes the given jobs whatever their status; returns how many existed.
  ///
  /// In one transaction, the jobs that are not held go first; then, under the locks of their
  /// lines, the ones still held (see `SQL.version9`'s lock order); then the next job of each line
  /// left is promoted. A job held when the transaction looked but promoted before its line's
  /// lock was granted is not waited for under that lock (its worker may be settling it, waiting
  /// for the same lock): it is removed by a transaction of its own after this one commits.
  public func remove(_ ids: [JobID], queue: String) async throws -> Int {
    if ids.isEmpty { return 0 }
    let sql = self.sql
    let unique = Array(Set(ids.map(\.rawValue)))
    return try await connection.perform(idempotent: true) { db in
      var count = 0
      var remaining = unique
      while !remaining.isEmpty {
        let ids = remaining
        remaining = try db.transaction {
          let held = try db.execute(sql.heldAmong, [.int64Array(ids), .text(queue)], prepared: false)
          let heldIDs = (0..<held.count).map { held.int64($0, 0) }
          var lines = Lines()
          for row in 0..<held.count { lines.add(queue, held.text(row, 2)) }
          let gone = try db.execute(
            sql.remove, [.text(queue), .int64Array(ids), .bool(false)], prepared: false)
          count += gone.count
          for row in 0..<gone.count where Lines.isInLine(gone.text(row, 0)) {
            lines.add(queue, gone.text(row, 1))
          }
          var moved: [Int64] = []
          if !heldIDs.isEmpty {
            try lines.lock(sql: sql, db: db)
            count += try db.execute(
              sql.remove, [.text(queue), .int64Array(heldIDs), .bool(true)], prepared: false
            ).count
            // The held jobs promoted meanwhile (still there, no longer held): next round.
            let present = try db.execute(
              sql.presentNotHeld, [.int64Array(heldIDs), .text(queue)], prepared: false)
            moved = (0..<present.count).map { present.int64($0, 0) }
          }
          try lines.promote(sql: sql, db: db)
          return moved
        }
      }
      return count
    }
  }

  /// Cancels unfinished jobs; see `JobStore.cancel(_:queue:clock:)`. One statement; not repeated
  /// after a lost connection (a repeat would answer `CancelResult.notFound` for the jobs the
  /// first run cancelled), so such a loss is an error to the caller, who may cancel again.
  ///
  /// The statement also announces the running jobs it cancelled (``cancellations(queue:)``) with
  /// a `NOTIFY`, delivered to every store listening on the schema when it commits.
  public func cancel(_ ids: [JobID], queue: String?, clock: any JobClock) async throws -> [CancelResult] {
    if ids.isEmpty { return [] }
    let sql = self.sql
    let unique = Array(Set(ids.map(\.rawValue)))
    let now = now(clock)
    let queueValue = queue.map(PostgresValue.text) ?? .null(oid: PostgresValue.textOID)
    let found = try await connection.perform(idempotent: false) { db -> [Int64: String] in
      // In one transaction, the jobs that are not held first; then, under the locks of their
      // lines, the ones still held (see `SQL.version9`'s lock order); then the next job of each
      // line left is promoted. A job held when the transaction looked but promoted before its
      // line's lock was granted is not waited for under that lock (its worker may be settling
      // it, waiting for the same lock): a transaction of its own cancels it after this one.
      var found: [Int64: String] = [:]
      var remaining = unique
      while !remaining.isEmpty {
        let ids = remaining
        remaining = try db.transaction {
          let held = try db.execute(sql.heldAmong, [.int64Array(ids), queueValue], prepared: false)
          let heldIDs = (0..<held.count).map { held.int64($0, 0) }
          var lines = Lines()
          for row in 0..<held.count { lines.add(held.text(row, 1) ?? "", held.text(row, 2)) }
          var seen: Set<Int64> = []
          func cancel(_ ids: [Int64], held: Bool) throws {
            let rows = try db.execute(
              sql.cancel, [.int64Array(ids), queueValue, now, .bool(held)], prepared: false)
            for row in 0..<rows.count {
              let status = rows.text(row, 1) ?? ""
              found[rows.int64(row, 0)] = status
              seen.insert(rows.int64(row, 0))
              if Lines.isInLine(status), status != "dead" {
                lines.add(rows.text(row, 4) ?? "", rows.text(row, 5))
              }
            }
          }
          try cancel(ids, held: false)
          var moved: [Int64] = []
          if !heldIDs.isEmpty {
            try lines.lock(sql: sql, db: db)
            try cancel(heldIDs, held: true)
            moved = heldIDs.filter { !seen.contains($0) }
          }
          try lines.promote(sql: sql, db: db)
          return moved
        }
      }
      return found
    }
    // A job cancelled here is already cancelled for an ID given again.
    var cancelled: Set<Int64> = []
    return ids.map { id in
      guard let status = found[id.rawValue] else { return .notFound }
      switch status {
      case "ready", "scheduled", "held", "running":
        guard cancelled.insert(id.rawValue).inserted else { return .alreadyCancelled }
        return status == "running" ? .cancelledRunning : .cancelledWaiting
      case "completed": return .alreadyCompleted
      case "cancelled": return .alreadyCancelled
      default: return .alreadyDead
      }
    }
  }

  /// The claims still current; see `JobStore.currentClaims(_:queue:)`. One read of the primary
  /// key.
  public func currentClaims(_ claims: [ClaimReference], queue: String) async throws -> [ClaimReference] {
    if claims.isEmpty { return [] }
    let sql = self.sql
    let running = try await connection.perform(idempotent: true) { db -> Set<ClaimReference> in
      let rows = try db.execute(sql.runningClaims, [.int64Array(claims.map(\.id.rawValue)), .text(queue)])
      return Set(
        (0..<rows.count).map { ClaimReference(id: JobID(rows.int64($0, 0)), token: rows.int64($0, 1)) })
    }
    return claims.filter(running.contains)
  }

  /// Deletes every job of the queue whose status is in `statuses`; returns how many.
  public func clear(queue: String, statuses: Set<JobStatus>) async throws -> Int {
    let stored = statuses.flatMap(Self.stored)
    if stored.isEmpty { return 0 }
    let sql = self.sql
    return try await connection.perform(idempotent: true) { db in
      try db.transaction { try Self.clear(queue: queue, stored: stored, through: .max, sql: sql, db: db) }
    }
  }

  /// Deletes the queue's jobs of the stored statuses with IDs up to `through`, in the caller's
  /// transaction; returns how many. The jobs that are not held go first; then, under the locks
  /// of the lines of the queue's held jobs, the held ones (a held job added meanwhile in a line
  /// not locked stays); then the next job of each line left is promoted (see `SQL.version9`'s
  /// lock order).
  private static func clear(queue: String, stored: [String], through: Int64, sql: SQL, db: Connection)
    throws -> Int
  {
    var lines = Lines()
    let unheld = stored.filter { $0 != "held" }
    var count = 0
    if !unheld.isEmpty {
      let gone = try db.execute(
        sql.clearThrough, [.text(queue), .textArray(unheld), .int64(through)], prepared: false)
      count = gone.count
      for row in 0..<gone.count where Lines.isInLine(gone.text(row, 0)) {
        lines.add(queue, gone.text(row, 1))
      }
    }
    if stored.contains("held") {
      let held = try db.execute(sql.heldLines, [.text(queue), .int64(through)], prepared: false)
      let keys = (0..<held.count).compactMap { held.text($0, 0) }
      if !keys.isEmpty {
        for key in keys { lines.add(queue, key) }
        try lines.lock(sql: sql, db: db)
        count += try db.execute(
          sql.clearHeld, [.text(queue), .int64(through), .textArray(keys)], prepared: false
        ).count
      }
    }
    try lines.promote(sql: sql, db: db)
    return count
  }

  /// Lines (a queue and an ordering key) some jobs left or are about to leave: locked, then
  /// promoted (see `SQL.version9`).
  struct Lines {
    private var seen: Set<[String]> = []
    private var queues: [String] = []
    private var keys: [String] = []

    /// Whether a job of this stored status is in its line.
    static func isInLine(_ status: String?) -> Bool {
      switch status {
      case "ready", "scheduled", "running", "held", "dead": true
      default: false
      }
    }

    /// Adds a job's line; a job without a key has none.
    mutating func add(_ queue: String, _ key: String?) {
      guard let key, seen.insert([queue, key]).inserted else { return }
      queues.append(queue)
      keys.append(key)
    }

    var isEmpty: Bool { keys.isEmpty }

    /// Takes the lines' locks, in lock-key order.
    func lock(sql: SQL, db: Connection) throws {
      if isEmpty { return }
      try db.execute(sql.lockLines, [.textArray(queues), .textArray(keys)], prepared: false)
    }

    /// Locks the lines and promotes the next job of each, in a statement of its own (a new
    /// snapshot, taken after the locks were granted).
    func promote(sql: SQL, db: Connection) throws {
      if isEmpty { return }
      try db.execute(sql.promoteLinesNow, [.textArray(queues), .textArray(keys)], prepared: false)
    }
  }

  /// How many of the queue's jobs have these statuses, and the highest of their IDs, in one
  /// statement (one range of `jobs_status` per status).
  public func tally(queue: String, statuses: Set<JobStatus>) async throws -> JobTally {
    let stored = statuses.flatMap(Self.stored)
    if stored.isEmpty { return JobTally(count: 0, highestID: nil) }
    let sql = self.sql
    return try await connection.perform(idempotent: true) { db in
      let rows = try db.execute(sql.tally, [.text(queue), .textArray(stored)], prepared: false)
      return JobTally(
        count: Int(rows.int64(0, 0)), highestID: rows.isNull(0, 1) ? nil : JobID(rows.int64(0, 1)))
    }
  }

  /// Deletes a batch of old finished jobs; see `JobStore.prune(queue:status:olderThan:limit:clock:)`.
  /// One statement: a range of `jobs_finished`, oldest first, skipping rows another pruner holds.
  public func prune(
    queue: String, status: JobStatus, olderThan age: Duration, limit: Int, clock: any JobClock
  )
    async throws -> Int
  {
    guard status.isFinished, limit > 0 else { return 0 }
    let statement = sql.prune(Self.stored(status)[0])
    let now = now(clock)
    // A zero age means every job of the status; any other is at least a millisecond.
    let milliseconds = age > .zero ? max(1, JobStoreTime.milliseconds(age)) : 0
    return try await connection.perform(idempotent: true) { db in
      let rows = try db.execute(
        statement, [.text(queue), .int64(milliseconds), now, .int64(Int64(limit))], prepared: false)
      return (0..<rows.count).first { !rows.isNull($0, 0) }.map { Int(rows.int64($0, 0)) } ?? 0
    }
  }

  /// Deletes the queue's jobs of these statuses with IDs up to `through` when there are exactly
  /// `expected` of them, in one transaction; nil (and nothing deleted) otherwise. A job a worker
  /// is claiming meanwhile is waited for, and then no longer counts.
  public func clear(queue: String, statuses: Set<JobStatus>, through: JobID, expecting expected: Int)
    async throws -> Int?
  {
    let stored = statuses.flatMap(Self.stored)
    if stored.isEmpty { return expected == 0 ? 0 : nil }
    let sql = self.sql
    struct CountDiffers: Error {}
    return try await connection.perform(idempotent: false) { db in
      do {
        return try db.transaction {
          let deleted = try Self.clear(
            queue: queue, stored: stored, through: through.rawValue, sql: sql, db: db)
          guard deleted == expected else { throw CountDiffers() }
          return deleted
        }
      } catch is CountDiffers {
        return nil
      }
    }
  }

  /// Makes dead jobs ready again, now, attempts reset to zero; returns how many.
  public func requeueDead(_ ids: [JobID]?, queue: String, clock: any JobClock) async throws -> Int {
    let sql = self.sql
    let now = now(clock)
    let count = try await connection.perform(idempotent: true) { db in
      try db.transaction {
        // The dead jobs and their keys, then every lock they need (deduplication keys and
        // lines) in one pass, as an enqueue takes them; then the jobs found, each skipped when a
        // prune or removal holds it.
        let dead = try db.execute(
          sql.deadJobs,
          [.text(queue), ids.map { .int64Array(Array(Set($0.map(\.rawValue)))) } ?? .null(oid: 1016)],
          prepared: false)
        var unkeyed: [Int64] = []
        var keyed: [Int64] = []
        var fair = false
        var keys = Set<Data>()
        var lines = Set<String>()
        for row in 0..<dead.count {
          if let key = dead.optionalData(row, 1) {
            keyed.append(dead.int64(row, 0))
            keys.insert(key)
          } else {
            unkeyed.append(dead.int64(row, 0))
          }
          if let line = dead.text(row, 2) { lines.insert(line) }
          fair = fair || dead.bool(row, 3)
        }
        if !keys.isEmpty || !lines.isEmpty {
          try db.execute(
            sql.lockKeys,
            [.text(queue), .byteaArray(Array(keys)), .textArray(Array(lines))], prepared: false)
        }
        var total = 0
        // With a job with a fairness key among them, one at a time, so each takes its turn seeing
        // the jobs before it ready (one statement's order is the plan's), in the order the other
        // stores take them: all of them, those without a deduplication key first; given IDs, by ID.
        let oneByOne = fair ? (ids == nil ? unkeyed + keyed : (unkeyed + keyed).sorted()) : keyed
        if !fair, !unkeyed.isEmpty {
          total = try db.execute(
            sql.requeueWithoutKey, [.text(queue), now, .int64Array(unkeyed)], prepared: false
          ).changed
        }
        for id in oneByOne {
          total += try db.execute(sql.requeueOne, [.text(queue), now, .int64(id)], prepared: false).changed
        }
        // Idle workers wake for re-queued jobs, by ID or all.
        if total > 0 { try db.execute(sql.notify, [.text(queue)]) }
        return total
      }
    }
    return count
  }

  /// Stores whether the queue is paused, and notifies the workers.
  public func setPaused(_ paused: Bool, queue: String) async throws {
    let sql = self.sql
    try await connection.perform(idempotent: true) { db in
      try db.transaction {
        try db.execute(sql.setPaused, [.text(queue), .bool(paused)])
        try db.execute(sql.notify, [.text(queue)])
      }
    }
  }

  /// The stored limits; see `JobStore.limits(queue:)`.
  public func limits(queue: String) async throws -> QueueLimits {
    let sql = self.sql
    return try await connection.perform(idempotent: true) { db in
      try db.transaction {
        let row = try db.execute(sql.limits, [.text(queue)])
        let overrides = try db.execute(sql.keyOverrides, [.text(queue)])
        let rateOverrides = try db.execute(sql.keyRateOverrides, [.text(queue)])
        var limits = QueueLimits()
        if row.count > 0 {
          limits.concurrency = row.isNull(0, 0) ? nil : Int(row.int64(0, 0))
          limits.rate =
            row.isNull(0, 1) ? nil : RateLimit(perSecond: row.double(0, 1), burst: Int(row.int64(0, 2)))
          limits.keyConcurrency = row.isNull(0, 3) ? nil : Int(row.int64(0, 3))
          limits.keyRate =
            row.isNull(0, 4) ? nil : RateLimit(perSecond: row.double(0, 4), burst: Int(row.int64(0, 5)))
        }
        for index in 0..<rateOverrides.count {
          limits.keyRateOverrides[rateOverrides.text(index, 0) ?? ""] = RateLimit(
            perSecond: rateOverrides.double(index, 1), burst: Int(rateOverrides.int64(index, 2)))
        }
        for index in 0..<overrides.count {
          limits.keyConcurrencyOverrides[overrides.text(index, 0) ?? ""] = Int(overrides.int64(index, 1))
        }
        return limits
      }
    }
  }

  /// Keeps and enforces rate limits: true.
  public var keepsRateLimits: Bool { true }

  /// Keeps and enforces limits per key: true.
  public var keepsKeyLimits: Bool { true }
  /// True: fair shares (`NewJob.fairnessKey`) are kept (schema version 14).
  public var keepsFairShares: Bool { true }

  /// The keys with running or held jobs; see `JobStore.limitKeyUsage(queue:limit:)`.
  public func limitKeyUsage(queue: String, limit: Int) async throws -> [LimitKeyUsage] {
    guard limit > 0 else { return [] }
    let sql = self.sql
    return try await connection.perform(idempotent: true) { db in
      let rows = try db.execute(sql.limitKeyUsage, [.text(queue), .int64(Int64(limit))])
      return (0..<rows.count).map {
        LimitKeyUsage(
          key: rows.text($0, 0) ?? "", running: Int(rows.int64($0, 1)), held: Int(rows.int64($0, 2)))
      }
    }
  }

  /// Stores limits and wakes the queue's listening workers (a raised limit frees places); see
  /// `JobStore.setLimits(_:queue:)`.
  public func setLimits(_ limits: QueueLimits, queue: String) async throws {
    try limits.check()
    let sql = self.sql
    try await connection.perform(idempotent: true) { db in
      try db.transaction {
        // Under the limit lock, as the claims: a claim that read the old limits and held jobs has
        // committed before the statements below take their snapshots, so they make those jobs
        // claimable; a claim after them reads the new limits.
        try db.execute(sql.takeLimitLock, [.text(queue)])
        try db.execute(
          sql.setLimits,
          [
            .text(queue), limits.concurrency.map { .int64(Int64($0)) } ?? .null(oid: PostgresValue.int8OID),
            limits.rate.map { .double($0.perSecond) } ?? .null(oid: PostgresValue.float8OID),
            limits.rate.map { .int64(Int64($0.burst)) } ?? .null(oid: PostgresValue.int8OID),
            limits.keyConcurrency.map { .int64(Int64($0)) } ?? .null(oid: PostgresValue.int8OID),
            limits.keyRate.map { .double($0.perSecond) } ?? .null(oid: PostgresValue.float8OID),
            limits.keyRate.map { .int64(Int64($0.burst)) } ?? .null(oid: PostgresValue.int8OID),
          ])
        try db.execute(sql.deleteKeyOverrides, [.text(queue)])
        if !limits.keyConcurrencyOverrides.isEmpty {
          let overrides = limits.keyConcurrencyOverrides.sorted {
            $0.key.utf8.lexicographicallyPrecedes($1.key.utf8)
          }
          try db.execute(
            sql.insertKeyOverrides,
            [.text(queue), .textArray(overrides.map(\.key)), .int64Array(overrides.map { Int64($0.value) })])
        }
        try db.execute(sql.deleteKeyRateOverrides, [.text(queue)])
        if !limits.keyRateOverrides.isEmpty {
          let overrides = limits.keyRateOverrides.sorted {
            $0.key.utf8.lexicographicallyPrecedes($1.key.utf8)
          }
          try db.execute(
            sql.insertKeyRateOverrides,
            [
              .text(queue), .textArray(overrides.map(\.key)), .doubleArray(overrides.map(\.value.perSecond)),
              .int64Array(overrides.map { Int64($0.value.burst) }),
            ])
        }
        // Buckets are kept while the queue has a rate per key (setting limits does not refill them).
        if !limits.hasKeyRates { try db.execute(sql.deleteKeyBuckets, [.text(queue)]) }
        if limits.hasKeyRates { self.keyRatedQueues.withLock { _ = $0.insert(ExactText(queue)) } }
        // Jobs held for their key's limit are claimable again; the next claims hold those whose
        // key is still at its limit.
        try db.execute(sql.unparkAll, [.text(queue)])
        try db.execute(sql.notify, [.text(queue)])
      }
    }
  }

  /// Whether the queue is paused.
  public func isPaused(queue: String) async throws -> Bool {
    let sql = self.sql
    return try await connection.perform(idempotent: true) { db in
      let row = try db.execute(sql.isPaused, [.text(queue)])
      return row.count > 0 && row.bool(0, 0)
    }
  }

  /// The earliest waiting run date and lease expiry. With ``Clock/database`` the dates are moved
  /// onto `clock` (by the difference between it and the server's clock), so a caller that
  /// compares them with its own clock waits the right time however far the clocks disagree.
  public func nextWake(queue: String, clock: any JobClock) async throws -> WakeHint {
    let sql = self.sql
    let now = now(clock)
    let useCaller = options.clock == .caller
    let micros: PostgresValue =
      useCaller ? .int64(RateLimit.microseconds(clock.now())) : .null(oid: PostgresValue.int8OID)
    let (serverNow, ready, scheduled, expiry, paused, scheduleDue, rate, keyDue) =
      try await connection.perform(
        idempotent: true
      ) {
        db in
        let row = try db.execute(sql.nextWake, [.text(queue), now, micros])
        return (
          row.date(0, 0), row.date(0, 1), row.date(0, 2), row.date(0, 3), row.bool(0, 4), row.date(0, 5),
          row.isNull(0, 6) ? nil : (next: row.int64(0, 6), readAt: row.int64(0, 7)),
          row.isNull(0, 8) ? nil : (next: row.int64(0, 8), readAt: row.int64(0, 9))
        )
      }
    var hint = WakeHint(
      nextRun: ready ?? scheduled, nextLeaseExpiry: expiry, paused: paused, nextScheduleDue: scheduleDue)
    if options.clock == .database, let serverNow {
      let offset = clock.now().timeIntervalSince(serverNow)
      hint.nextRun = hint.nextRun?.addingTimeInterval(offset)
      hint.nextLeaseExpiry = hint.nextLeaseExpiry?.addingTimeInterval(offset)
      hint.nextScheduleDue = hint.nextScheduleDue?.addingTimeInterval(offset)
    }
    // A key whose rate holds jobs needs a worker when its bucket gives its next start.
    if let keyDue {
      let due = Self.rateDate(next: keyDue.next, readAt: keyDue.readAt, clock: clock, caller: useCaller)
      hint.nextRun = min(hint.nextRun ?? due, due)
    }
    // No waiting job needs a worker before the rate gives its next start.
    if let run = hint.nextRun, let rate {
      hint.nextRun = max(
        run, Self.rateDate(next: rate.next, readAt: rate.readAt, clock: clock, caller: useCaller))
    }
    return hint
  }

  /// The names of queues that hold jobs, a stored pause flag or stored limits, sorted.
  public func queueNames() async throws -> [String] {
    let sql = self.sql
    return try await connection.perform(idempotent: true) { db in
      let rows = try db.execute(sql.queueNames)
      return (0..<rows.count).compactMap { rows.text($0, 0) }
    }
  }

  /// Waits until a job is added to `queue`, put back (a retry, a release, a rescued lease), or the
  /// queue is paused, resumed or re-queued (a `NOTIFY` on the store's channel, received on a
  /// connection of its own), or `timeout` passes.
  ///
  /// - Returns: Whether a notification came.
  public func waitForWork(queue: String, timeout: Duration) async -> Bool {
    guard let listener else {
      // No session to listen on (a transaction pooler without `listenURL`): polling alone.
      try? await DispatchSleep.sleep(for: max(timeout, .milliseconds(1)))
      return false
    }
    return await listener.wait(queue: queue, timeout: timeout)
  }

  /// Announcements of the running jobs of `queue` cancelled by any process's
  /// ``cancel(_:queue:clock:)`` on this schema (a `NOTIFY` sent by the cancel's own statement, so
  /// only a cancel that commits announces anything), heard on the listener's connection: a
  /// running `JobQueue` cancels such a job's handler within a round trip instead of at its next
  /// periodic check (every 500 ms). nil through a transaction pooler with no `listenURL` (no
  /// session to listen on): queues then rely on the periodic check. The announcements end when
  /// the store closes. See `JobStore.cancellations(queue:)`.
  public func cancellations(queue: String) -> AsyncStream<CancellationNotice>? {
    listener?.cancellations(queue: queue)
  }

  // MARK: - Helpers

  /// The stored statuses a public status covers.
  static func stored(_ status: JobStatus) -> [String] {
    switch status {
    case .pending: ["ready", "scheduled", "held"]
    case .running: ["running"]
    case .dead: ["dead"]
    case .completed: ["completed"]
    case .cancelled: ["cancelled"]
    }
  }

  /// Decodes a row selected with ``SQL/columns``.
  static func record(_ rows: QueryResult, _ row: Int) throws -> JobRecord {
    let statusText = rows.text(row, 3) ?? ""
    let status: JobStatus
    switch statusText {
    case "ready", "scheduled", "held": status = .pending
    case "running": status = .running
    case "dead": status = .dead
    case "completed": status = .completed
    case "cancelled": status = .cancelled
    default:
      throw PostgresError(
        code: .protocolViolation, message: "job \(rows.int64(row, 0)) has an unknown status '\(statusText)'")
    }
    return JobRecord(
      id: JobID(rows.int64(row, 0)), queue: rows.text(row, 1) ?? "", payload: rows.data(row, 2),
      status: status,
      priority: Int(clamping: rows.int64(row, 4)), attempts: Int(clamping: rows.int64(row, 5)),
      runAt: rows.date(row, 6) ?? Date(timeIntervalSince1970: 0),
      createdAt: rows.date(row, 7) ?? Date(timeIntervalSince1970: 0), lastError: rows.text(row, 8),
      deduplicationKey: rows.optionalData(row, 9).map { String(decoding: $0, as: UTF8.self) },
      leaseOwner: rows.text(row, 10), leaseExpiresAt: rows.date(row, 11), claimToken: rows.int64(row, 12),
      timeLimit: JobStoreTime.timeLimit(milliseconds: rows.isNull(row, 13) ? nil : rows.int64(row, 13)),
      finishedAt: rows.date(row, 14), errors: try errors(rows, row, 15),
      runDuration: rows.isNull(row, 16) ? nil : .milliseconds(rows.int64(row, 16)),
      output: rows.optionalData(row, 17), orderingKey: rows.text(row, 18), isHeld: statusText == "held",
      limitKey: rows.text(row, 19),
      isHeldByLimit: statusText == "held" && !rows.isNull(row, 20) && rows.bool(row, 20),
      fairnessKey: rows.text(row, 21))
  }

  /// A JSON array of strings (`SQL.appendError`) as a list; NULL as none.
  private static func errors(_ rows: QueryResult, _ row: Int, _ column: Int) throws -> [String] {
    guard let text = rows.text(row, column) else { return [] }
    do {
      return try JSONDecoder().decode([String].self, from: Data(text.utf8))
    } catch {
      throw PostgresError(
        code: .protocolViolation,
        message: "job \(rows.int64(row, 0)) has a list of errors that is not a JSON array of strings")
    }
  }

  /// Refuses timeouts that would make every call fail or that the server refuses.
  static func validate(_ options: Options) throws {
    func refuse(_ message: String) -> PostgresError { PostgresError(code: .invalidOptions, message: message) }
    if let callTimeout = options.callTimeout, callTimeout < .milliseconds(100) {
      throw refuse(
        "callTimeout must be at least 100 ms (it bounds every statement, a claim included), got \(callTimeout); "
          + "pass nil to wait as long as the server takes")
    }
    // `lock_timeout` is a 32-bit count of milliseconds on the server.
    if options.lockTimeout < .zero || options.lockTimeout > .milliseconds(Int64(Int32.max)) {
      throw refuse("lockTimeout must be between 0 (no limit) and about 24 days, got \(options.lockTimeout)")
    }
    if options.startupWait < .zero {
      throw refuse("startupWait must be 0 (one attempt) or more, got \(options.startupWait)")
    }
    if options.reconnectTimeout < .zero {
      throw refuse("reconnectTimeout must be 0 (do not reconnect) or more, got \(options.reconnectTimeout)")
    }
  }

  static func validate(schema: String) throws {
    let bytes = Array(schema.utf8)
    let valid =
      (1...50).contains(bytes.count)
      && bytes.enumerated().allSatisfy { index, byte in
        byte == UInt8(ascii: "_") || (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(byte)
          || (index > 0 && (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte))
      } && !schema.hasPrefix("pg_")
    guard valid else {
      throw PostgresError(
        code: .invalidSchemaName,
        message: "a schema name must be 1 to 50 characters from a-z, 0-9 and '_', not start with a digit "
          + "or 'pg_'; pass a name such as \"conveyor\"")
    }
  }
}

extension JobSettlement {
  /// Whether the settlement puts the job back in the queue (a retry or a release).
  fileprivate var returnsJob: Bool {
    switch action {
    case .retry, .release: true
    case .complete, .kill: false
    }
  }
}

/// Shuts a socket down once a time limit passes, unless restarted or disarmed first: bounds each
/// statement of a connection that no `callTimeout` watchdog watches (the store's opening).
///
/// It acts on a duplicate of the descriptor, closed by ``disarm()``: shutting a socket down
/// through any of its descriptors ends it, and libpq may close its own (and the number be reused
/// by another socket of the process) before the caller disarms. The timer's handler and
/// ``disarm()`` agree under the state's lock. Used from one thread.
final class SocketDeadline {
  private final class State: Sendable {
    /// The duplicate descriptor (-1 once disarmed) and whether the limit passed.
    let flags = Mutex((socket: Int32(-1), fired: false))
  }
  private let state = State()
  private let timer: any DispatchSourceTimer
  private let limit: Duration

  init(socket: Int32, after limit: Duration) {
    self.limit = limit
    timer = DispatchSource.makeTimerSource(queue: .global())
    // Close-on-exec, as libpq's own: a child another thread starts must not inherit it.
    state.flags.withLock { $0.socket = socket >= 0 ? fcntl(socket, F_DUPFD_CLOEXEC, 0) : -1 }
    let state = self.state
    timer.setEventHandler {
      state.flags.withLock { flags in
        guard flags.socket >= 0, !flags.fired else { return }
        _ = shutdown(flags.socket, Int32(SHUT_RDWR))
        flags.fired = true
      }
    }
    timer.schedule(deadline: Self.deadline(after: limit))
    timer.activate()
  }

  deinit { disarm() }

  private static func deadline(after limit: Duration) -> DispatchTime {
    .now() + .nanoseconds(Int(SerializedConnection.nanoseconds(limit)))
  }

  /// Starts the limit again from now (a new statement), unless it passed already.
  func restart() {
    guard !fired else { return }
    timer.schedule(deadline: Self.deadline(after: limit))
  }

  /// Stops the timer and closes the duplicate: from here on no socket is touched.
  func disarm() {
    timer.cancel()
    state.flags.withLock { flags in
      if flags.socket >= 0 { close(flags.socket) }
      flags.socket = -1
    }
  }

  /// Whether the limit passed and the socket was shut down.
  var fired: Bool { state.flags.withLock { $0.fired } }
}

/// Shuts a connection's socket down once `isCancelled` says so (looked at every 50 ms), so a
/// statement waiting on the server (a lock another process holds) ends with the task that waits
/// for it. Until ``disarm()``.
final class CancellationWatch {
  private final class State: Sendable {
    /// The duplicate descriptor (-1 once disarmed) and whether it was shut down.
    let flags = Mutex((socket: Int32(-1), fired: false))
  }
  private let state = State()
  private let timer: any DispatchSourceTimer

  init(socket: Int32, isCancelled: @escaping @Sendable () -> Bool) {
    timer = DispatchSource.makeTimerSource(queue: .global())
    // A duplicate, as `SocketDeadline` keeps: the connection may close its own first.
    state.flags.withLock { $0.socket = socket >= 0 ? fcntl(socket, F_DUPFD_CLOEXEC, 0) : -1 }
    let state = self.state
    timer.setEventHandler {
      guard isCancelled() else { return }
      state.flags.withLock { flags in
        guard flags.socket >= 0, !flags.fired else { return }
        _ = shutdown(flags.socket, Int32(SHUT_RDWR))
        flags.fired = true
      }
    }
    timer.schedule(deadline: .now() + .milliseconds(50), repeating: .milliseconds(50))
    timer.activate()
  }

  deinit { disarm() }

  /// Stops watching and closes the duplicate.
  func disarm() {
    timer.cancel()
    state.flags.withLock { flags in
      if flags.socket >= 0 { close(flags.socket) }
      flags.socket = -1
    }
  }

  /// Whether the task was cancelled and the socket shut down.
  var fired: Bool { state.flags.withLock { $0.fired } }
}
