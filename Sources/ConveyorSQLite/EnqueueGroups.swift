import Conveyor
import Synchronization

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#elseif canImport(Darwin)
  import Darwin
#endif

/// Enqueue calls that wait for a group commit: the calls that arrive while the connection is
/// busy are committed together, in one transaction.
///
/// A small call that finds no other add under way *leads*: it commits its own jobs on its
/// caller's thread (see ``SerializedConnection/tryInline(_:waitingForInlineCalls:cancellable:)``),
/// then commits, on that thread too, the calls that queued up behind it meanwhile, a few rounds
/// at most. Calls that cannot be committed there (too large, another process holds the lock, a
/// checkpoint waits, an error) are handed to one block on the connection's thread, which
/// commits whatever waits, group after group, until none comes. So concurrent adders cost one
/// transaction per group and no trip to the store's thread, where each call used to cost two
/// thread wake-ups.
///
/// When any call fails (a constraint, a trigger, a value SQLite refuses) or the commit does, the
/// whole group is rolled back and every call of it runs again alone, so a failure undoes and
/// fails only its own call. (A savepoint per call did the same at two more statements per job,
/// for a case that almost never happens.) Each caller is resumed only after the transaction
/// holding its jobs committed.
final class EnqueueGroups: Sendable {
  /// One waiting call.
  struct Request: Sendable {
    var jobs: [NewJob]
    var queue: String
    var clock: any JobClock
    /// How the caller gets its answer.
    var completion: Completion
    /// The caller's priority: a leader waiting for followers stops waiting for a call of higher
    /// priority, and a call of higher priority takes the wait over from a leader that yields (see
    /// ``EnqueueGroups/gather(with:queue:clock:)``).
    var priority: TaskPriority
    /// Whether the caller's task prefers an executor of its own: such a call takes the wait over
    /// from a leader that yields.
    var prefersExecutor: Bool

    /// Hands the caller its answer.
    func resume(with result: Result<[EnqueueResult], any Error>) {
      switch completion {
      case .continuation(let continuation): continuation.resume(with: result)
      case .leader(let slot): slot.fulfil(result)
      }
    }

    func resume(returning results: [EnqueueResult]) { resume(with: .success(results)) }

    func resume(throwing error: any Error) { resume(with: .failure(error)) }
  }

  /// How a waiting call gets its answer.
  enum Completion: Sendable {
    /// A call suspended in ``EnqueueGroups/add(_:)``.
    case continuation(UnsafeContinuation<[EnqueueResult], any Error>)
    /// The own call of a leader whose wait for followers another call took over (see
    /// ``EnqueueGroups/gather(with:queue:clock:)``): the leader reads its answer there.
    case leader(LeaderSlot)
  }

  /// The answer to a leader's own call once another call took its wait over: given once, by
  /// whoever commits the call, and read once, by the leader, whether its task is cancelled or not
  /// (its jobs may be committed).
  typealias LeaderSlot = CallbackPromise<[EnqueueResult]>

  /// A leader that yields its thread while it waits for followers (see
  /// ``EnqueueGroups/gather(with:queue:clock:)``).
  private struct Gathering {
    /// The leader's own call, for a call that takes the wait over.
    var own: Request
    var slot: LeaderSlot

    /// Whether `request` takes the wait over: when it would otherwise wait for the leader's task
    /// longer than for its own resumption (it prefers an executor of its own, or has a higher
    /// priority than the leader).
    func isTakenOver(by request: Request) -> Bool {
      request.prefersExecutor || request.priority > own.priority
    }
  }

  private struct State {
    var waiting: [Request] = []
    /// A block that commits the waiting calls is on the connection's thread (or running).
    var flushScheduled = false
    /// A caller leads: it commits on its own thread, and then the calls that wait (see
    /// ``lead()``). Never true while `flushScheduled` is.
    var leading = false
    /// Calls the current leader committed for others so far, and the last leader in all: a
    /// leader whose predecessor had followers waits briefly for its own (see
    /// ``gather(with:queue:clock:)``).
    var followersOfThisLead = 0
    var followersOfLastLead = 0
    /// The longest a new leader waits for the followers it expects (see
    /// ``gather(with:queue:clock:)``).
    var followerLinger = Duration.microseconds(50)
    /// The leader waiting for followers, while it yields its thread.
    var gathering: Gathering?

