import CLibPQ
import Conveyor
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import ConveyorPostgres

#if canImport(Glibc)
  import Glibc
#endif

/// The store's connections keep named prepared statements: a change to the table under them (a
/// column's type, a new column, a rebuilt index) must not stop claims, listings or lookups, and a
/// reconnect prepares them again, each connection for its own schema.
@Suite("PostgreSQL: prepared statements", .serialized)
struct PreparedStatementTests {
  /// Runs `call` a few times; returns the errors it threw (empty once it succeeded).
  func errors<T: Sendable>(
    attempts: Int = 3, _ call: @Sendable () async throws -> T
  ) async -> [String] {
    var errors: [String] = []
    for _ in 0..<attempts {
      do {
        _ = try await call()
        return []
      } catch {
        errors.append(String(describing: error))
      }
    }
    return errors
  }

  // MARK: A table changed after its statements were prepared

  // Failed before the fix: the store's connection keeps its named prepared statements for its whole life
  // (Connection.prepare, the `prepared` cache). A change to the type of a column the store reads
  // (here `last_error text` -> `varchar(4000)`, a change that leaves every stored value and its
  // binary form as they were) makes each prepared statement that returns that column fail with
  // SQLSTATE 0A000 "cached plan must not change result type". The error is not a connection loss,
  // so the connection is kept, the statement stays cached, and every later claim fails the same
  // way until the process restarts: workers stop claiming for good. Before the change
  // (PQexecParams, the unnamed statement) the same call simply worked. A fresh store on the same
  // table works, which shows the table itself is fine.
  @Test func claimingKeepsWorkingAfterAColumnTypeChangesUnderAPreparedStatement() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("rp")
    let store = try await openNamedStore(server, .init(schema: schema, reconnectTimeout: .seconds(30)))
    defer { Task { await store.close() } }
    let clock = SystemJobClock()
    let lease = Lease(owner: "w", duration: .seconds(30))
    _ = try await store.enqueue(
      [NewJob(payload: Data("a".utf8)), NewJob(payload: Data("b".utf8))], queue: "mig", clock: clock)
    // Prepares the claim on the store's connection.
    let first = try await store.settleAndClaim([], queue: "mig", limit: 1, lease: lease, clock: clock)
    #expect(first.claimed.count == 1)

    let admin = try AdminConnection(server.url)
    try admin.query("ALTER TABLE \"\(schema)\".jobs ALTER COLUMN last_error TYPE varchar(4000)")

    let failures = await errors {
      try await store.settleAndClaim(
        [JobSettlement(claim: first.claimed[0].claim, action: .complete)], queue: "mig", limit: 1,
        lease: lease, clock: clock)
    }
    #expect(failures.isEmpty, "the claim fails after the ALTER, every time: \(failures)")

