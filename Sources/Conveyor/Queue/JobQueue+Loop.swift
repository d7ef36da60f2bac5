import Foundation
import Synchronization

// The worker loop and the workers: they carry out what `QueueState` decides.
//
// The loop records outcomes, claims jobs for free slots, starts workers, rescues expired leases
// when one is due, looks for "finished", and otherwise sleeps until it is signalled, a job falls
// due, a lease runs out, or `pollInterval` passes (other processes' jobs, the stored pause flag).
// A worker handles its job, then records the outcome and claims its own next job in one store
// call, so a busy queue needs no round trip through the loop. The lease keeper (its own file)
// heartbeats on a thread of its own.

extension JobQueue {
  func runLoop() async {
    let keeper = LeaseKeeper(
      store: store, queue: identifier, lease: lease, clock: clock,
      executor: configuration.runtime.leaseExecutor,
      held: { [weak self] in self?.core.withLock { $0.state.heldClaims } ?? [] },
      lost: { [weak self] claims in self?.lost(claims) },
      renewed: { [weak self] claims, sent in self?.core.withLock { $0.state.renewed(claims, sentAt: sent) } },
      log: { [weak self] level, message in self?.log(level, message) },
      checkInterval: configuration.claimCheckInterval
    ).start()
    // Wakes the loop when the store hears of work from elsewhere (see `JobStore.waitForWork`).
    let watcher = Task(executorPreference: configuration.runtime.executor) {
      [store, identifier, wake, configuration] in
      while !Task.isCancelled {
        if await store.waitForWork(queue: identifier, timeout: configuration.pollInterval) { wake.signal() }
      }
    }
    let activityFlusher = flushActivityPeriodically()
    let pruner = pruneHistoryPeriodically()
    var failures = 0
    // A discarding group: finished workers are freed at once, so memory stays flat however many
    // jobs pass through.
    await withDiscardingTaskGroup { group in
      while !Task.isCancelled {
        do {
          guard let wait = try await turn(group: &group) else { break }
          failures = 0
          if let wait { await sleep(for: wait) }
        } catch {
          failures += 1
          let backoff = Duration.milliseconds(min(5_000, 50 << min(failures, 7)))
          log(.warning, "store error, retrying in \(backoff): \(error)", ["failures": String(failures)])
          await sleep(for: backoff)
        }
      }
      // Cancelled after the grace period: handlers were cancelled with the loop; the group waits
      // for them.
    }
    await finalFlush()
    pruner?.cancel()
    await handOverActivity(after: activityFlusher)
    watcher.cancel()
    keeper.cancel()
    core.withLock { core in
      core.loop = nil
      core.state.stopped()
    }
    log(.info, "queue stopped")
    publishState()
  }

  /// Sleeps until signalled, `duration` passes, or what is held here comes due: jobs claimed
  /// ahead must be handed back (at once when the queue is paused), or outcomes a batch left must
  /// be recorded (`QueueState.loopDue`). The same after a store error: a backoff does not delay a
  /// hand-back. The deadline is noted under the same lock, so a worker wakes the loop only when it
  /// would sleep past something due. (Skipping the turn's look at the store while a job claimed
  /// ahead waits was tried: on SQLite the queue at concurrency 1 was slower, 0.75–0.96× the raw
  /// loop against 0.86–1.14×.)
  private func sleep(for duration: Duration) async {
    let clock = self.clock
    let canHandle = handlerAvailable
    let deadline = core.withLock { core in
      let now = clock.uptime()
      var deadline = now + duration
      if let due = core.state.loopDue(canHandle: canHandle) {
        // At least 1 ms on, so the loop never spins on something it cannot act on yet.
        deadline = min(deadline, max(due, now + .milliseconds(1)))
      }
      core.state.loopSleepsUntil = deadline
      return deadline
    }
    await wake.wait(untilUptime: deadline)
    core.withLock { $0.state.loopSleepsUntil = nil }
  }

