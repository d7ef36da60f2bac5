import CSQLite
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import Conveyor
@testable import ConveyorSQLite

@Suite("StoreThread")
struct StoreThreadTests {
  final class Payload: Sendable {}

  @Test func aFinishedCallIsFreedWhileLaterCallsAreStillQueued() async throws {
    let thread = StoreThread(name: "test")
    defer { thread.stop() }
    let ran = DispatchSemaphore(value: 0)
    let hold = DispatchSemaphore(value: 0)
    weak var freed: Payload?
    do {
      let payload = Payload()
      freed = payload
      thread.submit {
        _ = payload
        ran.signal()
      }
    }
    // The thread is kept busy, and one more call waits behind it: the list never runs dry.
    thread.submit { hold.wait() }
    thread.submit {}
    ran.wait()
    // The first call's block (and what it captured) must be gone although the list is not empty.
    var released = false
    for _ in 0..<200 where !released {
      released = freed == nil
      if !released { try await Task.sleep(for: .milliseconds(5)) }
    }
    hold.signal()
    #expect(released, "a finished call's captures stay alive until the thread's list runs dry")
  }
}

/// The thread that closed the probed connection (set by SQLite's close trace).
private let closingThread = Mutex<pthread_t?>(nil)

@Suite("Closing a released store")
struct ReleasedStoreClosingTests {
  // Failed before the fix: the last reference to a store released on a pool thread closed the
  // connection there, and the last close checkpoints the WAL and syncs the file (seen holding a
  // pool thread in `fdatasync` while the whole test process stalled).
  @Test func aStoreReleasedFromATaskClosesOnItsOwnThread() async throws {
    let folder = try TemporaryFolder()
    closingThread.withLock { $0 = nil }
    func probed() throws -> Connection {
      let connection = try Connection(path: folder.path("closing.sqlite"), create: true)
      try connection.execute("PRAGMA journal_mode = WAL")
      try connection.execute("CREATE TABLE t (v)")
      sqlite3_trace_v2(
        connection.handle, UInt32(SQLITE_TRACE_CLOSE),
        { _, _, _, _ in
          closingThread.withLock { $0 = pthread_self() }
          return 0
        }, nil)
      return connection
    }
    // The serialized connection holds the only reference to the connection.
    nonisolated(unsafe) var serialized: SerializedConnection? = try SerializedConnection(
      label: "closing-probe", connection: try probed(), closedError: { CancellationError() })
    try await serialized!.perform { db in try db.execute("INSERT INTO t VALUES (1)") }
    // Released from a task, on a thread of the cooperative pool.
    let releasing = await Task.detached { () -> pthread_t in
      serialized = nil
      return pthread_self()
    }.value
    try await eventually("the connection closes") { closingThread.withLock { $0 } != nil }
    let closer = try #require(closingThread.withLock { $0 })
    #expect(pthread_equal(closer, releasing) == 0, "closed on the thread that released the store")
  }
}
