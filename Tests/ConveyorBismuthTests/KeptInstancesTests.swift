import Conveyor
import Foundation
import Testing

@testable import ConveyorBismuth

// The instances a queue keeps so that `remove(item)` and `items` compare items as they were
// added (`==` may use state the item does not encode), and the bound on their number.

@MainActor
private final class HandleAll: BismuthQueueDelegate {
  func queue<T>(
    _ queue: Bismuth.Queue<T>, handle item: T, completion: @escaping (Bismuth.HandleResult) -> Void
  ) where T: BismuthQueueable {
    completion(.handled)
  }
}

@MainActor
private final class RetryAll: BismuthQueueDelegate {
  func queue<T>(
    _ queue: Bismuth.Queue<T>, handle item: T, completion: @escaping (Bismuth.HandleResult) -> Void
  ) where T: BismuthQueueable {
    completion(.retry)
  }
}

@Suite("Bismuth: items compared as they were added", .timeLimit(.minutes(10)))
@MainActor
struct KeptInstancesTests {
  private func config(_ name: String, autoStart: Bool = false) throws -> Bismuth.Config {
    try temporaryConfig(name, retryTime: 0, autoStart: autoStart)
  }

  @Test("remove(item) finds an item whose == uses state it does not encode, and items returns it")
  func removeComparesTheAddedInstance() throws {
    let queue = Bismuth.Queue<QueueItem>(config: try config("remove"))
    let items = (1...3).map { QueueItem(url: "https://example.com/\($0)") }
    queue.add(items)
    #expect(queue.items == items)
    #expect(queue.remove(items[1]) == 1)
    #expect(queue.items == [items[0], items[2]])
    #expect(queue.remove(queue.items[0]) == 1)
    #expect(queue.count == 1)
  }

  @Test("after a restart only encoded state counts: the decoded item is not == the one added")
  func afterARestartOnlyEncodedStateCounts() throws {
    let config = try config("restart")
    let item = QueueItem(url: "https://example.com/kept")
    do {
      let first = Bismuth.Queue<QueueItem>(config: config)
      first.add(item)
    }
    let second = Bismuth.Queue<QueueItem>(config: config)
    #expect(second.items.map(\.url) == [item.url])
    #expect(second.remove(item) == 0)
    #expect(second.count == 1)
  }

  @Test("an instance is dropped when its job is handled, removed or cleared")
  func instancesAreDropped() async throws {
    let queue = Bismuth.Queue<QueueItem>(config: try config("dropped"))
    queue.add((1...20).map { QueueItem(url: "https://example.com/\($0)") })
    #expect(queue.keptInstanceCount == 20)
    #expect(queue.remove(queue.items[0]) == 1)
    #expect(queue.keptInstanceCount == 19)
    queue.clear()
    #expect(queue.keptInstanceCount == 0)

    queue.add((1...20).map { QueueItem(url: "https://example.com/again/\($0)") })
    let delegate = HandleAll()
    queue.delegate = delegate
    queue.start()
    await queue.jobQueue.waitUntilFinished()
    #expect(await eventually { queue.keptInstanceCount == 0 })
    await queue.jobQueue.shutdown(gracePeriod: .zero)
  }

  @Test("instances of jobs handled by another instance are dropped by the next listing")
  func jobsHandledElsewhereAreDropped() async throws {
    let config = try config("elsewhere")
    let adder = Bismuth.Queue<QueueItem>(config: config)
    adder.add((1...5).map { QueueItem(url: "https://example.com/\($0)") })
    #expect(adder.keptInstanceCount == 5)
    var workerConfig = config
    workerConfig.autoStart = true
    let worker = Bismuth.Queue<QueueItem>(config: workerConfig)
    let delegate = HandleAll()
    worker.delegate = delegate
    await worker.jobQueue.waitUntilFinished()
    #expect(adder.items.isEmpty)
    #expect(adder.keptInstanceCount == 0)
    await worker.jobQueue.shutdown(gracePeriod: .zero)
  }

  @Test("many adds whose jobs end elsewhere keep a bounded number of instances")
  func keptInstancesStayBounded() async throws {
    let config = try config("bounded")
    let adder = Bismuth.Queue<QueueItem>(config: config)
    var workerConfig = config
    workerConfig.autoStart = true
    let worker = Bismuth.Queue<QueueItem>(config: workerConfig)
    let delegate = HandleAll()
    worker.delegate = delegate
    for round in 0..<10 {
      adder.add((0..<500).map { QueueItem(url: "https://example.com/\(round)/\($0)") })
      await worker.jobQueue.waitUntilFinished()
    }
    // 5000 added and handled by the other instance: the adder looked again once it kept 1024.
    #expect(adder.keptInstanceCount <= 1024)
    await worker.jobQueue.shutdown(gracePeriod: .zero)
  }

  @Test("a job reported handled before its add returned is not kept")
  func handledBeforeTheAddReturned() {
    let kept = KeptInstances<QueueItem>()
    let id = JobID(7)
    kept.beginAdd()
    kept.finished(id)
    kept.endAdd(keeping: [(id, QueueItem(url: "https://example.com/fast"))])
    #expect(kept.count == 0)
    // Once no add is in flight, the early reports are forgotten.
    kept.beginAdd()
    kept.endAdd(keeping: [(id, QueueItem(url: "https://example.com/again"))])
    #expect(kept.count == 1)
  }

  @Test("an item whose job died and was re-queued is still removed by remove(item) and listed as added")
  func removeAfterTheDeadJobIsRequeued() async throws {
    var config = try config("requeued")
    config.maxAttempts = 1
    let queue = Bismuth.Queue<QueueItem>(config: config)
    let item = QueueItem(url: "https://example.com/dies-once")
    queue.add(item)
    let delegate = RetryAll()
    queue.delegate = delegate
    queue.start()
    let deadline = Date().addingTimeInterval(90)
    while try await queue.jobQueue.count().dead == 0, Date() < deadline {
      try await Task.sleep(for: .milliseconds(20))
    }
    #expect(try await queue.jobQueue.count().dead == 1)
    queue.delegate = nil
    #expect(try await queue.jobQueue.requeueDead() == 1)
    // Waiting again, added in this process by this queue: compared as it was added.
    #expect(queue.items == [item])
    #expect(queue.remove(item) == 1)
    #expect(queue.isEmpty)
    await queue.jobQueue.shutdown(gracePeriod: .zero)
  }
}
