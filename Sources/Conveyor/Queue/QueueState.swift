import Foundation

// The queue's decisions as a plain value: what to claim, what to start, what each worker does
// next, which claims are held, when "finished" may be reported. `JobQueue` keeps one behind a lock
// and acts on what its methods return (it never decides anything itself); the unit tests drive it
// with plain values.
//
// Declared outside the generic `JobQueue<Item>`: types nested in a generic class are generic too,
// and the run-time metadata lookups for them showed up on every job in profiles.

/// An outcome waiting to be recorded, and the event to publish once the store accepts it.
struct PendingSettlement: Sendable, Hashable {
  var settlement: JobSettlement
  var event: JobQueueEvent?
}

/// What the loop does in one turn, taken under the lock.
struct LoopStep: Sendable, Hashable {
  /// Outcomes to record now (taken out of the state; give them back with
  /// ``QueueState/restore(_:)`` if the store call fails).
  var settlements: [PendingSettlement]
  /// How many jobs to claim (0: none).
  var claimLimit: Int
  /// Whether the loop should ask the store at all (settlements, a claim, or a paused queue to
  /// re-check).
  var needsStore: Bool { !settlements.isEmpty || claimLimit > 0 || checkPause }
  /// Whether the queue believes it is paused and must look at the stored flag again.
  var checkPause: Bool
  /// Whether the queue is stopping.
  var stopping: Bool
  /// How many of `settlements` hand back claimed jobs that could not start (claimed ahead, or
  /// waiting when the queue stops, pauses or loses its handler).
  var handedBack = 0
}

/// What a worker does after finishing a job.
enum WorkerStep: Sendable, Hashable {
  /// Handle this claimed job next; `flush` asks the loop to record the outcomes so far.
  case run(JobRecord, flush: Bool)
  /// Record these outcomes and claim up to `limit` jobs in one store call.
  case claim([PendingSettlement], limit: Int)
  /// End the worker.
  case exit
}

/// A look at the store for "finished", begun by ``QueueState/beginFinishCheck()``.
struct FinishCheck: Sendable, Hashable {
  var generation: UInt64
  var epoch: UInt64
}

/// A reading of the queue's clock: its uptime, and how far its wall clock is ahead of it (the wall
/// reading minus the uptime). Between two readings the offset grows by as much as the wall clock
/// was stepped forward.
struct ClockReading: Sendable, Hashable {
  var uptime: Duration
  var wallOffset: Duration

  /// A reading taken now from `clock`.
  init(_ clock: any JobClock) {
    uptime = clock.uptime()
    wallOffset = .milliseconds(JobStoreTime.milliseconds(clock.now())) - uptime
  }

  init(uptime: Duration, wallOffset: Duration = .zero) {
    self.uptime = uptime
    self.wallOffset = wallOffset
  }

  static let zero = ClockReading(uptime: .zero)
}

/// Until when a claim's lease surely holds: the uptime when the claim (or the last heartbeat that
/// kept it) was sent, plus the lease, with the wall clock's offset then. A store that dates leases
/// by the wall clock ends them sooner by as much as that clock was stepped forward since.
struct LeaseBound: Sendable, Hashable {
  var holdsUntil: Duration
  var wallOffset: Duration

  /// The bound of a lease of `lease` asked for at `sent`.
  init(sent: ClockReading, lease: Duration) {
    holdsUntil = sent.uptime + lease
    wallOffset = sent.wallOffset
  }

  /// How much of the lease surely remains at `now`.
  func remaining(at now: ClockReading) -> Duration {
    holdsUntil - now.uptime - max(.zero, now.wallOffset - wallOffset)
  }
}

/// Claimed jobs waiting for a slot, first in first out, each with when it was claimed and until
/// when its lease surely holds.
struct JobBuffer: Sendable, Hashable {
  private var storage: [JobRecord] = []
  private var times: [Duration] = []
  /// Until when each job's lease surely holds (nil: not tracked), see ``QueueState/claimed(_:at:lease:)``.
  private var holds: [LeaseBound?] = []
  private var head = 0

