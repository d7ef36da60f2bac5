import Dispatch
import Foundation
import Synchronization

/// A `Foundation.Operation` whose work finishes later and produces a typed `Success` or `Failure`.
///
/// Use it on an `OperationQueue` (dependencies, priorities and `maxConcurrentOperationCount` are
/// honoured) or on its own with `run()`. Give the work as a closure, or subclass and override
/// `main()`; either way the operation completes exactly once, by `finish(returning:)`,
/// `finish(throwing:)` or `cancel()`, whichever comes first. Later calls are ignored.
///
/// - After `cancel()`, neither `successHandler` nor `failureHandler` runs. A started operation
///   becomes `isFinished` at once, so dependents do not wait for work that no longer matters; the
///   work sees `isCancelled` (and, for the `async` closure form, `Task.isCancelled`).
/// - Handlers run on `callbackQueue`, never while the operation holds its lock.
///
/// ```swift
/// let download = AsyncOperation<Int, URLError> { () async throws(URLError) -> Int in
///   try await fetchSize()
/// }
/// download.successHandler = { size in print("size:", size) }
/// queue.addOperation(download)
/// let size = try await download.value  // waits; the queue starts it
/// ```
///
/// Subclassing:
///
/// ```swift
/// final class Tick: AsyncOperation<Int, Never>, @unchecked Sendable {
///   override func main() {
///     DispatchQueue.global().asyncAfter(deadline: .now() + 0.1) { self.finish(returning: 1) }
///   }
/// }
/// ```
// @unchecked Sendable: mutable state lives in `control` (one atomic byte) and `state` (a
// `Mutex`, the lock for outcome, waiters, handlers and task); `body` is immutable.
open class AsyncOperation<Success: Sendable, Failure: Error>: Operation, @unchecked Sendable {
  /// The work given to a closure initialiser; nil for subclasses that override `main()`.
  /// Boxed so the designated initialiser takes no function type (a subclass with
  /// `Failure == Never` would otherwise crash Swift 6.3's vtable thunk emission).
  enum Body {
    case handler(@Sendable (AsyncOperation<Success, Failure>) -> Void)
    case work(TaskPriority?, @Sendable () async throws(Failure) -> Success)
  }

  private let control = OperationControl()
  private let state = Mutex(OperationStateMachine<Success, Failure>())
  private let body: Body?

  /// Creates an operation for a subclass that overrides `main()`.
  public override init() {
    body = nil
    super.init()
  }

  /// Creates an operation that runs `body` when started; `body` must eventually call
  /// `finish(returning:)` or `finish(throwing:)` on the operation it is given.
  ///
  /// No `Task` is created: `body` runs on the thread that starts the operation and may hand the
  /// work to any queue or callback API.
  ///
  /// - Parameter body: Starts the work; it receives the operation to finish and to check
  ///   `isCancelled` on.
  ///
  /// ```swift
  /// let op = AsyncOperation<Int, Never> { operation in
  ///   DispatchQueue.global().async { operation.finish(returning: 42) }
  /// }
  /// ```
  public convenience init(
    _ body: @escaping @Sendable (_ operation: AsyncOperation<Success, Failure>) -> Void
  ) {
    self.init(body: .handler(body))
  }

  /// Creates an operation that runs `work` in a new `Task` when started and finishes with what
  /// it returns or throws.
  ///
  /// `cancel()` cancels that task, so `work` can check `Task.isCancelled` or
  /// `try Task.checkCancellation()`-style APIs; the operation does not wait for `work` to notice.
  ///
  /// - Parameters:
  ///   - priority: The priority of the task that runs `work`.
  ///   - work: The work; its value or typed error becomes the operation's result.
  ///
  /// ```swift
  /// let op = AsyncOperation<Int, Never> {
  ///   try? await Task.sleep(for: .milliseconds(10))
  ///   return 42
  /// }
  /// ```
  public convenience init(
    priority: TaskPriority? = nil, _ work: @escaping @Sendable () async throws(Failure) -> Success
  ) {
    self.init(body: .work(priority, work))
  }

  init(body: Body) {
    self.body = body
    super.init()
  }

  // MARK: Configuration

  /// Called with the value when the operation succeeds; never after `cancel()`.
  ///
  /// Set it before the operation finishes: it is read once, when the outcome is decided, and
  /// dispatched to `callbackQueue` just after. Waiters on another thread may see the value first.
  public var successHandler: (@Sendable (Success) -> Void)? {
    get { state.withLock { $0.successHandler } }
    set { state.withLock { $0.successHandler = newValue } }
  }

  /// Called with the error when the operation fails; never after `cancel()`.
  ///
  /// Set it before the operation finishes: it is read once, when the outcome is decided.
  public var failureHandler: (@Sendable (Failure) -> Void)? {
    get { state.withLock { $0.failureHandler } }
    set { state.withLock { $0.failureHandler = newValue } }
  }

