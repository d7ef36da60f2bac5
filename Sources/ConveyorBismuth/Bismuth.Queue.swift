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
  /// - The delegate receives each item as decoded from the database, so state its `CodingKeys`
  ///   leave out has its default value there; ``remove(_:)`` and ``items`` use the instances this
  ///   queue added (see <doc:MigratingFromBismuth>).
  ///
  /// The synchronous calls (``add(_:)-(T)``, ``remove(_:)``, ``items``, ``count``,
  /// ``pause()``, ``resume()``, ``clear()``, and ``state`` when it must ask the database) block
  /// the calling thread until the database answered, usually well under a millisecond. Their work runs on a dedicated thread, never on
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
    private let kept = KeptInstances<T>()
    private let keptWatcher: Task<Void, Never>
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
      // As the old library did, a handled (or cancelled) item leaves the database.
      configuration.retention.completed = .none
      configuration.retention.cancelled = .none
      if let proxy = config.logProxy {
        configuration.log = { record in
          let fields = record.metadata.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }
          proxy(([record.message] + fields).joined(separator: " "))
        }
      }
      jobQueue = try JobQueue(configuration: configuration, store: store, delegate: adapter)
      keptWatcher = kept.watch(jobQueue.events)
      #if canImport(UIKit) && !os(watchOS)
        backgroundTime = config.canRunInBackground ? BackgroundTime(events: jobQueue.events) : nil
      #endif
      adapter.owner = self
      if config.autoStart { jobQueue.start() }
    }

    deinit {
      keptWatcher.cancel()
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
      let kept = kept
      let added = report("add") { () -> Bool in
        kept.beginAdd()
        do {
          let results = try await jobQueue.add(contentsOf: objects)
          kept.endAdd(keeping: zip(results, objects).filter { $0.0.inserted }.map { ($0.0.id, $0.1) })
          return true
        } catch {
          kept.endAdd(keeping: [])
          throw error
        }
      }
      if added != nil, kept.needsPruning { pruneKeptInstances() }
      return added ?? false
    }

    /// Removes every waiting item equal to `item` (and the record of a running one, whose result
    /// is then ignored); returns how many were removed.
    ///
    /// Items added by this queue instance are compared as they were added, so `==` may use state
    /// their `Codable` conformance leaves out (the old README's item compares a UUID it does not
    /// encode). Items added before a restart, or by another instance, are compared as decoded
    /// from the database: only their encoded state can count.
    @discardableResult
    public func remove(_ item: T) -> Int {
      let jobQueue = jobQueue
      let kept = kept
      return report("remove") {
        let listing = try await Self.unfinishedJobs(jobQueue, kept: kept)
        let matching = listing.jobs.filter { $0.item == item }.map(\.id)
        let removed = try await jobQueue.remove(matching)
        kept.drop(matching)
        kept.prune(keeping: listing.existing, listedAt: listing.generation)
        return removed
      } ?? 0
    }

    /// Removes every waiting item (running ones finish).
    public func clear() {
      let jobQueue = jobQueue
      _ = report("clear") { try await jobQueue.clear() }
      pruneKeptInstances()
    }

    /// The items waiting or being handled, in the order they were added: those added by this
    /// queue instance as they were added, the others as decoded from the database.
    public var items: [T] {
      let jobQueue = jobQueue
      let kept = kept
      return report("list items") {
        let listing = try await Self.unfinishedJobs(jobQueue, kept: kept)
        kept.prune(keeping: listing.existing, listedAt: listing.generation)
        return listing.jobs.map(\.item)
      } ?? []
    }

    /// How many items are waiting or being handled.
    public var count: Int {
      let jobQueue = jobQueue
      return report("count") { try await jobQueue.count().unfinished } ?? 0
    }

    /// Whether no item is waiting or being handled.
    public var isEmpty: Bool { count == 0 }

    /// How many added instances the queue keeps for ``remove(_:)`` and ``items`` (for tests).
    var keptInstanceCount: Int { kept.count }

    /// Drops the kept instances of items whose jobs are gone (handled by another instance,
    /// removed through ``jobQueue``, dead jobs deleted).
    private func pruneKeptInstances() {
      let jobQueue = jobQueue
      let kept = kept
      _ = report("list items") {
        let listing = try await Self.unfinishedJobs(jobQueue, kept: kept)
        kept.prune(keeping: listing.existing, listedAt: listing.generation)
      }
    }

    // MARK: Control

    /// What the queue is doing: ``Bismuth/QueueState/paused`` while the pause stored in the
    /// database holds (after ``pause()``, also one made before ``start()``, at an earlier launch or
    /// by another queue on the same database), else ``Bismuth/QueueState/running`` while items
    /// wait or are handled (also while they wait for a delegate or a retry), and
    /// ``Bismuth/QueueState/idle`` when none is left or the queue was not started.
    ///
    /// Unless the queue is handling an item or already knows it is paused, this asks the database
    /// for the stored pause and whether items wait, so it blocks the calling thread as ``count``
    /// does.
    public var state: QueueState {
      let current = jobQueue.state
      switch current {
      case .paused: return .paused
      case .running: return .running
      case .stopped, .idle:
        // The loop of a queue just created has not read the stored pause yet, and a queue not
        // started never reads it: ask the database.
        let jobQueue = jobQueue
        let stored = report("read the queue's state") { () -> (paused: Bool, waiting: Bool) in
          if try await jobQueue.store.isPaused(queue: jobQueue.configuration.identifier) {
            return (true, false)
          }
          if current == .stopped { return (false, false) }
          return (false, try await jobQueue.count().unfinished > 0)
        }
        guard let stored else { return .idle }
        if stored.paused { return .paused }
        return stored.waiting ? .running : .idle
      }
    }

    /// Starts handling items (a queue created with `autoStart = false`); does nothing if started.
    public func start() {
      jobQueue.start()
    }

    /// Stops handling new items until ``resume()``; the item being handled finishes. Stored in
    /// the database, so the queue is still paused after the app restarts. A queue not started
    /// yet is paused too: ``state`` says ``Bismuth/QueueState/paused`` and ``start()`` handles
    /// nothing until ``resume()``.
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

    /// The pending and running jobs in ID (arrival) order, each with the instance this queue
    /// added, or else decoded, and the IDs of every job the queue holds (dead ones too). Undecodable
    /// ones are skipped: the engine makes them dead jobs when it reaches them.
    private static func unfinishedJobs(
      _ jobQueue: JobQueue<T>, kept: KeptInstances<T>
    ) async throws -> KeptInstances<T>.Listing {
      let generation = kept.generation
      var found: [(id: JobID, item: T)] = []
      var existing: Set<JobID> = []
      // One pass over every status in ID order, so a job that moves between waiting and running
      // meanwhile (claimed, retried elsewhere) is seen once: a Bismuth queue keeps no completed
      // jobs, so the history this reads is the few cancelled jobs. Dead jobs keep their instances
      // (a re-queued one is the item added), but are not listed.
      var after: JobID?
      while true {
        let page = try await jobQueue.jobs(after: after, limit: 500)
        let instances = kept.instances(for: page.lazy.map(\.id))
        for record in page
        where record.status == .pending || record.status == .running || record.status == .dead {
          existing.insert(record.id)
          guard record.status != .dead else { continue }
          if let instance = instances[record.id] {
            found.append((record.id, instance))
          } else if let item = try? jobQueue.item(of: record) {
            // An item that no longer decodes is not listed (the old library could not show it
            // either); the queue makes it a dead job, with the decode error, when it comes up.
            found.append((record.id, item))
          }
        }
        guard let last = page.last, page.count == 500 else { break }
        after = last.id
      }
      return KeptInstances<T>.Listing(jobs: found, existing: existing, generation: generation)
    }
  }
}

