import Conveyor
import Foundation

/// The persistent request queue's namespace, kept so that code written for it compiles after
/// changing `import Bismuth` to `import ConveyorBismuth`.
///
/// ``Bismuth/Queue`` runs on Conveyor's `JobQueue` with a SQLite store: every `add`
/// is committed before it returns, a failed item waits for its retry without blocking the others,
/// and `pause()` is stored. See <doc:MigratingFromBismuth> for what differs on purpose.
public enum Bismuth {
  /// What the delegate tells the queue about an item.
  public enum HandleResult: Int, Sendable {
    /// Try the item again after ``Bismuth/Config/retryTime`` seconds.
    case retry
    /// The item is done: it is deleted from the queue.
    case handled
  }

  /// What a queue is doing. A stored pause comes first: a paused queue is
  /// ``Bismuth/QueueState/paused`` whether it was started or not.
  public enum QueueState: Int, Sendable {
    /// Not paused, and no item is waiting or being handled, or the queue was not started
    /// (`autoStart` false and no ``Bismuth/Queue/start()`` yet).
    case idle
    /// Paused by ``Bismuth/Queue/pause()``, also before ``Bismuth/Queue/start()``, at an earlier
    /// launch or by another queue on the same database; stored, so it lasts until
    /// ``Bismuth/Queue/resume()``.
    case paused
    /// Started and not paused, with items waiting or being handled: also while they wait for a
    /// delegate or for their retry, as in the old library.
    case running
  }
}

/// An item a ``Bismuth/Queue`` stores: `Codable` (stored as JSON), `Equatable` (for
/// ``Bismuth/Queue/remove(_:)``) and `Sendable` (it is handed to the delegate's isolation).
///
/// It refines Conveyor's `Queueable`, so an item may also give a `deduplicationKey`.
public protocol BismuthQueueable: Queueable, Equatable {}

/// Handles a ``Bismuth/Queue``'s items: the old library's delegate, which a `@MainActor` class
/// (a view controller, an app delegate, a view model) may adopt with ordinary methods.
///
/// Implement one of the two `queue(_:handle:…)` methods: the old one without `attempts`, or the
/// one with `attempts`, which is 0 the first time an item is handled (as in the old library).
///
/// ```swift
/// @MainActor final class Outbox: BismuthQueueDelegate {
///   func queue<T>(_ queue: Bismuth.Queue<T>, handle item: T,
///                 completion: @escaping (Bismuth.HandleResult) -> Void) where T: BismuthQueueable {
///     guard let item = item as? RequestQueueItem else { return completion(.handled) }
///     send(item) { ok in completion(ok ? .handled : .retry) }
///   }
///   func queueFinished<T>(_ queue: Bismuth.Queue<T>) where T: BismuthQueueable {}
/// }
/// ```
///
/// ## Where the callbacks run
/// - Both `queue(_:handle:…)` methods and `queueFinished(_:)` run on the delegate's isolation:
///   on the main actor for a `@MainActor` delegate (as UIKit classes are), on Swift's
///   cooperative thread pool for a nonisolated class. The main actor must be served (it is in
///   apps and in `@MainActor` tests).
/// - `completion` may be called from any thread, once; later calls are ignored.
/// - `queueFinished(_:)` runs after the last item's outcome is stored.
///
/// The requirements are declared `async` only so that main-actor methods satisfy them; write
/// them as ordinary synchronous methods, as before.
public protocol BismuthQueueDelegate: AnyObject, Sendable {
  /// Handles an item; `attempts` is 0 the first time. Call `completion` once.
  func queue<T: BismuthQueueable>(
    _ queue: Bismuth.Queue<T>, handle item: T, attempts: Int,
    completion: @escaping @Sendable (Bismuth.HandleResult) -> Void) async

  /// Handles an item (the old library's README shape). Call `completion` once.
  func queue<T: BismuthQueueable>(
    _ queue: Bismuth.Queue<T>, handle item: T,
    completion: @escaping @Sendable (Bismuth.HandleResult) -> Void) async

  /// Called when no item is waiting or being handled.
  func queueFinished<T: BismuthQueueable>(_ queue: Bismuth.Queue<T>) async
}

extension BismuthQueueDelegate {
  /// Calls ``BismuthQueueDelegate/queue(_:handle:completion:)``, for delegates written without
  /// `attempts`.
  public func queue<T: BismuthQueueable>(
    _ queue: Bismuth.Queue<T>, handle item: T, attempts: Int,
    completion: @escaping @Sendable (Bismuth.HandleResult) -> Void
  ) async {
    await self.queue(queue, handle: item, completion: completion)
  }

  /// Reached only by a delegate that implements neither `queue(_:handle:…)` method: logs that
  /// through ``Bismuth/Config/logProxy`` and retries the item.
  public func queue<T: BismuthQueueable>(
    _ queue: Bismuth.Queue<T>, handle item: T,
    completion: @escaping @Sendable (Bismuth.HandleResult) -> Void
  ) async {
    queue.config.logProxy?(
      "\(Self.self) implements neither queue(_:handle:completion:) nor queue(_:handle:attempts:completion:); "
        + "the item will be retried")
    completion(.retry)
  }

  /// Does nothing.
  public func queueFinished<T: BismuthQueueable>(_ queue: Bismuth.Queue<T>) {}
}
