import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import Conveyor

/// A user's clock whose monotonic reading runs at half the rate of its wall clock, leaving
/// `sleep(untilUptime:)` to the protocol's default.
struct HalfRateUptimeClock: JobClock {
  let base: ManualJobClock
  func now() -> Date { base.now() }
  func sleep(until deadline: Date) async throws { try await base.sleep(until: deadline) }
  func uptime() -> Duration { base.uptime() / 2 }
}

/// A clock with only `now()` and `sleep(until:)`: both monotonic methods are the defaults.
struct WallOnlyClock: JobClock {
  func now() -> Date { Date() }
  func sleep(until deadline: Date) async throws { try await SystemJobClock().sleep(until: deadline) }
}

/// The default `sleep(untilUptime:)` of `JobClock`, for clocks that leave it to the protocol.
@Suite("JobClock: the default sleep(untilUptime:)", .serialized)
struct JobClockTests {
  // Failed before the fix: the default measured what was left in uptime() and slept as long on
  // the wall clock, so a clock whose uptime() runs slower woke early.
  @Test("the default sleep(untilUptime:) does not return before uptime() reaches the deadline")
  func defaultSleepWaitsForTheUptimeDeadline() async throws {
    let manual = ManualJobClock()
    let clock = HalfRateUptimeClock(base: manual)
    let deadline = clock.uptime() + .seconds(10)
    let returnedAt = Mutex<Duration?>(nil)
    let sleeper = Task {
      try await clock.sleep(untilUptime: deadline)
      returnedAt.withLock { $0 = clock.uptime() }
    }
    try await waitUntilAsleep(1, on: manual)
    manual.advance(by: .seconds(10))  // uptime() reads 5 s
    try await waitUntilAsleep(1, on: manual, timeout: .seconds(3))
    #expect(returnedAt.withLock { $0 } == nil)
    manual.advance(by: .seconds(10))  // uptime() reads 10 s
    try await sleeper.value
    let at = try #require(returnedAt.withLock { $0 })
    #expect(at >= deadline, "returned at uptime \(at), deadline \(deadline)")
  }

  // Failed before the fix: `deadline - uptime()` (and, before that, the deadline's seconds)
  // trapped for a deadline near the most negative `Duration`.
  @Test("the default sleep(untilUptime:) does not trap on an extreme deadline")
  func defaultSleepDoesNotTrapOnExtremeDeadline() async {
    await #expect(processExitsWith: .success) {
      try? await WallOnlyClock().sleep(untilUptime: Duration(attoseconds: .min))
      try? await WallOnlyClock().sleep(untilUptime: .zero - .seconds(Int64.max))
    }
  }
}
