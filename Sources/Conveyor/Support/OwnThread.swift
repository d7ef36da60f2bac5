import Foundation

/// Runs `body` on a thread of its own and returns its result; the caller suspends meanwhile.
///
/// For blocking work (opening a database that may wait for a lock, connecting to a server): on
/// Linux, `DispatchQueue.global()` runs on the same threads as Swift's cooperative pool, so
/// blocking work sent there keeps the process's tasks from running until it ends (eight such
/// blocks held every task of a 2-core machine for as long as they slept). A thread costs tens of
/// microseconds to start: use this for calls that may block, not for every call.
package func onOwnThread<T: Sendable>(
  name: String, _ body: @escaping @Sendable () throws -> T
) async throws -> T {
  try await withCheckedThrowingContinuation { continuation in
    let thread = Thread { continuation.resume(with: Result { try body() }) }
    thread.name = name
    thread.start()
  }
}
