import Dispatch
import Foundation

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
/// A subclass repeats `@unchecked Sendable` (the base class is); it stays safe while the
/// subclass adds no mutable state, or guards what it adds with a lock such as a `Mutex`.
///
/// ```swift
/// // @unchecked Sendable: no stored properties; AsyncOperation guards its own state.
/// final class Tick: AsyncOperation<Int, Never>, @unchecked Sendable {
///   override func main() {
///     DispatchQueue.global().asyncAfter(deadline: .now() + 0.1) { self.finish(returning: 1) }
///   }
/// }
/// ```
// @unchecked Sendable: adds only the work closures, set in the initialisers and then only read;
// the shared state is guarded by `TypedOperation`'s `OperationCore` (an atomic byte and a `Mutex`).
open class AsyncOperation<Success: Sendable, Failure: Error>: TypedOperation<Success, Failure>,
  @unchecked Sendable
{
  /// The work of ``init(_:)``; nil for the other forms. Closures rather than one enum: a closure's
  /// layout does not depend on `Success` and `Failure`, so the hot path reads it without looking
  /// up generic metadata. Set by the convenience initialisers after the designated one, so that
  /// the designated initialiser takes no function type (a subclass with `Failure == Never` would
  /// otherwise crash Swift 6.3's vtable thunk emission).
  private var handlerBody: (@Sendable (AsyncOperation<Success, Failure>) -> Void)?
  /// The work of ``init(priority:_:)``; nil for the other forms.
  private var taskBody: (@Sendable () async throws(Failure) -> Success)?
  /// The priority of the task that runs ``taskBody``.
  private var taskPriority: TaskPriority?

  /// Creates an operation for a subclass that overrides `main()`.
  public override init() {
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
    self.init()
    handlerBody = body
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
    self.init()
    taskBody = work
    taskPriority = priority
  }

  // MARK: Operation

  /// Always true: the operation is finished by `finish(…)` or `cancel()`, not when `main()`
  /// returns.
  open override var isAsynchronous: Bool { true }

  /// True: a started operation becomes `isFinished` as soon as its outcome is decided.
  override final var finishesWhenDecided: Bool { true }

  /// Starts the work. Subclasses override it (without calling `super`) and call
  /// `finish(returning:)` or `finish(throwing:)` once the work is done, from any thread.
  open override func main() {
    if let handlerBody {
      handlerBody(self)
    } else if let taskBody {
      let task = Task(priority: taskPriority) {
        do throws(Failure) {
          self.finish(returning: try await taskBody())
        } catch {
          self.finish(throwing: error)
        }
      }
      if !attach(task) { task.cancel() }
    } else {
      preconditionFailure("\(type(of: self)) must override main() or use a closure initialiser")
    }
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
    complete(.failure(error))
  }
}
