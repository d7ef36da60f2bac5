import Conveyor
import Foundation
import Synchronization

/// A `JobStore` that forwards to another, counting every call by name and failing chosen calls:
/// tests see how often a queue touches its store, and how it survives storage errors.
public final class InstrumentedJobStore: JobStore {
  /// The store calls are forwarded to.
  public let base: any JobStore

  private struct State {
    var calls: [String: Int] = [:]
    var failures: [String: (count: Int, error: any Error)] = [:]
    var leaseExpirySkew: TimeInterval = 0
    var heartbeatReturnDelay: Duration = .zero
    var claimAnswerDelays: [Duration] = []
    var claimAnswerHolds: [Gate] = []
    var afterHeartbeat: (@Sendable () -> Void)?
    var hidesLostClaims = false
    var hidesCheckpoints = false
    var settlementsSent: [[JobSettlement]] = []
  }
  private let state = Mutex(State())

  /// The error injected failures throw.
  public struct InjectedFailure: Error, CustomStringConvertible {
    /// Says it was injected.
    public var description: String { "disk I/O error (injected)" }

    /// Creates the error.
    public init() {}
  }

  /// Wraps `base`.
  public init(_ base: any JobStore = InMemoryJobStore()) { self.base = base }

  /// Calls so far, by method name (`enqueue`, `settleAndClaim`, `heartbeat`, `rescue`, `counts`,
  /// `jobs`, `remove`, `clear`, `requeueDead`, `setPaused`, `isPaused`, `nextWake`, `queueNames`).
  public var calls: [String: Int] { state.withLock { $0.calls } }

  /// Every call so far.
  public var totalCalls: Int { state.withLock { $0.calls.values.reduce(0, +) } }

  /// The settlements of every `settleAndClaim` call so far, failed ones included, in order.
  public var settlementsSent: [[JobSettlement]] { state.withLock { $0.settlementsSent } }

  /// Makes heartbeats and claim checks answer that every claim is still current, as a store
  /// that cannot tell would: a queue then learns of a cancelled job only through its own
  /// `cancel`.
  public func hideLostClaims() {
    state.withLock { $0.hidesLostClaims = true }
  }

  /// Makes the store say it keeps no checkpoints, as a store written before them would.
  public func hideCheckpoints() {
    state.withLock { $0.hidesCheckpoints = true }
  }

  /// Forgets the calls counted so far.
  public func resetCalls() {
    state.withLock { $0.calls = [:] }
  }

  /// Makes the next `count` calls of `method` throw `error` (by default ``InjectedFailure``).
  public func fail(_ method: String, times count: Int, with error: any Error = InjectedFailure()) {
    state.withLock { $0.failures[method] = (count, error) }
  }

  /// Moves the lease expiry every later `nextWake` reports by `seconds` (negative: earlier), as a
  /// store that judges leases by a clock other than the caller's (a database server's) may do.
  /// The store's own rescue still judges by its own clock.
  public func skewLeaseExpiries(by seconds: TimeInterval) {
    state.withLock { $0.leaseExpirySkew = seconds }
  }

  /// Makes every later heartbeat return `delay` (real time) after the store extended its leases,
  /// as a store whose thread is slow to resume its caller does: the leases' new expiries are
  /// computed at the start of that wait.
  public func delayHeartbeatReturns(by delay: Duration) {
    state.withLock { $0.heartbeatReturnDelay = delay }
  }

  /// Makes the next claims that take at least one job return late, one claim per delay in
  /// `delays` (real time, after the store committed the claim): a stalled machine, or a store
  /// whose answer travels slowly, so the claim's lease may lapse before the worker hears of it.
  public func delayClaimAnswers(_ delays: [Duration]) {
    state.withLock { $0.claimAnswerDelays = delays }
  }

  /// Holds the answer of the next call that claims jobs until `gate` opens (after the store
  /// committed the claim): a worker stalled for as long as a test needs, say until another worker
  /// took the job over, whatever the machine's load.
  public func holdNextClaimAnswer(until gate: Gate) {
    state.withLock { $0.claimAnswerHolds.append(gate) }
  }

  /// Runs `hook` after every later heartbeat extended its leases, on the caller's thread and
  /// without suspending (a store that works on the caller's thread), before the call returns.
  public func runAfterEachHeartbeat(_ hook: @escaping @Sendable () -> Void) {
    state.withLock { $0.afterHeartbeat = hook }
  }

