import Conveyor
import ConveyorTesting
import Foundation
import Synchronization
import Testing

@testable import ConveyorPostgres

/// The test helpers of `ConveyorTesting` on PostgreSQL, as their guide says they work: with the
/// store's `clock` option `.caller`, a queue on a `ManualJobClock` runs until idle, its retries
/// taking no real time.
@Suite("ConveyorTesting on PostgreSQL")
struct TestingHelpersOnPostgresTests {
  struct Email: Queueable, Equatable {
    var to: String
  }

  @Test func aQueueRunsUntilIdleOnAManualClockWithTheCallersClock() async throws {
    let server = try await PostgresServer.shared()
    let store = try await PostgresJobStore.open(
      url: server.url, options: .init(schema: uniqueSchema("testing"), clock: .caller))
    let clock = ManualJobClock()
    let attempts = Mutex<[Int]>([])
    let queue = try JobQueue<Email>(
      configuration: .init(
        identifier: "emails", retryPolicy: .fixed(.seconds(15)), autoStart: false, clock: clock),
      store: store
    ) { _, context in
      attempts.withLock { $0.append(context.attempts) }
      if context.attempts < 3 { throw URLError(.timedOut) }
      return .handled
    }
    try await queue.add(Email(to: "ada@example.com"))
    let added = try await store.expectJob(of: Email.self, in: "emails")
    #expect(added.map(\.item) == [Email(to: "ada@example.com")])
    queue.start()
    let run = try await queue.runUntilIdle()
    await queue.shutdown(gracePeriod: .seconds(1))
    #expect(attempts.withLock { $0 } == [1, 2, 3])
    #expect(run.clockAdvances == 2 && run.timeAdvanced == .seconds(30), "\(run)")
    try await store.expectNoJob(of: Email.self, in: "emails")
    await store.close()
  }
}
