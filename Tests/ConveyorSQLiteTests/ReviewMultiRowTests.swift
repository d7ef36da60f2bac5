import CSQLite
import Conveyor
import ConveyorTestSupport
import Foundation
import Testing

@testable import ConveyorSQLite

/// Adversarial review of the multi-row `INSERT … RETURNING id` of enqueue
/// (`SQLiteJobStore.insertTogether`, commit c144b50).
@Suite("ReviewMultiRowTests: multi-row INSERT of enqueue", .serialized, .timeLimit(.minutes(3)))
struct ReviewMultiRowTests {
  /// Holds the store's connection, starts one task per call (in order, each waiting for the group
  /// before the next starts), releases the connection, and returns each call's outcome: the calls
  /// are committed as one group on the store's thread.
  static func grouped(
    _ store: SQLiteJobStore, _ calls: [(queue: String, jobs: [NewJob])]
  ) async throws -> [Result<[EnqueueResult], any Error>] {
    let gate = try await holdConnection(of: store)
    var adders: [Task<[EnqueueResult], any Error>] = []
    for (index, call) in calls.enumerated() {
      adders.append(Task { try await store.enqueue(call.jobs, queue: call.queue, now: epoch) })
      try await eventually("call \(index) waits for the group") { store.groups.waitingCount == index + 1 }
    }
    gate.signal()
    var results: [Result<[EnqueueResult], any Error>] = []
    for adder in adders { results.append(await adder.result) }
    return results
  }

  static let columns =
    "queue, hex(payload), typeof(payload), status, priority, run_at, created_at, ifnull(dedup_key, '-')"

  /// Every stored job's columns but its ID, in ID order, read by another connection.
  static func rows(_ path: String, where condition: String = "1") throws -> [String] {
    let connection = try Connection(path: path, create: false)
    var rows: [String] = []
    try connection.query("SELECT \(columns) FROM jobs WHERE \(condition) ORDER BY id") { statement in
      rows.append((0..<8).map { statement.text(Int32($0)) ?? "NULL" }.joined(separator: "|"))
    }
    return rows
  }

  /// The columns (but the ID) of the jobs stored under `ids`, "missing" for none.
  static func rows(of ids: [JobID], path: String) throws -> [String] {
    let connection = try Connection(path: path, create: false)
    return try ids.map { id in
      var row = "missing"
      try connection.query("SELECT \(columns) FROM jobs WHERE id = ?", .integer(id.rawValue)) { statement in
        row = (0..<8).map { statement.text(Int32($0)) ?? "NULL" }.joined(separator: "|")
      }
      return row
    }
  }

  static func count(_ path: String) throws -> Int64 {
    try Connection(path: path, create: false).scalar("SELECT count(*) FROM jobs") ?? -1
  }

  /// Jobs with extreme priorities, run dates and payloads.
  static func extremeJobs(_ count: Int, tag: String) -> [NewJob] {
    let priorities = [Int.max, Int.min, 0, -1, 1, Int(Int32.max) + 1]
    let times: [RunTime] = [
      .at(.distantPast), .at(.distantFuture), .at(Date(timeIntervalSince1970: .infinity)),
      .at(Date(timeIntervalSince1970: -.infinity)), .at(Date(timeIntervalSince1970: .nan)),
      .after(.seconds(Int64.max)), .after(.seconds(-5)), .now, .at(epoch),
      .at(epoch.addingTimeInterval(0.0004)),
      .at(epoch.addingTimeInterval(0.0006)), .at(epoch.addingTimeInterval(-0.001)),
    ]
    let payloads: [Data] = [Data(), Data([0]), payload("\(tag)"), Data(repeating: 0xFF, count: 3)]
    return (0..<count).map { index in
      NewJob(
        payload: index % 5 == 0 ? payloads[index % payloads.count] : payload("\(tag)-\(index)"),
        priority: priorities[index % priorities.count], runTime: times[index % times.count])
    }
  }

