import Dispatch
import Foundation
import Synchronization

#if canImport(Darwin)
  /// The queue handlers run on unless an operation is given another: `DispatchQueue.main` on Apple.
  package let defaultOperationCallbackQueue = DispatchQueue.main
#else
  /// The queue handlers run on unless an operation is given another. On Linux
  /// `DispatchQueue.main` only runs when something drains it (`dispatchMain()` or a run loop),
  /// which command-line tools and test runners do not, so handlers go to one shared serial queue.
  package let defaultOperationCallbackQueue = DispatchQueue(label: "conveyor.callbacks")
#endif

/// The control word of one typed operation: which of start, outcome and `isFinished` were
/// claimed, and what `isExecuting` / `isFinished` report.
///
/// One atomic byte, not generic, so the hot path (`OperationQueue` reads `isExecuting` and
/// `isFinished` several times per operation) needs no lock and no generic metadata. Every
/// transition is one read-modify-write of the same word, so they are totally ordered: of a
/// racing `start()` and `cancel()`, the later one always sees the earlier.
struct OperationControl: ~Copyable {
  /// What `start()` must do next.
  enum StartAction: Equatable {
    /// Already started: do nothing (an operation never runs twice).
    case ignore
    /// Its outcome was decided (cancelled) before it started: post `isFinished` without running
    /// `main()`.
    case finishWithoutRunning
    /// Post `isExecuting` and run `main()`.
    case run
  }

  private static let started: UInt8 = 1 << 0
  private static let decided: UInt8 = 1 << 1
  private static let cancelled: UInt8 = 1 << 2
  private static let finishClaimed: UInt8 = 1 << 3
  private static let executing: UInt8 = 1 << 4
  private static let finished: UInt8 = 1 << 5

  private let bits = Atomic<UInt8>(0)

  private var current: UInt8 { bits.load(ordering: .acquiring) }

  /// What `isExecuting` reports: `.executing` was published and `.finished` was not.
  var isExecuting: Bool { current & (Self.executing | Self.finished) == Self.executing }

  /// What `isFinished` reports.
  var isFinished: Bool { current & Self.finished != 0 }

  /// Whether `cancel()` decided the outcome.
  var isCancelled: Bool { current & Self.cancelled != 0 }

  /// Whether the outcome was decided (finished, failed or cancelled).
  var isDecided: Bool { current & Self.decided != 0 }

  /// Claims the one start.
  func claimStart() -> StartAction {
    let old = bits.bitwiseOr(Self.started, ordering: .acquiringAndReleasing).oldValue
    if old & Self.started != 0 { return .ignore }
    return old & Self.decided != 0 ? .finishWithoutRunning : .run
  }

  /// Claims the one outcome; nil if it was already decided, else whether the operation had
  /// started (a started asynchronous operation then publishes `isFinished`).
  ///
  /// - Parameter cancelling: Whether the outcome is a cancellation.
  func claimOutcome(cancelling: Bool) -> Bool? {
    let claim = Self.decided | (cancelling ? Self.cancelled : 0)
    var old = current
    while old & Self.decided == 0 {
      let (exchanged, original) = bits.compareExchange(
        expected: old, desired: old | claim, ordering: .acquiringAndReleasing)
      if exchanged { return old & Self.started != 0 }
      old = original
    }
    return nil
  }

  /// Claims the one `isFinished` notification; false if another thread already claimed it.
  func claimFinish() -> Bool {
    bits.bitwiseOr(Self.finishClaimed, ordering: .acquiringAndReleasing).oldValue
      & Self.finishClaimed == 0
  }

  /// Marks the outcome a cancellation, for a `cancel()` that replaced an outcome decided before
  /// the start and not delivered (see `OperationStateMachine.cancelEarly()`).
  func markCancelled() {
    bits.bitwiseOr(Self.cancelled, ordering: .acquiringAndReleasing)
  }

  /// Makes `isExecuting` true (unless already finished).
  func publishExecuting() {
    bits.bitwiseOr(Self.executing, ordering: .acquiringAndReleasing)
  }

  /// Makes `isFinished` true and `isExecuting` false, for good.
  func publishFinished() {
    bits.bitwiseOr(Self.finished, ordering: .acquiringAndReleasing)
  }
}

