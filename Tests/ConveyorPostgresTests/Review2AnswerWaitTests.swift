import Conveyor
import Foundation
import Synchronization
import Testing

@testable import ConveyorPostgres

/// Second review of the brief wait for an answer (`answerWait`): promises that did not hold, each
/// with the test that failed (a third finding, a doc comment that said 5 ms where the code clamps
/// to 1 ms, was fixed in the comment).
@Suite("Review 2: PostgreSQL callers waiting briefly for their answer", .serialized)
struct Review2AnswerWaitTests {
  /// "No caller waits ... for 10 ms after calls overlapped" (README), "none overlapped another
  /// lately" (`isQuiet`). The window is measured from the *start* of an overlap (`begin`), not
  /// from its end: two calls that overlap for longer than `busyFor` leave no quiet time at all
  /// once they end.
  @Test func anOverlapLongerThanTheWindowStillKeepsCallersFromWaitingAfterIt() async throws {
    let calls = SerializedConnection.CallsInFlight(busyFor: .milliseconds(100))
    calls.begin()
    calls.begin()  // two calls overlap...
    try await Task.sleep(for: .milliseconds(300))  // ...for 300 ms
    calls.end()
    calls.end()  // the overlap ended just now
    #expect(!calls.isQuiet, "callers may wait right after a 300 ms overlap (busyFor 100 ms)")
  }

  /// The same, end to end on one connection: a worker's call queued behind another worker's
  /// long call (a lock wait, a batch). When both are answered, the next call is alone, its
  /// connection's last block was short, and it waits, although calls overlapped a moment ago.
  @Test func aCallRightAfterALongOverlapDoesNotWait() async throws {
    let server = try await PostgresServer.shared()
    let calls = SerializedConnection.CallsInFlight(busyFor: .milliseconds(500))
    let connection = AnswerWaitTests.connection(server, answerWait: .milliseconds(1), calls: calls)
    _ = try await AnswerWaitTests.selectOne(connection)  // connects
    let long = Task {
      try await connection.perform(idempotent: true) { _ = try $0.execute("SELECT pg_sleep(1)") }
    }
    while calls.count.load(ordering: .relaxed) == 0 { try await Task.sleep(for: .milliseconds(1)) }
    // Queued behind the sleep: two calls in flight for about a second.
    let queued = Task { try await AnswerWaitTests.selectOne(connection) }
    try await long.value
    #expect(try await queued.value == 1)
    let overlapEnded = ContinuousClock.now
    let before = connection.answeredWhileWaiting.load(ordering: .relaxed)
    for _ in 0..<20 { _ = try await AnswerWaitTests.selectOne(connection) }
    let elapsed = ContinuousClock.now - overlapEnded
    let waited = connection.answeredWhileWaiting.load(ordering: .relaxed) - before
    if elapsed < .milliseconds(400) {
      #expect(
        waited == 0,
        "\(waited) of 20 calls within \(elapsed) of a 1 s overlap waited (busyFor 500 ms)")
    }
    await connection.close()
  }

  /// `nanoseconds(_:)` guards `seconds >= 0` as if it handled negative durations, but a negative
  /// duration of less than a second has `seconds == 0` and negative attoseconds:
  /// `UInt64(attoseconds / 1e9)` traps. Reachable through `CallsInFlight(busyFor:)`, which does not
  /// clamp (unlike `answerWait`).
  /// (Before the fix this trapped, ending the test run.)
  @Test func aNegativeSubSecondDurationDoesNotTrap() {
    #expect(Duration.nanoseconds(-5).components.seconds == 0)
    #expect(SerializedConnection.nanoseconds(.nanoseconds(-5)) == 0)
    #expect(SerializedConnection.nanoseconds(.seconds(-3)) == 0)
    #expect(SerializedConnection.nanoseconds(.microseconds(1_500)) == 1_500_000)
    let calls = SerializedConnection.CallsInFlight(busyFor: .nanoseconds(-5))
    #expect(calls.busyFor == 0)
  }
}
