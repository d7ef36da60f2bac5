import ConveyorBismuth
import Foundation
import Synchronization
import Testing

// The persistent request queue's README, as its users wrote it, compiled against the drop-in
// module: the only change is `import ConveyorBismuth` instead of `import Bismuth`. The delegates
// are `@MainActor` classes, as UIKit view controllers and app delegates are. The item compares a
// UUID its `CodingKeys` leave out, as the README's does.

enum HTTPMethod: String, Codable, Sendable {
  case get, post, delete
}

struct RequestQueueItem: BismuthQueueable {
  private enum CodingKeys: String, CodingKey {
    case url
    case httpMethod
    case parameters
  }

  private var uuid = UUID().uuidString

  let url: String
  let httpMethod: HTTPMethod
  let parameters: [String: String]?

  init(url: String, httpMethod: HTTPMethod = .get, parameters: [String: String]? = nil) {
    self.url = url
    self.httpMethod = httpMethod
    self.parameters = parameters
  }

  static func == (lhs: RequestQueueItem, rhs: RequestQueueItem) -> Bool {
    return lhs.uuid == rhs.uuid
  }
}

/// A fake API that calls back later on the main actor, as Alamofire calls back on the main queue:
/// "post" fails the first time it is called, like a request sent while offline.
@MainActor
final class FakeAPI {
  private var calls: [String: Int] = [:]

  func request(_ url: String, completion: @escaping (Bool) -> Void) {
    calls[url, default: 0] += 1
    let ok = !(url.hasSuffix("/post") && calls[url] == 1)
    Task { completion(ok) }
  }
}

/// The README's delegate, on the main actor; it records what happened for the test.
@MainActor
final class RequestsController: BismuthQueueDelegate {
  var queue: Bismuth.Queue<RequestQueueItem>!
  let api = FakeAPI()
  var handled: [String] = []
  var calls: [String] = []
  var finished = 0
  private var finishWaiters: [CheckedContinuation<Void, Never>] = []

  func configure(databaseURL: URL, autoStart: Bool = false) {
    var config = Bismuth.Config(identifier: "api-requests")
    config.logProxy = { line in
      print("[REQ] \(line)")
    }
    config.autoStart = autoStart  // Default: true
    config.canRunInBackground = false  // Default: true
    config.retryTime = 0  // Default: 15; 0 so that the retry comes at once
    config.databaseURL = databaseURL  // Conveyor's addition: where the database lives

    queue = Bismuth.Queue<RequestQueueItem>(config: config)
    queue.delegate = self
    queue.add(RequestQueueItem(url: "https://domain.com/api/get"))
    queue.add(
      RequestQueueItem(url: "https://domain.com/api/post", httpMethod: .post, parameters: ["name": "Bas"]))
    queue.add(RequestQueueItem(url: "https://domain.com/api/items/3", httpMethod: .delete))
  }

  // BismuthQueueDelegate functions

  func queue<T>(
    _ queue: Bismuth.Queue<T>, handle item: T, completion: @escaping (Bismuth.HandleResult) -> Void
  )
  where T: BismuthQueueable {
    MainActor.assertIsolated()
    guard let item = item as? RequestQueueItem else {
      completion(.handled)
      return
    }
    calls.append(item.url)
    api.request(item.url) { ok in
      if ok {
        self.handled.append(item.url)
        completion(.handled)
      } else {
        completion(.retry)
      }
    }
  }

  func queueFinished<T>(_ queue: Bismuth.Queue<T>) where T: BismuthQueueable {
    MainActor.assertIsolated()
    finished += 1
    let waiters = finishWaiters
    finishWaiters = []
    for waiter in waiters { waiter.resume() }
  }

  /// Returns once `queueFinished` has been called `count` times.
  func waitForFinish(count: Int) async {
    while finished < count {
      await withCheckedContinuation { finishWaiters.append($0) }
    }
  }
}

/// A delegate written with `attempts`: gives up (answers `.handled`) after three tries, as old
/// code did with `if attempts >= 2`.
@MainActor
final class CountingDelegate: BismuthQueueDelegate {
  var attemptsSeen: [Int] = []