/// An operation's outcome with its value's type erased: a success (its value boxed), a failure
/// (its error boxed), or a cancellation.
///
/// Erased so that the code every operation runs (finishing, delivering, waking waiters) is not
/// generic: a generic class's methods are not specialised for the caller's types across modules,
/// and each generic type they touch (`Result<Success, OperationError<Failure>>`, an optional of
/// it, a struct holding it) is a runtime metadata lookup, several per operation. The typed
/// accessors (`result`, `value`, the handlers) cast back, once per read.
package enum ErasedOutcome: Sendable {
  case success(any Sendable)
  case failure(any Error)
  case cancelled

  /// Whether this is a cancellation.
  var isCancelled: Bool {
    if case .cancelled = self { true } else { false }
  }

  /// The typed result: nil for a cancellation.
  ///
  /// - Parameters:
  ///   - success: The type the value was boxed from.
  ///   - failure: The type the error was boxed from.
  package func result<Success, Failure: Error>(
    _ success: Success.Type, _ failure: Failure.Type
  ) -> Result<Success, Failure>? {
    switch self {
    case .success(let value): .success(value as! Success)
    case .failure(let error): .failure(error as! Failure)
    case .cancelled: nil
    }
  }
}

/// Converts handlers between their typed form (the public properties) and the erased form an
/// ``OperationCore`` keeps. Reading a handler back gives a closure that calls the one set.
package enum ErasedHandlers {
  /// `handler` taking its value boxed.
  package static func erased<Success: Sendable>(
    _ handler: (@Sendable (Success) -> Void)?
  ) -> (@Sendable (any Sendable) -> Void)? {
    guard let handler else { return nil }
    return { @Sendable (value: any Sendable) in handler(value as! Success) }
  }

  /// `handler` taking its error boxed.
  package static func erased<Failure: Error>(
    _ handler: (@Sendable (Failure) -> Void)?
  ) -> (@Sendable (any Error) -> Void)? {
    guard let handler else { return nil }
    return { @Sendable (error: any Error) in handler(error as! Failure) }
  }

  /// A typed closure calling `handler`.
  package static func typed<Success: Sendable>(
    _ handler: (@Sendable (any Sendable) -> Void)?
  ) -> (@Sendable (Success) -> Void)? {
    guard let handler else { return nil }
    return { @Sendable (value: Success) in handler(value) }
  }

  /// A typed closure calling `handler`.
  package static func typed<Failure: Error>(
    _ handler: (@Sendable (any Error) -> Void)?
  ) -> (@Sendable (Failure) -> Void)? {
    guard let handler else { return nil }
    return { @Sendable (error: Failure) in handler(error) }
  }
}

/// The state of one operation, kept inside a `Mutex`: outcome, waiters, handlers and the task
/// running the work. Not generic (see ``ErasedOutcome``).
///
/// Each mutating method returns what the caller must do outside the lock (resume waiters, call
/// handlers, cancel the task). Nothing here calls out.
struct OperationStateMachine {
  typealias Waiter = CheckedContinuation<ErasedOutcome, Never>

  /// What the caller must do after the outcome was decided.
  struct Completion {
    var outcome: ErasedOutcome
    var waiters: [Waiter]
    var deliver: (@Sendable () -> Void)?
    var callbackQueue: DispatchQueue
    var task: Task<Void, Never>?
    /// Whether the operation becomes `isFinished` only after `deliver` ran (there is a handler
    /// and ``OperationStateMachine/finishesAfterHandlers`` is set).
    var finishesAfterDelivery = false
  }

  private(set) var outcome: ErasedOutcome?
  /// An outcome given by `finish` before the start, kept until the start delivers it: a queued
  /// operation's value is not seen before its dependencies finished.
  private var early: ErasedOutcome?
  /// Whether `start()` found the outcome decided and came to deliver it (see `markStarted()`).
  private var started = false
  private var waiters: [Waiter] = []
  private var task: Task<Void, Never>?
  /// Called with the boxed value; the typed setter wraps the user's handler.
  var successHandler: (@Sendable (any Sendable) -> Void)?
  /// Called with the boxed error; the typed setter wraps the user's handler.
  var failureHandler: (@Sendable (any Error) -> Void)?
  var callbackQueue = defaultOperationCallbackQueue
  /// The public `finishesAfterHandlers`.
  var finishesAfterHandlers = false
  /// Set when a completion that finishes after its handler was handed out, so that a
  /// `SyncOperation`'s `start()` leaves the finishing to the handler's queue.
  private(set) var finishDeferred = false

