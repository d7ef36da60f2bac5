import CSQLite
import Dispatch
import Synchronization

/// Confines one ``Connection`` to a dedicated serial dispatch queue and bridges it to `async`.
///
/// Blocking sqlite3 calls never run on Swift's cooperative thread pool: every use of the
/// connection is a block on `queue`. Cancelling the awaiting task calls `sqlite3_interrupt` when
/// its block is running, and skips the block when it has not started.
///
/// `@unchecked Sendable` is safe because `connection` is only touched from blocks running on the
/// serial `queue` (or through `queue.sync`); the one exception, `sqlite3_interrupt`, is documented
/// as safe to call from any thread while the handle is open, and the handle is an immutable `let`
/// closed only in `deinit`, when no operation can be running.
final class SerializedConnection: @unchecked Sendable {
  private let queue: DispatchQueue
  private let connection: Connection

  init(label: String, connection: Connection) {
    self.queue = DispatchQueue(label: label)
    self.connection = connection
  }

  /// Runs `body` on the queue and waits for it, blocking the calling thread.
  func sync<T>(_ body: (Connection) throws -> T) rethrows -> T {
    try queue.sync { try body(connection) }
  }

  /// Runs `body` on the queue without blocking the calling thread.
  func perform<T: Sendable>(_ body: @escaping @Sendable (Connection) throws -> T) async throws -> T {
    try Task.checkCancellation()
    let operation = Operation()
    return try await withTaskCancellationHandler {
      try await withUnsafeThrowingContinuation { (continuation: UnsafeContinuation<T, any Error>) in
        // Every path below resumes the continuation exactly once.
        queue.async {
          guard operation.start() else {
            continuation.resume(throwing: CancellationError())
            return
          }
          let result = Result { try body(self.connection) }
          let cancelled = operation.finish()
          if cancelled, case .failure(let error as SQLiteError) = result, error.code == .interrupt {
            continuation.resume(throwing: CancellationError())
          } else {
            continuation.resume(with: result)
          }
        }
      }
    } onCancel: {
      operation.cancel { sqlite3_interrupt(self.connection.handle) }
    }
  }

  /// The state of one queued block, shared between the block and the cancellation handler.
  private final class Operation: Sendable {
    private struct State {
      var started = false
      var finished = false
      var cancelled = false
    }
    private let state = Mutex(State())

    /// Marks the block started; false when it was cancelled before it could start.
    func start() -> Bool {
      state.withLock { state in
        state.started = true
        return !state.cancelled
      }
    }

    /// Marks the block finished; returns whether it was cancelled.
    func finish() -> Bool {
      state.withLock { state in
        state.finished = true
        return state.cancelled
      }
    }

    /// Marks the operation cancelled and, when its block is running, calls `interrupt`.
    ///
    /// `interrupt` runs under the lock, so the block cannot finish and let the next block start
    /// meanwhile: the interrupt never reaches another operation. SQLite clears an interrupt that
    /// arrives between two statements when the next statement starts with none active.
    func cancel(interrupt: () -> Void) {
      state.withLock { state in
        state.cancelled = true
        if state.started && !state.finished { interrupt() }
      }
    }
  }
}
