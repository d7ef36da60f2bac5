import Dispatch
import Foundation
import Synchronization

/// What ``AsyncOperation`` and ``SyncOperation`` share: a `Foundation.Operation` that produces a
/// typed `Success` or `Failure` once, with handlers, `async` waiting and cancellation.
///
/// Not meant to be used or subclassed directly (it has no public initialiser): subclass
/// ``AsyncOperation`` and override `main()`, or ``SyncOperation`` and override `execute()`.
// @unchecked Sendable: all mutable state lives in `core` (`OperationCore`: one atomic byte and a
// `Mutex`, the lock for outcome, waiters, handlers and task).
open class TypedOperation<Success: Sendable, Failure: Error>: Operation, @unchecked Sendable {
  private let core = OperationCore()

  /// Internal, so only this module's subclasses can be created. It overrides `Operation.init()`
  /// (rather than taking the finishing policy as an argument) so that the subclasses, which
  /// override it in turn, still inherit `Operation`'s convenience initialisers, as they did
  /// before this class existed.
  override init() {
    super.init()
  }

  deinit {
    core.detachFromDependencies(self)
  }

  /// When a started operation becomes `isFinished`: false (here and in `SyncOperation`) when
  /// `main()` returns; true (`AsyncOperation`) as soon as `finish(…)` or `cancel()` decides its
  /// outcome.
  var finishesWhenDecided: Bool { false }

  // MARK: Configuration

  /// Called with the value when the operation succeeds; never after `cancel()`.
  ///
  /// Set it before the operation finishes: it is read once, when the outcome is decided, and
  /// dispatched to `callbackQueue` just after. Waiters on another thread may see the value first.
  public var successHandler: (@Sendable (Success) -> Void)? {
    get { ErasedHandlers.typed(core.successHandler) }
    set { core.successHandler = ErasedHandlers.erased(newValue) }
  }

  /// Called with the error when the operation fails; never after `cancel()`.
  ///
  /// Set it before the operation finishes: it is read once, when the outcome is decided.
  public var failureHandler: (@Sendable (Failure) -> Void)? {
    get { ErasedHandlers.typed(core.failureHandler) }
    set { core.failureHandler = ErasedHandlers.erased(newValue) }
  }

  /// Whether a started operation becomes `isFinished` only after its `successHandler` or
  /// `failureHandler` returned, on `callbackQueue`. Default false: it finishes as soon as its
  /// outcome is decided, and the handler runs a moment later.
  ///
  /// Set it when a dependent operation reads what the handler stores: on an `OperationQueue`,
  /// the dependent then starts after the handler ran (as in the typed operation kit Conveyor grew
  /// out of; ConveyorOperationKit's classes set it). Without a handler, or after `cancel()`, the
  /// operation finishes as usual. Do not set it when `callbackQueue` waits for the operation
  /// (a main queue blocked in `waitUntilAllOperationsAreFinished()`, say): it would never finish.
  public var finishesAfterHandlers: Bool {
    get { core.finishesAfterHandlers }
    set { core.finishesAfterHandlers = newValue }
  }

  /// The queue `successHandler` and `failureHandler` run on.
  ///
  /// Defaults to `DispatchQueue.main` on Apple platforms. On Linux the default is one shared
  /// serial queue labelled `conveyor.callbacks`, because `DispatchQueue.main` does not run in
  /// command-line tools or test runners there unless something calls `dispatchMain()`.
  public var callbackQueue: DispatchQueue {
    get { core.callbackQueue }
    set { core.callbackQueue = newValue }
  }

  // MARK: Outcome

  /// The result once the operation succeeded or failed; nil while pending and after `cancel()`.
  public var result: Result<Success, Failure>? {
    core.outcome?.result(Success.self, Failure.self)
  }

  /// The value, waiting until the outcome is decided. Never starts the operation.
  ///
  /// Use it for an operation added to an `OperationQueue` (or started elsewhere); use `run()`
  /// to start a standalone one. After `cancel()` it returns at once, even while the work (a
  /// `SyncOperation`'s `execute()`, for instance) is still winding down. Cancelling the waiting
  /// task does not cancel the operation (as with `Task.value`); it keeps waiting.
  ///
  /// - Throws: `OperationError.failed` with the operation's error, or `.cancelled`.
  public var value: Success {
    get async throws(OperationError<Failure>) {
      try Self.typed(await core.awaitOutcome())
    }
  }

