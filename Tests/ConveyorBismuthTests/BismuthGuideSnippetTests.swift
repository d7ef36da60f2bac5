import ConveyorBismuth
import Foundation
import Testing

// The examples of this module's landing page (ConveyorBismuth.md) and of "Migrating from Bismuth"
// (Sources/ConveyorBismuth/ConveyorBismuth.docc/MigratingFromBismuth.md), verbatim between the
// markers, in a `@MainActor` controller as the guides assume. The item is the old README's
// `RequestQueueItem` (BismuthReadmeTests.swift).

@MainActor
final class GuideController: BismuthQueueDelegate {
  var queue: Bismuth.Queue<RequestQueueItem>!

  func queue<T>(
    _ queue: Bismuth.Queue<T>, handle item: T, completion: @escaping (Bismuth.HandleResult) -> Void
  ) where T: BismuthQueueable {
    completion(.handled)
  }

  /// The landing page's example. Compiled, not run: with no `databaseURL` it opens Conveyor's
  /// default database in the user's own data folder.
  func landingPageExample() {
    // ConveyorBismuth.md example begins
    var config = Bismuth.Config(identifier: "api-requests")
    config.logProxy = { line in print("[REQ] \(line)") }
    config.retryTime = 30  // Default: 15

    queue = Bismuth.Queue<RequestQueueItem>(config: config)
    queue.delegate = self  // a @MainActor view controller is fine
    queue.add(RequestQueueItem(url: "https://example.com/api/get"))
    // ConveyorBismuth.md example ends
  }

  /// The migration guide's equality example, on a queue that has not started.
  func removeByEquality(databaseURL: URL) -> [RequestQueueItem] {
    var config = Bismuth.Config(identifier: "guide-equality")
    config.autoStart = false
    config.databaseURL = databaseURL
    queue = Bismuth.Queue<RequestQueueItem>(config: config)
    // MigratingFromBismuth.md example begins
    let item = RequestQueueItem(url: "https://example.com/api/items/1")
    queue.add(item)
    queue.remove(item)  // removed, as before
    // MigratingFromBismuth.md example ends
    return queue.items
  }
}

@Suite("Guide snippets: Bismuth drop-in")
@MainActor
struct BismuthGuideSnippetTests {
  @Test func removeFindsTheInstanceThatWasAdded() throws {
    let controller = GuideController()
    #expect(controller.removeByEquality(databaseURL: try temporaryDatabase()).isEmpty)
  }
}