  var isEmpty: Bool { head == storage.count }
  var count: Int { storage.count - head }
  var claims: [ClaimReference] { storage[head...].map(\.claim) }
  var all: [JobRecord] { Array(storage[head...]) }
  /// When the first waiting job was claimed (nil: none waits).
  var firstClaimedAt: Duration? { isEmpty ? nil : times[head] }

  mutating func append(_ jobs: [JobRecord], at time: Duration = .zero, lease hold: LeaseBound? = nil) {
    if head > 0 && head == storage.count {
      storage.removeAll(keepingCapacity: true)
      times.removeAll(keepingCapacity: true)
      holds.removeAll(keepingCapacity: true)
      head = 0
    }
    storage.append(contentsOf: jobs)
    times.append(contentsOf: repeatElement(time, count: jobs.count))
    holds.append(contentsOf: repeatElement(hold, count: jobs.count))
  }

  mutating func removeAll(where shouldRemove: (JobRecord) -> Bool) {
    let kept = storage.indices.dropFirst(head).filter { !shouldRemove(storage[$0]) }
    storage = kept.map { storage[$0] }
    times = kept.map { times[$0] }
    holds = kept.map { holds[$0] }
    head = 0
  }

  mutating func removeAll() {
    storage = []
    times = []
    holds = []
    head = 0
  }

  /// A heartbeat kept these claims: their leases surely hold as `bound` says.
  mutating func renew(_ claims: Set<ClaimReference>, to bound: LeaseBound) {
    for index in storage.indices.dropFirst(head) where claims.contains(storage[index].claim) {
      holds[index] = bound
    }
  }

  mutating func popFirst() -> (job: JobRecord, lease: LeaseBound?)? {
    guard head < storage.count else { return nil }
    defer { head += 1 }
    return (storage[head], holds[head])
  }
}

/// The queue's state machine. Every method is a pure function of the state and its arguments.
struct QueueState: Sendable {
  /// Settings the decisions depend on.
  struct Limits: Sendable, Hashable {
    var concurrency: Int
    var prefetch: Int
    /// With `prefetch` 0: a worker whose job was short claims one job ahead (see
    /// ``JobQueueConfiguration/claimsAhead``).
    var claimsAhead = false
    /// The lease a claim asks for: a claimed job starts only while its lease surely holds for a
    /// third of this more (``mayStart(_:now:)``).
    var lease = Duration.seconds(60)
  }

  /// Whether a claimed job may start at `now`: its lease surely holds (``LeaseBound``: from when
  /// the claim, or the last heartbeat that kept it, was sent, less any forward step of the wall
  /// clock since) for at least a third of the lease more: the lease keeper heartbeats every third
  /// of the lease, so its next heartbeat renews the lease before it can lapse. A job claimed by a
  /// call answered late (a stalled store, a stalled machine), or claimed ahead and left waiting,
  /// may have lost its lease to a rescue and be running elsewhere: it is handed back unstarted
  /// instead (its attempt given back). Nil: not tracked (always true).
  func mayStart(_ lease: LeaseBound?, now: ClockReading) -> Bool {
    guard let lease else { return true }
    return lease.remaining(at: now) >= limits.lease / 3
  }

  /// How many claimed jobs were handed back because their lease might have lapsed before they
  /// could start (``mayStart(_:now:)``); the loop logs it.
  var handedBackLapsed = 0

  /// Takes the next claimed job that may start at `now`, handing back (as releases in
  /// ``settlements``) those before it whose lease may have lapsed.
  private mutating func popStartable(now: ClockReading) -> JobRecord? {
    while let (job, lease) = buffer.popFirst() {
      if mayStart(lease, now: now) { return job }
      handedBackLapsed += 1
      settlements.append(
        PendingSettlement(
          settlement: JobSettlement(claim: job.claim, action: .release(error: nil)), event: nil))
    }
    return nil
  }

