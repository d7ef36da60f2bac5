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
