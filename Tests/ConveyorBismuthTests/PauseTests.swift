import ConveyorBismuth
import Foundation
import Testing

/// `pause()` and `resume()` while items run.
@Suite("Bismuth: pause and resume", .timeLimit(.minutes(10)))
@MainActor
struct PauseTests {
  @Test("pause() while an item runs: it finishes, nothing else starts until resume()")
  func pauseWhileRunning() async throws {
    let queue = Bismuth.Queue<NamedItem>(config: try temporaryConfig("pause-running"))
    let delegate = RecordingDelegate(keepCompletion: true)
    queue.delegate = delegate
    queue.add([NamedItem(name: "a"), NamedItem(name: "b")])
    #expect(await eventually { delegate.kept.count == 1 })
    queue.pause()
    #expect(queue.state == .paused)
    delegate.keepCompletion = false
    delegate.kept[0](.handled)
    // "a" leaves the queue once its completion is stored (a loaded machine takes its time)...
    #expect(await eventually { queue.items.map(\.name) == ["b"] })
    // ...and "b" does not start while paused.
    try await Task.sleep(for: .milliseconds(500))
    #expect(delegate.seen.map(\.name) == ["a"])
    #expect(queue.items.map(\.name) == ["b"])
    queue.resume()
    #expect(await eventually { delegate.seen.count == 2 })
    #expect(await eventually { queue.isEmpty })
    await queue.jobQueue.shutdown(gracePeriod: .zero)
  }
}