  func queue<T>(
    _ queue: Bismuth.Queue<T>, handle item: T, attempts: Int,
    completion: @escaping (Bismuth.HandleResult) -> Void
  ) where T: BismuthQueueable {
    attemptsSeen.append(attempts)
    completion(attempts >= 2 ? .handled : .retry)
  }
}

/// An item of another type than the README's, for a second queue of the same app.
struct CountItem: BismuthQueueable {
  var count: Int
}

func temporaryDatabase() throws -> URL {
  let folder = FileManager.default.temporaryDirectory.appendingPathComponent(
    "ConveyorBismuthTests-\(UUID().uuidString)")
  try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
  return folder.appendingPathComponent("queue.sqlite")
}

@Suite("Bismuth drop-in (README)")
@MainActor
struct BismuthReadmeTests {
  @Test("the README flow: items added synchronously, start(), a failed item retried, then queueFinished")
  func readmeFlow() async throws {
    let controller = RequestsController()
    controller.configure(databaseURL: try temporaryDatabase())
    let queue = try #require(controller.queue)
    // `add` returned after the commit; `autoStart = false` left the queue idle.
    #expect(queue.count == 3)
    #expect(queue.state == .idle)
    #expect(queue.storageError == nil)

    queue.start()
    await controller.waitForFinish(count: 1)
    #expect(controller.finished == 1)
    #expect(queue.isEmpty)
    #expect(queue.state == .idle)
    // The failed "post" was retried after the others: a waiting item never blocks a ready one.
    #expect(
      controller.calls == [
        "https://domain.com/api/get", "https://domain.com/api/post", "https://domain.com/api/items/3",
        "https://domain.com/api/post",
      ])
    #expect(controller.handled.count == 3)
  }

  @Test("attempts count from 0, as in the old library")
  func attemptsFromZero() async throws {
    var config = Bismuth.Config(identifier: "attempts")
    config.retryTime = 0
    config.databaseURL = try temporaryDatabase()
    let queue = Bismuth.Queue<RequestQueueItem>(config: config)
    let delegate = CountingDelegate()
    queue.delegate = delegate
    queue.add(RequestQueueItem(url: "https://domain.com/api/once"))
    await queue.jobQueue.waitUntilFinished()
    #expect(delegate.attemptsSeen == [0, 1, 2])
  }

  @Test("add commits before it returns: another queue on the same database sees the items")
  func addCommitsBeforeReturning() throws {
    let url = try temporaryDatabase()
    var config = Bismuth.Config(identifier: "durable")
    config.autoStart = false
    config.databaseURL = url
    let first = Bismuth.Queue<RequestQueueItem>(config: config)
    let a = RequestQueueItem(url: "https://domain.com/a")
    let b = RequestQueueItem(url: "https://domain.com/b")
    #expect(first.add(a))
    #expect(first.add(b))

    // Another instance reads them back from the database: only their encoded state is there (the
    // README's item gets a new UUID when decoded, so it is not `==` to the one added).
    let second = Bismuth.Queue<RequestQueueItem>(config: config)
    #expect(second.items.map(\.url) == [a.url, b.url])
    #expect(second.count == 2)
  }

  @Test("remove(item) removes by equality; items lists the rest in order; clear() empties")
  func removeAndItems() throws {
    var config = Bismuth.Config(identifier: "remove")
    config.autoStart = false
    config.databaseURL = try temporaryDatabase()
    let queue = Bismuth.Queue<RequestQueueItem>(config: config)
    let items = (1...3).map { RequestQueueItem(url: "https://domain.com/\($0)") }
    queue.add(items)
    #expect(queue.remove(items[1]) == 1)
    #expect(queue.items == [items[0], items[2]])
    #expect(queue.remove(items[1]) == 0)
    queue.clear()
    #expect(queue.isEmpty)
  }

  @Test("pause() is stored and shown as .paused, resume() lets the items run, start() starts an idle queue")
  func pauseResumeStart() async throws {
    let url = try temporaryDatabase()
    var config = Bismuth.Config(identifier: "control")
    config.autoStart = false
    config.databaseURL = url
    config.retryTime = 0
    let queue = Bismuth.Queue<RequestQueueItem>(config: config)
    let delegate = CountingDelegate()
    queue.delegate = delegate
    queue.add(RequestQueueItem(url: "https://domain.com/paused"))
    #expect(queue.state == .idle)

    queue.pause()
    queue.start()
    #expect(queue.state == .paused)
    // Stored: another instance on the same database starts paused too (once its loop has read
    // the flag, which it reports as a state change).
    let other = Bismuth.Queue<RequestQueueItem>(config: config)
    let events = other.jobQueue.events
    other.start()
    for await event in events where event == .stateChanged(.paused) { break }
    #expect(other.state == .paused)
    #expect(queue.count == 1)
    await other.jobQueue.shutdown()  // it has no delegate: it would hold the item it claims

    queue.resume()
    await queue.jobQueue.waitUntilFinished()
    #expect(delegate.attemptsSeen == [0, 1, 2])
    #expect(queue.isEmpty)
  }

  @Test("a queue created on a database where it is paused says .paused at once, not .running")
  func pausedAtTheNextLaunch() throws {
    var config = Bismuth.Config(identifier: "paused-at-launch")
    config.databaseURL = try temporaryDatabase()
    config.autoStart = false
    do {
      let previousLaunch = Bismuth.Queue<RequestQueueItem>(config: config)
      previousLaunch.add(RequestQueueItem(url: "https://domain.com/waits"))
      previousLaunch.pause()
    }
    // The next launch: the pause is stored, so the queue is paused and handles nothing.
    config.autoStart = true
    let queue = Bismuth.Queue<RequestQueueItem>(config: config)
    #expect(queue.state == .paused)
  }

  @Test("pause() before start() pauses: the stored flag shows as .paused, as after start()")
  func pausedBeforeStart() throws {
    var config = Bismuth.Config(identifier: "paused-before-start")
    config.databaseURL = try temporaryDatabase()
    config.autoStart = false
    let queue = Bismuth.Queue<RequestQueueItem>(config: config)
    queue.add(RequestQueueItem(url: "https://domain.com/waits"))
    queue.pause()
    #expect(queue.state == .paused)
  }

  @Test("two queues with different identifiers on one database keep their items apart")
  func identifiersStayApart() async throws {
    let url = try temporaryDatabase()
    var uploadsConfig = Bismuth.Config(identifier: "uploads (wifi)")
    uploadsConfig.databaseURL = url
    uploadsConfig.autoStart = false
    let uploads = Bismuth.Queue<RequestQueueItem>(config: uploadsConfig)
    #expect(uploads.add(RequestQueueItem(url: "https://domain.com/upload")))

    // Another queue of the app, another item type, its own identifier.
    var countsConfig = Bismuth.Config(identifier: "uploads [wifi]")
    countsConfig.databaseURL = url
    countsConfig.retryTime = 0
    let counts = Bismuth.Queue<CountItem>(config: countsConfig)
    let delegate = CountingDelegate()
    counts.delegate = delegate
    try await Task.sleep(for: .seconds(2))
    #expect(delegate.attemptsSeen.isEmpty, "the other queue handled an upload")
    #expect(uploads.count == 1)
    #expect(counts.isEmpty)
    await counts.jobQueue.shutdown(gracePeriod: .zero)
  }

  @Test("the delegate may be set after the queue started: items wait for it without using an attempt")
  func delegateSetLater() async throws {
    var config = Bismuth.Config(identifier: "late-delegate")
    config.databaseURL = try temporaryDatabase()
    config.retryTime = 0
    let queue = Bismuth.Queue<RequestQueueItem>(config: config)  // autoStart: already running
    queue.add(RequestQueueItem(url: "https://domain.com/waits"))
    let delegate = CountingDelegate()
    queue.delegate = delegate
    await queue.jobQueue.waitUntilFinished()
    #expect(delegate.attemptsSeen == [0, 1, 2])
  }
}
