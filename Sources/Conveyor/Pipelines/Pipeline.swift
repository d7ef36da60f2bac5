import Dispatch
import Synchronization

/// Folds a value through asynchronous steps: each step receives the previous step's value.
///
/// The first error stops the run and steps not yet started never run. Runs are independent:
/// a `Pipeline` is an immutable value, so many runs of the same pipeline may go on at once and
/// cancelling one never touches another. Cancelling the Swift task awaiting ``run(from:)`` (or
/// calling ``RunHandle/cancel()`` on a completion-handler run) cancels the running step, which
/// sees `Task.isCancelled`, and the run ends with `CancellationError`.
///
/// ```swift
/// let pipeline = Pipeline(defaultValue: 1)
///   .then { $0 + 1 }
///   .then { $0 * 10 }
/// let value = try await pipeline.run()  // 20
/// ```
public struct Pipeline<Value: Sendable>: Sendable {
  /// One step: takes the previous value, returns the next one or throws.
  public typealias Step = @Sendable (Value) async throws -> Value

  /// The value the first step receives when a run is not given one.
  public var defaultValue: Value
  /// The steps, in order.
  public var steps: [Step]
  /// Where completion-handler runs deliver. Defaults to `DispatchQueue.global()` on every
  /// platform (`DispatchQueue.main` never runs in a Linux tool without a run loop).
  public var callbackQueue: DispatchQueue

  /// Makes a pipeline.
  ///
  /// - Parameters:
  ///   - defaultValue: The value a run starts from unless given another.
  ///   - steps: The steps, in order.
  ///   - callbackQueue: Where completion handlers are called; `DispatchQueue.global()` by default.
  public init(defaultValue: Value, steps: [Step] = [], callbackQueue: DispatchQueue = .global()) {
    self.defaultValue = defaultValue
    self.steps = steps
    self.callbackQueue = callbackQueue
  }

  /// Returns a copy with `step` appended.
  ///
  /// - Parameter step: Receives the previous value and returns the next.
  public func then(_ step: @escaping Step) -> Pipeline {
    var copy = self
    copy.steps.append(step)
    return copy
  }

  /// Makes a step from a completion-handler closure (the seed's `AsyncOperationWithCompletion`).
  ///
  /// If the run is cancelled while the closure is pending, the run ends at once with
  /// `CancellationError` and the closure's late completion is ignored.
  ///
  /// A closure that never calls its completion leaves the run waiting until it is cancelled:
  /// nothing else ends it. To bound a step, wrap it in ``step(timeout:_:)``, which fails it with
  /// ``StepTimeoutError`` when the time is up:
  ///
  /// ```swift
  /// let pipeline = Pipeline(defaultValue: request)
  ///   .then(Pipeline.step(timeout: .seconds(30), Pipeline.step { value, done in
  ///     legacyClient.send(value) { done($0) }  // may never call back
  ///   }))
  /// ```
  ///
  /// - Parameter body: Receives the previous value and a completion to call once.
  public static func step(
    _ body: @escaping @Sendable (Value, @escaping @Sendable (Result<Value, any Error>) -> Void) -> Void
  ) -> Step {
    { value in try await awaitCallback { body(value, $0) } }
  }

  /// Bounds `step` in time: if it has not finished after `limit`, the run goes on without it
  /// and fails with ``StepTimeoutError``.
  ///
  /// The step runs in a task of its own, which is cancelled when the time is up (or when the
  /// run is cancelled) and not waited for: a step that ignores cancellation, or a completion
  /// that never comes, cannot hold the run past `limit`. Its late result is ignored.
  ///
  /// ```swift
  /// let pipeline = Pipeline(defaultValue: 0)
  ///   .then(Pipeline.step(timeout: .seconds(5)) { value in try await slowService.fetch(value) })
  /// ```
  ///
  /// - Parameters:
  ///   - limit: How long the step may take.
  ///   - step: The step to bound.
  public static func step(timeout limit: Duration, _ step: @escaping Step) -> Step {
    { value in try await withTimeLimit(limit) { try await step(value) } }
  }

