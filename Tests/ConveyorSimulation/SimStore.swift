import Conveyor
import Foundation
import Synchronization

/// A simulated process's view of the shared store: every call goes through the world, which
/// gives it time on its way there and back, may fail it before it reaches the store or lose its
/// answer after it committed, and lets the oracle see what it did.
final class SimStore: JobStore {
  let base: InMemoryJobStore
  let world: SimWorld
  let process: Int
  /// This process's own rate bucket, for the `ratePerProcess` defect.
  private let ownRateTime = Mutex<Int64?>(nil)

  init(base: InMemoryJobStore, world: SimWorld, process: Int) {
    self.base = base
    self.world = world
    self.process = process
  }

  func enqueue(_ jobs: [NewJob], queue: String, clock: any JobClock) async throws -> [EnqueueResult] {
    try await world.call(process, .enqueue) {
      var stored = jobs
      if self.world.scenario.defect == .ignoresRunningForUniqueness {
        for index in stored.indices { stored[index].deduplicationScope = .waiting }
      }
      if self.world.scenario.defect == .ignoresOrderingKeys {
        for index in stored.indices { stored[index].orderingKey = nil }
      }
      if self.world.scenario.defect == .dropsFairnessKeys {
        for index in stored.indices { stored[index].fairnessKey = nil }
      }
      let results = try await self.base.enqueue(stored, queue: queue, clock: clock)
      self.world.oracle.enqueued(results, jobs, process: self.process)
      return results
    }
  }

  func settleAndClaim(
    _ settlements: [JobSettlement], queue: String, limit: Int, lease: Lease, clock: any JobClock
  ) async throws -> ClaimBatch {
    try await world.call(process, .settleAndClaim) {
      var settlements = settlements
      if self.world.scenario.defect == .settlesStaleClaims {
        settlements = settlements.map { settlement in
          guard let current = self.base.peek(settlement.id), current.status == .running else {
            return settlement
          }
          return JobSettlement(
            claim: ClaimReference(id: settlement.id, token: current.claimToken), action: settlement.action)
        }
      }
      let before = self.world.oracle.beforeSettling(settlements, queue: queue)
      // The defect: a bucket per process, the shared store keeping no rate.
      let ownRate = self.world.scenario.defect == .ratePerProcess ? self.world.scenario.rate : nil
      let micros = RateLimit.microseconds(JobStoreTime.normalized(clock.now()))
      let allowed =
        ownRate.map { rate in self.ownRateTime.withLock { rate.take(limit, tat: $0, now: micros).starts } }
        ?? limit
      var batch = try await self.base.settleAndClaim(
        settlements, queue: queue, limit: allowed, lease: lease, clock: clock)
      if let ownRate {
        self.ownRateTime.withLock { time in
          let taken = ownRate.take(batch.claimed.count, tat: time, now: micros)
          if taken.mustStore { time = taken.tat }
        }
      }
      if self.world.scenario.defect == .runsStalePayload {
        for index in batch.claimed.indices {
          if let first = self.world.oracle.firstPayload(of: batch.claimed[index].id) {
            batch.claimed[index].payload = first
          }
        }
      }
      self.world.oracle.settled(
        settlements, before: before, batch: batch, lease: lease, process: self.process)
      return batch
    }
  }

  func heartbeat(_ claims: [ClaimReference], queue: String, lease: Lease, clock: any JobClock)
    async throws -> [ClaimReference]
  {
    try await world.call(process, .heartbeat) {
      let before = Dictionary(
        claims.compactMap { claim in
          self.base.peek(claim.id).flatMap { $0.status == .running ? (claim.id, $0.claimToken) : nil }
        }, uniquingKeysWith: { first, _ in first })
      let held = try await self.heartbeatOnBase(claims, queue: queue, lease: lease, clock: clock)
      self.world.oracle.checkHeartbeat(held: held, before: before, process: self.process)
      return held
    }
  }

