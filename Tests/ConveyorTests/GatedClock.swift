import Foundation
import Synchronization
import Testing

@testable import Conveyor

/// Which role the current task plays for `GatedClock`.
enum GatedClockRole: Sendable {
  case plain
  /// Blocks inside `now()` (on its own thread) until released: a call that holds the store's lock.
  case holder
  /// Reports each `now()` reading.
  case observed
}

/// The role of the current task (`.plain` unless a test sets it).
enum GatedClockTask {
  @TaskLocal static var role: GatedClockRole = .plain
}

/// A manual clock whose `now()` can block one caller (to hold a store's lock) and report another
/// caller's readings.
final class GatedClock: JobClock, Sendable {
  let base: ManualJobClock
  private let gate = DispatchSemaphore(value: 0)
  let holderEntered: AsyncStream<Void>
  private let holderEnteredContinuation: AsyncStream<Void>.Continuation
  let observedRead: AsyncStream<Void>
  private let observedReadContinuation: AsyncStream<Void>.Continuation

  init(base: ManualJobClock) {
    self.base = base
    (holderEntered, holderEnteredContinuation) = AsyncStream.makeStream()
    (observedRead, observedReadContinuation) = AsyncStream.makeStream()
  }

  func release() { gate.signal() }

  func now() -> Date {
    switch GatedClockTask.role {
    case .plain:
      return base.now()
    case .holder:
      holderEnteredContinuation.yield()
      // Runs on a dedicated thread (a ThreadExecutor), never on the cooperative pool. The test
      // releases it on every path; the bound is only a last resort. (It was 30 s: beside the other
      // suites on two cores, the test's task once woke from its 2 s wait later than that, and the
      // holder let go before the clock moved.)
      _ = gate.wait(timeout: .now() + 600)
      return base.now()
    case .observed:
      let date = base.now()
      observedReadContinuation.yield()
      return date
    }
  }

  func sleep(until deadline: Date) async throws { try await base.sleep(until: deadline) }
  func uptime() -> Duration { base.uptime() }
  func sleep(untilUptime deadline: Duration) async throws { try await base.sleep(untilUptime: deadline) }
}

/// Whether `stream` yields within `seconds`.
func yields(_ stream: AsyncStream<Void>, within seconds: Double) async -> Bool {
  await withTaskGroup(of: Bool.self) { group in
    group.addTask {
      for await _ in stream { return true }
      return false
    }
    group.addTask {
      try? await Task.sleep(for: .seconds(seconds))
      return false
    }
    let first = await group.next() ?? false
    group.cancelAll()
    return first
  }
}

/// Runs `call` (on a thread of its own) while another call holds the store's lock; while it waits,
/// the clock advances by `advance`. Returns what `call` returned.
func whileLockHeld<T: Sendable>(
  store: InMemoryJobStore, clock: GatedClock, queue: String, advance: Duration,
  _ call: @escaping @Sendable () async throws -> T
) async throws -> T {
  // Whatever happens below, the holder is let go.
  defer { clock.release() }
  let holderThread = ThreadExecutor(name: "GatedClock.holder")
  let callerThread = ThreadExecutor(name: "GatedClock.caller")
  let holder = Task(executorPreference: holderThread) {
    try await GatedClockTask.$role.withValue(.holder) {
      // `counts` reads the clock while it holds the store's lock.
      _ = try await store.counts(queue: queue, clock: clock)
    }
  }
  let entered = await yields(clock.holderEntered, within: 30)
  try #require(entered, "the holder never read the clock")
  let caller = Task(executorPreference: callerThread) {
    try await GatedClockTask.$role.withValue(.observed) { try await call() }
  }
  // A store that reads the clock before taking its lock reads it now; one that reads it under the
  // lock cannot until the holder lets go (this wait then simply times out).
  _ = await yields(clock.observedRead, within: 2)
  clock.base.advance(by: advance)
  clock.release()
  try await holder.value
  return try await caller.value
}