  /// Runs the steps from ``defaultValue``.
  ///
  /// - Returns: The last step's value (``defaultValue`` if there are no steps).
  /// - Throws: The first step error, or `CancellationError` if the awaiting task was cancelled.
  @inlinable
  public func run() async throws -> Value {
    try await Self.fold(steps, from: defaultValue)
  }

  /// Runs the steps from `initial`.
  ///
  /// - Parameter initial: The value the first step receives.
  /// - Returns: The last step's value.
  /// - Throws: The first step error, or `CancellationError` if the awaiting task was cancelled.
  @inlinable
  public func run(from initial: Value) async throws -> Value {
    try await Self.fold(steps, from: initial)
  }

  /// Runs the steps from `initial` (or ``defaultValue``) in a new task, reporting once.
  ///
  /// - Parameters:
  ///   - initial: The value the first step receives; ``defaultValue`` when nil.
  ///   - completion: Called exactly once on ``callbackQueue`` with the final value or the error.
  /// - Returns: A handle that cancels this run only.
  @discardableResult
  public func execute(
    from initial: Value? = nil,
    completion: @escaping @Sendable (Result<Value, any Error>) -> Void
  ) -> RunHandle {
    Self.start(steps, from: initial ?? defaultValue, on: callbackQueue, completion: completion)
  }

  /// The seed's shape: runs `operations` (not ``steps``) from ``defaultValue`` and reports once.
  ///
  /// - Parameters:
  ///   - operations: The steps to run, in order.
  ///   - completion: Called exactly once on ``callbackQueue`` with the final value or the error.
  /// - Returns: A handle that cancels this run only.
  @discardableResult
  public func executeOperations(
    _ operations: [Step],
    completion: @escaping @Sendable (Result<Value, any Error>) -> Void
  ) -> RunHandle {
    Self.start(operations, from: defaultValue, on: callbackQueue, completion: completion)
  }

  @inlinable
  static func start(
    _ steps: [Step],
    from initial: Value,
    on queue: DispatchQueue,
    completion: @escaping @Sendable (Result<Value, any Error>) -> Void
  ) -> RunHandle {
    RunHandle.start(on: queue, completion: completion) { try await fold(steps, from: initial) }
  }

  /// The hot path: one await per step, no task and no lock per step.
  ///
  /// Cancellation is checked before every step and after the last one through an atomic flag
  /// that one cancellation handler per run sets: a relaxed load instead of `Task.isCancelled`,
  /// which costs a runtime call per step (half the time of a trivial step). Inlinable so that it
  /// is specialised for the caller's `Value` (unspecialised generic code costs as much again).
  @inlinable
  static func fold(_ steps: [Step], from initial: Value) async throws -> Value {
    let cancelled = CancellationFlag()
    return try await withTaskCancellationHandler {
      var value = initial
      for step in steps {
        if cancelled.isSet { throw CancellationError() }
        value = try await step(value)
      }
      if cancelled.isSet { throw CancellationError() }
      return value
    } onCancel: {
      cancelled.set()
    }
  }
}

/// The error of a step made with ``Pipeline/step(timeout:_:)`` that did not finish in time.
public struct StepTimeoutError: Error, Hashable, CustomStringConvertible {
  /// The time the step was given.
  public var limit: Duration

  /// Makes the error.
  ///
  /// - Parameter limit: The time the step was given.
  public init(limit: Duration) {
    self.limit = limit
  }

  /// "the step did not finish within …".
  public var description: String { "the step did not finish within \(limit)" }
}

