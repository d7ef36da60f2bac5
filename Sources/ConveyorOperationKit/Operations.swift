import Conveyor
import Foundation

/// The typed operation kit's asynchronous operation, on Conveyor's `AsyncOperation`: change
/// `import OperationKit` to `import ConveyorOperationKit`.
///
/// Subclasses override `main()` (without calling `super`) and call ``finish(withResult:)`` or
/// ``finish(withError:)`` once, from any thread. `successHandler` or `failureHandler` then runs
/// on `callbackQueue` (the main queue on Apple platforms), and only after it returned does the
/// operation become finished, so an `OperationQueue` starts dependents after the handler: they see
/// what it stored.
///
/// Fixed from the old kit: a second `finish` is ignored (the handlers ran twice), `cancel()`
/// racing `finish` never runs a handler, and state is guarded by a lock.
///
/// ```swift
/// // @unchecked Sendable: no stored properties (Swift 6 asks subclasses to restate it).
/// final class Answer: AsyncOperation<Int, MyError>, @unchecked Sendable {
///   override func main() {
///     DispatchQueue.global().async { self.finish(withResult: 42) }
///   }
/// }
/// ```
// @unchecked Sendable: adds no stored properties; Conveyor's `TypedOperation` guards all state
// with its `Mutex` (outcome, handlers, queue) and its atomic control byte.
open class AsyncOperation<ResultType: Sendable, ErrorType: Error>:
  Conveyor.AsyncOperation<ResultType, ErrorType>, @unchecked Sendable
{
  /// Creates an operation for a subclass that overrides `main()`; it finishes after its handlers.
  public override init() {
    super.init()
    finishesAfterHandlers = true
  }

  /// Finishes with `result` (the old name of `finish(returning:)`); ignored after the first finish
  /// or a `cancel()`.
  public final func finish(withResult result: ResultType) {
    finish(returning: result)
  }

  /// Finishes with `error` (the old name of `finish(throwing:)`); ignored after the first finish
  /// or a `cancel()`.
  public final func finish(withError error: ErrorType) {
    finish(throwing: error)
  }
}

/// The typed operation kit's synchronous operation: `main()` does the work and calls
/// ``finish(withResult:)`` or ``finish(withError:)`` before it returns, as the old README asks.
///
/// It runs on Conveyor's `AsyncOperation` machinery: the operation finishes when `finish` is
/// called and the handler has run on `callbackQueue` (so a `main()` that returns without calling
/// `finish` leaves the operation unfinished, where the old kit finished it without a result).
/// For new code, Conveyor's `SyncOperation` with `execute()` returns or throws instead.
///
/// ```swift
/// // @unchecked Sendable: no stored properties (Swift 6 asks subclasses to restate it).
/// final class Parse: SyncOperation<Int, ParseError>, @unchecked Sendable {
///   override func main() {
///     if let number = Int("42") { finish(withResult: number) } else { finish(withError: ParseError()) }
///   }
/// }
/// ```
// @unchecked Sendable: adds no stored properties; Conveyor's `TypedOperation` guards all state
// with its `Mutex` (outcome, handlers, queue) and its atomic control byte.
open class SyncOperation<ResultType: Sendable, ErrorType: Error>:
  Conveyor.AsyncOperation<ResultType, ErrorType>, @unchecked Sendable
{
  /// Creates an operation for a subclass that overrides `main()`; it finishes after its handlers.
  public override init() {
    super.init()
    finishesAfterHandlers = true
  }

  /// Finishes with `result`; ignored after the first finish or a `cancel()`.
  public final func finish(withResult result: ResultType) {
    finish(returning: result)
  }

  /// Finishes with `error`; ignored after the first finish or a `cancel()`.
  public final func finish(withError error: ErrorType) {
    finish(throwing: error)
  }
}
