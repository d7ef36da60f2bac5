import Foundation
import Synchronization

/// A ``JobStore`` that keeps jobs in memory: for tests and for work that may be lost when the
/// process ends.
///
/// It follows the same semantics as the durable stores (it passes the same conformance suite);
/// only durability differs. Claims are O(log n) through heaps, so large backlogs stay fast.
///
/// ```swift
/// let store = InMemoryJobStore()
/// let queue = try JobQueue<Email>(configuration: .init(identifier: "emails"), store: store) { email, _ in
///   try await send(email)
///   return .handled
/// }
/// ```
public final class InMemoryJobStore: JobStore {
  private let state = Mutex(State())

  /// Creates an empty store.
  public init() {}

  /// Commits new jobs; see ``JobStore/enqueue(_:queue:clock:)``.
  public func enqueue(_ jobs: [NewJob], queue: String, clock: any JobClock) async throws -> [EnqueueResult] {
    try OrderingKey.check(jobs)
    return state.withLock { state in
      state.enqueue(jobs, queue: queue, now: JobStoreTime.normalized(clock.now()))
    }
  }

  static func runDate(_ runTime: RunTime, now: Date) -> Date {
    switch runTime {
    case .now: now
    case .after(let delay): JobStoreTime.date(now, adding: delay)
    case .at(let date): JobStoreTime.normalized(date)
    }
  }

  /// Settles and claims; see ``JobStore/settleAndClaim(_:queue:limit:lease:clock:)``.
  public func settleAndClaim(
    _ settlements: [JobSettlement], queue: String, limit: Int, lease: Lease, clock: any JobClock
  ) async throws -> ClaimBatch {
    var stale: [ClaimReference] = []
    var retryDates: [JobID: Date] = [:]
    var claimed: [JobRecord] = []
    var full = false
    var nextStart: Date?
    let paused = withQueue(queue) { queueState in
      // Read under the lock, as the store protocol asks: a call that waited for the lock must not
      // commit a lease or run date from before the wait.
      let wall = clock.now()
      let now = JobStoreTime.normalized(wall)
      let expiry = JobStoreTime.date(now, adding: lease.duration)
      for settlement in settlements {
        guard queueState.settle(settlement, now: now) else {
          stale.append(settlement.claim)
          continue
        }
        if case .retry = settlement.action {
          retryDates[settlement.id] = queueState.jobs[settlement.id]?.record.runAt
        }
      }
      var places = queueState.limits.claimable(limit, running: queueState.running.count)
      let rate = queueState.paused || places == 0 ? nil : queueState.limits.rate
      // The rate reads the clock to the microsecond (the stored dates are whole milliseconds): a
      // claim at the `nextStart` it reported takes a start, and a rate above 1,000 a second gives
      // more than one a millisecond.
      let micros = RateLimit.microseconds(wall)
      if let rate { places = rate.take(places, tat: queueState.rateTime, now: micros).starts }
      if !queueState.paused && places > 0 {
        claimed = queueState.claim(
          limit: places, owner: lease.owner, expiry: expiry, now: now, micros: micros)
      }
      if let rate {
        let taken = rate.take(claimed.count, tat: queueState.rateTime, now: micros)
        if taken.mustStore { queueState.rateTime = taken.tat }
        nextStart = rate.nextStart(tat: queueState.rateTime, now: micros).map(RateLimit.date)
      }
      full = limit > 0 && queueState.limits.claimable(1, running: queueState.running.count) == 0
      return queueState.paused
    }
    return ClaimBatch(
      claimed: claimed, staleSettlements: stale, paused: paused, retryDates: retryDates, full: full,
      nextStart: nextStart)
  }

  /// Extends leases; see ``JobStore/heartbeat(_:queue:lease:clock:)``.
  public func heartbeat(_ claims: [ClaimReference], queue: String, lease: Lease, clock: any JobClock)
    async throws -> [ClaimReference]
  {
    withQueue(queue) { queueState in
      let now = JobStoreTime.normalized(clock.now())
      let expiry = JobStoreTime.date(now, adding: lease.duration)
      return claims.filter { claim in
        // A lapsed lease nobody rescued yet is still this claim's: renewing it is safe.
        guard queueState.isCurrent(claim) else { return false }
        queueState.jobs[claim.id]?.record.leaseExpiresAt = expiry
        return true
      }
    }
  }

  /// Keeps checkpoints: true.
  public var keepsCheckpoints: Bool { true }

  /// Replaces a running job's payload; see ``JobStore/checkpoint(_:payload:queue:)``.
  public func checkpoint(_ claim: ClaimReference, payload: Data, queue: String) async throws -> Bool {
    withQueue(queue) { queueState in
      guard queueState.isCurrent(claim) else { return false }
      queueState.jobs[claim.id]?.record.payload = payload
      return true
    }
  }

  /// Returns expired leases to ready; see ``JobStore/rescueExpiredLeases(queue:clock:)``.
  public func rescueExpiredLeases(queue: String, clock: any JobClock) async throws -> Int {
    withQueue(queue) { queueState in
      let now = JobStoreTime.normalized(clock.now())
      let expired = queueState.running.filter { id in
        guard let expiry = queueState.jobs[id]?.record.leaseExpiresAt else { return false }
        return expiry <= now
      }
      for id in expired {
        guard let slot = queueState.jobs[id] else { continue }
        queueState.makeWaiting(
          id, runAt: slot.record.runAt, error: slot.record.lastError, ready: true, seq: slot.seq,
          turn: .keep(slot.turn))
      }
      return expired.count
    }
  }

  /// Counts jobs by status; see ``JobStore/counts(queue:clock:)``.
  public func counts(queue: String, clock: any JobClock) async throws -> JobCounts {
    state.withLock { state in
      let now = JobStoreTime.normalized(clock.now())
      var counts = JobCounts()
      guard let queueState = state.queues[ExactText(queue)] else { return counts }
      for slot in queueState.jobs.values {
        switch slot.record.status {
        case .pending where slot.record.isHeld: counts.held += 1
        // Ready once marked so (as SQLite stores it), or once its date has come.
        case .pending where slot.ready || slot.record.runAt <= now: counts.ready += 1
        case .pending: counts.scheduled += 1
        case .running: counts.running += 1
        case .dead: counts.dead += 1
        case .completed: counts.completed += 1
        case .cancelled: counts.cancelled += 1
        }
      }
      return counts
    }
  }

  /// Lists jobs a page at a time; see ``JobStore/jobs(queue:status:after:limit:)``.
  public func jobs(queue: String, status: JobStatus?, after: JobID?, limit: Int) async throws
    -> [JobRecord]
  {
    state.withLock { state in
      guard limit > 0, let jobs = state.queues[ExactText(queue)]?.jobs else { return [] }
      if let status, status == .completed || status == .cancelled {
        // In the order they finished, from the one after `after` (the start when it is gone).
        let history = jobs.values.map(\.record).filter { $0.status == status }.sorted(by: Self.finishOrder)
        let start = after.flatMap { after in history.firstIndex { $0.id == after }.map { $0 + 1 } } ?? 0
        return Array(history[start...].prefix(limit))
      }
      let matching = jobs.values.map(\.record).filter { record in
        (status == nil || record.status == status) && (after.map { record.id > $0 } ?? true)
      }
      return Array(matching.sorted { $0.id < $1.id }.prefix(limit))
    }
  }

