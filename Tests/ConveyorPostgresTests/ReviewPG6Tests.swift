import Conveyor
import ConveyorTestSupport
import Foundation
import Testing

@testable import ConveyorPostgres

// Review 6, probes of promise 3: a listing page in ID order of some statuses, read per stored
// status from jobs_status with LATERAL and merged by ID: every job exactly once in ID order when
// paging with `after`, with any status filter and any limit, beside other queues.

@Suite("ReviewPG6: listing pages merged by status", .serialized, .timeLimit(.minutes(2)))
struct ReviewPG6Tests {
  /// Fills queue "q" with ready, scheduled, running and dead jobs interleaved in ID order, beside
  /// "other" and "q2" (whose jobs interleave by ID too). Returns the store and the expected
  /// (id, status) of "q" in ID order.
  static func fill(_ schema: String) async throws -> (PostgresJobStore, [(JobID, JobStatus)]) {
    let server = try await PostgresServer.shared()
    let store = try await PostgresJobStore.open(
      url: server.url + "?sslmode=disable", options: .init(schema: schema))
    let clock = SystemJobClock()
    for index in 0..<90 {
      let runTime: RunTime = index % 5 == 1 ? .after(.seconds(3_600)) : .now
      _ = try await store.enqueue(
        [NewJob(payload: Data("q\(index)".utf8), priority: index % 3, runTime: runTime)], queue: "q",
        clock: clock)
      _ = try await store.enqueue([NewJob(payload: Data("o\(index)".utf8))], queue: "other", clock: clock)
      if index % 4 == 0 {
        _ = try await store.enqueue([NewJob(payload: Data("q2\(index)".utf8))], queue: "q2", clock: clock)
      }
    }
    let lease = Lease(owner: "w", duration: .seconds(600))
    let claimed = try await store.settleAndClaim([], queue: "q", limit: 40, lease: lease, clock: clock)
      .claimed
    // Half of the claimed die, a few are retried far ahead (scheduled again), the rest run.
    var settlements: [JobSettlement] = []
    for (index, job) in claimed.enumerated() {
      switch index % 4 {
      case 0, 1: settlements.append(JobSettlement(claim: job.claim, action: .kill(error: "dead \(index)")))
      case 2:
        settlements.append(
          JobSettlement(claim: job.claim, action: .retry(after: .seconds(3_600), error: "later")))
      default: break
      }
    }
    _ = try await store.settleAndClaim(settlements, queue: "q", limit: 0, lease: lease, clock: clock)
    // Also other queues' running and dead jobs.
    let others = try await store.settleAndClaim([], queue: "other", limit: 30, lease: lease, clock: clock)
      .claimed
    _ = try await store.settleAndClaim(
      others.prefix(15).map { JobSettlement(claim: $0.claim, action: .kill(error: "x")) }, queue: "other",
      limit: 0,
      lease: lease, clock: clock)
    let all = try await store.jobs(queue: "q", status: nil, after: nil, limit: .max)
    return (store, all.map { ($0.id, $0.status) })
  }

  static func page(
    _ store: PostgresJobStore, status: JobStatus?, limit: Int, after start: JobID? = nil
  ) async throws -> [JobRecord] {
    var after = start
    var listed: [JobRecord] = []
    var pages = 0
    while true {
      let page = try await store.jobs(queue: "q", status: status, after: after, limit: limit)
      if page.isEmpty { break }
      #expect(page.count <= limit)
      listed += page
      after = page.last?.id
      pages += 1
      if pages > 10_000 { break }
    }
    return listed
  }

  @Test func everyJobOnceInIDOrderForEveryStatusAndLimit() async throws {
    let schema = uniqueSchema("pg6list")
    let (store, expected) = try await Self.fill(schema)
    defer { Task { await store.close() } }
    // The expected list is itself checked against the table.
    let admin = try AdminConnection(try await PostgresServer.shared().url)
    let table = try admin.query("SELECT id, status FROM \(schema).jobs WHERE queue = 'q' ORDER BY id")
    #expect(table.map { Int64($0[0]!)! } == expected.map(\.0.rawValue))
    let stored = Dictionary(uniqueKeysWithValues: table.map { (Int64($0[0]!)!, $0[1]!) })
    #expect(
      Set(stored.values) == ["ready", "scheduled", "running", "dead"], "all four stored statuses present")
    #expect(expected.count == 90)

