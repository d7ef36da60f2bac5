import ConveyorBismuth
import Foundation
import Testing

/// `Config.databaseURL`: the file the queue's items are committed to.
@Suite("Bismuth: the database file", .timeLimit(.minutes(10)))
@MainActor
struct DatabaseFileTests {
  /// A databaseURL in a folder that did not exist yet (an app's Application Support subfolder on
  /// first launch) silently fell back to memory: `add` returned true ("committed to the database")
  /// and, with the default logProxy of nil, nothing said the items would be gone at the next
  /// launch. Failed before the fix: `Bismuth.Queue.init(config:)` caught the open error and used
  /// `InMemoryJobStore`, as `SQLiteJobStore(path:)` needs the folder to exist.
  @Test("a databaseURL in a folder not created yet still gives a durable queue")
  func databaseInMissingFolder() throws {
    let url = try temporaryDatabase().deletingLastPathComponent()
      .appendingPathComponent("not-yet").appendingPathComponent("queue.sqlite")
    var config = Bismuth.Config(identifier: "durable")
    config.databaseURL = url
    config.autoStart = false
    let first = Bismuth.Queue<NamedItem>(config: config)
    #expect(first.add(NamedItem(name: "kept")))
    #expect(first.storageError == nil, "fell back to memory: \(String(describing: first.storageError))")
    let second = Bismuth.Queue<NamedItem>(config: config)  // the next launch
    #expect(second.items == [NamedItem(name: "kept")])
  }
}
