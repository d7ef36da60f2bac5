import Foundation
import Synchronization

/// The source of time for a ``JobQueue``: run dates, retry delays, leases and heartbeats.
///
/// The default, ``SystemJobClock``, reads the system clock. Tests inject a ``ManualJobClock`` so
/// that a 30-second retry or a 60-second lease takes no real time.
public protocol JobClock: Sendable {
  /// The current date.
  func now() -> Date
  /// Suspends until `now()` reaches `deadline`; throws `CancellationError` if the task is
  /// cancelled first.
  func sleep(until deadline: Date) async throws
}

/// The system clock.
public struct SystemJobClock: JobClock {
  /// Creates the system clock.
  public init() {}

  /// `Date()`.
  public func now() -> Date { Date() }

  /// Sleeps with `Task.sleep` until the deadline.
  public func sleep(until deadline: Date) async throws {
    let interval = deadline.timeIntervalSinceNow
    if interval > 0 { try await Task.sleep(for: .milliseconds(Int64((interval * 1000).rounded(.up)))) }
  }
}

/// A clock that moves only when told to: for tests.
///
/// ```swift
/// let clock = ManualJobClock()
/// var configuration = JobQueueConfiguration(identifier: "api-requests")
/// configuration.clock = clock
/// // ... a job answered `.retry` waits for its 15 s interval:
/// clock.advance(by: .seconds(15))
/// ```
public final class ManualJobClock: JobClock {
  private struct Sleeper {
    var deadline: Date
    var continuation: CheckedContinuation<Void, any Error>
  }

  private struct State {
    var now: Date
    var sleepers: [UInt64: Sleeper] = [:]
    var nextToken: UInt64 = 0
  }

  private let state: Mutex<State>

  /// Creates a clock showing `start` (by default 2024-01-01 00:00:00 UTC).
  public init(start: Date = Date(timeIntervalSince1970: 1_704_067_200)) {
    state = Mutex(State(now: start))
  }

  /// The clock's current date.
  public func now() -> Date { state.withLock { $0.now } }

  /// Moves the clock forward and wakes every sleeper whose deadline has come.
  public func advance(by duration: Duration) {
    let due = state.withLock { state -> [CheckedContinuation<Void, any Error>] in
      state.now = state.now.adding(duration)
      let now = state.now
      let tokens = state.sleepers.filter { $0.value.deadline <= now }.map(\.key)
      return tokens.compactMap { state.sleepers.removeValue(forKey: $0)?.continuation }
    }
    for continuation in due { continuation.resume() }
  }

  /// Suspends until ``advance(by:)`` moves the clock to `deadline`.
  public func sleep(until deadline: Date) async throws {
    let token = state.withLock { state -> UInt64 in
      state.nextToken += 1
      return state.nextToken
    }
    try await withTaskCancellationHandler {
      try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
        let outcome = state.withLock { state -> Result<Void, any Error>? in
          if Task.isCancelled { return .failure(CancellationError()) }
          if deadline <= state.now { return .success(()) }
          state.sleepers[token] = Sleeper(deadline: deadline, continuation: continuation)
          return nil
        }
        if let outcome { continuation.resume(with: outcome) }
      }
    } onCancel: {
      let sleeper = state.withLock { $0.sleepers.removeValue(forKey: token) }
      sleeper?.continuation.resume(throwing: CancellationError())
    }
  }
}
