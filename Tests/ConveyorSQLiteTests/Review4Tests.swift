import Conveyor
import ConveyorTestSupport
import Dispatch
import Foundation
import Synchronization
import Testing

@testable import ConveyorSQLite

/// Adversarial review of group commit without savepoints (`EnqueueGroups.swift`, `commit`).
@Suite("Review4Tests: group commit without savepoints", .serialized, .timeLimit(.minutes(2)))
struct Review4Tests {
  /// Holds the store's connection, starts one task per element of `calls` (each one call of
  /// jobs with the given keys and payload text), waits until all of them wait for one group, then
  /// releases the connection and returns each call's outcome.
  static func grouped(
    _ store: SQLiteJobStore, _ calls: [[(payload: String, key: String?)]]
  ) async throws -> [Result<[EnqueueResult], any Error>] {
    let gate = try await holdConnection(of: store)
    // One at a time, so the group holds the calls in this order.
    var adders: [Task<[EnqueueResult], any Error>] = []
    for (index, call) in calls.enumerated() {
      adders.append(
        Task { () throws -> [EnqueueResult] in
          try await store.enqueue(
            call.map { NewJob(payload: payload($0.payload), runAt: epoch, deduplicationKey: $0.key) },
            queue: "jobs", now: epoch)
        })
      try await eventually("call \(index) waits for the group") { store.groups.waitingCount == index + 1 }
    }
    gate.signal()
    var results: [Result<[EnqueueResult], any Error>] = []
    for adder in adders { results.append(await adder.result) }
    return results
  }

  // Two calls with the same key in one group, a call whose whole transaction a trigger rolls back
  // (RAISE(ROLLBACK)) or whose statement it aborts, and calls with keys of their own: the group
  // is rolled back and every call runs again alone. The second call with key "k" must get the
  // first's ID with `inserted: false`; each other call's job is committed exactly once.
  @Test(arguments: ["ABORT", "ROLLBACK", "FAIL"])
  func duplicatesWithinAGroupWithAFailingCall(_ raise: String) async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("g.sqlite")
    let store = try SQLiteJobStore(path: path)
    try Connection(path: path, create: false).execute(
      """
      CREATE TRIGGER reject BEFORE INSERT ON jobs WHEN NEW.dedup_key = 'bad'
      BEGIN SELECT RAISE(\(raise), 'rejected by the test'); END
      """)
    let results = try await Self.grouped(
      store,
      [
        [("k1", "k")], [("k2", "k")], [("m1", "m"), ("bad", "bad")], [("m2", "m")], [("n", nil)],
        [("k3", "k"), ("n2", nil)],
      ])
    let first = try results[0].get()[0]
    #expect(first.inserted)
    #expect(try results[1].get() == [EnqueueResult(id: first.id, inserted: false)])
    #expect(throws: SQLiteError.self) { try results[2].get() }
    // The failed call's "m" job is rolled back with it: the next call with key "m" inserts.
    #expect(try results[3].get()[0].inserted)
    #expect(try results[4].get()[0].inserted)
    let last = try results[5].get()
    #expect(last[0] == EnqueueResult(id: first.id, inserted: false))
    #expect(last[1].inserted)
    let other = try Connection(path: path, create: false)
    #expect(try other.scalar("SELECT count(*) FROM jobs") == 4)
    #expect(try other.scalar("SELECT count(*) FROM jobs WHERE dedup_key = 'k'") == 1)
    #expect(try other.scalar("SELECT count(*) FROM jobs WHERE dedup_key = 'm'") == 1)
    #expect(try other.scalar("SELECT count(*) FROM jobs WHERE dedup_key = 'bad'") == 0)
    await store.close()
  }

  // Fixed (failed before the fix: the skipped call got the previous call's ID as its new job): a
  // trigger that silently skips a row (RAISE(IGNORE)), as an application may install to drop
  // jobs it does not want. The skipped call committed nothing, yet `insert` answered
  // `inserted: true` with the connection's last rowid: inside a group, the ID of the job the call
  // before it inserted. Now a job that was not stored fails its call (nothing of it is added),
  // and the other calls of the group commit theirs.
  @Test func aRowSkippedByATriggerIsNotReportedAsAnotherCallsJob() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("i.sqlite")
    let store = try SQLiteJobStore(path: path)
    try Connection(path: path, create: false).execute(
      """
      CREATE TRIGGER skip BEFORE INSERT ON jobs WHEN NEW.dedup_key = 'skip'
      BEGIN SELECT RAISE(IGNORE); END
      """)
    let results = try await Self.grouped(store, [[("a", "a")], [("s", "skip")], [("c", "c")]])
    let a = try results[0].get()[0]
    let c = try results[2].get()[0]
    #expect(throws: SQLiteError.self, "a job the table did not take fails its call") { try results[1].get() }
    let other = try Connection(path: path, create: false)
    #expect(try other.scalar("SELECT count(*) FROM jobs") == 2)
    #expect(a.inserted && c.inserted && a.id != c.id)
    // The same for a call alone (the inline path), and for a batch: nothing of it is added.
    await #expect(throws: SQLiteError.self) {
      _ = try await store.enqueue(
        [NewJob(payload: payload("s"), runAt: epoch, deduplicationKey: "skip")], queue: "jobs", now: epoch)
    }
    await #expect(throws: SQLiteError.self) {
      _ = try await store.enqueue(
        [
          NewJob(payload: payload("b"), runAt: epoch, deduplicationKey: "b"),
          NewJob(payload: payload("s"), runAt: epoch, deduplicationKey: "skip"),
        ], queue: "jobs", now: epoch)
    }
    #expect(try other.scalar("SELECT count(*) FROM jobs") == 2)
    await store.close()
  }

  // The store is closed while calls wait for their group: each call either commits (and its job
  // is there) or fails; none hangs and none commits twice.
  @Test func closingWhileCallsWait() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("c.sqlite")
    let store = try SQLiteJobStore(path: path)
    let gate = try await holdConnection(of: store)
    let adders = (0..<6).map { i in
      Task { () throws -> [EnqueueResult] in
        try await store.enqueue(
          [NewJob(payload: payload("\(i)"), runAt: epoch, deduplicationKey: "k\(i)")], queue: "jobs",
          now: epoch)
      }
    }
    try await eventually("every call waits") { store.groups.waitingCount == 6 }
    let closing = Task { await store.close() }
    try await Task.sleep(for: .milliseconds(100))
    gate.signal()
    await closing.value
    var committed = 0
    for adder in adders { if case .success = await adder.result { committed += 1 } }
    let other = try Connection(path: path, create: false)
    #expect(try other.scalar("SELECT count(*) FROM jobs") == Int64(committed))
    // A call after the close fails at once.
    await #expect(throws: (any Error).self) {
      try await store.enqueue([NewJob(payload: payload("late"), runAt: epoch)], queue: "jobs", now: epoch)
    }
  }
}