  /// A handler run shorter than this may make its worker claim ahead.
  static let shortJob = Duration.milliseconds(1)
  /// A store call shorter than this is too cheap to overlap with a job (the in-memory store):
  /// handing its outcome to the loop would cost more than the call. A worker on such a store
  /// batches instead (see ``Ahead/batch``).
  static let cheapStoreCall = Duration.microseconds(10)
  /// How many jobs a worker on a cheap store claims beyond its own (``Ahead/batch``), after a job
  /// shorter than ``shortJob``: jobs as short run well within ``aheadHold``; behind one that runs
  /// long, the others wait for a free slot and are handed back when the hold passes. On the
  /// in-memory store at concurrency 4, 15 drained no-op jobs about 1.2 times as fast as 3 (7 was
  /// between them).
  static let batchedAheadJobs = 15

  /// How a worker claims after a job, with `prefetch` 0 and ``Limits/claimsAhead``.
  enum Ahead: Sendable, Hashable {
    /// Only its own next job.
    case none
    /// One job more, whose outcome the loop records while the next job runs: a slow store call
    /// (SQLite, PostgreSQL) overlaps a job.
    case overlap
    /// ``batchedAheadJobs`` more, whose outcomes are recorded with the worker's next claim (or by
    /// the loop once ``aheadHold`` passed): on a store whose calls cost less than handing an
    /// outcome to the loop (the in-memory store), fewer calls.
    case batch
  }

  /// How a worker claims after its handler ran for `handler`, its last store call having taken
  /// `lastStoreCall` (nil: not measured): ahead only after a job shorter than `jobCeiling`
  /// (``shortJob``); overlapping a store call of at least `storeCallFloor`, batching below it. A
  /// store call that took no time at all means a clock that does not advance (a manual test
  /// clock), which can time nothing: no claiming ahead (a handler waiting on the test would hold
  /// jobs for good).
  static func ahead(
    handler: Duration, lastStoreCall: Duration?, storeCallFloor: Duration, jobCeiling: Duration = shortJob
  ) -> Ahead {
    guard let lastStoreCall, handler < jobCeiling else { return .none }
    if lastStoreCall >= storeCallFloor { return .overlap }
    return lastStoreCall > .zero ? .batch : .none
  }

  /// The longest a job claimed ahead waits for a slot before the loop hands it back.
  static let aheadHold = Duration.milliseconds(50)

  let limits: Limits
  /// Started and not yet fully stopped.
  var running = false
  /// `shutdown` began: no new claims, no new handlers.
  var stopping = false
  /// The stored pause flag as last seen.
  var paused = false
  /// The state last published.
  var publishedState = JobQueueState.stopped
  /// Worker tasks running; each holds one of the `concurrency` slots.
  var workers = 0
  /// The claims of the jobs being handled (for heartbeats). By claim, not by job: a worker whose
  /// lease lapsed may still be running a job that this same queue claimed again.
  var inFlight: Set<ClaimReference> = []
  /// Claimed jobs waiting for a slot.
  var buffer = JobBuffer()
  /// The loop took jobs claimed ahead out of the buffer to hand them back and has not recorded
  /// that yet: a worker that finishes meanwhile must not claim past them (see
  /// ``workerFinished(_:outcome:canHandle:ahead:)``).
  var handingBack = false
  /// The last claim ahead was a batch (``Ahead/batch``): a worker running one of its jobs leaves
  /// the outcomes for its next claim instead of asking the loop to record them (the loop does by
  /// ``leftOutcomesDue``, whatever happens).
  var batchingAhead = false
  /// Outcomes not yet recorded.
  var settlements: [PendingSettlement] = [] {
    didSet { if settlements.isEmpty { leftOutcomesDue = nil } }
  }
  /// When the loop must record the outcomes a batch's worker left for its next claim (the queue
  /// clock's uptime): the hold of the job the worker took in their place, so none waits longer
  /// than ``aheadHold`` after that job's claim whatever the jobs after it do. Nil when no outcome
  /// was left so.
  var leftOutcomesDue: Duration?
  /// Whether `.finished` was published since work was last seen.
  var reportedFinished = false
  /// Raised when this instance adds or re-queues jobs.
  var enqueueGeneration: UInt64 = 0
  /// Raised when the loop begins a look at the store for "finished".
  var finishCheckEpoch: UInt64 = 0
  /// `waitUntilFinished` callers, with the epoch at which they began waiting: only a check begun
  /// after that may release them.
  var finishWaiters: [UUID: UInt64] = [:]

