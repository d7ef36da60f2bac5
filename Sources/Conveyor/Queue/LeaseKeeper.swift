import Foundation

/// Keeps a queue's leases alive: every third of the lease it heartbeats every claim the queue
/// holds, and tells the queue which ones it lost.
///
/// It runs as one task that prefers ``ThreadExecutor/leases``, a thread of its own, and sleeps on
/// the clock's monotonic ``JobClock/sleep(for:)``: neither CPU-bound handlers filling the
/// cooperative pool nor a step of the wall clock can delay a heartbeat. The store computes each
/// new expiry from its clock while it holds its lock.
struct LeaseKeeper: Sendable {
  var store: any JobStore
  var queue: String
  var lease: Lease
  var clock: any JobClock
  /// The claims to keep: read before each heartbeat.
  var held: @Sendable () -> [ClaimReference]
  /// Claims the store no longer holds for this queue.
  var lost: @Sendable (Set<ClaimReference>) -> Void
  var log: @Sendable (LogRecord.Level, String) -> Void

  /// How long between heartbeats: a third of the lease, so two can fail before it lapses.
  var interval: Duration { lease.duration / 3 }

  /// Starts the keeper; cancel the task to stop it.
  func start() -> Task<Void, Never> {
    Task(executorPreference: ThreadExecutor.leases) { await run() }
  }

  private func run() async {
    var failures = 0
    while !Task.isCancelled {
      // After a failure, try again sooner: the lease is still running down.
      let wait = failures == 0 ? interval : min(interval, .milliseconds(100) * (1 << min(failures, 5)))
      do { try await clock.sleep(for: wait) } catch { return }
      let claims = held()
      guard !claims.isEmpty else {
        failures = 0
        continue
      }
      do {
        let kept = Set(try await store.heartbeat(claims, queue: queue, lease: lease, clock: clock))
        failures = 0
        let gone = Set(claims).subtracting(kept)
        if !gone.isEmpty { lost(gone) }
      } catch is CancellationError {
        return
      } catch {
        failures += 1
        log(.warning, "could not extend leases; trying again: \(error)")
      }
    }
  }
}
