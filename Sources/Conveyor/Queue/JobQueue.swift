import Foundation
import Synchronization

/// A durable queue of `Codable` jobs: committed before ``add(_:priority:delay:)`` returns, retried
/// by policy, paused and resumed, and handed out again when a worker dies (at-least-once, with
/// leases).
///
/// ```swift
/// struct Email: Queueable { var to: String; var body: String }
///
/// let store = try SQLiteJobStore(path: "outbox.sqlite")
/// let queue = try JobQueue<Email>(
///   configuration: .init(identifier: "emails", maxAttempts: 5), store: store
/// ) { email, context in
///   try await mailer.send(email)  // a thrown error retries by policy
///   return .handled
/// }
/// try await queue.add(Email(to: "ada@example.com", body: "Hello"))
/// ```
///
/// ## Semantics
/// - A job is claimed under a lease, heartbeated while its handler runs, and deleted when handled.
///   If the worker vanishes, the job is handed out again after ``JobQueueConfiguration/leaseDuration``,
///   so a handler may see a job more than once: make handlers idempotent.
/// - Ready jobs run by priority (higher first), then run date, then arrival. A job waiting for its
///   retry never blocks a ready one. With `concurrency` 1, jobs of equal priority run in FIFO order.
/// - ``pause()`` is stored: every worker on the same store stops claiming; running handlers finish.
/// - An item that no longer decodes (its type changed) becomes a dead job carrying the decode
///   error; the queue goes on.
/// - The queue keeps itself alive while started; call ``shutdown(gracePeriod:)`` to stop it.
public final class JobQueue<Item: Queueable>: Sendable {
  /// An async handler: returns what to do with the job; a thrown error means retry by policy.
  public typealias Handler = @Sendable (Item, JobContext) async throws -> JobResult

  /// The queue's settings.
  public let configuration: JobQueueConfiguration
  /// The store holding the queue's jobs.
  public let store: any JobStore

  private let handler: Handler?
  /// The delegate form's delegate (held weakly inside); nil for the closure form.
  private let delegateBox: DelegateBox?
  private let core = Mutex(QueueCore())
  private let encoder = JSONEncoder()
  private let decoder = JSONDecoder()
  private let wake: WakeSignal
  private let owner: String
  private var identifier: String { configuration.identifier }
  private var clock: any JobClock { configuration.clock }

  /// Creates a queue whose jobs an async closure handles.
  ///
  /// - Parameters:
  ///   - configuration: the settings; validated here.
  ///   - store: where jobs live, e.g. `SQLiteJobStore` or ``InMemoryJobStore``.
  ///   - handler: called for each job with the decoded item; return ``JobResult/handled``,
  ///     ``JobResult/retry``, ``JobResult/retry(after:reason:)`` or ``JobResult/discard(reason:)``.
  /// - Throws: ``JobQueueError`` when the configuration is invalid.
  public init(
    configuration: JobQueueConfiguration, store: any JobStore, handler: @escaping Handler
  ) throws(JobQueueError) {
    try configuration.validate()
    self.configuration = configuration
    self.store = store
    self.handler = handler
    self.delegateBox = nil
    self.wake = WakeSignal(clock: configuration.clock)
    self.owner = Self.makeOwnerID()
    if configuration.autoStart { start() }
  }

  /// Creates a queue whose jobs a delegate handles (the seed library's shape).
  ///
  /// The queue holds the delegate weakly; while it is gone, no job is claimed.
  public init<Delegate: JobQueueDelegate>(
    configuration: JobQueueConfiguration, store: any JobStore, delegate: Delegate
  ) throws(JobQueueError) where Delegate.Item == Item {
    try configuration.validate()
    self.configuration = configuration
    self.store = store
    self.handler = nil
    self.delegateBox = DelegateBox(delegate)
    self.wake = WakeSignal(clock: configuration.clock)
    self.owner = Self.makeOwnerID()
    if configuration.autoStart { start() }
  }

  // MARK: Adding

