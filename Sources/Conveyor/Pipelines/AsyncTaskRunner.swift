import Dispatch

/// Runs a list of ``AsyncTask``s one after another or a few at a time, with one outcome.
///
/// - `.sequential`: a task starts only after the previous one completed.
/// - `.concurrent(width:)`: at most `width` tasks run at once; results keep the input order.
///
/// Either way the first error ends the run: tasks not yet started never start, running ones are
/// cancelled (an `async` task sees `Task.isCancelled`; a completion-handler task cannot be
/// interrupted and is waited for), and the completion is called exactly once. Each call to
/// ``run()`` or ``execute(completion:)`` is an independent run; cancelling one leaves the others alone.
///
/// ```swift
/// let runner = AsyncTaskRunner<Int, any Error>([first, second], mode: .sequential)
/// let values = try await runner.run()
/// ```
public struct AsyncTaskRunner<Output: Sendable, Failure: Error>: Sendable {
  /// How many tasks may run at once.
  public enum Mode: Sendable, Hashable {
    /// One at a time, in list order; the next starts after the previous one completed.
    case sequential
    /// Up to `width` at once (at least 1), started in list order.
    case concurrent(width: Int)
  }

  /// The tasks, in order.
  public var tasks: [any AsyncTask<Output, Failure>] {
    didSet { works = Self.works(of: tasks) }
  }
  /// What running each task awaits, as a plain closure: one direct call per task, instead of
  /// a call through an existential into unspecialised generic code (three calls per task).
  /// An ``AnyAsyncTask`` contributes its own closure.
  @usableFromInline private(set) var works: [Work]
  /// Sequential or concurrent.
  public var mode: Mode
  /// Where ``execute(completion:)`` calls its completion. Defaults to `DispatchQueue.global()`
  /// on every platform (`DispatchQueue.main` never runs in a Linux tool without a run loop).
  public var callbackQueue: DispatchQueue

  /// Makes a runner.
  ///
  /// - Parameters:
  ///   - tasks: The tasks, in order.
  ///   - mode: `.sequential` (default) or `.concurrent(width:)`; a width below 1 is a programmer error.
  ///   - callbackQueue: Where ``execute(completion:)`` delivers; `DispatchQueue.global()` by default.
  public init(
    _ tasks: [any AsyncTask<Output, Failure>],
    mode: Mode = .sequential,
    callbackQueue: DispatchQueue = .global()
  ) {
    if case .concurrent(let width) = mode {
      precondition(width >= 1, "AsyncTaskRunner: concurrent width must be at least 1, got \(width)")
    }
    self.tasks = tasks
    self.works = Self.works(of: tasks)
    self.mode = mode
    self.callbackQueue = callbackQueue
  }

  /// How a task's work is awaited.
  ///
  /// Two cases so that a closure that cannot throw is awaited as the caller wrote it: making it
  /// throwing wraps it in a thunk, one more `async` frame per task (the sequential run went at a
  /// third of a plain loop over the same closures with the three thunks it used to take). Never
  /// `throws(Failure)`: Swift 6.3.1 crashes in IR generation when a specialised caller
  /// (`Failure == Never`) calls a `throws(Failure)` closure kept in a generic container.
  @usableFromInline
  enum Work: Sendable {
    /// A closure that cannot throw.
    case plain(@Sendable () async -> Output)
    /// Any other task, made to throw untyped errors.
    case throwing(@Sendable () async throws -> Output)

    /// Awaits the work.
    @inlinable
    func callAsFunction() async throws -> Output {
      switch self {
      case .plain(let body): await body()
      case .throwing(let body): try await body()
      }
    }
  }

  /// The closure that runs `task`, for ``works``.
  static func works(of tasks: [any AsyncTask<Output, Failure>]) -> [Work] {
    tasks.map { task in
      if let erased = task as? AnyAsyncTask<Output, Failure> {
        if let plain = erased.plainWork { return .plain(plain) }
        return .throwing(erased.untypedWork)
      }
      return .throwing { try await task.run() }
    }
  }

  /// Runs the tasks and returns their values in list order.
  ///
  /// - Throws: The first task error (a `Failure`), or `CancellationError` when the awaiting task
  ///   is cancelled before the run finished.
  @inlinable
  public func run() async throws -> [Output] {
    switch mode {
    case .sequential:
      return try await runSequentially()
    case .concurrent(let width):
      return try await runConcurrently(width: width)
    }
  }

  /// Starts a run in a new task and calls `completion` once with the values or the first error.
  ///
  /// - Parameter completion: Called exactly once on ``callbackQueue``.
  /// - Returns: A handle whose ``RunHandle/cancel()`` cancels this run only.
  @discardableResult
  public func execute(completion: @escaping @Sendable (Result<[Output], any Error>) -> Void) -> RunHandle {
    RunHandle.start(on: callbackQueue, completion: completion) { try await run() }
  }

  /// The hot path, like `Pipeline.fold`: one await per task, cancellation read from a flag.
  /// Inlinable so that it is specialised for the caller's `Output` and `Failure`.
  @inlinable
  func runSequentially() async throws -> [Output] {
    let cancelled = CancellationFlag()  // one handler per run, an atomic load per task
    let works = self.works
    return try await withTaskCancellationHandler {
      var values: [Output] = []
      values.reserveCapacity(works.count)
      for work in works {
        if cancelled.isSet { throw CancellationError() }
        switch work {
        case .plain(let body): values.append(await body())
        case .throwing(let body): values.append(try await body())
        }
      }
      if cancelled.isSet { throw CancellationError() }
      return values
    } onCancel: {
      cancelled.set()
    }
  }

  @usableFromInline
  func runConcurrently(width: Int) async throws -> [Output] {
    let tasks = works
    let values = try await withThrowingTaskGroup(of: (Int, Output).self) { group in
      var values = [Output?](repeating: nil, count: tasks.count)
      var next = 0
      func startNext() {
        let index = next
        let task = tasks[index]
        next += 1
        group.addTask {
          try Task.checkCancellation()
          return (index, try await task())
        }
      }
      while next < min(width, tasks.count) { startNext() }
      // The first child to fail rethrows here; leaving the closure cancels and awaits the rest.
      while let (index, value) = try await group.next() {
        values[index] = value
        if next < tasks.count {
          try Task.checkCancellation()
          startNext()
        }
      }
      return values
    }
    try Task.checkCancellation()
    return values.map { $0! }
  }
}