  /// Starts the operation on the calling task if nobody has, then returns its value.
  ///
  /// Meant for standalone operations. It never starts an operation twice; but on an operation
  /// already in an `OperationQueue` it would start it without waiting for its dependencies, so
  /// await `value` there instead. Cancelling the calling task cancels the operation.
  ///
  /// A `SyncOperation`'s `execute()` blocks the calling thread, so keep it short or use
  /// `AsyncOperation` for long work.
  ///
  /// - Throws: `OperationError.failed` with the operation's error, or `.cancelled`.
  @discardableResult
  public func run() async throws(OperationError<Failure>) -> Success {
    let outcome = await withTaskCancellationHandler {
      start()
      return await core.awaitOutcome()
    } onCancel: {
      cancel()
    }
    return try Self.typed(outcome)
  }

  /// The value of `outcome`, or its typed error.
  private static func typed(_ outcome: ErasedOutcome) throws(OperationError<Failure>) -> Success {
    switch outcome {
    case .success(let value): return value as! Success
    case .failure(let error): throw .failed(error as! Failure)
    case .cancelled: throw .cancelled
    }
  }

  // MARK: Operation

  /// Whether `cancel()` decided the outcome. False if the operation had already finished when
  /// `cancel()` was called: a late cancel changes nothing.
  open override var isCancelled: Bool { core.isCancelled }

  /// Whether `main()` has been called and the operation has not finished yet (for a
  /// `SyncOperation`: whether `execute()` is running).
  open override var isExecuting: Bool { core.isExecuting }

  /// Whether the operation finished, failed or was cancelled and started (dependents may run).
  ///
  /// A started `SyncOperation` finishes when `execute()` returns, even if cancelled while it ran.
  open override var isFinished: Bool { core.isFinished }

  /// Runs `main()` once; an operation cancelled before starting finishes without running it.
  ///
  /// Calling it again, from any thread, does nothing. A `SyncOperation` runs `main()`
  /// synchronously and finishes when it returns; an `AsyncOperation` finishes when `finish(…)` or
  /// `cancel()` decides its outcome.
  public final override func start() {
    let deferred = core.start(self, finishesWhenDecided: finishesWhenDecided) { main() }
    if let deferred { finishAfterHandler(deferred) }
  }

  /// Cancels the operation: it produces no result, its handlers do not run and waiters get
  /// `OperationError.cancelled` at once. A started `AsyncOperation` becomes finished at once; a
  /// running `SyncOperation` when its `execute()`, which sees `isCancelled`, returns.
  ///
  /// Ignored if the operation already finished. Subclasses that override it must call `super`.
  ///
  /// An outcome given by `finish` before the operation started is not delivered until it starts
  /// (after its dependencies); until then `cancel()` still cancels it.
  open override func cancel() {
    core.cancel(self, finishesWhenDecided: finishesWhenDecided) { super.cancel() }
  }

  /// Makes this operation wait for `operation`, as `Operation.addDependency(_:)` does.
  ///
  /// On Linux, where Foundation keeps dependents unretained, an operation freed before its
  /// dependencies finished (one cancelled while it waited) takes itself off their books when it
  /// goes, so their finish does not read freed memory. Subclasses that override it must call
  /// `super`.
  ///
  /// - Parameter operation: The operation that must finish first.
  open override func addDependency(_ operation: Operation) {
    core.noteDependency()
    super.addDependency(operation)
  }

  /// Records `outcome` unless the outcome was already decided, then finishes (if the operation
  /// finishes when decided), calls the handler and resumes waiters.
  final func complete(_ outcome: ErasedOutcome) {
    let deferred = core.complete(self, outcome, finishesWhenDecided: finishesWhenDecided)
    if let deferred { finishAfterHandler(deferred) }
  }

  /// Runs the handler, then publishes `isFinished`.
  private func finishAfterHandler(_ deferred: DeferredFinish) {
    let wasExecuting = deferred.wasExecuting
    OperationCore.finishAfterHandler(deferred) {
      self.core.publishFinished(self, wasExecuting: wasExecuting)
    }
  }

  /// Keeps the task running the work so `cancel()` can cancel it; false if already decided (the
  /// caller then cancels the task itself).
  final func attach(_ task: Task<Void, Never>) -> Bool {
    core.attach(task)
  }
}