  /// Commits an item as a new job; returns after the store committed it.
  ///
  /// - Parameters:
  ///   - item: the item; encoded as JSON.
  ///   - priority: higher runs first among ready jobs. Default 0.
  ///   - delay: the job is not handed out before this much time has passed.
  /// - Returns: the job's ID, or the ID of the pending or running job with the same
  ///   ``Queueable/deduplicationKey``.
  @discardableResult
  public func add(_ item: Item, priority: Int = 0, delay: Duration = .zero) async throws -> JobID {
    try await add(contentsOf: [item], priority: priority, delay: delay)[0]
  }

  /// Commits an item to run at a date.
  @discardableResult
  public func add(_ item: Item, priority: Int = 0, runAt date: Date) async throws -> JobID {
    try await commit(newJobs([item], priority: priority, runAt: date))[0]
  }

  /// Commits several items in one transaction: all are stored or none.
  ///
  /// - Returns: one ID per item, in order.
  @discardableResult
  public func add<Items: Sequence<Item>>(
    contentsOf items: Items, priority: Int = 0, delay: Duration = .zero
  ) async throws -> [JobID] {
    let jobs = try newJobs(items, priority: priority, runAt: clock.now().adding(delay))
    if jobs.isEmpty { return [] }
    return try await commit(jobs)
  }

  private func newJobs<Items: Sequence<Item>>(_ items: Items, priority: Int, runAt: Date) throws -> [NewJob] {
    try items.map { item in
      NewJob(
        payload: try encode(item), priority: priority, runAt: runAt, deduplicationKey: item.deduplicationKey)
    }
  }

  private func commit(_ jobs: [NewJob]) async throws -> [JobID] {
    let results = try await store.enqueue(jobs, queue: identifier, now: clock.now())
    let subscribers = core.withLock { core in
      core.noteNewWork()
      return core.subscribers.isEmpty ? [] : Array(core.subscribers.values)
    }
    for result in results where result.inserted {
      for subscriber in subscribers { subscriber.yield(.enqueued(result.id)) }
    }
    wake.signal()
    return results.map { $0.id }
  }

  private func encode(_ item: Item) throws(JobQueueError) -> Data {
    do {
      return try encoder.encode(item)
    } catch {
      throw .encodingFailed(String(describing: error))
    }
  }

  // MARK: Control

  /// Starts claiming and handling jobs; does nothing if already started.
  ///
  /// With ``JobQueueConfiguration/autoStart`` (the default) the queue starts on creation.
  public func start() {
    let started = core.withLock { core -> Bool in
      guard core.loop == nil else { return false }
      core.running = true
      core.stopping = false
      core.loop = Task { await self.runLoop() }
      return true
    }
    if started {
      log(.info, "queue started")
      publishState()
    }
  }

  /// Stops claiming new jobs on every worker of the store; running handlers finish.
  ///
  /// The flag is stored, so it survives restarts until ``resume()``.
  public func pause() async throws {
    try await store.setPaused(true, queue: identifier)
    core.withLock { $0.paused = true }
    log(.info, "queue paused")
    publishState()
  }

  /// Clears the stored pause flag and wakes the queue.
  public func resume() async throws {
    try await store.setPaused(false, queue: identifier)
    core.withLock { $0.paused = false }
    log(.info, "queue resumed")
    publishState()
    wake.signal()
  }

  /// Stops the queue: no new claims, running handlers get `gracePeriod` to finish, then their tasks
  /// are cancelled (at once if the calling task is cancelled). Jobs claimed but not started are
  /// given back; a handler that throws after the cancellation has its job retried at once (the
  /// attempt counts). Returns when the queue has stopped, which means after every handler
  /// returned: a handler that ignores cancellation is waited for.
  ///
  /// The grace period is measured in real time, whatever the configured clock. Event streams do
  /// not end (the queue may be started again): stop reading at `.stateChanged(.stopped)`.
  public func shutdown(gracePeriod: Duration = .seconds(30)) async {
    let loop = core.withLock { core -> Task<Void, Never>? in
      core.stopping = true
      return core.loop
    }
    wake.signal()
    guard let loop else { return }
    await withTaskGroup(of: Void.self) { group in
      group.addTask { await loop.value }
      group.addTask {
        // Ends early when the loop stopped first (then cancelling it does nothing) or when the
        // caller is cancelled (then the handlers are cancelled at once).
        do { try await Task.sleep(for: gracePeriod) } catch {}
        loop.cancel()
      }
      await group.next()
      group.cancelAll()
    }
    await loop.value
  }

