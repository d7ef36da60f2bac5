import Conveyor
import Foundation
import Synchronization

extension QueueEngineConformance {
  /// Cancelling, on every store: a waiting job never runs; a running job's handler is cancelled,
  /// in the queue instance that runs it whichever instance cancels, and it is not retried.
  static let cancelChecks: [JobStoreCheck] = [
    check("a cancelled waiting job never runs; a dead one and an unknown ID are left alone") { store in
      var configuration = configuration()
      configuration.autoStart = false
      configuration.maxAttempts = 1
      let runs = Runs()
      let queue = try JobQueue<Named>(configuration: configuration, store: store) { item, _ in
        runs.append(item.name)
        return item.name == "dies" ? .discard(reason: "no") : .handled
      }
      let dies = try await queue.add(Named(name: "dies")).id
      queue.start()
      await queue.waitUntilFinished()
      try await queue.pause()
      let waiting = try await queue.add(Named(name: "waits")).id
      let kept = try await queue.add(Named(name: "kept")).id
      let results = try await queue.cancel([waiting, dies, JobID(kept.rawValue + 100)])
      try expect(results == [.cancelledWaiting, .alreadyDead, .notFound], "answers: \(results)")
      try await queue.resume()
      await queue.waitUntilFinished()
      await queue.shutdown()
      try expect(runs.all == ["dies", "kept"], "the cancelled job never ran: \(runs.all)")
      try expect(try await store.job(dies)?.status == .dead, "the dead job is kept")
    },
    check("cancelling a running job in another queue instance cancels its handler; it is not retried") {
      store in
      var configuration = configuration()
      configuration.retryPolicy = .fixed(.zero)
      configuration.autoStart = false
      let runs = Runs()
      let worker = try JobQueue<Named>(configuration: configuration, store: store) { item, context in
        runs.append("\(item.name)\(context.attempts)")
        do {
          try await Task.sleep(for: .seconds(600))
        } catch {
          runs.append("cancelled")
          throw error
        }
        return .handled
      }
      let recorder = EventRecorder(worker.events)
      let id = try await worker.add(Named(name: "x")).id
      worker.start()
      try await waitFor("the handler to start") { runs.all == ["x1"] }
      // Another instance on the same store: another process, as far as the worker can tell.
      var otherConfiguration = configuration
      otherConfiguration.autoStart = false
      let other = try JobQueue<Named>(configuration: otherConfiguration, store: store) { _, _ in .handled }
      try expect(try await other.cancel(id) == .cancelledRunning, "cancelled while running")
      try await waitFor("the handler to be cancelled") { runs.all.contains("cancelled") }
      await worker.waitUntilFinished()
      await worker.shutdown()
      try expect(runs.all == ["x1", "cancelled"], "not retried: \(runs.all)")
      try expect(try await store.job(id)?.status == .cancelled, "kept as cancelled")
      let outcomes = recorder.events.filter {
        switch $0 {
        case .succeeded, .retryScheduled, .died: true
        default: false
        }
      }
      try expect(outcomes.isEmpty, "no outcome recorded for the cancelled attempt: \(outcomes)")
    },
    check("cancelling a job this instance runs cancels its handler without asking the store") { store in
      // Heartbeats and claim checks say the claim is still held: only the queue's own `cancel`
      // can tell the handler.
      let blind = InstrumentedJobStore(store)
      blind.hideLostClaims()
      var configuration = configuration()
      configuration.autoStart = false
      let started = Gate()
      let cancelled = Gate()
      let saw = Runs()
      let queue = try JobQueue<Named>(configuration: configuration, store: blind) { _, _ in
        started.open()
        // A handler that cannot see the store: only its task's cancellation ends it.
        await withTaskCancellationHandler {
          await cancelled.wait()
        } onCancel: {
          saw.append("cancelled")
          cancelled.open()
        }
        return .handled
      }
      let id = try await queue.add(Named(name: "x")).id
      queue.start()
      await started.wait()
      try expect(try await queue.cancel(id) == .cancelledRunning, "cancelled while running")
      try await waitFor("the handler to be cancelled") { saw.all == ["cancelled"] }
      await queue.waitUntilFinished()
      await queue.shutdown()
      try expect(try await store.job(id)?.status == .cancelled, "kept as cancelled")
    },
    check("a job cancelled after its worker took it, before its handler started, does not run on") { store in
      // The worker has the job (its claim answered, a slot taken) and is decoding its item when
      // the queue's own `cancel` comes: the handler must then never start, or be cancelled.
      let blind = InstrumentedJobStore(store)
      blind.hideLostClaims()
      var configuration = configuration()
      configuration.autoStart = false
      // The held decoding blocks its thread: the queue's own, not one of the cooperative pool's
      // (two checks held at once on a two-core machine would hold the whole pool).
      configuration.runtime.executor = OneThreadExecutor()
      let name = "held-\(UUID().uuidString)"
      let hold = HeldInDecoding.hold(name)
      defer { hold.letGo() }
      let runs = Runs()
      let queue = try JobQueue<HeldInDecoding>(configuration: configuration, store: blind) { _, _ in
        runs.append("started")
        do {
          try await Task.sleep(for: .seconds(600))
        } catch {
          runs.append("cancelled")
          throw error
        }
        return .handled
      }
      let id = try await queue.add(HeldInDecoding(name: name)).id
      queue.start()
      try await waitFor("the worker to decode the job") { hold.isReached }
      try expect(try await queue.cancel(id) == .cancelledRunning, "cancelled while its worker holds it")
      hold.letGo()
      // The worker goes on: its handler must not start, or be cancelled at once. (Two seconds for
      // it to start; five more for a started handler to see its cancellation.)
      var deadline = ContinuousClock.now + .seconds(2)
      while runs.all.isEmpty && ContinuousClock.now < deadline {
        try await Task.sleep(for: .milliseconds(20))
      }
      deadline = ContinuousClock.now + .seconds(5)
      while runs.all == ["started"] && ContinuousClock.now < deadline {
        try await Task.sleep(for: .milliseconds(20))
      }
      let seen = runs.all
      await queue.shutdown(gracePeriod: .zero)
      try expect(
        seen.isEmpty || seen == ["started", "cancelled"],
        "the cancelled job's handler ran on, uncancelled: \(seen)")
      try expect(try await store.job(id)?.status == .cancelled, "kept as cancelled")
    },
    check("a job claimed by this instance but not started, when cancelled, never starts") { store in
      // Heartbeats and claim checks say the claim is still held: only the queue's own `cancel`
      // can drop the job it holds in its buffer (on a store that tells, the next check would,
      // racing the slot that frees).
      let blind = InstrumentedJobStore(store)
      blind.hideLostClaims()
      var configuration = configuration()
      configuration.autoStart = false
      configuration.concurrency = 1
      configuration.prefetch = 1
      let runs = Runs()
      let first = Gate()
      let queue = try JobQueue<Named>(configuration: configuration, store: blind) { item, _ in
        runs.append(item.name)
        if item.name == "first" { await first.wait() }
        return .handled
      }
      _ = try await queue.add(Named(name: "first"))
      let buffered = try await queue.add(Named(name: "buffered")).id
      queue.start()
      // Both claimed at once (1 + prefetch): the second waits in this instance for the slot.
      try await waitFor("both jobs to be claimed") {
        try await store.job(buffered)?.status == .running && runs.all == ["first"]
      }
      try expect(try await queue.cancel(buffered) == .cancelledRunning, "cancelled while claimed")
      first.open()
      await queue.waitUntilFinished()
      await queue.shutdown()
      try expect(runs.all == ["first"], "the cancelled job never started: \(runs.all)")
    },
    check("waitUntilFinished returns while a cancelled job's handler ignores cancellation") { store in
      // waitUntilFinished returns "when the store holds no waiting or running job of this queue":
      // a cancelled job is finished, so nothing is left to wait for, as for a handler past its
      // time limit whose attempt is recorded.
      var configuration = configuration()
      configuration.autoStart = false
      let started = Gate()
      let release = Gate()
      let queue = try JobQueue<Named>(configuration: configuration, store: store) { _, _ in
        started.open()
        await release.wait()  // ignores cancellation
        return .handled
      }
      let id = try await queue.add(Named(name: "x")).id
      queue.start()
      await started.wait()
      try expect(try await queue.cancel(id) == .cancelledRunning, "cancelled while running")
      try expect(
        try await store.counts(queue: "engine", clock: SystemJobClock()) == JobCounts(cancelled: 1),
        "nothing unfinished stored")
      let finished = Runs()
      let waiter = Task {
        await queue.waitUntilFinished()
        finished.append("finished")
      }
      defer { waiter.cancel() }
      try await releasing(release, thenStopping: queue) {
        try await waitFor("waitUntilFinished to return though the store holds no job") {
          finished.all == ["finished"]
        }
      }
    },
    check("a cancelled job's handler that ignores cancellation is reported lost once") { store in
      // The worker keeps its slot until the handler returns; its claim must not be reported lost
      // again at every claim check and heartbeat meanwhile.
      let counted = InstrumentedJobStore(store)
      var configuration = configuration()
      configuration.autoStart = false
      configuration.concurrency = 2
      let logs = Runs()
      configuration.log = { logs.append($0.message) }
      let runs = Runs()
      let release = Gate()
      let queue = try JobQueue<Named>(configuration: configuration, store: counted) { item, _ in
        runs.append(item.name)
        await release.wait()  // ignores cancellation
        return .handled
      }
      let id = try await queue.add(Named(name: "x")).id
      // Keeps the queue holding a claim of its own, so it goes on checking.
      _ = try await queue.add(Named(name: "healthy"))
      queue.start()
      try await waitFor("both handlers to start") { runs.all.count == 2 }
      let other = try JobQueue<Named>(configuration: configuration, store: store) { _, _ in .handled }
      try expect(try await other.cancel(id) == .cancelledRunning, "cancelled while running")
      let lostLogs: @Sendable () -> Int = { logs.all.filter { $0.contains("no longer holds a job") }.count }
      try await releasing(release, thenStopping: queue) {
        try await waitFor("the loss to be reported") { lostLogs() >= 1 }
        let checks = counted.calls["currentClaims", default: 0]
        try await waitFor("three more claim checks") {
          counted.calls["currentClaims", default: 0] >= checks + 3
        }
        try expect(lostLogs() == 1, "reported once, not at every check: \(lostLogs()) times")
      }
    },
    check("a job cancelled by this instance while its claim's answer is on the way never starts") { store in
      // The store committed the claim, so the job is running there, but the answer has not reached
      // the queue when the queue cancels it. Heartbeats and claim checks say the claim is still
      // held: only the queue's own `cancel` can keep the handler from running.
      let blind = InstrumentedJobStore(store)
      blind.hideLostClaims()
      let answer = Gate()
      blind.holdNextClaimAnswer(until: answer)
      var configuration = configuration()
      configuration.autoStart = false
      let runs = Runs()
      let queue = try JobQueue<Named>(configuration: configuration, store: blind) { item, _ in
        runs.append(item.name)
        return .handled
      }
      let id = try await queue.add(Named(name: "x")).id
      queue.start()
      try await waitUntilRunning(store)
      try expect(try await queue.cancel(id) == .cancelledRunning, "cancelled while claimed")
      answer.open()
      await queue.waitUntilFinished()
      await queue.shutdown()
      try expect(runs.all.isEmpty, "the cancelled job never started: \(runs.all)")
    },
  ]

