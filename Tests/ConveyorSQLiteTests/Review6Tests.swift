import CSQLite
import Conveyor
import ConveyorTestSupport
import Dispatch
import Foundation
import Synchronization
import Testing

@testable import ConveyorSQLite

// Review 6, probes of promise 4: `performInline` waits for a busy connection on the caller's
// thread for a bounded time, then hands the call to the store's thread; the `occupied` flag;
// cancellation; close; the hand-over on SQLITE_BUSY. No timing assertions: waits are bounds a
// hang blows through.

private final class R6Count: Sendable {
  private let value = Atomic<Int>(0)
  var count: Int { value.load(ordering: .acquiring) }
  func add(_ n: Int = 1) { value.add(n, ordering: .acquiringAndReleasing) }
}

private final class R6IDs: Sendable {
  private let ids = Mutex<[JobID: Int]>([:])
  func add(_ id: JobID) { ids.withLock { $0[id, default: 0] += 1 } }
  var all: [JobID: Int] { ids.withLock { $0 } }
}

/// Aborts the process with a message if not signalled in time (a starved pool cannot run the
/// suite's time limit either).
private func r6Watchdog(_ what: String, seconds: Int = 90) -> DispatchSemaphore {
  let done = DispatchSemaphore(value: 0)
  Thread.detachNewThread {
    if done.wait(timeout: .now() + .seconds(seconds)) == .timedOut {
      FileHandle.standardError.write(Data("Review6 watchdog: \(what) hung for \(seconds) s\n".utf8))
      abort()
    }
  }
  return done
}

@Suite("Review6: SQLite inline calls", .timeLimit(.minutes(2)))
struct Review6SQLiteTests {
  /// Many tasks claim and complete small batches inline, contending for the connection, while
  /// other tasks use the store's thread: every job is claimed exactly once and the store ends
  /// empty.
  @Test(arguments: [2, 8, 16])
  func contendedInlineClaimsClaimEveryJobOnce(workers: Int) async throws {
    let watchdog = r6Watchdog("contended claims")
    defer { watchdog.signal() }
    let folder = try TemporaryFolder()
    let store = try makeStore(folder)
    let total = 1_500
    for start in stride(from: 0, to: total, by: 500) {
      _ = try await store.enqueue(
        (start..<start + 500).map { NewJob(payload: payload("\($0)"), runAt: epoch) }, queue: "jobs",
        now: epoch)
    }
    let claimed = R6IDs()
    let stop = R6Count()
    // Calls on the store's thread beside them.
    let others = Task {
      while stop.count == 0 {
        _ = try await store.counts(queue: "jobs", now: epoch)
        _ = try await store.jobs(queue: "jobs", status: .running, after: nil, limit: 5)
      }
    }
    let tasks = (0..<workers).map { index in
      Task {
        var held: [JobRecord] = []
        while true {
          let batch = try await store.settleAndClaim(
            held.map { JobSettlement(claim: $0.claim, action: .complete) }, queue: "jobs",
            limit: 1 + index % 4, lease: lease("w\(index)"), now: epoch)
          #expect(batch.staleSettlements.isEmpty)
          for job in batch.claimed { claimed.add(job.id) }
          _ = try await store.isPaused(queue: "jobs")
          if batch.claimed.isEmpty { break }
          held = batch.claimed
        }
      }
    }
    for task in tasks { try await task.value }
    stop.add()
    try await others.value
    let all = claimed.all
    #expect(all.count == total, "\(all.count) of \(total) jobs claimed")
    #expect(all.values.allSatisfy { $0 == 1 }, "jobs claimed twice: \(all.filter { $0.value > 1 }.count)")
    #expect(try await store.counts(queue: "jobs", now: epoch) == JobCounts())
  }

