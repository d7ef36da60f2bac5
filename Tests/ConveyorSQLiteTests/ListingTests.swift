import CSQLite
import Conveyor
import ConveyorTestSupport
import Foundation
import Testing

@testable import ConveyorSQLite

/// Listing a queue's waiting jobs, or all its jobs, in ID order, without walking other queues'
/// rows: a window of the table, then the queue's own partial indexes.
@Suite("SQLite listings")
struct SQLiteListingTests {
  /// Pages through `queue` `limit` jobs at a time.
  func pages(_ store: SQLiteJobStore, _ queue: String, _ status: JobStatus?, limit: Int) async throws
    -> [Int64]
  {
    var ids: [Int64] = []
    var after: JobID?
    while true {
      let page = try await store.jobs(queue: queue, status: status, after: after, limit: limit)
      #expect(page.count <= limit)
      #expect(page.allSatisfy { $0.queue == queue && (status == nil || $0.status == status) })
      ids += page.map(\.id.rawValue)
      guard page.count == limit, let last = page.last else { return ids }
      after = last.id
    }
  }

  /// A small queue's jobs spread thinly among a big queue's, in every state: every page, in ID
  /// order, whether the window finds them or the indexes do.
  @Test func pagesAreCompleteAndInIDOrderAcrossTheWindow() async throws {
    let folder = try TemporaryFolder()
    let store = try makeStore(folder)
    var small: [Int64] = []
    for round in 0..<12 {
      _ = try await store.enqueue(
        (0..<150).map { NewJob(payload: payload("\($0)"), runAt: epoch) }, queue: "big", now: epoch)
      let job = NewJob(
        payload: payload("s\(round)"), priority: round % 3,
        runAt: epoch.addingTimeInterval(Double(round % 2) * 60))
      small += try await store.enqueue([job], queue: "small", now: epoch).map(\.id.rawValue)
    }
    // Some of the small queue's jobs run, two die.
    let claimed = try await store.settleAndClaim([], queue: "small", limit: 4, lease: lease(), now: epoch)
      .claimed
    _ = try await store.settleAndClaim(
      claimed.prefix(2).map { JobSettlement(claim: $0.claim, action: .kill(error: "x")) }, queue: "small",
      limit: 0,
      lease: lease(), now: epoch)
    let all = try await store.jobs(queue: "small", status: nil, after: nil, limit: 100)
    #expect(all.map(\.id.rawValue) == small, "every job of the queue, in ID order")
    let waiting = all.filter { $0.status == .pending }.map(\.id.rawValue)
    #expect(waiting.count == 8)
    for limit in [1, 2, 5, 50] {
      #expect(try await pages(store, "small", nil, limit: limit) == small, "limit \(limit)")
      #expect(try await pages(store, "small", .pending, limit: limit) == waiting, "limit \(limit)")
    }
    // The big queue's pages come from the window, and its waiting jobs are all there.
    #expect(try await pages(store, "big", .pending, limit: 100).count == 1_800)
  }

  /// A small queue beside 200,000 rows of another queue: a page reads a few hundred rows, not the
  /// table (counted in SQLite virtual-machine steps, not time).
  @Test func aSmallQueuesPageDoesNotWalkTheTable() async throws {
    let folder = try TemporaryFolder()
    let store = try makeStore(folder)
    _ = try await store.enqueue(
      [NewJob(payload: payload("welcome"), runAt: epoch)], queue: "emails", now: epoch)
    try await store.connection.perform { db in
      try db.execute(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 200000) "
          + "INSERT INTO jobs (queue, payload, status, run_at, created_at) "
          + "SELECT 'outbox', x'7b7d', 'dead', 0, 0 FROM n")
    }
    _ = try await store.enqueue(
      [NewJob(payload: payload("later"), runAt: epoch)], queue: "emails", now: epoch)
    let statements =
      [JobStatus.pending, nil].flatMap {
        [ListingSQL.windowed($0), ListingSQL.idsAfter($0)]
      } + [ListingSQL.windowEnd, SQL.job, SQL.list(.pending), SQL.list(nil)]
    for status in [JobStatus.pending, nil] {
      try await store.connection.perform { db in
        for sql in statements {
          _ = sqlite3_stmt_status(try db.statement(sql).handle, SQLITE_STMTSTATUS_VM_STEP, 1)
        }
      }
      let page = try await store.jobs(queue: "emails", status: status, after: nil, limit: 50)
      #expect(page.map { String(decoding: $0.payload, as: UTF8.self) } == ["welcome", "later"])
      let steps = try await store.connection.perform { db -> Int32 in
        try statements.reduce(0) {
          $0 + sqlite3_stmt_status(try db.statement($1).handle, SQLITE_STMTSTATUS_VM_STEP, 0)
        }
      }
      // About 40 steps for each of the window's 256 rows (22 columns); the table is 200,000 rows.
      #expect(
        steps < 12_000,
        "a page of 2 jobs took \(steps) steps beside 200,000 rows (\(String(describing: status)))")
    }
  }
}
