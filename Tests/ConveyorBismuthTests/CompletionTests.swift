import ConveyorBismuth
import Foundation
import Testing

/// What the queue does with a handler's completion: the first call counts, later ones and the
/// calls for an item removed meanwhile are ignored.
@Suite("Bismuth: a handler's completion", .timeLimit(.minutes(10)))
@MainActor
struct CompletionTests {
  @Test("a second completion call is ignored: .retry then .handled retries once")
  func completionTwice() async throws {
    let queue = Bismuth.Queue<NamedItem>(config: try temporaryConfig("twice", retryTime: 0))
    let delegate = RecordingDelegate(keepCompletion: true)
    queue.delegate = delegate
    queue.add(NamedItem(name: "a"))
    #expect(await eventually { delegate.kept.count == 1 })
    delegate.keepCompletion = false
    delegate.kept[0](.retry)
    delegate.kept[0](.handled)
    #expect(await eventually { delegate.seen.count == 2 && delegate.finished >= 1 })
    #expect(delegate.seen.map(\.attempts) == [0, 1])
    await queue.jobQueue.shutdown(gracePeriod: .zero)
  }

  @Test("remove(item) of the running item: its later .retry is ignored and it never runs again")
  func removeRunningItem() async throws {
    let queue = Bismuth.Queue<NamedItem>(config: try temporaryConfig("remove-running", retryTime: 0))
    let delegate = RecordingDelegate(keepCompletion: true)
    queue.delegate = delegate
    let item = NamedItem(name: "running")
    queue.add(item)
    #expect(await eventually { delegate.kept.count == 1 })
    #expect(queue.state == .running)
    #expect(queue.items == [item])
    #expect(queue.remove(item) == 1)
    #expect(queue.items.isEmpty)
    delegate.kept[0](.retry)
    #expect(await eventually { delegate.finished >= 1 })
    try await Task.sleep(for: .milliseconds(300))
    #expect(delegate.seen.count == 1)
    #expect(queue.isEmpty)
    await queue.jobQueue.shutdown(gracePeriod: .zero)
  }
}