  /// Finish date, then ID.
  static func finishOrder(_ a: JobRecord, _ b: JobRecord) -> Bool {
    let (x, y) = (a.finishedAt ?? .distantPast, b.finishedAt ?? .distantPast)
    return x != y ? x < y : a.id < b.id
  }

  /// The job with this ID; see ``JobStore/job(_:)``.
  public func job(_ id: JobID) async throws -> JobRecord? {
    state.withLock { state in state.queues.values.lazy.compactMap { $0.jobs[id]?.record }.first }
  }

  /// Deletes jobs; see ``JobStore/remove(_:queue:)``.
  public func remove(_ ids: [JobID], queue: String) async throws -> Int {
    state.withLock { state in
      var removed = 0
      for id in Set(ids) where state.queues[ExactText(queue)]?.delete(id) == true { removed += 1 }
      return removed
    }
  }

  /// Cancels unfinished jobs; see ``JobStore/cancel(_:queue:clock:)``.
  public func cancel(_ ids: [JobID], queue: String?, clock: any JobClock) async throws -> [CancelResult] {
    state.withLock { state in
      let now = JobStoreTime.normalized(clock.now())
      return ids.map { id in
        let name = queue.map(ExactText.init) ?? state.queues.first { $0.value.jobs[id] != nil }?.key
        guard let name, let record = state.queues[name]?.jobs[id]?.record else { return .notFound }
        switch record.status {
        case .dead: return .alreadyDead
        case .completed: return .alreadyCompleted
        case .cancelled: return .alreadyCancelled
        case .pending, .running:
          state.queues[name]?.finish(id, as: .cancelled, now: now, error: nil)
          return record.status == .running ? .cancelledRunning : .cancelledWaiting
        }
      }
    }
  }

  /// Deletes old finished jobs; see ``JobStore/prune(queue:status:olderThan:limit:clock:)``.
  public func prune(
    queue: String, status: JobStatus, olderThan age: Duration, limit: Int, clock: any JobClock
  )
    async throws -> Int
  {
    guard status.isFinished, limit > 0 else { return 0 }
    return withQueue(queue) { queueState in
      let now = JobStoreTime.normalized(clock.now())
      let cutoff = JobStoreTime.date(
        milliseconds: JobStoreTime.milliseconds(now) - JobStoreTime.milliseconds(age))
      return queueState.prune(status, finishedBefore: age == .zero ? nil : cutoff, limit: limit)
    }
  }

  /// The claims still current; see ``JobStore/currentClaims(_:queue:)``.
  public func currentClaims(_ claims: [ClaimReference], queue: String) async throws -> [ClaimReference] {
    withQueue(queue) { queueState in claims.filter { queueState.isCurrent($0) } }
  }

  /// Deletes jobs by status; see ``JobStore/clear(queue:statuses:)``.
  public func clear(queue: String, statuses: Set<JobStatus>) async throws -> Int {
    withQueue(queue) { queueState in
      let doomed = queueState.jobs.values.filter { statuses.contains($0.record.status) }.map(\.record.id)
      for id in doomed { queueState.delete(id) }
      return doomed.count
    }
  }

  /// Counts jobs by status; see ``JobStore/tally(queue:statuses:)``.
  public func tally(queue: String, statuses: Set<JobStatus>) async throws -> JobTally {
    withQueue(queue) { queueState in
      let ids = queueState.jobs.values.filter { statuses.contains($0.record.status) }.map(\.record.id)
      return JobTally(count: ids.count, highestID: ids.max())
    }
  }

  /// Deletes counted jobs or none; see ``JobStore/clear(queue:statuses:through:expecting:)``.
  public func clear(queue: String, statuses: Set<JobStatus>, through: JobID, expecting expected: Int)
    async throws -> Int?
  {
    withQueue(queue) { queueState in
      let doomed = queueState.jobs.values.filter {
        statuses.contains($0.record.status) && $0.record.id <= through
      }
      .map(\.record.id)
      guard doomed.count == expected else { return nil }
      for id in doomed { queueState.delete(id) }
      return doomed.count
    }
  }

  /// Re-queues dead jobs; see ``JobStore/requeueDead(_:queue:clock:)``.
  public func requeueDead(_ ids: [JobID]?, queue: String, clock: any JobClock) async throws -> Int {
    withQueue(queue) { queueState in
      let now = JobStoreTime.normalized(clock.now())
      // Oldest first, so of dead jobs sharing a deduplication key the oldest is the one re-queued;
      // re-queueing every dead job takes those without a key first, as SQLite does (they take
      // their fair-shares turns in that order).
      let candidates =
        ids.map { Array(Set($0)).sorted() }
        ?? queueState.jobs.keys.sorted {
          let (a, b) = (
            queueState.jobs[$0]?.record.deduplicationKey, queueState.jobs[$1]?.record.deduplicationKey
          )
          return (a == nil) != (b == nil) ? a == nil : $0 < $1
        }
      var count = 0
      for id in candidates {
        guard let record = queueState.jobs[id]?.record, record.status == .dead else { continue }
        if let key = record.deduplicationKey, queueState.dedup[ExactText(key)]?.isEmpty == false { continue }
        queueState.jobs[id]?.record.attempts = 0
        queueState.makeWaiting(id, runAt: now, error: record.lastError, ready: true, seq: 0, turn: .take)
        count += 1
      }
      return count
    }
  }

  /// Stores the pause flag; see ``JobStore/setPaused(_:queue:)``.
  public func setPaused(_ paused: Bool, queue: String) async throws {
    state.withLock { $0.queues[ExactText(queue), default: QueueState()].paused = paused }
  }

  /// Reads the pause flag; see ``JobStore/isPaused(queue:)``.
  public func isPaused(queue: String) async throws -> Bool {
    state.withLock { $0.queues[ExactText(queue)]?.paused ?? false }
  }

  /// The stored limits; see ``JobStore/limits(queue:)``.
  public func limits(queue: String) async throws -> QueueLimits {
    state.withLock { $0.queues[ExactText(queue)]?.limits ?? QueueLimits() }
  }

  /// Keeps and enforces rate limits: true.
  public var keepsRateLimits: Bool { true }

  /// Keeps and enforces limits per key: true.
  public var keepsKeyLimits: Bool { true }
  /// Keeps fairness keys and claims by fair shares.
  public var keepsFairShares: Bool { true }

  /// The keys with running or held jobs; see ``JobStore/limitKeyUsage(queue:limit:)``.
  public func limitKeyUsage(queue: String, limit: Int) async throws -> [LimitKeyUsage] {
    guard limit > 0 else { return [] }
    let rows = state.withLock { state -> [LimitKeyUsage] in
      guard let queueState = state.queues[ExactText(queue)] else { return [] }
      var usage: [ExactText: (running: Int, held: Int)] = [:]
      for (key, running) in queueState.runningByKey { usage[key, default: (0, 0)].running = running }
      for (key, entries) in queueState.parked {
        // Entries of jobs since changed stay in the heap until met; count the jobs still held.
        let held = Set(entries.elements.map(\.entry.id)).filter {
          queueState.jobs[$0].map { $0.record.status == .pending && $0.record.isHeldByLimit } ?? false
        }.count
        if held > 0 { usage[key, default: (0, 0)].held = held }
      }
      return usage.map { LimitKeyUsage(key: $0.key.text, running: $0.value.running, held: $0.value.held) }
    }
    return Array(rows.sorted(by: LimitKeyUsage.precedes).prefix(limit))
  }

