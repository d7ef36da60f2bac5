import CSQLite
import Conveyor
import ConveyorTestSupport
import Dispatch
import Foundation
import Synchronization
import Testing

@testable import ConveyorSQLite

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// An identifier of the calling thread.
private func currentThread() -> UInt {
  #if canImport(Darwin)
    UInt(bitPattern: pthread_self())
  #else
    UInt(pthread_self())
  #endif
}

/// What may run on the caller's thread (Swift's cooperative pool): only the short statements of a
/// small hot call. Commits that sync the disk, large calls and WAL checkpoints run on the store's
/// thread. Where a commit ran is read from SQLite's commit hook, never from timings.
@Suite("SQLiteJobStore: what runs on the caller's thread", .timeLimit(.minutes(10)))
struct InlineSafetyTests {
  /// The threads on which a connection's transactions committed, in order.
  final class CommitThreads: Sendable {
    private let threads = Mutex<[UInt]>([])
    var all: [UInt] { threads.withLock { $0 } }
    func add(_ thread: UInt) { threads.withLock { $0.append(thread) } }
    func clear() { threads.withLock { $0.removeAll() } }
  }

  /// Records the thread of every commit of `store`'s connection from now on; returns the record
  /// and the store's own thread.
  static func recordCommits(of store: SQLiteJobStore) async throws -> (CommitThreads, storeThread: UInt) {
    let record = CommitThreads()
    // Kept for the process's life: SQLite may call the hook until the connection closes.
    let context = UInt(bitPattern: Unmanaged.passRetained(record).toOpaque())
    let storeThread = try await store.connection.perform { db -> UInt in
      sqlite3_commit_hook(
        db.handle,
        { context in
          Unmanaged<CommitThreads>.fromOpaque(context!).takeUnretainedValue().add(currentThread())
          return 0
        }, UnsafeMutableRawPointer(bitPattern: context))
      return currentThread()
    }
    return (record, storeThread)
  }

  /// The size of the file at `path` in bytes (0 when missing).
  static func fileSize(_ path: String) -> Int {
    (try? FileManager.default.attributesOfItem(atPath: path)[.size] as? Int) ?? 0
  }

  /// How many frames the `-wal` file beside `path` has room for: how far the WAL grew since it
  /// was created (SQLite starts a checkpointed WAL file over without shrinking it).
  static func walFrames(_ path: String, pageSize: Int) -> Int {
    max(0, fileSize(path + "-wal") - 32) / (pageSize + 24)
  }

  /// The calls of the hot path, once each, on a queue holding a ready job.
  static func hotCalls(_ store: SQLiteJobStore) async throws {
    _ = try await store.enqueue([NewJob(payload: payload("one"), runAt: epoch)], queue: "jobs", now: epoch)
    let batch = try await store.settleAndClaim([], queue: "jobs", limit: 1, lease: lease(), now: epoch)
    let claim = try #require(batch.claimed.first)
    _ = try await store.settleAndClaim(
      [JobSettlement(claim: claim.claim, action: .complete)], queue: "jobs", limit: 1, lease: lease(),
      now: epoch)
    _ = try await store.isPaused(queue: "jobs")
    _ = try await store.nextWake(queue: "jobs", clock: FixedJobClock(epoch))
  }

  /// With `synchronous=FULL` every commit syncs the disk, so no call runs on the caller's thread;
  /// with NORMAL the same calls commit on the caller's thread (which shows the record sees it).
  @Test(arguments: SQLiteJobStore.Synchronous.allCases)
  func commitsThatSyncTheDiskRunOnTheStoresThread(_ synchronous: SQLiteJobStore.Synchronous) async throws {
    let folder = try TemporaryFolder()
    let store = try SQLiteJobStore(path: folder.path("sync.sqlite"), options: .init(synchronous: synchronous))
    let (commits, storeThread) = try await Self.recordCommits(of: store)
    try await Self.hotCalls(store)
    #expect(commits.all.count >= 3, "an enqueue, a claim and a settlement commit")
    let elsewhere = commits.all.filter { $0 != storeThread }.count
    switch synchronous {
    case .full:
      #expect(elsewhere == 0, "\(elsewhere) of \(commits.all.count) commits ran on the caller's thread")
      #expect(await store.connection.tryInline { _ in true } == nil)
    case .normal:
      #expect(elsewhere > 0, "no commit ran on the caller's thread")
    }
  }