  /// One turn of the loop. Returns nil to end the loop, `.some(nil)` to turn again at once, or
  /// how long to wait for a signal at most.
  private func turn(group: inout DiscardingTaskGroup) async throws -> Duration?? {
    if core.withLock({ $0.state.rescueDue }) {
      // A queue that starts (a restart after a crash, say) gives the jobs of a vanished worker
      // back before it claims anything, so they run in their old places, before jobs added after
      // them. A failure is retried at the next turn, before any claim.
      let rescued = try await store.rescueExpiredLeases(queue: identifier, clock: clock)
      core.withLock { $0.state.rescueDue = false }
      if rescued > 0 {
        log(.warning, "handed out \(rescued) job(s) whose worker stopped heart-beating")
      }
    }
    let canHandle = handlerAvailable
    let now = clock.uptime()
    guard let step = core.withLock({ $0.state.takeLoopStep(canHandle: canHandle, now: now) }) else {
      return nil
    }
    var claimedAny = false
    var storeCall: Duration?
    if step.needsStore {
      // Recorded, or kept in the settlements to be recorded first next time: either way a
      // worker may claim again.
      defer { if step.handedBack > 0 { core.withLock { $0.state.handBackRecorded() } } }
      let (batch, _, _, took) = try await settleAndClaim(
        step.settlements, limit: step.claimLimit, takingNext: false, timed: true)
      storeCall = took
      claimedAny = !batch.claimed.isEmpty
      if step.handedBack > 0 {
        log(
          .debug, "handed back \(step.handedBack) claimed job(s) that could not start in time",
          ["jobs": String(step.handedBack)])
      }
    }
    let handedBack = startWorkers(in: &group, lastStoreCall: storeCall)
    if handedBack || (claimedAny && !step.stopping && core.withLock({ $0.state.freeSlots > 0 })) {
      return .some(nil)  // more may be ready, or jobs handed back must be recorded: turn again
    }
    if step.stopping { return configuration.pollInterval }
    // The sleep is cut short by anything held here that comes due first (see `sleep(for:)`).
    return try await nextWait(canHandle: canHandle)
  }

  /// Looks at the store: rescues expired leases when one is due, reports "finished", and says how
  /// long the loop may sleep. Never returns a wait of zero for something it cannot act on, so an
  /// idle queue does not spin.
  private func nextWait(canHandle: Bool) async throws -> Duration?? {
    let check = core.withLock { $0.state.beginFinishCheck() }
    var hint = try await store.nextWake(queue: identifier, clock: clock)
    var now = clock.now()
    if let expiry = hint.nextLeaseExpiry, expiry <= now {
      let rescued = try await store.rescueExpiredLeases(queue: identifier, clock: clock)
      if rescued > 0 {
        log(.warning, "handed out \(rescued) job(s) whose worker stopped heart-beating")
        core.withLock { $0.state.sawWork() }
        return .some(nil)
      }
      // Nothing was rescued: its worker heartbeated meanwhile, or the store judges leases by a
      // clock of its own (a database server's) that is behind this one. Look again, but never
      // spin on it: a lease that still looks past is looked at again after `pollInterval`. It is
      // never dropped, since a running job keeps the queue unfinished.
      hint = try await store.nextWake(queue: identifier, clock: clock)
      now = clock.now()
      if let expiry = hint.nextLeaseExpiry, expiry <= now {
        hint.nextLeaseExpiry = now.addingTimeInterval(configuration.pollInterval.seconds)
      }
    }
    // Schedules due: fired here, from the hint the loop reads anyway, so an idle queue with
    // schedules calls the store no more often than one without (see `fireDueSchedules`).
    var scheduleDue = hint.nextScheduleDue
    if let due = scheduleDue, due <= now {
      let firing = try await store.fireDueSchedules(queue: identifier, clock: clock)
      if !firing.added.isEmpty {
        log(.debug, "schedules added \(firing.added.count) job(s)", ["jobs": String(firing.added.count)])
        announce(added: firing.added)
        return .some(nil)
      }
      // Nothing to add (another process fired the slot): wait for the next due time, but never
      // spin on one that stays past.
      now = clock.now()
      scheduleDue = firing.nextDue.map { max($0, now.addingTimeInterval(configuration.pollInterval.seconds)) }
      if let next = firing.nextDue, next > now { scheduleDue = next }
    }
    // The stored pause flag, set or cleared by any worker: a queue that is not claiming (its
    // slots busy, jobs claimed ahead) must still stop starting them.
    let pauseChanged = core.withLock { core -> Bool in
      defer { core.state.paused = hint.paused }
      return core.state.paused != hint.paused
    }
    if pauseChanged { publishState() }
    if hint.isFinished {
      // Waiters are released whatever the handler; "finished" is published only by a queue that
      // can handle jobs (a released delegate's queue is not doing the work).
      await reportFinished(check, publish: canHandle)
    } else {
      core.withLock { $0.state.sawWork() }
    }
    var wait = configuration.pollInterval
    if let expiry = hint.nextLeaseExpiry { wait = min(wait, duration(from: now, to: expiry)) }
    if let due = scheduleDue { wait = min(wait, max(duration(from: now, to: due), .milliseconds(1))) }
    // A queue its last claim found full claims again after its wait (see `QueueState.fullUntil`):
    // a place freed elsewhere meanwhile (a run date of now) must not make it turn without claiming.
    let uptime = clock.uptime()
    if let fullUntil = core.withLock({ $0.state.fullUntil }), fullUntil > uptime {
      wait = min(wait, fullUntil - uptime)
    } else if let run = hint.nextRun, core.withLock({ $0.state.canClaim(canHandle: canHandle) }) {
      let untilRun = duration(from: now, to: run)
      if untilRun <= .zero { return .some(nil) }
      wait = min(wait, untilRun)
    }
    return wait
  }