  /// Calls waiting for a connection held by a block on the store's thread, some cancelled while
  /// they wait, some while queued on the thread, some never: each ends, with CancellationError
  /// or its result, never another error and never a hang.
  @Test func cancelledWaitingCallsEndWithCancellationOrRun() async throws {
    let watchdog = r6Watchdog("cancelled waiting calls")
    defer { watchdog.signal() }
    let folder = try TemporaryFolder()
    let store = try makeStore(folder)
    _ = try await store.enqueue(
      (0..<64).map { NewJob(payload: payload("\($0)"), runAt: epoch) }, queue: "jobs", now: epoch)
    for round in 0..<5 {
      let gate = DispatchSemaphore(value: 0)
      let holding = R6Count()
      store.connection.submit { _ in
        holding.add()
        gate.wait()
      }
      try await eventually("the connection is held") { holding.count == 1 }
      let calls = (0..<24).map { index in
        Task { () -> String in
          do {
            switch index % 3 {
            case 0: _ = try await store.isPaused(queue: "jobs")
            case 1: _ = try await store.nextWake(queue: "jobs", clock: FixedJobClock(epoch))
            default:
              let batch = try await store.settleAndClaim(
                [], queue: "jobs", limit: 1, lease: lease(), now: epoch)
              // Give it back (in a task of its own: this one may be cancelled), so later rounds
              // find ready jobs.
              if let job = batch.claimed.first {
                _ = try await Task {
                  try await store.settleAndClaim(
                    [JobSettlement(claim: job.claim, action: .release(error: nil))], queue: "jobs", limit: 0,
                    lease: lease(), now: epoch)
                }.value
              }
            }
            return "ran"
          } catch is CancellationError {
            return "cancelled"
          } catch {
            return "error: \(error)"
          }
        }
      }
      // Some at once, some after they reached their wait.
      for (index, call) in calls.enumerated() where index % 4 == 0 { call.cancel() }
      try await Task.sleep(for: .milliseconds(20))
      for (index, call) in calls.enumerated() where index % 4 == 1 { call.cancel() }
      gate.signal()
      for (index, call) in calls.enumerated() where index % 4 == 2 { call.cancel() }
      for (index, call) in calls.enumerated() {
        let outcome = await call.value
        #expect(outcome == "ran" || outcome == "cancelled", "round \(round), call \(index): \(outcome)")
        if index % 4 == 3 {
          #expect(outcome == "ran", "round \(round), call \(index) never cancelled: \(outcome)")
        }
      }
    }
    #expect(try await store.counts(queue: "jobs", now: epoch).running == 0)
  }

  /// Calls cancelled at random moments while they contend for the connection among themselves
  /// (inline waits, inline runs, hand-overs): each ends; the connection stays usable.
  @Test func cancellationDuringInlineContentionNeverHangs() async throws {
    let watchdog = r6Watchdog("cancellation during contention")
    defer { watchdog.signal() }
    let folder = try TemporaryFolder()
    let store = try makeStore(folder)
    _ = try await store.enqueue(
      (0..<200).map { NewJob(payload: payload("\($0)"), runAt: epoch) }, queue: "jobs", now: epoch)
    let unexpected = Log<String>()
    for round in 0..<20 {
      let callers = (0..<8).map { index in
        Task {
          while !Task.isCancelled {
            do {
              if index.isMultiple(of: 2) {
                _ = try await store.isPaused(queue: "jobs")
              } else {
                let batch = try await store.settleAndClaim(
                  [], queue: "jobs", limit: 2, lease: lease(), now: epoch)
                if !batch.claimed.isEmpty {
                  // Not cancellable for the give-back: run it in a task of its own.
                  let back = batch.claimed.map {
                    JobSettlement(claim: $0.claim, action: .release(error: nil))
                  }
                  _ = try await Task {
                    try await store.settleAndClaim(back, queue: "jobs", limit: 0, lease: lease(), now: epoch)
                  }.value
                }
              }
            } catch is CancellationError {
              return
            } catch {
              unexpected.append("round \(round): \(error)")
              return
            }
          }
        }
      }
      try await Task.sleep(for: .milliseconds(Int64(1 + round % 5)))
      for caller in callers { caller.cancel() }
      for caller in callers { await caller.value }
    }
    #expect(unexpected.all.isEmpty, "\(unexpected.all.prefix(5))")
    #expect(try await store.isPaused(queue: "jobs") == false)
    let counts = try await store.counts(queue: "jobs", now: epoch)
    #expect(counts.ready + counts.running == 200)
  }