  init(limits: Limits) { self.limits = limits }

  var freeSlots: Int { max(0, limits.concurrency - workers) }

  /// Nothing held in this process: no worker, no claimed job waiting, no outcome unrecorded.
  var holdsNothing: Bool { workers == detached.count && buffer.isEmpty && settlements.isEmpty }

  /// The claims of handlers that still run but no longer hold work of the queue's: their attempt
  /// is recorded (it outran its time limit) or their job is gone (cancelled, removed, taken over).
  /// Each holds its worker's slot until the handler returns, but ``holdsNothing`` leaves them out,
  /// so `waitUntilFinished` does not wait for a handler that may never return.
  var detached: Set<ClaimReference> = []
  /// Jobs this instance cancelled while running that it did not hold: a claim of one on its way
  /// back is dropped when it arrives (``claimed(_:at:lease:)``). The most recent
  /// ``cancelledHereLimit`` are kept (a job running elsewhere never comes back here).
  var cancelledHere: Set<JobID> = []
  private var cancelledHereOrder: [JobID] = []
  static let cancelledHereLimit = 4_096

  /// Forgets `claim` as detached; whether it was abandoned (its outcome is then dropped). Both
  /// sets are almost always empty: the common case hashes nothing.
  private mutating func releaseDetached(_ claim: ClaimReference) -> Bool {
    guard !detached.isEmpty else { return false }
    detached.remove(claim)
    return abandoned.remove(claim) != nil
  }

  /// Notes jobs cancelled while running that this instance does not hold.
  mutating func noteCancelled(_ ids: some Sequence<JobID>) {
    for id in ids where cancelledHere.insert(id).inserted {
      cancelledHereOrder.append(id)
    }
    if cancelledHereOrder.count > Self.cancelledHereLimit {
      let dropped = cancelledHereOrder.count - Self.cancelledHereLimit
      for id in cancelledHereOrder.prefix(dropped) { cancelledHere.remove(id) }
      cancelledHereOrder.removeFirst(dropped)
    }
  }

  /// Of ``detached``, the claims the store no longer holds: whatever their handler returns is
  /// dropped, and they are neither heartbeated nor reported lost again.
  var abandoned: Set<ClaimReference> = []

  /// The state to publish.
  var computedState: JobQueueState {
    if !running { return .stopped }
    if paused { return .paused }
    return workers == 0 ? .idle : .running
  }

  /// The state if it changed since it was last published (and records it as published).
  mutating func stateToPublish() -> JobQueueState? {
    let state = computedState
    guard state != publishedState else { return nil }
    publishedState = state
    return state
  }

  // MARK: Starting and stopping

  /// Whether the loop must rescue expired leases before it claims: set when the queue starts, so
  /// the jobs of a worker that vanished (this process, before a restart) run before later jobs.
  var rescueDue = false

  /// Marks the queue started; false when it already was.
  mutating func start() -> Bool {
    guard !running else { return false }
    running = true
    stopping = false
    rescueDue = true
    return true
  }

  /// Marks the queue stopped after its loop ended.
  mutating func stopped() {
    running = false
    stopping = false
  }

  /// Takes what the loop must record at shutdown: the outcomes and, as releases, the claimed
  /// jobs that never started.
  mutating func takeFinalFlush() -> [PendingSettlement] {
    let releases = buffer.all.map {
      PendingSettlement(settlement: JobSettlement(claim: $0.claim, action: .release(error: nil)), event: nil)
    }
    defer {
      settlements = []
      buffer.removeAll()
    }
    return settlements + releases
  }

  // MARK: The loop

