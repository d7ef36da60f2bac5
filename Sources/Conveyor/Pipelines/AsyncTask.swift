import Dispatch
import Synchronization

/// A unit of asynchronous work with a typed outcome, usable with a completion handler or `await`.
///
/// Conform by implementing ``execute(completion:)``; ``run()`` then has a default that awaits it.
/// Work that is natively `async` should also implement ``run()`` so that cancelling the awaiting
/// Swift task reaches it (the default cannot interrupt a completion-handler task: it waits for
/// the completion). ``AnyAsyncTask`` builds one from a closure of either kind.
///
/// ```swift
/// let task = AnyAsyncTask<Int, Never> { 6 * 7 }
/// let answer = await task.run()  // 42
/// ```
public protocol AsyncTask<Output, Failure>: Sendable {
  /// The value the task produces.
  associatedtype Output: Sendable
  /// The error the task may fail with.
  associatedtype Failure: Error

  /// Starts the task and calls `completion` once with its outcome, on a thread of the task's choosing.
  ///
  /// - Parameter completion: Called exactly once with the value or the error.
  func execute(completion: @escaping @Sendable (Result<Output, Failure>) -> Void)

  /// Runs the task and returns its value or throws its error.
  func run() async throws(Failure) -> Output
}

extension AsyncTask {
  /// Awaits ``execute(completion:)``.
  ///
  /// A completion called more than once is honoured the first time only. Cancelling the awaiting
  /// Swift task does not interrupt a completion-handler task; this waits for its completion.
  public func run() async throws(Failure) -> Output {
    try await firstResult(of: execute)
  }
}

/// Awaits the first result a completion-handler `execute` reports; later ones are ignored.
func firstResult<Output: Sendable, Failure: Error>(
  of execute: (@escaping @Sendable (Result<Output, Failure>) -> Void) -> Void
) async throws(Failure) -> Output {
  let result = await withCheckedContinuation {
    (continuation: CheckedContinuation<Result<Output, Failure>, Never>) in
    let once = ResumeOnce(continuation)
    execute { once.resume(returning: $0) }
  }
  return try result.get()
}

/// An ``AsyncTask`` made from a closure, either `async` or completion-handler based.
///
/// ```swift
/// let fetch = AnyAsyncTask<String, any Error> { try await loadGreeting() }
/// let legacy = AnyAsyncTask<Int, Never>(execute: { done in
///   DispatchQueue.global().async { done(.success(1)) }
/// })
/// ```
public struct AnyAsyncTask<Output: Sendable, Failure: Error>: AsyncTask {
  @usableFromInline
  enum Body: Sendable {
    case async(@Sendable () async throws(Failure) -> Output)
    case callback(@Sendable (@escaping @Sendable (Result<Output, Failure>) -> Void) -> Void)
  }

  @usableFromInline let body: Body
  /// What ``run()`` awaits, made once from `body`: a plain closure call.
  @usableFromInline let work: @Sendable () async throws(Failure) -> Output
  /// The same with untyped `throws`, for `AsyncTaskRunner` (see its `works`). Made where the
  /// task is made, from the caller's closure, so awaiting it goes through one thunk at most.
  @usableFromInline let untypedWork: @Sendable () async throws -> Output
  /// The caller's closure itself when it cannot throw, for `AsyncTaskRunner`: awaited as it is,
  /// without the thunk that makes it throwing (each thunk is one more `async` frame per call).
  @usableFromInline let plainWork: (@Sendable () async -> Output)?

  // Disfavoured so that a closure that cannot throw picks the initialiser below (with
  // `Failure == Never` the two take the same type); a throwing closure has only this one.

  /// Makes a task from an `async` closure; cancelling the awaiting Swift task reaches the closure.
  ///
  /// - Parameter body: The work; it runs once per ``run()`` or ``execute(completion:)``.
  @inlinable @_disfavoredOverload
  public init(_ body: @escaping @Sendable () async throws(Failure) -> Output) {
    self.body = .async(body)
    self.work = body
    self.untypedWork = body
    self.plainWork = nil
  }

  /// Makes a task from an `async` closure that cannot fail; cancelling the awaiting Swift task
  /// reaches the closure.
  ///
  /// The same as the initialiser taking a throwing closure, for a closure that does not throw:
  /// kept as it is, so that ``AsyncTaskRunner`` awaits it with no conversion in between.
  ///
  /// - Parameter body: The work; it runs once per ``run()`` or ``execute(completion:)``.
  @inlinable
  public init(_ body: @escaping @Sendable () async -> Output) {
    self.body = .async(body)
    self.work = body
    self.untypedWork = body
    self.plainWork = body
  }

