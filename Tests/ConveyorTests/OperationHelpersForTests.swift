import ConveyorTestSupport
import Dispatch
import Foundation
import Synchronization

#if canImport(Glibc)
  import Glibc
#endif

/// A typed error the operation tests fail with.
struct TestError: Error, Equatable {
  var code: Int
}

/// Waits until every block already on `queue` has run.
func drain(_ queue: DispatchQueue) async {
  await withCheckedContinuation { continuation in queue.async { continuation.resume() } }
}

/// Runs `body` on a Dispatch thread and returns what it returns, so that long synchronous work
/// (making, starting and freeing many operations) does not hold one of the few threads of Swift's
/// cooperative pool, which the other tests of a full run need.
@discardableResult
func onADispatchThread<Value: Sendable>(_ body: @escaping @Sendable () -> Value) async -> Value {
  await withCheckedContinuation { continuation in
    DispatchQueue.global().async { continuation.resume(returning: body()) }
  }
}

/// Runs `DispatchQueue.concurrentPerform` on a Dispatch thread, so the test does not block one of
/// the few threads of Swift's cooperative pool while it runs.
func concurrentlyPerform(iterations: Int, _ body: @escaping @Sendable (Int) -> Void) async {
  await withCheckedContinuation { continuation in
    DispatchQueue.global().async {
      DispatchQueue.concurrentPerform(iterations: iterations, execute: body)
      continuation.resume()
    }
  }
}
