import Dispatch
import Foundation
import Synchronization

/// A `Foundation.Operation` that runs blocking work on the thread that starts it and produces a
/// typed `Success` or `Failure`.
///
/// Give the work as a closure, or subclass and override `execute()`. The outcome is decided once:
/// by `execute()` returning or throwing, or by `cancel()` if it comes first. After `cancel()`
/// neither handler runs and the value `execute()` returns is discarded; `execute()` should check
/// `isCancelled` to stop early. The operation becomes `isFinished` when `execute()` returns, so an
/// `OperationQueue` never runs more of them at once than its `maxConcurrentOperationCount`.
///
/// ```swift
/// let parse = SyncOperation<Int, ParseError> { () throws(ParseError) -> Int in
///   guard let number = Int(text) else { throw ParseError() }
///   return number
/// }
/// queue.addOperation(parse)
/// let number = try await parse.value
/// ```
///
/// Subclassing:
///
/// ```swift
/// final class Sum: SyncOperation<Int, Never>, @unchecked Sendable {
///   override func execute() -> Int { (1...10).reduce(0, +) }
/// }
/// ```
// @unchecked Sendable: mutable state lives in `control` (one atomic byte) and `state` (a
// `Mutex`, the lock for outcome, waiters and handlers); `work` is immutable.
open class SyncOperation<Success: Sendable, Failure: Error>: Operation, @unchecked Sendable {
  private let control = OperationControl()
  private let state = Mutex(OperationStateMachine<Success, Failure>())
  private let work: Work?

  /// The closure form's work, boxed so the designated initialiser takes no function type (a
  /// subclass with `Failure == Never` would otherwise crash Swift 6.3's vtable thunk emission).
  struct Work: Sendable {
    var run: @Sendable () throws(Failure) -> Success
  }

  /// Creates an operation for a subclass that overrides `execute()`.
  public override init() {
    work = nil
    super.init()
  }

  /// Creates an operation that runs `work` when started.
  ///
  /// - Parameter work: The blocking work; its value or typed error becomes the result.
  ///
  /// ```swift
  /// let op = SyncOperation<Int, Never> { 6 * 7 }
  /// ```
  public convenience init(_ work: @escaping @Sendable () throws(Failure) -> Success) {
    self.init(work: Work(run: work))
  }

  init(work: Work) {
    self.work = work
    super.init()
  }

  /// The work. Subclasses override it (without calling `super`); it runs at most once, on the
  /// thread that calls `start()`, and should return or throw early once `isCancelled` is true.
  ///
  /// - Returns: The operation's value.
  /// - Throws: The operation's typed failure.
  open func execute() throws(Failure) -> Success {
    guard let work else {
      preconditionFailure("\(type(of: self)) must override execute() or use init(_:)")
    }
    return try work.run()
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
  /// Use it for an operation added to an `OperationQueue`; use `run()` to start a standalone one.
  /// After `cancel()` it returns at once, even while `execute()` is still winding down.
  /// Cancelling the waiting task does not cancel the operation.
  ///
  /// - Throws: `OperationError.failed` with the operation's error, or `.cancelled`.
  public var value: Success {
    get async throws(OperationError<Failure>) {
      try await OperationDriver.outcome(state).get()
    }
  }

  /// Starts the operation on the calling task if nobody has, then returns its value.
  ///
  /// `execute()` blocks the calling thread, so keep it short or use `AsyncOperation` for long
  /// work. It never starts an operation twice; on an operation already in an `OperationQueue`
  /// await `value` instead. Cancelling the calling task cancels the operation.
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

  /// Whether `cancel()` decided the outcome. False if the operation had already finished when
  /// `cancel()` was called: a late cancel changes nothing.
  open override var isCancelled: Bool { control.isCancelled }

  /// Whether `execute()` is running.
  open override var isExecuting: Bool { control.isExecuting }

  /// Whether `execute()` returned, or the operation was cancelled and then started.
  open override var isFinished: Bool { control.isFinished }

  /// Runs `main()` once, synchronously; an operation cancelled before starting finishes without
  /// running it. Calling it again, from any thread, does nothing.
  public final override func start() {
    switch control.claimStart() {
    case .ignore:
      return
    case .finishWithoutRunning:
      OperationDriver.publishFinished(self, control, wasExecuting: false)
    case .run:
      OperationDriver.publishExecuting(self, control)
      if !control.isDecided { main() }
      OperationDriver.publishFinished(self, control, wasExecuting: true)
    }
  }

  /// Calls `execute()` and records its outcome; override `execute()` instead.
  public final override func main() {
    let outcome: OperationStateMachine<Success, Failure>.Outcome
    do throws(Failure) {
      outcome = .success(try execute())
    } catch {
      outcome = .failure(.failed(error))
    }
    complete(outcome)
  }

  /// Cancels the operation: it produces no result, its handlers do not run and waiters get
  /// `OperationError.cancelled` at once. A running `execute()` sees `isCancelled`.
  ///
  /// Ignored if the operation already finished. Subclasses that override it must call `super`.
  open override func cancel() {
    guard control.claimOutcome(cancelling: true) != nil else { return }
    let completion = state.withLock { $0.complete(.failure(.cancelled)) }
    super.cancel()
    if let completion { OperationDriver.deliver(completion) }
  }

  private func complete(_ outcome: OperationStateMachine<Success, Failure>.Outcome) {
    guard control.claimOutcome(cancelling: false) != nil else { return }
    let completion = state.withLock { $0.complete(outcome) }
    if let completion { OperationDriver.deliver(completion) }
  }
}