    // The table is fine: a store that prepares its statements afresh reads it.
    let fresh = try await openNamedStore(server, .init(schema: schema, reconnectTimeout: .seconds(30)))
    defer { Task { await fresh.close() } }
    let listed = try await fresh.jobs(queue: "mig", status: nil, after: nil, limit: 10)
    #expect(listed.count >= 1)
  }

  // Failed before the fix: as above, for the listings (all, and one status) and the lookup by ID (all prepared,
  // all return `lease_owner`): after `lease_owner text` -> `varchar(200)` they fail with "cached plan must not change
  // result type" on every call; the store never prepares them again (Connection.prepare).
  @Test func listingAndLookupKeepWorkingAfterAColumnTypeChangesUnderAPreparedStatement() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("rp")
    let store = try await openNamedStore(server, .init(schema: schema, reconnectTimeout: .seconds(30)))
    defer { Task { await store.close() } }
    let clock = SystemJobClock()
    let id = try await store.enqueue([NewJob(payload: Data("a".utf8))], queue: "mig", clock: clock)[0].id
    #expect(try await store.jobs(queue: "mig", status: nil, after: nil, limit: 10).map(\.id) == [id])
    #expect(try await store.jobs(queue: "mig", status: .dead, after: nil, limit: 10).isEmpty)
    #expect(try await store.job(id)?.id == id)

    let admin = try AdminConnection(server.url)
    try admin.query("ALTER TABLE \"\(schema)\".jobs ALTER COLUMN lease_owner TYPE varchar(200)")

    let listFailures = await errors { try await store.jobs(queue: "mig", status: nil, after: nil, limit: 10) }
    #expect(listFailures.isEmpty, "listing fails after the ALTER, every time: \(listFailures)")
    let statusFailures = await errors {
      try await store.jobs(queue: "mig", status: .dead, after: nil, limit: 10)
    }
    #expect(statusFailures.isEmpty, "listing by status fails after the ALTER: \(statusFailures)")
    let lookupFailures = await errors { try await store.job(id) }
    #expect(lookupFailures.isEmpty, "the lookup fails after the ALTER, every time: \(lookupFailures)")
  }

  // A change that leaves the result's types alone (a new column, an index dropped and
  // made again) is replanned by the server.
  @Test func addingAColumnAndRebuildingAnIndexUnderPreparedStatementsIsReplanned() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("rp")
    let store = try await openNamedStore(server, .init(schema: schema, reconnectTimeout: .seconds(30)))
    defer { Task { await store.close() } }
    let clock = SystemJobClock()
    let lease = Lease(owner: "w", duration: .seconds(30))
    _ = try await store.enqueue(
      [NewJob(payload: Data("a".utf8)), NewJob(payload: Data("b".utf8))], queue: "mig", clock: clock)
    let first = try await store.settleAndClaim([], queue: "mig", limit: 1, lease: lease, clock: clock)
    let admin = try AdminConnection(server.url)
    try admin.query(
      """
      ALTER TABLE "\(schema)".jobs ADD COLUMN note text;
      DROP INDEX "\(schema)".jobs_ready;
      CREATE INDEX jobs_ready ON "\(schema)".jobs (queue, priority DESC, run_at, id) WHERE status = 'ready';
      """)
    let second = try await store.settleAndClaim(
      [JobSettlement(claim: first.claimed[0].claim, action: .complete)], queue: "mig", limit: 1,
      lease: lease, clock: clock)
    #expect(second.claimed.count == 1 && second.staleSettlements.isEmpty)
  }

  // MARK: Reconnects and two schemas

  // After `pg_terminate_backend` the store reconnects, and the new connection prepares its
  // statements again; two stores on two schemas of one server never read each other's tables.
  @Test func preparedStatementsSurviveATerminatedBackendAndStayWithTheirSchema() async throws {
    let server = try await PostgresServer.shared()
    let schemaA = uniqueSchema("rpa")
    let schemaB = uniqueSchema("rpb")
    let a = try await openNamedStore(server, .init(schema: schemaA, reconnectTimeout: .seconds(30)))
    let b = try await openNamedStore(server, .init(schema: schemaB, reconnectTimeout: .seconds(30)))
    defer {
      Task {
        await a.close()
        await b.close()
      }
    }
    let clock = SystemJobClock()
    let lease = Lease(owner: "w", duration: .seconds(30))
    let idA = try await a.enqueue([NewJob(payload: Data("a".utf8))], queue: "q", clock: clock)[0].id
    let idB = try await b.enqueue([NewJob(payload: Data("b".utf8))], queue: "q", clock: clock)[0].id
    #expect(try await a.jobs(queue: "q", status: nil, after: nil, limit: 10).map(\.id) == [idA])
    #expect(try await b.jobs(queue: "q", status: nil, after: nil, limit: 10).map(\.id) == [idB])

    let admin = try AdminConnection(server.url)
    try admin.query(
      "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name IN ('\(schemaA)', '\(schemaB)')"
    )
    let claimedA = try await a.settleAndClaim([], queue: "q", limit: 5, lease: lease, clock: clock).claimed
    let claimedB = try await b.settleAndClaim([], queue: "q", limit: 5, lease: lease, clock: clock).claimed
    #expect(claimedA.map(\.id) == [idA])
    #expect(claimedB.map(\.id) == [idB])
    #expect(try await a.counts(queue: "q", clock: clock).running == 1)
  }
}
