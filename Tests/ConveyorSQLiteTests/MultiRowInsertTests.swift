import CSQLite
import Conveyor
import ConveyorTestSupport
import Foundation
import Testing

@testable import ConveyorSQLite

/// Jobs without keys are inserted with one multi-row `INSERT … RETURNING id` per 32 jobs, for one
/// call or a group of calls (`SQLiteJobStore.insertTogether`): every call must still get the IDs
/// of its own jobs, in order, and a row the table does not take must fail only its own call.
@Suite("One INSERT for the jobs of a group", .serialized, .timeLimit(.minutes(10)))
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

  func job(_ text: String, key: String? = nil) -> NewJob {
    NewJob(payload: payload(text), runAt: epoch, deduplicationKey: key)
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
    let results = try await enqueueGrouped(store, calls)
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
    let results = try await enqueueGrouped(store, calls)
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
    _ = await onStoreThread(store) { sqlite3_limit($0.handle, SQLITE_LIMIT_LENGTH, 1_900) }
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
    let grouped = try await enqueueGrouped(many, calls)
    var groupedIDs: [JobID] = []
    for result in grouped { groupedIDs += try result.get().map(\.id) }
    #expect(try Self.rows(of: groupedIDs, path: manyPath) == expected)
    #expect(try count(manyPath) == 140)
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
    let results = try await enqueueGrouped(store, calls)
    for (call, result) in zip(calls, results) {
      let ids = try result.get().map(\.id)
      let stored = try Self.rows(of: ids, path: path).map {
        $0.split(separator: "|").prefix(2).joined(separator: "|")
      }
      #expect(
        stored == call.jobs.map { "\(call.queue)|\($0.payload.map { String(format: "%02X", $0) }.joined())" })
    }
    #expect(try count(path) == Int64(2 * sizes.reduce(0, +)))
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
    let results = try await enqueueGrouped(store, calls)
    #expect(throws: (any Error).self) { try results[1].get() }
    for index in [0, 2] {
      let ids = try results[index].get().map(\.id)
      #expect(
        try Self.rows(of: ids, path: path).map { $0.split(separator: "|").prefix(2).joined(separator: "|") }
          == calls[index].jobs.map {
            "\(calls[index].queue)|\($0.payload.map { String(format: "%02X", $0) }.joined())"
          })
    }
    #expect(try count(path) == 35)
    #expect(try await store.queueNames().sorted() == ["a", "b"])
    await store.close()
  }

  // A value SQLite refuses in the second statement of a group: that call fails, the others are
  // committed, and no multi-row statement keeps a value bound.
  @Test func aRefusedValueInTheSecondStatementLeavesNothingBound() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("b.sqlite")
    let store = try SQLiteJobStore(path: path)
    _ = await onStoreThread(store) { sqlite3_limit($0.handle, SQLITE_LIMIT_LENGTH, 1_900) }
    var calls: [(queue: String, jobs: [NewJob])] = []
    calls.append(("a", (0..<30).map { NewJob(payload: payload("a\($0)"), runAt: epoch) }))
    calls.append(
      (
        "big",
        (0..<20).map { NewJob(payload: $0 == 10 ? Data(count: 2_000) : payload("d\($0)"), runAt: epoch) }
      ))
    calls.append(("b", (0..<5).map { NewJob(payload: payload("b\($0)"), runAt: epoch) }))
    let results = try await enqueueGrouped(store, calls)
    #expect(throws: (any Error).self) { try results[1].get() }
    #expect(try results[0].get().count == 30)
    #expect(try results[2].get().count == 5)
    #expect(try count(path) == 35)
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
    #expect(try count(path) == 2 + 2 + 3 + 5)
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
    let results = try await enqueueGrouped(store, calls)
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
    #expect(try count(path) == 44)
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
    let results = try await enqueueGrouped(store, calls)
    for (call, result) in zip(calls, results) {
      let ids = try result.get().map(\.id)
      #expect(
        try Self.rows(of: ids, path: path).map { $0.split(separator: "|").prefix(2).joined(separator: "|") }
          == call.jobs.map { "\(call.queue)|\($0.payload.map { String(format: "%02X", $0) }.joined())" })
    }
    #expect(try await store.queueNames().sorted() == calls.map(\.queue).sorted())
    await store.close()
  }

  // RAISE(IGNORE) on the last job of a call: alone inline (3 jobs), alone on the store's thread
  // (40 jobs, over the inline limit), and in a group between two calls. Nothing of the failing
  // call is stored; the others are, with their own IDs; a later call with a stored key is
  // answered `inserted: false` with the stored job's ID.
  @Test func aDroppedLastRowFailsItsWholeCallEveryWay() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("d.sqlite")
    let store = try SQLiteJobStore(path: path)
    try installSkipTrigger(at: path)
    let other = try Connection(path: path, create: false)
    await #expect(throws: SQLiteError.self) {
      _ = try await store.enqueue([job("a", key: "a"), job("b"), job("skip")], queue: "jobs", now: epoch)
    }
    await #expect(throws: SQLiteError.self) {
      _ = try await store.enqueue((0..<39).map { job("m\($0)") } + [job("skip")], queue: "jobs", now: epoch)
    }
    #expect(try other.scalar("SELECT count(*) FROM jobs") == 0)
    let results = try await enqueueGrouped(
      store, [[("g1", "g")], [("x", "x"), ("skip", nil)], [("g2", "g"), ("h", nil)]])
    let g1 = try results[0].get()
    #expect(throws: SQLiteError.self) { try results[1].get() }
    let third = try results[2].get()
    #expect(g1.count == 1 && g1[0].inserted)
    #expect(third.count == 2 && third[0] == EnqueueResult(id: g1[0].id, inserted: false) && third[1].inserted)
    #expect(try other.scalar("SELECT count(*) FROM jobs") == 2)
    // "x" was not stored: a new call with key "x" inserts; "g" is answered with g1's ID.
    let again = try await store.enqueue(
      [job("x2", key: "x"), job("g3", key: "g")], queue: "jobs", now: epoch)
    #expect(again[0].inserted && again[1] == EnqueueResult(id: g1[0].id, inserted: false))
    for result in g1 + third + again where result.inserted {
      #expect(try await store.job(result.id) != nil, "job \(result.id) reported inserted is stored")
    }
    await store.close()
  }
}
