import CSQLite
import Conveyor
import ConveyorTestSupport
import Dispatch
import Foundation
import Synchronization
import Testing

@testable import ConveyorSQLite

/// A clock that cancels the task reading it: the store reads the clock inside its transaction, so
/// the cancellation arrives mid-transaction, after `BEGIN IMMEDIATE` and before `COMMIT`.
private struct CancellingClock: JobClock {
  func now() -> Date {
    withUnsafeCurrentTask { $0?.cancel() }
    return epoch
  }
  func sleep(until deadline: Date) async throws { try await Task.sleep(for: .milliseconds(1)) }
}

/// A count shared between tasks and threads.
private final class Count: Sendable {
  private let storage = Atomic<Int>(0)
  var value: Int { storage.load(ordering: .acquiring) }
  func add() { storage.add(1, ordering: .acquiringAndReleasing) }
}

/// A value shared between tasks and threads.
private final class Shared<Value: Sendable>: Sendable {
  private let storage: Mutex<Value>
  init(_ value: Value) { storage = Mutex(value) }
  func update<T>(_ body: (inout Value) -> T) -> T { storage.withLock { body(&$0) } }
}

/// Review probes for issue 11 (inline hot calls, group commit, checkpoints on the store's thread).
@Suite("Review 11b: SQLite inline calls and group commit", .timeLimit(.minutes(2)))
struct Review11bTests {
  /// The payloads of every job in the file, as another connection sees them.
  private static func payloads(_ path: String) throws -> [String] {
    let other = try Connection(path: path, create: false)
    var all: [String] = []
    try other.query("SELECT payload FROM jobs ORDER BY id") {
      all.append(String(decoding: $0.data(0), as: UTF8.self))
    }
    return all
  }

