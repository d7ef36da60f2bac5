import CSQLite
import Conveyor
import ConveyorTestSupport
import Foundation
import Testing

@testable import ConveyorSQLite

/// Jobs without keys are inserted with one multi-row `INSERT … RETURNING id` per 32 jobs, for one
/// call or a group of calls (`SQLiteJobStore.insertTogether`): every call must still get the IDs
/// of its own jobs, in order, and a row the table does not take must fail only its own call.
@Suite("One INSERT for the jobs of a group", .serialized, .timeLimit(.minutes(2)))
struct MultiRowInsertTests {
  /// The payload, status and priority stored under each of `ids`, read by another connection.
  func stored(_ ids: [JobID], path: String) throws -> [String] {
    let connection = try Connection(path: path, create: false)
    return try ids.map { id in
      var row: String?
      try connection.query("SELECT payload, status, priority FROM jobs WHERE id = ?", .integer(id.rawValue)) {
        row = "\(String(decoding: $0.data(0), as: UTF8.self)) \($0.text(1) ?? "-") \($0.int(2))"
      }
      return row ?? "missing"
    }
  }

  func count(_ path: String) throws -> Int64? {
    try Connection(path: path, create: false).scalar("SELECT count(*) FROM jobs")
  }

  // Five calls of 1, 3, 30, 2 and 4 jobs in one group on the store's thread: two statements (32
  // and 8 rows), the first ending inside the third call.
  @Test func callsGroupedOnTheStoresThreadGetTheIDsOfTheirOwnJobs() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("g.sqlite")
    let store = try SQLiteJobStore(path: path)
    let sizes = [1, 3, 30, 2, 4]
    let calls = sizes.enumerated().map { call, size in
      (0..<size).map { (payload: "c\(call)j\($0)", key: String?.none) }
    }
    let before = store.groups.groupsCommitted
    let results = try await Review4Tests.grouped(store, calls)
    #expect(store.groups.groupsCommitted == before + 1, "the five calls were not one group")
    var previous: Int64 = 0
    for (call, result) in zip(calls, results) {
      let ids = try result.get().map(\.id)
      #expect(try result.get().allSatisfy { $0.inserted })
      #expect(try stored(ids, path: path) == call.map { "\($0.payload) ready 0" })
      for id in ids {
        #expect(id.rawValue > previous, "IDs out of the order of the calls and their jobs")
        previous = id.rawValue
      }
    }
    #expect(try count(path) == 40)
    await store.close()
  }

  // One call of 70 jobs (over the inline limit: the store's thread), with priorities and run dates
  // of their own: three statements of 32, 32 and 6 rows.
  @Test func aLargeCallGetsTheIDsOfItsJobsInOrder() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("l.sqlite")
    let store = try SQLiteJobStore(path: path)
    let jobs = (0..<70).map { index in
      NewJob(
        payload: payload("j\(index)"), priority: index % 5,
        runAt: index % 3 == 0 ? epoch.addingTimeInterval(60) : epoch)
    }
    let results = try await store.enqueue(jobs, queue: "jobs", now: epoch)
    #expect(results.allSatisfy { $0.inserted })
    #expect(
      try stored(results.map(\.id), path: path)
        == (0..<70).map { "j\($0) \($0 % 3 == 0 ? "scheduled" : "ready") \($0 % 5)" })
    #expect(results.map(\.id.rawValue) == results.map(\.id.rawValue).sorted())
    await store.close()
  }

  // A leader commits the calls queued behind it on its own thread, to two queues: each follower
  // gets its own jobs' IDs, and both queues are listed.
  @Test func followersCommittedByTheLeaderGetTheIDsOfTheirOwnJobs() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("f.sqlite")
    let store = try SQLiteJobStore(path: path)
    let clock = GateClock()
    let leader = Task(executorPreference: OneThreadExecutor()) {
      try await store.enqueue([NewJob(payload: payload("leader"), runAt: epoch)], queue: "a", clock: clock)
    }
    try await eventually("the leader is inside its transaction") { clock.entered }
    var followers: [Task<[EnqueueResult], any Error>] = []
    for index in 0..<4 {
      followers.append(
        Task {
          try await store.enqueue(
            (0..<(index + 1)).map { NewJob(payload: payload("f\(index)j\($0)"), runAt: epoch) },
            queue: index % 2 == 0 ? "a" : "b", now: epoch)
        })
      try await eventually("follower \(index) waits behind the leader") {
        store.groups.waitingCount == index + 1
      }
    }
    clock.open()
    let led = try await leader.value
    #expect(try stored(led.map(\.id), path: path) == ["leader ready 0"])
    for (index, follower) in followers.enumerated() {
      let ids = try await follower.value.map(\.id)
      #expect(try stored(ids, path: path) == (0..<(index + 1)).map { "f\(index)j\($0) ready 0" })
    }
    #expect(store.groups.callsTaken == 0, "the store's thread committed calls the leader should have")
    #expect(try await store.queueNames().sorted() == ["a", "b"])
    #expect(try count(path) == 11)
    await store.close()
  }

  // A trigger skips one row of the middle call of a group without keys (RAISE(IGNORE)): that call
  // fails and stores nothing; the others are committed with their own IDs.
  @Test func aRowSkippedInAGroupWithoutKeysFailsOnlyItsCall() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("s.sqlite")
    let store = try SQLiteJobStore(path: path)
    try installSkipTrigger(at: path)
    let calls: [[(payload: String, key: String?)]] = [
      [("a1", nil), ("a2", nil)], [("b1", nil), ("skip", nil), ("b3", nil)], [("c1", nil)],
    ]
    let results = try await Review4Tests.grouped(store, calls)
    #expect(try stored(results[0].get().map(\.id), path: path) == ["a1 ready 0", "a2 ready 0"])
    #expect(throws: SQLiteError.self) { try results[1].get() }
    #expect(try stored(results[2].get().map(\.id), path: path) == ["c1 ready 0"])
    #expect(try count(path) == 3)
    await store.close()
  }

  /// The statement `sql` of `connection` with its bound values written in (NULL where none is).
  func expanded(_ sql: String, _ connection: Connection) throws -> String {
    let statement = try connection.statement(sql)
    guard let text = sqlite3_expanded_sql(statement.handle) else { return "" }
    defer { sqlite3_free(text) }
    return String(cString: text)
  }

  // Fixed (the statement kept the values bound before the one SQLite refused, a copy of each,
  // until its next use): a value over SQLite's length limit fails the call and leaves nothing
  // bound, through `Connection.run` and through the multi-row insert.
  @Test func aValueSQLiteRefusesLeavesNothingBound() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("b.sqlite")
    let connection = try Connection(path: folder.path("plain.sqlite"), create: true)
    try connection.execute("CREATE TABLE t (a, b)")
    sqlite3_limit(connection.handle, SQLITE_LIMIT_LENGTH, 1_000)
    let sql = "INSERT INTO t VALUES (?, ?)"
    #expect(throws: SQLiteError.self) { try connection.run(sql, .text("kept"), .blob(Data(count: 2_000))) }
    #expect(try expanded(sql, connection) == "INSERT INTO t VALUES (NULL, NULL)")

    let store = try SQLiteJobStore(path: path)
    _ = await onStoreThread(store) { sqlite3_limit($0.handle, SQLITE_LIMIT_LENGTH, 1_000) }
    await #expect(throws: SQLiteError.self) {
      _ = try await store.enqueue(
        [NewJob(payload: payload("kept"), runAt: epoch), NewJob(payload: Data(count: 2_000), runAt: epoch)],
        queue: "jobs", now: epoch)
    }
    let bound = await onStoreThread(store) { (try? expanded(SQL.insert(rows: 2), $0)) ?? "no statement" }
    #expect(bound?.contains("'jobs'") == false, "a value is still bound: \(bound ?? "closed")")
    #expect(try count(path) == 0)
    await store.close()
  }

  // Fixed (each multi-row statement bound up to 32 payloads at once, a copy of each, where one
  // statement per job held one: a call of large payloads took up to 32 times more memory while it
  // was inserted): a statement ends at 32 jobs or before its payloads pass 64 KiB, so large jobs
  // go one per statement. Four jobs of 40 KiB: four statements of one row, none of four.
  @Test func largePayloadsGoOnePerStatement() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("p.sqlite")
    let store = try SQLiteJobStore(path: path)
    let jobs = (0..<4).map { index in
      NewJob(payload: Data(repeating: UInt8(65 + index), count: 40 * 1_024), runAt: epoch)
    }
    let results = try await store.enqueue(jobs, queue: "jobs", now: epoch)
    #expect(results.map(\.id.rawValue) == results.map(\.id.rawValue).sorted())
    let statements = await onStoreThread(store) { db in
      Dictionary(uniqueKeysWithValues: [1, 2, 4].map { ($0, db.isCached(SQL.insert(rows: $0))) })
    }
    #expect(statements == [1: true, 2: false, 4: false])
    let connection = try Connection(path: path, create: false)
    for (index, result) in results.enumerated() {
      let first = try connection.scalar(
        "SELECT unicode(CAST(substr(payload, 1, 1) AS TEXT)) FROM jobs WHERE id = ?",
        .integer(result.id.rawValue))
      #expect(first == Int64(65 + index), "job \(index) holds another job's payload")
    }
    await store.close()
  }

  // Small and large jobs mixed across the calls of a group on the store's thread: statements end
  // at the byte limit inside calls and between them, and each call still gets its own jobs' IDs.
  @Test func mixedPayloadSizesInAGroupKeepEachCallsIDs() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("x.sqlite")
    let store = try SQLiteJobStore(path: path)
    let sizes = [[10, 70_000, 10], [30_000, 30_000, 30_000], [5], [65_536, 1, 65_535, 2]]
    let gate = try await holdConnection(of: store)
    var adders: [Task<[EnqueueResult], any Error>] = []
    for (call, jobSizes) in sizes.enumerated() {
      let jobs = jobSizes.enumerated().map { index, size in
        NewJob(payload: Data(repeating: UInt8(65 + call * 4 + index), count: size), runAt: epoch)
      }
      adders.append(Task { try await store.enqueue(jobs, queue: "jobs", now: epoch) })
      try await eventually("call \(call) waits for the group") { store.groups.waitingCount == call + 1 }
    }
    gate.signal()
    let connection = try Connection(path: path, create: false)
    var previous: Int64 = 0
    for (call, adder) in adders.enumerated() {
      for (index, result) in try await adder.value.enumerated() {
        #expect(result.inserted && result.id.rawValue > previous, "call \(call) job \(index): \(result)")
        previous = result.id.rawValue
        var stored: (Int, Int64)?
        try connection.query(
          "SELECT length(payload), unicode(CAST(substr(payload, 1, 1) AS TEXT)) FROM jobs WHERE id = ?",
          .integer(result.id.rawValue)
        ) { stored = ($0.int(0), $0.int64(1)) }
        #expect(stored?.0 == sizes[call][index], "call \(call) job \(index) has another job's payload")
        #expect(
          stored?.1 == Int64(65 + call * 4 + index), "call \(call) job \(index) has another job's payload")
      }
    }
    await store.close()
  }
}