    /// How many of the first waiting calls fit one inline transaction beside `rows` jobs and
    /// `bytes` bytes already in it (see ``SQLiteJobStore/isSmall(_:)``).
    func fittingPrefix(rows: Int, bytes: Int) -> Int {
      var rows = rows
      var bytes = bytes
      var fitting = 0
      for request in waiting {
        rows += request.jobs.count
        for job in request.jobs { bytes += SQLiteJobStore.bytes(of: job) }
        guard rows <= SQLiteJobStore.inlineRowLimit, bytes <= SQLiteJobStore.inlineByteLimit else { break }
        fitting += 1
      }
      return fitting
    }

    /// Takes the first `count` waiting calls for the leader.
    mutating func takeFollowers(_ count: Int) -> [Request] {
      followersOfThisLead += count
      defer { waiting.removeFirst(count) }
      return Array(waiting.prefix(count))
    }

    /// Ends the lead.
    mutating func endLead() {
      leading = false
      followersOfLastLead = followersOfThisLead
    }
    /// Groups committed with more than one call (for tests).
    var groupsCommitted = 0
    /// Calls taken by the connection's thread, alone or in groups (for tests).
    var callsTaken = 0
  }

  private let state = Mutex(State())

  /// The most rounds a leader commits for the calls queued behind it before it hands the rest to
  /// the connection's thread: a bound on how long the leader's own call and its pool thread wait.
  static let leaderRounds = 8

  /// What a leader does next (see ``next(round:)``).
  enum Next {
    /// Nothing waits: the leader returns.
    case done
    /// Commit these calls, on the leader's thread, then ask again.
    case commit([Request])
    /// The calls that wait go to the connection's thread: the leader submits a flush and returns.
    case handOver
  }

  /// Makes the caller the leader when no add is under way (none leads and no flush is
  /// scheduled): it may then commit on its own thread, and must end with ``next(round:)`` or
  /// ``handOver(_:)``. False when the caller must wait in a group (``add(_:)``).
  func lead() -> Bool {
    state.withLock { state in
      guard !state.leading && !state.flushScheduled else { return false }
      state.leading = true
      state.followersOfThisLead = 0
      return true
    }
  }

  /// For the leader: takes the calls that queued up behind it, as many as an inline transaction
  /// holds (``SQLiteJobStore/inlineRowLimit`` jobs and ``SQLiteJobStore/inlineByteLimit`` bytes),
  /// or ends its lead when none waits, when the first that waits is too large, or after
  /// ``leaderRounds`` rounds.
  func next(round: Int) -> Next {
    state.withLock { state in
      if state.waiting.isEmpty {
        state.endLead()
        return .done
      }
      let taken = round < Self.leaderRounds ? state.fittingPrefix(rows: 0, bytes: 0) : 0
      guard taken > 0 else {
        state.endLead()
        state.flushScheduled = true
        return .handOver
      }
      return .commit(state.takeFollowers(taken))
    }
  }

  /// What a new leader commits (see ``gather(with:queue:clock:)``).
  enum Gathered {
    /// Its own jobs, and then these calls'.
    case followers([Request])
    /// Nothing: another call took the wait over, and the leader's call was committed (or failed)
    /// with the calls behind it. The answer is in the slot.
    case takenOver(LeaderSlot)
  }

