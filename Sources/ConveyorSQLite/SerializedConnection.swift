import CSQLite
import Conveyor
import Synchronization

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#elseif canImport(Darwin)
  import Darwin
#endif

/// Confines one ``Connection`` to a dedicated thread and bridges it to `async`.
///
/// Blocking sqlite3 calls never make Swift's cooperative thread pool wait for a lock: every use of
/// the connection is a block on `thread`, which runs them one at a time, except the short
/// transactions of ``performInline(_:)`` and ``tryInline(_:waitingForInlineCalls:)``, which run on
/// the caller's thread when the connection is free, with SQLite's busy timeout off, and move to
/// `thread` (where they may wait) when they meet another connection's lock. A call of
/// ``performInline(_:)`` that finds the connection in use waits for it on the caller's thread
/// for at most ``inlineWaitLimit`` (half a millisecond, yielding the processor), then moves to
/// `thread`: with several workers, their calls mostly find it held by another's short inline
/// transaction, and the trip to `thread` and back cost more than that wait. Cancelling the awaiting task calls
/// `sqlite3_interrupt` when its block is running, and skips the block when it has not started.
///
/// Nothing but the caller's own statements runs inline: a connection whose commits sync the disk
/// (`synchronous` FULL or EXTRA) runs every call on `thread`, and SQLite's automatic WAL
/// checkpoint (which would write and sync the database file inside whichever `COMMIT` makes the
/// WAL file reach its threshold) is replaced by a `PASSIVE` checkpoint that such a commit submits
/// to `thread`; until it ran, calls run on `thread` behind it, so the WAL file stays bounded.
///
/// `@unchecked Sendable` is safe because `connection` is only touched while holding the `inUse`
/// lock: by blocks running on the serial `thread`, or by an inline call that took the lock
/// without waiting (the owner hands over a connection nobody else uses); the one exception,
/// `sqlite3_interrupt`, is documented as safe to call from any thread while the handle is open,
/// and the connection's `interruption` flag is an atomic. The other state (`runsInline`,
/// `checkpointScheduled`, `occupied`, `inlineCalls`) is a constant and atomics.
/// It is only called while a `perform` block runs, and such a block starts only on an open
/// connection; the handle closes in a block of its own (``close()``) or in `deinit`, when no
/// block can be running.
final class SerializedConnection: @unchecked Sendable {
  private let thread: StoreThread
  private let connection: Connection
  /// Held by whoever uses `connection`: a block on `thread` (which may wait for it, briefly, while
  /// an inline call runs), or an inline call (which never waits for it).
  private let inUse = Mutex(())

  /// Whether calls may run on the caller's thread (false when commits sync the disk).
  let runsInline: Bool
  /// A checkpoint block is on `thread` (or running): commits past the WAL threshold meanwhile
  /// submit no other.
  private let checkpointScheduled = Atomic<Bool>(false)
  /// Someone holds `inUse` (see ``using(_:)``): read by inline calls before they try the lock,
  /// since a failed try of a contended lock is a system call.
  private let occupied = Atomic<Bool>(false)
  /// The longest an inline call waits for another inline call to free the connection.
  static let inlineWaitLimit = Duration.microseconds(500)
  /// Inline calls run so far (for yielding the thread now and then).
  private let inlineCalls = Atomic<Int>(0)

  /// What a call made after ``close()`` throws.
  private let closedError: @Sendable () -> any Error

  /// The WAL size, in pages, past which a commit submits a checkpoint when the connection's own
  /// automatic checkpoint is off: SQLite's default threshold.
  static let defaultCheckpointPages: Int32 = 1_000

  /// Takes over `connection`, which the caller must not use afterwards; calls made after
  /// ``close()`` throw `closedError()`.
  ///
  /// Reads the connection's `synchronous` level (inline calls only when it is NORMAL or OFF: a
  /// FULL or EXTRA commit syncs the disk) and its automatic-checkpoint threshold, which from now
  /// on submits a checkpoint to the connection's thread instead of checkpointing in the commit.
  /// Set both pragmas before.
  init(label: String, connection: Connection, closedError: @escaping @Sendable () -> any Error) throws {
    let pages = try connection.scalar("PRAGMA wal_autocheckpoint") ?? Int64(Self.defaultCheckpointPages)
    runsInline = try connection.synchronousLevel() <= 1
    self.thread = StoreThread(name: label)
    self.connection = connection
    self.closedError = closedError
    // A threshold of 0 or less means no automatic checkpoint: none is submitted either.
    if pages > 0 {
      connection.checkpointElsewhere(atPages: Int32(clamping: pages)) { [weak self] in
        self?.submitCheckpoint()
      }
    }
  }