  /// The time from `now` to `date` (negative when `date` is past), in whole milliseconds.
  private func duration(from now: Date, to date: Date) -> Duration {
    let milliseconds = (date.timeIntervalSince(now) * 1000).rounded(.up)
    let capped = min(max(milliseconds, -1e12), 1e12)
    return .milliseconds(Int64(capped))
  }

  /// Heartbeats found claims gone: drop the ones not yet started, and say so.
  func lost(_ claims: Set<ClaimReference>) {
    let (stillHeld, handlers) = core.withLock { core in
      let held = Set(core.state.heldClaims)
      core.state.lost(claims)
      // A handler still running on one is detached: its claim leaves the held claims (no more
      // checks, heartbeats or warnings for it) and what it returns is dropped.
      let abandoned = core.state.abandon(claims)
      let cancels =
        abandoned.isEmpty
        ? []
        : abandoned.compactMap { core.handlers[$0] }
          + core.inlineHandlers.values.map { handle in { handle.cancel(ifRunning: abandoned) } }
      return (claims.intersection(held), cancels)
    }
    for claim in stillHeld {
      log(
        .warning,
        "the store no longer holds a job for this worker (cancelled, removed, or taken over after its lease lapsed)",
        ["job": claim.id.description])
    }
    // Its outcome would be refused: stop the work.
    for cancel in handlers { cancel() }
  }

  /// Records outcomes and claims, publishing the events of the outcomes the store accepted; on
  /// failure the outcomes are kept to be recorded next time.
  func settleAndClaim(_ pending: [PendingSettlement], limit: Int) async throws -> ClaimBatch {
    try await settleAndClaim(pending, limit: limit, takingNext: false).batch
  }

  /// The same; with `takingNext`, also takes the next claimed job for the calling worker under the
  /// same lock (nil: the worker ends). `held`: a job claimed ahead waits for a slot (with `prefetch`
  /// 0) and the loop must be woken to hand it back in time. `took`: with `timed`, how long the
  /// store's call took (the store's alone: the bookkeeping around it would make a cheap store look
  /// slow on a busy machine).
  func settleAndClaim(_ pending: [PendingSettlement], limit: Int, takingNext: Bool, timed: Bool = false)
    async throws -> (batch: ClaimBatch, next: JobRecord?, held: Bool, took: Duration?)
  {
    let batch: ClaimBatch
    // A claim's lease starts no earlier than the call: from then on it surely holds for the lease.
    let sent = timed || limit > 0 ? ClockReading(clock) : nil
    let called = timed ? sent?.uptime : nil
    do {
      batch = try await store.settleAndClaim(
        pending.map(\.settlement), queue: identifier, limit: limit, lease: lease, clock: clock)
    } catch {
      core.withLock { $0.state.restore(pending) }
      throw error
    }
    // One clock read for all three: when the claimed jobs arrived, the end of the call, and the
    // time a job taken for the worker must still have on its lease (read even when nothing was
    // claimed: the job taken may have waited in the buffer since an earlier claim).
    let reading =
      called != nil || !batch.claimed.isEmpty || takingNext || batch.full || batch.nextStart != nil
      ? ClockReading(clock) : .zero
    let now = reading.uptime
    let took = called.map { now - $0 }
    let stale = batch.staleSettlements.isEmpty ? [] : Set(batch.staleSettlements)
    // Full, or out of starts: claim again after the poll, or when the rate gives the next start.
    let poll = configuration.pollInterval
    let fullUntil = [
      batch.full ? now + poll : nil,
      batch.nextStart.map { now + min(poll, max(.milliseconds(1), duration(from: clock.now(), to: $0))) },
    ].compactMap { $0 }.max()
    let (subscribers, pauseChanged, next, held, lapsed) = core.withLock { core in
      core.state.claimed(
        batch.claimed, at: now, lease: sent.map { LeaseBound(sent: $0, lease: configuration.leaseDuration) })
      let changed = core.state.paused != batch.paused
      core.state.paused = batch.paused
      if limit > 0 { core.state.fullUntil = fullUntil }
      let next = takingNext ? core.state.nextForWorker(now: reading) : nil
      defer { core.state.handedBackLapsed = 0 }
      return (
        core.subscribers.isEmpty ? [] : Array(core.subscribers.values), changed, next,
        core.state.loopMustWake || core.state.handedBackLapsed > 0, core.state.handedBackLapsed
      )
    }
    logHandedBack(lapsed: lapsed)
    if pauseChanged { publishState() }
    for item in pending {
      if stale.contains(item.settlement.claim) {
        log(
          .warning, "a job's outcome was not recorded: it was removed or its lease passed to another claim",
          ["job": item.settlement.id.description])
        continue
      }
      guard var event = item.event else { continue }
      countOutcome(event)
      // The run date the store set (it reads its clock when it records the outcome).
      if case .retryScheduled(let id, _, let error) = event, let date = batch.retryDates[id] {
        event = .retryScheduled(id, at: date, error: error)
      }
      for subscriber in subscribers { subscriber.yield(event) }
    }
    return (batch, next, held, took)
  }

