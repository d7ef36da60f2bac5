import ConveyorBismuth
import Foundation
import Testing

// The persistent request queue's own test (BismuthTests.swift), with its item as the library
// wrote it: `==` compares a UUID that `CodingKeys` leave out. Changes: the import; `Sendable`
// (implied by `BismuthQueueable`); the HTTP method enum is the README tests' `HTTPMethod`; the
// database is a temporary file; and the last check, which read the old library's private cache
// file, reads `count` instead.

struct QueueItem: BismuthQueueable {
  private enum CodingKeys: String, CodingKey {
    case url
    case httpMethod
    case parameters
  }

  private let uuid = UUID().uuidString

  let url: String
  let httpMethod: HTTPMethod
  let parameters: [String: String]?

  init(url: String, httpMethod: HTTPMethod = .get, parameters: [String: String]? = nil) {
    self.url = url
    self.httpMethod = httpMethod
    self.parameters = parameters
  }

  static func == (lhs: QueueItem, rhs: QueueItem) -> Bool {
    return lhs.uuid == rhs.uuid
  }
}

@Suite("Bismuth drop-in: the old library's own test")
@MainActor
struct OldLibraryOwnTests {
  @Test("add, remove by equality, state while items wait without a delegate, pause, resume, clear")
  func testQueue() throws {
    var config = Bismuth.Config(identifier: UUID().uuidString)
    config.databaseURL = try temporaryDatabase()
    let queue = Bismuth.Queue<QueueItem>(config: config)
    #expect(queue.isEmpty)
    queue.add(QueueItem(url: "https://www.google.com"))
    queue.add(QueueItem(url: "https://www.google.com/new", httpMethod: .post, parameters: ["name": "Bas"]))
    queue.add(QueueItem(url: "https://www.e-sites.nl/api/item/1", httpMethod: .delete))
    #expect(queue.count == 3)
    let item = QueueItem(url: "https://www.e-sites.nl")
    queue.add(item)
    queue.remove(item)
    #expect(queue.count == 3)
    #expect(!queue.isEmpty)
    #expect(queue.state == .running)
    queue.pause()
    #expect(queue.state == .paused)
    queue.resume()
    #expect(queue.state == .running)
    queue.clear()
    #expect(queue.count == 0)
    #expect(queue.state == .idle)
  }
}