  /// For a new leader about to commit `jobs`: the waiting calls that fit one inline transaction
  /// with them, to commit together.
  ///
  /// When the last leader had followers, their callers come back within microseconds with their
  /// next jobs: waiting for as many (for at most the follower linger, 50 µs) makes one
  /// transaction of them and the leader's own jobs, where committing at once would commit the
  /// leader's jobs alone and theirs in a second transaction. A lone adder (no followers) never
  /// waits.
  ///
  /// On the global executor the leader waits with `Task.yield()`, so its own thread runs the
  /// followers meanwhile. Those followers are the tasks queued behind it: they would otherwise
  /// need another thread of the pool, often one that had gone to sleep and took longer than the
  /// linger to wake. Eight adding tasks then committed in groups of about five, and about one
  /// transaction in three held a single call; yielding, nearly every group holds all eight.
  ///
  /// A yielding leader is not running, and the pool may not run it again for a long while (other
  /// work of its priority holds every thread). A call on the pool at the leader's priority or
  /// lower would wait as long for its own resumption, so it may wait for the leader. Any other
  /// call that arrives *takes the wait over* (see ``add(_:)``): a call of higher priority, and a
  /// call whose task prefers an executor of its own (it needs no thread of the pool). The
  /// leader's own call then goes to the connection's thread with the calls waiting, and the
  /// leader reads its answer when it runs again.
  ///
  /// When its task prefers an executor, the leader spins on its thread (`sched_yield`) instead,
  /// as it always did: a job there may wait for another caller's add, and those adds would wait
  /// for the leader. It commits at once when a call of higher priority waits behind it.
  func gather(with jobs: [NewJob], queue: String, clock: any JobClock) async -> Gathered {
    let (expected, linger) = state.withLock { ($0.followersOfLastLead, $0.followerLinger) }
    let bytes = jobs.reduce(0) { $0 + SQLiteJobStore.bytes(of: $1) }
    func takeFitting(_ state: inout State) -> Gathered {
      .followers(state.takeFollowers(state.fittingPrefix(rows: jobs.count, bytes: bytes)))
    }
    guard expected > 0 else { return state.withLock { takeFitting(&$0) } }
    let deadline = ContinuousClock.now + linger
    let priority = Task.currentPriority
    guard withUnsafeCurrentTask(body: { $0?.unownedTaskExecutor == nil }) else {
      while ContinuousClock.now < deadline {
        let enough = state.withLock { state in
          state.waiting.count >= expected || state.waiting.contains { $0.priority > priority }
        }
        if enough { break }
        sched_yield()
      }
      return state.withLock { takeFitting(&$0) }
    }
    let slot = LeaderSlot()
    let own = Request(
      jobs: jobs, queue: queue, clock: clock, completion: .leader(slot), priority: priority,
      prefersExecutor: false)
    let gathering = Gathering(own: own, slot: slot)
    state.withLock { $0.gathering = gathering }
    while true {
      let gathered = state.withLock { state -> Gathered? in
        guard state.gathering?.slot === slot else { return .takenOver(slot) }
        // A call that would take the wait over but came before it was published (the first pass
        // runs before the first yield): the leader, running, commits at once.
        guard
          state.waiting.count >= expected || ContinuousClock.now >= deadline
            || state.waiting.contains(where: gathering.isTakenOver(by:))
        else { return nil }
        state.gathering = nil
        return takeFitting(&state)
      }
      if let gathered { return gathered }
      await Task.yield()
    }
  }

  /// Ends the lead, handing `requests` (taken, not committed) and the calls that wait to the
  /// connection's thread; true when the caller must submit the flush (none is scheduled).
  func handOver(_ requests: [Request]) -> Bool {
    state.withLock { state in
      state.waiting.insert(contentsOf: requests, at: 0)
      state.endLead()
      defer { state.flushScheduled = true }
      return !state.flushScheduled
    }
  }

  /// Whether no add is under way: none leads and no flush is scheduled (for tests). A flush that
  /// took its calls and ended (see ``take(expecting:linger:endingFlush:)``) may still be committing
  /// them on the connection's thread.
  var isIdle: Bool { state.withLock { !$0.leading && !$0.flushScheduled } }

  /// Sets how long a new leader waits for the followers it expects (for tests; 50 µs otherwise).
  func setFollowerLinger(_ linger: Duration) { state.withLock { $0.followerLinger = linger } }

  /// How many calls wait (for tests).
  var waitingCount: Int { state.withLock { $0.waiting.count } }

  /// How many calls the connection's thread committed, alone or in groups (for tests).
  var callsTaken: Int { state.withLock { $0.callsTaken } }

  /// How many transactions committed more than one call (for tests).
  var groupsCommitted: Int { state.withLock { $0.groupsCommitted } }