  /// The base store's heartbeat (or, with ``SimDefect/renewsStaleClaims``, a defective one).
  private func heartbeatOnBase(_ claims: [ClaimReference], queue: String, lease: Lease, clock: any JobClock)
    async throws -> [ClaimReference]
  {
    guard world.scenario.defect == .renewsStaleClaims else {
      return try await base.heartbeat(claims, queue: queue, lease: lease, clock: clock)
    }
    // Each claim of a running job stands for the job's current claim.
    let current = claims.map { claim -> ClaimReference in
      guard let record = self.base.peek(claim.id), record.status == .running else { return claim }
      return ClaimReference(id: claim.id, token: record.claimToken)
    }
    let kept = Set(try await self.base.heartbeat(current, queue: queue, lease: lease, clock: clock))
    return zip(claims, current).filter { kept.contains($0.1) }.map(\.0)
  }

  func rescueExpiredLeases(queue: String, clock: any JobClock) async throws -> Int {
    try await world.call(process, .rescue) {
      let judgedBy: any JobClock =
        self.world.scenario.defect == .rescuesLiveLeases ? AheadClock(base: clock, by: 0.25) : clock
      let before = self.world.oracle.beforeRescue()
      let now = clock.now()
      let count = try await self.base.rescueExpiredLeases(queue: queue, clock: judgedBy)
      self.world.oracle.checkRescue(before: before, now: now, process: self.process)
      if count > 0 { self.world.oracle.rescued() }
      return count
    }
  }

  func counts(queue: String, clock: any JobClock) async throws -> JobCounts {
    try await world.call(process, .read) { try await self.base.counts(queue: queue, clock: clock) }
  }

  func jobs(queue: String, status: JobStatus?, after: JobID?, limit: Int) async throws -> [JobRecord] {
    try await world.call(process, .read) {
      try await self.base.jobs(queue: queue, status: status, after: after, limit: limit)
    }
  }

  func job(_ id: JobID) async throws -> JobRecord? {
    try await world.call(process, .read) { try await self.base.job(id) }
  }

  func remove(_ ids: [JobID], queue: String) async throws -> Int {
    try await world.call(process, .change) {
      let count = try await self.base.remove(ids, queue: queue)
      self.world.oracle.removed(ids)
      return count
    }
  }

  func cancel(_ ids: [JobID], queue: String?, clock: any JobClock) async throws -> [CancelResult] {
    try await world.call(process, .change) {
      let results = try await self.base.cancel(ids, queue: queue, clock: clock)
      self.world.oracle.removed(zip(ids, results).filter { $0.1.cancelled }.map(\.0))
      return results
    }
  }

  func prune(queue: String, status: JobStatus, olderThan age: Duration, limit: Int, clock: any JobClock)
    async throws -> Int
  {
    try await world.call(process, .change) {
      switch self.world.scenario.defect {
      case .prunesEarly?:
        return try await self.base.prune(
          queue: queue, status: status, olderThan: .zero, limit: limit, clock: clock)
      case .prunesUnfinished?:
        let oldest = try await self.base.jobs(queue: queue, status: .pending, after: nil, limit: 1)
        _ = try await self.base.remove(oldest.map(\.id), queue: queue)
      default: break
      }
      return try await self.base.prune(
        queue: queue, status: status, olderThan: age, limit: limit, clock: clock)
    }
  }

  func currentClaims(_ claims: [ClaimReference], queue: String) async throws -> [ClaimReference] {
    try await world.call(process, .read) {
      guard self.world.scenario.defect == .renewsStaleClaims else {
        return try await self.base.currentClaims(claims, queue: queue)
      }
      // The same defect as its heartbeat: a claim of a running job counts as its current one.
      return claims.filter { self.base.peek($0.id)?.status == .running }
    }
  }

  func clear(queue: String, statuses: Set<JobStatus>) async throws -> Int {
    try await world.call(process, .change) {
      let doomed = try await self.base.jobs(queue: queue, status: nil, after: nil, limit: .max).filter {
        statuses.contains($0.status)
      }
      let count = try await self.base.clear(queue: queue, statuses: statuses)
      self.world.oracle.removed(doomed.map(\.id))
      return count
    }
  }

