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
    core.handlersFromOwner = true
  }

  deinit {
    core.detachFromDependencies(self)
  }

  /// Called on `callbackQueue` with the value of ``finish(withResult:)``; never after `cancel()`.
  /// Set it before the operation finishes.
  ///
  /// Read through `self` when the operation finishes, as in the old kit: a subclass may override
  /// it (to wrap the handler that was set, say).
  open var successHandler: (@Sendable (ResultType) -> Void)? {
    get { ErasedHandlers.typed(core.successHandler) }
    set { core.successHandler = ErasedHandlers.erased(newValue) }
  }

  /// Called on `callbackQueue` with the error of ``finish(withError:)``; never after `cancel()`.
  /// Set it before the operation finishes. Read through `self` when the operation finishes.
  open var failureHandler: (@Sendable (ErrorType) -> Void)? {
    get { ErasedHandlers.typed(core.failureHandler) }
    set { core.failureHandler = ErasedHandlers.erased(newValue) }
  }

  /// Where the handlers run: the main queue on Apple platforms; elsewhere one shared serial
  /// queue, because the main queue does not run in Linux tools and test runners. Read through
  /// `self` when the operation finishes, so a subclass may override it.
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
    let deferred = core.start(self, finishesWhenDecided: true, handlers: handlerCall(for:)) { main() }
    if let deferred { finishAfterHandler(deferred) }
  }

  /// Makes this operation wait for `operation`, as `Operation.addDependency(_:)` does (on Linux
  /// it also takes itself off the books of unfinished dependencies when it is freed).
  /// Subclasses that override it must call `super`.
  ///
  /// - Parameter operation: The operation that must finish first.
  open override func addDependency(_ operation: Foundation.Operation) {
    core.noteDependency()
    super.addDependency(operation)
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
    let deferred = core.complete(self, outcome, finishesWhenDecided: true, handlers: handlerCall(for:))
    if let deferred { finishAfterHandler(deferred) }
  }

  /// The handler for `outcome` and its queue, read through `self` (outside any lock), so that
  /// overrides of `successHandler`, `failureHandler` and `callbackQueue` count, as in the old kit.
  private func handlerCall(for outcome: ErasedOutcome) -> HandlerCall {
    let queue = callbackQueue
    switch outcome {
    case .success(let value):
      guard let handler = successHandler else { return HandlerCall(call: nil, queue: queue) }
      let result = value as! ResultType
      return HandlerCall(call: { handler(result) }, queue: queue)
    case .failure(let error):
      guard let handler = failureHandler else { return HandlerCall(call: nil, queue: queue) }
      let typed = error as! ErrorType
      return HandlerCall(call: { handler(typed) }, queue: queue)
    case .cancelled:
      return HandlerCall(call: nil, queue: queue)
    }
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
    /// Set by `addDependency(_:)`: the `deinit` has dependencies to leave (see `AsyncOperation`).
    var dependent = false
  }

  private let state = Mutex(State())

  /// Creates an operation for a subclass that overrides `main()`.
  public override init() {
    super.init()
  }

  deinit {
    #if !canImport(Darwin)
      // Foundation on Linux keeps dependents unretained: leave the books of unfinished
      // dependencies (see `OperationCore.detachFromDependencies`).
      if state.withLock({ $0.dependent }) {
        for dependency in dependencies { removeDependency(dependency) }
      }
    #endif
  }

  /// Called on `callbackQueue` with the value of ``finish(withResult:)``, before `finish`
  /// returns; never after `cancel()`. Read through `self` by `finish`, so a subclass may override
  /// it.
  open var successHandler: (@Sendable (ResultType) -> Void)? {
    get { state.withLock { $0.successHandler } }
    set { state.withLock { $0.successHandler = newValue } }
  }

  /// Called on `callbackQueue` with the error of ``finish(withError:)``, before `finish` returns;
  /// never after `cancel()`. Read through `self` by `finish`.
  open var failureHandler: (@Sendable (ErrorType) -> Void)? {
    get { state.withLock { $0.failureHandler } }
    set { state.withLock { $0.failureHandler = newValue } }
  }

  /// Where the handlers run: the main queue on Apple platforms; elsewhere one shared serial
  /// queue, because the main queue does not run in Linux tools and test runners. Read through
  /// `self` by `finish`, so a subclass may override it.
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

  /// Makes this operation wait for `operation`, as `Operation.addDependency(_:)` does (on Linux
  /// it also takes itself off the books of unfinished dependencies when it is freed).
  /// Subclasses that override it must call `super`.
  ///
  /// - Parameter operation: The operation that must finish first.
  open override func addDependency(_ operation: Foundation.Operation) {
    state.withLock { $0.dependent = true }
    super.addDependency(operation)
  }

  /// Runs `successHandler` with `result` on `callbackQueue` and returns when it has. Ignored
  /// after the first finish or a `cancel()`.
  ///
  /// - Parameter result: The operation's value.
  public final func finish(withResult result: ResultType) {
    guard decide() else { return }
    // Read through `self`, outside the lock: a subclass may override them.
    let (handler, queue) = (successHandler, callbackQueue)
    releaseHandlers()
    if let handler { CallbackQueueMark.run(on: queue) { handler(result) } }
  }

  /// Runs `failureHandler` with `error` on `callbackQueue` and returns when it has. Ignored after
  /// the first finish or a `cancel()`.
  ///
  /// - Parameter error: The operation's error.
  public final func finish(withError error: ErrorType) {
    guard decide() else { return }
    let (handler, queue) = (failureHandler, callbackQueue)
    releaseHandlers()
    if let handler { CallbackQueueMark.run(on: queue) { handler(error) } }
  }

  /// Decides the outcome; false if it was decided already.
  private func decide() -> Bool {
    state.withLock { state in
      if state.decided { return false }
      state.decided = true
      return true
    }
  }

  /// Drops the stored handlers once the outcome is decided (they may hold the operation).
  private func releaseHandlers() {
    state.withLock { state in
      state.successHandler = nil
      state.failureHandler = nil
    }
  }
}