  /// Records the outcome once (the caller claimed it in `OperationControl`); nil if it was
  /// already recorded.
  ///
  /// - Parameter newOutcome: The success, failure or cancellation.
  mutating func complete(_ newOutcome: ErasedOutcome) -> Completion? {
    if outcome != nil { return nil }
    outcome = newOutcome
    var deliver: (@Sendable () -> Void)?
    var cancelled = false
    switch newOutcome {
    case .success(let value):
      if let handler = successHandler { deliver = { handler(value) } }
    case .failure(let error):
      if let handler = failureHandler { deliver = { handler(error) } }
    case .cancelled:
      cancelled = true
    }
    let completion = Completion(
      outcome: newOutcome, waiters: waiters, deliver: deliver, callbackQueue: callbackQueue,
      task: cancelled ? task : nil, finishesAfterDelivery: deliver != nil && finishesAfterHandlers)
    finishDeferred = completion.finishesAfterDelivery
    waiters = []
    task = nil
    successHandler = nil
    failureHandler = nil
    return completion
  }

  /// Keeps `newOutcome`, decided before the start, until ``markStarted()``; if the start already
  /// came, records it now.
  ///
  /// - Parameter newOutcome: The success or failure given to `finish`.
  mutating func hold(_ newOutcome: ErasedOutcome) -> Completion? {
    if started { return complete(newOutcome) }
    if outcome == nil, early == nil { early = newOutcome }
    return nil
  }

  /// Called by a start that found the outcome decided: records the held outcome, if any.
  mutating func markStarted() -> Completion? {
    started = true
    guard let held = early else { return nil }
    early = nil
    return complete(held)
  }

  /// Replaces a held outcome with a cancellation, if the start has not delivered it yet: the
  /// operation never ran and nobody saw the value, so a `cancel()` still cancels it.
  mutating func cancelEarly() -> Completion? {
    guard !started, early != nil else { return nil }
    early = nil
    return complete(.cancelled)
  }

  /// Keeps the task running the work so `cancel()` can cancel it; false if already decided.
  mutating func attach(_ newTask: Task<Void, Never>) -> Bool {
    if outcome != nil { return false }
    task = newTask
    return true
  }

  /// Returns the outcome if decided, else keeps `waiter` to resume later.
  mutating func outcome(orEnqueue waiter: Waiter) -> ErasedOutcome? {
    if let outcome { return outcome }
    waiters.append(waiter)
    return nil
  }
}

