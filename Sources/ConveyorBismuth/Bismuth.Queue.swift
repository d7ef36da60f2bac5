import Conveyor
import ConveyorSQLite
import Foundation
import Synchronization

extension Bismuth {
  /// A durable queue of `Codable` items handled one at a time by a delegate, with the old
  /// library's API, running on Conveyor's `JobQueue`.
  ///
  /// ```swift
  /// var config = Bismuth.Config(identifier: "api-requests")
  /// config.retryTime = 30
  /// queue = Bismuth.Queue<RequestQueueItem>(config: config)
  /// queue.delegate = self
  /// queue.add(RequestQueueItem(url: "https://example.com/api/get"))
  /// ```
  ///
  /// What changed from the old library, on purpose:
  /// - ``add(_:)-(T)`` commits the item to a SQLite database before it returns (the old library
  ///   wrote a JSON file in a cache folder a quarter second later, and lost the queue when that
  ///   file failed to decode). The old cache file is not read: items queued by the old library are
  ///   not carried over.
  /// - An item waiting for its retry never blocks the others, and a failed item keeps its place
  ///   by arrival.
  /// - ``start()`` starts a queue created with `autoStart = false`.
  /// - ``pause()`` is stored in the database: the queue stays paused across launches until
  ///   ``resume()``.
  /// - ``add(_:)-(T)`` does not replace an equal item already queued; give the item a
  ///   `deduplicationKey` for that.
  ///
  /// The synchronous calls (``add(_:)-(T)``, ``remove(_:)``, ``items``, ``count``,
  /// ``pause()``, ``resume()``, ``clear()``) block the calling thread until the database
  /// answered, usually well under a millisecond. Their work runs on a dedicated thread, never on
  /// Swift's cooperative pool, so calling them from `async` code cannot deadlock; still, in
  /// `async` code prefer ``jobQueue``'s `async` methods, which do not block a thread.
  public final class Queue<T: BismuthQueueable>: Sendable {
    /// The settings the queue was created with.
    public let config: Config
    /// The Conveyor queue doing the work, for its `async` API (`add`, `count`, `events`,
    /// `waitUntilFinished`, dead jobs…).
    public let jobQueue: JobQueue<T>
    /// Why the database could not be opened, when it could not: the queue then keeps its items in
    /// memory only (and says so through ``Config/logProxy``). Nil normally.
    public let storageError: (any Error)?

    private let slot: DelegateSlot
    private let adapter: Adapter<T>
    #if canImport(UIKit) && !os(watchOS)
      private let backgroundTime: BackgroundTime?
    #endif

    /// The object that handles items; held weakly. Set it before or after the queue starts: items
    /// wait for a delegate, without using an attempt.
    public weak var delegate: (any BismuthQueueDelegate)? {
      get { slot.delegate }
      set { slot.delegate = newValue }
    }

    /// Creates the queue on its SQLite database (see ``Config/databaseURL``).
    ///
    /// If the database cannot be opened, the queue still works, in memory only, and
    /// ``storageError`` says why.
    public convenience init(config: Config) {
      let store: any JobStore
      var failure: (any Error)?
      do {
        if let url = config.databaseURL {
          // Its folder is created (0700) as the default location's is: on an app's first launch
          // an Application Support subfolder does not exist yet.
          try FileManager.default.createDirectory(
            at: url.deletingLastPathComponent(), withIntermediateDirectories: true,
            attributes: [.posixPermissions: 0o700])
          store = try SQLiteJobStore(path: url.path)
        } else {
          store = try SQLiteJobStore()
        }
      } catch {
        config.logProxy?("Could not open the queue's database, keeping items in memory only: \(error)")
        failure = error
        store = InMemoryJobStore()
      }
      self.init(config: config, store: store, storageError: failure)
    }

    /// Creates the queue on a store of your choice (an `InMemoryJobStore` for tests, a shared
    /// `SQLiteJobStore`).
    ///
    /// - Throws: `JobQueueError` if the configuration is invalid (a `maxAttempts` below 1).
    public convenience init(config: Config, store: any JobStore) throws {
      try self.init(validating: config, store: store)
    }

    private convenience init(config: Config, store: any JobStore, storageError: (any Error)?) {
      do {
        try self.init(validating: config, store: store, storageError: storageError)
      } catch {
        preconditionFailure("Bismuth.Config is invalid: \(error)")
      }
    }