  /// Adds a call; true when the caller must schedule a flush (none is scheduled and no leader will
  /// take the call).
  ///
  /// A call that takes over the wait of a yielding leader (see ``gather(with:queue:clock:)``)
  /// ends its lead: the leader's own call and the calls waiting go to the connection's thread
  /// with it.
  func add(_ request: Request) -> Bool {
    state.withLock { state in
      state.waiting.append(request)
      if let gathering = state.gathering, gathering.isTakenOver(by: request) {
        state.gathering = nil
        state.waiting.insert(gathering.own, at: 0)
        state.endLead()
        defer { state.flushScheduled = true }
        return !state.flushScheduled
      }
      if state.leading { return false }
      defer { state.flushScheduled = true }
      return !state.flushScheduled
    }
  }

  /// Takes every waiting call once at least `expected` wait, or once `linger` has passed with
  /// some waiting; nil (and the flush ends) when none came by then.
  ///
  /// The callers of the group just committed come back within microseconds to add their next
  /// jobs: waiting for them (yielding the processor meanwhile) makes the next group as large as
  /// the last, where taking whatever is there at once would commit them one or two at a time.
  /// A group of one (`expected` 1) is not waited for: a single caller's next call then finds the
  /// flush over and runs inline, instead of following every call through the connection's thread
  /// (as it did once a checkpoint had sent one call there).
  ///
  /// With `endingFlush`, taking a group also ends the flush: calls that come later lead (see
  /// ``lead()``) instead of waiting for the connection's thread.
  func take(expecting expected: Int, linger: Duration = .microseconds(50), endingFlush: Bool = false)
    -> [Request]?
  {
    let deadline = ContinuousClock.now + (expected == 1 ? .zero : linger)
    while true {
      let taken = state.withLock { state -> [Request]?? in
        let waiting = state.waiting.count
        if waiting >= max(expected, 1) || (waiting > 0 && ContinuousClock.now >= deadline) {
          state.callsTaken += waiting
          if endingFlush { state.flushScheduled = false }
          defer { state.waiting = [] }
          return state.waiting
        }
        guard waiting == 0 && ContinuousClock.now >= deadline else { return .some(nil) }
        state.flushScheduled = false
        return nil
      }
      guard let taken else { return nil }
      if let taken { return taken }
      sched_yield()
    }
  }

  /// Counts a transaction that committed several calls.
  func countGroup() { state.withLock { $0.groupsCommitted += 1 } }
}

extension SQLiteJobStore {
  /// Commits the waiting enqueue calls as one group; runs on the connection's thread (`db` is nil
  /// once the store was closed). `expected` is the size of the group before, whose callers may
  /// come back with their next jobs (see ``EnqueueGroups/take(expecting:linger:)``).
  ///
  /// The next group is a new block behind the blocks already submitted, so a stream of adds never
  /// keeps a claim or a heartbeat waiting for the thread.
  ///
  /// When calls may run inline, the flush commits one group, the calls waiting when it starts, and
  /// ends: the calls that come later lead again (see ``EnqueueGroups/lead()``), waiting briefly
  /// for the connection while this group commits. Each flush after the first waited for the
  /// callers of the group before to come back, and a stream of adds, whose callers always did,
  /// stayed on this thread once a checkpoint or a leader's last round had sent it here.
  func flushEnqueueGroups(_ db: Connection?, expecting expected: Int = 0) {
    let inline = connection.runsInline
    let taken =
      inline ? groups.take(expecting: 0, linger: .zero, endingFlush: true) : groups.take(expecting: expected)
    guard let group = taken else { return }
    if let db {
      let results = Self.commit(group, db: db, groups: groups)
      for (request, result) in zip(group, results) { request.resume(with: result) }
    } else {
      for request in group { request.resume(throwing: connection.closedFailure()) }
    }
    if !inline { connection.submit { [self] db in flushEnqueueGroups(db, expecting: group.count) } }
  }

