import Foundation

/// Keeps a queue's leases alive: every third of the lease it heartbeats every claim the queue
/// holds, and tells the queue which ones it lost. Between heartbeats it asks the store, every
/// ``checkInterval``, which of them are still current (a read), so a job cancelled or removed
/// in another process has its handler cancelled within about that long.
///
/// A store that announces cancellations (``JobStore/cancellations(queue:)``, PostgreSQL's
/// `NOTIFY`) makes that sooner: the keeper follows its notices beside the loop above, and on one
/// that concerns a claim it holds it runs the same check at once, for those claims. A notice
/// about jobs it does not hold costs no store call; no notice, nothing. The periodic check stays,
/// for a notice lost (a reconnect, a proxy without `LISTEN`).
///
/// A heartbeat is due a third of the lease after the last one *started*: the store computes the
/// new expiries while the call runs, so a call slow to return (a store thread slow to resume its
/// caller, a starved machine) does not push the next heartbeat out and eat into the lease. A
/// heartbeat that took longer than a third of the lease is followed by the next at once, after
/// the other keepers waiting for the thread they share had their turn.
///
/// It runs as one task that prefers ``ThreadExecutor/leases``, a thread of its own, and sleeps on
/// the clock's monotonic ``JobClock/sleep(untilUptime:)``: neither CPU-bound handlers filling the
/// cooperative pool nor a step of the wall clock can delay a heartbeat. The store computes each
/// new expiry from its clock while it holds its lock.
struct LeaseKeeper: Sendable {
  var store: any JobStore
  var queue: String
  var lease: Lease
  var clock: any JobClock
  /// The executor the keeper's task prefers (``ThreadExecutor/leases`` in production).
  var executor: any TaskExecutor = ThreadExecutor.leases
  /// The claims to keep: read before each heartbeat.
  var held: @Sendable () -> [ClaimReference]
  /// Claims the store no longer holds for this queue.
  var lost: @Sendable (Set<ClaimReference>) -> Void
  /// Claims a heartbeat sent at the given reading of ``clock`` kept.
  var renewed: @Sendable (Set<ClaimReference>, ClockReading) -> Void = { _, _ in }
  var log: @Sendable (LogRecord.Level, String) -> Void

  /// How long between heartbeats: a third of the lease, so two can fail before it lapses.
  var interval: Duration { lease.duration / 3 }
  /// How long between checks that the claims are still current (none when the heartbeats come
  /// as often).
  var checkInterval = Duration.milliseconds(500)

  /// Starts the keeper; cancel the task to stop it.
  func start() -> Task<Void, Never> {
    Task(executorPreference: executor) {
      guard let notices = store.cancellations(queue: queue) else { return await run() }
      await withDiscardingTaskGroup { group in
        group.addTask { await follow(notices) }
        await run()
        // Stopped (the keeper's task cancelled): the group cancels the follower's iteration.
        group.cancelAll()
      }
    }
  }

  /// Checks at once the held claims each notice concerns, until the task is cancelled or the
  /// store ends the announcements (closed).
  private func follow(_ notices: AsyncStream<CancellationNotice>) async {
    for await notice in notices {
      let claims = held().filter { notice.concerns($0.id) }
      if !claims.isEmpty { await checkClaims(claims) }
    }
  }

  private func run() async {
    var failures = 0
    var due = clock.uptime() + interval
    let checks = checkInterval < interval
    var checkDue = clock.uptime() + checkInterval
    while !Task.isCancelled {
      if checks && checkDue < due {
        if checkDue > clock.uptime() {
          do { try await clock.sleep(untilUptime: checkDue) } catch { return }
        }
        checkDue = clock.uptime() + checkInterval
        await checkClaims()
        continue
      }
      checkDue = due + checkInterval
      if due <= clock.uptime() {
        // Due at once (the last heartbeat took a third of the lease): a sleep until a past
        // deadline may return without suspending, and a store that works on the caller's thread
        // would then keep the thread every queue's keeper shares (``ThreadExecutor/leases``).
        await Task.yield()
        if Task.isCancelled { return }
      } else {
        do { try await clock.sleep(untilUptime: due) } catch { return }
      }
      let sent = ClockReading(clock)
      let started = sent.uptime
      due = started + interval
      let claims = held()
      guard !claims.isEmpty else {
        failures = 0
        continue
      }
      do {
        let kept = Set(try await store.heartbeat(claims, queue: queue, lease: lease, clock: clock))
        failures = 0
        renewed(kept, sent)
        let gone = Set(claims).subtracting(kept)
        if !gone.isEmpty { lost(gone) }
      } catch  where Task.isCancelled {
        return
      } catch {
        // Any other error (a `CancellationError` too, from a store whose task was not cancelled)
        // is a failed heartbeat: try again sooner, from the failure, as the lease runs down.
        failures += 1
        due = clock.uptime() + min(interval, .milliseconds(100) * (1 << min(failures, 5)))
        log(.warning, "could not extend leases; trying again: \(error)")
      }
    }
  }

  /// Asks the store which held claims are still current, and reports the others lost. A failure
  /// is left to the next heartbeat, which will find out.
  private func checkClaims() async {
    await checkClaims(held())
  }

  /// The same for some of the held claims.
  private func checkClaims(_ claims: [ClaimReference]) async {
    guard !claims.isEmpty else { return }
    do {
      let current = Set(try await store.currentClaims(claims, queue: queue))
      let gone = Set(claims).subtracting(current)
      if !gone.isEmpty { lost(gone) }
    } catch {
      if !Task.isCancelled { log(.debug, "could not check which claims are current: \(error)") }
    }
  }
}
