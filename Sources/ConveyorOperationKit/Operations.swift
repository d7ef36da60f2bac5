import Conveyor
import Dispatch
import Foundation
import Synchronization

/// The typed operation kit's asynchronous operation: change `import OperationKit` to
/// `import ConveyorOperationKit`.
///
/// Subclasses override `main()` (without calling `super`) and call ``finish(withResult:)`` or
/// ``finish(withError:)`` once, from any thread. `successHandler` or `failureHandler` then runs
/// on `callbackQueue` (the main queue on Apple platforms), and only after it returned does the
/// operation become finished, so an `OperationQueue` starts dependents after the handler: they see
/// what it stored.
///
/// Its members are the old class's and `Foundation.Operation`'s, nothing more, so a subclass may
/// declare any other name (a `result`, a `value`) as before. It runs on Conveyor's operation
/// machinery, which fixes the old kit's bugs: a second `finish` is ignored (the handlers ran
/// twice), `cancel()` racing `finish` never runs a handler, and state is guarded by a lock.
///
/// One difference on purpose: an operation cancelled before it started becomes finished when its
/// queue starts it (at once, as a cancelled operation is ready), not inside `cancel()`; see the
/// migration guide.
///
/// ```swift
/// // @unchecked Sendable: no stored properties (Swift 6 asks subclasses to restate it).
/// final class Answer: AsyncOperation<Int, MyError>, @unchecked Sendable {
///   override func main() {
///     DispatchQueue.global().async { self.finish(withResult: 42) }
///   }
/// }
/// ```
// @unchecked Sendable: all mutable state lives in `core` (Conveyor's `OperationCore`: an atomic
// byte and a `Mutex`).
open class AsyncOperation<ResultType: Sendable, ErrorType: Error>: Foundation.Operation, @unchecked Sendable {
  private let core = OperationCore()

  /// Creates an operation for a subclass that overrides `main()`.
  public override init() {
    super.init()
    core.finishesAfterHandlers = true
  }

  /// Called on `callbackQueue` with the value of ``finish(withResult:)``; never after `cancel()`.
  /// Set it before the operation finishes.
  open var successHandler: (@Sendable (ResultType) -> Void)? {
    get { ErasedHandlers.typed(core.successHandler) }
    set { core.successHandler = ErasedHandlers.erased(newValue) }
  }

  /// Called on `callbackQueue` with the error of ``finish(withError:)``; never after `cancel()`.
  /// Set it before the operation finishes.
  open var failureHandler: (@Sendable (ErrorType) -> Void)? {
    get { ErasedHandlers.typed(core.failureHandler) }
    set { core.failureHandler = ErasedHandlers.erased(newValue) }
  }

  /// Where the handlers run: the main queue on Apple platforms; elsewhere one shared serial
  /// queue, because the main queue does not run in Linux tools and test runners.
  open var callbackQueue: DispatchQueue {
    get { core.callbackQueue }
    set { core.callbackQueue = newValue }
  }

  #if canImport(Darwin)
    /// True: the operation is finished by `finish` or `cancel()`, not when `main()` returns.
    public final override var isConcurrent: Bool { true }
  #else
    /// True, as on Apple platforms (where `Operation` has this older name of `isAsynchronous`).
    public final var isConcurrent: Bool { true }
  #endif

  /// True: the operation is finished by `finish` or `cancel()`, not when `main()` returns.
  public final override var isAsynchronous: Bool { true }

  /// Whether `main()` has been called and the operation has not finished yet.
  public final override var isExecuting: Bool { core.isExecuting }

  /// Whether the operation finished (after its handler) or was cancelled and started.
  public final override var isFinished: Bool { core.isFinished }

  /// Runs `main()` once; an operation cancelled before starting finishes without running it.
  public final override func start() {
    let deferred = core.start(self, finishesWhenDecided: true) { main() }
    if let deferred { finishAfterHandler(deferred) }
  }

  /// The work: override it (without calling `super`) and call ``finish(withResult:)`` or
  /// ``finish(withError:)`` once it is done.
  open override func main() {
    preconditionFailure("\(type(of: self)) must override main()")
  }

  /// Cancels the operation: no handler runs, and a started operation is finished at once.
  /// Ignored once it finished. Subclasses that override it must call `super`.
  open override func cancel() {
    core.cancel(self, finishesWhenDecided: true) { super.cancel() }
  }

  /// Finishes with `result`: `successHandler` runs, then the operation is finished. Ignored after
  /// the first finish or a `cancel()`.
  ///
  /// - Parameter result: The operation's value.
  public final func finish(withResult result: ResultType) {
    finish(.success(result))
  }

  /// Finishes with `error`: `failureHandler` runs, then the operation is finished. Ignored after
  /// the first finish or a `cancel()`.
  ///
  /// - Parameter error: The operation's error.
  public final func finish(withError error: ErrorType) {
    finish(.failure(error))
  }

  private func finish(_ outcome: ErasedOutcome) {
    let deferred = core.complete(self, outcome, finishesWhenDecided: true)
    if let deferred { finishAfterHandler(deferred) }
  }

  /// Runs the handler, then publishes `isFinished`.
  private func finishAfterHandler(_ deferred: DeferredFinish) {
    let wasExecuting = deferred.wasExecuting
    OperationCore.finishAfterHandler(deferred) {
      self.core.publishFinished(self, wasExecuting: wasExecuting)
    }
  }
}