  /// For the leader (see ``EnqueueGroups/lead()``), once its own add ran: commits the calls that
  /// queued up behind it, round after round, on its thread, resuming each caller once its jobs
  /// are committed; hands them to the connection's thread when they cannot be committed there.
  ///
  /// Not cancellable: the calls are other callers', whose task the leader's cancellation must not
  /// touch. Never suspends: the waiting calls depend on the leader's task alone.
  /// Returns whether it committed calls of others.
  func commitQueuedBehindLeader() async -> Bool {
    var round = 0
    while true {
      defer { round += 1 }
      switch groups.next(round: round) {
      case .done:
        return round > 0
      case .handOver:
        connection.submit { [self] db in flushEnqueueGroups(db) }
        return round > 0
      case .commit(let group):
        let outcome = await connection.tryInline(
          { db in try Self.commitInline(group.map { ($0.jobs, $0.queue, $0.clock) }, db: db) },
          waitingForInlineCalls: true, cancellable: false, yields: false)
        guard case .success(let results)? = outcome else {
          // Busy, a checkpoint waits, closed, or a call failed: the connection's thread commits
          // the group again, each call alone if need be, and reports each call's own error.
          if groups.handOver(group) { connection.submit { [self] db in flushEnqueueGroups(db) } }
          return round > 0
        }
        if group.count > 1 { groups.countGroup() }
        for (request, result) in zip(group, results) { request.resume(returning: result) }
      }
    }
  }

  /// Lets the pool's other tasks run once a lead ended: at once after a lead that committed
  /// others' calls (up to 8 rounds and a wait for followers: a loop of such leads kept a pool
  /// thread for tens of milliseconds between yields, and starved a test beside 8 adding tasks
  /// for 20 s in a full run), every 64th inline call otherwise.
  func yieldAfterLead(ledOthers: Bool) async {
    if ledOthers { await Task.yield() } else { await connection.countInlineCall() }
  }

  /// Commits the calls of a leader's group in one transaction, in order; throws (and commits
  /// nothing) when any call fails.
  static func commitInline(_ calls: [(jobs: [NewJob], queue: String, clock: any JobClock)], db: Connection)
    throws -> [[EnqueueResult]]
  {
    let results = try db.transaction(immediate: true) { try insert(calls, db: db) }
    // Only once committed: a rolled-back note must be written again next time.
    for call in calls { db.notedQueues.insert(ExactText(call.queue)) }
    return results
  }

  /// Commits one group's calls in one transaction, each in a savepoint of its own.
  private static func commit(_ group: [EnqueueGroups.Request], db: Connection, groups: EnqueueGroups)
    -> [Result<[EnqueueResult], any Error>]
  {
    func alone(_ request: EnqueueGroups.Request) -> Result<[EnqueueResult], any Error> {
      Result { try commitAlone(request.jobs, queue: request.queue, clock: request.clock, db: db) }
    }
    if group.count == 1 { return [alone(group[0])] }
    do {
      try db.begin("BEGIN IMMEDIATE")
    } catch {
      // No lock within the busy timeout: no call's work began; each fails as a lone call would.
      return group.map { _ in .failure(error) }
    }
    let results: [[EnqueueResult]]
    do {
      results = try insert(group.map { ($0.jobs, $0.queue, $0.clock) }, db: db)
      try db.run("COMMIT")
    } catch {
      db.rollbackIfNeeded()
      // Nothing of the group was committed: each call alone, so a failure stays its own.
      return group.map(alone)
    }
    groups.countGroup()
    for request in group { db.notedQueues.insert(ExactText(request.queue)) }
    return results.map { .success($0) }
  }

  /// Commits one call's jobs in a transaction of their own.
  static func commitAlone(_ jobs: [NewJob], queue: String, clock: any JobClock, db: Connection) throws
    -> [EnqueueResult]
  {
    try commitInline([(jobs, queue, clock)], db: db)[0]
  }

  /// Inserts the calls' jobs in order inside the caller's transaction, skipping duplicates by key;
  /// the results of each call, in order.
  ///
  /// When no job has a key, the jobs go into one multi-row `INSERT … RETURNING id` per
  /// ``rowsPerInsert`` jobs or ``bytesPerInsert`` bytes (see ``insertTogether(_:rows:db:)``); otherwise each job is one statement,
  /// after a lookup of its key.
  private static func insert(_ calls: [(jobs: [NewJob], queue: String, clock: any JobClock)], db: Connection)
    throws -> [[EnqueueResult]]
  {
    let rows = calls.reduce(0) { $0 + $1.jobs.count }
    if rows > 1, SQL.hasReturning,
      calls.allSatisfy({ $0.jobs.allSatisfy { $0.deduplicationKey == nil && $0.orderingKey == nil } })
    {
      return try insertTogether(calls, rows: rows, db: db)
    }
    return try calls.map { call in
      try insert(call.jobs, queue: call.queue, now: millis(call.clock.now()), db: db)
    }
  }

