import Foundation

/// Where a queue's tasks run and how it waits in real time: the seams a deterministic simulation
/// of the engine replaces (`Tests/ConveyorSimulation`). In production (``production``) every task
/// runs on Swift's global executor, the lease keeper on a thread of its own
/// (``ThreadExecutor/leases``), and real-time waits (a shutdown's grace period, the patience of the
/// last flush) use the system's monotonic clock.
package struct QueueRuntime: Sendable {
  /// The executor every task of the queue prefers (its loop, its workers, its watchers); nil: the
  /// global executor.
  package var executor: (any TaskExecutor)?
  /// The executor the lease keeper prefers.
  package var leaseExecutor: any TaskExecutor
  /// A monotonic reading for waits bounded in real time whatever the queue's clock.
  package var elapsed: @Sendable () -> Duration
  /// Sleeps for a real-time duration; throws `CancellationError` when the task is cancelled.
  package var sleep: @Sendable (Duration) async throws -> Void

  package init(
    executor: (any TaskExecutor)?, leaseExecutor: any TaskExecutor,
    elapsed: @escaping @Sendable () -> Duration,
    sleep: @escaping @Sendable (Duration) async throws -> Void
  ) {
    self.executor = executor
    self.leaseExecutor = leaseExecutor
    self.elapsed = elapsed
    self.sleep = sleep
  }

  /// The global executor, the lease thread, and the system's monotonic clock.
  package static let production = QueueRuntime(
    executor: nil, leaseExecutor: ThreadExecutor.leases,
    elapsed: { ContinuousClock.now - origin },
    sleep: { try await DispatchSleep.sleep(for: $0) })

  private static let origin = ContinuousClock.now

  /// The same, with every task and wait on `clock` and `executor` (a simulation's).
  package static func simulated(executor: any TaskExecutor, clock: any JobClock) -> QueueRuntime {
    QueueRuntime(
      executor: executor, leaseExecutor: executor, elapsed: { clock.uptime() },
      sleep: { try await clock.sleep(for: $0) })
  }
}