  /// An enqueue of many jobs or of a large payload, and a claim of many jobs, are many statements:
  /// they commit on the store's thread, while a small enqueue still commits on the caller's.
  @Test func largeCallsRunOnTheStoresThread() async throws {
    let folder = try TemporaryFolder()
    let store = try makeStore(folder)
    let (commits, storeThread) = try await Self.recordCommits(of: store)

    _ = try await store.enqueue([NewJob(payload: payload("small"), runAt: epoch)], queue: "jobs", now: epoch)
    #expect(commits.all.count == 1)
    #expect(commits.all.allSatisfy { $0 != storeThread }, "a small enqueue ran on the store's thread")

    commits.clear()
    let many = (0..<1_000).map { NewJob(payload: payload("\($0)"), runAt: epoch) }
    _ = try await store.enqueue(many, queue: "jobs", now: epoch)
    _ = try await store.enqueue(
      [NewJob(payload: Data(repeating: 1, count: 1_000_000), runAt: epoch)], queue: "jobs", now: epoch)
    let batch = try await store.settleAndClaim([], queue: "jobs", limit: 500, lease: lease(), now: epoch)
    #expect(batch.claimed.count == 500)
    _ = try await store.settleAndClaim(
      batch.claimed.map { JobSettlement(claim: $0.claim, action: .complete) }, queue: "jobs", limit: 0,
      lease: lease(), now: epoch)
    #expect(commits.all.count == 4)
    #expect(
      commits.all.allSatisfy { $0 == storeThread },
      "\(commits.all.filter { $0 != storeThread }.count) large calls committed on the caller's thread")
  }

  /// The commit that makes the WAL file reach SQLite's checkpoint threshold does not checkpoint
  /// (write the database file) on the caller's thread: with the store's thread held, inline adds
  /// fill the WAL past the threshold and the database file keeps its size; once the thread is
  /// free, the checkpoint runs there and the database file grows.
  @Test func theWALIsCheckpointedOnTheStoresThreadNotTheCallers() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("checkpoint.sqlite")
    let store = try makeStore(folder, name: "checkpoint.sqlite")
    let pageSize = Int(try await store.connection.perform { try $0.scalar("PRAGMA page_size") } ?? 4_096)
    let threshold = Int(SerializedConnection.defaultCheckpointPages)
    let sizeBefore = Self.fileSize(path)

    let gate = DispatchSemaphore(value: 0)
    let held = Atomic<Bool>(false)
    store.connection.submitWithoutConnection {
      held.store(true, ordering: .releasing)
      gate.wait()
    }
    // Released however the test ends (a second signal is harmless): a call left waiting for the
    // thread would otherwise hang the test run.
    defer { gate.signal() }
    try await eventually("the store's thread is held") { held.load(ordering: .acquiring) }
    // Small adds, each committed on the caller's thread (the store's thread is held); an add that
    // did not run inline fails the test instead of waiting for the thread.
    let body = Data(repeating: 7, count: 8_000)
    let clock = FixedJobClock(epoch)
    var adds = 0
    while Self.walFrames(path, pageSize: pageSize) < threshold && adds < 10 * threshold {
      let result = await store.connection.tryInline { db in
        try SQLiteJobStore.commitAlone(
          [NewJob(payload: body, runAt: epoch)], queue: "jobs", clock: clock, db: db)
      }
      _ = try #require(result, "add \(adds + 1) did not run on the caller's thread").get()
      adds += 1
    }
    let walFrames = Self.walFrames(path, pageSize: pageSize)
    let sizeAtThreshold = Self.fileSize(path)
    gate.signal()
    #expect(walFrames >= threshold, "\(adds) adds left \(walFrames) WAL frames")
    #expect(
      sizeAtThreshold == sizeBefore,
      "the database file grew from \(sizeBefore) to \(sizeAtThreshold) bytes: a checkpoint ran on the caller's thread"
    )

    // A call on the store's thread runs after the checkpoint submitted before it.
    #expect(try await store.counts(queue: "jobs", now: epoch).ready == adds)
    #expect(Self.fileSize(path) > sizeBefore + adds * 8_000 / 2, "no checkpoint ran on the store's thread")
  }

  /// Many adds on the caller's thread (no automatic checkpoint there) keep the WAL file bounded:
  /// the checkpoint the store's thread runs lets the WAL start over near SQLite's threshold.
  @Test func theWALStaysBoundedUnderInlineAdds() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("bounded.sqlite")
    let store = try makeStore(folder, name: "bounded.sqlite")
    let pageSize = Int(try await store.connection.perform { try $0.scalar("PRAGMA page_size") } ?? 4_096)
    let threshold = Int(SerializedConnection.defaultCheckpointPages)
    let body = Data(repeating: 7, count: 8_000)
    let adds = 4 * threshold  // at least three pages each: twelve thresholds' worth of WAL
    for _ in 0..<adds {
      _ = try await store.enqueue([NewJob(payload: body, runAt: epoch)], queue: "jobs", now: epoch)
    }
    let frames = Self.walFrames(path, pageSize: pageSize)
    #expect(
      frames < 2 * threshold, "the WAL file grew to \(frames) frames (\(Self.fileSize(path + "-wal")) bytes)")
    #expect(try await store.counts(queue: "jobs", now: epoch).ready == adds)
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
    // Before a call that must run on the caller's thread: a call that finds the connection held
    // (the store's thread ending a group's flush) waits only 500 µs for it, then goes to the
    // store's thread; on a loaded machine the flush once held it longer, and the claim of 32
    // went there.
    func connectionFree() async throws {
      try await eventually("the connection is free") { store.groups.isIdle && !store.connection.isOccupied }
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
    try await connectionFree()
    _ = try await store.enqueue(jobs(count: 32, total: 65_536, tag: "a"), queue: "jobs", now: epoch)
    #expect(ranInline() == true, "32 jobs of 64 KiB did not commit on the caller's thread")
    _ = try await store.enqueue(jobs(count: 32, total: 65_537, tag: "b"), queue: "jobs", now: epoch)
    #expect(ranInline() == false, "64 KiB + 1 committed on the caller's thread")
    try await eventually("the group flush ended") { store.groups.isIdle }
    _ = try await store.enqueue(jobs(count: 33, total: 40_000, tag: "c"), queue: "jobs", now: epoch)
    #expect(ranInline() == false, "33 jobs committed on the caller's thread")
    // The group's next flush lingers on the connection for a moment after a grouped add.
    try await connectionFree()
    let claimed = try await store.settleAndClaim([], queue: "jobs", limit: 32, lease: lease(), now: epoch)
    #expect(claimed.claimed.count == 32)
    #expect(ranInline() == true, "a claim of 32 did not commit on the caller's thread")
    try await connectionFree()
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
