import Conveyor
import Foundation
import Synchronization

/// The async task performer's base operation: an `Operation` that is finished by ``finish()``.
///
/// Subclasses override `main()` and call ``finish()`` when their work is done, from any thread;
/// later calls are ignored.
// @unchecked Sendable: adds no stored properties; Conveyor's `TypedOperation` guards all state
// with its `Mutex` and its atomic control byte.
open class AsyncOperation: Conveyor.AsyncOperation<Void, Never>, @unchecked Sendable {
  /// Creates an operation for a subclass that overrides `main()`.
  public override init() {
    super.init()
  }

  /// Marks the operation finished; ignored after the first call or a `cancel()`.
  open func finish() {
    finish(returning: ())
  }
}

/// An operation with a typed completion: subclasses call `completion` with their value or error,
/// then ``AsyncOperation/finish()``.
///
/// ```swift
/// // @unchecked Sendable: only immutable stored properties (Swift 6 asks subclasses to restate it).
/// final class RemoveItemFromBagOperation: AsyncOperationWithCompletion<Bag>, @unchecked Sendable {
///   let itemID: Int
///   let api: ECommAPI
///   init(itemID: Int, api: ECommAPI) {
///     self.itemID = itemID
///     self.api = api
///   }
///   override func main() {
///     api.removeFromBag(item: itemID) { [weak self] (updatedBag, error) in
///       self?.completion?(updatedBag, error)
///       self?.finish()
///     }
///   }
/// }
/// ```
///
/// In a ``SynchronousOperationQueue`` run, ``input`` holds the previous operation's value (the
/// queue's `defaultValue` for the first), so a step can build on the one before.
// @unchecked Sendable: its own state (`completion`, `input`) lives in the `Mutex` `slots`; the
// superclass guards the rest.
open class AsyncOperationWithCompletion<T: Sendable>: AsyncOperation, @unchecked Sendable {
  private struct Slots {
    var completion: (@Sendable (T?, (any Error)?) -> Void)?
    var input: T?
  }

  private let slots = Mutex(Slots())

  /// Creates an operation for a subclass that overrides `main()`.
  public override init() {
    super.init()
  }

  /// Called by the subclass with its value or its error; set by ``SynchronousOperationQueue``.
  public var completion: (@Sendable (T?, (any Error)?) -> Void)? {
    get { slots.withLock { $0.completion } }
    set { slots.withLock { $0.completion = newValue } }
  }

  /// The value the previous operation of the run reported (the queue's `defaultValue` for the
  /// first operation); nil outside a run.
  public var input: T? {
    get { slots.withLock { $0.input } }
    set { slots.withLock { $0.input = newValue } }
  }
}

/// The error a ``SynchronousOperationQueue`` run reports when an operation finished without
/// calling its completion.
public enum SynchronousOperationQueueError: Error, Sendable {
  /// The operation finished (or was cancelled) without reporting a value or an error.
  case neverExecuted
}

/// Runs ``AsyncOperationWithCompletion``s one after another, passing each one's value to the
/// next, stops at the first error, and reports the final value once: the async task performer's
/// `SynchronousOperationQueue`, on Conveyor's `Pipeline`.
///
/// ```swift
/// let queue = SynchronousOperationQueue(defaultValue: currentBag)
/// queue.executeOperations(operations) { (finalBag, error) in
///   if let error = error { print(":(") } else { print("Updated Bag: \(finalBag!)") }
/// }
/// ```
///
/// Fixed from the old library: the completion runs exactly once; each operation's value reaches
/// the next as ``AsyncOperationWithCompletion/input``; after an error the operations not started
/// are cancelled and never run; and runs are independent, so an error in one run never cancels
/// another run on the same queue.
public final class SynchronousOperationQueue<T: Sendable>: Sendable {
  /// How the operations of a run are scheduled.
  public enum QueueType: Sendable {
    /// At most this many operations at once; each gets `defaultValue` as its input and the run
    /// reports the last operation's value (in list order).
    case concurrent(maxConcurrentOperations: Int)
    /// One after another, each getting the previous one's value (the default).
    case nonConcurrent
  }

  private let state: Mutex<T>
  /// How runs schedule their operations.
  public let type: QueueType
  /// The queue the completion runs on: the main queue on Apple platforms, a shared serial queue
  /// elsewhere.
  public let callbackQueue: DispatchQueue

  /// The value the first operation receives, and the result of a run with no operations.
  public var defaultValue: T {
    get { state.withLock { $0 } }
    set { state.withLock { $0 = newValue } }
  }

  /// Creates a queue that runs operations one after another.
  public convenience init(defaultValue: T) {
    self.init(defaultValue: defaultValue, type: .nonConcurrent)
  }

  /// Creates a queue of the given type.
  public init(defaultValue: T, type: QueueType) {
    self.state = Mutex(defaultValue)
    self.type = type
    self.callbackQueue = defaultCompletionQueue
  }

  /// Runs `operations` and calls `completion` once on ``callbackQueue`` with the final value, or
  /// with the first error (and a nil value).
  ///
  /// - Parameters:
  ///   - operations: the operations, in order; each is started directly (not on an
  ///     `OperationQueue`) once the previous one reported.
  ///   - completion: called exactly once.
  /// - Returns: a handle that cancels this run only.
  @discardableResult
  public func executeOperations(
    _ operations: [AsyncOperationWithCompletion<T>],
    completion: @escaping @Sendable (T?, (any Error)?) -> Void
  ) -> RunHandle {
    let initial = defaultValue
    let report: @Sendable (Result<T?, any Error>) -> Void = { result in
      switch result {
      case .success(let value): completion(value, nil)
      case .failure(let error):
        for operation in operations where !operation.isExecuting && !operation.isFinished {
          operation.cancel()
        }
        completion(nil, error)
      }
    }
    switch type {
    case .nonConcurrent:
      let steps = operations.map { operation in
        { @Sendable (value: T?) async throws -> T? in try await Self.run(operation, input: value) }
      }
      return Pipeline<T?>(defaultValue: initial, callbackQueue: callbackQueue)
        .executeOperations(steps, completion: report)
    case .concurrent(let width):
      let tasks = operations.map { operation in
        AnyAsyncTask<T?, any Error> { try await Self.run(operation, input: initial) }
      }
      return AsyncTaskRunner(tasks, mode: .concurrent(width: max(1, width)), callbackQueue: callbackQueue)
        .execute { result in report(result.map { $0.last ?? initial }) }
    }
  }

  /// Starts `operation` with `input` and returns what it reports; throws its error.
  private static func run(_ operation: AsyncOperationWithCompletion<T>, input: T?) async throws -> T? {
    let promise = CallbackPromise<T?>()
    operation.input = input
    operation.completion = { value, error in
      promise.fulfil(error.map { .failure($0) } ?? .success(value))
    }
    // The operation's own outcome: finishing (or being cancelled) without reporting is an error.
    let finished = Task {
      _ = try? await operation.value
      promise.fulfil(.failure(SynchronousOperationQueueError.neverExecuted))
    }
    defer { finished.cancel() }
    return try await withTaskCancellationHandler {
      operation.start()
      return try await promise.value
    } onCancel: {
      operation.cancel()
    }
  }
}
