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
  /// A reading of a clock that never jumps (a step of the wall clock does not move it), for
  /// measuring intervals: the queue times heartbeats, polls and rescues with it.
  func uptime() -> Duration
  /// Suspends until ``uptime()`` reaches `deadline`; throws `CancellationError` if the task is
  /// cancelled first.
  func sleep(untilUptime deadline: Duration) async throws
}

extension JobClock {
  /// The wall clock's reading since 1970: right for clocks that only move forward.
  public func uptime() -> Duration {
    .milliseconds(JobStoreTime.milliseconds(now()))
  }

  /// Sleeps on the wall clock (``sleep(until:)``) for what is left until ``uptime()`` reaches
  /// `deadline`, again until it has: right for clocks whose wall reading only moves forward,
  /// whichever ``uptime()`` they have, one that runs slower than the wall clock too. Each sleep
  /// ends a microsecond short of what is left (a wall clock stepped by hand can fall short of a
  /// target by a rounding) and lasts at least a microsecond, so the loop waits for the wall clock
  /// to move and never spins. The arithmetic is in `Double` seconds, so no deadline traps. (It
  /// slept until the date `deadline` after 1970, right only for the default ``uptime()``: a clock
  /// with its own returned at once from every sleep, and an idle queue on it called its store
  /// without pause.)
  public func sleep(untilUptime deadline: Duration) async throws {
    while true {
      let left = deadline.seconds - uptime().seconds
      guard left > 0 else { return try Task.checkCancellation() }
      try await sleep(until: now().addingTimeInterval(max(left - 0.000_001, 0.000_001)))
    }
  }

  /// Sleeps for `duration` of ``uptime()``, which a step of the wall clock does not affect.
  public func sleep(for duration: Duration) async throws {
    try await sleep(untilUptime: uptime() + duration)
  }
}

/// The system clock.
public struct SystemJobClock: JobClock {
  /// Creates the system clock.
  public init() {}

  /// `Date()`.
  public func now() -> Date { Date() }

  /// Sleeps until the wall clock shows `deadline` (measured once, then monotonically).
  public func sleep(until deadline: Date) async throws {
    let interval = deadline.timeIntervalSinceNow
    guard interval > 0 else { return try Task.checkCancellation() }
    let capped = min(interval, JobStoreTime.longestDelay.seconds)
    try await sleep(for: .milliseconds(Int64((capped * 1000).rounded(.up))))
  }

  /// Time since an arbitrary start, on the monotonic `ContinuousClock`.
  public func uptime() -> Duration { Self.origin.duration(to: .now) }

  /// Sleeps until ``uptime()`` reaches `deadline`, on a Dispatch timer (monotonic).
  ///
  /// The timer fires on a Dispatch queue of its own, not on Swift's cooperative pool, so a task
  /// that prefers its own executor (the queue's lease keeper) wakes on time however busy the pool
  /// is.
  public func sleep(untilUptime deadline: Duration) async throws {
    try await DispatchSleep.sleep(for: deadline - uptime())
  }

  private static let origin = ContinuousClock.now
}