  /// What the queue is doing now.
  public var state: JobQueueState { core.withLock { $0.state } }

  /// Whether ``shutdown(gracePeriod:)`` has begun (for tests that must act after it has).
  var isStopping: Bool { core.withLock { $0.stopping } }

  /// How many jobs the queue holds, by status.
  public func count() async throws -> JobCounts {
    try await store.counts(queue: identifier, now: clock.now())
  }

  /// Lists the queue's jobs in ID order, a page at a time.
  ///
  /// - Parameters:
  ///   - status: only jobs with this status; nil for all.
  ///   - after: only jobs with a greater ID (pass the last ID of the previous page).
  ///   - limit: the page size.
  public func jobs(in status: JobStatus? = nil, after: JobID? = nil, limit: Int = 100) async throws
    -> [JobRecord]
  {
    try await store.jobs(queue: identifier, status: status, after: after, limit: limit)
  }

  /// Decodes a listed job's item.
  public func item(of record: JobRecord) throws -> Item {
    try decoder.decode(Item.self, from: record.payload)
  }

  /// Deletes jobs whatever their status; returns how many existed. A running job's handler is not
  /// interrupted, but its outcome is then ignored.
  @discardableResult
  public func remove(_ ids: [JobID]) async throws -> Int {
    try await store.remove(ids, queue: identifier)
  }

  /// Deletes a job; returns whether it existed.
  @discardableResult
  public func remove(_ id: JobID) async throws -> Bool {
    try await remove([id]) == 1
  }

  /// Deletes every pending and dead job (running ones finish and are deleted if handled); returns
  /// how many were deleted.
  @discardableResult
  public func clear() async throws -> Int {
    try await store.clear(queue: identifier, statuses: [.pending, .dead])
  }

  /// Makes dead jobs pending again with their attempts reset; nil re-queues every dead job.
  ///
  /// Returns how many were re-queued. A dead job whose deduplication key is held by a waiting or
  /// running job stays dead, so the same work is not queued twice (see
  /// ``JobStore/requeueDead(_:queue:now:)``).
  @discardableResult
  public func requeueDead(_ ids: [JobID]? = nil) async throws -> Int {
    let count = try await store.requeueDead(ids, queue: identifier, now: clock.now())
    if count > 0 {
      core.withLock { $0.noteNewWork() }
      wake.signal()
    }
    return count
  }

  /// Deletes dead jobs; returns how many.
  @discardableResult
  public func purgeDead() async throws -> Int {
    try await store.clear(queue: identifier, statuses: [.dead])
  }