    private init(validating config: Config, store: any JobStore, storageError: (any Error)? = nil) throws {
      self.config = config
      self.storageError = storageError
      let slot = DelegateSlot()
      let adapter = Adapter<T>(slot: slot)
      self.slot = slot
      self.adapter = adapter
      var configuration = JobQueueConfiguration(identifier: config.queueName)
      configuration.retryPolicy = .fixed(.seconds(min(max(config.retryTime, 0), 86_400)))
      configuration.maxAttempts = config.maxAttempts
      configuration.autoStart = false
      configuration.canRunInBackground = config.canRunInBackground
      if let proxy = config.logProxy {
        configuration.log = { record in
          let fields = record.metadata.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }
          proxy(([record.message] + fields).joined(separator: " "))
        }
      }
      jobQueue = try JobQueue(configuration: configuration, store: store, delegate: adapter)
      #if canImport(UIKit) && !os(watchOS)
        backgroundTime = config.canRunInBackground ? BackgroundTime(events: jobQueue.events) : nil
      #endif
      adapter.owner = self
      if config.autoStart { jobQueue.start() }
    }

    deinit {
      // The adapter goes with this object, so the engine claims nothing more; stop its loop.
      let jobQueue = jobQueue
      Task { await jobQueue.shutdown(gracePeriod: .seconds(5)) }
    }

    // MARK: Items

    /// Adds an item; returns once it is committed to the database.
    ///
    /// Blocks the calling thread until then (see the type's notes). A database error is passed to
    /// ``Config/logProxy`` and returns false.
    @discardableResult
    public func add(_ object: T) -> Bool {
      add([object])
    }

    /// Adds items in one transaction: all are committed, or none (false).
    @discardableResult
    public func add(_ objects: [T]) -> Bool {
      if objects.isEmpty { return true }
      let jobQueue = jobQueue
      return report("add") { _ = try await jobQueue.add(contentsOf: objects) } != nil
    }

    /// Removes every waiting item equal to `item` (and the record of a running one, whose result
    /// is then ignored); returns how many were removed.
    @discardableResult
    public func remove(_ item: T) -> Int {
      let jobQueue = jobQueue
      return report("remove") {
        let matching = try await Self.unfinishedJobs(jobQueue).filter { $0.item == item }.map(\.id)
        return try await jobQueue.remove(matching)
      } ?? 0
    }

    /// Removes every waiting item (running ones finish).
    public func clear() {
      let jobQueue = jobQueue
      _ = report("clear") { try await jobQueue.clear() }
    }

    /// The items waiting or being handled, in the order they were added.
    public var items: [T] {
      let jobQueue = jobQueue
      return report("list items") { try await Self.unfinishedJobs(jobQueue).map(\.item) } ?? []
    }

    /// How many items are waiting or being handled.
    public var count: Int {
      let jobQueue = jobQueue
      return report("count") { try await jobQueue.count().unfinished } ?? 0
    }

    /// Whether no item is waiting or being handled.
    public var isEmpty: Bool { count == 0 }

    // MARK: Control

    /// What the queue is doing.
    public var state: QueueState {
      switch jobQueue.state {
      case .stopped, .idle: .idle
      case .running: .running
      case .paused: .paused
      }
    }

    /// Starts handling items (a queue created with `autoStart = false`); does nothing if started.
    public func start() {
      jobQueue.start()
    }

    /// Stops handling new items until ``resume()``; the item being handled finishes. Stored in
    /// the database, so the queue is still paused after the app restarts.
    public func pause() {
      let jobQueue = jobQueue
      _ = report("pause") { try await jobQueue.pause() }
    }

    /// Resumes a paused queue.
    public func resume() {
      let jobQueue = jobQueue
      _ = report("resume") { try await jobQueue.resume() }
    }

    // MARK: Helpers

    /// Runs `work` off the calling thread and waits; logs and returns nil on error.
    private func report<Value: Sendable>(
      _ what: String, _ work: @escaping @Sendable () async throws -> Value
    ) -> Value? {
      do {
        return try BlockingBridge.wait(for: work)
      } catch {
        config.logProxy?("Could not \(what): \(error)")
        return nil
      }
    }