  /// What the loop does this turn; nil when it should end (stopping with no worker left).
  ///
  /// Claimed jobs that cannot start are handed back in this step's settlements when
  /// ``handBackDue(canHandle:)`` has come (measured against `now`, the queue clock's uptime) and
  /// no slot is free for them, or at once when they can never start (stopping, paused, no
  /// handler).
  mutating func takeLoopStep(canHandle: Bool, now: Duration = .zero) -> LoopStep? {
    if stopping && workers == 0 { return nil }
    var handedBack = 0
    if let due = handBackDue(canHandle: canHandle), now >= due, freeSlots == 0 || due == .zero {
      handedBack = buffer.count
      handingBack = true
      settlements += buffer.all.map {
        PendingSettlement(
          settlement: JobSettlement(claim: $0.claim, action: .release(error: nil)), event: nil)
      }
      buffer.removeAll()
    }
    // Claim only what can start now (plus prefetch), and only once the buffer is empty; while
    // the queue is full, only with outcomes of this queue's to record (they may free places).
    let full = fullUntil.map { now < $0 } ?? false
    let canClaim = !stopping && canHandle && buffer.isEmpty && !paused && (!full || !settlements.isEmpty)
    let limit = canClaim && freeSlots > 0 ? freeSlots + limits.prefetch : 0
    defer { settlements = [] }
    return LoopStep(
      settlements: settlements, claimLimit: limit, checkPause: paused, stopping: stopping,
      handedBack: handedBack)
  }

  /// Whether the loop may claim now: a slot is free and nothing stops it.
  func canClaim(canHandle: Bool) -> Bool {
    !stopping && !paused && canHandle && freeSlots > 0 && buffer.isEmpty
  }

  /// Claimed jobs arrived at `now` (the queue clock's uptime): they wait for a slot. `lease`:
  /// their leases' bound, from when the claim was sent (the store starts the lease no earlier);
  /// nil: not tracked.
  mutating func claimed(_ jobs: [JobRecord], at now: Duration = .zero, lease: LeaseBound? = nil) {
    var jobs = jobs
    if !cancelledHere.isEmpty {
      // Cancelled by this instance while their claim's answer was on its way: never started.
      jobs.removeAll { cancelledHere.remove($0.id) != nil }
    }
    guard !jobs.isEmpty else { return }
    buffer.append(jobs, at: now, lease: lease)
    reportedFinished = false
  }

  /// A heartbeat sent at `sent` kept these claims.
  mutating func renewed(_ claims: Set<ClaimReference>, sentAt sent: ClockReading) {
    buffer.renew(claims, to: LeaseBound(sent: sent, lease: limits.lease))
  }

  /// A store call failed: its outcomes go back to be recorded first next time.
  mutating func restore(_ pending: [PendingSettlement]) {
    settlements.insert(contentsOf: pending, at: 0)
  }

  /// The claimed jobs that may start now, each taking a slot (and a worker). Jobs whose lease may
  /// have lapsed are handed back instead (``mayStart(_:now:)``).
  mutating func takeJobsToStart(now: ClockReading = .zero) -> [JobRecord] {
    var taken: [JobRecord] = []
    while workers < limits.concurrency, !stopping, !paused, let job = popStartable(now: now) {
      inFlight.insert(job.claim)
      workers += 1
      taken.append(job)
    }
    return taken
  }

  // MARK: Workers

  /// When the claimed jobs waiting for a slot must be handed back if they have not started (the
  /// queue clock's uptime; `.zero`: at once). Nil when none waits, or when they wait for as long
  /// as it takes (`prefetch` above 0).
  ///
  /// At once when they can never start: the queue is stopping (whatever `prefetch`), paused, or
  /// has no handler. Otherwise, with `prefetch` 0 (so they were claimed ahead), ``aheadHold``
  /// after the first of them was claimed.
  func handBackDue(canHandle: Bool) -> Duration? {
    guard let first = buffer.firstClaimedAt else { return nil }
    if stopping { return .zero }
    guard limits.prefetch == 0 else { return nil }
    return paused || !canHandle ? .zero : first + Self.aheadHold
  }