  /// Returns when the queue has no pending or running job left (dead jobs do not count), or when
  /// the calling task is cancelled.
  ///
  /// The queue must be started and not paused for jobs to finish: on a stopped or paused queue
  /// this waits until it is started or resumed and its jobs are done (cancel the task to stop
  /// waiting).
  public func waitUntilFinished() async {
    let token = UUID()
    await withTaskCancellationHandler {
      await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
        let done = core.withLock { core -> Bool in
          if core.reportedFinished || Task.isCancelled { return true }
          core.finishWaiters[token] = continuation
          return false
        }
        if done { continuation.resume() } else { wake.signal() }
      }
    } onCancel: {
      core.withLock { $0.finishWaiters.removeValue(forKey: token) }?.resume()
    }
  }

  /// What happens in the queue, as it happens. Each access starts a new subscription that receives
  /// events from then on; consume it, or let it go (events are buffered until read).
  public var events: AsyncStream<JobQueueEvent> {
    let (stream, continuation) = AsyncStream.makeStream(of: JobQueueEvent.self)
    let token = UUID()
    core.withLock { $0.subscribers[token] = continuation }
    continuation.onTermination = { [weak self] _ in
      _ = self?.core.withLock { $0.subscribers.removeValue(forKey: token) }
    }
    return stream
  }

  // MARK: The worker loop

  private func runLoop() async {
    var timing = LoopTiming(now: clock.now())
    var failures = 0
    await withTaskGroup(of: Void.self) { group in
      while !Task.isCancelled {
        let hasHandler = handlerAvailable
        let now = clock.now()
        do {
          // Before taking outcomes out of the shared state, so a failure here loses none.
          try await maintainLeases(timing: &timing, now: now)
          guard let step = core.withLock({ $0.takeStep(configuration: configuration) }) else { break }
          // The store's pause flag is the authority (another process may have set or cleared
          // it), so a paused queue still asks; the store then claims nothing.
          let canClaim = !step.stop && hasHandler && step.buffered == 0
          let limit = canClaim ? step.freeSlots + configuration.prefetch : 0
          var claimedAny = false
          var paused = step.paused
          if !step.settlements.isEmpty || limit > 0 || step.paused {
            let batch = try await settleAndClaim(step.settlements, limit: limit, now: now)
            claimedAny = !batch.claimed.isEmpty
            paused = batch.paused
            if batch.paused != step.paused {
              core.withLock { $0.paused = batch.paused }
              publishState()
            }
          }
          failures = 0
          startHandlers(in: &group)
          let (idle, free) = core.withLock { core in
            (
              core.workers == 0 && core.buffer.isEmpty && core.settlements.isEmpty,
              core.freeSlots(configuration)
            )
          }
          if claimedAny && free > 0 && !step.stop { continue }  // more may be ready: claim again
          var deadline = timing.nextMaintenance(holding: !idle)
          if paused {
            // Look again for the flag being cleared, by this or another process.
            deadline = min(deadline, now.adding(configuration.pollInterval))
          } else if idle && !step.stop {
            if let next = try await store.nextWakeDate(queue: identifier) {
              // No pending and no running job has no next wake date: that is "finished", found
              // with an index seek rather than a count of every job.
              deadline = min(deadline, next, now.adding(configuration.pollInterval))
            } else {
              if hasHandler { reportFinished(generation: step.generation) }
              deadline = min(deadline, now.adding(configuration.pollInterval))
            }
          }
          await wake.wait(until: deadline)
        } catch {
          failures += 1
          let backoff = Duration.milliseconds(min(5_000, 50 << min(failures, 7)))
          log(.warning, "store error, retrying in \(backoff): \(error)", ["failures": String(failures)])
          await wake.wait(until: clock.now().adding(backoff))
        }
      }
      // Cancelled after the grace period: handlers were cancelled with the loop; wait for them.
      await group.waitForAll()
    }
    await finalFlush()
    wake.disarm()
    core.withLock { core in
      core.loop = nil
      core.running = false
    }
    log(.info, "queue stopped")
    publishState()
  }

  /// Heartbeats held jobs, then rescues expired leases, when their times come. Heartbeats go
  /// first so that a worker that was slow to get here never rescues (and runs again) its own jobs.
  private func maintainLeases(timing: inout LoopTiming, now: Date) async throws {
    if now >= timing.nextHeartbeat {
      try await heartbeat(now: now)
      timing.nextHeartbeat = now.adding(configuration.leaseDuration / 3)
    }
    if now >= timing.nextRescue {
      let rescued = try await store.rescueExpiredLeases(queue: identifier, now: now)
      if rescued > 0 { log(.warning, "handed out \(rescued) job(s) whose worker stopped heart-beating") }
      timing.nextRescue = now.adding(configuration.leaseDuration / 2)
    }
  }

  /// Extends the lease on every job this worker holds; drops waiting jobs whose lease is gone.
  private func heartbeat(now: Date) async throws {
    // Jobs being handled, claimed jobs waiting for a slot, and handled jobs whose outcome is not
    // recorded yet: all are still this worker's until their outcome is stored.
    let held = core.withLock { core in
      Array(core.inFlight) + core.buffer.ids + core.settlements.map { $0.settlement.id }
    }
    guard !held.isEmpty else { return }
    let lease = Lease(owner: owner, expiresAt: now.adding(configuration.leaseDuration))
    let kept = Set(try await store.heartbeat(held, queue: identifier, lease: lease))
    let lost = Set(held.filter { !kept.contains($0) })
    guard !lost.isEmpty else { return }
    // A waiting job whose lease is gone (removed, or handed to another worker) must not start.
    core.withLock { $0.buffer.removeAll { lost.contains($0.id) } }
    for id in lost {
      log(.warning, "lost the lease on a job; another worker may run it", ["job": id.description])
    }
  }

  private func settleAndClaim(_ pending: [PendingSettlement], limit: Int, now: Date) async throws
    -> ClaimBatch
  {
    let lease = Lease(owner: owner, expiresAt: now.adding(configuration.leaseDuration))
    let batch: ClaimBatch
    do {
      batch = try await store.settleAndClaim(
        pending.map { $0.settlement }, queue: identifier, limit: limit, lease: lease, now: now)
    } catch {
      core.withLock { $0.settlements.insert(contentsOf: pending, at: 0) }
      throw error
    }
    let stale = batch.staleSettlements.isEmpty ? [] : Set(batch.staleSettlements)
    let subscribers = core.withLock { core in
      core.buffer.append(batch.claimed)
      if !batch.claimed.isEmpty { core.reportedFinished = false }
      return Array(core.subscribers.values)
    }
    for item in pending {
      if stale.contains(item.settlement.id) {
        log(
          .warning, "a job's outcome was not recorded: it was removed or its lease passed to another worker",
          ["job": item.settlement.id.description])
        continue
      }
      if let event = item.event { for subscriber in subscribers { subscriber.yield(event) } }
    }
    return batch
  }

  /// Starts a worker task for each free slot that has a claimed job waiting.
  private func startHandlers(in group: inout TaskGroup<Void>) {
    let jobs = core.withLock { core -> [JobRecord] in
      var taken: [JobRecord] = []
      while core.workers < configuration.concurrency, !core.stopping, !core.paused,
        let job = core.buffer.popFirst()
      {
        core.inFlight.insert(job.id)
        core.workers += 1
        taken.append(job)
      }
      return taken
    }
    guard !jobs.isEmpty else { return }
    publishState()
    for job in jobs {
      group.addTask { await self.work(startingWith: job) }
    }
  }

  /// A worker: handles a job, then the next claimed one, and when none is left records its
  /// outcomes and claims its next job itself in one store call, so a busy queue needs neither a
  /// task per job nor a round trip through the loop. It ends when nothing is ready.
  private func work(startingWith first: JobRecord) async {
    var next: JobRecord? = first
    while let record = next {
      let pending = await process(record)
      let canClaim = handlerAvailable
      let step = core.withLock { core -> WorkerStep in
        core.inFlight.remove(record.id)
        core.settlements.append(pending)
        if !core.stopping, !core.paused, let job = core.buffer.popFirst() {
          core.inFlight.insert(job.id)
          return .run(job, flush: core.settlements.count >= max(1, configuration.prefetch))
        }
        guard !core.stopping, !core.paused, canClaim else { return .exit }
        defer { core.settlements = [] }
        return .claim(core.settlements)
      }
      switch step {
      case .run(let job, let flush):
        next = job
        if flush { wake.signal() }
      case .exit:
        next = nil
      case .claim(let settlements):
        do {
          let batch = try await settleAndClaim(
            settlements, limit: 1 + configuration.prefetch, now: clock.now())
          if batch.paused {
            core.withLock { $0.paused = true }
            publishState()
          }
        } catch {
          log(.warning, "store error while claiming; the queue will retry: \(error)")
        }
        next = core.withLock { core -> JobRecord? in
          guard !core.stopping, !core.paused, let job = core.buffer.popFirst() else { return nil }
          core.inFlight.insert(job.id)
          return job
        }
      }
    }
    core.withLock { $0.workers -= 1 }
    publishState()
    wake.signal()
  }

  /// Whether a handler exists to run jobs: always for the closure form; while the delegate lives
  /// for the delegate form.
  private var handlerAvailable: Bool {
    handler != nil || delegateBox?.isAlive() == true
  }

  private func process(_ record: JobRecord) async -> PendingSettlement {
    emit(.started(record.id, attempt: record.attempts))
    // A claim counts an attempt before the handler runs, so a job past the limit here had a worker
    // that died during its last allowed attempt (a crash, a kill, an out-of-memory): dead, or a
    // job that crashes its worker would be handed out forever.
    if let max = configuration.maxAttempts, record.attempts > max {
      return settlement(for: record, outcome: .abandoned(limit: max))
    }
    let item: Item
    do {
      item = try decoder.decode(Item.self, from: record.payload)
    } catch {
      return settlement(for: record, outcome: .undecodable(String(describing: error)))
    }
    let context = JobContext(
      id: record.id, queue: identifier, attempts: record.attempts, createdAt: record.createdAt,
      lastError: record.lastError)
    do {
      return settlement(for: record, outcome: .result(try await handle(item, context)))
    } catch {
      return settlement(for: record, outcome: .thrown(error))
    }
  }

  private func handle(_ item: Item, _ context: JobContext) async throws -> JobResult {
    if let handler { return try await handler(item, context) }
    guard let delegate = delegateBox?.handle else {
      return .retry(after: .zero, reason: "the queue's delegate was released")
    }
    return try await delegate(self, item, context.attempts)
  }

  private func settlement(for record: JobRecord, outcome: Outcome) -> PendingSettlement {
    let now = clock.now()
    func done(_ action: JobSettlement.Action, _ event: JobQueueEvent) -> PendingSettlement {
      PendingSettlement(settlement: JobSettlement(id: record.id, owner: owner, action: action), event: event)
    }
    func retry(after delay: Duration?, reason: String?) -> PendingSettlement {
      if let max = configuration.maxAttempts, record.attempts >= max {
        let why = "gave up after \(record.attempts) attempt(s)" + (reason.map { ": \($0)" } ?? "")
        log(.error, "job is dead", ["job": record.id.description, "reason": why])
        return done(.kill(error: why), .died(record.id, reason: why))
      }
      let date = now.adding(delay ?? configuration.retryPolicy.delay(afterAttempt: record.attempts))
      log(.info, "job will be retried", ["job": record.id.description, "attempt": String(record.attempts)])
      return done(.retry(at: date, error: reason), .retryScheduled(record.id, at: date, error: reason))
    }
    switch outcome {
    case .abandoned(let limit):
      let why =
        "gave up after \(limit) attempt(s): the worker stopped (crashed or was killed) during the last one"
      log(.error, "job is dead", ["job": record.id.description, "reason": "worker lost"])
      return done(.kill(error: why), .died(record.id, reason: why))
    case .undecodable(let message):
      let why = "undecodable payload (did the item type change?): \(message)"
      log(.error, "job is dead", ["job": record.id.description, "reason": "undecodable payload"])
      return done(.kill(error: why), .died(record.id, reason: why))
    case .thrown(let error):
      if Task.isCancelled && core.withLock({ $0.stopping }) {
        return done(
          .retry(at: now, error: "interrupted by shutdown"),
          .retryScheduled(record.id, at: now, error: "interrupted by shutdown"))
      }
      return retry(after: nil, reason: String(describing: error))
    case .result(let result):
      switch result.kind {
      case .handled:
        return done(.complete, .succeeded(record.id))
      case .retry(let delay, let reason):
        return retry(after: delay, reason: reason ?? "handler asked to retry")
      case .discard(let reason):
        log(.warning, "job discarded", ["job": record.id.description])
        return done(.kill(error: reason), .died(record.id, reason: reason))
      }
    }
  }

  /// Marks the queue finished (the store holds no pending or running job) and tells everyone
  /// waiting, unless a job was added since `generation` was read or it was already reported.
  private func reportFinished(generation: UInt64) {
    let notify = core.withLock { core -> FinishNotification? in
      guard core.enqueueGeneration == generation, !core.reportedFinished else { return nil }
      core.reportedFinished = true
      defer { core.finishWaiters = [:] }
      return FinishNotification(
        waiters: Array(core.finishWaiters.values), subscribers: Array(core.subscribers.values))
    }
    guard let notify else { return }
    log(.debug, "queue finished")
    for subscriber in notify.subscribers { subscriber.yield(.finished) }
    delegateBox?.finished(self)
    for waiter in notify.waiters { waiter.resume() }
  }

  /// Records outstanding outcomes and gives back claimed jobs that never started.
  private func finalFlush() async {
    let (pending, buffered) = core.withLock { core in
      defer {
        core.settlements = []
        core.buffer = JobBuffer()
      }
      return (core.settlements, core.buffer.all)
    }
    let owner = self.owner
    let releases = buffered.map {
      PendingSettlement(settlement: JobSettlement(id: $0.id, owner: owner, action: .release), event: nil)
    }
    guard !(pending + releases).isEmpty else { return }
    let now = clock.now()
    // An unstructured task: the loop may be cancelled, the flush must still run. The shared
    // settle-and-claim reports only outcomes the store accepted, and keeps them on failure.
    let flush = Task { try await self.settleAndClaim(pending + releases, limit: 0, now: now) }
    do {
      _ = try await flush.value
    } catch {
      log(
        .error, "could not record outcomes at shutdown; the jobs will run again after their lease: \(error)")
    }
  }

  // MARK: Events, state, logging

  private func emit(_ event: JobQueueEvent) {
    let subscribers = core.withLock { Array($0.subscribers.values) }
    for subscriber in subscribers { subscriber.yield(event) }
  }

  private func publishState() {
    let (changed, subscribers) = core.withLock {
      core -> (JobQueueState?, [AsyncStream<JobQueueEvent>.Continuation]) in
      let state = core.computedState
      guard state != core.state else { return (nil, []) }
      core.state = state
      return (state, Array(core.subscribers.values))
    }
    if let changed { for subscriber in subscribers { subscriber.yield(.stateChanged(changed)) } }
  }

  private func log(_ level: LogRecord.Level, _ message: String, _ metadata: [String: String] = [:]) {
    guard let sink = configuration.log else { return }
    var fields = metadata
    fields["queue"] = identifier
    sink(LogRecord(level: level, message: message, metadata: fields))
  }

  private static func makeOwnerID() -> String {
    let host = ProcessInfo.processInfo.hostName
    let pid = ProcessInfo.processInfo.processIdentifier
    return "\(host):\(pid):\(UUID().uuidString.prefix(8))"
  }
}

