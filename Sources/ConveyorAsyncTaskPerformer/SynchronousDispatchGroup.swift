import Conveyor
import Foundation

/// A task whose work is asynchronous, such as an API call: the async task performer's protocol.
///
/// ```swift
/// struct SayHelloTask: AsyncTask {
///   let id: Int
///   func execute(completion: @escaping () -> Void) {
///     print("Hello World \(id)")
///     completion()
///   }
/// }
/// ```
///
/// Conforming types are `Sendable` (a task is started from whichever thread the previous one
/// completed on); a struct of `Sendable` values is so without saying anything.
public protocol AsyncTask: Sendable {
  /// Starts the work; call `completion` once when it is done (from any thread; later calls are
  /// ignored).
  func execute(completion: @escaping @Sendable () -> Void)
}

/// Runs a list of ``AsyncTask``s strictly one after another and calls one completion at the end:
/// the async task performer's `SynchronousDispatchGroup`, on Conveyor's `AsyncTaskRunner`.
///
/// ```swift
/// let tasks: [AsyncTask] = [SayHelloTask(id: 1), SayHelloTask(id: 2), SayHelloTask(id: 3)]
/// SynchronousDispatchGroup().executeTasks(tasks) {
///   print("Goodbye")
/// }
/// ```
///
/// Fixed from the old library: each task starts only after the previous one completed (the old
/// group started them all at once), and the completion runs exactly once.
public final class SynchronousDispatchGroup: Sendable {
  /// The queue the completion runs on.
  public let systemQueue: DispatchQueue

  /// Creates a group whose completion runs on the main queue on Apple platforms, and on a shared
  /// serial queue elsewhere (the main queue does not run in Linux tools and tests).
  public convenience init() {
    self.init(systemQueue: defaultCompletionQueue)
  }

  /// Creates a group whose completion runs on `systemQueue`.
  ///
  /// - Parameter systemQueue: where the completion runs.
  public init(systemQueue: DispatchQueue) {
    self.systemQueue = systemQueue
  }

  /// Runs `tasks` in order, each after the previous one called its completion, then calls
  /// `completion` once on ``systemQueue``.
  ///
  /// - Parameters:
  ///   - tasks: the tasks, in order; an empty list completes at once.
  ///   - completion: called once after the last task completed.
  /// - Returns: a handle that cancels this run (the task running finishes; later ones never
  ///   start; `completion` still runs once).
  @discardableResult
  public func executeTasks(_ tasks: [AsyncTask], completion: @escaping @Sendable () -> Void) -> RunHandle {
    let steps = tasks.map { task in
      AnyAsyncTask<Void, Never>(execute: { done in task.execute { done(.success(())) } })
    }
    return AsyncTaskRunner(steps, mode: .sequential, callbackQueue: systemQueue).execute { _ in completion() }
  }
}

/// The main queue on Apple platforms; a shared serial queue elsewhere.
let defaultCompletionQueue: DispatchQueue = {
  #if canImport(Darwin)
    DispatchQueue.main
  #else
    DispatchQueue(label: "conveyor.async-task-performer")
  #endif
}()