  /// Starts a worker task for each free slot that has a claimed job waiting; `lastStoreCall` is
  /// how long the call that claimed them took (nil: they were claimed earlier). Returns whether
  /// jobs were handed back because their lease may have lapsed before they could start (the loop
  /// records that at once).
  private func startWorkers(in group: inout DiscardingTaskGroup, lastStoreCall: Duration?) -> Bool {
    let now = ClockReading(clock)
    let (jobs, lapsed) = core.withLock { core in
      let jobs = core.state.takeJobsToStart(now: now)
      defer { core.state.handedBackLapsed = 0 }
      return (jobs, core.state.handedBackLapsed)
    }
    logHandedBack(lapsed: lapsed)
    guard !jobs.isEmpty else { return lapsed > 0 }
    publishState()
    for job in jobs {
      group.addTask { await self.work(startingWith: job, lastStoreCall: lastStoreCall) }
    }
    return lapsed > 0
  }

  /// Says how many claimed jobs were handed back unstarted because their lease may have lapsed.
  private func logHandedBack(lapsed: Int) {
    guard lapsed > 0 else { return }
    log(
      .warning,
      "handed back \(lapsed) claimed job(s) unstarted: the claim was answered (or the job waited) so late "
        + "that the lease may have lapsed, and another worker may hold the job",
      ["jobs": String(lapsed)])
  }

  /// A worker: handles a job, then the next claimed one, and when none is left records its
  /// outcomes and claims its next job itself in one store call. It ends when nothing is ready.
  private func work(startingWith first: JobRecord, lastStoreCall: Duration?) async {
    var next: JobRecord? = first
    // A decoder of the worker's own: a shared `JSONDecoder` takes its options lock on every
    // decode, which workers on other threads then wait for.
    let decoder = PayloadDecoder()
    // Lets a handler run in this task be cancelled on request: registered once per worker, not
    // per job (a per-job registration under the queue's lock cost a quarter of the in-memory
    // drain at concurrency 4).
    let cancellation = HandlerCancellation()
    let worker = ObjectIdentifier(cancellation)
    core.withLock { $0.inlineHandlers[worker] = cancellation }
    defer { core.withLock { _ = $0.inlineHandlers.removeValue(forKey: worker) } }
    let clock = self.clock
    let storeCallFloor = configuration.claimAheadStoreCallFloor
    let jobCeiling = configuration.claimAheadJobCeiling
    // The cheapest of this worker's recent store calls: it rises by a sixteenth per slower call,
    // so a streak of calls slowed by contention (workers, the loop) does not make a store whose
    // calls are cheap look slow; and it drops to a call at once.
    var storeCall = lastStoreCall
    // Claiming ahead is decided from these timings; without it, nothing reads them.
    let timesCalls = configuration.claimsAhead && configuration.prefetch == 0
    while let record = next {
      // A handler is timed only when a store call was (claiming ahead weighs the two).
      let began = timesCalls && storeCall != nil ? clock.uptime() : nil
      let handled = await process(record, decoder: decoder, cancellation: cancellation)
      var outcome: PendingSettlement? = handled.settlement
      if let overrun = handled.overrun {
        // Timed out: the loop records the attempt now; this worker keeps its slot until the
        // handler returns.
        if core.withLock({ $0.state.attemptOutran(record.claim, outcome: handled.settlement) }) {
          wake.signal()
        } else {
          await recordAlone(handled.settlement)
        }
        await waitForOverrun(overrun, of: record)
        outcome = nil
      }
      if handled.endsWorker {
        // This task stays cancelled: it hands its outcome over (dropped, the job being gone)
        // and ends; the loop starts a new worker for any job claimed meanwhile.
        core.withLock { $0.state.workerStops(record.claim, outcome: outcome) }
        break
      }
      let ahead =
        began.map {
          QueueState.ahead(
            handler: clock.uptime() - $0, lastStoreCall: storeCall, storeCallFloor: storeCallFloor,
            jobCeiling: jobCeiling)
        } ?? .none
      let canHandle = handlerAvailable
      let now = ClockReading(clock)
      let (step, lapsed) = core.withLock { core in
        defer { core.state.handedBackLapsed = 0 }
        let step = core.state.workerFinished(
          record.claim, outcome: outcome, canHandle: canHandle, ahead: ahead, now: now)
        return (step, core.state.handedBackLapsed)
      }
      logHandedBack(lapsed: lapsed)
      switch step {
      case .run(let job, let flush):
        next = job
        if flush { wake.signal() }
      case .exit:
        next = nil
      case .claim(let settlements, let limit):
        do {
          let claim = try await settleAndClaim(settlements, limit: limit, takingNext: true, timed: timesCalls)
          if let took = claim.took { storeCall = min(took, storeCall.map { $0 + $0 / 16 } ?? took) }
          next = claim.next
          // A job claimed ahead, and the loop sleeps past its hand-back: it must time the hold.
          if claim.held { wake.signal() }
        } catch {
          log(.warning, "store error while claiming; the queue will retry: \(error)")
          let now = ClockReading(clock)
          let lapsed: Int
          (next, lapsed) = core.withLock { core in
            defer { core.state.handedBackLapsed = 0 }
            return (core.state.nextForWorker(now: now), core.state.handedBackLapsed)
          }
          logHandedBack(lapsed: lapsed)
          if lapsed > 0 { wake.signal() }
        }
      }
    }
    core.withLock { $0.state.workerExited() }
    publishState()
    wake.signal()
  }