/// A cancellable sleep on a Dispatch timer (monotonic, independent of the cooperative pool).
///
/// Each sleep has a timer source of its own, cancelled (and so freed) as soon as the sleep ends,
/// by its deadline or by the task's cancellation. A queue's loop sleeps until its next poll and
/// is woken early by nearly every job; with `asyncAfter`, whose timer cannot be cancelled, every
/// early wake-up left a timer and its closure scheduled until the deadline, one per wake-up.
package enum DispatchSleep {
  private static let timers = DispatchQueue(label: "Conveyor.timers")

  /// Timers scheduled and not yet cancelled (for tests).
  package static let liveTimers = Atomic<Int>(0)

  /// A sleep's timer source, held by the sleeper to cancel it from whichever thread ends the
  /// sleep. Safe to send: libdispatch allows `cancel()` from any thread, and the one reference is
  /// stored and taken only under the lock of `Sleeper.state`.
  private struct SharedTimer: @unchecked Sendable {
    let source: any DispatchSourceTimer
  }

  private final class Sleeper: Sendable {
    private struct State {
      var continuation: CheckedContinuation<Void, any Error>?
      var ended = false
      var timer: SharedTimer?
    }

    private let state = Mutex(State())

    /// Keeps the continuation; false when the sleep was already cancelled.
    func install(_ continuation: CheckedContinuation<Void, any Error>) -> Bool {
      state.withLock { state in
        if state.ended { return false }
        state.continuation = continuation
        return true
      }
    }

    /// Keeps the running timer, to cancel it when the sleep ends; cancels it at once when the
    /// sleep already ended (it was cancelled meanwhile).
    func attach(_ timer: SharedTimer) {
      let ended = state.withLock { state -> Bool in
        if !state.ended { state.timer = timer }
        return state.ended
      }
      if ended { timer.source.cancel() }
    }

    /// Ends the sleep (once): cancels its timer and resumes the sleeping task.
    func finish(_ result: Result<Void, any Error>) {
      let (continuation, timer) = state.withLock { state in
        state.ended = true
        defer {
          state.continuation = nil
          state.timer = nil
        }
        return (state.continuation, state.timer)
      }
      timer?.source.cancel()
      continuation?.resume(with: result)
    }
  }

  /// Sleeps for `duration` (at most ``JobStoreTime/longestDelay``); throws `CancellationError`
  /// when the task is cancelled first.
  package static func sleep(for duration: Duration) async throws {
    try Task.checkCancellation()
    guard duration > .zero else { return }
    let (seconds, attoseconds) = min(duration, JobStoreTime.longestDelay).components
    let nanoseconds = seconds * 1_000_000_000 + attoseconds / 1_000_000_000
    let sleeper = Sleeper()
    try await withTaskCancellationHandler {
      try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
        guard sleeper.install(continuation) else {
          return continuation.resume(throwing: CancellationError())
        }
        // `Int` is 32 bits on watchOS: a delay it cannot hold in nanoseconds goes in seconds.
        let delay: DispatchTimeInterval =
          nanoseconds <= Int64(Int.max) ? .nanoseconds(Int(nanoseconds)) : .seconds(Int(clamping: seconds))
        let timer = DispatchSource.makeTimerSource(queue: timers)
        timer.schedule(deadline: .now() + delay, leeway: .milliseconds(1))
        timer.setEventHandler { sleeper.finish(.success(())) }
        // Cancelling drops the handlers, and with them the timer's reference to the sleeper.
        timer.setCancelHandler { liveTimers.subtract(1, ordering: .relaxed) }
        liveTimers.add(1, ordering: .relaxed)
        timer.resume()
        sleeper.attach(SharedTimer(source: timer))
      }
    } onCancel: {
      sleeper.finish(.failure(CancellationError()))
    }
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
///
/// It keeps two readings, as a computer does: the wall clock (``now()``), which ``step(by:)`` can
/// move back or forward as an administrator or NTP would, and a monotonic one (``uptime()``)
/// that only ``advance(by:)`` moves.
public final class ManualJobClock: JobClock {
  private enum Deadline {
    case wall(Date)
    case monotonic(Duration)
  }

  private struct Sleeper {
    var deadline: Deadline
    var continuation: CheckedContinuation<Void, any Error>
  }

  private struct State {
    var now: Date
    var elapsed: Duration = .zero
    var sleepers: [UInt64: Sleeper] = [:]
    var nextToken: UInt64 = 0

    func isDue(_ deadline: Deadline) -> Bool {
      switch deadline {
      case .wall(let date): date <= now
      case .monotonic(let instant): instant <= elapsed
      }
    }

    mutating func takeDue() -> [CheckedContinuation<Void, any Error>] {
      let tokens = sleepers.filter { isDue($0.value.deadline) }.map(\.key)
      return tokens.compactMap { sleepers.removeValue(forKey: $0)?.continuation }
    }
  }

  private let state: Mutex<State>

  /// Creates a clock showing `start` (by default 2024-01-01 00:00:00 UTC).
  public init(start: Date = Date(timeIntervalSince1970: 1_704_067_200)) {
    state = Mutex(State(now: start))
  }

  /// The clock's current wall-clock date.
  public func now() -> Date { state.withLock { $0.now } }

  /// Moves time forward (both readings) and wakes every sleeper whose deadline has come. A
  /// negative duration does nothing.
  public func advance(by duration: Duration) {
    guard duration > .zero else { return }
    let due = state.withLock { state in
      state.now = state.now.addingTimeInterval(duration.seconds)
      state.elapsed += duration
      return state.takeDue()
    }
    for continuation in due { continuation.resume() }
  }

  /// Steps the wall clock only, forward or back, as a clock adjustment would; monotonic sleeps
  /// (``sleep(for:)``) are not affected.
  public func step(by duration: Duration) {
    let due = state.withLock { state in
      state.now = state.now.addingTimeInterval(duration.seconds)
      return state.takeDue()
    }
    for continuation in due { continuation.resume() }
  }

  /// Suspends until the wall clock reaches `deadline`.
  public func sleep(until deadline: Date) async throws {
    try await sleep(.wall(deadline))
  }

  /// The total of every ``advance(by:)`` so far (``step(by:)`` does not count).
  public func uptime() -> Duration { state.withLock { $0.elapsed } }

  /// How many sleeps wait on this clock: a test advances time once the code it drives sleeps
  /// again, so that a loop woken by one advance is not overtaken by the next.
  public var sleeping: Int { state.withLock { $0.sleepers.count } }

  /// Suspends until ``advance(by:)`` has moved ``uptime()`` to `deadline`.
  public func sleep(untilUptime deadline: Duration) async throws {
    try await sleep(.monotonic(deadline))
  }

  private func sleep(_ deadline: Deadline) async throws {
    let token = state.withLock { state -> UInt64 in
      state.nextToken += 1
      return state.nextToken
    }
    try await withTaskCancellationHandler {
      try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
        let outcome = state.withLock { state -> Result<Void, any Error>? in
          if Task.isCancelled { return .failure(CancellationError()) }
          if state.isDue(deadline) { return .success(()) }
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
