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

  // Interleaved rounds, best of each: the machine is shared, so load drifts between runs and a
  // baseline measured only at the start would be unfair to whichever variant ran last.
  var blockSeconds = Double.infinity
  var asyncSeconds = Double.infinity
  var taskSeconds = Double.infinity
  var syncSeconds = Double.infinity
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