  /// Whether a handler takes jobs now (``handlerAvailable``), for the test helpers of
  /// `ConveyorTesting`, which say so rather than wait.
  package var isHandlerAvailable: Bool { handlerAvailable }

  /// Whether a handler exists to run jobs: always for the closure form; while the delegate lives
  /// for the delegate form.
  private var handlerAvailable: Bool {
    handler != nil || delegateBox?.isAlive() == true
  }

  private func process(_ record: JobRecord, decoder: PayloadDecoder, cancellation: HandlerCancellation) async
    -> Handled
  {
    // A claim counts an attempt before the handler runs, so a job past the limit here had a worker
    // that vanished during its last allowed attempt (a crash, a kill, an out-of-memory): dead, or
    // a job that crashes its worker would be handed out forever. A shutdown gives its attempt
    // back, so it never gets here.
    if let max = configuration.maxAttempts, record.attempts > max {
      return Handled(settlement(for: record, outcome: .abandoned(limit: max)))
    }
    let item: Item
    do {
      item = try decoder.decode(Item.self, from: record.payload)
    } catch {
      return Handled(settlement(for: record, outcome: .undecodable(String(describing: error))))
    }
    let context = JobContext(
      id: record.id, queue: identifier, attempts: record.attempts, createdAt: record.createdAt,
      lastError: record.lastError, claimToken: record.claimToken)
    guard handlerAvailable else { return Handled(settlement(for: record, outcome: .noHandler)) }
    let limit = record.timeLimit ?? configuration.timeLimit
    // Armed on every job (with the task only when the handler runs in it), so the claims noted
    // for a worker between two jobs never pile up.
    let cancelledEarly = withUnsafeCurrentTask { (task: UnsafeCurrentTask?) -> Bool in
      cancellation.arm(limit == nil ? task : nil, claim: record.claim)
    }
    if cancelledEarly {
      // Cancelled (or taken over) since this worker took the job, before its handler could be
      // cancelled: none starts. The outcome is dropped with the abandoned claim.
      return Handled(
        PendingSettlement(
          settlement: JobSettlement(claim: record.claim, action: .release(error: nil)), event: nil))
    }
    // Only when a handler is about to run: `.started` means "a handler started on a job".
    emit(.started(record.id, attempt: record.attempts))
    countStart(of: record)
    guard let limit else {
      // No limit: the handler runs in the worker's own task (no task to create, no hop back),
      // cancellable on request through it; a worker cancelled so ends after this job.
      let started = clock.uptime()
      let returned: Result<JobResult?, any Error>
      do { returned = .success(try await handleInline(item, context)) } catch { returned = .failure(error) }
      var handled = Handled(
        settlement(for: record, outcome: Self.outcome(returned), ran: clock.uptime() - started))
      handled.endsWorker = cancellation.disarm()
      return handled
    }
    let started = clock.uptime()
    let (end, handler) = await handle(item, context, claim: record.claim, until: started + limit)
    guard let returned = end else {
      // The deadline came first.
      // The grace runs from when the handler was cancelled, which may be after the limit (a
      // stalled machine, a test clock moved in one step).
      let cancelledAt = max(started + limit, clock.uptime())
      let overrun = Overrun(
        handler: handler, started: started, stuckAt: cancelledAt + configuration.timeLimitGrace)
      return Handled(settlement(for: record, outcome: .timedOut(limit), ran: limit), overrun: overrun)
    }
    return Handled(settlement(for: record, outcome: Self.outcome(returned), ran: clock.uptime() - started))
  }

  /// What a handler's return or error means.
  private static func outcome(_ returned: Result<JobResult?, any Error>) -> Outcome {
    switch returned {
    case .success(let result?): .result(result)
    case .success(nil): .noHandler
    case .failure(let error): .thrown(error)
    }
  }

  /// Runs the handler in the worker's task; nil when the delegate is gone. A delegate's call ends
  /// when the task is cancelled (a shutdown's grace ran out, or the job was cancelled), as a
  /// closure's would.
  private func handleInline(_ item: Item, _ context: JobContext) async throws -> JobResult? {
    if let handler { return try await handler(item, context) }
    let answer = CallbackPromise<JobResult>()
    guard let delegate = delegateBox?.handle, await delegate(self, item, context.attempts, answer) else {
      return nil
    }
    return try await answer.value
  }