/// The typed operation kit's synchronous operation: `main()` does the work and calls
/// ``finish(withResult:)`` or ``finish(withError:)`` before it returns, as the old README asks.
///
/// As in the old kit it is synchronous (`isAsynchronous` is false): `finish` runs the handler on
/// `callbackQueue` and waits for it (inline when already on that queue), and the operation is
/// finished when `main()` returns, so a dependent sees what the handler stored. Do not let
/// `callbackQueue` wait for the operation (a main queue blocked in
/// `waitUntilAllOperationsAreFinished()`): the handler could never run. A `main()` that returns
/// without calling `finish` finishes the operation with no handler run, as before.
///
/// Fixed from the old kit: a second `finish` is ignored, and a `cancel()` that comes before
/// `finish` means no handler runs.
///
/// ```swift
/// // @unchecked Sendable: no stored properties (Swift 6 asks subclasses to restate it).
/// final class Parse: SyncOperation<Int, ParseError>, @unchecked Sendable {
///   override func main() {
///     if let number = Int("42") { finish(withResult: number) } else { finish(withError: ParseError()) }
///   }
/// }
/// ```
// @unchecked Sendable: the handlers, the callback queue and whether the outcome was decided live
// in `state`, a `Mutex`.
open class SyncOperation<ResultType: Sendable, ErrorType: Error>: Foundation.Operation, @unchecked Sendable {
  private struct State {
    var successHandler: (@Sendable (ResultType) -> Void)?
    var failureHandler: (@Sendable (ErrorType) -> Void)?
    var callbackQueue = defaultOperationCallbackQueue
    /// Set by the first `finish` or an effective `cancel()`; later ones are ignored.
    var decided = false
  }

  private let state = Mutex(State())

  /// Creates an operation for a subclass that overrides `main()`.
  public override init() {
    super.init()
  }

  /// Called on `callbackQueue` with the value of ``finish(withResult:)``, before `finish`
  /// returns; never after `cancel()`.
  open var successHandler: (@Sendable (ResultType) -> Void)? {
    get { state.withLock { $0.successHandler } }
    set { state.withLock { $0.successHandler = newValue } }
  }

  /// Called on `callbackQueue` with the error of ``finish(withError:)``, before `finish` returns;
  /// never after `cancel()`.
  open var failureHandler: (@Sendable (ErrorType) -> Void)? {
    get { state.withLock { $0.failureHandler } }
    set { state.withLock { $0.failureHandler = newValue } }
  }

  /// Where the handlers run: the main queue on Apple platforms; elsewhere one shared serial
  /// queue, because the main queue does not run in Linux tools and test runners.
  open var callbackQueue: DispatchQueue {
    get { state.withLock { $0.callbackQueue } }
    set { state.withLock { $0.callbackQueue = newValue } }
  }

  #if canImport(Darwin)
    /// False: the operation is finished when `main()` returns.
    public final override var isConcurrent: Bool { false }
  #else
    /// False, as on Apple platforms (where `Operation` has this older name of `isAsynchronous`).
    public final var isConcurrent: Bool { false }
  #endif

  /// False: the operation is finished when `main()` returns.
  public final override var isAsynchronous: Bool { false }

  /// Cancels the operation unless `finish` came first: no handler runs after it. Subclasses that
  /// override it must call `super`.
  open override func cancel() {
    let decides = state.withLock { state -> Bool in
      if state.decided { return false }
      state.decided = true
      return true
    }
    if decides { super.cancel() }
  }

  /// Runs `successHandler` with `result` on `callbackQueue` and returns when it has. Ignored
  /// after the first finish or a `cancel()`.
  ///
  /// - Parameter result: The operation's value.
  public final func finish(withResult result: ResultType) {
    guard let (handler, queue) = decide({ $0.successHandler }) else { return }
    if let handler { Self.run(on: queue) { handler(result) } }
  }

  /// Runs `failureHandler` with `error` on `callbackQueue` and returns when it has. Ignored after
  /// the first finish or a `cancel()`.
  ///
  /// - Parameter error: The operation's error.
  public final func finish(withError error: ErrorType) {
    guard let (handler, queue) = decide({ $0.failureHandler }) else { return }
    if let handler { Self.run(on: queue) { handler(error) } }
  }

  /// Decides the outcome; nil if it was decided already, else the handler `pick` chooses (the
  /// others are released) and the callback queue.
  private func decide<Handler>(
    _ pick: (State) -> Handler?
  ) -> (Handler?, DispatchQueue)? {
    state.withLock { state in
      if state.decided { return nil }
      state.decided = true
      let handler = pick(state)
      state.successHandler = nil
      state.failureHandler = nil
      return (handler, state.callbackQueue)
    }
  }

  /// Runs `body` on `queue` and waits: inline when the calling thread already runs `queue` (the
  /// old kit's "safe sync"), so a handler on the operation's own queue cannot deadlock.
  private static func run(on queue: DispatchQueue, _ body: () -> Void) {
    if Thread.isMainThread && queue === DispatchQueue.main {
      body()
      return
    }
    let identity = ObjectIdentifier(queue)
    if queue.getSpecific(key: queueIdentityKey) != identity {
      queue.setSpecific(key: queueIdentityKey, value: identity)
    }
    // The calling thread's queue, or a queue it targets, is `queue`: waiting would deadlock.
    if DispatchQueue.getSpecific(key: queueIdentityKey) == identity {
      body()
    } else {
      queue.sync(execute: body)
    }
  }
}

/// Marks a callback queue with its own identity, so that a thread can tell whether it runs it.
private let queueIdentityKey = DispatchSpecificKey<ObjectIdentifier>()
