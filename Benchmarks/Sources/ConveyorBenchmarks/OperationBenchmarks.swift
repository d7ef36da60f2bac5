import Conveyor
import Foundation
import Synchronization

/// The least an asynchronous operation that runs its work in a `Task` must do: publish
/// `isExecuting` and `isFinished` with KVO, and finish when the task ends. No outcome, no
/// handlers, no cancellation: the baseline of what the `Task` itself costs an operation.
// @unchecked Sendable: its one mutable property is an `Atomic`.
private final class BareTaskOperation: Operation, @unchecked Sendable {
  /// 0 ready, 1 executing, 2 finished.
  private let phase = Atomic<Int>(0)

  override var isAsynchronous: Bool { true }
  override var isExecuting: Bool { phase.load(ordering: .acquiring) == 1 }
  override var isFinished: Bool { phase.load(ordering: .acquiring) == 2 }

  override func start() {
    willChangeValue(forKey: "isExecuting")
    phase.store(1, ordering: .releasing)
    didChangeValue(forKey: "isExecuting")
    Task {
      self.willChangeValue(forKey: "isExecuting")
      self.willChangeValue(forKey: "isFinished")
      self.phase.store(2, ordering: .releasing)
      self.didChangeValue(forKey: "isExecuting")
      self.didChangeValue(forKey: "isFinished")
    }
  }
}

/// Adds `count` operations made by `make` to a fresh queue of the given width and waits for all.
private func drainQueue(count: Int, width: Int, _ make: () -> Operation) {
  let queue = OperationQueue()
  queue.maxConcurrentOperationCount = width
  for _ in 0..<count { queue.addOperation(make()) }
  queue.waitUntilAllOperationsAreFinished()
}

func runOperationBenchmarks() async throws {
  section("Operations: 100k no-op operations on an OperationQueue")
  let count = 100_000
  let width = max(2, ProcessInfo.processInfo.activeProcessorCount)

  // Interleaved rounds, best of each: the machine is shared, so load drifts between runs and a
  // baseline measured only at the start would be unfair to whichever variant ran last.
  var blockSeconds = Double.infinity
  var asyncSeconds = Double.infinity
  var taskSeconds = Double.infinity
  var syncSeconds = Double.infinity
  var bareTaskSeconds = Double.infinity
  for _ in 0..<5 {
    blockSeconds = min(
      blockSeconds, await best(repeats: 1) { drainQueue(count: count, width: width) { BlockOperation {} } })
    asyncSeconds = min(
      asyncSeconds,
      await best(repeats: 1) {
        drainQueue(count: count, width: width) {
          AsyncOperation<Void, Never> { operation in operation.finish(returning: ()) }
        }
      })
    taskSeconds = min(
      taskSeconds,
      await best(repeats: 1) { drainQueue(count: count, width: width) { AsyncOperation<Void, Never> {} } })
    syncSeconds = min(
      syncSeconds,
      await best(repeats: 1) { drainQueue(count: count, width: width) { SyncOperation<Void, Never> {} } })
    bareTaskSeconds = min(
      bareTaskSeconds,
      await best(repeats: 1) { drainQueue(count: count, width: width) { BareTaskOperation() } })
  }

  Comparison(
    name: "AsyncOperation (finish closure), width \(width)", count: count, seconds: asyncSeconds,
    baselineName: "BlockOperation", baselineSeconds: blockSeconds, goal: 0.8
  ).print()
  Comparison(
    name: "AsyncOperation (async closure, Task), width \(width)", count: count, seconds: taskSeconds,
    baselineName: "BlockOperation", baselineSeconds: blockSeconds, goal: nil
  ).print()
  // A fairer baseline for the closure that runs in a `Task`: an operation doing only what any
  // operation running a `Task` must (start the task, publish the KVO changes). Most of the gap to
  // BlockOperation is the task itself: creating it, a hop to the cooperative pool and back.
  Comparison(
    name: "AsyncOperation (async closure, Task), width \(width)", count: count, seconds: taskSeconds,
    baselineName: "bare Operation running a Task", baselineSeconds: bareTaskSeconds, goal: nil
  ).print()
  Comparison(
    name: "SyncOperation, width \(width)", count: count, seconds: syncSeconds,
    baselineName: "BlockOperation", baselineSeconds: blockSeconds, goal: nil
  ).print()
}
