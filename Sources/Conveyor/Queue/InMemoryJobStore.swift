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

  /// Commits new jobs; see ``JobStore/enqueue(_:queue:now:)``.
  public func enqueue(_ jobs: [NewJob], queue: String, now: Date) async throws -> [EnqueueResult] {
    state.withLock { state in
      var results: [EnqueueResult] = []
      results.reserveCapacity(jobs.count)
      for job in jobs {
        if let key = job.deduplicationKey, let existing = state.queues[queue]?.dedup[key] {
          results.append(EnqueueResult(id: existing, inserted: false))
          continue
        }
        state.nextID += 1
        let record = JobRecord(
          id: JobID(state.nextID), queue: queue, payload: job.payload, status: .pending,
          priority: job.priority, attempts: 0, runAt: job.runAt, createdAt: now,
          deduplicationKey: job.deduplicationKey)
        state.queues[queue, default: QueueState()].insertPending(record)
        results.append(EnqueueResult(id: record.id, inserted: true))
      }
      return results
    }
  }

  /// Settles and claims; see ``JobStore/settleAndClaim(_:queue:limit:lease:now:)``.
  public func settleAndClaim(
    _ settlements: [JobSettlement], queue: String, limit: Int, lease: Lease, now: Date
  ) async throws -> ClaimBatch {
    withQueue(queue) { queueState in
      var stale: [JobID] = []
      for settlement in settlements where !queueState.settle(settlement, now: now) {
        stale.append(settlement.id)
      }
      var claimed: [JobRecord] = []
      if !queueState.paused && limit > 0 {
        claimed = queueState.claim(limit: limit, lease: lease, now: now)
      }
      return ClaimBatch(claimed: claimed, staleSettlements: stale, paused: queueState.paused)
    }
  }

  /// Extends leases; see ``JobStore/heartbeat(_:queue:lease:)``.
  public func heartbeat(_ ids: [JobID], queue: String, lease: Lease) async throws -> [JobID] {
    state.withLock { state in
      var held: [JobID] = []
      for id in ids {
        guard var record = state.queues[queue]?.jobs[id], record.status == .running,
          record.leaseOwner == lease.owner
        else { continue }
        record.leaseExpiresAt = lease.expiresAt
        state.queues[queue]?.jobs[id] = record
        held.append(id)
      }
      return held
    }
  }

  /// Returns expired leases to pending; see ``JobStore/rescueExpiredLeases(queue:now:)``.
  public func rescueExpiredLeases(queue: String, now: Date) async throws -> Int {
    withQueue(queue) { queueState in
      let expired = queueState.running.filter { id in
        guard let expiry = queueState.jobs[id]?.leaseExpiresAt else { return false }
        return expiry < now
      }
      for id in expired { queueState.makePending(id, runAt: now, error: queueState.jobs[id]?.lastError) }
      return expired.count
    }
  }

  /// Counts jobs by status; see ``JobStore/counts(queue:now:)``.
  public func counts(queue: String, now: Date) async throws -> JobCounts {
    state.withLock { state in
      var counts = JobCounts()
      guard let jobs = state.queues[queue]?.jobs else { return counts }
      for record in jobs.values {
        switch record.status {
        case .pending where record.runAt <= now: counts.ready += 1
        case .pending: counts.scheduled += 1
        case .running: counts.running += 1
        case .dead: counts.dead += 1
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
      let all = state.queues[queue]?.jobs.values.filter { record in
        (status == nil || record.status == status) && (after.map { record.id > $0 } ?? true)
      }
      return Array((all ?? []).sorted { $0.id < $1.id }.prefix(max(0, limit)))
    }
  }

  /// Deletes jobs; see ``JobStore/remove(_:queue:)``.
  public func remove(_ ids: [JobID], queue: String) async throws -> Int {
    state.withLock { state in
      var removed = 0
      for id in Set(ids) where state.queues[queue]?.delete(id) == true { removed += 1 }
      return removed
    }
  }

  /// Deletes jobs by status; see ``JobStore/clear(queue:statuses:)``.
  public func clear(queue: String, statuses: Set<JobStatus>) async throws -> Int {
    withQueue(queue) { queueState in
      let doomed = queueState.jobs.values.filter { statuses.contains($0.status) }.map(\.id)
      for id in doomed { queueState.delete(id) }
      return doomed.count
    }
  }

  /// Re-queues dead jobs; see ``JobStore/requeueDead(_:queue:now:)``.
  public func requeueDead(_ ids: [JobID]?, queue: String, now: Date) async throws -> Int {
    withQueue(queue) { queueState in
      // Oldest first, so of dead jobs sharing a deduplication key the oldest is the one re-queued.
      let candidates = (ids.map { Array(Set($0)) } ?? Array(queueState.jobs.keys)).sorted()
      var count = 0
      for id in candidates {
        guard let record = queueState.jobs[id], record.status == .dead else { continue }
        if let key = record.deduplicationKey, queueState.dedup[key] != nil { continue }
        queueState.jobs[id]?.attempts = 0
        queueState.makePending(id, runAt: now, error: queueState.jobs[id]?.lastError)
        count += 1
      }
      return count
    }
  }

  /// Stores the pause flag; see ``JobStore/setPaused(_:queue:)``.
  public func setPaused(_ paused: Bool, queue: String) async throws {
    state.withLock { $0.queues[queue, default: QueueState()].paused = paused }
  }

  /// Reads the pause flag; see ``JobStore/isPaused(queue:)``.
  public func isPaused(queue: String) async throws -> Bool {
    state.withLock { $0.queues[queue]?.paused ?? false }
  }

  /// The next date a worker is needed; see ``JobStore/nextWakeDate(queue:)``.
  public func nextWakeDate(queue: String) async throws -> Date? {
    withQueue(queue) { $0.nextWakeDate() }
  }

  /// Names of queues with jobs or a pause flag; see ``JobStore/queueNames()``.
  public func queueNames() async throws -> [String] {
    state.withLock { state in
      state.queues.filter { !$0.value.jobs.isEmpty || $0.value.paused }.keys.sorted()
    }
  }
}

extension InMemoryJobStore {
  /// Runs `body` on a queue's state in place (no copy of its jobs), under the lock.
  private func withQueue<R>(_ queue: String, _ body: (inout QueueState) -> R) -> R {
    state.withLock { state in body(&state.queues[queue, default: QueueState()]) }
  }

  fileprivate struct State: Sendable {
    var nextID: Int64 = 0
    var queues: [String: QueueState] = [:]
  }

  /// One heap entry: a pending job's ordering key. Entries go stale when the job changes; they are
  /// checked against the job when popped (lazy deletion).
  fileprivate struct Entry: Sendable {
    var id: JobID
    var priority: Int
    var runAt: Date
  }

  /// Orders entries for claiming: priority descending, then run date, then ID.
  fileprivate struct ClaimOrder: Comparable, Sendable {
    var entry: Entry
    init(_ entry: Entry) { self.entry = entry }

    static func < (a: ClaimOrder, b: ClaimOrder) -> Bool {
      if a.entry.priority != b.entry.priority { return a.entry.priority > b.entry.priority }
      if a.entry.runAt != b.entry.runAt { return a.entry.runAt < b.entry.runAt }
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

  fileprivate struct QueueState: Sendable {
    var jobs: [JobID: JobRecord] = [:]
    var paused = false
    /// Pending jobs in claim order: priority descending, run date, ID.
    var ready = Heap<ClaimOrder>()
    /// Pending jobs not yet ready, by run date.
    var scheduled = Heap<RunDateOrder>()
    var running: Set<JobID> = []
    var dedup: [String: JobID] = [:]

    func isCurrent(_ entry: Entry) -> Bool {
      guard let record = jobs[entry.id] else { return false }
      return record.status == .pending && record.runAt == entry.runAt
        && record.priority == entry.priority
    }

    mutating func insertPending(_ record: JobRecord) {
      jobs[record.id] = record
      if let key = record.deduplicationKey { dedup[key] = record.id }
      scheduled.push(RunDateOrder(Entry(id: record.id, priority: record.priority, runAt: record.runAt)))
    }

    /// Moves scheduled entries whose date has come into the ready heap.
    mutating func promote(now: Date) {
      while let top = scheduled.peek?.entry, top.runAt <= now {
        scheduled.pop()
        if isCurrent(top) { ready.push(ClaimOrder(top)) }
      }
    }

    mutating func claim(limit: Int, lease: Lease, now: Date) -> [JobRecord] {
      promote(now: now)
      var claimed: [JobRecord] = []
      while claimed.count < limit, let entry = ready.pop()?.entry {
        guard isCurrent(entry), var record = jobs[entry.id] else { continue }
        record.status = .running
        record.attempts += 1
        record.leaseOwner = lease.owner
        record.leaseExpiresAt = lease.expiresAt
        jobs[record.id] = record
        running.insert(record.id)
        claimed.append(record)
      }
      return claimed
    }

    /// Applies a settlement if the owner still holds the job; returns whether it applied.
    mutating func settle(_ settlement: JobSettlement, now: Date) -> Bool {
      guard let record = jobs[settlement.id], record.status == .running,
        record.leaseOwner == settlement.owner
      else { return false }
      switch settlement.action {
      case .complete:
        delete(record.id)
      case .retry(let date, let error):
        makePending(record.id, runAt: date, error: error)
      case .kill(let error):
        running.remove(record.id)
        if let key = record.deduplicationKey, dedup[key] == record.id { dedup[key] = nil }
        var dead = record
        dead.status = .dead
        dead.lastError = error
        dead.leaseOwner = nil
        dead.leaseExpiresAt = nil
        jobs[record.id] = dead
      case .release:
        jobs[record.id]?.attempts = max(0, record.attempts - 1)
        makePending(record.id, runAt: record.runAt, error: record.lastError)
      }
      return true
    }

    mutating func makePending(_ id: JobID, runAt: Date, error: String?) {
      guard var record = jobs[id] else { return }
      running.remove(id)
      record.status = .pending
      record.runAt = runAt
      record.lastError = error
      record.leaseOwner = nil
      record.leaseExpiresAt = nil
      insertPending(record)
    }

    @discardableResult
    mutating func delete(_ id: JobID) -> Bool {
      guard let record = jobs.removeValue(forKey: id) else { return false }
      running.remove(id)
      if let key = record.deduplicationKey, dedup[key] == id { dedup[key] = nil }
      return true
    }

    mutating func nextWakeDate() -> Date? {
      while let top = ready.peek?.entry, !isCurrent(top) { ready.pop() }
      while let top = scheduled.peek?.entry, !isCurrent(top) { scheduled.pop() }
      let leaseExpiry = running.compactMap { jobs[$0]?.leaseExpiresAt }.min()
      return [ready.peek?.entry.runAt, scheduled.peek?.entry.runAt, leaseExpiry].compactMap { $0 }.min()
    }
  }
}