    for status in [nil, JobStatus.pending, .running, .dead] {
      let want = expected.filter { status == nil || $0.1 == status }.map(\.0)
      for limit in [1, 2, 3, 4, 7, 16, 89, 90, 91, 1_000, Int.max] {
        let listed = try await Self.page(store, status: status, limit: limit)
        #expect(
          listed.map(\.id) == want,
          "status \(String(describing: status)), limit \(limit): \(listed.count) listed, \(want.count) expected"
        )
        #expect(listed.allSatisfy { $0.queue == "q" && (status == nil || $0.status == status) })
      }
      // After the last ID: nothing. After an ID of another queue, or before the first: the rest.
      if let last = want.last {
        #expect(try await store.jobs(queue: "q", status: status, after: last, limit: 5).isEmpty)
        #expect(try await store.jobs(queue: "q", status: status, after: last, limit: .max).isEmpty)
        let middle = want[want.count / 2]
        let rest = try await Self.page(store, status: status, limit: 3, after: middle)
        #expect(rest.map(\.id) == Array(want.drop { $0 <= middle }))
        let fromZero = try await store.jobs(queue: "q", status: status, after: JobID(0), limit: .max)
        #expect(fromZero.map(\.id) == want)
        let fromMin = try await store.jobs(queue: "q", status: status, after: JobID(Int64.min), limit: 1)
        #expect(fromMin.map(\.id) == [want[0]])
        let past = try await store.jobs(queue: "q", status: status, after: JobID(Int64.max), limit: .max)
        #expect(past.isEmpty)
      }
    }
    // The records listed are the stored ones.
    for record in try await store.jobs(queue: "q", status: nil, after: nil, limit: .max) {
      #expect(try await store.job(record.id) == record)
    }
    // A limit of 0 or below lists nothing; an unknown queue nothing.
    #expect(try await store.jobs(queue: "q", status: nil, after: nil, limit: 0).isEmpty)
    #expect(try await store.jobs(queue: "q", status: nil, after: nil, limit: -1).isEmpty)
    #expect(try await store.jobs(queue: "nope", status: nil, after: nil, limit: .max).isEmpty)
  }

  /// The same listing on the in-memory store (the reference semantics) and on PostgreSQL, for a
  /// random history of calls on both: equal pages of IDs and statuses.
  @Test func listingsMatchTheInMemoryStore() async throws {
    let schema = uniqueSchema("pg6ref")
    let server = try await PostgresServer.shared()
    let store = try await PostgresJobStore.open(
      url: server.url + "?sslmode=disable", options: .init(schema: schema))
    defer { Task { await store.close() } }
    let memory = InMemoryJobStore()
    let clock = SystemJobClock()
    let lease = Lease(owner: "w", duration: .seconds(600))
    var idMap: [JobID: JobID] = [:]  // PostgreSQL ID -> in-memory ID
    var generator = SystemRandomNumberGenerator()
    var heldPG: [JobRecord] = []
    var heldMem: [JobID: JobRecord] = [:]
    for round in 0..<30 {
      let count = Int.random(in: 1...6, using: &generator)
      let jobs = (0..<count).map { index in
        NewJob(
          payload: Data("\(round)-\(index)".utf8), priority: 0,
          runTime: index % 3 == 2 ? .after(.seconds(3_600)) : .now)
      }
      let a = try await store.enqueue(jobs, queue: "q", clock: clock)
      let b = try await memory.enqueue(jobs, queue: "q", clock: clock)
      for (x, y) in zip(a, b) { idMap[x.id] = y.id }
      _ = try await store.enqueue([NewJob(payload: Data("o".utf8))], queue: "other", clock: clock)
      let claimA = try await store.settleAndClaim([], queue: "q", limit: 2, lease: lease, clock: clock)
        .claimed
      let claimB = try await memory.settleAndClaim([], queue: "q", limit: 2, lease: lease, clock: clock)
        .claimed
      #expect(claimA.map { idMap[$0.id] } == claimB.map(\.id), "claims differ in round \(round)")
      heldPG += claimA
      for job in claimB { heldMem[job.id] = job }
      if round % 3 == 0, let victim = heldPG.first {
        heldPG.removeFirst()
        let twin = heldMem.removeValue(forKey: idMap[victim.id]!)!
        _ = try await store.settleAndClaim(
          [JobSettlement(claim: victim.claim, action: .kill(error: "x"))], queue: "q", limit: 0, lease: lease,
          clock: clock)
        _ = try await memory.settleAndClaim(
          [JobSettlement(claim: twin.claim, action: .kill(error: "x"))], queue: "q", limit: 0, lease: lease,
          clock: clock)
      }
    }
    for status in [nil, JobStatus.pending, .running, .dead] {
      for limit in [1, 5, Int.max] {
        let a = try await Self.page(store, status: status, limit: limit)
        var b: [JobRecord] = []
        var after: JobID?
        while true {
          let page = try await memory.jobs(queue: "q", status: status, after: after, limit: limit)
          if page.isEmpty { break }
          b += page
          after = page.last?.id
        }
        #expect(a.map { idMap[$0.id] } == b.map(\.id), "status \(String(describing: status)), limit \(limit)")
        #expect(a.map(\.status) == b.map(\.status))
      }
    }
  }
}