  /// Stores limits; see ``JobStore/setLimits(_:queue:)``. Every job held by its key's limit
  /// becomes claimable again (the next claims hold those whose key is still at its limit).
  public func setLimits(_ limits: QueueLimits, queue: String) async throws {
    try limits.check()
    state.withLock { state in
      state.queues[ExactText(queue), default: QueueState()].limits = limits
      if limits.rate == nil { state.queues[ExactText(queue)]?.rateTime = nil }
      state.queues[ExactText(queue)]?.unparkAll()
      if !limits.hasKeyRates { state.queues[ExactText(queue)]?.clearKeyBuckets() }
    }
  }

  /// When a worker is next needed; see ``JobStore/nextWake(queue:clock:)``.
  public func nextWake(queue: String, clock: any JobClock) async throws -> WakeHint {
    state.withLock { state in
      var hint = state.queues[ExactText(queue), default: QueueState()].nextWake(now: clock.now())
      hint.paused = state.queues[ExactText(queue)]?.paused ?? false
      hint.nextScheduleDue = state.schedules[ExactText(queue)]?.values.compactMap(\.nextDue).min()
      return hint
    }
  }

  /// Stores schedules; see ``JobStore/saveSchedules(_:queue:origin:clock:)``.
  public func saveSchedules(
    _ schedules: [ScheduleDefinition], queue: String, origin: ScheduleOrigin, clock: any JobClock
  ) async throws -> ScheduleSaveSummary {
    try state.withLock { state throws(ScheduleError) in
      let existing = Array((state.schedules[ExactText(queue)] ?? [:]).values)
      let now = JobStoreTime.normalizedDown(clock.now())
      var (writes, jobs, summary) = try ScheduleBook.save(
        schedules, queue: queue, origin: origin, existing: existing, now: now)
      if !jobs.isEmpty {
        summary.added = state.enqueue(jobs, queue: queue, now: now).filter(\.inserted).map(\.id)
      }
      for write in writes { state.schedules[ExactText(queue), default: [:]][ExactText(write.name)] = write }
      return summary
    }
  }

  /// The stored schedules; see ``JobStore/schedules(queue:)``.
  public func schedules(queue: String?) async throws -> [StoredSchedule] {
    state.withLock { state in
      state.schedules.filter { entry in queue.map { entry.key == ExactText($0) } ?? true }.values
        .flatMap(\.values)
        .sorted { (ExactText($0.queue), ExactText($0.name)) < (ExactText($1.queue), ExactText($1.name)) }
    }
  }

  /// Pauses or resumes a schedule; see ``JobStore/changeSchedulePause(_:name:queue:clock:)``.
  public func changeSchedulePause(_ paused: Bool, name: String, queue: String, clock: any JobClock)
    async throws -> [JobID]?
  {
    state.withLock { state in
      guard let stored = state.schedules[ExactText(queue)]?[ExactText(name)] else { return nil }
      let now = JobStoreTime.normalizedDown(clock.now())
      let (jobs, after) = stored.pausing(paused, now: now)
      let added = jobs.isEmpty ? [] : state.enqueue(jobs, queue: queue, now: now).filter(\.inserted).map(\.id)
      state.schedules[ExactText(queue)]?[ExactText(name)] = after
      return added
    }
  }

  /// Deletes a schedule; see ``JobStore/removeSchedule(name:queue:)``.
  public func removeSchedule(name: String, queue: String) async throws -> Bool {
    state.withLock { state in state.schedules[ExactText(queue)]?.removeValue(forKey: ExactText(name)) != nil }
  }

  /// Fires due schedules; see ``JobStore/fireDueSchedules(queue:clock:)``.
  public func fireDueSchedules(queue: String, clock: any JobClock) async throws -> ScheduleFiring {
    state.withLock { state in
      let now = JobStoreTime.normalizedDown(clock.now())
      let due = (state.schedules[ExactText(queue)] ?? [:]).values.filter {
        ($0.nextDue ?? .distantFuture) <= now
      }
      var added: [JobID] = []
      for schedule in due.sorted(by: { ExactText($0.name) < ExactText($1.name) }) {
        let (jobs, after) = schedule.firing(now: now)
        added += state.enqueue(jobs, queue: queue, now: now).filter(\.inserted).map(\.id)
        state.schedules[ExactText(queue)]?[ExactText(schedule.name)] = after
      }
      return ScheduleFiring(
        added: added, nextDue: state.schedules[ExactText(queue)]?.values.compactMap(\.nextDue).min())
    }
  }

  /// Names of queues with jobs, a pause flag or limits; see ``JobStore/queueNames()``.
  public func queueNames() async throws -> [String] {
    state.withLock { state in
      state.queues.filter { !$0.value.jobs.isEmpty || $0.value.paused || !$0.value.limits.isEmpty }.keys
        .sorted()
        .map(\.text)
    }
  }
}

extension InMemoryJobStore {
  /// The job with this ID as the store holds it now, read at once (no suspension): for a
  /// simulation's checks, which must see the store between two steps.
  package func peek(_ id: JobID) -> JobRecord? {
    state.withLock { state in state.queues.values.lazy.compactMap { $0.jobs[id]?.record }.first }
  }

  /// The queue's jobs as the store holds them now, in no particular order (see ``peek(_:)``).
  package func peekAll(queue: String) -> [JobRecord] {
    state.withLock { $0.queues[ExactText(queue)]?.jobs.values.map(\.record) ?? [] }
  }

  /// Whether the queue's pause flag is set now (see ``peek(_:)``).
  package func peekPaused(queue: String) -> Bool {
    state.withLock { $0.queues[ExactText(queue)]?.paused ?? false }
  }

  /// Runs `body` on a queue's state in place (no copy of its jobs), under the lock.
  private func withQueue<R>(_ queue: String, _ body: (inout QueueState) -> R) -> R {
    state.withLock { state in body(&state.queues[ExactText(queue), default: QueueState()]) }
  }

