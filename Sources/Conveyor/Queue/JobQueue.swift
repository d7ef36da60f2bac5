import Foundation
import Synchronization

/// A durable queue of `Codable` jobs: committed before ``add(_:priority:delay:timeLimit:)`` returns, retried
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
///   retry never blocks a ready one, and a job retried with no delay runs after every job that was
///   ready when it was retried (A1, B1, C1, A2). With `concurrency` 1, jobs of equal priority run
///   in FIFO order. A queue that starts first gives back the jobs whose worker vanished (their
///   lease lapsed), so they run in their old places, before jobs added after them.
/// - A handler never starts on a claim whose lease may have lapsed: a claim answered so late (a
///   stalled machine or store), or a claimed job that waited so long, that less than a third of
///   the lease is surely left is handed back unstarted, its attempt not counted.
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

  let handler: Handler?
  /// The delegate form's delegate (held weakly inside); nil for the closure form.
  let delegateBox: DelegateBox?
  let core: Mutex<QueueCore>
  /// How many subscribers `core` holds, written under its lock; read without it by `emit`.
  let subscriberCount = Atomic<Int>(0)
  let encoder = JSONEncoder()
  let decoder = JSONDecoder()
  let wake: WakeSignal
  let owner: String
  /// Activity counts not yet given to the store (see `QueueActivity.swift`).
  let activityTally = ActivityTally()
  var identifier: String { configuration.identifier }
  var clock: any JobClock { configuration.clock }
  var lease: Lease { Lease(owner: owner, duration: configuration.leaseDuration) }

  /// Creates a queue whose jobs an async closure handles.
  ///
  /// - Parameters:
  ///   - configuration: the settings; validated here (against the store's lock wait too).
  ///   - store: where jobs live, e.g. `SQLiteJobStore` or ``InMemoryJobStore``.
  ///   - handler: called for each job with the decoded item; return ``JobResult/handled``,
  ///     ``JobResult/retry``, ``JobResult/retry(after:reason:)`` or ``JobResult/discard(reason:)``.
  /// - Throws: ``JobQueueError`` when the configuration is invalid.
  public init(
    configuration: JobQueueConfiguration, store: any JobStore, handler: @escaping Handler
  ) throws(JobQueueError) {
    try configuration.validate(for: store)
    self.configuration = configuration
    self.store = store
    self.handler = handler
    self.delegateBox = nil
    self.wake = WakeSignal(clock: configuration.clock, executor: configuration.runtime.executor)
    self.owner = Self.makeOwnerID()
    self.core = Mutex(QueueCore(configuration))
    if configuration.autoStart { start() }
  }

  /// Creates a queue whose jobs a delegate handles (the seed library's shape).
  ///
  /// The queue holds the delegate weakly; while it is gone, no job is claimed, and a job whose
  /// handler would have run is given back without using an attempt.
  public init<Delegate: JobQueueDelegate>(
    configuration: JobQueueConfiguration, store: any JobStore, delegate: Delegate
  ) throws(JobQueueError) where Delegate.Item == Item {
    try configuration.validate(for: store)
    self.configuration = configuration
    self.store = store
    self.handler = nil
    self.delegateBox = DelegateBox(delegate)
    self.wake = WakeSignal(clock: configuration.clock, executor: configuration.runtime.executor)
    self.owner = Self.makeOwnerID()
    self.core = Mutex(QueueCore(configuration))
    if configuration.autoStart { start() }
  }

  // MARK: Adding

  /// Commits an item as a new job; returns after the store committed it.
  ///
  /// - Parameters:
  ///   - item: the item; encoded as JSON.
  ///   - priority: higher runs first among ready jobs. Default 0.
  ///   - delay: the job is not handed out before this much time has passed (negative counts as
  ///     zero; more than 100 years counts as 100 years).
  ///   - timeLimit: the longest one attempt of this job may run, instead of the queue's
  ///     ``JobQueueConfiguration/timeLimit``; nil (the default): the queue's. Between 1 ms and 7
  ///     days, kept in whole milliseconds.
  /// - Returns: the job's ID and what was done. When a *waiting* job already has the item's
  ///   ``Queueable/deduplicationKey``, nothing is stored and that job's ID comes back with
  ///   `outcome` `.existing`. A job that is already running does not count: it may have read old
  ///   data, so the new item is stored and runs after it. The item's
  ///   ``Queueable/deduplicationScope`` widens which jobs count, and its ``Queueable/onConflict``
  ///   `.replace` gives a waiting job the new payload, priority, delay and time limit (`.replaced`).
  /// - Throws: ``JobQueueError/invalidTimeLimit(_:)`` for a time limit out of range;
  ///   ``JobQueueError/invalidDeduplication(_:)`` for a ``DeduplicationScope/completedWithin(_:)``
  ///   period out of range or longer than the queue's ``JobRetention/completed``.
  @discardableResult
  public func add(_ item: Item, priority: Int = 0, delay: Duration = .zero, timeLimit: Duration? = nil)
    async throws -> EnqueueResult
  {
    try await add(contentsOf: [item], priority: priority, delay: delay, timeLimit: timeLimit)[0]
  }

  /// Commits an item to run at a date (a date already past runs at once).
  ///
  /// - Throws: ``JobQueueError/invalidSchedule(_:)`` for a date that is not finite;
  ///   ``JobQueueError/invalidTimeLimit(_:)`` for a time limit out of range (see
  ///   ``add(_:priority:delay:timeLimit:)``).
  @discardableResult
  public func add(_ item: Item, priority: Int = 0, runAt date: Date, timeLimit: Duration? = nil) async throws
    -> EnqueueResult
  {
    guard date.timeIntervalSince1970.isFinite else {
      // Not `\(date)`: Foundation's description of a NaN date traps.
      throw JobQueueError.invalidSchedule(
        "the run date (\(date.timeIntervalSince1970) s since 1970) is not a finite date; "
          + "pass a real date or a delay")
    }
    return try await commit(newJobs([item], priority: priority, runTime: .at(date), timeLimit: timeLimit))[0]
  }

  /// Commits several items in one transaction: all are stored or none.
  ///
  /// - Returns: one result per item, in order (see ``add(_:priority:delay:timeLimit:)``).
  @discardableResult
  public func add<Items: Sequence<Item>>(
    contentsOf items: Items, priority: Int = 0, delay: Duration = .zero, timeLimit: Duration? = nil
  ) async throws -> [EnqueueResult] {
    let jobs = try newJobs(
      items, priority: priority, runTime: delay > .zero ? .after(delay) : .now, timeLimit: timeLimit)
    if jobs.isEmpty { return [] }
    return try await commit(jobs)
  }

  private func newJobs<Items: Sequence<Item>>(
    _ items: Items, priority: Int, runTime: RunTime, timeLimit: Duration?
  ) throws -> [NewJob] {
    if let timeLimit, let problem = JobQueueConfiguration.problem(timeLimit: timeLimit, name: "timeLimit") {
      throw JobQueueError.invalidTimeLimit(problem)
    }
    return try items.map { item in
      let key = item.deduplicationKey
      let scope = key == nil ? .waiting : item.deduplicationScope
      if let problem = problem(scope) { throw JobQueueError.invalidDeduplication(problem) }
      let orderingKey = item.orderingKey
      if let orderingKey, let problem = OrderingKey.problem(orderingKey) {
        throw JobQueueError.invalidOrderingKey(problem)
      }
      let limitKey = item.limitKey
      if let limitKey {
        if let problem = LimitKey.problem(limitKey) { throw JobQueueError.invalidLimitKey(problem) }
        if !store.keepsKeyLimits {
          throw JobQueueError.invalidLimitKey(
            "\(type(of: store)) keeps no limit keys; use a store that does (in-memory, SQLite, PostgreSQL)")
        }
      }
      let fairnessKey = item.fairnessKey
      if let fairnessKey {
        if let problem = FairnessKey.problem(fairnessKey, orderingKey: orderingKey) {
          throw JobQueueError.invalidFairnessKey(problem)
        }
        if !store.keepsFairShares {
          throw JobQueueError.invalidFairnessKey(
            "\(type(of: store)) keeps no fair shares; use a store that does (in-memory, SQLite, PostgreSQL)")
        }
      }
      return NewJob(
        payload: try encode(item), priority: priority, runTime: runTime, deduplicationKey: key,
        deduplicationScope: scope, onConflict: item.onConflict, timeLimit: timeLimit,
        orderingKey: orderingKey, limitKey: limitKey, fairnessKey: fairnessKey)
    }
  }

  /// Why this queue cannot keep `scope`, or nil: a period out of range, or one that outlives the
  /// completed jobs the queue keeps (the store could not see them).
  func problem(_ scope: DeduplicationScope) -> String? {
    if let problem = scope.problem { return problem }
    guard case .completedWithin(let period) = scope else { return nil }
    switch configuration.retention.completed {
    case .forever: return nil
    case .none:
      return "deduplicationScope \(scope) needs completed jobs kept, and the queue's "
        + "retention.completed is .none: keep them at least \(period)"
    case .for(let kept):
      return kept >= period
        ? nil
        : "deduplicationScope \(scope) outlives the queue's retention.completed (\(kept)): keep "
          + "completed jobs at least \(period), or shorten the period"
    }
  }

  private func commit(_ jobs: [NewJob]) async throws -> [EnqueueResult] {
    let results = try await store.enqueue(jobs, queue: identifier, clock: clock)
    announce(added: results.filter(\.inserted).map(\.id))
    return results
  }

  /// Tells the loop and the subscribers of jobs this queue committed (added, or fired from its
  /// schedules): new work, and an `.enqueued` event each.
  func announce(added ids: [JobID]) {
    let subscribers = core.withLock { core in
      core.state.noteNewWork()
      return core.subscribers.isEmpty ? [] : Array(core.subscribers.values)
    }
    for id in ids {
      for subscriber in subscribers { subscriber.yield(.enqueued(id)) }
    }
    wake.signal()
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
      guard core.loop == nil, core.state.start() else { return false }
      core.loop = Task(executorPreference: configuration.runtime.executor) { await self.runLoop() }
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
    core.withLock { $0.state.paused = true }
    log(.info, "queue paused")
    publishState()
    wake.signal()  // the loop hands back jobs claimed ahead
  }

  /// Clears the stored pause flag and wakes the queue.
  public func resume() async throws {
    try await store.setPaused(false, queue: identifier)
    core.withLock { $0.state.paused = false }
    log(.info, "queue resumed")
    publishState()
    wake.signal()
  }

  /// The limits stored with this queue (empty when none were set); see ``QueueLimits``.
  public func limits() async throws -> QueueLimits {
    try await store.limits(queue: identifier)
  }

  /// Stores limits every worker of this queue obeys, in every process sharing the store, from
  /// its next claim; replaces the limits stored before (pass `QueueLimits()` to remove them).
  ///
  /// ```swift
  /// try await queue.setLimits(QueueLimits(concurrency: 2))  // two at once, across all processes
  /// ```
  ///
  /// - Throws: ``JobQueueError/invalidLimits(_:)`` for limits out of range (nothing is changed),
  ///   or the store's error.
  public func setLimits(_ limits: QueueLimits) async throws {
    try limits.check()
    if limits.rate != nil, !store.keepsRateLimits {
      throw JobQueueError.invalidLimits(
        "\(type(of: store)) keeps no rate limits; use a store that does (in-memory, SQLite, PostgreSQL)")
    }
    if limits.hasKeyLimits, !store.keepsKeyLimits {
      throw JobQueueError.invalidLimits(
        "\(type(of: store)) keeps no limits per key; use a store that does (in-memory, SQLite, PostgreSQL)")
    }
    try await store.setLimits(limits, queue: identifier)
    core.withLock { $0.state.fullUntil = nil }
    log(
      .info, "queue limits set",
      [
        "concurrency": limits.concurrency.map(String.init) ?? "none",
        "rate": limits.rate.map { "\($0.perSecond)/s burst \($0.burst)" } ?? "none",
        "keyConcurrency": limits.keyConcurrency.map(String.init) ?? "none",
        "keyOverrides": String(limits.keyConcurrencyOverrides.count),
      ])
    wake.signal()  // a raised limit may free places at once
  }

  /// Stops the queue: no new claims, running handlers get `gracePeriod` to finish, then their tasks
  /// are cancelled (at once if the calling task is cancelled). Returns when the queue has stopped,
  /// which means after every handler returned: a handler that ignores cancellation is waited for.
  ///
  /// Shutdown is not a crash: jobs claimed but not started, and jobs whose handler was cancelled
  /// by the shutdown and then threw or asked for a retry, are given back ready in their old
  /// place without using up an attempt (the interruption is recorded as their last error). A
  /// handler that finishes within the grace period is recorded as usual.
  ///
  /// The grace period is measured in real time, whatever the configured clock. Event streams do
  /// not end (the queue may be started again): stop reading at `.stateChanged(.stopped)`.
  public func shutdown(gracePeriod: Duration = .seconds(30)) async {
    let loop = core.withLock { core -> Task<Void, Never>? in
      if core.state.running { core.state.stopping = true }
      return core.loop
    }
    wake.signal()
    guard let loop else { return }
    await withTaskGroup(of: Void.self) { group in
      group.addTask { await loop.value }
      group.addTask {
        // Ends early when the loop stopped first (then cancelling it does nothing) or when the
        // caller is cancelled (then the handlers are cancelled at once).
        do { try await self.configuration.runtime.sleep(gracePeriod) } catch {}
        loop.cancel()
      }
      await group.next()
      group.cancelAll()
    }
    await loop.value
  }

  /// What the queue is doing now.
  public var state: JobQueueState { core.withLock { $0.state.publishedState } }

  /// Whether ``shutdown(gracePeriod:)`` has begun (for tests that must act after it has).
  var isStopping: Bool { core.withLock { $0.state.stopping } }

  /// How many jobs the queue holds, by status.
  public func count() async throws -> JobCounts {
    try await store.counts(queue: identifier, clock: clock)
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

  /// Decodes a listed job's item, as a worker would: the same value, or the same error, as
  /// Foundation's `JSONDecoder`.
  public func item(of record: JobRecord) throws -> Item {
    try PayloadDecoder.decode(Item.self, from: record.payload, fallback: decoder)
  }

  /// The job with this ID, if it belongs to this queue: waiting, running, or finished and kept
  /// as history (``JobRetention``), with its status, attempts, errors, run time and output.
  public func job(_ id: JobID) async throws -> JobRecord? {
    guard let record = try await store.job(id), record.queue == identifier else { return nil }
    return record
  }

  /// Decodes a completed job's output (``JobResult/handled(output:)``); nil when it has none.
  ///
  /// - Throws: the decoding error when the stored JSON is not an `Output`.
  public func output<Output: Decodable>(of record: JobRecord, as type: Output.Type = Output.self) throws
    -> Output?
  {
    guard let output = record.output else { return nil }
    return try JSONDecoder().decode(Output.self, from: output)
  }

  /// Deletes jobs whatever their status; returns how many existed. A running job's handler is not
  /// interrupted, but its outcome is then ignored.
  @discardableResult
  public func remove(_ ids: [JobID]) async throws -> Int {
    try await store.remove(ids, queue: identifier)
  }

  /// Cancels jobs of this queue that have not finished; returns one result per ID, in order.
  ///
  /// A waiting job is deleted at once and never runs. A running job is deleted too, so it is not
  /// retried and its handler's outcome is ignored; its handler's task is cancelled: at once when
  /// it runs in this queue instance, otherwise when its worker next checks its claims (twice a
  /// second while it holds any), in whichever process or machine it runs. A dead job, or an ID
  /// with no job (finished and deleted, never added, or of another queue), is left as it is: see
  /// ``CancelResult``.
  @discardableResult
  public func cancel(_ ids: [JobID]) async throws -> [CancelResult] {
    let results = try await store.cancel(ids, queue: identifier, clock: clock)
    guard results.count == ids.count else {
      throw JobQueueError.invalidConfiguration(
        "the store answered \(results.count) results for \(ids.count) cancelled IDs; its cancel(_:queue:clock:) is broken"
      )
    }
    let running = Set(zip(ids, results).filter { $0.1 == .cancelledRunning }.map(\.0))
    if !running.isEmpty {
      // This instance's claims of those jobs, running or claimed and waiting for a slot, are
      // gone: the waiting ones never start, the running ones' handlers are cancelled.
      let claims = core.withLock { core in
        let held = Set(core.state.heldClaims.filter { running.contains($0.id) })
        // One whose claim is on its way back here is dropped when it arrives.
        core.state.noteCancelled(running.subtracting(held.map(\.id)))
        return held
      }
      lost(claims)
    }
    return results
  }

  /// Cancels a job of this queue that has not finished; see the form that takes a list of IDs.
  @discardableResult
  public func cancel(_ id: JobID) async throws -> CancelResult {
    try await cancel([id])[0]
  }

  /// Deletes a job; returns whether it existed.
  @discardableResult
  public func remove(_ id: JobID) async throws -> Bool {
    try await remove([id]) == 1
  }

  /// Deletes every waiting and dead job (running ones finish and are deleted if handled); returns
  /// how many were deleted.
  ///
  /// A job already claimed by a worker counts as running, also one claimed ahead or prefetched
  /// that has not started yet: it is not deleted, and runs (or is handed back, and then is
  /// waiting again).
  @discardableResult
  public func clear() async throws -> Int {
    try await store.clear(queue: identifier, statuses: [.pending, .dead])
  }

  /// Makes dead jobs ready again with their attempts reset; nil re-queues every dead job.
  ///
  /// Returns how many were re-queued. A dead job whose deduplication key is held by a waiting
  /// job stays dead, so the same work is not queued twice (see
  /// ``JobStore/requeueDead(_:queue:clock:)``).
  @discardableResult
  public func requeueDead(_ ids: [JobID]? = nil) async throws -> Int {
    let count = try await store.requeueDead(ids, queue: identifier, clock: clock)
    if count > 0 {
      core.withLock { $0.state.noteNewWork() }
      wake.signal()
    }
    return count
  }

  /// Deletes dead jobs; returns how many.
  @discardableResult
  public func purgeDead() async throws -> Int {
    try await store.clear(queue: identifier, statuses: [.dead])
  }

  /// Returns when the store holds no waiting or running job of this queue (dead jobs do not
  /// count, nor do jobs held behind a dead job of their ordering key: both wait for an operator),
  /// or when the calling task is cancelled.
  ///
  /// The answer comes from the store, looked at after this call began, so jobs added by another
  /// `JobQueue` instance or another process on the same store count too. The queue must be
  /// started and not paused for jobs to finish: on a stopped or paused queue this waits until it
  /// is started or resumed and its jobs are done (cancel the task to stop waiting).
  public func waitUntilFinished() async {
    let token = UUID()
    await withTaskCancellationHandler {
      await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
        let cancelled = core.withLock { core -> Bool in
          if Task.isCancelled { return true }
          core.state.addFinishWaiter(token)
          core.finishContinuations[token] = continuation
          return false
        }
        if cancelled { continuation.resume() } else { wake.signal() }
      }
    } onCancel: {
      let continuation = core.withLock { core in
        core.state.finishWaiters[token] = nil
        return core.finishContinuations.removeValue(forKey: token)
      }
      continuation?.resume()
    }
  }

  /// What happens in the queue, as it happens. Each access starts a new subscription that receives
  /// events from then on; consume it, or let it go (events are buffered until read).
  public var events: AsyncStream<JobQueueEvent> {
    let (stream, continuation) = AsyncStream.makeStream(of: JobQueueEvent.self)
    let token = UUID()
    core.withLock { core in
      core.subscribers[token] = continuation
      subscriberCount.store(core.subscribers.count, ordering: .releasing)
    }
    continuation.onTermination = { [weak self] _ in
      guard let self else { return }
      core.withLock { core in
        core.subscribers.removeValue(forKey: token)
        subscriberCount.store(core.subscribers.count, ordering: .releasing)
      }
    }
    return stream
  }

  // MARK: Events, state, logging

  func emit(_ event: JobQueueEvent) {
    // Most queues have no subscriber: no lock then.
    guard subscriberCount.load(ordering: .acquiring) > 0 else { return }
    let subscribers = core.withLock { Array($0.subscribers.values) }
    for subscriber in subscribers { subscriber.yield(event) }
  }

  func publishState() {
    let (changed, subscribers) = core.withLock {
      core -> (JobQueueState?, [AsyncStream<JobQueueEvent>.Continuation]) in
      guard let state = core.state.stateToPublish() else { return (nil, []) }
      return (state, Array(core.subscribers.values))
    }
    if let changed { for subscriber in subscribers { subscriber.yield(.stateChanged(changed)) } }
  }

  func log(_ level: LogRecord.Level, _ message: String, _ metadata: [String: String] = [:]) {
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

/// The queue's locked storage: the state machine, and what it cannot hold as plain values
/// (tasks and continuations).
struct QueueCore: Sendable {
  var state: QueueState
  var loop: Task<Void, Never>?
  var subscribers: [UUID: AsyncStream<JobQueueEvent>.Continuation] = [:]
  var finishContinuations: [UUID: CheckedContinuation<Void, Never>] = [:]
  /// How to cancel each handler running (or running past its time limit), by claim: a claim the
  /// store no longer holds (cancelled, removed, taken over) has its handler cancelled.
  var handlers: [ClaimReference: @Sendable () -> Void] = [:]
  /// Each worker's handle on the handler it runs in its own task (jobs without a time limit),
  /// registered once per worker.
  var inlineHandlers: [ObjectIdentifier: HandlerCancellation] = [:]

  init(_ configuration: JobQueueConfiguration) {
    state = QueueState(
      limits: .init(
        concurrency: configuration.concurrency, prefetch: configuration.prefetch,
        // A job claimed ahead by a process that dies has its claim's attempt counted, as a
        // prefetched one does: with one attempt allowed it would die without running.
        claimsAhead: configuration.claimsAhead && configuration.maxAttempts != 1,
        lease: configuration.leaseDuration))
  }
}

extension JobQueue {
  /// The delegate, held weakly, with its calls bound to the concrete type.
  final class DelegateBox: Sendable {
    /// Handles a job; nil when the delegate is gone.
    /// Starts handling a job, its answer to be given to the promise; false when the delegate is
    /// gone (the promise is then never fulfilled).
    let handle: @Sendable (JobQueue<Item>, Item, Int, CallbackPromise<JobResult>) async -> Bool
    let finished: @Sendable (JobQueue<Item>) async -> Void
    let isAlive: @Sendable () -> Bool

    init<Delegate: JobQueueDelegate>(_ delegate: Delegate) where Delegate.Item == Item {
      handle = { [weak delegate] queue, item, attempts, promise in
        guard let delegate, delegate.isReadyForJobs else { return false }
        // The requirement is `async` so that the call hops to the delegate's actor (the main
        // actor for a `@MainActor` delegate); the completion may come during or after it. The
        // end of a shutdown's grace period fulfils the promise with `CancellationError`, as a
        // closure handler would throw it, and goes through the same shutdown rule; a later
        // completion is ignored.
        await delegate.queue(queue, handle: item, attempts: attempts) { promise.fulfil(.success($0)) }
        return true
      }
      finished = { [weak delegate] queue in await delegate?.queueFinished(queue) }
      isAlive = { [weak delegate] in delegate?.isReadyForJobs == true }
    }
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
///
/// ## Main-actor delegates
///
/// The requirements are `async`, so a `@MainActor` class (a view model, an app delegate) adopts
/// the protocol with ordinary synchronous methods, and the queue calls them on the main actor:
///
/// ```swift
/// @MainActor final class UploadsModel: JobQueueDelegate {
///   var uploaded = 0
///   func queue(_ queue: JobQueue<Upload>, handle item: Upload, attempts: Int,
///              completion: @escaping @Sendable (JobResult) -> Void) {
///     uploaded += 1  // main-actor state, no hop needed
///     completion(.handled)
///   }
/// }
/// ```
///
/// ## Where the callbacks run
///
/// - `queue(_:handle:attempts:completion:)` and `queueFinished(_:)` run on the delegate's
///   isolation: on the main actor for a `@MainActor` delegate, on that actor for an actor, and on
///   Swift's cooperative thread pool (some background thread) for a nonisolated class. A
///   main-actor delegate needs the main actor to be served: it is in apps, in `async` `main`
///   functions and in `@MainActor` tests; a command-line tool that blocks its main thread never
///   gets its jobs handled.
/// - `completion` may be called from any thread, during the call or later.
/// - `queueFinished(_:)` is awaited by the queue's loop before it looks for more work, so it
///   runs after the last job's outcome is recorded and before any job added later is handled.
public protocol JobQueueDelegate<Item>: AnyObject, Sendable {
  /// The queue's item type.
  associatedtype Item: Queueable

  /// Handles one job; call `completion` exactly once (later calls are ignored). `attempts` is 1
  /// the first time.
  ///
  /// Declared `async` so that an actor-isolated (for instance `@MainActor`) method satisfies it;
  /// implement it as an ordinary synchronous method.
  func queue(
    _ queue: JobQueue<Item>, handle item: Item, attempts: Int,
    completion: @escaping @Sendable (JobResult) -> Void) async

  /// Called when no pending or running job is left.
  ///
  /// Declared `async` so that an actor-isolated method satisfies it; implement it as an ordinary
  /// synchronous method.
  func queueFinished(_ queue: JobQueue<Item>) async

  /// Whether the delegate can take jobs now. While it is false the queue claims no job, and a job
  /// claimed meanwhile is given back without using an attempt, so another worker may run it.
  /// Default true. Read from the queue's own tasks, so it must be safe to read from any thread.
  var isReadyForJobs: Bool { get }
}

extension JobQueueDelegate {
  /// Does nothing.
  public func queueFinished(_ queue: JobQueue<Item>) {}

  /// Always ready.
  public var isReadyForJobs: Bool { true }
}