  private func record(_ method: String) throws {
    let failure = state.withLock { state -> (any Error)? in
      state.calls[method, default: 0] += 1
      guard let (left, error) = state.failures[method], left > 0 else { return nil }
      state.failures[method] = (left - 1, error)
      return error
    }
    if let failure { throw failure }
  }

  /// Counted, then forwarded to ``base``.
  public func enqueue(_ jobs: [NewJob], queue: String, clock: any JobClock) async throws -> [EnqueueResult] {
    try record("enqueue")
    return try await base.enqueue(jobs, queue: queue, clock: clock)
  }

  /// Counted, then forwarded to ``base``.
  public func settleAndClaim(
    _ settlements: [JobSettlement], queue: String, limit: Int, lease: Lease, clock: any JobClock
  ) async throws -> ClaimBatch {
    state.withLock { $0.settlementsSent.append(settlements) }
    try record("settleAndClaim")
    let batch = try await base.settleAndClaim(
      settlements, queue: queue, limit: limit, lease: lease, clock: clock)
    if !batch.claimed.isEmpty,
      let delay = state.withLock({ $0.claimAnswerDelays.isEmpty ? nil : $0.claimAnswerDelays.removeFirst() })
    {
      try await Task.sleep(for: delay)
    }
    if !batch.claimed.isEmpty,
      let gate = state.withLock({ $0.claimAnswerHolds.isEmpty ? nil : $0.claimAnswerHolds.removeFirst() })
    {
      await gate.wait()
    }
    return batch
  }

  /// The base store's, unless ``hideCheckpoints()`` was called.
  public var keepsCheckpoints: Bool { !state.withLock { $0.hidesCheckpoints } && base.keepsCheckpoints }

  /// Counted, then forwarded to ``base``.
  public func checkpoint(_ claim: ClaimReference, payload: Data, queue: String) async throws -> Bool {
    try record("checkpoint")
    return try await base.checkpoint(claim, payload: payload, queue: queue)
  }

  /// Counted, then forwarded to ``base``.
  public func heartbeat(_ claims: [ClaimReference], queue: String, lease: Lease, clock: any JobClock)
    async throws -> [ClaimReference]
  {
    try record("heartbeat")
    var kept = try await base.heartbeat(claims, queue: queue, lease: lease, clock: clock)
    if state.withLock({ $0.hidesLostClaims }) { kept = claims }
    state.withLock { $0.afterHeartbeat }?()
    let delay = state.withLock { $0.heartbeatReturnDelay }
    if delay > .zero { try await Task.sleep(for: delay) }
    return kept
  }

  /// Counted, then forwarded to ``base``.
  public func rescueExpiredLeases(queue: String, clock: any JobClock) async throws -> Int {
    try record("rescue")
    return try await base.rescueExpiredLeases(queue: queue, clock: clock)
  }

  /// Counted, then forwarded to ``base``.
  public func counts(queue: String, clock: any JobClock) async throws -> JobCounts {
    try record("counts")
    return try await base.counts(queue: queue, clock: clock)
  }

  /// Counted, then forwarded to ``base``.
  public func jobs(queue: String, status: JobStatus?, after: JobID?, limit: Int) async throws -> [JobRecord] {
    try record("jobs")
    return try await base.jobs(queue: queue, status: status, after: after, limit: limit)
  }

  /// Counted, then forwarded to ``base``.
  public func job(_ id: JobID) async throws -> JobRecord? {
    try record("job")
    return try await base.job(id)
  }

  /// Counted, then forwarded to ``base``.
  public func remove(_ ids: [JobID], queue: String) async throws -> Int {
    try record("remove")
    return try await base.remove(ids, queue: queue)
  }

  /// Counted, then forwarded to ``base``.
  public func cancel(_ ids: [JobID], queue: String?, clock: any JobClock) async throws -> [CancelResult] {
    try record("cancel")
    return try await base.cancel(ids, queue: queue, clock: clock)
  }

  /// Counted, then forwarded to ``base``.
  public func prune(
    queue: String, status: JobStatus, olderThan age: Duration, limit: Int, clock: any JobClock
  )
    async throws -> Int
  {
    try record("prune")
    return try await base.prune(queue: queue, status: status, olderThan: age, limit: limit, clock: clock)
  }

  /// Forwarded to ``base``.
  public func cancellations(queue: String) -> AsyncStream<CancellationNotice>? {
    base.cancellations(queue: queue)
  }

  /// Counted, then forwarded to ``base``.
  public func currentClaims(_ claims: [ClaimReference], queue: String) async throws -> [ClaimReference] {
    try record("currentClaims")
    let current = try await base.currentClaims(claims, queue: queue)
    return state.withLock { $0.hidesLostClaims } ? claims : current
  }

