import ConveyorBismuth
import Foundation
import Testing

/// The synchronous calls (`add`, `items`, `count`, `pause`, `resume`) from the main actor inside a
/// delegate callback and from the cooperative pool.
@Suite("Bismuth: synchronous calls do not deadlock", .timeLimit(.minutes(10)))
@MainActor
struct SynchronousCallsTests {
  @Test("synchronous add, items and count from inside a main-actor delegate callback do not deadlock")
  func syncCallsInsideMainActorCallback() async throws {
    var config = try temporaryConfig("reentrant")
    config.logProxy = { _ in }
    let queue = Bismuth.Queue<NamedItem>(config: config)
    let delegate = RecordingDelegate()
    var inside: [[String]] = []
    delegate.onHandle = { queue, item in
      if item.name == "first" {
        #expect(queue.add(NamedItem(name: "second")))
        inside.append(queue.items.map(\.name))
        inside.append(["\(queue.count)"])
        queue.pause()
        queue.resume()
      }
    }
    queue.delegate = delegate
    queue.add(NamedItem(name: "first"))
    #expect(await eventually { delegate.seen.count == 2 && delegate.finished >= 1 })
    #expect(delegate.seen.map(\.name) == ["first", "second"])
    #expect(inside == [["first", "second"], ["2"]])
    await queue.jobQueue.shutdown(gracePeriod: .zero)
  }

  @Test("synchronous add from many cooperative-pool tasks at once does not deadlock")
  func syncAddFromCooperativePool() async throws {
    let queue = Bismuth.Queue<NamedItem>(config: try temporaryConfig("pool", autoStart: false))
    await withTaskGroup(of: Bool.self) { group in
      for index in 0..<32 {
        group.addTask { queue.add(NamedItem(name: "\(index)")) }
      }
      for await ok in group { #expect(ok) }
    }
    #expect(queue.count == 32)
  }
}