  /// `close()` while many calls contend inline: each call either ran or failed with the store's
  /// closed error; every call after `close()` fails with it.
  @Test func closeDuringInlineContention() async throws {
    let watchdog = r6Watchdog("close during contention")
    defer { watchdog.signal() }
    for round in 0..<10 {
      let folder = try TemporaryFolder()
      let store = try makeStore(folder)
      _ = try await store.enqueue(
        (0..<50).map { NewJob(payload: payload("\($0)"), runAt: epoch) }, queue: "jobs", now: epoch)
      let unexpected = Log<String>()
      let callers = (0..<8).map { index in
        Task {
          while true {
            do {
              if index.isMultiple(of: 2) {
                _ = try await store.isPaused(queue: "jobs")
              } else {
                _ = try await store.nextWake(queue: "jobs", clock: FixedJobClock(epoch))
                _ = try await store.settleAndClaim([], queue: "jobs", limit: 1, lease: lease(), now: epoch)
              }
            } catch let error as SQLiteJobStoreError where error.code == .closed {
              return
            } catch {
              unexpected.append("round \(round): \(type(of: error)) \(error)")
              return
            }
          }
        }
      }
      try await Task.sleep(for: .milliseconds(Int64(round % 4)))
      await store.close()
      for caller in callers { await caller.value }
      #expect(unexpected.all.isEmpty, "\(unexpected.all)")
      await #expect(throws: SQLiteJobStoreError.self) { try await store.isPaused(queue: "jobs") }
      await #expect(throws: SQLiteJobStoreError.self) {
        try await store.settleAndClaim([], queue: "jobs", limit: 1, lease: lease(), now: epoch)
      }
      await #expect(throws: SQLiteJobStoreError.self) {
        try await store.nextWake(queue: "jobs", clock: FixedJobClock(epoch))
      }
    }
  }

  /// Another connection holds the write lock (busy timeout far longer than the time limit):
  /// contending inline claims hand over to the store's thread instead of waiting for the lock
  /// on the pool; the pool stays free; all finish once the lock is released.
  @Test func contendingClaimsBehindAnotherConnectionsLockLeaveThePoolFree() async throws {
    let watchdog = r6Watchdog("claims behind another connection's lock", seconds: 100)
    defer { watchdog.signal() }
    let folder = try TemporaryFolder()
    let path = folder.path("busy.sqlite")
    let store = try SQLiteJobStore(path: path, options: .init(busyTimeout: .seconds(600)))
    _ = try await store.enqueue(
      (0..<40).map { NewJob(payload: payload("\($0)"), runAt: epoch) }, queue: "jobs", now: epoch)
    let other = try Connection(path: path, create: false)
    try other.execute("BEGIN IMMEDIATE")
    let finished = R6Count()
    let claimers = (0..<(4 * ProcessInfo.processInfo.activeProcessorCount)).map { _ in
      Task {
        let batch = try await store.settleAndClaim([], queue: "jobs", limit: 1, lease: lease(), now: epoch)
        finished.add()
        return batch.claimed.count
      }
    }
    let marker = R6Count()
    Task { marker.add() }
    try await eventually("a task on the pool ran while the claims waited") { marker.count == 1 }
    try await Task.sleep(for: .milliseconds(200))
    #expect(finished.count == 0, "a claim finished while another connection held the lock")
    try other.execute("COMMIT")
    var total = 0
    for claimer in claimers { total += try await claimer.value }
    #expect(total == claimers.count)
  }

  /// While a checkpoint waits for the store's thread, calls (even ones that found the
  /// connection busy and wait for it) go to the thread behind it.
  @Test func waitingInlineCallsDoNotRunWhileACheckpointIsScheduled() async throws {
    let watchdog = r6Watchdog("checkpoint")
    defer { watchdog.signal() }
    let folder = try TemporaryFolder()
    let path = folder.path("checkpoint.sqlite")
    let store = try makeStore(folder, name: "checkpoint.sqlite")
    let gate = DispatchSemaphore(value: 0)
    let held = R6Count()
    store.connection.submitWithoutConnection {
      held.add()
      gate.wait()
    }
    defer { gate.signal() }
    try await eventually("the store's thread is held") { held.count == 1 }
    // Fill the WAL past the threshold with inline adds: a checkpoint is then scheduled behind
    // the held thread.
    let body = Data(repeating: 7, count: 8_000)
    let clock = FixedJobClock(epoch)
    var scheduled = false
    for _ in 0..<5_000 {
      let result = await store.connection.tryInline { db in
        try SQLiteJobStore.commitAlone(
          [NewJob(payload: body, runAt: epoch)], queue: "jobs", clock: clock, db: db)
      }
      if result == nil {
        scheduled = true
        break
      }
    }
    #expect(scheduled, "no checkpoint was ever scheduled")
    // Now every call must wait for the thread: none completes while it is held.
    let done = R6Count()
    let calls = (0..<6).map { index in
      Task {
        if index.isMultiple(of: 2) {
          _ = try await store.isPaused(queue: "jobs")
        } else {
          _ = try await store.settleAndClaim([], queue: "jobs", limit: 1, lease: lease(), now: epoch)
        }
        done.add()
      }
    }
    try await Task.sleep(for: .milliseconds(200))
    #expect(done.count == 0, "\(done.count) calls ran inline while a checkpoint waited")
    gate.signal()
    for call in calls { try await call.value }
    _ = path
  }
}

