import Dispatch
import Foundation

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
/// A subclass repeats `@unchecked Sendable` (the base class is); it stays safe while the
/// subclass adds no mutable state, or guards what it adds with a lock such as a `Mutex`.
///
/// ```swift
/// // @unchecked Sendable: no stored properties; SyncOperation guards its own state.
/// final class Sum: SyncOperation<Int, Never>, @unchecked Sendable {
///   override func execute() -> Int { (1...10).reduce(0, +) }
/// }
/// ```
// @unchecked Sendable: adds only the immutable `work`; the shared state is guarded by
// `TypedOperation`'s `OperationCore` (an atomic byte and a `Mutex`).
open class SyncOperation<Success: Sendable, Failure: Error>: TypedOperation<Success, Failure>,
  @unchecked Sendable
{
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

  // MARK: Operation

  /// Calls `execute()` and records its outcome; override `execute()` instead.
  public final override func main() {
    let outcome: ErasedOutcome
    do throws(Failure) {
      outcome = .success(try execute())
    } catch {
      outcome = .failure(error)
    }
    complete(outcome)
  }
}