/// Tells whether the calling thread runs a given queue, so that ``SyncOperation`` can run a
/// handler on its own queue inline (the old kit's "safe sync") instead of deadlocking.
///
/// Each queue gets a number of its own, once, as a queue-specific value. The number belongs to
/// the queue, not to the `DispatchQueue` object naming it: on Linux every read of
/// `DispatchQueue.main` gives a new object for the same queue, so neither `===` nor an
/// `ObjectIdentifier` can recognise it, and marking the queue with the identity of whichever
/// object was used last let two operations overwrite each other's mark.
enum CallbackQueueMark {
  private static let key = DispatchSpecificKey<UInt64>()
  /// The last number given; the lock also makes marking a queue happen once.
  private static let lastMark = Mutex<UInt64>(0)

  /// The number of `queue`, given now if it has none.
  static func mark(of queue: DispatchQueue) -> UInt64 {
    if let mark = queue.getSpecific(key: key) { return mark }
    return lastMark.withLock { last in
      if let mark = queue.getSpecific(key: key) { return mark }
      last += 1
      queue.setSpecific(key: key, value: last)
      return last
    }
  }

  /// Whether the calling thread runs `queue`, or a queue that targets it. The main thread counts
  /// as running the main queue, also outside any block (where a synchronous wait for the main
  /// queue would never return).
  static func isCurrent(_ queue: DispatchQueue) -> Bool {
    let mark = mark(of: queue)
    if Thread.isMainThread && mark == self.mark(of: .main) { return true }
    return DispatchQueue.getSpecific(key: key) == mark
  }

  /// Runs `body` on `queue` and waits: inline when the calling thread already runs `queue`.
  static func run(on queue: DispatchQueue, _ body: () -> Void) {
    if isCurrent(queue) {
      body()
    } else {
      queue.sync(execute: body)
    }
  }
}