  /// Fixed (failed before the fix: SQLite can report `SQLITE_INTERRUPT` from a `COMMIT` that
  /// committed, when the progress handler runs at its end; see `InterruptFlag`).
  /// Promise: a cancelled call interrupts its statement and nothing is committed. An add whose
  /// task is cancelled mid-transaction either commits and returns, or throws `CancellationError`
  /// and leaves nothing behind.
  @Test func aCancelledAddThatThrowsCommittedNothing() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("cancel-add.sqlite")
    let store = try SQLiteJobStore(path: path)
    var cancelled: [String] = []
    var returned = 0
    for index in 0..<3_000 {
      let outcome = await Task { () -> Bool? in
        do {
          _ = try await store.enqueue(
            [NewJob(payload: payload("job-\(index)"), runAt: epoch)], queue: "jobs", clock: CancellingClock())
          return false
        } catch is CancellationError {
          return true
        } catch {
          Issue.record("add \(index) failed with \(error)")
          return nil
        }
      }.value
      if outcome == true { cancelled.append("job-\(index)") }
      if outcome == false { returned += 1 }
    }
    let stored = Set(try Self.payloads(path))
    let committedAnyway = cancelled.filter(stored.contains)
    #expect(
      committedAnyway.isEmpty,
      """
      \(committedAnyway.count) of \(cancelled.count) adds that threw CancellationError were committed \
      (\(committedAnyway.prefix(5))); \(returned) returned normally
      """)
    await store.close()
  }

  /// Fixed (failed before the fix, as above).
  /// The same for claims: a claim that throws `CancellationError` claimed nothing, so the running
  /// count equals the jobs the returned batches hold.
  @Test func aCancelledClaimThatThrowsClaimedNothing() async throws {
    let folder = try TemporaryFolder()
    let store = try SQLiteJobStore(path: folder.path("cancel-claim.sqlite"))
    let jobs = (0..<1_500).map { NewJob(payload: payload("\($0)"), runAt: epoch) }
    _ = try await store.enqueue(jobs, queue: "jobs", now: epoch)
    var claimedByCallers = 0
    var threw = 0
    for _ in 0..<1_500 {
      let claimed = await Task { () -> Int? in
        do {
          return try await store.settleAndClaim(
            [], queue: "jobs", limit: 1, lease: lease(), clock: CancellingClock()
          ).claimed.count
        } catch is CancellationError {
          return nil
        } catch {
          Issue.record("claim failed with \(error)")
          return nil
        }
      }.value
      if let claimed { claimedByCallers += claimed } else { threw += 1 }
    }
    let running = try await store.counts(queue: "jobs", now: epoch).running
    #expect(
      running == claimedByCallers,
      """
      \(running) jobs are running but the callers got \(claimedByCallers) \
      (\(threw) claims threw CancellationError): \(running - claimedByCallers) claims were \
      committed for callers told they were cancelled
      """)
    await store.close()
  }

  /// While another connection holds the write lock for 2 s, 16 tasks keep adding (one job per
  /// call, some keys shared), and a claim, `isPaused` and `nextWake` are called: no caller is
  /// stuck, and every job is committed exactly once.
  @Test(arguments: SQLiteJobStore.Synchronous.allCases)
  func anotherConnectionsLockHoldsNoPoolThreadAndLosesNothing(_ synchronous: SQLiteJobStore.Synchronous)
    async throws
  {
    let folder = try TemporaryFolder()
    let path = folder.path("held.sqlite")
    let store = try SQLiteJobStore(
      path: path, options: .init(synchronous: synchronous, busyTimeout: .seconds(60)))
    _ = try await store.enqueue([NewJob(payload: payload("seed"), runAt: epoch)], queue: "jobs", now: epoch)

    let ticks = Count()
    let ticker = Task {
      while !Task.isCancelled {
        try? await Task.sleep(for: .milliseconds(5))
        ticks.add()
      }
    }
    defer { ticker.cancel() }

    let locked = DispatchSemaphore(value: 0)
    let ticksWhileHeld = Shared<[Int]>([0, 0])
    let holder = Thread {
      let other = try! Connection(path: path, create: false)
      other.setLockWait(milliseconds: 60_000)
      try! other.execute("BEGIN IMMEDIATE")
      ticksWhileHeld.update { $0[0] = ticks.value }
      locked.signal()
      Thread.sleep(forTimeInterval: 2)
      ticksWhileHeld.update { $0[1] = ticks.value }
      try! other.execute("COMMIT")
    }
    holder.start()
    try await onOwnThread(name: "test-locked") { locked.wait() }

    let adders = (0..<16).map { task in
      Task { () throws -> [(String, EnqueueResult)] in
        var results: [(String, EnqueueResult)] = []
        for call in 0..<10 {
          let name = "t\(task)-c\(call)"
          let key = call % 5 == 0 ? "shared-\(call)" : nil
          let result = try await store.enqueue(
            [NewJob(payload: payload(name), runAt: epoch, deduplicationKey: key)], queue: "jobs", now: epoch)
          results.append((name, result[0]))
        }
        return results
      }
    }
    let others = Task {
      _ = try await store.isPaused(queue: "jobs")
      _ = try await store.nextWake(queue: "jobs", clock: FixedJobClock(epoch))
      return try await store.settleAndClaim([], queue: "jobs", limit: 1, lease: lease(), now: epoch).claimed
        .count
    }

    var all: [(String, EnqueueResult)] = []
    for adder in adders { all += try await adder.value }
    #expect(try await others.value == 1)
    // The ticks are logged, not asserted: they measure the whole test process's pool, which other
    // suites running beside this one (spawning processes, filling tables) also hold; that this
    // store's calls wait off the pool is `callsWaitingForAnotherConnectionsLockWaitOffThePool`.
    let held = ticksWhileHeld.update { $0 }
    print("timer ticks while another connection held the lock: \(held[1] - held[0])")

    let stored = try Self.payloads(path)
    #expect(stored.count == Set(stored).count, "a job was committed twice")
    let inserted = all.filter { $0.1.inserted }
    #expect(Set(inserted.map(\.0)) == Set(stored).subtracting(["seed"]), "inserted jobs and the file differ")
    #expect(Set(inserted.map(\.1.id)).count == inserted.count)
    // Each shared key was inserted once; the other adds of it got that job's ID.
    for call in [0, 5] {
      let keyed = all.filter { $0.0.hasSuffix("-c\(call)") }
      #expect(
        keyed.filter(\.1.inserted).count == 1,
        "key shared-\(call) inserted \(keyed.filter(\.1.inserted).count) times")
      #expect(Set(keyed.map(\.1.id)).count == 1)
    }
    await store.close()
  }

  /// `close()` while calls wait in a group and more calls (inline and grouped) arrive: every caller
  /// resumes, with its jobs committed exactly when it succeeded, and the file holds nothing else.
  @Test func closeRacingAGroupAndInlineCalls() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("close.sqlite")
    let store = try SQLiteJobStore(path: path)
    _ = try await store.enqueue([NewJob(payload: payload("seed"), runAt: epoch)], queue: "jobs", now: epoch)

    let gate = try await holdConnection(of: store)
    defer { gate.signal() }

    func adder(_ name: String) -> Task<Bool, Never> {
      Task {
        do {
          _ = try await store.enqueue(
            [NewJob(payload: payload(name), runAt: epoch)], queue: "jobs", now: epoch)
          return true
        } catch {
          return false
        }
      }
    }
    let early = (0..<12).map { adder("early-\($0)") }
    try await eventually("the early adds wait in a group") { store.groups.waitingCount == 12 }
    let closer = Task { await store.close() }
    let late = (0..<24).map { index in
      Task { () -> Bool in
        if index.isMultiple(of: 3) {
          _ = try? await store.isPaused(queue: "jobs")
          _ = try? await store.settleAndClaim([], queue: "jobs", limit: 1, lease: lease(), now: epoch)
        }
        return await adder("late-\(index)").value
      }
    }
    gate.signal()
    await closer.value

    var succeeded: Set<String> = []
    for (index, task) in early.enumerated() where await task.value { succeeded.insert("early-\(index)") }
    for (index, task) in late.enumerated() where await task.value { succeeded.insert("late-\(index)") }
    #expect(succeeded.count >= 12, "the early adds, submitted before close(), must commit")
    await #expect(throws: SQLiteJobStoreError.self) {
      _ = try await store.enqueue(
        [NewJob(payload: payload("after"), runAt: epoch)], queue: "jobs", now: epoch)
    }
    let stored = try Self.payloads(path)
    #expect(stored.count == Set(stored).count, "a job was committed twice")
    #expect(Set(stored) == succeeded.union(["seed"]), "the file differs from what the callers were told")
  }

  /// One key repeated inside one call, across the calls of one group, and across two groups:
  /// one job is inserted, every other add gets its ID.
  @Test func aKeyRepeatedWithinAndAcrossGroupsIsInsertedOnce() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("dedup.sqlite")
    let store = try SQLiteJobStore(path: path)
    var all: [EnqueueResult] = []
    for round in 0..<2 {
      let gate = try await holdConnection(of: store)
      let adders = (0..<6).map { index in
        Task {
          try await store.enqueue(
            [
              NewJob(payload: payload("r\(round)-\(index)-a"), runAt: epoch, deduplicationKey: "k"),
              NewJob(payload: payload("r\(round)-\(index)-b"), runAt: epoch),
              NewJob(payload: payload("r\(round)-\(index)-c"), runAt: epoch, deduplicationKey: "k"),
            ], queue: "jobs", now: epoch)
        }
      }
      do {
        try await eventually("the adds wait in a group") { store.groups.waitingCount == 6 }
      } catch {
        gate.signal()
        throw error
      }
      gate.signal()
      for adder in adders {
        let results = try await adder.value
        #expect(results.count == 3)
        #expect(results[1].inserted)
        all += [results[0], results[2]]
      }
    }
    #expect(all.filter(\.inserted).count == 1, "key k inserted \(all.filter(\.inserted).count) times")
    #expect(Set(all.map(\.id)).count == 1)
    #expect(store.groups.groupsCommitted >= 2)
    let other = try Connection(path: path, create: false)
    #expect(try other.scalar("SELECT count(*) FROM jobs WHERE dedup_key = 'k'") == 1)
    #expect(try other.scalar("SELECT count(*) FROM jobs") == 13)
    await store.close()
  }

  /// The limits, exactly: 32 jobs of 64 KiB in all (payloads and keys) commit on the caller's
  /// thread; 33 jobs, or one byte more, on the store's; 32 settlements with a limit of 32 on the
  /// caller's, a limit of 33 on the store's.
  @Test func theInlineLimitsAreExact() async throws {
    let folder = try TemporaryFolder()
    let store = try makeStore(folder, name: "limits.sqlite")
    let (commits, storeThread) = try await InlineSafetyTests.recordCommits(of: store)
    func ranInline() -> Bool? {
      let all = commits.all
      commits.clear()
      guard all.count == 1 else { return nil }
      return all[0] != storeThread
    }
    // 32 jobs: 31 × 2,000 bytes + keys, the last filling 64 KiB exactly.
    func jobs(count: Int, total: Int, tag: String) -> [NewJob] {
      var made: [NewJob] = []
      var used = 0
      for index in 0..<count {
        let key = "\(tag)-\(index)"
        let size = index == count - 1 ? total - used - key.utf8.count : 1_000
        used += size + key.utf8.count
        made.append(NewJob(payload: Data(repeating: 1, count: size), runAt: epoch, deduplicationKey: key))
      }
      return made
    }
    _ = try await store.enqueue(jobs(count: 32, total: 65_536, tag: "a"), queue: "jobs", now: epoch)
    #expect(ranInline() == true, "32 jobs of 64 KiB did not commit on the caller's thread")
    _ = try await store.enqueue(jobs(count: 32, total: 65_537, tag: "b"), queue: "jobs", now: epoch)
    #expect(ranInline() == false, "64 KiB + 1 committed on the caller's thread")
    try await eventually("the group flush ended") { store.groups.isIdle }
    _ = try await store.enqueue(jobs(count: 33, total: 40_000, tag: "c"), queue: "jobs", now: epoch)
    #expect(ranInline() == false, "33 jobs committed on the caller's thread")
    // The group's next flush lingers on the connection for a moment after a grouped add.
    try await eventually("the group flush ended") { store.groups.isIdle }

    let claimed = try await store.settleAndClaim([], queue: "jobs", limit: 32, lease: lease(), now: epoch)
    #expect(claimed.claimed.count == 32)
    #expect(ranInline() == true, "a claim of 32 did not commit on the caller's thread")
    _ = try await store.settleAndClaim(
      claimed.claimed.map { JobSettlement(claim: $0.claim, action: .complete) }, queue: "jobs", limit: 32,
      lease: lease(), now: epoch)
    #expect(ranInline() == true, "32 settlements and a claim of 32 did not commit on the caller's thread")
    _ = try await store.settleAndClaim([], queue: "jobs", limit: 33, lease: lease(), now: epoch)
    #expect(ranInline() == false, "a claim of 33 committed on the caller's thread")
    await store.close()
  }

  /// Two stores (two connections, as two processes would be) adding to one file at once: each
  /// checkpoints on its own thread, and the WAL file stays bounded. (Concurrent writers defeat
  /// PASSIVE checkpoints for a while with SQLite's own auto-checkpoint too: four plain connections
  /// doing the same reached 8,698 frames; two stores here reached up to 3,861.)
  @Test func twoWritersKeepTheWALBounded() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("two.sqlite")
    let first = try SQLiteJobStore(path: path)
    let second = try SQLiteJobStore(path: path)
    let pageSize = Int(try await first.connection.perform { try $0.scalar("PRAGMA page_size") } ?? 4_096)
    let body = Data(repeating: 7, count: 8_000)
    let largestWAL = Shared(0)
    let writers = [first, second].flatMap { store in
      (0..<2).map { _ in
        Task {
          for _ in 0..<400 {
            _ = try await store.enqueue([NewJob(payload: body, runAt: epoch)], queue: "jobs", now: epoch)
            let frames = InlineSafetyTests.walFrames(path, pageSize: pageSize)
            largestWAL.update { $0 = max($0, frames) }
          }
        }
      }
    }
    for writer in writers { try await writer.value }
    let threshold = Int(SerializedConnection.defaultCheckpointPages)
    let largest = largestWAL.update { $0 }
    #expect(largest < 10 * threshold, "the WAL grew to \(largest) frames (threshold \(threshold))")
    #expect(try await first.counts(queue: "jobs", now: epoch).ready == 1_600)
    await first.close()
    await second.close()
  }
}
