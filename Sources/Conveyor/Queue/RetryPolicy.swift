import Foundation

/// How long a job waits before its next attempt.
///
/// ```swift
/// var configuration = JobQueueConfiguration(identifier: "uploads")
/// configuration.retryPolicy = .exponential(initial: .seconds(1), maximum: .seconds(300))
/// configuration.maxAttempts = 10
/// ```
public struct RetryPolicy: Sendable {
  private let compute: @Sendable (Int) -> Duration

  /// A policy computing the delay from the attempt that just failed (1 for the first).
  public init(_ delay: @escaping @Sendable (_ failedAttempt: Int) -> Duration) {
    compute = delay
  }

  /// The delay after the given failed attempt (1 for the first); never negative.
  public func delay(afterAttempt attempt: Int) -> Duration {
    max(.zero, compute(max(1, attempt)))
  }

  /// The same delay after every attempt. The default is `.fixed(.seconds(15))`.
  public static func fixed(_ interval: Duration) -> RetryPolicy {
    RetryPolicy { _ in interval }
  }

  /// A delay that grows by `multiplier` after each attempt, capped at `maximum`.
  ///
  /// The delay after attempt *n* is `min(maximum, initial × multiplier^(n-1))`, then shortened by
  /// up to `jitter` of itself at random so that many failed jobs do not retry in lockstep.
  ///
  /// - Parameters:
  ///   - initial: the delay after the first failure.
  ///   - multiplier: growth per attempt (≥ 1).
  ///   - maximum: the cap.
  ///   - jitter: fraction in 0...1 by which the delay may be shortened at random; 0 disables it.
  ///   - random: the random source, returning values in 0..<1; inject one to make tests
  ///     deterministic.
  public static func exponential(
    initial: Duration = .seconds(1), multiplier: Double = 2, maximum: Duration = .seconds(600),
    jitter: Double = 0.1, random: @escaping @Sendable () -> Double = { Double.random(in: 0..<1) }
  ) -> RetryPolicy {
    // Clamped to the longest delay a store applies, so the millisecond count below never
    // overflows however large `maximum` is.
    let longest = JobStoreTime.longestDelay.seconds
    let initialSeconds = min(max(0, initial.seconds), longest)
    let maximumSeconds = min(max(0, maximum.seconds), longest)
    let factor = max(1, multiplier)
    let spread = min(1, max(0, jitter))
    return RetryPolicy { attempt in
      let grown = initialSeconds * pow(factor, Double(attempt - 1))
      let capped = min(maximumSeconds, grown.isFinite ? grown : maximumSeconds)
      let jittered = capped * (1 - spread * min(1, max(0, random())))
      return .milliseconds(Int64((jittered * 1000).rounded()))
    }
  }

  /// Any rule: the closure gets the failed attempt (1 for the first) and returns the delay.
  public static func custom(_ delay: @escaping @Sendable (_ failedAttempt: Int) -> Duration) -> RetryPolicy {
    RetryPolicy(delay)
  }
}

extension Duration {
  /// The duration in seconds, as a Double (for any duration: `components` traps on one whose
  /// seconds do not fit an `Int64`).
  var seconds: Double { self / .seconds(1) }
}

extension Date {
  /// This date moved by a duration.
  func adding(_ duration: Duration) -> Date { addingTimeInterval(duration.seconds) }
}