private struct R6Job: Queueable, Hashable {
  var number: Int
}

private final class R6Handled: Sendable {
  private let counts = Mutex<[Int: Int]>([:])
  func add(_ key: Int) { counts.withLock { $0[key, default: 0] += 1 } }
  var all: [Int: Int] { counts.withLock { $0 } }
}

@Suite("Review6: JobQueue on SQLite with contended inline calls", .timeLimit(.minutes(2)))
struct Review6SQLiteQueueTests {
  static func config(_ concurrency: Int, prefetch: Int = 2) -> JobQueueConfiguration {
    JobQueueConfiguration(
      identifier: "jobs", retryPolicy: .fixed(.seconds(600)), concurrency: concurrency, prefetch: prefetch,
      leaseDuration: .seconds(300), pollInterval: .milliseconds(20))
  }

  /// Two stores (two connections) on one file, a queue on each: their claims meet each other's
  /// write lock (SQLITE_BUSY hands over) and their own workers' inline calls. Every job runs
  /// exactly once, with one `.started` and one `.succeeded` on the queue that ran it.
  @Test(arguments: [1, 4])
  func twoConnectionsEveryJobOnce(concurrency: Int) async throws {
    let watchdog = r6Watchdog("two connections")
    defer { watchdog.signal() }
    let folder = try TemporaryFolder()
    let first = try makeStore(folder, name: "shared.sqlite")
    let second = try makeStore(folder, name: "shared.sqlite")
    let handled = R6Handled()
    let handler: JobQueue<R6Job>.Handler = { item, _ in
      handled.add(item.number)
      return .handled
    }
    let a = try JobQueue<R6Job>(configuration: Self.config(concurrency), store: first, handler: handler)
    let b = try JobQueue<R6Job>(configuration: Self.config(concurrency), store: second, handler: handler)
    let recordA = EventRecorder(a.events)
    let recordB = EventRecorder(b.events)
    let total = 1_200
    for start in stride(from: 0, to: total, by: 100) {
      _ = try await (start / 100 % 2 == 0 ? a : b).add(
        contentsOf: (start..<start + 100).map { R6Job(number: $0) })
    }
    try await eventually("every job handled", timeout: .seconds(90)) { handled.all.count >= total }
    try await eventually("nothing left", timeout: .seconds(30)) {
      try await first.counts(queue: "jobs", now: Date()) == JobCounts()
    }
    await a.shutdown()
    await b.shutdown()
    #expect(handled.all.count == total)
    #expect(
      handled.all.values.allSatisfy { $0 == 1 }, "ran twice: \(handled.all.filter { $0.value > 1 }.count)")
    func tally(_ events: [JobQueueEvent]) -> (started: Int, succeeded: Int) {
      var started = 0
      var succeeded = 0
      for event in events {
        if case .started = event { started += 1 }
        if case .succeeded = event { succeeded += 1 }
      }
      return (started, succeeded)
    }
    let (sa, ua) = tally(recordA.events)
    let (sb, ub) = tally(recordB.events)
    #expect(sa + sb == total, "started events \(sa) + \(sb)")
    #expect(ua + ub == total, "succeeded events \(ua) + \(ub)")
  }

  /// Shutdown with no grace while workers claim inline (their store calls are cancelled): no
  /// job is left running or lost; a restart runs the rest, each job at most once in all, except
  /// a handler the shutdown interrupted, which is given back and runs again.
  @Test(arguments: [2, 4])
  func shutdownWithoutGraceLosesNoJob(concurrency: Int) async throws {
    let watchdog = r6Watchdog("shutdown without grace")
    defer { watchdog.signal() }
    for round in 0..<4 {
      let folder = try TemporaryFolder()
      let store = try makeStore(folder)
      let completed = R6Handled()
      let handler: JobQueue<R6Job>.Handler = { item, _ in
        await Task.yield()
        completed.add(item.number)
        return .handled
      }
      let queue = try JobQueue<R6Job>(
        configuration: Self.config(concurrency, prefetch: 3), store: store, handler: handler)
      let total = 600
      _ = try await queue.add(contentsOf: (0..<total).map { R6Job(number: $0) })
      try await eventually("some handled") { completed.all.count >= 50 + 60 * round }
      await queue.shutdown(gracePeriod: .zero)
      let counts = try await store.counts(queue: "jobs", now: Date())
      #expect(counts.running == 0, "round \(round): \(counts.running) jobs left running after shutdown")
      let left = counts.ready + counts.scheduled
      #expect(counts.dead == 0)
      let again = try JobQueue<R6Job>(configuration: Self.config(concurrency), store: store, handler: handler)
      await again.waitUntilFinished()
      await again.shutdown()
      #expect(
        completed.all.count == total, "round \(round): \(completed.all.count) of \(total), \(left) were left")
      #expect(try await store.counts(queue: "jobs", now: Date()) == JobCounts())
    }
  }
}