  func tally(queue: String, statuses: Set<JobStatus>) async throws -> JobTally {
    try await world.call(process, .read) { try await self.base.tally(queue: queue, statuses: statuses) }
  }

  func clear(queue: String, statuses: Set<JobStatus>, through: JobID, expecting expected: Int) async throws
    -> Int?
  {
    try await world.call(process, .change) {
      let doomed = try await self.base.jobs(queue: queue, status: nil, after: nil, limit: .max).filter {
        statuses.contains($0.status) && $0.id <= through
      }
      let count = try await self.base.clear(
        queue: queue, statuses: statuses, through: through, expecting: expected)
      if count != nil { self.world.oracle.removed(doomed.map(\.id)) }
      return count
    }
  }

  func requeueDead(_ ids: [JobID]?, queue: String, clock: any JobClock) async throws -> Int {
    try await world.call(process, .change) {
      let count = try await self.base.requeueDead(ids, queue: queue, clock: clock)
      if count > 0 { self.world.oracle.requeued() }
      return count
    }
  }

  func setPaused(_ paused: Bool, queue: String) async throws {
    try await world.call(process, .change) {
      // The application pauses during the chaos only: a pause still on its way (a slow call, a
      // retry) when faults stop is dropped, or it would outlast the resume that ends the chaos.
      if paused && self.world.phase != .chaos {
        self.world.trace.note("p\(self.process) pause dropped: faults have stopped")
        return
      }
      try await self.base.setPaused(paused, queue: queue)
      self.world.oracle.paused(paused, queue: queue)
    }
  }

  func limits(queue: String) async throws -> QueueLimits {
    try await world.call(process, .read) { try await self.base.limits(queue: queue) }
  }

  var keepsKeyLimits: Bool { base.keepsKeyLimits }
  var keepsFairShares: Bool { base.keepsFairShares }

  func limitKeyUsage(queue: String, limit: Int) async throws -> [LimitKeyUsage] {
    try await world.call(process, .read) { try await self.base.limitKeyUsage(queue: queue, limit: limit) }
  }

  func setLimits(_ limits: QueueLimits, queue: String) async throws {
    try await world.call(process, .change) {
      switch self.world.scenario.defect {
      case .forgetsLimits: break
      case .ratePerProcess:
        try await self.base.setLimits(QueueLimits(concurrency: limits.concurrency), queue: queue)
      case .ignoresKeyLimits:
        var kept = limits
        kept.keyConcurrency = nil
        kept.keyConcurrencyOverrides = [:]
        try await self.base.setLimits(kept, queue: queue)
      case .ignoresKeyRates:
        var kept = limits
        kept.keyRate = nil
        kept.keyRateOverrides = [:]
        try await self.base.setLimits(kept, queue: queue)
      default: try await self.base.setLimits(limits, queue: queue)
      }
      self.world.oracle.limitsSet(limits)
    }
  }

  func isPaused(queue: String) async throws -> Bool {
    try await world.call(process, .read) { try await self.base.isPaused(queue: queue) }
  }

  func nextWake(queue: String, clock: any JobClock) async throws -> WakeHint {
    try await world.call(process, .read) { try await self.base.nextWake(queue: queue, clock: clock) }
  }

  func queueNames() async throws -> [String] {
    try await world.call(process, .read) { try await self.base.queueNames() }
  }

  // MARK: Schedules

  func saveSchedules(
    _ schedules: [ScheduleDefinition], queue: String, origin: ScheduleOrigin, clock: any JobClock
  ) async throws -> ScheduleSaveSummary {
    try await world.call(process, .change) {
      let now = clock.now()
      let summary = try await self.base.saveSchedules(schedules, queue: queue, origin: origin, clock: clock)
      // A changed or retired schedule fires the slots already due, in the same call.
      let added = summary.added.compactMap(self.base.peek)
      let stored = try await self.base.schedules(queue: queue)
      // The jobs first, then the schedules as stored, which are checked against them.
      self.world.oracle.schedulesFired(added, stored: [], now: now, process: self.process)
      self.world.oracle.schedulesStored(stored, process: self.process)
      return summary
    }
  }

