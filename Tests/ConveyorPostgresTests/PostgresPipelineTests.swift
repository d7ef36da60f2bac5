import Conveyor
import ConveyorTestSupport
import Foundation
import Testing

@testable import ConveyorPostgres

/// The store's one-round-trip claim: statements sent together (libpq's pipeline mode) run as one
/// transaction, fail as one, and leave the connection usable; a cancelled call stops the statement
/// it waits in.
@Suite("PostgreSQL pipelines")
struct PostgresPipelineTests {
  // Failed before the fix: prepared statements were found by `String` equality, which takes
  // canonically equivalent texts (a precomposed and a decomposed "é") for one, so the second text
  // ran the first one's statement (the same defect the review found in the SQLite store's cache).
  @Test func textsThatDifferOnlyInTheirUnicodeFormGetStatementsOfTheirOwn() async throws {
    let server = try await PostgresServer.shared()
    let connection = try Connection(conninfo: server.url, scrubber: Scrubber(secrets: []))
    let composed = "SELECT '\u{e9}' || $1::text"
    let decomposed = "SELECT 'e\u{301}' || $1::text"
    #expect(composed == decomposed, "Swift calls them equal")
    let first = try connection.execute(composed, [.text("!")]).text(0, 0)
    let second = try connection.execute(decomposed, [.text("!")]).text(0, 0)
    #expect(first.map { Array($0.utf8) } == Array("\u{e9}!".utf8))
    #expect(
      second.map { Array($0.utf8) } == Array("e\u{301}!".utf8),
      "the decomposed text ran the other's statement")
  }

  @Test func aFailingStatementRollsBackTheWholePipelineAndTheConnectionStaysUsable() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("pipe")
    let connection = try Connection(conninfo: server.url, scrubber: Scrubber(secrets: []))
    try connection.executeScript("CREATE SCHEMA \(schema); CREATE TABLE \(schema).t (v int8)")
    let insert = "INSERT INTO \(schema).t VALUES ($1)"
    #expect {
      _ = try connection.pipeline([
        (insert, [.int64(1)]),
        ("SELECT 1 / $1::int8", [.int64(0)]),
        (insert, [.int64(2)]),
      ])
    } throws: { ($0 as? PostgresError)?.sqlState == "22012" }
    let count = "SELECT count(*)::int8 FROM \(schema).t WHERE v > $1"
    #expect(try connection.execute(count, [.int64(0)]).int64(0, 0) == 0, "the first insert was rolled back")
    #expect(connection.isHealthy, "the connection left pipeline mode and is idle")

    let results = try connection.pipeline([
      (insert, [.int64(1)]),
      (insert, [.int64(2)]),
      ("SELECT sum(v)::int8 FROM \(schema).t WHERE v > $1", [.int64(0)]),
    ])
    #expect(results.count == 3)
    #expect(results[2].int64(0, 0) == 3, "each statement sees the ones before it")
    #expect(try connection.execute(count, [.int64(0)]).int64(0, 0) == 2, "committed at the end")
    try connection.executeScript("DROP SCHEMA \(schema) CASCADE")
  }

  @Test func cancellingAClaimThatWaitsForALockStopsItAndCommitsNothing() async throws {
    let server = try await PostgresServer.shared()
    let store = try await PostgresJobStore.open(
      url: server.url, options: .init(schema: uniqueSchema(), lockTimeout: .seconds(600)))
    let schema = store.options.schema
    let clock = SystemJobClock()
    let lease = Lease(owner: "w", duration: .seconds(60))
    _ = try await store.enqueue([NewJob(payload: Data("{}".utf8))], queue: "q", clock: clock)
    let job = try #require(
      try await store.settleAndClaim([], queue: "q", limit: 1, lease: lease, clock: clock).claimed.first)
    // Another connection holds the job's row, so the settlement waits for its lock (up to 600 s).
    let holder = try AdminConnection(server.url)
    try holder.query("BEGIN")
    try holder.query("SELECT * FROM \(schema).jobs WHERE id = \(job.id.rawValue) FOR UPDATE")
    let settlement = JobSettlement(claim: job.claim, action: .complete)
    let call = Task {
      try await store.settleAndClaim([settlement], queue: "q", limit: 1, lease: lease, clock: clock)
    }
    try await Task.sleep(for: .milliseconds(300))
    call.cancel()
    await #expect(throws: CancellationError.self) { try await call.value }
    try holder.query("ROLLBACK")
    #expect(try await store.counts(queue: "q", clock: clock).running == 1, "nothing was settled")
    // The store still works, and the settlement applies now.
    let batch = try await store.settleAndClaim([settlement], queue: "q", limit: 1, lease: lease, clock: clock)
    #expect(batch.staleSettlements.isEmpty)
    #expect(try await store.counts(queue: "q", clock: clock) == JobCounts())
    await store.close()
  }
}
