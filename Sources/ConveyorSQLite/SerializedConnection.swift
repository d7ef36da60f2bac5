import CSQLite
import Conveyor
import Synchronization

/// Confines one ``Connection`` to a dedicated thread and bridges it to `async`.
///
/// Blocking sqlite3 calls never run on Swift's cooperative thread pool: every use of the
/// connection is a block on `thread`, which runs them one at a time. Cancelling the awaiting task
/// calls `sqlite3_interrupt` when its block is running, and skips the block when it has not started.
///
/// `@unchecked Sendable` is safe because `connection` is only touched from blocks running on the
/// serial `thread` (the owner hands over a connection nobody else uses); the one exception,
/// `sqlite3_interrupt`, is documented as safe to call from any thread while the handle is open,
/// and the connection's `interruption` flag is an atomic.
/// It is only called while a `perform` block runs, and such a block starts only on an open
/// connection; the handle closes in a block of its own (``close()``) or in `deinit`, when no
/// block can be running.
final class SerializedConnection: @unchecked Sendable {
  private let thread: StoreThread
  private let connection: Connection

  /// What a call made after ``close()`` throws.
  private let closedError: @Sendable () -> any Error

  /// Takes over `connection`, which the caller must not use afterwards; calls made after
  /// ``close()`` throw `closedError()`.
  init(label: String, connection: Connection, closedError: @escaping @Sendable () -> any Error) {
    self.thread = StoreThread(name: label)
    self.connection = connection
    self.closedError = closedError
  }

  deinit { thread.stop() }

  /// Closes the connection after every block submitted before, and returns once it is closed.
  /// Blocks submitted afterwards fail with `closedError` and never touch the connection.
  func close() async {
    await withUnsafeContinuation { (continuation: UnsafeContinuation<Void, Never>) in
      thread.submit {
        self.connection.close()
        continuation.resume()
      }
    }
  }

  /// Runs `body` on the connection's thread without blocking the calling thread; throws
  /// `closedError()` once ``close()`` ran.
  func perform<T: Sendable>(_ body: @escaping @Sendable (Connection) throws -> T) async throws -> T {
    try Task.checkCancellation()
    let operation = Operation()
    return try await withTaskCancellationHandler {
      try await withUnsafeThrowingContinuation { (continuation: UnsafeContinuation<T, any Error>) in
        // Every path below resumes the continuation exactly once.
        thread.submit {
          // Checked before the operation starts, so a cancellation never interrupts a closed handle.
          guard !self.connection.isClosed else {
            continuation.resume(throwing: self.closedError())
            return
          }
          // Cleared before the operation starts: a cancellation from now on is this block's.
          self.connection.interruption.clear()
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
      operation.cancel {
        self.connection.interruption.set()  // for a statement that has not started yet
        sqlite3_interrupt(self.connection.handle)
      }
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
    /// meanwhile: the interrupt never reaches another operation. `sqlite3_interrupt` is lost when
    /// it arrives between two statements, so `interrupt` also sets the connection's
    /// ``Connection/interruption`` flag, which stops the statements that start later.
    func cancel(interrupt: () -> Void) {
      state.withLock { state in
        state.cancelled = true
        if state.started && !state.finished { interrupt() }
      }
    }
  }
}
