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

/// The state of one typed operation: a pure value the operation keeps inside a `Mutex`.
///
/// Each mutating method decides one transition and returns what the caller must do outside the
/// lock (post KVO notifications, resume waiters, call handlers). Nothing here calls out.
struct OperationStateMachine<Success: Sendable, Failure: Error> {
  typealias Outcome = Result<Success, OperationError<Failure>>
  typealias Waiter = CheckedContinuation<Outcome, Never>

  /// What `isExecuting` / `isFinished` report. It only moves forward.
  enum Phase: Int, Comparable {
    case pending
    case executing
    case finished

    static func < (lhs: Phase, rhs: Phase) -> Bool { lhs.rawValue < rhs.rawValue }
  }

  /// What `start()` must do next.
  enum StartAction {
    /// Already started: do nothing (an operation never runs twice).
    case ignore
    /// Cancelled before it started: post `isFinished` without running `main()`.
    case finishWithoutRunning
    /// Post `isExecuting` and run `main()`.
    case run
  }

  /// What the caller must do after the outcome was decided.
  struct Completion {
    var outcome: Outcome
    var waiters: [Waiter]
    var deliver: (@Sendable () -> Void)?
    var callbackQueue: DispatchQueue
    var task: Task<Void, Never>?
    var publishFinished: Bool
  }

  private(set) var phase = Phase.pending
  private(set) var started = false
  private(set) var finishClaimed = false
  private(set) var outcome: Outcome?
  private var waiters: [Waiter] = []
  private var task: Task<Void, Never>?
  var successHandler: (@Sendable (Success) -> Void)?
  var failureHandler: (@Sendable (Failure) -> Void)?
  var callbackQueue = defaultOperationCallbackQueue

  /// The public `result`: nil while pending and when cancelled.
  var result: Result<Success, Failure>? {
    switch outcome {
    case .success(let value): .success(value)
    case .failure(.failed(let error)): .failure(error)
    case .failure(.cancelled), nil: nil
    }
  }

  var isCancelled: Bool {
    if case .failure(.cancelled) = outcome { return true }
    return false
  }

  /// Claims the one start.
  mutating func start() -> StartAction {
    if started { return .ignore }
    started = true
    return outcome == nil ? .run : .finishWithoutRunning
  }

  /// Moves the published phase forward (never back).
  mutating func publish(_ newPhase: Phase) {
    phase = max(phase, newPhase)
  }

  /// Claims the one `isFinished` notification; false if another thread already claimed it.
  mutating func claimFinish() -> Bool {
    if finishClaimed { return false }
    finishClaimed = true
    return true
  }

  /// Decides the outcome once; nil if it was already decided (the call is ignored).
  ///
  /// - Parameters:
  ///   - newOutcome: The success, failure or cancellation.
  ///   - finishesNow: Whether a started operation publishes `isFinished` now (asynchronous
  ///     operations) or when `start()` returns (synchronous ones).
  mutating func complete(_ newOutcome: Outcome, finishesNow: Bool) -> Completion? {
    if outcome != nil { return nil }
    outcome = newOutcome
    var deliver: (@Sendable () -> Void)?
    switch newOutcome {
    case .success(let value):
      if let handler = successHandler { deliver = { handler(value) } }
    case .failure(.failed(let error)):
      if let handler = failureHandler { deliver = { handler(error) } }
    case .failure(.cancelled):
      break
    }
    let completion = Completion(
      outcome: newOutcome, waiters: waiters, deliver: deliver, callbackQueue: callbackQueue,
      task: isCancelled ? task : nil,
      publishFinished: finishesNow && started)
    waiters = []
    task = nil
    successHandler = nil
    failureHandler = nil
    return completion
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
  /// Posts `isExecuting` around moving the phase to `.executing`.
  static func publishExecuting<Success, Failure>(
    _ operation: Operation, _ state: borrowing Mutex<OperationStateMachine<Success, Failure>>
  ) {
    operation.willChangeValue(forKey: "isExecuting")
    state.withLock { $0.publish(.executing) }
    operation.didChangeValue(forKey: "isExecuting")
  }

  /// Posts `isFinished` (and `isExecuting`) once, around moving the phase to `.finished`.
  static func publishFinished<Success, Failure>(
    _ operation: Operation, _ state: borrowing Mutex<OperationStateMachine<Success, Failure>>,
    wasExecuting: Bool
  ) {
    guard state.withLock({ $0.claimFinish() }) else { return }
    if wasExecuting { operation.willChangeValue(forKey: "isExecuting") }
    operation.willChangeValue(forKey: "isFinished")
    state.withLock { $0.publish(.finished) }
    if wasExecuting { operation.didChangeValue(forKey: "isExecuting") }
    operation.didChangeValue(forKey: "isFinished")
  }

  /// Cancels the work's task, dispatches the handler and resumes every waiter.
  static func deliver<Success, Failure>(
    _ completion: OperationStateMachine<Success, Failure>.Completion
  ) {
    completion.task?.cancel()
    if let deliver = completion.deliver { completion.callbackQueue.async(execute: deliver) }
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