  // Differential: the same jobs with extreme values stored through one-row inserts (one job per
  // call, the path of before) and through the multi-row insert (one call of 70 jobs: three
  // statements; and a group of calls of 31, 2, 33 and 4 jobs straddling the 32-row boundaries,
  // on queues of their own). Every column but the ID must be the same, and each returned ID must
  // hold its own job.
  @Test func extremeValuesAreStoredAsTheOneRowPathStoresThem() async throws {
    let folder = try TemporaryFolder()
    let jobs = Self.extremeJobs(70, tag: "x")

    let onePath = folder.path("one.sqlite")
    let one = try SQLiteJobStore(path: onePath)
    var oneIDs: [JobID] = []
    for job in jobs { oneIDs += try await one.enqueue([job], queue: "q", now: epoch).map(\.id) }
    await one.close()
    let expected = try Self.rows(of: oneIDs, path: onePath)
    #expect(!expected.contains("missing"))

    let manyPath = folder.path("many.sqlite")
    let many = try SQLiteJobStore(path: manyPath)
    let results = try await many.enqueue(jobs, queue: "q", now: epoch)
    #expect(results.allSatisfy { $0.inserted })
    #expect(try Self.rows(of: results.map(\.id), path: manyPath) == expected)

    // The same jobs in a group of four calls.
    var calls: [(queue: String, jobs: [NewJob])] = []
    var start = 0
    for size in [31, 2, 33, 4] {
      calls.append(("q", Array(jobs[start..<start + size])))
      start += size
    }
    let grouped = try await Self.grouped(many, calls)
    var groupedIDs: [JobID] = []
    for result in grouped { groupedIDs += try result.get().map(\.id) }
    #expect(try Self.rows(of: groupedIDs, path: manyPath) == expected)
    #expect(try Self.count(manyPath) == 140)
    await many.close()
  }

