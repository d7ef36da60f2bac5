import Dispatch
import Foundation
import Synchronization

#if canImport(Darwin)
  /// The queue handlers run on unless an operation is given another: `DispatchQueue.main` on Apple.
  let defaultOperationCallbackQueue = DispatchQueue.main
#else
  /// The queue handlers run on unless an operation is given another. On Linux
  /// `DispatchQueue.main` only runs when something drains it (`dispatchMain()` or a run loop),
  /// which command-line tools and test runners do not, so handlers go to one shared serial queue.
  let defaultOperationCallbackQueue = DispatchQueue(label: "conveyor.callbacks")
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

/// The typed state of one operation, kept inside a `Mutex`: outcome, waiters, handlers and the
/// task running the work. Touched once or twice per operation, never on the hot path.
///
/// Each mutating method returns what the caller must do outside the lock (resume waiters, call
/// handlers, cancel the task). Nothing here calls out.
struct OperationStateMachine<Success: Sendable, Failure: Error> {
  typealias Outcome = Result<Success, OperationError<Failure>>
  typealias Waiter = CheckedContinuation<Outcome, Never>

  /// What the caller must do after the outcome was decided.
  struct Completion {
    var outcome: Outcome
    var waiters: [Waiter]
    var deliver: (@Sendable () -> Void)?
    var callbackQueue: DispatchQueue
    var task: Task<Void, Never>?
    /// Whether the operation becomes `isFinished` only after `deliver` ran (there is a handler
    /// and ``OperationStateMachine/finishesAfterHandlers`` is set).
    var finishesAfterDelivery = false
  }

  private(set) var outcome: Outcome?
  /// An outcome given by `finish` before the start, kept until the start delivers it: a queued
  /// operation's value is not seen before its dependencies finished.
  private var early: Outcome?
  /// Whether `start()` found the outcome decided and came to deliver it (see `markStarted()`).
  private var started = false
  private var waiters: [Waiter] = []
  private var task: Task<Void, Never>?
  var successHandler: (@Sendable (Success) -> Void)?
  var failureHandler: (@Sendable (Failure) -> Void)?
  var callbackQueue = defaultOperationCallbackQueue
  /// The public `finishesAfterHandlers`.
  var finishesAfterHandlers = false
  /// Set when a completion that finishes after its handler was handed out, so that a
  /// `SyncOperation`'s `start()` leaves the finishing to the handler's queue.
  private(set) var finishDeferred = false

  /// The public `result`: nil while pending and when cancelled.
  var result: Result<Success, Failure>? {
    switch outcome {
    case .success(let value): .success(value)
    case .failure(.failed(let error)): .failure(error)
    case .failure(.cancelled), nil: nil
    }
  }

  /// Records the outcome once (the caller claimed it in `OperationControl`); nil if it was
  /// already recorded.
  ///
  /// - Parameter newOutcome: The success, failure or cancellation.
  mutating func complete(_ newOutcome: Outcome) -> Completion? {
    if outcome != nil { return nil }
    outcome = newOutcome
    var deliver: (@Sendable () -> Void)?
    var cancelled = false
    switch newOutcome {
    case .success(let value):
      if let handler = successHandler { deliver = { handler(value) } }
    case .failure(.failed(let error)):
      if let handler = failureHandler { deliver = { handler(error) } }
    case .failure(.cancelled):
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
  mutating func hold(_ newOutcome: Outcome) -> Completion? {
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
    return complete(.failure(.cancelled))
  }

  /// Keeps the task running the work so `cancel()` can cancel it; false if already decided.
  mutating func attach(_ newTask: Task<Void, Never>) -> Bool {
    if outcome != nil { return false }
    task = newTask
    return true
  }

  /// Returns the outcome if decided, else keeps `waiter` to resume later.
  mutating func outcome(orEnqueue waiter: Waiter) -> Outcome? {
    if let outcome { return outcome }
    waiters.append(waiter)
    return nil
  }
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
  static func deliver<Success, Failure>(
    _ completion: OperationStateMachine<Success, Failure>.Completion,
    then: (@Sendable () -> Void)? = nil
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

  /// Returns the outcome, waiting for it if it is not decided yet.
  static func outcome<Success, Failure>(
    _ state: borrowing Mutex<OperationStateMachine<Success, Failure>>
  ) async -> OperationStateMachine<Success, Failure>.Outcome {
    if let outcome = state.withLock({ $0.outcome }) { return outcome }
    return await withCheckedContinuation { waiter in
      if let outcome = state.withLock({ $0.outcome(orEnqueue: waiter) }) {
        waiter.resume(returning: outcome)
      }
    }
  }
}