  /// When the loop's sleep ends (the queue clock's uptime), noted under the lock as it reads
  /// what is due (``loopDue(canHandle:)``); nil while it is awake.
  var loopSleepsUntil: Duration?
  /// Until when (uptime) the loop claims nothing but with outcomes of its own: the store said
  /// the queue's running jobs filled its concurrency limit (``ClaimBatch/full``), or its rate
  /// limit gives no start before ``ClaimBatch/nextStart``, so a claim for each job added would
  /// take nothing. Nil: claims as usual.
  var fullUntil: Duration?

  /// When the loop must act next for what is held here (the queue clock's uptime): hand back the
  /// jobs claimed ahead (``handBackDue(canHandle:)``), or record the outcomes a batch's worker
  /// left (``leftOutcomesDue``). Nil: nothing is due.
  func loopDue(canHandle: Bool) -> Duration? {
    switch (handBackDue(canHandle: canHandle), leftOutcomesDue) {
    case (let handBack?, let left?): min(handBack, left)
    case (let due, nil), (nil, let due): due
    }
  }

  /// Whether a worker must wake the loop: something is due (``loopDue(canHandle:)``) and the
  /// loop sleeps past it. A loop that is awake needs no signal: it reads what is due under the
  /// lock that notes its next sleep, so it sees this. Waking it for every claim ahead cost a turn
  /// of the loop and two store calls per claim: at concurrency 1 on the in-memory store, more
  /// than claiming ahead saved.
  var loopMustWake: Bool {
    guard let due = loopDue(canHandle: true), let sleepsUntil = loopSleepsUntil else { return false }
    return sleepsUntil > due
  }

  /// The loop recorded (or failed to record, and kept) the hand-back it took.
  mutating func handBackRecorded() { handingBack = false }

  /// A worker finished the job of `claim` with `outcome`: what it does next. `ahead`: see
  /// ``ahead(handler:lastStoreCall:storeCallFloor:jobCeiling:)``; with `prefetch` 0 and
  /// ``Limits/claimsAhead`` the worker then claims one job beyond its own (the loop records this
  /// outcome while the next job runs), or ``batchedAheadJobs`` on a cheap store.
  /// `outcome` nil: it was handed over already (``attemptOutran(_:outcome:)``).
  mutating func workerFinished(
    _ claim: ClaimReference, outcome: PendingSettlement?, canHandle: Bool, ahead: Ahead = .none,
    now: ClockReading = .zero
  ) -> WorkerStep {
    inFlight.remove(claim)
    let dropped = releaseDetached(claim)
    if let outcome, !dropped { settlements.append(outcome) }
    if !stopping, !paused, !buffer.isEmpty {
      // The hold of the job taken now, read before it leaves the buffer.
      let held = handBackDue(canHandle: canHandle)
      guard let next = popStartable(now: now) else {
        // Every waiting job was handed back: they must be recorded before anyone claims past
        // them, so the worker ends and the loop records them.
        return .exit
      }
      inFlight.insert(next.claim)
      if limits.prefetch == 0 && batchingAhead, let held {
        // Left for this worker's next claim, and due to the loop by the taken job's hold: the
        // loop is woken only if it would sleep past that.
        leftOutcomesDue = min(leftOutcomesDue ?? held, held)
        return .run(next, flush: loopMustWake)
      }
      return .run(next, flush: settlements.count >= max(1, limits.prefetch))
    }
    // A claim now could overtake the jobs the loop is handing back (still held in the store):
    // the worker ends, and the loop claims again once they are ready, in their old places.
    guard !stopping, !paused, canHandle, !handingBack else { return .exit }
    defer { settlements = [] }
    var extra = 0
    if limits.prefetch == 0 && limits.claimsAhead {
      switch ahead {
      case .none: extra = 0
      case .overlap: extra = 1
      case .batch: extra = Self.batchedAheadJobs
      }
      batchingAhead = ahead == .batch
    }
    return .claim(settlements, limit: 1 + limits.prefetch + extra)
  }

