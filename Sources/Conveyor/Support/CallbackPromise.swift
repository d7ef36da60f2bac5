import Synchronization

/// A value a completion handler delivers once, awaited by one task.
///
/// Unlike a bare continuation, the value may arrive before anyone waits (a completion handler
/// called synchronously, or from another thread, before the caller got to `value`), later
/// deliveries are ignored, and the waiting task's cancellation ends the wait with
/// `CancellationError`. Used where a callback-style delegate is called with `await` (it may hop
/// to the delegate's actor) and its completion is awaited afterwards.
package final class CallbackPromise<Value: Sendable>: Sendable {
  private enum State {
    case empty
    case waiting(CheckedContinuation<Value, any Error>)
    case done(Result<Value, any Error>)
  }

  private let state = Mutex(State.empty)

  /// Creates an empty promise.
  package init() {}

  /// Delivers `result` the first time; later calls are ignored. Resumes the waiter outside the lock.
  package func fulfil(_ result: Result<Value, any Error>) {
    let waiter = state.withLock { state -> CheckedContinuation<Value, any Error>? in
      switch state {
      case .empty:
        state = .done(result)
        return nil
      case .waiting(let continuation):
        state = .done(result)
        return continuation
      case .done:
        return nil
      }
    }
    waiter?.resume(with: result)
  }

  /// The delivered value, waiting for it. Throws `CancellationError` if the waiting task is
  /// cancelled first (and the promise is then fulfilled with that error).
  package var value: Value {
    get async throws {
      try await withTaskCancellationHandler {
        try await delivered()
      } onCancel: {
        fulfil(.failure(CancellationError()))
      }
    }
  }

  /// The delivered value, waiting for it however long, cancelled or not: for the outcome of work
  /// already under way that the waiter must report (a job committed or not).
  package var valueIgnoringCancellation: Value {
    get async throws { try await delivered() }
  }

  private func delivered() async throws -> Value {
    try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Value, any Error>) in
      let ready = state.withLock { state -> Result<Value, any Error>? in
        switch state {
        case .empty:
          state = .waiting(continuation)
          return nil
        case .done(let result):
          return result
        case .waiting:
          preconditionFailure("CallbackPromise.value awaited twice")
        }
      }
      if let ready { continuation.resume(with: ready) }
    }
  }
}