  /// Submits a checkpoint to the connection's thread unless one is already waiting there. Called
  /// by a commit that left the WAL file past its threshold, on the committing thread (the caller's,
  /// for an inline call), so never waits.
  private func submitCheckpoint() {
    guard
      checkpointScheduled.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing)
        .exchanged
    else { return }
    thread.submit {
      self.using {
        // Cleared first: a commit past the threshold from now on needs a checkpoint after this one.
        self.checkpointScheduled.store(false, ordering: .releasing)
        guard !self.connection.isClosed else { return }
        self.connection.checkpoint()
      }
    }
  }

  /// For tests: runs `block` on the connection's thread after every block submitted before,
  /// without taking the connection, so inline calls still run meanwhile.
  func submitWithoutConnection(_ block: @escaping @Sendable () -> Void) {
    thread.submit(block)
  }

  deinit {
    // Closing may checkpoint the WAL and sync the file (the last connection to close does): on
    // the connection's thread, never on whatever thread released the last reference (often one
    // of the cooperative pool's). Nothing else can use the connection any more.
    nonisolated(unsafe) let connection = self.connection
    thread.submit { connection.close() }
    thread.stop()
  }

  /// Closes the connection after every block submitted before, and returns once it is closed.
  /// Blocks submitted afterwards fail with `closedError` and never touch the connection.
  func close() async {
    await withUnsafeContinuation { (continuation: UnsafeContinuation<Void, Never>) in
      thread.submit {
        self.using { self.connection.close() }
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
          let result = self.using { () -> Result<T, any Error> in
            // Checked before the operation starts, so a cancellation never interrupts a closed handle.
            guard !self.connection.isClosed else { return .failure(self.closedError()) }
            // Cleared before the operation starts: a cancellation from now on is this block's.
            self.connection.interruption.clear()
            guard operation.start() else { return .failure(CancellationError()) }
            self.connection.waitForLocks(true)
            let result = Result { try body(self.connection) }
            let cancelled = operation.finish()
            if cancelled, case .failure(let error as SQLiteError) = result, error.code == .interrupt {
              return .failure(CancellationError())
            }
            return result
          }
          continuation.resume(with: result)
        }
      }
    } onCancel: {
      operation.cancel(interrupt: interrupt)
    }
  }

  /// Runs `body` at once on the calling thread when no other call is using the connection;
  /// otherwise, or when `body` meets another connection's lock, runs it on the connection's thread
  /// like ``perform(_:)``.
  ///
  /// For short transactions on the hot path (an enqueue, a claim): the caller skips the hop to the
  /// connection's thread and back. `body` runs with SQLite's busy timeout off, so it blocks the
  /// caller's thread for its statements only, never while another process holds the lock: then
  /// it fails with `SQLITE_BUSY` at once, its transaction rolls back, and it runs again on the
  /// connection's thread, which waits for the lock. So `body` must be one transaction that can run
  /// again from the start.
  func performInline<T: Sendable>(_ body: @escaping @Sendable (Connection) throws -> T) async throws -> T {
    if let result = await tryInline(body, waitingForInlineCalls: true) { return try result.get() }
    return try await perform(body)
  }

  /// Runs `body` on the calling thread, as ``performInline(_:)`` does, when the connection is free
  /// and `body` meets no other connection's lock; nil when it did not run (the connection was busy,
  /// a checkpoint waits for the thread, or ``runsInline`` is false) or rolled back for a lock.
  ///
  /// With `waitingForInlineCalls`, a call that finds the connection in use (usually by another
  /// inline call, a short transaction on another thread) waits for it on this thread, yielding the
  /// processor, for at most ``inlineWaitLimit`` in all, then returns nil.
  ///
  /// When `cancellable` is false, the calling task's cancellation neither skips nor interrupts
  /// `body`: for work done on behalf of other callers (a leader's group of adds). When `yields`
  /// is false, the call never suspends, and the caller must call ``countInlineCall()`` once it
  /// may: a leader of adds must not suspend while other callers wait for it.
  func tryInline<T: Sendable>(
    _ body: @escaping @Sendable (Connection) throws -> T, waitingForInlineCalls: Bool = false,
    cancellable: Bool = true, yields: Bool = true
  ) async -> Result<T, any Error>? {
    // While a checkpoint waits for the thread, calls queue up behind it: inline commits meanwhile
    // would grow the WAL file without bound on a busy thread.
    guard runsInline, !checkpointScheduled.load(ordering: .acquiring) else { return nil }
    if cancellable && Task.isCancelled { return .failure(CancellationError()) }
    let operation = Operation()
    func attempt() -> Result<T, any Error>? {
      var deadline: ContinuousClock.Instant?
      while true {
        let ran = usingIfAvailable { () -> Result<T, any Error>? in
          guard !connection.isClosed else { return .failure(closedError()) }
          connection.interruption.clear()
          guard operation.start() else { return .failure(CancellationError()) }
          connection.waitForLocks(false)
          let result = Result { try body(connection) }
          let cancelled = operation.finish()
          if case .failure(let error as SQLiteError) = result {
            if error.code.primary == .busy { return nil }  // any SQLITE_BUSY_* too: hand over
            if cancelled && error.code == .interrupt { return .failure(CancellationError()) }
          }
          return result
        }
        if let ran { return ran }
        // Busy: wait briefly for the connection, then hand over.
        guard waitingForInlineCalls else { return nil }
        let limit = deadline ?? ContinuousClock.now + Self.inlineWaitLimit
        deadline = limit
        repeat {
          sched_yield()
          if (cancellable && Task.isCancelled) || checkpointScheduled.load(ordering: .acquiring)
            || ContinuousClock.now >= limit
          {
            return nil
          }
        } while occupied.load(ordering: .acquiring)
      }
    }
    let outcome =
      cancellable
      ? await withTaskCancellationHandler {
        attempt()
      } onCancel: {
        operation.cancel(interrupt: interrupt)
      } : attempt()
    if outcome != nil, yields { await countInlineCall() }
    return outcome
  }

  /// Counts an inline call that ran; every 64th lets other tasks waiting for this thread go
  /// first, as a trip to the connection's thread would: a loop of inline calls never suspends
  /// otherwise, and would hold one of the pool's few threads for as long as it ran. Yielding after
  /// every call cost a third of the inline path's speed (the yield wakes another pool thread);
  /// after every 64th it bounds the wait of other tasks to a few milliseconds.
  func countInlineCall() async {
    if inlineCalls.wrappingAdd(1, ordering: .relaxed).newValue % 64 == 0 { await Task.yield() }
  }

  /// Runs `block` on the connection's thread after every block submitted before, with the
  /// connection (nil once ``close()`` ran). Not cancellable: for work that resumes its own callers.
  func submit(_ block: @escaping @Sendable (Connection?) -> Void) {
    thread.submit {
      self.using {
        guard !self.connection.isClosed else { return block(nil) }
        self.connection.interruption.clear()
        self.connection.waitForLocks(true)
        block(self.connection)
      }
    }
  }

  /// Runs `body` holding the connection, waiting for it.
  private func using<R>(_ body: () -> R) -> R {
    inUse.withLock { _ in
      occupied.store(true, ordering: .relaxed)
      defer { occupied.store(false, ordering: .releasing) }
      return body()
    }
  }

  /// Whether a call holds the connection now (for tests, which wait for it to be free before a
  /// call that must run on their own thread: a call finding it held waits only briefly, see
  /// ``inlineWaitLimit``, then goes to the connection's thread).
  var isOccupied: Bool { occupied.load(ordering: .acquiring) }

  /// Runs `body` holding the connection when nobody else holds it; nil otherwise.
  private func usingIfAvailable<R>(_ body: () -> R) -> R? {
    guard !occupied.load(ordering: .acquiring) else { return nil }
    return inUse.withLockIfAvailable { _ in
      occupied.store(true, ordering: .relaxed)
      defer { occupied.store(false, ordering: .releasing) }
      return body()
    }
  }

  /// The error calls made after ``close()`` throw.
  func closedFailure() -> any Error { closedError() }

  /// Stops the running statement of a cancelled call (see ``Operation/cancel(interrupt:)``).
  private func interrupt() {
    // The flag stops a statement that has not started yet; neither is set once COMMIT has begun.
    if connection.interruption.set() { sqlite3_interrupt(connection.handle) }
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