  /// Runs the handler; nil when the delegate is gone. A delegate's answer comes through
  /// `answer`, which the caller ends with `CancellationError` at a shutdown: the delegate cannot
  /// see its task's cancellation, so a time limit or a lost claim leaves it running, holding its
  /// slot, as a closure that ignores cancellation does.
  private func handle(_ item: Item, _ context: JobContext, answer: CallbackPromise<JobResult>) async throws
    -> JobResult?
  {
    if let handler { return try await handler(item, context) }
    guard let delegate = delegateBox?.handle, await delegate(self, item, context.attempts, answer) else {
      return nil
    }
    return try await answer.valueIgnoringCancellation
  }

  /// Runs the handler in a task of its own, registered under `claim` (so a claim the store no
  /// longer holds cancels it), until it returns or `deadline` (the clock's uptime) passes,
  /// whichever comes first: what it returned, or nil when the deadline came first (its task is
  /// then cancelled, and may still be running). A result that comes after the deadline counts as
  /// the deadline coming first (its timer may not have run: every thread of the pool blocked).
  /// The handler's task, to wait for.
  ///
  /// Cancelling the caller (a shutdown's grace ran out) cancels the handler.
  private func handle(_ item: Item, _ context: JobContext, claim: ClaimReference, until deadline: Duration)
    async -> (Result<JobResult?, any Error>?, Task<Void, Never>)
  {
    let end = CallbackPromise<Result<JobResult?, any Error>?>()
    let answer = CallbackPromise<JobResult>()
    let clock = self.clock
    let handler = Task(executorPreference: configuration.runtime.executor) {
      let result: Result<JobResult?, any Error>
      do { result = .success(try await self.handle(item, context, answer: answer)) } catch {
        result = .failure(error)
      }
      if clock.uptime() > deadline {
        end.fulfil(.success(nil))
      } else {
        end.fulfil(.success(result))
      }
    }
    // Registered and looked at under one lock: a claim abandoned before the registration (no
    // handler was there to cancel) cancels the handler here.
    let abandoned = core.withLock { core in
      core.handlers[claim] = { handler.cancel() }
      return core.state.abandoned.contains(claim)
    }
    if abandoned { handler.cancel() }
    let timer = Task(executorPreference: configuration.runtime.executor) {
      do { try await clock.sleep(untilUptime: deadline) } catch { return }  // the handler returned first
      end.fulfil(.success(nil))
    }
    let result: Result<JobResult?, any Error>?
    do {
      result = try await withTaskCancellationHandler {
        try await end.valueIgnoringCancellation
      } onCancel: {
        handler.cancel()
        answer.fulfil(.failure(CancellationError()))
      }
    } catch {
      result = nil  // not reached: `end` is only ever fulfilled with a success
    }
    timer.cancel()
    if result == nil { handler.cancel() }
    core.withLock { _ = $0.handlers.removeValue(forKey: claim) }
    return (result, handler)
  }

  /// Records one outcome in a store call of its own, in a task no shutdown cancels: for a
  /// time-limited attempt that outran its limit while the queue stops (its loop records nothing
  /// more until its workers end). A failure leaves it to the loop's final record.
  private func recordAlone(_ outcome: PendingSettlement) async {
    // A failed call has put the outcome back already (`settleAndClaim` restores what it could
    // not record): restoring it here too sent it twice in the shutdown's final record.
    await Task(executorPreference: configuration.runtime.executor) {
      do {
        _ = try await self.settleAndClaim([outcome], limit: 0)
      } catch {
        self.log(.warning, "could not record a timed-out attempt; it is recorded at shutdown: \(error)")
      }
    }.value
  }

  /// A handler that outran its time limit and still holds its worker: the worker reports it stuck
  /// once `stuckAt` (the clock's uptime) passes, and takes no other job until it returns.
  private func waitForOverrun(_ overrun: Overrun, of record: JobRecord) async {
    let clock = self.clock
    let stuckAt = overrun.stuckAt
    let returned = CallbackPromise<Bool>()
    let handler = overrun.handler
    let watch = Task(executorPreference: configuration.runtime.executor) {
      await handler.value
      returned.fulfil(.success(true))
    }
    let timer = Task(executorPreference: configuration.runtime.executor) {
      do { try await clock.sleep(untilUptime: stuckAt) } catch { return }
      returned.fulfil(.success(false))
    }
    let inTime: Bool
    do { inTime = try await returned.valueIgnoringCancellation } catch { inTime = true }  // not reached
    timer.cancel()
    if !inTime {
      let after = stuckAt - overrun.started
      log(
        .error,
        "job's handler is stuck: it ran past its time limit, ignores cancellation, and holds a worker slot",
        ["job": record.id.description, "after": String(describing: after)])
      emit(.stuck(record.id, after: after))
      if store.recordsActivity { activityTally.stuck(queue: identifier, at: clock.now()) }
    }
    await watch.value
  }