  /// The queue `successHandler` and `failureHandler` run on.
  ///
  /// Defaults to `DispatchQueue.main` on Apple platforms. On Linux the default is one shared
  /// serial queue labelled `conveyor.callbacks`, because `DispatchQueue.main` does not run in
  /// command-line tools or test runners there unless something calls `dispatchMain()`.
  public var callbackQueue: DispatchQueue {
    get { state.withLock { $0.callbackQueue } }
    set { state.withLock { $0.callbackQueue = newValue } }
  }

  // MARK: Outcome

  /// The result once the operation succeeded or failed; nil while pending and after `cancel()`.
  public var result: Result<Success, Failure>? {
    state.withLock { $0.result }
  }

  /// The value, waiting until the outcome is decided. Never starts the operation.
  ///
  /// Use it for an operation added to an `OperationQueue` (or started elsewhere); use `run()`
  /// to start a standalone one. Cancelling the waiting task does not cancel the operation (as
  /// with `Task.value`); it keeps waiting.
  ///
  /// - Throws: `OperationError.failed` with the operation's error, or `.cancelled`.
  public var value: Success {
    get async throws(OperationError<Failure>) {
      try await OperationDriver.outcome(state).get()
    }
  }

  /// Starts the operation if nobody has, then returns its value.
  ///
  /// Meant for standalone operations. It never starts an operation twice; but on an operation
  /// already in an `OperationQueue` it would start it without waiting for its dependencies, so
  /// await `value` there instead. Cancelling the calling task cancels the operation.
  ///
  /// - Throws: `OperationError.failed` with the operation's error, or `.cancelled`.
  @discardableResult
  public func run() async throws(OperationError<Failure>) -> Success {
    let outcome = await withTaskCancellationHandler {
      start()
      return await OperationDriver.outcome(state)
    } onCancel: {
      cancel()
    }
    return try outcome.get()
  }

  // MARK: Operation

  /// Always true: the operation is finished by `finish(…)` or `cancel()`, not when `main()`
  /// returns.
  open override var isAsynchronous: Bool { true }

  /// Whether `cancel()` decided the outcome. False if the operation had already finished when
  /// `cancel()` was called: a late cancel changes nothing.
  open override var isCancelled: Bool { control.isCancelled }

  /// Whether `main()` has been called and the operation has not finished yet.
  open override var isExecuting: Bool { control.isExecuting }

  /// Whether the operation finished, failed or was cancelled and started (dependents may run).
  open override var isFinished: Bool { control.isFinished }

  /// Runs `main()` once; an operation cancelled before starting finishes without running it.
  ///
  /// Calling it again, from any thread, does nothing.
  public final override func start() {
    switch control.claimStart() {
    case .ignore:
      return
    case .finishWithoutRunning:
      OperationDriver.publishFinished(self, control, wasExecuting: false)
    case .run:
      OperationDriver.publishExecuting(self, control)
      if !control.isDecided {
        main()
      } else {
        OperationDriver.publishFinished(self, control, wasExecuting: true)
      }
    }
  }

  /// Starts the work. Subclasses override it (without calling `super`) and call
  /// `finish(returning:)` or `finish(throwing:)` once the work is done, from any thread.
  open override func main() {
    switch body {
    case .handler(let handler):
      handler(self)
    case .work(let priority, let work):
      let task = Task(priority: priority) {
        do throws(Failure) {
          self.finish(returning: try await work())
        } catch {
          self.finish(throwing: error)
        }
      }
      if !state.withLock({ $0.attach(task) }) { task.cancel() }
    case nil:
      preconditionFailure("\(type(of: self)) must override main() or use a closure initialiser")
    }
  }

  /// Cancels the operation: it produces no result, its handlers do not run, waiters get
  /// `OperationError.cancelled`, and a started operation becomes finished at once.
  ///
  /// Ignored if the operation already finished. Subclasses that override it must call `super`.
  open override func cancel() {
    guard let started = control.claimOutcome(cancelling: true) else { return }
    let completion = state.withLock { $0.complete(.failure(.cancelled)) }
    super.cancel()
    if started { OperationDriver.publishFinished(self, control, wasExecuting: true) }
    if let completion { OperationDriver.deliver(completion) }
  }

  /// Finishes the operation with `value`; ignored if it already finished or was cancelled.
  ///
  /// - Parameter value: The operation's result, passed to `successHandler` and to waiters.
  public final func finish(returning value: Success) {
    complete(.success(value))
  }

  /// Finishes the operation with `error`; ignored if it already finished or was cancelled.
  ///
  /// - Parameter error: The operation's failure, passed to `failureHandler`; waiters get
  ///   `OperationError.failed(error)`.
  public final func finish(throwing error: Failure) {
    complete(.failure(.failed(error)))
  }

  private func complete(_ outcome: OperationStateMachine<Success, Failure>.Outcome) {
    guard let started = control.claimOutcome(cancelling: false) else { return }
    let completion = state.withLock { $0.complete(outcome) }
    if started { OperationDriver.publishFinished(self, control, wasExecuting: true) }
    if let completion { OperationDriver.deliver(completion) }
  }
}