/// The items this queue instance added, by job, kept so that ``Bismuth/Queue/remove(_:)`` and
/// ``Bismuth/Queue/items`` compare and return them as they were added: `==` may use state the
/// item does not encode. An instance is dropped when its job is handled or removed. A dead job
/// keeps its instance, since `JobQueue.requeueDead` can bring it back; it goes with the dead job
/// (``Bismuth/Queue/clear()``, or found missing by a listing). Jobs that end elsewhere (another
/// instance, another process) are found missing by the next listing, and at the latest when the
/// kept instances have doubled since the last look.
final class KeptInstances<T: BismuthQueueable>: Sendable {
  /// Unfinished jobs as a listing found them.
  struct Listing: Sendable {
    var jobs: [(id: JobID, item: T)]
    /// Every job the listing saw, dead ones included: their instances are kept.
    var existing: Set<JobID>
    /// ``KeptInstances/generation`` when the listing began.
    var generation: Int
  }

  private struct State {
    var instances: [JobID: T] = [:]
    /// Adds begun and not ended.
    var addsInFlight = 0
    /// Jobs reported finished while an add was in flight and not kept (yet): the add that made
    /// one must not keep it. Emptied when no add is in flight.
    var finishedDuringAdds: Set<JobID> = []
    /// Counts the adds begun, so that a listing can tell whether one overlapped it.
    var generation = 0
    /// Prune (list the queue) once this many instances are kept.
    var pruneAt = 1024
  }

