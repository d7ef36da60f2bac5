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

  /// Requests cancellation of this run.
  public func cancel() {
    task.cancel()
  }

  /// Whether ``cancel()`` has been called.
  public var isCancelled: Bool {
    task.isCancelled
  }
}