extension JobQueue {
  /// The delegate, held weakly, with its calls bound to the concrete type.
  fileprivate final class DelegateBox: Sendable {
    let handle: @Sendable (JobQueue<Item>, Item, Int) async throws -> JobResult
    let finished: @Sendable (JobQueue<Item>) -> Void
    let isAlive: @Sendable () -> Bool

    init<Delegate: JobQueueDelegate>(_ delegate: Delegate) where Delegate.Item == Item {
      handle = { [weak delegate] queue, item, attempts in
        guard let delegate else { return .retry(after: .zero, reason: "the queue's delegate was released") }
        // The task's cancellation (at the end of a shutdown's grace period) throws, as a closure
        // handler's would, and goes through the same shutdown rule; a later completion is ignored.
        return try await awaitCallback { done in
          delegate.queue(queue, handle: item, attempts: attempts) { done(.success($0)) }
        }
      }
      finished = { [weak delegate] queue in delegate?.queueFinished(queue) }
      isAlive = { [weak delegate] in delegate != nil }
    }
  }
}

// MARK: - Internal state
//
// Declared outside the generic `JobQueue<Item>`: types nested in a generic class are generic too,
// and the run-time metadata lookups for them showed up on every job in profiles.

private struct PendingSettlement: Sendable {
  var settlement: JobSettlement
  var event: JobQueueEvent?
}

