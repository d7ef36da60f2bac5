import Conveyor
import ConveyorTestSupport
import Dispatch
import Foundation
import Synchronization
import Testing

@testable import ConveyorSQLite

/// Adversarial review of the flush that ends at once when calls may run inline (commit bc19902).
@Suite("Review 2: SQLite enqueue leader/flush races", .serialized, .timeLimit(.minutes(2)))
struct ReviewLeader2Tests {

  private static func storedPayloads(path: String) throws -> [String] {
    let other = try Connection(path: path, create: false)
    other.setLockWait(milliseconds: 10_000)
    var stored: [String] = []
    try other.query("SELECT payload FROM jobs") { stored.append(String(decoding: $0.data(0), as: UTF8.self)) }
    return stored
  }

  /// A flush that took its group and ended (the flush state is off) and is blocked inside its
  /// transaction: later small adds lead, find the connection held, hand over; a large add and a
  /// small add with the blocked call's key arrive too. All complete once the flush commits, keys
  /// are honoured across the two groups, and no add stays under way.
  @Test func addsArrivingWhileAnEndedFlushCommitsAreNotLost() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("jobs.sqlite")
    let store = try makeStore(folder)
    _ = try await store.enqueue([NewJob(payload: payload("seed"), runAt: epoch)], queue: "jobs", now: epoch)
    let clock = GateClock()
    // 33 jobs: not small, so it goes to the store's thread, whose flush reads the clock.
    let big = Task {
      try await store.enqueue(
        (0..<33).map {
          NewJob(payload: payload("big\($0)"), runAt: epoch, deduplicationKey: $0 == 0 ? "k" : nil)
        },
        queue: "jobs", clock: clock)
    }
    try await eventually("the flush is inside its transaction") { clock.entered }
    // The flush took the big call and ended: a new add may lead.
    #expect(store.groups.waitingCount == 0)
    #expect(store.groups.isIdle, "the flush did not end when it took its group")
    let smalls = (0..<6).map { index in
      Task {
        try await store.enqueue(
          [
            NewJob(
              payload: payload("s\(index)"), runAt: epoch, deduplicationKey: index == 0 ? "k" : "s\(index)")
          ],
          queue: "jobs", now: epoch)[0]
      }
    }
    let big2 = Task {
      try await store.enqueue(
        (0..<40).map { NewJob(payload: payload("big2-\($0)"), runAt: epoch) }, queue: "jobs", now: epoch)
    }
    try await eventually("the later adds wait") { store.groups.waitingCount == 7 }
    #expect(!store.groups.isIdle)
    clock.open()
    let first = try await big.value
    #expect(first.count == 33 && first.allSatisfy(\.inserted))
    var ids: [JobID] = []
    for (index, small) in smalls.enumerated() {
      let result = try await small.value
      if index == 0 {
        #expect(result == EnqueueResult(id: first[0].id, inserted: false), "key k was inserted twice")
      } else {
        #expect(result.inserted)
        #expect(try isCommitted(result.id, path: path))
        ids.append(result.id)
      }
    }
    #expect(try await big2.value.count == 40)
    #expect(try scalar("SELECT count(*) FROM jobs", path: path) == 1 + 33 + 5 + 40)
    #expect(await eventually(timeout: .seconds(90)) { store.groups.isIdle }, "an add stays under way")
    // A lone adder commits inline again.
    let taken = store.groups.callsTaken
    for index in 0..<10 {
      _ = try await store.enqueue(
        [NewJob(payload: payload("lone\(index)"), runAt: epoch)], queue: "jobs", now: epoch)
    }
    #expect(store.groups.callsTaken == taken)
  }

  /// Closing the store while an ended flush is blocked in its transaction and other adds (small and
  /// large) wait or lead: every call is resumed, committed or with `closed`.
  @Test(arguments: [SQLiteJobStore.Synchronous.normal, .full])
  func closingWhileAFlushCommitsResumesEveryCall(_ synchronous: SQLiteJobStore.Synchronous) async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("jobs.sqlite")
    let store = try makeStore(folder, options: .init(synchronous: synchronous))
    let clock = GateClock()
    let big = Task {
      try await store.enqueue(
        (0..<33).map { NewJob(payload: payload("big\($0)"), runAt: epoch) }, queue: "jobs", clock: clock)
    }
    try await eventually("the flush is inside its transaction") { clock.entered }
    let others = (0..<6).map { index in
      Task {
        try await store.enqueue(
          index == 3
            ? (0..<40).map { NewJob(payload: payload("o\(index)-\($0)"), runAt: epoch) }
            : [NewJob(payload: payload("o\(index)"), runAt: epoch)],
          queue: "jobs", now: epoch)
      }
    }
    try await eventually("the others wait") { store.groups.waitingCount == 6 }
    let closing = Task { await store.close() }
    try await Task.sleep(for: .milliseconds(20))
    // More adds after close was called, before it ran.
    let late = (0..<3).map { index in
      Task {
        try await store.enqueue(
          [NewJob(payload: payload("late\(index)"), runAt: epoch)], queue: "jobs", now: epoch)
      }
    }
    try await Task.sleep(for: .milliseconds(20))
    clock.open()
    #expect(try await big.value.count == 33)
    await closing.value
    var committedRows = 33
    for task in others + late {
      switch await task.result {
      case .success(let results):
        for result in results { #expect(try isCommitted(result.id, path: path)) }
        committedRows += results.count
      case .failure(let error as SQLiteJobStoreError):
        #expect(error.code == .closed)
      case .failure(let error):
        Issue.record("unexpected error \(error)")
      }
    }
    #expect(try scalar("SELECT count(*) FROM jobs", path: path) == Int64(committedRows))
    #expect(await eventually(timeout: .seconds(90)) { store.groups.isIdle }, "an add stays under way")
  }

  /// With synchronous FULL, concurrent adds (small, large, shared keys) all go through the store's
  /// thread, grouped, and none is lost or duplicated.
  @Test func withSynchronousFullEveryAddGoesThroughTheStoresThread() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("jobs.sqlite")
    let store = try makeStore(folder, options: .init(synchronous: .full))
    let adders = (0..<6).map { task in
      Task { () -> [(String?, EnqueueResult)] in
        var out: [(String?, EnqueueResult)] = []
        for call in 0..<40 {
          let key: String? = call % 5 == 0 && call % 13 != 7 ? "shared\(call % 3)" : nil
          let jobs =
            call % 13 == 7
            ? (0..<34).map { NewJob(payload: payload("t\(task)c\(call)-\($0)"), runAt: epoch) }
            : [NewJob(payload: payload("t\(task)c\(call)"), runAt: epoch, deduplicationKey: key)]
          let results = try await store.enqueue(jobs, queue: "jobs", now: epoch)
          out.append((key, results[0]))
        }
        return out
      }
    }
    var byKey: [String: Set<JobID>] = [:]
    var inserted = 0
    for adder in adders {
      for (key, result) in try await adder.value {
        if let key { byKey[key, default: []].insert(result.id) }
        if result.inserted { inserted += 1 }
      }
    }
    for (key, ids) in byKey { #expect(ids.count == 1, "key \(key): \(ids)") }
    #expect(
      store.groups.callsTaken == 240, "\(store.groups.callsTaken) of 240 calls through the store's thread")
    #expect(store.groups.groupsCommitted > 0)
    let rows = try scalar("SELECT count(*) FROM jobs", path: path)
    // Each of the 6 tasks made 3 large calls (call 7, 20, 33): 33 more rows each.
    #expect(rows == Int64(inserted + 6 * 3 * 33))
    #expect(await eventually(timeout: .seconds(90)) { store.groups.isIdle }, "an add stays under way")
  }

  /// A mix on the inline path: concurrent small and large adds with shared keys, cancellations at
  /// various moments, checkpoints (payloads of a few KiB), and another connection taking the write
  /// lock now and then. No call hangs; a call that returned committed its jobs, a call that threw
  /// committed none; each key maps to one ID.
  @Test func inlineMixWithCheckpointsLocksAndCancellationsLosesNothing() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("jobs.sqlite")
    let store = try makeStore(folder, options: .init(busyTimeout: .seconds(60)))
    _ = try await store.enqueue([NewJob(payload: payload("seed"), runAt: epoch)], queue: "jobs", now: epoch)
    let stop = Flag()
    let lockerDone = DispatchSemaphore(value: 0)
    let locker = Thread {
      let other = try! Connection(path: path, create: false)
      other.setLockWait(milliseconds: 60_000)
      while !stop.value {
        try! other.execute("BEGIN IMMEDIATE")
        usleep(UInt32.random(in: 200...3_000))
        try! other.execute("COMMIT")
        usleep(UInt32.random(in: 1_000...8_000))
      }
      lockerDone.signal()
    }
    locker.start()
    let filler = String(repeating: "x", count: 8_000)
    let loops = (0..<6).map { task in
      Task { () -> [(name: String, key: String?, large: Bool, outcome: Result<[EnqueueResult], any Error>)] in
        var out: [(name: String, key: String?, large: Bool, outcome: Result<[EnqueueResult], any Error>)] = []
        for call in 0..<200 {
          let name = "t\(task)c\(call)"
          let key: String? = call % 6 == 0 ? "shared\(call % 4)" : nil
          let large = call % 17 == 5 && call % 6 != 0
          let jobs =
            large
            ? (0..<33).map { NewJob(payload: payload("\(name)-\($0)"), runAt: epoch) }
            : [NewJob(payload: payload(name + "|" + filler), runAt: epoch, deduplicationKey: key)]
          let adder = Task { try await store.enqueue(jobs, queue: "jobs", now: epoch) }
          switch call % 5 {
          case 0: adder.cancel()
          case 1:
            await Task.yield()
            adder.cancel()
          case 2:
            try? await Task.sleep(for: .microseconds(100))
            adder.cancel()
          default: break
          }
          out.append((name, key, large, await adder.result))
        }
        return out
      }
    }
    var all: [(name: String, key: String?, large: Bool, outcome: Result<[EnqueueResult], any Error>)] = []
    for loop in loops { all += await loop.value }
    stop.set()
    while lockerDone.wait(timeout: .now()) == .timedOut { try await Task.sleep(for: .milliseconds(5)) }
    let stored = Set(try Self.storedPayloads(path: path).map { String($0.prefix { $0 != "|" }) })
    var idsByKey: [String: Set<JobID>] = [:]
    var expected: Set<String> = ["seed"]
    for entry in all {
      switch entry.outcome {
      case .success(let results):
        if entry.large {
          #expect(results.count == 33)
          for index in 0..<33 {
            #expect(stored.contains("\(entry.name)-\(index)"), "\(entry.name) returned but not stored")
            expected.insert("\(entry.name)-\(index)")
          }
        } else {
          if let key = entry.key { idsByKey[key, default: []].insert(results[0].id) }
          if results[0].inserted {
            #expect(stored.contains(entry.name), "\(entry.name) returned but not stored")
            expected.insert(entry.name)
          } else {
            #expect(entry.key != nil && !stored.contains(entry.name))
          }
        }
      case .failure(is CancellationError):
        #expect(
          !stored.contains(entry.name) && !stored.contains("\(entry.name)-0"),
          "\(entry.name) cancelled but stored")
      case .failure(let error):
        Issue.record("\(entry.name) failed: \(error)")
      }
    }
    for (key, ids) in idsByKey { #expect(ids.count == 1, "key \(key): \(ids)") }
    #expect(stored == expected, "stored but not returned: \(stored.subtracting(expected).sorted().prefix(5))")
    #expect(await eventually(timeout: .seconds(90)) { store.groups.isIdle }, "an add stays under way")
    print(
      "calls \(all.count), taken by the thread \(store.groups.callsTaken), groups \(store.groups.groupsCommitted)"
    )
  }
}