  fileprivate struct State: Sendable {
    var nextID: Int64 = 0
    /// By name, compared byte for byte as the databases compare it (see ``ExactText``).
    var queues: [ExactText: QueueState] = [:]
    /// Schedules by queue, then name.
    var schedules: [ExactText: [ExactText: StoredSchedule]] = [:]

    /// Commits `jobs` to `queue` at `now`; see ``JobStore/enqueue(_:queue:clock:)``.
    mutating func enqueue(_ jobs: [NewJob], queue: String, now: Date) -> [EnqueueResult] {
      var results: [EnqueueResult] = []
      results.reserveCapacity(jobs.count)
      for job in jobs {
        if job.hasDeduplicationOptions, let key = job.deduplicationKey,
          let found = queues[ExactText(queue)]?.existing(
            ExactText(key), scope: job.deduplicationScope, now: now)
        {
          guard found.waiting, job.onConflict == .replace else {
            results.append(EnqueueResult(id: found.id, outcome: .existing))
            continue
          }
          queues[ExactText(queue)]?.replace(found.id, with: job, now: now)
          results.append(EnqueueResult(id: found.id, outcome: .replaced))
          continue
        }
        if let key = job.deduplicationKey,
          let existing = queues[ExactText(queue)]?.dedup[ExactText(key)]?.min()
        {
          results.append(EnqueueResult(id: existing, inserted: false))
          continue
        }
        nextID += 1
        let record = JobRecord(
          id: JobID(nextID), queue: queue, payload: job.payload, status: .pending,
          priority: job.priority, attempts: 0, runAt: InMemoryJobStore.runDate(job.runTime, now: now),
          createdAt: now,
          deduplicationKey: job.deduplicationKey,
          timeLimit: job.timeLimitMilliseconds.map { .milliseconds($0) }, orderingKey: job.orderingKey,
          limitKey: job.limitKey, fairnessKey: job.fairnessKey)
        queues[ExactText(queue), default: QueueState()].insertNew(record, now: now)
        results.append(EnqueueResult(id: record.id, inserted: true))
      }
      return results
    }
  }

  /// One heap entry: a pending job's ordering key. Entries go stale when the job changes; they are
  /// checked against the job when popped (lazy deletion).
  fileprivate struct Entry: Sendable {
    var id: JobID
    var priority: Int
    var runAt: Date
    /// The job's place among ready jobs of its priority and run date (``Slot/seq``).
    var seq: Int64
    /// The job's fair-shares turn (``Slot/turn``).
    var turn: Int64?
    /// The job's place in claim order within its priority: its turn, else its run date
    /// (milliseconds since 1970; see ``FairTurns``).
    var place: Int64

    init(id: JobID, priority: Int, runAt: Date, seq: Int64, turn: Int64?) {
      self.id = id
      self.priority = priority
      self.runAt = runAt
      self.seq = seq
      self.turn = turn
      self.place = turn ?? JobStoreTime.milliseconds(runAt)
    }
  }

  /// Orders entries for claiming: priority descending, then place (turn or run date), then
  /// ``Slot/seq``, then ID.
  fileprivate struct ClaimOrder: Comparable, Sendable {
    var entry: Entry
    init(_ entry: Entry) { self.entry = entry }

    static func < (a: ClaimOrder, b: ClaimOrder) -> Bool {
      if a.entry.priority != b.entry.priority { return a.entry.priority > b.entry.priority }
      if a.entry.place != b.entry.place { return a.entry.place < b.entry.place }
      if a.entry.seq != b.entry.seq { return a.entry.seq < b.entry.seq }
      return a.entry.id < b.entry.id
    }

    static func == (a: ClaimOrder, b: ClaimOrder) -> Bool { !(a < b) && !(b < a) }
  }

  /// Orders entries by run date, then ID.
  fileprivate struct RunDateOrder: Comparable, Sendable {
    var entry: Entry
    init(_ entry: Entry) { self.entry = entry }

    static func < (a: RunDateOrder, b: RunDateOrder) -> Bool {
      a.entry.runAt != b.entry.runAt ? a.entry.runAt < b.entry.runAt : a.entry.id < b.entry.id
    }

    static func == (a: RunDateOrder, b: RunDateOrder) -> Bool { !(a < b) && !(b < a) }
  }

  /// When a limit key's rate gives its held jobs their next start (microseconds since 1970).
  fileprivate struct KeyDue: Comparable, Sendable {
    var due: Int64
    var key: ExactText

    static func < (a: KeyDue, b: KeyDue) -> Bool { a.due != b.due ? a.due < b.due : a.key < b.key }
  }

  /// A finished job's place in pruning order: finish date, then ID.
  fileprivate struct FinishOrder: Comparable, Sendable {
    var id: JobID
    var finishedAt: Date

    static func < (a: FinishOrder, b: FinishOrder) -> Bool {
      a.finishedAt != b.finishedAt ? a.finishedAt < b.finishedAt : a.id < b.id
    }
  }

  /// A stored job and whether it is in the ready state (claimable whatever the clock says now),
  /// as SQLite keeps it: a waiting job is ready when it was committed, retried or given back with
  /// a run date that had come, or when a claim promoted it.
  fileprivate struct Slot: Sendable {
    var record: JobRecord
    var ready: Bool
    /// The job's place among ready jobs of its priority and run date, as SQLite keeps it: 0 for
    /// a job added, scheduled or re-queued; a job retried straight into the ready state takes a
    /// place behind every job then ready (``QueueState/lastRetrySeq``); a release or rescue keeps
    /// it.
    var seq: Int64 = 0
    /// The job's fair-shares turn while it is ready with a fairness key (``FairTurns``): taken when
    /// it became ready, kept while a limit holds it or a lapsed lease hands it out again.
    var turn: Int64? = nil
  }