/// What the loop needs for one turn, taken under the lock.
private struct Step {
  var stop: Bool
  var paused: Bool
  var buffered: Int
  var freeSlots: Int
  var settlements: [PendingSettlement]
  var generation: UInt64
}

/// Claimed jobs waiting for a free slot, first in first out.
private struct JobBuffer: Sendable {
  private var storage: [JobRecord] = []
  private var head = 0

  var isEmpty: Bool { head == storage.count }
  var count: Int { storage.count - head }
  var ids: [JobID] { storage[head...].map { $0.id } }
  var all: [JobRecord] { Array(storage[head...]) }

  mutating func append(_ jobs: [JobRecord]) {
    if head > 0 && head == storage.count {
      storage.removeAll(keepingCapacity: true)
      head = 0
    }
    storage.append(contentsOf: jobs)
  }

  mutating func removeAll(where shouldRemove: (JobRecord) -> Bool) {
    storage = storage[head...].filter { !shouldRemove($0) }
    head = 0
  }

  mutating func popFirst() -> JobRecord? {
    guard head < storage.count else { return nil }
    defer { head += 1 }
    return storage[head]
  }
}

private enum WorkerStep {
  /// Handle the next buffered job; `flush` asks the loop to record the outcomes so far.
  case run(JobRecord, flush: Bool)
  case claim([PendingSettlement])
  case exit
}