    /// The pending and running jobs, decoded, in ID (arrival) order. Undecodable ones are skipped:
    /// the engine makes them dead jobs when it reaches them.
    private static func unfinishedJobs(_ jobQueue: JobQueue<T>) async throws -> [(id: JobID, item: T)] {
      var found: [(id: JobID, item: T)] = []
      var after: JobID?
      while true {
        let page = try await jobQueue.jobs(after: after, limit: 500)
        for record in page where record.status != .dead {
          // An item that no longer decodes is not listed (the old library could not show it
          // either); the queue makes it a dead job, with the decode error, when it comes up.
          if let item = try? jobQueue.item(of: record) { found.append((record.id, item)) }
        }
        guard let last = page.last, page.count == 500 else { return found }
        after = last.id
      }
    }
  }
}

/// The current delegate, held weakly, and the handlers waiting for one.
final class DelegateSlot: Sendable {
  private struct State {
    weak var delegate: (any BismuthQueueDelegate)?
    var waiters: [UUID: CheckedContinuation<any BismuthQueueDelegate, any Error>] = [:]
  }

  private let state = Mutex(State())

  var delegate: (any BismuthQueueDelegate)? {
    get { state.withLock { $0.delegate } }
    set {
      let waiters = state.withLock { state in
        state.delegate = newValue
        defer { if newValue != nil { state.waiters = [:] } }
        return newValue == nil ? [] : Array(state.waiters.values)
      }
      if let newValue { for waiter in waiters { waiter.resume(returning: newValue) } }
    }
  }

  /// The delegate, waiting until one is set, at most `limit`; throws `CancellationError` if the
  /// task is cancelled or the time runs out.
  func waitForDelegate(atMost limit: Duration) async throws -> any BismuthQueueDelegate {
    let token = UUID()
    // Started once the waiter is recorded, so a timer that fires at once finds it.
    let timer = Mutex<Task<Void, Never>?>(nil)
    defer { timer.withLock { $0?.cancel() } }
    return try await withTaskCancellationHandler {
      try await withCheckedThrowingContinuation { continuation in
        let ready = state.withLock { state -> Result<any BismuthQueueDelegate, any Error>? in
          if let delegate = state.delegate { return .success(delegate) }
          // Cancelled before the waiter was recorded: the handler found nobody to end.
          if Task.isCancelled { return .failure(CancellationError()) }
          state.waiters[token] = continuation
          return nil
        }
        if let ready { return continuation.resume(with: ready) }
        timer.withLock {
          $0 = Task { [weak self] in
            // Freed at once when cancelled, unlike `Task.sleep`.
            do { try await DispatchSleep.sleep(for: limit) } catch { return }
            let waiter = self?.state.withLock { $0.waiters.removeValue(forKey: token) }
            waiter?.resume(throwing: CancellationError())
          }
        }
      }
    } onCancel: {
      let waiter = state.withLock { $0.waiters.removeValue(forKey: token) }
      waiter?.resume(throwing: CancellationError())
    }
  }

}

/// The engine's delegate: forwards to the ``Bismuth/Queue``'s current delegate, counting attempts
/// from 0 as the old library did.
final class Adapter<T: BismuthQueueable>: JobQueueDelegate, Sendable {
  private let slot: DelegateSlot
  private let ownerBox = Mutex(WeakOwner())

  private struct WeakOwner {
    weak var queue: Bismuth.Queue<T>?
  }

  init(slot: DelegateSlot) {
    self.slot = slot
  }

  var owner: Bismuth.Queue<T>? {
    get { ownerBox.withLock { $0.queue } }
    set { ownerBox.withLock { $0.queue = newValue } }
  }

  func queue(
    _ queue: JobQueue<T>, handle item: T, attempts: Int,
    completion: @escaping @Sendable (JobResult) -> Void
  ) async {
    do {
      // The engine claims only while a delegate is set (`isReadyForJobs`); one that went away in
      // between is waited for briefly, never forever (the item would be stuck for every worker).
      let delegate = try await slot.waitForDelegate(atMost: .seconds(2))
      guard let owner else { throw CancellationError() }
      await delegate.queue(owner, handle: item, attempts: attempts - 1) { result in
        completion(result == .handled ? .handled : .retry)
      }
    } catch {
      // Cancelled while waiting for a delegate (a shutdown): the engine gives the item back.
      completion(.retry)
    }
  }

  /// Jobs are claimed only while the ``Bismuth/Queue`` has a delegate, so a queue without one
  /// never holds an item that another instance on the same file could handle.
  var isReadyForJobs: Bool { slot.delegate != nil }

  func queueFinished(_ queue: JobQueue<T>) async {
    guard let delegate = slot.delegate, let owner else { return }
    await delegate.queueFinished(owner)
  }
}
