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
  private static let dependent: UInt8 = 1 << 6

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

  /// Whether `start()` was called.
  var isStarted: Bool { current & Self.started != 0 }

  /// Whether `addDependency(_:)` was ever called (see ``OperationCore/detachFromDependencies(_:)``).
  var hasDependencies: Bool { current & Self.dependent != 0 }

  /// Records that the operation was given a dependency.
  func markDependent() {
    bits.bitwiseOr(Self.dependent, ordering: .acquiringAndReleasing)
  }

  /// Claims the one start.
  func claimStart() -> StartAction {
    let old = bits.bitwiseOr(Self.started, ordering: .acquiringAndReleasing).oldValue
    if old & Self.started != 0 { return .ignore }
    return old & Self.decided != 0 ? .finishWithoutRunning : .run
  }

  /// Claims the one outcome; nil if it was already decided, else whether the operation had
  /// started (a started asynchronous operation then publishes `isFinished`).
  ///
  /// Before the start, called only with the state lock held, together with holding (or
  /// recording) the outcome, so that whoever sees the outcome claimed and then takes the lock
  /// finds it held or recorded.
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
    /// The operation's `finishesAfterHandlers`, for an owner that gives the handler itself.
    var finishesAfterHandlers = false
    /// Whether the owner still has to give the handler and queue (see
    /// ``OperationStateMachine/handlersFromOwner``): a success or failure of such an owner.
    var needsOwnerHandlers = false
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
  /// Whether the owner reads the handler and the queue through its own (overridable) properties
  /// when the outcome is decided, outside the lock, rather than the ones stored here: the
  /// drop-in classes of ConveyorOperationKit, whose subclasses may override them.
  var handlersFromOwner = false
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
      if !handlersFromOwner, let handler = successHandler { deliver = { handler(value) } }
    case .failure(let error):
      if !handlersFromOwner, let handler = failureHandler { deliver = { handler(error) } }
    case .cancelled:
      cancelled = true
    }
    var completion = Completion(
      outcome: newOutcome, waiters: waiters, deliver: deliver, callbackQueue: callbackQueue,
      task: cancelled ? task : nil, finishesAfterDelivery: deliver != nil && finishesAfterHandlers)
    finishDeferred = completion.finishesAfterDelivery
    waiters = []
    task = nil
    if handlersFromOwner && !cancelled {
      // The owner's getters read these; ``ownerGaveHandlers(finishesAfterDelivery:)`` drops them.
      completion.finishesAfterHandlers = finishesAfterHandlers
      completion.needsOwnerHandlers = true
    } else {
      successHandler = nil
      failureHandler = nil
    }
    return completion
  }

  /// Called once the owner gave the handler of a completion that needed it: drops the stored
  /// handlers (they may hold the operation) and notes whether the finish waits for the handler.
  ///
  /// - Parameter finishesAfterDelivery: Whether the operation finishes after the handler.
  mutating func ownerGaveHandlers(finishesAfterDelivery: Bool) {
    successHandler = nil
    failureHandler = nil
    finishDeferred = finishesAfterDelivery
  }

  /// Keeps `newOutcome`, decided before the start, until ``markStarted()``. The caller claimed
  /// the outcome while holding the lock, and `start()` marks the start only after seeing that
  /// claim, so the start has not come yet.
  ///
  /// - Parameter newOutcome: The success or failure given to `finish`.
  mutating func hold(_ newOutcome: ErasedOutcome) {
    precondition(outcome == nil && early == nil && !started, "an outcome held twice")
    early = newOutcome
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

/// The handler an owner that reads its handlers through overridable properties gives for an
/// outcome (see ``OperationCore/handlersFromOwner``), and the queue to run it on.
package struct HandlerCall: Sendable {
  /// Calls the handler with the value or error; nil when there is no handler.
  package var call: (@Sendable () -> Void)?
  /// The queue `call` runs on.
  package var queue: DispatchQueue

  /// Creates a handler call.
  ///
  /// - Parameters:
  ///   - call: Calls the handler; nil when there is none.
  ///   - queue: Where it runs.
  package init(call: (@Sendable () -> Void)?, queue: DispatchQueue) {
    self.call = call
    self.queue = queue
  }
}

/// The machinery of one operation that produces an outcome once, whatever its class: the control
/// word, the locked state, and the steps `start()`, `cancel()` and finishing take, with the KVO
/// notifications `OperationQueue` needs (on Linux too).
///
/// ``TypedOperation`` keeps one, and so do the drop-in classes of ConveyorOperationKit, which are
/// `Foundation.Operation` subclasses of their own so that they show their users no more members
/// than the old classes had. Not generic: see ``ErasedOutcome``.
///
/// A claim of the outcome that may come before the start (`cancel()`, and `finish` on an
/// operation not started yet) is made while holding the state lock, in the same critical section
/// that records or holds the outcome. So a `cancel()` or a `start()` that sees the outcome
/// claimed, and then takes the lock, always finds it recorded or held, and `isFinished` is never
/// published before the outcome is recorded.
package struct OperationCore: ~Copyable, Sendable {
  /// What an owner that reads its handlers itself gives for an outcome: see
  /// ``handlersFromOwner``.
  package typealias HandlerSource = (ErasedOutcome) -> HandlerCall

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

  /// Whether the owner gives the handler and queue for each success or failure, read through its
  /// own properties when the outcome is decided (outside the lock), instead of the stored
  /// ``successHandler``, ``failureHandler`` and ``callbackQueue``: a subclass may override those
  /// properties. Such an owner passes a ``HandlerSource`` to ``start(_:finishesWhenDecided:handlers:main:)``
  /// and ``complete(_:_:finishesWhenDecided:handlers:)``.
  package var handlersFromOwner: Bool {
    get { state.withLock { $0.handlersFromOwner } }
    nonmutating set { state.withLock { $0.handlersFromOwner = newValue } }
  }

  // MARK: Steps

  /// The body of `start()`: runs `main` once; an operation cancelled before starting finishes
  /// without running it, and one given an outcome early delivers it now.
  ///
  /// - Parameters:
  ///   - operation: The operation whose KVO notifications are posted.
  ///   - finishesWhenDecided: True for an asynchronous operation (finished by its outcome), false
  ///     for a synchronous one (finished when `main` returns).
  ///   - handlers: For an owner with ``handlersFromOwner``: the handler for an outcome.
  ///   - main: The operation's `main()`.
  /// - Returns: A handler to run before `isFinished` is published, which the caller hands to
  ///   ``finishAfterHandler(_:publish:)``; nil when nothing is left to do.
  package func start(
    _ operation: Operation, finishesWhenDecided: Bool, handlers: HandlerSource? = nil, main: () -> Void
  ) -> DeferredFinish? {
    switch control.claimStart() {
    case .ignore:
      return nil
    case .finishWithoutRunning:
      // A value `finish` gave before the start is delivered now, after the dependencies. The
      // outcome was claimed and recorded (or held) under the lock before this start saw it.
      var completion = state.withLock { $0.markStarted() }
      if let held = completion, held.needsOwnerHandlers { completion = withOwnerHandlers(held, handlers) }
      return finish(operation, delivering: completion, wasExecuting: false)
    case .run:
      OperationDriver.publishExecuting(operation, control)
      if !control.isDecided { main() }
      // An asynchronous operation is finished by whoever decides its outcome (also one decided
      // between the claim above and here). A synchronous one is finished here when `main`
      // returns, unless it finishes after its handler, on the handler's queue.
      if !finishesWhenDecided && !state.withLock({ $0.finishDeferred }) {
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
  ///   - finishesWhenDecided: As for ``start(_:finishesWhenDecided:handlers:main:)``.
  ///   - superCancel: Calls `super.cancel()` of the operation's class.
  package func cancel(_ operation: Operation, finishesWhenDecided: Bool, superCancel: () -> Void) {
    let decision = state.withLock {
      state -> (completion: OperationStateMachine.Completion, publishes: Bool)? in
      if let started = control.claimOutcome(cancelling: true) {
        guard let completion = state.complete(.cancelled) else { return nil }
        return (completion, started && finishesWhenDecided)
      }
      // Decided by an early `finish` and not delivered yet: the cancellation replaces it.
      guard let completion = state.cancelEarly() else { return nil }
      control.markCancelled()
      return (completion, false)
    }
    guard let decision else { return }
    // `Operation.cancel()` lets a queue start the operation without waiting for dependencies.
    superCancel()
    if decision.publishes {
      OperationDriver.publishFinished(operation, control, wasExecuting: true)
    }
    OperationDriver.deliver(decision.completion)
  }

  /// Records `outcome` unless the outcome was already decided, then finishes (if the operation
  /// finishes when decided), calls the handler and resumes waiters. On an operation not started
  /// yet the outcome is held until the start.
  ///
  /// - Parameters:
  ///   - operation: The operation whose KVO notifications are posted.
  ///   - outcome: A success or a failure.
  ///   - finishesWhenDecided: As for ``start(_:finishesWhenDecided:handlers:main:)``.
  ///   - handlers: As for ``start(_:finishesWhenDecided:handlers:main:)``.
  /// - Returns: As for ``start(_:finishesWhenDecided:handlers:main:)``.
  package func complete(
    _ operation: Operation, _ outcome: ErasedOutcome, finishesWhenDecided: Bool,
    handlers: HandlerSource? = nil
  ) -> DeferredFinish? {
    let completion: OperationStateMachine.Completion?
    if control.isStarted {
      // Started: nobody holds an outcome any more, so the claim needs no lock.
      guard control.claimOutcome(cancelling: false) != nil else { return nil }
      completion = state.withLock { $0.complete(outcome) }
    } else {
      completion = completeBeforeStart(outcome)
      guard case .some = completion else { return nil }
    }
    if completion?.needsOwnerHandlers == true {
      return settle(
        operation, withOwnerHandlers(completion!, handlers), finishesWhenDecided: finishesWhenDecided)
    }
    return settle(operation, consume completion, finishesWhenDecided: finishesWhenDecided)
  }

  /// `finish` on an operation that had not started when it was called: claims the outcome and
  /// holds it until the start, both under the lock, so that a `cancel()` or a `start()` that sees
  /// the claim finds the outcome held. Returns the completion only when the start came in between
  /// (the outcome is then recorded as usual); nil when held or already decided.
  private func completeBeforeStart(_ outcome: ErasedOutcome) -> OperationStateMachine.Completion? {
    state.withLock { state -> OperationStateMachine.Completion? in
      guard let started = control.claimOutcome(cancelling: false) else { return nil }
      guard started else {
        // Queued behind dependencies: held until the start, which then finishes the operation
        // without running `main()`.
        state.hold(outcome)
        return nil
      }
      return state.complete(outcome)
    }
  }

  /// The end of ``complete(_:_:finishesWhenDecided:handlers:)``: nothing for an outcome held or
  /// ignored (nil), else finishing and delivering.
  ///
  /// The completion is consumed, here and in ``finish(_:delivering:wasExecuting:)``, not copied:
  /// its outcome boxes a value of any type, which only that type's own code can copy.
  private func settle(
    _ operation: Operation, _ completion: consuming OperationStateMachine.Completion?,
    finishesWhenDecided: Bool
  ) -> DeferredFinish? {
    switch consume completion {
    case .none:
      return nil
    case .some(let completion):
      if completion.finishesAfterDelivery {
        return DeferredFinish(completion: completion, wasExecuting: true)
      }
      // A synchronous operation is finished by `start()` when `main()` returns.
      if finishesWhenDecided {
        OperationDriver.publishFinished(operation, control, wasExecuting: true)
      }
      OperationDriver.deliver(completion)
      return nil
    }
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
  ///   - deferred: What ``start(_:finishesWhenDecided:handlers:main:)`` or
  ///     ``complete(_:_:finishesWhenDecided:handlers:)`` returned.
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

  // MARK: Dependencies

  /// Called by the owner's `addDependency(_:)`: notes that ``detachFromDependencies(_:)`` has
  /// work to do.
  package func noteDependency() {
    control.markDependent()
  }

  /// Called by the owner's `deinit`: takes the operation off the books of its dependencies.
  ///
  /// swift-corelibs-foundation keeps an operation's dependents unretained and reads them when it
  /// finishes. An operation freed before one of its dependencies finished (one cancelled while it
  /// waited: its queue finishes it at once, then lets it go) left a dangling pointer there, and
  /// the dependency's finish crashed the process (signal 11 in `Operation.observeValue`).
  /// `removeDependency(_:)` removes that pointer. Apple's Foundation needs nothing.
  ///
  /// - Parameter operation: The owner, in its `deinit`.
  package func detachFromDependencies(_ operation: Operation) {
    #if !canImport(Darwin)
      guard control.hasDependencies else { return }
      for dependency in operation.dependencies { operation.removeDependency(dependency) }
    #endif
  }

  /// `completion` with the handler and queue an owner with ``handlersFromOwner`` gives, asked
  /// outside the lock.
  private func withOwnerHandlers(
    _ completion: consuming OperationStateMachine.Completion, _ handlers: HandlerSource?
  ) -> OperationStateMachine.Completion {
    let handler = handlers?(completion.outcome) ?? HandlerCall(call: nil, queue: completion.callbackQueue)
    completion.deliver = handler.call
    completion.callbackQueue = handler.queue
    completion.finishesAfterDelivery = handler.call != nil && completion.finishesAfterHandlers
    completion.needsOwnerHandlers = false
    let finishesAfterDelivery = completion.finishesAfterDelivery
    state.withLock { $0.ownerGaveHandlers(finishesAfterDelivery: finishesAfterDelivery) }
    return completion
  }

  /// Publishes `isFinished` and delivers `completion`, or, when the operation finishes after its
  /// handlers, returns what the owner must run to do both in that order.
  private func finish(
    _ operation: Operation, delivering completion: consuming OperationStateMachine.Completion?,
    wasExecuting: Bool
  ) -> DeferredFinish? {
    switch consume completion {
    case .some(let completion) where completion.finishesAfterDelivery:
      return DeferredFinish(completion: completion, wasExecuting: wasExecuting)
    case .some(let completion):
      OperationDriver.publishFinished(operation, control, wasExecuting: wasExecuting)
      OperationDriver.deliver(completion)
      return nil
    case .none:
      OperationDriver.publishFinished(operation, control, wasExecuting: wasExecuting)
      return nil
    }
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
