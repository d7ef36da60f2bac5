import Dispatch

/// A handle on one run started with a completion handler; ``cancel()`` ends that run only.
///
/// Cancelling cancels the Swift task that drives the run: the running step sees
/// `Task.isCancelled`, no further step starts, and the completion receives `CancellationError`
/// (unless the run had already finished). Other runs of the same pipeline or runner are untouched.
public struct RunHandle: Sendable, Hashable {
  private let task: Task<Void, Never>

  @usableFromInline
  init(_ task: Task<Void, Never>) {
    self.task = task
  }

  /// Runs `operation` in a new task and calls `completion` once, on `queue`, with its value or
  /// error: how every completion-handler `execute` starts a run.
  @inlinable
  static func start<Value: Sendable>(
    on queue: DispatchQueue,
    completion: @escaping @Sendable (Result<Value, any Error>) -> Void,
    _ operation: @escaping @Sendable () async throws -> Value
  ) -> RunHandle {
    RunHandle(
      Task {
        let result: Result<Value, any Error>
        do {
          result = .success(try await operation())
        } catch {
          result = .failure(error)
        }
        queue.async { completion(result) }
      })
  }

  /// Requests cancellation of this run.
  public func cancel() {
    task.cancel()
  }

  /// Whether ``cancel()`` has been called.
  public var isCancelled: Bool {
    task.isCancelled
  }
}