  /// Whether the handler was cut short by a shutdown: the queue is stopping and the handler's
  /// task was cancelled (the grace period ran out).
  private var interruptedByShutdown: Bool {
    Task.isCancelled && core.withLock { $0.state.stopping }
  }

  /// The settlement of a handled job; `ran`: how long its handler ran (nil when none ran).
  private func settlement(for record: JobRecord, outcome: Outcome, ran: Duration? = nil) -> PendingSettlement
  {
    func done(_ action: JobSettlement.Action, _ event: JobQueueEvent?, output: Data? = nil)
      -> PendingSettlement
    {
      let keeps: Bool
      switch action {
      case .complete: keeps = configuration.retention.completed != .none
      case .kill: keeps = configuration.retention.dead != .none
      case .retry, .release: keeps = true
      }
      var settlement = JobSettlement(
        claim: record.claim, action: action, runDuration: ran, output: output, keepsHistory: keeps)
      settlement.ordered = record.orderingKey != nil
      if case .kill = action, record.orderingKey != nil {
        settlement.releasesOrderingKey = configuration.deadHeadPolicy == .releasesKey
      }
      return PendingSettlement(settlement: settlement, event: event)
    }
    func release(_ why: String) -> PendingSettlement {
      log(.info, "job given back: \(why)", ["job": record.id.description])
      return done(.release(error: why), nil)
    }
    func retry(after delay: Duration?, reason: String?) -> PendingSettlement {
      if interruptedByShutdown { return release("interrupted by shutdown") }
      if let max = configuration.maxAttempts, record.attempts >= max {
        let why = "gave up after \(record.attempts) attempt(s)" + (reason.map { ": \($0)" } ?? "")
        log(.error, "job is dead", ["job": record.id.description, "reason": why])
        return done(.kill(error: why), .died(record.id, reason: why))
      }
      let wait = delay ?? configuration.retryPolicy.delay(afterAttempt: record.attempts)
      let date = JobStoreTime.date(clock.now(), adding: wait)
      log(.info, "job will be retried", ["job": record.id.description, "attempt": String(record.attempts)])
      return done(.retry(after: wait, error: reason), .retryScheduled(record.id, at: date, error: reason))
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
    case .noHandler:
      return release("the queue's delegate was released before the job ran")
    case .thrown(let error):
      return retry(after: nil, reason: String(describing: error))
    case .timedOut(let limit):
      log(.warning, "job's handler ran past its time limit and was cancelled", ["job": record.id.description])
      return retry(after: nil, reason: "timed out after \(JobStoreTime.secondsText(limit))")
    case .result(let result):
      switch result.kind {
      case .handled(let output):
        if case .failure(let problem) = output {
          log(.error, "job's output not stored", ["job": record.id.description, "reason": problem.message])
        }
        var stored: Data?
        if case .success(let data) = output { stored = data }
        return done(.complete, .succeeded(record.id), output: stored)
      case .retry(let delay, let reason):
        return retry(after: delay, reason: reason ?? "handler asked to retry")
      case .discard(let reason):
        log(.warning, "job discarded", ["job": record.id.description])
        return done(.kill(error: reason), .died(record.id, reason: reason))
      case .wait(let delay, let reason):
        // Not given back at a shutdown: the run's history already holds the sleep or the retry,
        // and a run given back would count one claim fewer than the history expects.
        let date = JobStoreTime.date(clock.now(), adding: delay)
        log(.debug, "workflow run waits", ["job": record.id.description, "until": date.description])
        return done(.retry(after: delay, error: reason), .retryScheduled(record.id, at: date, error: reason))
      case .giveBack(let reason):
        return release(reason)
      }
    }
  }

  /// Publishes "finished" (when `publish` allows) and releases `waitUntilFinished` callers, when
  /// the state allows.
  private func reportFinished(_ check: FinishCheck, publish allowed: Bool) async {
    let (waiters, subscribers, publish) = core.withLock { core in
      let (tokens, stateAllows) = core.state.finishConfirmed(check, publish: allowed)
      let publish = stateAllows
      let waiters = tokens.compactMap { core.finishContinuations.removeValue(forKey: $0) }
      return (waiters, publish ? Array(core.subscribers.values) : [], publish)
    }
    if publish {
      log(.debug, "queue finished")
      for subscriber in subscribers { subscriber.yield(.finished) }
      await delegateBox?.finished(self)
    }
    for waiter in waiters { waiter.resume() }
  }

