import CSQLite
import Conveyor
import ConveyorTestSupport
import Dispatch
import Foundation
import Synchronization
import Testing

@testable import ConveyorSQLite

// Review 7: the statement cache's `recent` array (Connection.statement), and the flush that no
// longer lingers after a group of one (EnqueueGroups.take).

@Suite("Review7: SQLite statement lookup and flushes after a lone call", .timeLimit(.minutes(2)))
struct Review7Tests {
  /// The text `sql` returns as its first column, as UTF-8 bytes.
  static func bytes(_ db: Connection, _ sql: String) throws -> [UInt8] {
    var result: [UInt8] = []
    try db.query(sql) { row in result = Array((row.text(0) ?? "").utf8) }
    return result
  }

  /// Two SQL texts that Swift's `==` calls equal (canonically equivalent: the same two combining
  /// marks in either order) but that are different texts of the same UTF-8 length. The statement
  /// returned for the second must be the second's, not the first's from `recent`.
  @Test func canonicallyEquivalentTextsOfEqualLengthGetTheirOwnStatements() throws {
    let folder = try TemporaryFolder()
    let db = try Connection(path: folder.path("stmt.sqlite"), create: true)
    defer { db.close() }
    let first = "SELECT 'e\u{301}\u{323}'"
    let second = "SELECT 'e\u{323}\u{301}'"
    #expect(first == second && first.utf8.count == second.utf8.count)
    #expect(Array(first.utf8) != Array(second.utf8))
    let a = try Self.bytes(db, first)
    let b = try Self.bytes(db, second)
    #expect(a == Array("e\u{301}\u{323}".utf8))
    #expect(
      b == Array("e\u{323}\u{301}".utf8),
      "the statement for the second text returned \(b), the first text's bytes")
    #expect(Array(try db.statement(second).sql.utf8) == Array(second.utf8))
  }

  /// The same with texts of different lengths (precomposed and decomposed é), found once the
  /// first has left `recent`: the dictionary behind it.
  @Test func canonicallyEquivalentTextsOfDifferentLengthGetTheirOwnStatements() throws {
    let folder = try TemporaryFolder()
    let db = try Connection(path: folder.path("stmt.sqlite"), create: true)
    defer { db.close() }
    let composed = "SELECT '\u{e9}'"
    let decomposed = "SELECT 'e\u{301}'"
    #expect(composed == decomposed && composed.utf8.count != decomposed.utf8.count)
    #expect(try Self.bytes(db, composed) == Array("\u{e9}".utf8))
    let got = try Self.bytes(db, decomposed)
    #expect(got == Array("e\u{301}".utf8), "decomposed text answered \(got)")
  }

  /// Runtime-built texts, of equal lengths, more than `recent` holds, in rotation: each gets its
  /// own statement; equal content in other storage gets the same one; the connection holds one
  /// prepared statement per distinct text (none kept alive only by `recent`).
  @Test func runtimeTextsRotatingPastRecentGetTheirOwnStatements() throws {
    let folder = try TemporaryFolder()
    let db = try Connection(path: folder.path("stmt.sqlite"), create: true)
    defer { db.close() }
    let count = Connection.recentStatements * 2 + 3
    let texts = (0..<count).map { "SELECT \(100 + $0)" }  // all of one length
    for round in 0..<5 {
      for (index, text) in texts.enumerated().reversed() where (index + round) % 3 != 0 || round == 0 {
        // Rebuilt from bytes each time: other storage, same content.
        let copy = String(decoding: Array(text.utf8), as: UTF8.self)
        #expect(try db.scalar(copy) == Int64(100 + index), "round \(round), text \(text)")
        #expect(try db.statement(copy) === (try db.statement(text)))
        #expect(try db.statement(copy).sql == text)
      }
    }
    #expect(db.cachedStatementCount == count)
    var live = 0
    var statement = sqlite3_next_stmt(db.handle, nil)
    while let current = statement {
      live += 1
      statement = sqlite3_next_stmt(db.handle, current)
    }
    #expect(live == count, "\(live) prepared statements on the handle for \(count) texts")
    // An empty text is refused, and does not disturb the cache.
    #expect(throws: (any Error).self) { _ = try db.statement("") }
    #expect(try db.scalar(texts[0]) == 100)
  }

  // MARK: Flushes after a group of one

  /// Makes inserts of the payload "slow" take a while (a trigger joining a table with itself).
  static func slowInserts(path: String) throws {
    let other = try Connection(path: path, create: false)
    defer { other.close() }
    try other.execute(
      """
      CREATE TABLE slow_rows (n INTEGER);
      WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 1500)
      INSERT INTO slow_rows SELECT x FROM c;
      CREATE TABLE slow_seen (n INTEGER);
      CREATE TRIGGER slow_insert BEFORE INSERT ON jobs WHEN NEW.payload = CAST('slow' AS BLOB)
      BEGIN INSERT INTO slow_seen SELECT count(*) FROM slow_rows a, slow_rows b; END;
      CREATE TRIGGER reject_insert BEFORE INSERT ON jobs WHEN NEW.payload = CAST('bad' AS BLOB)
      BEGIN SELECT RAISE(ABORT, 'rejected by review 7'); END;
      """)
  }

  /// A lone call committed on the store's thread (a group of one) is followed by a flush that no
  /// longer lingers; calls that arrive while the connection is busy after it still wait, and that
  /// flush commits them as one group. (Made deterministic after a first version, timed by a slow
  /// trigger, failed on a loaded machine: the adders came after the slow call had finished.)
  @Test func callsArrivingDuringALoneCallsCommitAreStillGrouped() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("group.sqlite")
    let store = try SQLiteJobStore(path: path)
    _ = try await store.enqueue([NewJob(payload: payload("warm"), runAt: epoch)], queue: "jobs", now: epoch)
    try Self.slowInserts(path: path)
    let gate = try await holdConnection(of: store)
    let slow = Task {
      try await store.enqueue([NewJob(payload: payload("slow"), runAt: epoch)], queue: "jobs", now: epoch)
    }
    try await eventually("the slow call waits") { store.groups.waitingCount == 1 }
    // Queued behind the flush that takes the lone call: holds the connection after it, before
    // the next flush.
    let second = DispatchSemaphore(value: 0)
    let heldAgain = Atomic<Bool>(false)
    store.connection.submit { _ in
      heldAgain.store(true, ordering: .releasing)
      second.wait()
    }
    defer { second.signal() }
    let groupsBefore = store.groups.groupsCommitted
    gate.signal()
    _ = try await slow.value
    try await eventually("the connection is held again") { heldAgain.load(ordering: .acquiring) }
    let names = ["a", "b", "c", "d", "e"]
    let adders = names.map { name in
      Task {
        try await store.enqueue([NewJob(payload: payload(name), runAt: epoch)], queue: "jobs", now: epoch)
      }
    }
    try await eventually("the adders wait for the connection") { store.groups.waitingCount == names.count }
    second.signal()
    for (name, adder) in zip(names, adders) {
      let result = await adder.result
      if name == "bad" {
        #expect(throws: (any Error).self) { try result.get() }
      } else {
        #expect(try result.get().count == 1, "\(name)")
      }
    }
    let other = try Connection(path: path, create: false)
    defer { other.close() }
    #expect(try other.scalar("SELECT count(*) FROM jobs") == 1 + 1 + Int64(names.count))
    #expect(try other.scalar("SELECT count(*) FROM jobs WHERE payload = CAST('bad' AS BLOB)") == 0)
    // Only meaningful when the adders did wait behind the slow call.
    #expect(
      store.groups.groupsCommitted > groupsBefore,
      "no group was committed after the group of one (\(store.groups.callsTaken) calls taken)")
  }

}