/// The machinery of one operation that produces an outcome once, whatever its class: the control
/// word, the locked state, and the steps `start()`, `cancel()` and finishing take, with the KVO
/// notifications `OperationQueue` needs (on Linux too).
///
/// ``TypedOperation`` keeps one, and so do the drop-in classes of ConveyorOperationKit, which are
/// `Foundation.Operation` subclasses of their own so that they show their users no more members
/// than the old classes had. Not generic: see ``ErasedOutcome``.
package struct OperationCore: ~Copyable, Sendable {
  private let control = OperationControl()
  private let state = Mutex(OperationStateMachine())

  /// Creates the machinery of an operation not started yet.
  package init() {}

  // MARK: Reading

  /// What `isExecuting` reports.
  package var isExecuting: Bool { control.isExecuting }

  /// What `isFinished` reports.
  package var isFinished: Bool { control.isFinished }

  /// Whether `cancel()` decided the outcome (a late cancel does not count).
  package var isCancelled: Bool { control.isCancelled }

  /// The outcome, if decided.
  package var outcome: ErasedOutcome? { state.withLock { $0.outcome } }

  /// The outcome, waiting for it if it is not decided yet.
  package func awaitOutcome() async -> ErasedOutcome {
    if let outcome = state.withLock({ $0.outcome }) { return outcome }
    return await withCheckedContinuation { waiter in
      if let outcome = state.withLock({ $0.outcome(orEnqueue: waiter) }) {
        waiter.resume(returning: outcome)
      }
    }
  }

  // MARK: Settings

  /// The handler called with the value; read once, when the outcome is decided.
  package var successHandler: (@Sendable (any Sendable) -> Void)? {
    get { state.withLock { $0.successHandler } }
    nonmutating set { state.withLock { $0.successHandler = newValue } }
  }

  /// The handler called with the error; read once, when the outcome is decided.
  package var failureHandler: (@Sendable (any Error) -> Void)? {
    get { state.withLock { $0.failureHandler } }
    nonmutating set { state.withLock { $0.failureHandler = newValue } }
  }

  /// Where the handlers run.
  package var callbackQueue: DispatchQueue {
    get { state.withLock { $0.callbackQueue } }
    nonmutating set { state.withLock { $0.callbackQueue = newValue } }
  }

  /// Whether a started operation becomes `isFinished` only after its handler returned.
  package var finishesAfterHandlers: Bool {
    get { state.withLock { $0.finishesAfterHandlers } }
    nonmutating set { state.withLock { $0.finishesAfterHandlers = newValue } }
  }

  // MARK: Steps

  /// The body of `start()`: runs `main` once; an operation cancelled before starting finishes
  /// without running it, and one given an outcome early delivers it now.
  ///
  /// - Parameters:
  ///   - operation: The operation whose KVO notifications are posted.
  ///   - finishesWhenDecided: True for an asynchronous operation (finished by its outcome), false
  ///     for a synchronous one (finished when `main` returns).
  ///   - main: The operation's `main()`.
  /// - Returns: A handler to run before `isFinished` is published, which the caller hands to
  ///   ``finishAfterHandler(_:publish:)``; nil when nothing is left to do.
  package func start(_ operation: Operation, finishesWhenDecided: Bool, main: () -> Void) -> DeferredFinish? {
    switch control.claimStart() {
    case .ignore:
      return nil
    case .finishWithoutRunning:
      // A value `finish` gave before the start is delivered now, after the dependencies.
      let completion = state.withLock { $0.markStarted() }
      return finish(operation, delivering: completion, wasExecuting: false)
    case .run:
      OperationDriver.publishExecuting(operation, control)
      let runs = !control.isDecided
      if runs { main() }
      // A synchronous operation finishing after its handler is finished by the handler's queue.
      if !runs || (!finishesWhenDecided && !state.withLock({ $0.finishDeferred })) {
        OperationDriver.publishFinished(operation, control, wasExecuting: true)
      }
      return nil
    }
  }

  /// The body of `cancel()`: decides the outcome as a cancellation unless it was decided, calls
  /// `superCancel` (`Operation.cancel()`) if so, and finishes a started asynchronous operation.
  ///
  /// - Parameters:
  ///   - operation: The operation whose KVO notifications are posted.
  ///   - finishesWhenDecided: As for ``start(_:finishesWhenDecided:main:)``.
  ///   - superCancel: Calls `super.cancel()` of the operation's class.
  package func cancel(_ operation: Operation, finishesWhenDecided: Bool, superCancel: () -> Void) {
    guard let started = control.claimOutcome(cancelling: true) else {
      // Decided by an early `finish` and not delivered yet: the cancellation replaces it, and
      // `Operation.cancel()` lets a queue drop the operation without waiting for dependencies.
      guard let completion = state.withLock({ $0.cancelEarly() }) else { return }
      control.markCancelled()
      superCancel()
      OperationDriver.deliver(completion)
      return
    }
    let completion = state.withLock { $0.complete(.cancelled) }
    superCancel()
    if started && finishesWhenDecided {
      OperationDriver.publishFinished(operation, control, wasExecuting: true)
    }
    if let completion { OperationDriver.deliver(completion) }
  }

  /// Records `outcome` unless the outcome was already decided, then finishes (if the operation
  /// finishes when decided), calls the handler and resumes waiters.
  ///
  /// - Parameters:
  ///   - operation: The operation whose KVO notifications are posted.
  ///   - outcome: A success or a failure.
  ///   - finishesWhenDecided: As for ``start(_:finishesWhenDecided:main:)``.
  /// - Returns: As for ``start(_:finishesWhenDecided:main:)``.
  package func complete(
    _ operation: Operation, _ outcome: ErasedOutcome, finishesWhenDecided: Bool
  ) -> DeferredFinish? {
    guard let started = control.claimOutcome(cancelling: false) else { return nil }
    if !started {
      // `finish` on an operation not started yet (queued behind dependencies): held until the
      // start, which then finishes it without running `main()`.
      if let completion = state.withLock({ $0.hold(outcome) }) { OperationDriver.deliver(completion) }
      return nil
    }
    let completion = state.withLock { $0.complete(outcome) }
    if finishesWhenDecided || completion?.finishesAfterDelivery == true {
      // A synchronous operation that does not finish after its handler is finished by `start()`.
      return finish(operation, delivering: completion, wasExecuting: true)
    }
    if let completion { OperationDriver.deliver(completion) }
    return nil
  }

  /// Keeps the task running the work so `cancel()` can cancel it; false if already decided (the
  /// caller then cancels the task itself).
  package func attach(_ task: Task<Void, Never>) -> Bool {
    state.withLock { $0.attach(task) }
  }

  /// Runs the handler of `deferred` on its queue, then `publish`, which calls
  /// ``publishFinished(_:wasExecuting:)`` on the operation's core.
  ///
  /// A step of its own because the closure that publishes must hold the operation, which owns
  /// this core: the owner builds it from `self`.
  ///
  /// - Parameters:
  ///   - deferred: What ``start(_:finishesWhenDecided:main:)`` or
  ///     ``complete(_:_:finishesWhenDecided:)`` returned.
  ///   - publish: Publishes `isFinished`.
  package static func finishAfterHandler(
    _ deferred: DeferredFinish, publish: @escaping @Sendable () -> Void
  ) {
    OperationDriver.deliver(deferred.completion, then: publish)
  }

  /// Posts `isFinished` (and `isExecuting` if `wasExecuting`) once.
  ///
  /// - Parameters:
  ///   - operation: The operation whose KVO notifications are posted.
  ///   - wasExecuting: Whether the operation had published `isExecuting`.
  package func publishFinished(_ operation: Operation, wasExecuting: Bool) {
    OperationDriver.publishFinished(operation, control, wasExecuting: wasExecuting)
  }

  /// Publishes `isFinished` and delivers `completion`, or, when the operation finishes after its
  /// handlers, returns what the owner must run to do both in that order.
  private func finish(
    _ operation: Operation, delivering completion: OperationStateMachine.Completion?, wasExecuting: Bool
  ) -> DeferredFinish? {
    if let completion, completion.finishesAfterDelivery {
      return DeferredFinish(completion: completion, wasExecuting: wasExecuting)
    }
    OperationDriver.publishFinished(operation, control, wasExecuting: wasExecuting)
    if let completion { OperationDriver.deliver(completion) }
    return nil
  }
}