  // Triggers that add a row of their own to `jobs` for every job (an audit copy in another
  // queue), before or after the job's row: each caller still gets its own jobs' IDs.
  @Test(arguments: ["BEFORE", "AFTER"])
  func triggersAddingRowsToJobsLeaveEachCallItsOwnIDs(_ timing: String) async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("t.sqlite")
    let store = try SQLiteJobStore(path: path)
    try Connection(path: path, create: false).execute(
      """
      CREATE TRIGGER audit \(timing) INSERT ON jobs WHEN NEW.queue != 'audit'
      BEGIN
        INSERT INTO jobs (queue, payload, status, priority, run_at, created_at)
        VALUES ('audit', NEW.payload, 'dead', 0, 0, 0);
      END
      """)
    let sizes = [1, 3, 30, 2, 4, 33]
    let calls = sizes.enumerated().map { call, size in
      (
        queue: "q\(call % 3)",
        jobs: (0..<size).map { NewJob(payload: payload("c\(call)j\($0)"), runAt: epoch) }
      )
    }
    let results = try await Self.grouped(store, calls)
    for (call, result) in zip(calls, results) {
      let ids = try result.get().map(\.id)
      let stored = try Self.rows(of: ids, path: path).map {
        $0.split(separator: "|").prefix(2).joined(separator: "|")
      }
      #expect(
        stored == call.jobs.map { "\(call.queue)|\($0.payload.map { String(format: "%02X", $0) }.joined())" })
    }
    #expect(try Self.count(path) == Int64(2 * sizes.reduce(0, +)))
    await store.close()
  }

  // An AFTER INSERT trigger ending with RAISE(IGNORE) on a job: the row is stored (the statement
  // goes on), as a one-job call shows. A call of several jobs must do the same.
  @Test func anAfterInsertIgnoreBehavesAsInAOneRowInsert() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("a.sqlite")
    let store = try SQLiteJobStore(path: path)
    try Connection(path: path, create: false).execute(
      """
      CREATE TRIGGER after_ignore AFTER INSERT ON jobs WHEN NEW.payload = CAST('mark' AS BLOB)
      BEGIN SELECT RAISE(IGNORE); END
      """)
    let alone = await outcome {
      try await store.enqueue([NewJob(payload: payload("mark"), runAt: epoch)], queue: "q", now: epoch)
    }
    let together = await outcome {
      try await store.enqueue(
        [
          NewJob(payload: payload("a"), runAt: epoch), NewJob(payload: payload("mark"), runAt: epoch),
          NewJob(payload: payload("b"), runAt: epoch),
        ], queue: "q", now: epoch)
    }
    let aloneOK = (try? alone.get()) != nil
    let togetherOK = (try? together.get()) != nil
    #expect(aloneOK == togetherOK, "one-row path: \(alone), multi-row path: \(together)")
    if let ids = try? together.get().map(\.id) {
      #expect(
        try Self.rows(of: ids, path: path).map { $0.split(separator: "|")[1] } == ["61", "6D61726B", "62"])
    }
    await store.close()
  }

  // A BEFORE INSERT trigger drops one row in the middle of the second statement of a large group
  // (RAISE(IGNORE)): only that call fails, nothing of it is stored, its queue (of its own) is not
  // listed, and the other calls are committed with their own IDs.
  @Test func aRowDroppedInTheSecondStatementFailsOnlyItsCall() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("d.sqlite")
    let store = try SQLiteJobStore(path: path)
    try installSkipTrigger(at: path)
    var calls: [(queue: String, jobs: [NewJob])] = []
    calls.append(("a", (0..<30).map { NewJob(payload: payload("a\($0)"), runAt: epoch) }))
    calls.append(
      ("doomed", (0..<20).map { NewJob(payload: payload($0 == 15 ? "skip" : "d\($0)"), runAt: epoch) }))
    calls.append(("b", (0..<5).map { NewJob(payload: payload("b\($0)"), runAt: epoch) }))
    let results = try await Self.grouped(store, calls)
    #expect(throws: (any Error).self) { try results[1].get() }
    for index in [0, 2] {
      let ids = try results[index].get().map(\.id)
      #expect(
        try Self.rows(of: ids, path: path).map { $0.split(separator: "|").prefix(2).joined(separator: "|") }
          == calls[index].jobs.map {
            "\(calls[index].queue)|\($0.payload.map { String(format: "%02X", $0) }.joined())"
          })
    }
    #expect(try Self.count(path) == 35)
    #expect(try await store.queueNames().sorted() == ["a", "b"])
    await store.close()
  }

  // A value SQLite refuses in the second statement of a group: that call fails, the others are
  // committed, and no multi-row statement keeps a value bound.
  @Test func aRefusedValueInTheSecondStatementLeavesNothingBound() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("b.sqlite")
    let store = try SQLiteJobStore(path: path)
    _ = await onStoreThread(store) { sqlite3_limit($0.handle, SQLITE_LIMIT_LENGTH, 1_000) }
    var calls: [(queue: String, jobs: [NewJob])] = []
    calls.append(("a", (0..<30).map { NewJob(payload: payload("a\($0)"), runAt: epoch) }))
    calls.append(
      (
        "big",
        (0..<20).map { NewJob(payload: $0 == 10 ? Data(count: 2_000) : payload("d\($0)"), runAt: epoch) }
      ))
    calls.append(("b", (0..<5).map { NewJob(payload: payload("b\($0)"), runAt: epoch) }))
    let results = try await Self.grouped(store, calls)
    #expect(throws: (any Error).self) { try results[1].get() }
    #expect(try results[0].get().count == 30)
    #expect(try results[2].get().count == 5)
    #expect(try Self.count(path) == 35)
    let bound = await onStoreThread(store) { db in
      (1...SQLiteJobStore.rowsPerInsert).compactMap { rows -> String? in
        guard let statement = try? db.statement(SQL.insert(rows: rows)),
          let text = sqlite3_expanded_sql(statement.handle)
        else { return nil }
        defer { sqlite3_free(text) }
        let sql = String(cString: text)
        return sql.contains("'") ? "\(rows): \(sql.prefix(200))" : nil
      }
    }
    #expect(bound == [], "values still bound: \(bound ?? ["closed"])")
    #expect(try await store.queueNames().sorted() == ["a", "b"])
    await store.close()
  }

  // Queue names that are different texts but canonically equivalent as Swift strings (a
  // precomposed and a decomposed "é"): both have jobs, so both must be listed.
  @Test func canonicallyEquivalentQueueNamesAreBothListed() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("u.sqlite")
    let store = try SQLiteJobStore(path: path)
    let composed = "caf\u{E9}"
    let decomposed = "cafe\u{301}"
    _ = try await store.enqueue(
      [NewJob(payload: payload("1"), runAt: epoch), NewJob(payload: payload("2"), runAt: epoch)],
      queue: composed, now: epoch)
    _ = try await store.enqueue(
      [NewJob(payload: payload("3"), runAt: epoch), NewJob(payload: payload("4"), runAt: epoch)],
      queue: decomposed, now: epoch)
    let stored = try Connection(path: path, create: false)
    var distinct: Int64 = 0
    distinct = try stored.scalar("SELECT count(DISTINCT queue) FROM jobs") ?? 0
    #expect(distinct == 2, "the jobs are stored under two queue names")
    let names = try await store.queueNames()
    #expect(names.count == 2, "queue names listed: \(names.map { Array($0.unicodeScalars) })")
    await store.close()
  }

  // A closed store: a multi-job call and a group fail, and nothing hangs.
  @Test func aClosedStoreFailsMultiJobCalls() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("c.sqlite")
    let store = try SQLiteJobStore(path: path)
    await store.close()
    await #expect(throws: (any Error).self) {
      _ = try await store.enqueue(
        (0..<40).map { NewJob(payload: payload("\($0)"), runAt: epoch) }, queue: "q", now: epoch)
    }
    await #expect(throws: (any Error).self) {
      _ = try await store.enqueue(
        (0..<3).map { NewJob(payload: payload("\($0)"), runAt: epoch) }, queue: "q", now: epoch)
    }
  }

  // A leader (on its own thread) commits followers to four queues, one of which has a row a
  // trigger drops: the group goes to the store's thread, runs each call alone; only that
  // follower fails, its queue is not listed, and every other call has its own IDs.
  @Test func aLeadersGroupWithADroppedRowFailsOnlyThatFollower() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("l.sqlite")
    let store = try SQLiteJobStore(path: path)
    try installSkipTrigger(at: path)
    let clock = GateClock()
    let leader = Task(executorPreference: OneThreadExecutor()) {
      try await store.enqueue(
        [NewJob(payload: payload("L0"), runAt: epoch), NewJob(payload: payload("L1"), runAt: epoch)],
        queue: "lead", clock: clock)
    }
    try await eventually("the leader is inside its transaction") { clock.entered }
    var followers: [Task<[EnqueueResult], any Error>] = []
    for index in 0..<4 {
      followers.append(
        Task {
          try await store.enqueue(
            (0..<(index + 2)).map {
              NewJob(payload: payload(index == 2 && $0 == 1 ? "skip" : "f\(index)j\($0)"), runAt: epoch)
            }, queue: "q\(index)", now: epoch)
        })
      try await eventually("follower \(index) waits behind the leader") {
        store.groups.waitingCount == index + 1
      }
    }
    clock.open()
    let led = try await leader.value
    #expect(
      try Self.rows(of: led.map(\.id), path: path).map { $0.split(separator: "|")[1] } == ["4C30", "4C31"])
    for (index, follower) in followers.enumerated() {
      let result = await follower.result
      if index == 2 {
        #expect(throws: (any Error).self) { try result.get() }
        continue
      }
      let ids = try result.get().map(\.id)
      #expect(
        try Self.rows(of: ids, path: path).map { String($0.split(separator: "|")[0]) }
          == Array(repeating: "q\(index)", count: index + 2))
    }
    #expect(try Self.count(path) == 2 + 2 + 3 + 5)
    #expect(try await store.queueNames().sorted() == ["lead", "q0", "q1", "q3"])
    await store.close()
  }

  // Calls with and without keys in one group, past 32 jobs: duplicates answered with the stored
  // job's ID and `inserted: false`, the others with their own IDs, in order.
  @Test func keysAndNoKeysInOneGroup() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("k.sqlite")
    let store = try SQLiteJobStore(path: path)
    let calls: [(queue: String, jobs: [NewJob])] = [
      ("q", (0..<3).map { NewJob(payload: payload("n\($0)"), runAt: epoch) }),
      ("q", [NewJob(payload: payload("k1"), runAt: epoch, deduplicationKey: "k")]),
      ("q", [NewJob(payload: payload("k2"), runAt: epoch, deduplicationKey: "k")]),
      ("q", (0..<40).map { NewJob(payload: payload("m\($0)"), runAt: epoch) }),
    ]
    let results = try await Self.grouped(store, calls)
    let first = try results[1].get()
    let second = try results[2].get()
    #expect(first.map(\.inserted) == [true])
    #expect(second.map(\.inserted) == [false])
    #expect(second.map(\.id) == first.map(\.id))
    let many = try results[3].get()
    #expect(many.count == 40 && many.allSatisfy { $0.inserted })
    #expect(
      try Self.rows(of: many.map(\.id), path: path).map { $0.split(separator: "|")[1] }
        == (0..<40).map { Substring(payload("m\($0)").map { String(format: "%02X", $0) }.joined()) })
    #expect(try Self.count(path) == 44)
    await store.close()
  }

  // An AFTER INSERT trigger with RAISE(IGNORE) created as a TEMP trigger on the store's own
  // connection: the row is stored (a one-row insert reports it), but the multi-row insert's
  // RETURNING skips it, so a call of several jobs fails where a call of one job succeeds.
  //
  // Kept as a known issue: a TEMP trigger lives on one connection, and the store's is private
  // (this test reaches it through `@testable`); the same trigger in the schema, which an
  // application can create, behaves as in a one-row insert
  // (`anAfterInsertIgnoreBehavesAsInAOneRowInsert`).
  @Test func aTempAfterInsertIgnoreFailsAMultiJobCallThatTheOneRowPathTakes() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("tt.sqlite")
    let store = try SQLiteJobStore(path: path)
    let created = await onStoreThread(store) { db in
      (try? db.execute(
        """
        CREATE TEMP TRIGGER after_ignore AFTER INSERT ON main.jobs
        WHEN NEW.payload = CAST('mark' AS BLOB) BEGIN SELECT RAISE(IGNORE); END
        """)) != nil
    }
    #expect(created == true, "the TEMP trigger was not created")
    let alone = await outcome {
      try await store.enqueue([NewJob(payload: payload("mark"), runAt: epoch)], queue: "q", now: epoch)
    }
    let together = await outcome {
      try await store.enqueue(
        [NewJob(payload: payload("a"), runAt: epoch), NewJob(payload: payload("mark"), runAt: epoch)],
        queue: "q", now: epoch)
    }
    #expect((try? alone.get()) != nil, "one-row path: \(alone)")
    withKnownIssue("RETURNING skips a row a TEMP trigger ignored after its insert") {
      #expect((try? together.get()) != nil, "multi-row path: \(together)")
    }
    await store.close()
  }

  // A large group on the store's thread: 60 calls of 1 to 7 jobs, each on a queue of its own
  // (about 240 jobs, eight statements): each call gets its own jobs' IDs, all queues listed.
  @Test func aLargeGroupOfManyQueues() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("m.sqlite")
    let store = try SQLiteJobStore(path: path)
    let calls: [(queue: String, jobs: [NewJob])] = (0..<60).map { call in
      (
        "q\(call)",
        (0..<(call % 7 + 1)).map { NewJob(payload: payload("c\(call)j\($0)"), priority: call, runAt: epoch) }
      )
    }
    let results = try await Self.grouped(store, calls)
    for (call, result) in zip(calls, results) {
      let ids = try result.get().map(\.id)
      #expect(
        try Self.rows(of: ids, path: path).map { $0.split(separator: "|").prefix(2).joined(separator: "|") }
          == call.jobs.map { "\(call.queue)|\($0.payload.map { String(format: "%02X", $0) }.joined())" })
    }
    #expect(try await store.queueNames().sorted() == calls.map(\.queue).sorted())
    await store.close()
  }
}
