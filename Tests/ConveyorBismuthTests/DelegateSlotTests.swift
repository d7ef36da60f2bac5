import Foundation
import Synchronization
import Testing

@testable import ConveyorBismuth

/// The slot where a handler waits for the queue's delegate, and the items that wait in it.
@Suite("Bismuth: waiting for a delegate")
struct DelegateSlotTests {
  /// A wait whose time is up before it began ends with `CancellationError`. The timer started
  /// before the waiter was recorded, so a timer that fired first would have found nobody to end,
  /// and the wait would then have lasted until a delegate was set, that is forever here. (Not
  /// seen to fail before the fix: the timer's task always started after the waiter was recorded.)
  @Test func aWaitWhoseTimeIsUpAtOnceEnds() async throws {
    let slot = DelegateSlot()
    let ended = Atomic<Int>(0)
    // Side by side: one after another, each wait took a few hops through a cooperative pool that
    // a loaded machine made seconds late, and 20 of them outlasted the bound.
    let waits = Task {
      await withTaskGroup(of: Bool.self) { group in
        for _ in 0..<20 {
          group.addTask { (try? await slot.waitForDelegate(atMost: .zero)) == nil }
        }
        for await endedWithoutDelegate in group where endedWithoutDelegate {
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

  /// A queue with no delegate (autoStart is the default) claimed an item and held it forever (its
  /// lease is renewed while it waits for a delegate), so another queue instance on the same file,
  /// with a delegate, never got it. Failed before the fix: `Adapter.queue(_:handle:...)` waited in
  /// `DelegateSlot.waitForDelegate()` with no bound.
  @Test(
    "an instance without a delegate does not keep an item from an instance with one", .timeLimit(.minutes(10))
  )
  @MainActor func delegatelessInstanceHoldsItem() async throws {
    let config = try temporaryConfig("shared", retryTime: 0)
    let idle = Bismuth.Queue<NamedItem>(config: config)  // autoStart, no delegate yet
    idle.add(NamedItem(name: "a"))
    // Several poll intervals: the delegate-less queue must not claim it meanwhile.
    try await Task.sleep(for: .seconds(2))
    #expect(try await idle.jobQueue.count().running == 0, "claimed by a queue that cannot handle it")
    let worker = Bismuth.Queue<NamedItem>(config: config)
    let delegate = RecordingDelegate()
    worker.delegate = delegate
    let handled = await eventually { !delegate.seen.isEmpty }
    #expect(handled, "the item stayed claimed by the instance that has no delegate")
    await idle.jobQueue.shutdown(gracePeriod: .zero)
    await worker.jobQueue.shutdown(gracePeriod: .zero)
  }

  @Test(
    "an item added to a queue without a delegate, then shut down, comes back with no attempt used",
    .timeLimit(.minutes(10)))
  @MainActor func shutdownWhileWaitingForDelegate() async throws {
    let config = try temporaryConfig("wait", retryTime: 3600)  // a retry would be an hour away
    let first = Bismuth.Queue<NamedItem>(config: config)
    first.add(NamedItem(name: "a"))
    try await Task.sleep(for: .milliseconds(300))
    await first.jobQueue.shutdown(gracePeriod: .zero)
    let second = Bismuth.Queue<NamedItem>(config: config)
    let delegate = RecordingDelegate()
    second.delegate = delegate
    #expect(await eventually { !delegate.seen.isEmpty })
    #expect(delegate.seen.map(\.attempts) == [0])
    await second.jobQueue.shutdown(gracePeriod: .zero)
  }

  @Test(
    "a queue released while its item waits for a delegate leaves the item, no attempt used",
    .timeLimit(.minutes(10)))
  @MainActor func releasedWhileWaitingForDelegate() async throws {
    let config = try temporaryConfig("released", retryTime: 3600)
    do {
      let first = Bismuth.Queue<NamedItem>(config: config)
      first.add(NamedItem(name: "a"))
      try await Task.sleep(for: .milliseconds(300))
    }
    let second = Bismuth.Queue<NamedItem>(config: config)
    let delegate = RecordingDelegate()
    second.delegate = delegate
    // The released queue's shutdown has a 5 s grace period; the 90 s wait is far beyond it.
    #expect(await eventually { !delegate.seen.isEmpty })
    #expect(delegate.seen.map(\.attempts) == [0])
    await second.jobQueue.shutdown(gracePeriod: .zero)
  }
}