  /// Makes a task from a completion-handler closure (the seed's `execute(completion:)` shape).
  ///
  /// - Parameter execute: Starts the work and calls its argument once with the outcome.
  public init(execute: @escaping @Sendable (@escaping @Sendable (Result<Output, Failure>) -> Void) -> Void) {
    self.body = .callback(execute)
    let work = { @Sendable () async throws(Failure) -> Output in try await firstResult(of: execute) }
    self.work = work
    self.untypedWork = work
    self.plainWork = nil
  }

  /// Wraps another task.
  ///
  /// - Parameter task: The task to forward to; its own ``AsyncTask/run()`` is used when awaited.
  public init<Wrapped: AsyncTask>(_ task: Wrapped)
  where Wrapped.Output == Output, Wrapped.Failure == Failure {
    let work: @Sendable () async throws(Failure) -> Output = { () async throws(Failure) -> Output in
      try await task.run()
    }
    self.body = .async(work)
    self.work = work
    self.untypedWork = work
    self.plainWork = nil
  }

  /// Starts the task; an `async` body runs in a new unstructured `Task`.
  ///
  /// - Parameter completion: Called exactly once with the outcome, on an arbitrary thread.
  public func execute(completion: @escaping @Sendable (Result<Output, Failure>) -> Void) {
    switch body {
    case .async(let body):
      Task {
        do throws(Failure) {
          completion(.success(try await body()))
        } catch {
          completion(.failure(error))
        }
      }
    case .callback(let execute):
      let once = Mutex(false)
      execute { result in
        let first = once.withLock { called in
          defer { called = true }
          return !called
        }
        if first { completion(result) }
      }
    }
  }

  /// Runs the task; an `async` body runs in the caller's task, so it sees its cancellation.
  ///
  /// Not inlinable: Swift 6.3.1 crashes in IR generation when a caller specialised for
  /// `Failure == Never` calls the stored `throws(Failure)` closure.
  public func run() async throws(Failure) -> Output {
    try await work()
  }
}

/// Resumes a continuation at most once; later calls are ignored.
final class ResumeOnce<Value: Sendable, Failure: Error>: Sendable {
  private let continuation: Mutex<CheckedContinuation<Value, Failure>?>

  init(_ continuation: CheckedContinuation<Value, Failure>) {
    self.continuation = Mutex(continuation)
  }

  func resume(returning value: sending Value) {
    // Take the continuation under the lock, resume it outside.
    let taken = continuation.withLock { stored in
      defer { stored = nil }
      return stored
    }
    taken?.resume(returning: value)
  }
}

/// Bridges a completion-handler step into `async`, ending early with `CancellationError` when the
/// awaiting task is cancelled (a completion arriving after that is ignored).
func awaitCallback<Value: Sendable>(
  _ start: (@escaping @Sendable (Result<Value, any Error>) -> Void) -> Void
) async throws -> Value {
  let gate = CancellableGate<Value>()
  return try await withTaskCancellationHandler {
    try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Value, any Error>) in
      guard gate.install(continuation) else {
        continuation.resume(throwing: CancellationError())
        return
      }
      start { gate.finish($0) }
    }
  } onCancel: {
    gate.finish(.failure(CancellationError()))
  }
}

/// The state shared by a callback, a cancellation handler and a waiting continuation.
private final class CancellableGate<Value: Sendable>: Sendable {
  private enum State {
    case notWaiting
    case waiting(CheckedContinuation<Value, any Error>)
    case finished
  }

  private let state = Mutex(State.notWaiting)

  /// Stores the continuation; false when the gate already finished (cancelled before waiting).
  func install(_ continuation: CheckedContinuation<Value, any Error>) -> Bool {
    state.withLock { state in
      guard case .notWaiting = state else { return false }
      state = .waiting(continuation)
      return true
    }
  }

  /// Resumes the waiting continuation with `result` the first time; outside the lock.
  func finish(_ result: Result<Value, any Error>) {
    let continuation = state.withLock { state -> CheckedContinuation<Value, any Error>? in
      switch state {
      case .notWaiting:
        state = .finished
        return nil
      case .waiting(let continuation):
        state = .finished
        return continuation
      case .finished:
        return nil
      }
    }
    continuation?.resume(with: result)
  }
}
