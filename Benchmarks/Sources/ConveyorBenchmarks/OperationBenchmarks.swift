import Conveyor
import Foundation

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

  let blockSeconds = await best {
    drainQueue(count: count, width: width) { BlockOperation {} }
  }
  let asyncSeconds = await best {
    drainQueue(count: count, width: width) {
      AsyncOperation<Void, Never> { operation in operation.finish(returning: ()) }
    }
  }
  let taskSeconds = await best {
    drainQueue(count: count, width: width) { AsyncOperation<Void, Never> {} }
  }
  let syncSeconds = await best {
    drainQueue(count: count, width: width) { SyncOperation<Void, Never> {} }
  }

  Comparison(
    name: "AsyncOperation (finish closure), width \(width)", count: count, seconds: asyncSeconds,
    baselineName: "BlockOperation", baselineSeconds: blockSeconds, goal: 0.8
  ).print()
  Comparison(
    name: "AsyncOperation (async closure, Task), width \(width)", count: count, seconds: taskSeconds,
    baselineName: "BlockOperation", baselineSeconds: blockSeconds, goal: nil
  ).print()
  Comparison(
    name: "SyncOperation, width \(width)", count: count, seconds: syncSeconds,
    baselineName: "BlockOperation", baselineSeconds: blockSeconds, goal: nil
  ).print()
}