  /// Runs `body`, then opens `release` (the handlers waiting on it return) and shuts `queue`
  /// down, whether `body` threw or not.
  static func releasing<Item>(
    _ release: Gate, thenStopping queue: JobQueue<Item>, _ body: () async throws -> Void
  ) async throws {
    do {
      try await body()
    } catch {
      release.open()
      await queue.shutdown()
      throw error
    }
    release.open()
    await queue.shutdown()
  }
}

/// An item whose decoding, for a name registered with ``hold(_:)``, waits until the test lets it
/// go: a worker that has taken its job and not yet started the handler. The wait blocks the
/// decoding thread (decoding is synchronous), for 30 seconds at most.
struct HeldInDecoding: Queueable {
  var name: String

  /// The hold of one name.
  final class Hold: Sendable {
    private let reached = Atomic<Bool>(false)
    private let go = DispatchSemaphore(value: 0)
    private let released = Atomic<Bool>(false)

    /// Whether a worker is decoding the item and waits.
    var isReached: Bool { reached.load(ordering: .acquiring) }

    /// Lets the decoding go on (once; later calls do nothing).
    func letGo() {
      if !released.exchange(true, ordering: .acquiringAndReleasing) { go.signal() }
    }

    fileprivate func wait() {
      reached.store(true, ordering: .releasing)
      _ = go.wait(timeout: .now() + 30)
    }
  }

  private static let holds = Mutex<[String: Hold]>([:])

  /// Holds the next decoding of an item named `name`.
  static func hold(_ name: String) -> Hold {
    let hold = Hold()
    holds.withLock { $0[name] = hold }
    return hold
  }

  init(name: String) { self.name = name }

  private enum CodingKeys: String, CodingKey { case name }

  init(from decoder: any Decoder) throws {
    let container = try decoder.container(keyedBy: CodingKeys.self)
    name = try container.decode(String.self, forKey: .name)
    if let hold = Self.holds.withLock({ $0.removeValue(forKey: name) }) { hold.wait() }
  }
}