/// How a handler call ended.
private enum Outcome {
  case result(JobResult)
  case thrown(any Error)
  case undecodable(String)
  case abandoned(limit: Int)
}

private struct FinishNotification {
  var waiters: [CheckedContinuation<Void, Never>]
  var subscribers: [AsyncStream<JobQueueEvent>.Continuation]
}

private struct LoopTiming {
  var nextRescue: Date
  var nextHeartbeat: Date

  init(now: Date) {
    nextRescue = now
    nextHeartbeat = now
  }

  func nextMaintenance(holding: Bool) -> Date {
    holding ? min(nextRescue, nextHeartbeat) : nextRescue
  }
}

private struct QueueCore: Sendable {
  var loop: Task<Void, Never>?
  var running = false
  var stopping = false
  var paused = false
  var state = JobQueueState.stopped
  /// Jobs being handled, for heartbeats.
  var inFlight: Set<JobID> = []
  /// Worker tasks running; each holds one of the `concurrency` slots.
  var workers = 0
  var buffer = JobBuffer()
  var settlements: [PendingSettlement] = []
  var subscribers: [UUID: AsyncStream<JobQueueEvent>.Continuation] = [:]
  var finishWaiters: [UUID: CheckedContinuation<Void, Never>] = [:]
  var reportedFinished = false
  var enqueueGeneration: UInt64 = 0