  fileprivate struct QueueState: Sendable {
    /// Every job of the queue, by ID.
    var jobs = JobTable<Slot>()
    var paused = false
    var limits = QueueLimits()
    /// The rate limit's stored time (GCRA's theoretical arrival time, microseconds since 1970),
    /// or nil when no claim took a start yet.
    var rateTime: Int64?
    /// Pending jobs in claim order: priority descending, place, ID.
    var ready = Heap<ClaimOrder>()
    /// The entries of ``ready`` and ``parked`` by priority, kept once the queue had a job with a
    /// fairness key, for the first waiting job of a priority (``head(_:)``); nil before.
    var readyByPriority: [Int: Heap<ClaimOrder>]?
    /// How many entries ``readyByPriority`` holds, stale ones included.
    var readyByPriorityCount = 0
    /// Each fairness key's latest turn at each priority (``FairTurns/previous``).
    var fairPrevious: [FairTurns.Key: Int64] = [:]
    /// The latest turn any key took at each priority (``FairTurns/latest``).
    var fairLatest: [Int: Int64] = [:]
    /// Pending jobs not yet ready, by run date.
    var scheduled = Heap<RunDateOrder>()
    var running: Set<JobID> = []
    /// Waiting jobs by deduplication key (usually one; a retried job can wait beside a newer one).
    var dedup: [ExactText: Set<JobID>] = [:]
    /// Every stored job with a deduplication key, whatever its status, by key: the wider
    /// ``DeduplicationScope``s look for running and completed ones here.
    var keyed: [ExactText: Set<JobID>] = [:]
    /// Each finished status's jobs by finish date, for pruning (entries of jobs since deleted or
    /// re-queued are skipped when met).
    var finished: [JobStatus: Heap<FinishOrder>] = [:]
    /// The place last given to a job retried straight into the ready state (``Slot/seq``): each
    /// such retry takes the next, so it goes behind every ready job of its run date.
    var lastRetrySeq: Int64 = 0
    /// By ordering key, the jobs of the key that are waiting (held or not), running or dead,
    /// in ID order: only the first may be other than held.
    var lines: [ExactText: OrderLine] = [:]
    /// By limit key, how many of the key's jobs run (lapsed leases not yet rescued among them).
    var runningByKey: [ExactText: Int] = [:]
    /// By limit key, the jobs a claim held because the key was at its limit, in claim order
    /// (entries of jobs since changed are skipped when met, as in ``ready``).
    var parked: [ExactText: Heap<ClaimOrder>] = [:]
    /// By limit key with a rate, its bucket's stored time (GCRA's, microseconds since 1970); a key
    /// without one has a full bucket.
    var keyBuckets: [ExactText: Int64] = [:]
    /// ``keyBuckets``'s size at which the next claim drops the full buckets.
    var keyBucketsPruneAt = 1_024
    /// By limit key whose rate held jobs, when its bucket gives the next start, and the claim's
    /// time when it noted it: the first claim from `due`, or with its clock before `setAt` (stepped
    /// back since), makes held jobs of the key claimable, as many as the bucket gives.
    var keyDue: [ExactText: (due: Int64, setAt: Int64)] = [:]
    /// ``keyDue`` by time (entries no longer in ``keyDue`` are skipped when met).
    var dueKeys = Heap<KeyDue>()
    /// No ``keyDue`` entry was noted later than this (the latest noted, or later).
    var latestDueSet = Int64.min

    /// The most keys whose held jobs one claim makes claimable (`QueueLimits` documents it).
    static let maximumKeysReleased = 1_000

    /// Forgets every key's bucket and due time (no rate per key is set).
    mutating func clearKeyBuckets() {
      keyBuckets = [:]
      keyDue = [:]
      dueKeys = Heap()
      latestDueSet = .min
    }

    /// The rate of `key` held a job at `now`: its held jobs may be claimable again at `due`.
    mutating func setDue(_ key: ExactText, _ due: Int64, now: Int64) {
      if let known = keyDue[key], known.due <= due, known.setAt <= now { return }
      keyDue[key] = (due, now)
      latestDueSet = max(latestDueSet, now)
      dueKeys.push(KeyDue(due: due, key: key))
    }

    /// The earliest time a key's rate gives its held jobs a start, if any key's rate holds jobs:
    /// `now` when a due time was noted by a later clock (the clock stepped back since).
    mutating func earliestDue(now: Int64) -> Int64? {
      while let top = dueKeys.peek, keyDue[top.key]?.due != top.due { dueKeys.pop() }
      guard let earliest = dueKeys.peek?.due else { return nil }
      if now < latestDueSet, keyDue.values.contains(where: { $0.setAt > now }) { return now }
      return earliest
    }

    /// Makes claimable the jobs held by keys whose rate gives starts again by `now`
    /// (microseconds), or whose due time a later clock noted: as many of each key's as its bucket
    /// gives (at least one; a claim holds again any still over a limit). A key with more held is
    /// due again when its bucket gives the start after those. At most ``maximumKeysReleased`` keys
    /// a call (a key left is still due).
    mutating func releaseDueKeys(now: Int64) {
      var due: [ExactText] = []
      var noted = Set<ExactText>()
      while due.count < Self.maximumKeysReleased, let top = dueKeys.peek, top.due <= now {
        dueKeys.pop()
        if keyDue[top.key]?.due == top.due, noted.insert(top.key).inserted { due.append(top.key) }
      }
      if now < latestDueSet {
        // The clock stepped back since some due times were noted: those are due now.
        for (key, entry) in keyDue where entry.setAt > now && !noted.contains(key) {
          if due.count == Self.maximumKeysReleased { break }
          due.append(key)
          noted.insert(key)
        }
        latestDueSet = keyDue.filter { !noted.contains($0.key) }.values.map(\.setAt).max() ?? .min
      }
      for key in due {
        keyDue[key] = nil
        let rate = limits.rate(forKey: key.text)
        let starts =
          rate.map { max(1, $0.take(RateLimit.maximumBurst, tat: keyBuckets[key], now: now).starts) } ?? 1
        for _ in 0..<starts {
          guard parked[key] != nil else { break }
          unpark(key)
        }
        if parked[key] != nil, let rate {
          setDue(key, max(now + 1, rate.take(starts, tat: keyBuckets[key], now: now).next), now: now)
        }
      }
      if keyBuckets.count >= keyBucketsPruneAt {
        // Full for a day: a claim whose clock is ahead of the others' drops no bucket that still
        // binds them.
        keyBuckets = keyBuckets.filter { $0.value > now - 86_400_000_000 || keyDue[$0.key] != nil }
        keyBucketsPruneAt = max(1_024, keyBuckets.count * 2)
      }
    }

    /// The job `id` started running.
    mutating func startRunning(_ id: JobID, limitKey: String?) {
      running.insert(id)
      if let limitKey { runningByKey[ExactText(limitKey), default: 0] += 1 }
    }

    /// The job `id` (still stored) stopped running, whatever it became: a job of its limit key
    /// that a claim held for the key's limit may be claimed again.
    mutating func stopRunning(_ id: JobID) {
      guard running.remove(id) != nil, let limitKey = jobs[id]?.record.limitKey else { return }
      let key = ExactText(limitKey)
      let left = (runningByKey[key] ?? 1) - 1
      runningByKey[key] = left > 0 ? left : nil
      unpark(key)
    }

    /// A waiting job that was claimable (not held) leaves that state other than by a claim
    /// (cancelled, removed, replaced): the job its key's last stop made claimable may be this one,
    /// and the key's held jobs would wait for a stop that never comes, so the first is claimable
    /// again (the next claim holds it again if its key is still at its limit).
    /// Only a ready job counts (`ready`: the slot's mark), as SQLite's trigger fires only for one
    /// that was `ready`: a scheduled job cannot be the one a stop made claimable.
    mutating func leftClaimable(_ record: JobRecord, ready: Bool) {
      guard ready, record.status == .pending, !record.isHeld, let key = record.limitKey else { return }
      unpark(ExactText(key))
    }

    /// Makes the first job held for the limit of `key` that is still held so claimable again.
    mutating func unpark(_ key: ExactText) {
      while let entry = parked[key]?.pop()?.entry {
        let unparked =
          jobs.update(entry.id) { slot -> Bool in
            guard Self.isCurrent(entry, slot), slot.record.isHeldByLimit else { return false }
            slot.record.isHeld = false
            slot.record.isHeldByLimit = false
            slot.ready = true
            return true
          } ?? false
        if parked[key]?.peek == nil { parked[key] = nil }
        if unparked {
          pushReady(entry)
          return
        }
      }
    }

    /// Makes every job held for its key's limit claimable again (the limits changed).
    mutating func unparkAll() {
      for key in Array(parked.keys) {
        while parked[key] != nil { unpark(key) }
      }
    }

    /// Whether `slot` holds the job of `entry` as the entry saw it: waiting, with the entry's run
    /// date and priority.
    static func isCurrent(_ entry: Entry, _ slot: Slot) -> Bool {
      slot.record.status == .pending && slot.record.runAt == entry.runAt
        && slot.record.priority == entry.priority && slot.seq == entry.seq && slot.turn == entry.turn
    }

    /// Adds a ready entry to the claim heap (and to ``readyByPriority`` when kept).
    mutating func pushReady(_ entry: Entry) {
      ready.push(ClaimOrder(entry))
      guard readyByPriority != nil else { return }
      readyByPriority![entry.priority, default: Heap()].push(ClaimOrder(entry))
      readyByPriorityCount += 1
      // Claims leave their entries here; rebuilt from the live ones when they outnumber them.
      if readyByPriorityCount > 2 * ready.count + 1_024 { buildReadyByPriority() }
    }

    /// Builds ``readyByPriority`` from the current ready entries.
    mutating func buildReadyByPriority() {
      var byPriority: [Int: Heap<ClaimOrder>] = [:]
      var count = 0
      let waiting = ready.elements + parked.values.flatMap(\.elements)
      for order in waiting where waitsInPlace(order.entry) == true {
        byPriority[order.entry.priority, default: Heap()].push(order)
        count += 1
      }
      readyByPriority = byPriority
      readyByPriorityCount = count
    }

    /// The place of the first job of `priority` that is ready or held by its limit key
    /// (``FairTurns``), nil when there is none.
    mutating func head(_ priority: Int) -> Int64? {
      if readyByPriority == nil { buildReadyByPriority() }
      while let top = readyByPriority?[priority]?.peek {
        if waitsInPlace(top.entry) == true { return top.entry.place }
        readyByPriority![priority]!.pop()
        readyByPriorityCount -= 1
      }
      return nil
    }

    /// The turn `record` takes as it becomes ready (``FairTurns``), nil without a fairness key.
    mutating func takeTurn(_ record: JobRecord) -> Int64? {
      guard let key = record.fairnessKey else { return nil }
      let priority = record.priority
      let exact = FairTurns.Key(priority: priority, key: key)
      var turns = FairTurns(
        heads: head(priority).map { [priority: $0] } ?? [:],
        latest: fairLatest[priority].map { [priority: $0] } ?? [:],
        previous: fairPrevious[exact].map { [exact: $0] } ?? [:])
      let turn = turns.take(key: key, priority: priority, runAt: JobStoreTime.milliseconds(record.runAt))
      fairPrevious[exact] = turn
      fairLatest[priority] = turns.latest[priority]
      return turn
    }

    /// Whether the job of `entry` still waits in its place under it: current
    /// (``isCurrent(_:_:)``) and ready or held by its limit key. Nil when the entry is stale.
    mutating func waitsInPlace(_ entry: Entry) -> Bool? {
      jobs.update(entry.id) { slot in
        Self.isCurrent(entry, slot) ? slot.ready || slot.record.isHeldByLimit : nil
      } ?? nil
    }

    /// Whether the job of `entry` is still ready under it: current (``isCurrent(_:_:)``) and marked
    /// ready. Nil when the entry is stale.
    mutating func readiness(of entry: Entry) -> Bool? {
      jobs.update(entry.id) { slot in Self.isCurrent(entry, slot) ? slot.ready : nil } ?? nil
    }

    /// Whether `claim` is the job's current claim: running under the same token.
    mutating func isCurrent(_ claim: ClaimReference) -> Bool {
      jobs.update(claim.id) { Self.isCurrent(claim, $0) } ?? false
    }

    static func isCurrent(_ claim: ClaimReference, _ slot: Slot) -> Bool {
      slot.record.status == .running && slot.record.claimToken == claim.token
    }

    /// Stores a new job: held when its ordering key's line holds an earlier job.
    mutating func insertNew(_ record: JobRecord, now: Date) {
      var record = record
      if let key = record.orderingKey.map(ExactText.init) {
        record.isHeld = !(lines[key]?.isEmpty ?? true)
        lines[key, default: OrderLine()].append(record.id)
      }
      let isReady = record.runAt <= now
      insertWaiting(record, ready: isReady, turn: isReady && !record.isHeld ? takeTurn(record) : nil)
    }

    /// Stores a waiting job; a held one (``JobRecord/isHeld``) goes in no claim heap. `turn`: its
    /// fair-shares turn when it is ready (``Slot/turn``).
    mutating func insertWaiting(_ record: JobRecord, ready isReady: Bool, seq: Int64 = 0, turn: Int64? = nil)
    {
      let turn = isReady && !record.isHeld ? turn : nil
      jobs[record.id] = Slot(record: record, ready: isReady && !record.isHeld, seq: seq, turn: turn)
      if let key = record.deduplicationKey {
        dedup[ExactText(key), default: []].insert(record.id)
        keyed[ExactText(key), default: []].insert(record.id)
      }
      if record.isHeld { return }
      let entry = Entry(id: record.id, priority: record.priority, runAt: record.runAt, seq: seq, turn: turn)
      if isReady {
        pushReady(entry)
      } else {
        scheduled.push(RunDateOrder(entry))
      }
    }

    /// Moves scheduled entries whose date has come into the ready heap; jobs with a fairness key
    /// take their turns then, in ID order (the order SQLite's promotion gives its triggers).
    mutating func promote(now: Date) {
      var due: [Entry] = []
      while let top = scheduled.peek?.entry, top.runAt <= now {
        scheduled.pop()
        guard let slot = jobs[top.id], Self.isCurrent(top, slot), !slot.ready else { continue }
        due.append(top)
      }
      if due.count > 1 { due.sort { $0.id < $1.id } }
      for entry in due {
        // An entry pushed twice for one job (scheduled again in between) is promoted once.
        guard let slot = jobs[entry.id], Self.isCurrent(entry, slot), !slot.ready else { continue }
        let turn = takeTurn(slot.record)
        jobs.update(entry.id) { slot in
          slot.ready = true
          slot.turn = turn
        }
        pushReady(
          Entry(id: entry.id, priority: entry.priority, runAt: entry.runAt, seq: entry.seq, turn: turn))
      }
    }

    /// Claims up to `limit` ready jobs; `now` is the stored dates' millisecond, `micros` the
    /// clock to the microsecond (for the rates of limit keys).
    mutating func claim(limit: Int, owner: String, expiry: Date, now: Date, micros: Int64) -> [JobRecord] {
      promote(now: now)
      if !keyDue.isEmpty { releaseDueKeys(now: micros) }
      var claimed: [JobRecord] = []
      while claimed.count < limit, let entry = ready.pop()?.entry {
        // The entry is current (see `isCurrent(_:_:)`) and the job ready: claimed in place, or
        // held when its limit key is at its limit or its rate gives no start.
        var parkedKey: ExactText?
        // Whether the job's limit key is at its limit (read before the update, which holds `jobs`);
        // when it is not and the key has a rate, the bucket's time after this start, or when the
        // rate gives none, its next start.
        var full = false
        var bucket: (tat: Int64?, next: Int64?)
        if let key = jobs[entry.id]?.record.limitKey {
          let exact = ExactText(key)
          full = limits.concurrency(forKey: key).map { runningByKey[exact, default: 0] >= $0 } ?? false
          if !full, let rate = limits.rate(forKey: key) {
            let taken = rate.take(1, tat: keyBuckets[exact], now: micros)
            full = taken.starts == 0
            bucket = full ? (taken.mustStore ? taken.tat : nil, taken.next) : (taken.tat, nil)
          }
        }
        let record = jobs.update(entry.id) { slot -> JobRecord? in
          guard Self.isCurrent(entry, slot), slot.ready else { return nil }
          if full, let limitKey = slot.record.limitKey {
            slot.ready = false
            slot.record.isHeld = true
            slot.record.isHeldByLimit = true
            parkedKey = ExactText(limitKey)
            return nil
          }
          slot.ready = false
          slot.record.status = .running
          slot.record.attempts = slot.record.attempts == Int.max ? Int.max : slot.record.attempts + 1
          slot.record.claimToken &+= 1
          slot.record.leaseOwner = owner
          slot.record.leaseExpiresAt = expiry
          return slot.record
        }
        if let parkedKey {
          parked[parkedKey, default: Heap()].push(ClaimOrder(entry))
          if let tat = bucket.tat { keyBuckets[parkedKey] = tat }
          if let next = bucket.next { setDue(parkedKey, next, now: micros) }
        }
        guard let record = record ?? nil else { continue }
        if let tat = bucket.tat, let key = record.limitKey { keyBuckets[ExactText(key)] = tat }
        if let key = record.deduplicationKey { dropDeduplication(key, entry.id) }
        claimed.append(record)
        startRunning(entry.id, limitKey: record.limitKey)
      }
      return claimed
    }

    /// Applies a settlement if its claim is current; returns whether it applied.
    mutating func settle(_ settlement: JobSettlement, now: Date) -> Bool {
      if case .complete = settlement.action {
        // Completed in place: a running job holds no waiting state (ready mark, deduplication
        // key) to drop.
        let keeps = settlement.keepsHistory
        let completed = jobs.update(settlement.id) { slot -> Bool in
          guard Self.isCurrent(settlement.claim, slot) else { return false }
          guard keeps else { return true }
          slot.record.status = .completed
          slot.record.finishedAt = now
          slot.record.leaseOwner = nil
          slot.record.leaseExpiresAt = nil
          if let ran = settlement.runDuration { slot.record.runDuration = ran }
          if let output = settlement.output { slot.record.output = output }
          return true
        }
        guard completed == true else { return false }
        stopRunning(settlement.id)
        let key = jobs[settlement.id]?.record.orderingKey
        if keeps {
          finished[.completed, default: Heap()].push(FinishOrder(id: settlement.id, finishedAt: now))
        } else if let removed = jobs.removeValue(for: settlement.id) {
          forgetKey(of: removed.record)
        }
        if let key { leaveLine(settlement.id, key: key) }
        return true
      }
      guard let slot = jobs[settlement.id], Self.isCurrent(settlement.claim, slot) else { return false }
      let record = slot.record
      switch settlement.action {
      case .complete:
        if settlement.keepsHistory {
          finish(
            record.id, as: .completed, now: now, runDuration: settlement.runDuration,
            output: settlement.output)
        } else {
          delete(record.id)
        }
      case .retry(let delay, let error):
        let runAt = JobStoreTime.date(now, adding: delay)
        let ready = runAt <= now
        if ready { lastRetrySeq += 1 }
        jobs[record.id]?.record.errors = JobHistory.appending(error, to: record.errors)
        if let ran = settlement.runDuration { jobs[record.id]?.record.runDuration = ran }
        makeWaiting(
          record.id, runAt: runAt, error: error.map(JobHistory.bounded) ?? record.lastError, ready: ready,
          seq: ready ? lastRetrySeq : 0, turn: .take)
      case .kill(let error):
        if settlement.keepsHistory {
          finish(record.id, as: .dead, now: now, error: error, runDuration: settlement.runDuration)
          // The dead job leaves its key (``DeadHeadPolicy/releasesKey``): the next job may run.
          if settlement.releasesOrderingKey, let key = record.orderingKey {
            jobs[record.id]?.record.orderingKey = nil
            leaveLine(record.id, key: key)
          }
        } else {
          delete(record.id)
        }
      case .release(let error):
        jobs[record.id]?.record.attempts = max(0, record.attempts - 1)
        makeWaiting(
          record.id, runAt: record.runAt, error: error.map(JobHistory.bounded) ?? record.lastError,
          ready: true,
          seq: slot.seq, turn: .keep(slot.turn))
      }
      return true
    }

    /// Makes a waiting or running job finished with `status` (its deduplication key and lease
    /// released), noting it for pruning.
    mutating func finish(
      _ id: JobID, as status: JobStatus, now: Date, error: String? = nil, runDuration: Duration? = nil,
      output: Data? = nil
    ) {
      guard var record = jobs[id]?.record else { return }
      let wasReady = jobs[id]?.ready ?? false
      if record.status == .pending { stopWaiting(record) }
      stopRunning(id)
      leftClaimable(record, ready: wasReady)
      record.status = status
      record.finishedAt = now
      if let error {
        // Bounded as the databases keep it.
        record.lastError = JobHistory.bounded(error)
        record.errors = JobHistory.appending(error, to: record.errors)
      }
      if let runDuration { record.runDuration = runDuration }
      if let output { record.output = output }
      record.leaseOwner = nil
      record.leaseExpiresAt = nil
      record.isHeld = false
      record.isHeldByLimit = false
      jobs[id] = Slot(record: record, ready: false, seq: 0)
      finished[status, default: Heap()].push(FinishOrder(id: id, finishedAt: now))
      // A dead job keeps its place at the head of its key's line: it blocks the key.
      if status != .dead, let key = record.orderingKey { leaveLine(id, key: key) }
    }

    /// Deletes up to `limit` jobs with `status` that finished before `cutoff` (nil: any), oldest
    /// first.
    mutating func prune(_ status: JobStatus, finishedBefore cutoff: Date?, limit: Int) -> Int {
      var doomed: [JobID] = []
      // A job that finished twice at the same time (re-queued in between) has two entries.
      var seen: Set<JobID> = []
      while doomed.count < limit, let top = finished[status]?.peek {
        if let cutoff, top.finishedAt >= cutoff { break }
        finished[status]?.pop()
        // Entries go stale when a job is deleted or re-queued (lazy deletion).
        guard let record = jobs[top.id]?.record, record.status == status, record.finishedAt == top.finishedAt
        else { continue }
        if seen.insert(top.id).inserted { doomed.append(top.id) }
      }
      for id in doomed { delete(id) }
      return doomed.count
    }

    /// A fair-shares turn for a job that waits again: its own (a release or rescue keeps its
    /// place) or a new one if it is ready.
    enum TurnChoice {
      case keep(Int64?)
      case take
    }

    mutating func makeWaiting(
      _ id: JobID, runAt: Date, error: String?, ready isReady: Bool, seq: Int64, turn choice: TurnChoice
    ) {
      guard var record = jobs[id]?.record else { return }
      // The turn first, then the job's limit key lets its next held job go (as SQLite's triggers
      // fire: the newest, the turn's, first).
      var turn: Int64? = nil
      switch choice {
      case .keep(let kept): turn = kept
      case .take:
        if isReady, record.orderingKey == nil {
          var becoming = record
          becoming.runAt = runAt
          turn = takeTurn(becoming)
        }
      }
      stopRunning(id)
      record.status = .pending
      record.finishedAt = nil
      record.runAt = runAt
      record.lastError = error
      record.leaseOwner = nil
      record.leaseExpiresAt = nil
      // A job that waits again (retried, released, rescued, re-queued) is held unless it heads
      // its key's line.
      record.isHeld = record.orderingKey.map { lines[ExactText($0)]?.first != id } ?? false
      record.isHeldByLimit = false
      insertWaiting(record, ready: isReady, seq: seq, turn: turn)
    }

    /// The oldest job of `key` within `scope` at `now`, and whether it waits: a waiting one
    /// first, else (for the wider scopes) a running one or one completed within the period.
    func existing(_ key: ExactText, scope: DeduplicationScope, now: Date) -> (id: JobID, waiting: Bool)? {
      if let waiting = dedup[key]?.min() { return (waiting, true) }
      guard scope.includesRunning, let ids = keyed[key] else { return nil }
      let since = scope.completedSince(now: JobStoreTime.milliseconds(now)).map {
        JobStoreTime.date(milliseconds: $0)
      }
      let found = ids.filter { id in
        guard let record = jobs[id]?.record else { return false }
        if record.status == .running { return true }
        guard let since, record.status == .completed, let finished = record.finishedAt else { return false }
        return finished >= since
      }
      return found.min().map { ($0, false) }
    }

    /// Gives the waiting job `id` the payload, priority, run time and time limit of `job`,
    /// keeping its place among jobs of the same priority and run date.
    mutating func replace(_ id: JobID, with job: NewJob, now: Date) {
      guard let slot = jobs[id], slot.record.status == .pending else { return }
      var record = slot.record
      // A job held for its key's limit is claimable again (its held entry no longer matches it):
      // the next claim holds it again if the key is still at its limit.
      if record.isHeldByLimit {
        record.isHeld = false
        record.isHeldByLimit = false
      }
      record.payload = job.payload
      record.priority = job.priority
      record.runAt = InMemoryJobStore.runDate(job.runTime, now: now)
      record.timeLimit = job.timeLimitMilliseconds.map { .milliseconds($0) }
      // Neither ready nor held while it takes a new turn: it is not the head of its priority.
      jobs.update(id) {
        $0.ready = false
        $0.record.isHeldByLimit = false
      }
      let isReady = record.runAt <= now
      // The turn first, then the job's limit key lets its next held job go (see `makeWaiting`).
      let turn = isReady && !record.isHeld ? takeTurn(record) : nil
      leftClaimable(slot.record, ready: slot.ready)
      // The old heap entries no longer match the record (``isCurrent(_:_:)``): they are skipped.
      insertWaiting(record, ready: isReady, seq: slot.seq, turn: turn)
    }

    /// Forgets a deleted job's key.
    mutating func forgetKey(of record: JobRecord) {
      guard let key = record.deduplicationKey.map(ExactText.init) else { return }
      keyed[key]?.remove(record.id)
      if keyed[key]?.isEmpty == true { keyed[key] = nil }
    }

    /// Drops a waiting job's hold on its deduplication key (it is going away).
    mutating func stopWaiting(_ record: JobRecord) {
      guard let key = record.deduplicationKey else { return }
      dropDeduplication(key, record.id)
    }

    mutating func dropDeduplication(_ key: String, _ id: JobID) {
      let key = ExactText(key)
      dedup[key]?.remove(id)
      if dedup[key]?.isEmpty == true { dedup[key] = nil }
    }

    @discardableResult
    mutating func delete(_ id: JobID) -> Bool {
      guard let record = jobs[id]?.record else { return false }
      let wasReady = jobs[id]?.ready ?? false
      if record.status == .pending { stopWaiting(record) }
      forgetKey(of: record)
      stopRunning(id)
      jobs[id] = nil
      leftClaimable(record, ready: wasReady)
      if let key = record.orderingKey { leaveLine(id, key: key) }
      return true
    }

    /// Takes a finished or deleted job out of its ordering key's line; the next job, if held,
    /// becomes scheduled (the next claim makes it ready once due).
    mutating func leaveLine(_ id: JobID, key: String) {
      let key = ExactText(key)
      lines[key]?.remove(id)
      guard let next = lines[key]?.first else {
        lines[key] = nil
        return
      }
      // A head held by its limit key's limit stays so: its key's next stop makes it claimable.
      guard var record = jobs[next]?.record, record.status == .pending, record.isHeld, !record.isHeldByLimit
      else { return }
      record.isHeld = false
      // Ready when it was due when added, so a clock stepped back since does not delay it.
      insertWaiting(record, ready: record.runAt <= record.createdAt, seq: 0)
    }

    /// A ready job is due now, whatever its date says (the wall clock may have stepped back).
    /// `now` is the clock's reading as it is (the rate's next start is to the microsecond).
    mutating func nextWake(now wall: Date) -> WakeHint {
      let now = JobStoreTime.normalized(wall)
      while let top = ready.peek?.entry, readiness(of: top) != true { ready.pop() }
      while let top = scheduled.peek?.entry, readiness(of: top) != false { scheduled.pop() }
      let leaseExpiry = running.compactMap { jobs[$0]?.record.leaseExpiresAt }.min()
      // A queue whose running jobs fill its concurrency limit needs no worker for its waiting ones.
      let full = limits.claimable(1, running: running.count) == 0
      // A key whose rate holds jobs needs a worker when its bucket gives its next start.
      let due = earliestDue(now: RateLimit.microseconds(wall)).map(RateLimit.date)
      var nextRun =
        full
        ? nil
        : [ready.peek.map { min($0.entry.runAt, now) }, scheduled.peek?.entry.runAt, due].compactMap { $0 }
          .min()
      // No waiting job needs a worker before the rate limit gives its next start.
      if let run = nextRun, let rate = limits.rate,
        let start = rate.nextStart(tat: rateTime, now: RateLimit.microseconds(wall))
      {
        nextRun = max(run, RateLimit.date(start))
      }
      return WakeHint(nextRun: nextRun, nextLeaseExpiry: leaseExpiry)
    }
  }
}

/// The jobs of one ordering key that are waiting, running or dead, in ID order (see
/// `InMemoryJobStore.QueueState.lines`). New IDs are appended (they only grow) and the first
/// usually leaves first, so both are O(1); another job leaves in O(n).
struct OrderLine: Sendable {
  private var ids: [JobID] = []
  private var start = 0

  var isEmpty: Bool { start == ids.count }
  var first: JobID? { isEmpty ? nil : ids[start] }

  /// Adds a job; its ID is greater than every ID in the line.
  mutating func append(_ id: JobID) { ids.append(id) }

  mutating func remove(_ id: JobID) {
    if first == id {
      start += 1
      if start == ids.count {
        ids.removeAll(keepingCapacity: true)
        start = 0
      } else if start >= 64 && start * 2 >= ids.count {
        ids.removeFirst(start)
        start = 0
      }
      return
    }
    var low = start
    var high = ids.count
    while low < high {
      let middle = (low + high) / 2
      if ids[middle] < id { low = middle + 1 } else { high = middle }
    }
    if low < ids.count, ids[low] == id { ids.remove(at: low) }
  }
}
