import Foundation
import Synchronization
import Testing

@testable import ConveyorBismuth

/// The slot where a handler waits for the queue's delegate.
@Suite("Bismuth: waiting for a delegate")
struct DelegateSlotTests {
  /// A wait whose time is up before it began ends with `CancellationError`. The timer started
  /// before the waiter was recorded, so a timer that fired first would have found nobody to end,
  /// and the wait would then have lasted until a delegate was set, that is forever here. (Not
  /// seen to fail before the fix: the timer's task always started after the waiter was recorded.)
  @Test func aWaitWhoseTimeIsUpAtOnceEnds() async throws {
    let slot = DelegateSlot()
    let ended = Atomic<Int>(0)
    let waits = Task {
      for _ in 0..<20 {
        do {
          _ = try await slot.waitForDelegate(atMost: .zero)
        } catch {
          ended.add(1, ordering: .relaxed)
        }
      }
    }
    let done = await eventually(within: 90) { ended.load(ordering: .relaxed) == 20 }
    #expect(done, "\(ended.load(ordering: .relaxed)) of 20 waits with no time left had ended after 90 s")
    waits.cancel()
  }

  /// A wait begun by a task already cancelled ends at once. Its cancellation handler ran before
  /// the waiter was recorded, found nobody to end, and the wait lasted its whole limit.
  @Test func aWaitOfACancelledTaskEndsAtOnce() async throws {
    let slot = DelegateSlot()
    let wait = Task {
      withUnsafeCurrentTask { $0?.cancel() }
      _ = try await slot.waitForDelegate(atMost: .seconds(3_600))
    }
    let ended = Atomic<Bool>(false)
    let watcher = Task {
      _ = await wait.result
      ended.store(true, ordering: .releasing)
    }
    let done = await eventually(within: 30) { ended.load(ordering: .acquiring) }
    #expect(done, "a cancelled task's wait for a delegate (an hour) had not ended after 30 s")
    wait.cancel()
    watcher.cancel()
  }
}