  var computedState: JobQueueState {
    if !running { return .stopped }
    if paused { return .paused }
    return workers == 0 ? .idle : .running
  }

  /// Jobs were added or re-queued: whoever waits for "finished" must look again.
  mutating func noteNewWork() {
    enqueueGeneration &+= 1
    reportedFinished = false
  }

  func freeSlots(_ configuration: JobQueueConfiguration) -> Int {
    max(0, configuration.concurrency - workers)
  }

  /// Takes what the loop needs for one turn, including every outcome not yet recorded; nil when
  /// the loop should end (stopping with no worker running).
  mutating func takeStep(configuration: JobQueueConfiguration) -> Step? {
    if stopping && workers == 0 { return nil }
    defer { settlements = [] }
    return Step(
      stop: stopping, paused: paused, buffered: buffer.count, freeSlots: freeSlots(configuration),
      settlements: settlements, generation: enqueueGeneration)
  }
}

/// Handles a queue's jobs through callbacks: the seed library's delegate shape.
///
/// ```swift
/// final class Uploader: JobQueueDelegate {
///   func queue(_ queue: JobQueue<Upload>, handle item: Upload, attempts: Int,
///              completion: @escaping @Sendable (JobResult) -> Void) {
///     upload(item) { ok in completion(ok ? .handled : .retry) }
///   }
///   func queueFinished(_ queue: JobQueue<Upload>) { print("all uploaded") }
/// }
/// ```
public protocol JobQueueDelegate<Item>: AnyObject, Sendable {
  /// The queue's item type.
  associatedtype Item: Queueable

  /// Handles one job; call `completion` exactly once (later calls are ignored). `attempts` is 1
  /// the first time.
  func queue(
    _ queue: JobQueue<Item>, handle item: Item, attempts: Int,
    completion: @escaping @Sendable (JobResult) -> Void)

  /// Called when no pending or running job is left.
  func queueFinished(_ queue: JobQueue<Item>)
}

extension JobQueueDelegate {
  /// Does nothing.
  public func queueFinished(_ queue: JobQueue<Item>) {}
}
