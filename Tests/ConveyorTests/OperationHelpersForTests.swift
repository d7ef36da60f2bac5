import Dispatch
import Foundation
import Synchronization

/// A typed error the operation tests fail with.
struct TestError: Error, Equatable {
  var code: Int
}

/// A thread-safe counter.
final class Counter: Sendable {
  private let storage = Atomic<Int>(0)

  var value: Int { storage.load(ordering: .sequentiallyConsistent) }

  func increment() {
    storage.add(1, ordering: .sequentiallyConsistent)
  }
}

/// A thread-safe log of names, in the order they were appended.
final class NameLog: Sendable {
  private let storage = Mutex<[String]>([])

  var entries: [String] { storage.withLock { $0 } }

  func append(_ entry: String) {
    storage.withLock { $0.append(entry) }
  }
}

/// Waits until every block already on `queue` has run.
func drain(_ queue: DispatchQueue) async {
  await withCheckedContinuation { continuation in queue.async { continuation.resume() } }
}

/// Polls `condition` until it holds or `timeout` passes; returns whether it held.
func eventually(
  timeout: Duration = .seconds(5), _ condition: @Sendable () -> Bool
) async -> Bool {
  let deadline = ContinuousClock.now + timeout
  while ContinuousClock.now < deadline {
    if condition() { return true }
    try? await Task.sleep(for: .milliseconds(2))
  }
  return condition()
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
