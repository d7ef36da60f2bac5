import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import Conveyor

/// The clock's sleeps, which the queue's loop, its lease keeper and its retries wait on.
@Suite("Sleeps on Dispatch timers", .serialized)
struct TimerTests {
  /// A cancelled sleep frees its timer at once. A queue's loop sleeps until its next poll or
  /// deadline and is woken early by nearly every job, cancelling the sleep; the timer of a
  /// cancelled sleep stayed scheduled (with its closure) until its deadline, so a busy queue with
  /// a long poll interval held one timer per wake-up: a day's poll interval at 10,000 jobs a
  /// second is hundreds of millions.
  @Test func aCancelledSleepFreesItsTimerAtOnce() async throws {
    let clock = SystemJobClock()
    let before = DispatchSleep.liveTimers.load(ordering: .relaxed)
    for _ in 0..<2_000 {
      let sleeper = Task { try await clock.sleep(for: .seconds(3_600)) }
      try await Task.sleep(for: .milliseconds(1))  // the sleep has begun (its timer is scheduled)
      sleeper.cancel()
      _ = await sleeper.result
    }
    // Other tests' queues sleep meanwhile: a few hundred timers at most, not thousands.
    let grown = DispatchSleep.liveTimers.load(ordering: .relaxed) - before
    #expect(grown < 500, "\(grown) more timers scheduled after 2,000 cancelled hour-long sleeps")
  }

  /// The same through a queue: a queue polling once an hour handles 1,000 jobs added one at a
  /// time, its loop going idle between them and woken by each, and keeps no timer per wake-up.
  @Test func aBusyQueueWithALongPollKeepsNoTimerPerWakeUp() async throws {
    struct Item: Queueable { var number: Int }
    let store = InMemoryJobStore()
    let handled = Atomic<Int>(0)
    let configuration = JobQueueConfiguration(identifier: "timers", pollInterval: .seconds(3_600))
    let queue = try JobQueue<Item>(configuration: configuration, store: store) { _, _ in
      handled.add(1, ordering: .relaxed)
      return .handled
    }
    let before = DispatchSleep.liveTimers.load(ordering: .relaxed)
    for number in 0..<1_000 {
      try await queue.add(Item(number: number))
      try await Task.sleep(for: .milliseconds(1))  // the loop goes idle, and sleeps
    }
    let done = await eventually { handled.load(ordering: .relaxed) == 1_000 }
    #expect(done)
    let grown = DispatchSleep.liveTimers.load(ordering: .relaxed) - before
    #expect(grown < 500, "\(grown) more timers scheduled after 1,000 jobs on a queue polling hourly")
    await queue.shutdown()
  }
}