@Suite("Review6: SQLite liveness under inline contention", .timeLimit(.minutes(2)))
struct Review6SQLiteLivenessTests {
  /// Tasks that call inline in tight loops (each finding the connection mostly held by
  /// another's inline call) leave the pool able to run other tasks, and leave the store's thread
  /// able to take the connection for its calls.
  @Test func tightInlineLoopsStarveNeitherThePoolNorTheStoresThread() async throws {
    let watchdog = r6Watchdog("tight inline loops")
    defer { watchdog.signal() }
    let folder = try TemporaryFolder()
    let store = try makeStore(folder)
    _ = try await store.enqueue(
      (0..<20).map { NewJob(payload: payload("\($0)"), runAt: epoch) }, queue: "jobs", now: epoch)
    let stop = R6Count()
    let loops = (0..<8).map { index in
      Task {
        while stop.count == 0 {
          if index.isMultiple(of: 2) {
            _ = try await store.isPaused(queue: "jobs")
          } else {
            _ = try await store.settleAndClaim([], queue: "jobs", limit: 0, lease: lease(), now: epoch)
          }
        }
      }
    }
    for _ in 0..<20 {
      let marker = R6Count()
      Task { marker.add() }
      try await eventually("a task on the pool ran", timeout: .seconds(30)) { marker.count == 1 }
      // On the store's thread.
      #expect(try await store.counts(queue: "jobs", now: epoch).ready == 20)
    }
    stop.add()
    for task in loops { try await task.value }
  }
}