  /// The most jobs one multi-row `INSERT` takes (see ``insertTogether(_:rows:db:)``): 7 parameters
  /// each, far below SQLite's limit of 32,766, and at most 32 statements to cache.
  static let rowsPerInsert = 32
  /// The most payload bytes one multi-row `INSERT` holds (a larger job goes alone): SQLite keeps a
  /// copy of each bound value until the statement ran, so large jobs go one per statement, holding
  /// one copy at a time as a statement per job did.
  static let bytesPerInsert = 64 * 1_024

  /// Inserts the calls' jobs, none of which has a key, `rows` in all, with one multi-row `INSERT`
  /// per ``rowsPerInsert`` jobs or ``bytesPerInsert`` bytes of payloads: one statement to start,
  /// and one update of the `AUTOINCREMENT` counter, for a group of calls instead of one per job
  /// (8 calls of one job: 65 µs a transaction instead of 74 µs, measured on the group's leader).
  ///
  /// A job's ID is read back with `RETURNING id`; the IDs are matched to the jobs in ascending
  /// order, because SQLite inserts the rows of a `VALUES` list in their order and an
  /// `AUTOINCREMENT` key only grows, while the order of the `RETURNING` rows is not promised. A
  /// row a trigger skipped (`RAISE(IGNORE)`) returns no ID: the calls fail, and the group runs
  /// each alone (see ``commit(_:db:groups:)``), as when a one-row insert changes no row.
  private static func insertTogether(
    _ calls: [(jobs: [NewJob], queue: String, clock: any JobClock)], rows: Int, db: Connection
  ) throws -> [[EnqueueResult]] {
    // The rows of each statement: up to `rowsPerInsert` jobs and `bytesPerInsert` bytes.
    var chunks: [Int] = []
    var chunkBytes = 0
    for call in calls {
      for job in call.jobs {
        let size = bytes(of: job)
        if let last = chunks.last, last < rowsPerInsert, chunkBytes + size <= bytesPerInsert {
          chunks[chunks.count - 1] += 1
          chunkBytes += size
        } else {
          chunks.append(1)
          chunkBytes = size
        }
      }
    }
    var ids: [Int64] = []
    ids.reserveCapacity(rows)
    var statement: Statement?
    var chunk = 0  // the rows of `statement`
    var bound = 0  // those bound so far
    var chunksBegun = 0
    // A value SQLite refuses (too large) leaves a statement half bound: clear its copies.
    defer { statement?.reset() }
    for call in calls {
      if !db.notedQueues.contains(ExactText(call.queue)) { try db.run(SQL.noteQueue, .text(call.queue)) }
      let now = millis(call.clock.now())
      for job in call.jobs {
        let current: Statement
        if let statement {
          current = statement
        } else {
          chunk = chunks[chunksBegun]
          chunksBegun += 1
          bound = 0
          current = try db.statement(SQL.insert(rows: chunk))
          statement = current
        }
        let runAt = runAt(job.runTime, now: now)
        let first = Int32(bound * SQL.insertColumns + 1)
        try current.bind(.text(call.queue), at: first)
        try current.bind(.blob(job.payload), at: first + 1)
        try current.bind(.text(runAt <= now ? "ready" : "scheduled"), at: first + 2)
        try current.bind(.integer(Int64(job.priority)), at: first + 3)
        try current.bind(.integer(runAt), at: first + 4)
        try current.bind(.integer(now), at: first + 5)
        try current.bind(.null, at: first + 6)
        try current.bind(job.timeLimitMilliseconds.map(SQLiteValue.integer) ?? .null, at: first + 7)
        try current.bind(.null, at: first + 8)
        try current.bind(.null, at: first + 9)
        try current.bind(job.limitKey.map(SQLiteValue.text) ?? .null, at: first + 10)
        try current.bind(job.fairnessKey.map(SQLiteValue.text) ?? .null, at: first + 11)
        bound += 1
        guard bound == chunk else { continue }
        statement = nil
        defer { current.reset() }
        var returned: [Int64] = []
        returned.reserveCapacity(chunk)
        while try current.step() { returned.append(current.int64(0)) }
        guard returned.count == chunk else {
          throw SQLiteError(
            code: .constraint,
            message:
              "the jobs table did not take a job (a trigger on it dropped the row); nothing of this add was stored"
          )
        }
        ids += returned.sorted()
      }
    }
    var results: [[EnqueueResult]] = []
    results.reserveCapacity(calls.count)
    var next = 0
    for call in calls {
      results.append(ids[next..<next + call.jobs.count].map { EnqueueResult(id: JobID($0), inserted: true) })
      next += call.jobs.count
    }
    return results
  }

