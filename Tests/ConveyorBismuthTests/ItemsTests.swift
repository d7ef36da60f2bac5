import ConveyorBismuth
import Foundation
import Testing

/// `items` and `count`: every item not handled yet, the running one included, in arrival order.
@Suite("Bismuth: items in arrival order", .timeLimit(.minutes(10)))
@MainActor
struct ItemsTests {
  @Test("items keep arrival order across a retry, and include the running item")
  func itemsOrderAcrossRetry() async throws {
    let config = try temporaryConfig("order", retryTime: 3600, autoStart: false)
    let queue = Bismuth.Queue<NamedItem>(config: config)
    let delegate = RecordingDelegate(answer: .retry)
    queue.delegate = delegate
    queue.add([NamedItem(name: "a"), NamedItem(name: "b"), NamedItem(name: "c")])
    queue.start()
    #expect(await eventually { delegate.seen.count == 3 })
    try await Task.sleep(for: .milliseconds(200))
    #expect(queue.items.map(\.name) == ["a", "b", "c"])
    #expect(queue.count == 3)
    #expect(queue.remove(NamedItem(name: "b")) == 1)
    #expect(queue.items.map(\.name) == ["a", "c"])
    await queue.jobQueue.shutdown(gracePeriod: .zero)
  }
}