/// A handler that must run before the operation publishes `isFinished` (see
/// ``OperationCore/finishAfterHandler(_:publish:)``).
package struct DeferredFinish: Sendable {
  let completion: OperationStateMachine.Completion
  /// Whether the operation had published `isExecuting`.
  package let wasExecuting: Bool
}

/// The steps both operation classes share, run outside the state lock.
enum OperationDriver {
  /// Posts `isExecuting` around making it true.
  static func publishExecuting(_ operation: Operation, _ control: borrowing OperationControl) {
    operation.willChangeValue(forKey: "isExecuting")
    control.publishExecuting()
    operation.didChangeValue(forKey: "isExecuting")
  }

  /// Posts `isFinished` (and `isExecuting`) once, around making it true.
  static func publishFinished(
    _ operation: Operation, _ control: borrowing OperationControl, wasExecuting: Bool
  ) {
    guard control.claimFinish() else { return }
    if wasExecuting { operation.willChangeValue(forKey: "isExecuting") }
    operation.willChangeValue(forKey: "isFinished")
    control.publishFinished()
    if wasExecuting { operation.didChangeValue(forKey: "isExecuting") }
    operation.didChangeValue(forKey: "isFinished")
  }

  /// Cancels the work's task, dispatches the handler and resumes every waiter.
  ///
  /// - Parameter then: run on the callback queue right after the handler (nothing when there is
  ///   no handler: the caller finishes the operation itself then).
  static func deliver(
    _ completion: OperationStateMachine.Completion, then: (@Sendable () -> Void)? = nil
  ) {
    completion.task?.cancel()
    if let deliver = completion.deliver {
      if let then {
        completion.callbackQueue.async {
          deliver()
          then()
        }
      } else {
        completion.callbackQueue.async(execute: deliver)
      }
    }
    for waiter in completion.waiters { waiter.resume(returning: completion.outcome) }
  }
}