  /// A handler ran past its time limit: its attempt's outcome is to be recorded now (the loop
  /// takes it at its next turn), while its worker keeps the slot until the handler returns and
  /// then calls ``workerFinished(_:outcome:canHandle:ahead:now:)`` with no outcome.
  ///
  /// Returns false when the loop will not record it (the queue is stopping: the loop waits for
  /// its workers before its final record): the worker records it itself.
  mutating func attemptOutran(_ claim: ClaimReference, outcome: PendingSettlement) -> Bool {
    inFlight.remove(claim)
    // Abandoned already: nothing to record.
    guard detached.insert(claim).inserted else { return true }
    guard !stopping else { return false }
    settlements.append(outcome)
    return true
  }

  /// The store no longer holds these claims: a handler still running on one is detached and its
  /// outcome will be dropped. Returns the claims newly abandoned.
  mutating func abandon(_ claims: Set<ClaimReference>) -> Set<ClaimReference> {
    var newly: Set<ClaimReference> = []
    for claim in claims where inFlight.remove(claim) != nil {
      detached.insert(claim)
      abandoned.insert(claim)
      newly.insert(claim)
    }
    return newly
  }

  /// A worker ends after the job of `claim` without taking another (its task was cancelled to
  /// stop the handler): its outcome, unless abandoned, goes to the loop to record.
  mutating func workerStops(_ claim: ClaimReference, outcome: PendingSettlement?) {
    inFlight.remove(claim)
    let dropped = releaseDetached(claim)
    if let outcome, !dropped { settlements.append(outcome) }
  }

  /// The next claimed job for a worker that just claimed (nil: the worker ends). Jobs whose lease
  /// may have lapsed are handed back instead (``mayStart(_:now:)``).
  mutating func nextForWorker(now: ClockReading = .zero) -> JobRecord? {
    guard !stopping, !paused, let job = popStartable(now: now) else { return nil }
    inFlight.insert(job.claim)
    return job
  }

  /// A worker ended.
  mutating func workerExited() { workers -= 1 }

  // MARK: Leases

  /// Every claim this process still holds: jobs being handled, claimed jobs waiting for a slot,
  /// and handled jobs whose outcome is not recorded yet.
  var heldClaims: [ClaimReference] {
    Array(inFlight) + buffer.claims + settlements.map(\.settlement.claim)
  }

  /// Heartbeats found these claims gone (lapsed and claimed again, or removed): a claimed job
  /// that has not started must not start.
  mutating func lost(_ claims: Set<ClaimReference>) {
    buffer.removeAll { claims.contains($0.claim) }
  }

  // MARK: Finished

  /// This instance added or re-queued jobs.
  mutating func noteNewWork() {
    enqueueGeneration &+= 1
    reportedFinished = false
  }

  /// Registers a `waitUntilFinished` caller; it is released by the first finish check that
  /// begins after now.
  mutating func addFinishWaiter(_ token: UUID) {
    finishWaiters[token] = finishCheckEpoch
  }

  /// The loop is about to look at the store for "finished".
  mutating func beginFinishCheck() -> FinishCheck {
    finishCheckEpoch &+= 1
    return FinishCheck(generation: enqueueGeneration, epoch: finishCheckEpoch)
  }

  /// The store held no waiting and no running job during `check`. Returns the waiters to release
  /// and whether to publish `.finished`; nothing when this instance added work since the check
  /// began or holds work.
  ///
  /// - Parameter publish: whether this queue publishes `.finished` at all (a queue whose delegate
  ///   is gone releases waiters but publishes nothing).
  mutating func finishConfirmed(_ check: FinishCheck, publish: Bool = true) -> (
    waiters: [UUID], publish: Bool
  ) {
    guard check.generation == enqueueGeneration, holdsNothing else { return ([], false) }
    let released = finishWaiters.filter { $0.value < check.epoch }.map(\.key)
    for token in released { finishWaiters[token] = nil }
    guard publish else { return (released, false) }
    let news = !reportedFinished
    reportedFinished = true
    return (released, news)
  }

  /// The store showed unfinished work: the next "finished" is news again.
  mutating func sawWork() { reportedFinished = false }
}