  private let state = Mutex(State())

  /// How many instances are kept (for tests).
  var count: Int { state.withLock { $0.instances.count } }

  /// Changes whenever an add begins.
  var generation: Int { state.withLock { $0.generation } }

  /// Whether enough instances are kept that a listing should look for those whose jobs ended.
  var needsPruning: Bool { state.withLock { $0.instances.count >= $0.pruneAt } }

  /// Drops the instance of every job `events` reports handled, until the task is cancelled. A
  /// job that died keeps it: it may be re-queued.
  func watch(_ events: AsyncStream<JobQueueEvent>) -> Task<Void, Never> {
    Task { [weak self] in
      for await event in events {
        switch event {
        case .succeeded(let id):
          self?.finished(id)
        default:
          break
        }
      }
    }
  }

  /// The kept instances of `ids`.
  func instances(for ids: some Sequence<JobID>) -> [JobID: T] {
    state.withLock { state in
      if state.instances.isEmpty { return [:] }
      var found: [JobID: T] = [:]
      for id in ids { if let instance = state.instances[id] { found[id] = instance } }
      return found
    }
  }

  /// Called before an add commits.
  func beginAdd() {
    state.withLock { state in
      state.addsInFlight += 1
      state.generation += 1
    }
  }

  /// Called after an add committed (or failed): keeps the instances of the jobs it inserted,
  /// unless a job already finished.
  func endAdd(keeping added: [(JobID, T)]) {
    state.withLock { state in
      for (id, item) in added where !state.finishedDuringAdds.contains(id) {
        state.instances[id] = item
      }
      state.addsInFlight -= 1
      if state.addsInFlight == 0 { state.finishedDuringAdds = [] }
    }
  }

  /// Drops the instances of removed jobs.
  func drop(_ ids: [JobID]) {
    state.withLock { state in
      for id in ids { state.instances[id] = nil }
    }
  }

  /// Drops the instances of jobs not in `existing`, unless an add overlapped the listing that
  /// found them (its job may be missing from it).
  ///
  /// - Parameters:
  ///   - existing: The IDs of the queue's jobs (waiting, running or dead).
  ///   - generation: ``generation`` when the listing began.
  func prune(keeping existing: Set<JobID>, listedAt generation: Int) {
    state.withLock { state in
      guard state.addsInFlight == 0, state.generation == generation else {
        // Adds overlapped the listing: look again after a thousand more, not after each.
        state.pruneAt = max(state.pruneAt, state.instances.count + 1024)
        return
      }
      if !state.instances.isEmpty {
        state.instances = state.instances.filter { existing.contains($0.key) }
      }
      // The next look is due when the kept instances have doubled, or outgrown the queue: a
      // listing's cost is spread over at least as many adds as it lists jobs.
      state.pruneAt = max(1024, 2 * state.instances.count, existing.count)
    }
  }

  /// Drops the instance of a job that was handled.
  func finished(_ id: JobID) {
    state.withLock { state in
      if state.instances.removeValue(forKey: id) == nil, state.addsInFlight > 0 {
        state.finishedDuringAdds.insert(id)
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