  /// Records outstanding outcomes and gives back claimed jobs that never started.
  private func finalFlush() async {
    let pending = core.withLock { $0.state.takeFinalFlush() }
    guard !pending.isEmpty else { return }
    // An unstructured task: the loop may be cancelled, the flush must still run. The shared
    // settle-and-claim reports only outcomes the store accepted, and keeps them on failure. A
    // failing store is tried again with backoff while half the lease lasts (the lease keeper
    // still heartbeats the jobs meanwhile), measured in real time whatever the queue's clock: a
    // lost release would turn a shutdown into a crash that uses up the attempt.
    let patience = min(configuration.leaseDuration / 2, .seconds(30))
    let runtime = configuration.runtime
    let flush = Task(executorPreference: runtime.executor) { () async throws -> Void in
      let start = runtime.elapsed()
      var backoff = Duration.milliseconds(20)
      while true {
        let outstanding = self.core.withLock { core -> [PendingSettlement] in
          defer { core.state.settlements = [] }
          return core.state.settlements
        }
        do {
          _ = try await self.settleAndClaim(outstanding.isEmpty ? pending : outstanding, limit: 0)
          return
        } catch {
          guard runtime.elapsed() - start + backoff < patience else { throw error }
          self.log(.warning, "could not record outcomes at shutdown, trying again in \(backoff): \(error)")
          try await runtime.sleep(backoff)
          backoff = min(backoff * 2, .seconds(1))
        }
      }
    }
    do {
      try await flush.value
    } catch {
      log(
        .error, "could not record outcomes at shutdown; the jobs will run again after their lease: \(error)")
    }
  }
}

/// How a handler call ended.
private enum Outcome {
  case result(JobResult)
  case timedOut(Duration)
  case thrown(any Error)
  case undecodable(String)
  case abandoned(limit: Int)
  case noHandler
}

/// What a worker's handling of one job came to.
private struct Handled {
  /// The attempt's outcome, to record.
  var settlement: PendingSettlement
  /// Set when the handler outran its time limit: the outcome is recorded at once, and the worker
  /// waits for the handler before it takes another job.
  var overrun: Overrun?
  /// Set when the worker's own task was cancelled to stop the handler (its job was cancelled or
  /// taken over): the cancellation stays with the task, so the worker ends after this job.
  var endsWorker = false

  init(_ settlement: PendingSettlement, overrun: Overrun? = nil) {
    self.settlement = settlement
    self.overrun = overrun
  }
}

/// A handler still running after its time limit.
private struct Overrun {
  /// The handler's task.
  var handler: Task<Void, Never>
  /// When it started (the clock's uptime).
  var started: Duration
  /// When it counts as stuck (the clock's uptime): its limit plus the grace.
  var stuckAt: Duration
}

/// Cancels a worker's task while it runs a handler in it, on request (the job was cancelled, or
/// its claim passed to another worker).
///
/// One per worker. An `UnsafeCurrentTask` may be used only while its task runs. It is kept, under
/// this object's lock, from just before a handler is called (``arm(_:claim:)``, in the task
/// itself) until it returns (``disarm()``), and ``cancel(ifRunning:)`` uses it only under that
/// lock: so only while the task is inside the handler, alive.
final class HandlerCancellation: Sendable {
  /// The task and whether it was cancelled. `@unchecked Sendable`: the `UnsafeCurrentTask` is
  /// touched only under `state`'s lock, while its task is inside the handler (see above).
  private struct Slot: @unchecked Sendable {
    var task: UnsafeCurrentTask?
    var claim: ClaimReference?
    var cancelled = false
    /// Claims cancelled while no handler of theirs was armed: the worker may have taken one and
    /// not armed it yet. Forgotten at the next ``arm(_:claim:)``.
    var missed: Set<ClaimReference> = []
  }

  private let state = Mutex(Slot())

  /// Keeps the running task, just before its handler is called on the job of `claim`; returns
  /// true, keeping nothing, when `claim` was cancelled before (after the worker took its job): its
  /// handler must not start.
  func arm(_ task: UnsafeCurrentTask?, claim: ClaimReference) -> Bool {
    state.withLock { slot in
      let early = !slot.missed.isEmpty && slot.missed.contains(claim)
      slot.missed.removeAll()
      slot.task = early ? nil : task
      slot.claim = early ? nil : claim
      slot.cancelled = false
      return early
    }
  }

  /// Cancels the task if it is still inside a handler of one of `claims`; otherwise notes them
  /// for the next ``arm(_:claim:)``.
  func cancel(ifRunning claims: Set<ClaimReference>) {
    state.withLock { slot in
      guard let task = slot.task, let claim = slot.claim, claims.contains(claim) else {
        slot.missed.formUnion(claims)
        return
      }
      slot.cancelled = true
      task.cancel()
    }
  }

  /// Forgets the task once its handler returned; whether it was cancelled meanwhile.
  func disarm() -> Bool {
    state.withLock { slot in
      slot.task = nil
      slot.claim = nil
      return slot.cancelled
    }
  }
}