/// Runs `body` in a task of its own and returns its value, or throws ``StepTimeoutError`` after
/// `limit`, or `CancellationError` when the awaiting task is cancelled, whichever comes first.
/// The task and the timer are cancelled when this returns; neither is waited for.
func withTimeLimit<Value: Sendable>(
  _ limit: Duration, _ body: @escaping @Sendable () async throws -> Value
) async throws -> Value {
  let started = Mutex<[Task<Void, Never>]>([])
  defer { for task in started.withLock({ $0 }) { task.cancel() } }
  return try await awaitCallback { finish in
    let work = Task {
      do {
        finish(.success(try await body()))
      } catch {
        finish(.failure(error))
      }
    }
    let timer = Task {
      do {
        // Not `Task.sleep`: on Linux a cancelled one stays scheduled until its deadline.
        try await DispatchSleep.sleep(for: limit)
      } catch {
        return  // the work finished or the run was cancelled first
      }
      finish(.failure(StepTimeoutError(limit: limit)))
    }
    started.withLock { $0 = [work, timer] }
  }
}

/// A flag a task cancellation handler sets and a loop reads cheaply.
@usableFromInline
final class CancellationFlag: Sendable {
  @usableFromInline let flag = Atomic(false)

  @usableFromInline
  init() {}

  /// Whether the handler has run.
  @inlinable
  var isSet: Bool {
    flag.load(ordering: .relaxed)
  }

  /// Called from the cancellation handler.
  @usableFromInline
  func set() {
    flag.store(true, ordering: .relaxed)
  }
}

extension Pipeline {
  /// Starts a pipeline whose steps may change the value's type.
  ///
  /// ```swift
  /// let length = Pipeline.start(with: { (text: String) in text.count })
  ///   .then { $0 * 2 }
  ///   .then { "\($0) characters, doubled" }
  /// ```
  ///
  /// - Parameter first: The first step, from `Value` to its output.
  public static func start<Output: Sendable>(
    with first: @escaping @Sendable (Value) async throws -> Output
  ) -> TypedPipeline<Value, Output> {
    TypedPipeline(first)
  }
}

/// A pipeline whose steps may change type, built with ``Pipeline/start(with:)`` and ``then(_:)``.
///
/// The same rules as ``Pipeline``: each step receives the previous value, the first error stops
/// it, cancellation is checked before every step, runs are independent.
public struct TypedPipeline<Input: Sendable, Output: Sendable>: Sendable {
  private let body: @Sendable (Input) async throws -> Output

  /// Starts with `first`, checking cancellation before it.
  init(_ first: @escaping @Sendable (Input) async throws -> Output) {
    self.init(body: { input in
      if Task.isCancelled { throw CancellationError() }
      return try await first(input)
    })
  }

  private init(body: @escaping @Sendable (Input) async throws -> Output) {
    self.body = body
  }

  /// Returns a pipeline with `step` appended.
  ///
  /// - Parameter step: Receives this pipeline's output and returns the next value.
  public func then<Next: Sendable>(
    _ step: @escaping @Sendable (Output) async throws -> Next
  ) -> TypedPipeline<Input, Next> {
    let body = self.body
    return TypedPipeline<Input, Next>(body: { input in
      let value = try await body(input)
      // Checked between steps: a cancelled run never starts `step`.
      if Task.isCancelled { throw CancellationError() }
      return try await step(value)
    })
  }

  /// Runs the steps from `input`.
  ///
  /// - Parameter input: The value the first step receives.
  /// - Throws: The first step error, or `CancellationError` if the awaiting task was cancelled.
  public func run(_ input: Input) async throws -> Output {
    let output = try await body(input)
    if Task.isCancelled { throw CancellationError() }
    return output
  }

  /// Runs the steps from `input` in a new task and reports once.
  ///
  /// - Parameters:
  ///   - input: The value the first step receives.
  ///   - callbackQueue: Where `completion` is called; `DispatchQueue.global()` by default.
  ///   - completion: Called exactly once with the final value or the error.
  /// - Returns: A handle that cancels this run only.
  @discardableResult
  public func execute(
    _ input: Input,
    callbackQueue: DispatchQueue = .global(),
    completion: @escaping @Sendable (Result<Output, any Error>) -> Void
  ) -> RunHandle {
    RunHandle.start(on: callbackQueue, completion: completion) { try await run(input) }
  }
}