  /// Counted, then forwarded to ``base``.
  public func clear(queue: String, statuses: Set<JobStatus>) async throws -> Int {
    try record("clear")
    return try await base.clear(queue: queue, statuses: statuses)
  }

  /// Counted, then forwarded to ``base``.
  public func tally(queue: String, statuses: Set<JobStatus>) async throws -> JobTally {
    try record("tally")
    return try await base.tally(queue: queue, statuses: statuses)
  }

  /// Counted, then forwarded to ``base``.
  public func clear(queue: String, statuses: Set<JobStatus>, through: JobID, expecting expected: Int)
    async throws -> Int?
  {
    try record("clear")
    return try await base.clear(queue: queue, statuses: statuses, through: through, expecting: expected)
  }

  /// Counted, then forwarded to ``base``.
  public func requeueDead(_ ids: [JobID]?, queue: String, clock: any JobClock) async throws -> Int {
    try record("requeueDead")
    return try await base.requeueDead(ids, queue: queue, clock: clock)
  }

  /// Counted, then forwarded to ``base``.
  public func setPaused(_ paused: Bool, queue: String) async throws {
    try record("setPaused")
    try await base.setPaused(paused, queue: queue)
  }

  /// Counted, then forwarded to ``base``.
  public func isPaused(queue: String) async throws -> Bool {
    try record("isPaused")
    return try await base.isPaused(queue: queue)
  }

  /// Counted, then forwarded to ``base``.
  public func limits(queue: String) async throws -> QueueLimits {
    try record("limits")
    return try await base.limits(queue: queue)
  }

  /// The base store's answer.
  public var keepsKeyLimits: Bool { base.keepsKeyLimits }
  /// The base store's answer.
  public var keepsFairShares: Bool { base.keepsFairShares }

  /// Counted, then forwarded to ``base``.
  public func limitKeyUsage(queue: String, limit: Int) async throws -> [LimitKeyUsage] {
    try record("limitKeyUsage")
    return try await base.limitKeyUsage(queue: queue, limit: limit)
  }

  /// Counted, then forwarded to ``base``.
  public func setLimits(_ limits: QueueLimits, queue: String) async throws {
    try record("setLimits")
    try await base.setLimits(limits, queue: queue)
  }

  /// Counted, then forwarded to ``base``.
  public func nextWake(queue: String, clock: any JobClock) async throws -> WakeHint {
    try record("nextWake")
    var hint = try await base.nextWake(queue: queue, clock: clock)
    let skew = state.withLock { $0.leaseExpirySkew }
    hint.nextLeaseExpiry = hint.nextLeaseExpiry?.addingTimeInterval(skew)
    return hint
  }

  /// Counted, then forwarded to ``base``.
  public func queueNames() async throws -> [String] {
    try record("queueNames")
    return try await base.queueNames()
  }

  /// Counted, then forwarded to ``base``.
  public func saveSchedules(
    _ schedules: [ScheduleDefinition], queue: String, origin: ScheduleOrigin, clock: any JobClock
  ) async throws -> ScheduleSaveSummary {
    try record("saveSchedules")
    return try await base.saveSchedules(schedules, queue: queue, origin: origin, clock: clock)
  }

  /// Counted, then forwarded to ``base``.
  public func schedules(queue: String?) async throws -> [StoredSchedule] {
    try record("schedules")
    return try await base.schedules(queue: queue)
  }

  /// Counted, then forwarded to ``base``.
  public func changeSchedulePause(_ paused: Bool, name: String, queue: String, clock: any JobClock)
    async throws -> [JobID]?
  {
    try record("changeSchedulePause")
    return try await base.changeSchedulePause(paused, name: name, queue: queue, clock: clock)
  }

  /// Counted, then forwarded to ``base``.
  public func removeSchedule(name: String, queue: String) async throws -> Bool {
    try record("removeSchedule")
    return try await base.removeSchedule(name: name, queue: queue)
  }

  /// Counted, then forwarded to ``base``.
  public func fireDueSchedules(queue: String, clock: any JobClock) async throws -> ScheduleFiring {
    try record("fireDueSchedules")
    return try await base.fireDueSchedules(queue: queue, clock: clock)
  }

  /// Counted, then forwarded to ``base``.
  public var maximumLockWait: Duration { base.maximumLockWait }

  /// Forwarded to ``base``.
  public var maximumLockWaitSetting: String { base.maximumLockWaitSetting }
}
