import Foundation
import LoopbackHTTPServer
import Synchronization

/// The tests' names for the shared loopback server's types.
typealias TestHTTPServer = LoopbackHTTPServer
typealias ReceivedRequest = LoopbackRequest
typealias Reply = LoopbackReply

struct ServerError: Error, CustomStringConvertible {
  var description: String
  init(_ description: String) { self.description = description }
}

extension Duration {
  var timeInterval: TimeInterval {
    Double(components.seconds) + Double(components.attoseconds) / 1e18
  }
}

/// A port nothing listens on: port 1 (tcpmux) is privileged and unused, so connecting is refused.
/// A port bound then freed would not do: a server another test starts in parallel can take it.
func closedPort() -> UInt16 { 1 }

/// Runs `body`, throwing if it takes longer than `limit`. On time-out the body is cancelled and
/// not waited for, so even work that ignores cancellation (a non-cancellable continuation) cannot
/// hang the test.
func within<T: Sendable>(
  _ limit: Duration = .seconds(60), _ what: String = "operation",
  _ body: @escaping @Sendable () async throws -> T
) async throws -> T {
  try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
    let pending = PendingContinuation(continuation)
    let work = Task {
      let outcome: Result<T, any Error>
      do {
        outcome = .success(try await body())
      } catch {
        outcome = .failure(error)
      }
      pending.take()?.resume(with: outcome)
    }
    Task {
      do {
        try await Task.sleep(for: limit)
      } catch {
        return
      }
      guard let waiter = pending.take() else { return }
      work.cancel()
      waiter.resume(throwing: ServerError("timed out after \(limit): \(what)"))
    }
  }
}

/// A continuation that whoever comes first takes and resumes.
private final class PendingContinuation<T: Sendable>: Sendable {
  private let continuation: Mutex<CheckedContinuation<T, any Error>?>

  init(_ continuation: CheckedContinuation<T, any Error>) {
    self.continuation = Mutex(continuation)
  }

  func take() -> CheckedContinuation<T, any Error>? {
    continuation.withLock { $0.take() }
  }
}