  func schedules(queue: String?) async throws -> [StoredSchedule] {
    try await world.call(process, .read) { try await self.base.schedules(queue: queue) }
  }

  func changeSchedulePause(_ paused: Bool, name: String, queue: String, clock: any JobClock) async throws
    -> [JobID]?
  {
    try await world.call(process, .change) {
      // As with the queue's pause: a pause still on its way when faults stop is dropped, or it
      // would outlast the resume that ends the chaos.
      if paused && self.world.phase != .chaos {
        self.world.trace.note("p\(self.process) schedule pause dropped: faults have stopped")
        return []
      }
      let now = clock.now()
      let before = try await self.base.schedules(queue: queue).first { $0.name == name }
      let added = try await self.base.changeSchedulePause(paused, name: name, queue: queue, clock: clock)
      // A pause fires the slots already due, in the same call: the jobs first, then the pause or
      // resume, which checks the schedule against them.
      let stored = try await self.base.schedules(queue: queue)
      self.world.oracle.schedulesFired(
        (added ?? []).compactMap(self.base.peek), stored: [], now: now, process: self.process)
      let after = stored.first { $0.name == name }
      self.world.oracle.schedulePaused(paused, before: before, after: after, process: self.process)
      return added
    }
  }

  func removeSchedule(name: String, queue: String) async throws -> Bool {
    try await world.call(process, .change) { try await self.base.removeSchedule(name: name, queue: queue) }
  }

  func fireDueSchedules(queue: String, clock: any JobClock) async throws -> ScheduleFiring {
    try await world.call(process, .change) {
      let early = self.world.scenario.defect == .firesEarly && self.world.draw { $0.chance(probability: 0.3) }
      let judgedBy: any JobClock = early ? AheadClock(base: clock, by: 1.5) : clock
      let now = clock.now()
      var firing = try await self.base.fireDueSchedules(queue: queue, clock: judgedBy)
      switch self.world.scenario.defect {
      case .firesSlotTwice?:
        // The jobs of a firing that left its schedule unadvanced are added again by the next.
        let again = self.world.unadvanced.withLock { jobs in
          defer { jobs = [] }
          return jobs
        }
        if !again.isEmpty {
          firing.added += try await self.base.enqueue(again, queue: queue, clock: clock).filter(\.inserted)
            .map(\.id)
        }
        if !firing.added.isEmpty && self.world.draw({ $0.chance(probability: 0.2) }) {
          let jobs = firing.added.compactMap(self.base.peek).map { record in
            NewJob(
              payload: record.payload, priority: record.priority, runAt: record.runAt,
              timeLimit: record.timeLimit)
          }
          self.world.unadvanced.withLock { $0 = jobs }
        }
      case .skipsSlot?:
        if let first = firing.added.first, self.world.draw({ $0.chance(probability: 0.2) }) {
          _ = try await self.base.remove([first], queue: queue)
          firing.added.removeFirst()
        }
      default: break
      }
      self.world.oracle.schedulesFired(
        firing.added.compactMap(self.base.peek), stored: try await self.base.schedules(queue: queue),
        now: now,
        process: self.process)
      return firing
    }
  }

  /// Hears of nothing: idle workers poll, on the simulated clock.
  func waitForWork(queue: String, timeout: Duration) async -> Bool {
    try? await world.clock.sleep(for: max(timeout, .milliseconds(1)))
    return false
  }
}

/// A clock whose wall reading is `by` seconds ahead of `base`'s: a store that judges leases by it
/// ends them early.
private struct AheadClock: JobClock {
  let base: any JobClock
  let by: TimeInterval

  func now() -> Date { base.now().addingTimeInterval(by) }
  func sleep(until deadline: Date) async throws {
    try await base.sleep(until: deadline.addingTimeInterval(-by))
  }
  func uptime() -> Duration { base.uptime() }
  func sleep(untilUptime deadline: Duration) async throws { try await base.sleep(untilUptime: deadline) }
}