  /// Inserts jobs in order inside the caller's transaction, skipping duplicates by key.
  static func insert(_ jobs: [NewJob], queue: String, now: Int64, db: Connection) throws
    -> [EnqueueResult]
  {
    if !db.notedQueues.contains(ExactText(queue)) { try db.run(SQL.noteQueue, .text(queue)) }
    var results: [EnqueueResult] = []
    results.reserveCapacity(jobs.count)
    for job in jobs {
      if let key = job.deduplicationKey {
        var found = try db.scalar(SQL.findDuplicate, .text(queue), .text(key)).map { (id: $0, waiting: true) }
        if found == nil, job.deduplicationScope.includesRunning {
          let since = job.deduplicationScope.completedSince(now: now)
          found = try db.scalar(
            SQL.findKeyed, .text(queue), .text(key), since.map(SQLiteValue.integer) ?? .null
          )
          .map { (id: $0, waiting: false) }
        }
        if let found {
          guard found.waiting, job.onConflict == .replace else {
            results.append(EnqueueResult(id: JobID(found.id), outcome: .existing))
            continue
          }
          let runAt = runAt(job.runTime, now: now)
          let replaced = try db.run(
            SQL.replaceWaiting, .blob(job.payload), .integer(Int64(job.priority)), .integer(runAt),
            .text(runAt <= now ? "ready" : "scheduled"),
            job.timeLimitMilliseconds.map(SQLiteValue.integer) ?? .null, .integer(found.id))
          // In this write transaction the job found waiting cannot have moved on.
          guard replaced == 1 else {
            throw SQLiteError(
              code: .constraint, message: "the waiting job \(found.id) to replace was not updated")
          }
          results.append(EnqueueResult(id: JobID(found.id), outcome: .replaced))
          continue
        }
      }
      let runAt = runAt(job.runTime, now: now)
      // A job whose ordering key's line holds an earlier job waits behind it, held.
      let held =
        try job.orderingKey.map { try db.scalar(SQL.lineTaken, .text(queue), .text($0)) != nil } ?? false
      let stored = try db.run(
        SQL.insert, .text(queue), .blob(job.payload),
        .text(held ? "held" : runAt <= now ? "ready" : "scheduled"),
        .integer(Int64(job.priority)), .integer(runAt), .integer(now),
        job.deduplicationKey.map(SQLiteValue.text) ?? .null,
        job.timeLimitMilliseconds.map(SQLiteValue.integer) ?? .null,
        job.orderingKey.map(SQLiteValue.text) ?? .null, job.orderingKey == nil ? .null : .integer(1),
        job.limitKey.map(SQLiteValue.text) ?? .null, job.fairnessKey.map(SQLiteValue.text) ?? .null)
      // A trigger may drop the row without an error (RAISE(IGNORE)): the last row ID is then
      // another job's. The call fails, and nothing of it is added.
      guard stored == 1 else {
        throw SQLiteError(
          code: .constraint,
          message:
            "the jobs table did not take a job (a trigger on it dropped the row); nothing of this add was stored"
        )
      }
      results.append(EnqueueResult(id: JobID(db.lastInsertRowID), inserted: true))
    }
    return results
  }
}
