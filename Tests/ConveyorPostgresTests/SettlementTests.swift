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

/// Settling claims on PostgreSQL as the in-memory reference store does: completions alone or in
/// mixed batches, stale tokens, another queue's jobs (stale, as in the reference store), retry
/// dates that are the stored run dates, text with NUL, and a whole scenario compared value by
/// value.
@Suite("PostgreSQL: settling claims", .serialized)
struct SettlementTests {
  struct Scenario {
    var applied: Set<JobID>
    var stale: [ClaimReference]
  }

  /// Claims jobs in two queues, then settles in queue `ca`: a current completion twice, a stale
  /// token, another queue's job, a removed job, a rescued-and-reclaimed job's old claim, an
  /// unknown ID; with `mixed` a kill of one more current claim joins the batch.
  func completions(mixed: Bool) async throws -> (stale: [ClaimReference], rows: [String: String]) {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema(mixed ? "pg3mix" : "pg3comp")
    let store = try await openNamedStore(server, .init(schema: schema, clock: .caller))
    let clock = ManualJobClock()
    let lease = Lease(owner: "w", duration: .seconds(30))
    let a = try await store.enqueue((0..<6).map { textJob("a\($0)") }, queue: "ca", clock: clock).map(\.id)
    let b = try await store.enqueue([textJob("b")], queue: "cb", clock: clock).map(\.id)
    let claimedA = try await store.settleAndClaim([], queue: "ca", limit: 5, lease: lease, clock: clock)
      .claimed
    let claimedB = try await store.settleAndClaim([], queue: "cb", limit: 1, lease: lease, clock: clock)
      .claimed
    #expect(claimedA.map(\.id) == Array(a.prefix(5)) && claimedB.map(\.id) == b)
    let claim = Dictionary(uniqueKeysWithValues: (claimedA + claimedB).map { ($0.id, $0.claim) })
    // a[2] is removed; a[3]'s lease lapses, it is rescued and claimed again (new token).
    _ = try await store.remove([a[2]], queue: "ca")
    _ = try await store.heartbeat(
      [claim[a[0]]!, claim[a[1]]!, claim[a[4]]!], queue: "ca",
      lease: Lease(owner: "w", duration: .seconds(3600)), clock: clock)
    clock.step(by: .seconds(60))
    #expect(try await store.rescueExpiredLeases(queue: "ca", clock: clock) == 1)
    let reclaimed = try await store.settleAndClaim([], queue: "ca", limit: 1, lease: lease, clock: clock)
      .claimed
    #expect(reclaimed.map(\.id) == [a[3]])
    var settlements = [
      JobSettlement(claim: claim[a[0]]!, action: .complete),
      JobSettlement(claim: claim[a[0]]!, action: .complete),
      JobSettlement(claim: ClaimReference(id: a[1], token: claim[a[1]]!.token - 1), action: .complete),
      JobSettlement(claim: claim[b[0]]!, action: .complete),
      JobSettlement(claim: claim[a[2]]!, action: .complete),
      JobSettlement(claim: claim[a[3]]!, action: .complete),
      JobSettlement(claim: ClaimReference(id: JobID(9_000_000), token: 1), action: .complete),
    ]
    if mixed { settlements.append(JobSettlement(claim: claim[a[4]]!, action: .kill(error: "k"))) }
    let batch = try await store.settleAndClaim(settlements, queue: "ca", limit: 0, lease: lease, clock: clock)
    let admin = try AdminConnection(server.url)
    var rows: [String: String] = [:]
    for row in try admin.query("SELECT payload, status FROM \"\(schema)\".jobs ORDER BY id") {
      let hex = row[0] ?? ""
      rows[hex] = row[1] ?? ""
    }
    await store.close()
    return (batch.staleSettlements, rows)
  }

  // Completions alone (their own statement) and a mixed batch report the same stale settlements
  // and change the same rows.
  @Test func completionsAloneAndMixedBatchesAgree() async throws {
    let alone = try await completions(mixed: false)
    let mixed = try await completions(mixed: true)
    // Both scenarios number their jobs from their own schema's sequence: compare positions.
    #expect(alone.stale.count == 5, "stale: \(alone.stale)")
    #expect(mixed.stale.count == 5, "stale: \(mixed.stale)")
    var expectedMixed = alone.rows
    expectedMixed["\\x6134"] = "dead"
    #expect(alone.rows["\\x6134"] == "running")
    #expect(mixed.rows == expectedMixed, "alone \(alone.rows) mixed \(mixed.rows)")
    #expect(alone.rows["\\x6130"] == "completed", "the current completion applied")
    #expect(alone.rows["\\x6131"] == "running" && alone.rows["\\x62"] == "running")
    #expect(alone.rows["\\x6133"] == "running", "the rescued job's new claim is untouched")
  }

  // NUL in a lease owner and in errors is stored as U+FFFD (checked in the UTF-8 bytes now).
  @Test func nulInOwnerAndErrorsIsStoredAsReplacement() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("pg3nul")
    let store = try await openNamedStore(server, .init(schema: schema))
    let clock = SystemJobClock()
    _ = try await store.enqueue([textJob(), textJob()], queue: "n", clock: clock)
    let owner = "w\0x\0"
    let claimed = try await store.settleAndClaim(
      [], queue: "n", limit: 2, lease: Lease(owner: owner, duration: .seconds(30)), clock: clock
    ).claimed
    #expect(claimed.map(\.leaseOwner) == ["w\u{FFFD}x\u{FFFD}", "w\u{FFFD}x\u{FFFD}"])
    let result = try await store.settleAndClaim(
      [JobSettlement(claim: claimed[0].claim, action: .kill(error: "e\0r"))], queue: "n", limit: 0,
      lease: Lease(owner: owner, duration: .seconds(30)), clock: clock)
    #expect(result.staleSettlements.isEmpty)
    #expect(try await store.job(claimed[0].id)?.lastError == "e\u{FFFD}r")
    await store.close()
  }

  // Failed before the fix: settlements and heartbeats are not scoped to the queue they are sent for: the
  // `settle` and `heartbeat` statements in SQL.swift match on `id` and `claim_token` only (no
  // `queue = $n`). A worker of queue "a" can complete, kill or extend a running job of queue "b";
  // `InMemoryJobStore` (the reference) reports such a settlement stale and leaves the job alone.
  @Test func outcomesAndHeartbeatsSentForAnotherQueueAreStaleAsInTheReferenceStore() async throws {
    let server = try await PostgresServer.shared()
    let clock = ManualJobClock()
    let postgres = try await openNamedStore(server, .init(schema: uniqueSchema("rv"), clock: .caller))
    let memory = InMemoryJobStore()
    let lease = Lease(owner: "w", duration: .seconds(30))
    var outcomes: [String: (stale: Int, heartbeat: Int, counts: JobCounts)] = [:]
    let stores: [(String, any JobStore)] = [("memory", memory), ("postgres", postgres)]
    for (name, store) in stores {
      _ = try await store.enqueue([NewJob(payload: Data("b".utf8))], queue: "b", clock: clock)
      let claim = try await store.settleAndClaim([], queue: "b", limit: 1, lease: lease, clock: clock)
        .claimed[0]
        .claim
      let beat = try await store.heartbeat([claim], queue: "a", lease: lease, clock: clock)
      let batch = try await store.settleAndClaim(
        [JobSettlement(claim: claim, action: .complete)], queue: "a", limit: 0, lease: lease, clock: clock)
      let counts = try await store.counts(queue: "b", clock: clock)
      outcomes[name] = (stale: batch.staleSettlements.count, heartbeat: beat.count, counts: counts)
    }
    let reference = try #require(outcomes["memory"])
    let actual = try #require(outcomes["postgres"])
    #expect(reference.stale == 1 && reference.counts.running == 1, "the reference leaves b's job alone")
    #expect(actual.heartbeat == reference.heartbeat, "a heartbeat sent for queue a does not extend b's job")
    #expect(actual.stale == reference.stale, "a settlement sent for queue a is stale for b's job")
    #expect(actual.counts == reference.counts, "b's job is still running: \(actual.counts)")
    await postgres.close()
  }

  // One settlement of each kind (retries of several delays, among them clamped ones), and a stale
  // retry: `retryDates` holds exactly the applied retries, each equal to the stored run date.
  @Test(arguments: [PostgresJobStore.Clock.database, .caller])
  func retryDatesAreTheStoredRunDates(clock kind: PostgresJobStore.Clock) async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("pg5retry")
    let store = try await PostgresJobStore.open(url: server.url, options: .init(schema: schema, clock: kind))
    // Near the latest date a store keeps, so long delays clamp; or now.
    let dates: [Date] =
      kind == .caller
      ? [JobStoreTime.latest.addingTimeInterval(-86_400.4567), Date(timeIntervalSince1970: 1_000.0006)]
      : [Date()]
    for base in dates {
      let clock = FixedJobClock(base)
      let queue = "r\(Int(base.timeIntervalSince1970) & 0xffff)"
      let added = try await store.enqueue((0..<9).map { textJob("j\($0)") }, queue: queue, clock: clock)
      #expect(added.count == 9)
      let lease = Lease(owner: "w", duration: .seconds(3600))
      let claimed = try await store.settleAndClaim([], queue: queue, limit: 9, lease: lease, clock: clock)
        .claimed
      #expect(claimed.count == 9)
      let refs = claimed.map { ClaimReference(id: $0.id, token: $0.claimToken) }
      let actions: [JobSettlement.Action] = [
        .retry(after: .zero, error: "e"),
        .retry(after: .milliseconds(1500), error: nil),
        .retry(after: .seconds(Int64.max), error: "long"),
        .retry(after: .seconds(86_400 * 365 * 200), error: nil),
        .retry(after: .seconds(-5), error: nil),
        .complete,
        .kill(error: "k"),
        .release(error: nil),
      ]
      var settlements = zip(refs, actions).map { JobSettlement(claim: $0, action: $1) }
      // A stale retry: the last claim with a wrong token.
      settlements.append(
        JobSettlement(
          claim: ClaimReference(id: refs[8].id, token: refs[8].token + 7),
          action: .retry(after: .seconds(1), error: nil)))
      let batch = try await store.settleAndClaim(
        settlements, queue: queue, limit: 0, lease: lease, clock: clock)
      let retried = Set(refs[0..<5].map(\.id))
      #expect(Set(batch.retryDates.keys) == retried, "keys \(batch.retryDates.keys)")
      #expect(batch.staleSettlements == [ClaimReference(id: refs[8].id, token: refs[8].token + 7)])
      for id in retried {
        let stored = try await store.job(id)?.runAt
        #expect(
          batch.retryDates[id] == stored,
          "job \(id): reported \(String(describing: batch.retryDates[id])), stored \(String(describing: stored))"
        )
      }
    }
    await store.close()
  }

  /// One scenario on both stores with the same manual clock: the claim order, the stored run
  /// dates (far future, clamped), priorities at the extremes, NUL bytes and a large payload.
  @Test func sameScenarioSameResultsAsTheInMemoryStore() async throws {
    let server = try await PostgresServer.shared()
    let postgres = try await openNamedStore(server, .init(schema: uniqueSchema("rv"), clock: .caller))
    let memory = InMemoryJobStore()
    let big = Data((0..<(8 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 31) })
    func scenario(_ store: any JobStore) async throws -> [String] {
      let clock = ManualJobClock()
      let start = clock.now()
      var log: [String] = []
      let jobs: [NewJob] = [
        NewJob(payload: Data("a\0b".utf8)),
        NewJob(payload: Data("p5".utf8), priority: 5, runTime: .after(.seconds(10))),
        NewJob(payload: Data("old".utf8), runAt: start.addingTimeInterval(-60)),
        NewJob(payload: Data("max".utf8), priority: Int.max),
        NewJob(payload: Data("min".utf8), priority: Int.min),
        NewJob(payload: Data("far".utf8), runAt: .distantFuture),
        NewJob(payload: Data("inf".utf8), runAt: Date(timeIntervalSince1970: .infinity)),
        NewJob(payload: Data("longdelay".utf8), runTime: .after(.seconds(Int64.max))),
        NewJob(payload: Data("k1".utf8), deduplicationKey: "k\0x"),
        NewJob(payload: Data("k2".utf8), deduplicationKey: "k\0y"),
        NewJob(payload: Data("k3".utf8), deduplicationKey: "k\0x"),
        NewJob(payload: big),
      ]
      let results = try await store.enqueue(jobs, queue: "o", clock: clock)
      let ids = results.map(\.id)
      log.append("inserted \(results.map(\.inserted))")
      func name(_ id: JobID) -> String { "\(ids.firstIndex(of: id).map(String.init) ?? "?")" }
      let lease = Lease(owner: "wx", duration: .seconds(30))
      var pending: [JobSettlement] = []
      for step in 0..<12 {
        let batch = try await store.settleAndClaim(pending, queue: "o", limit: 2, lease: lease, clock: clock)
        pending = []
        for (index, job) in batch.claimed.enumerated() {
          log.append(
            "step \(step) claimed \(name(job.id)) attempts \(job.attempts) runAt \(job.runAt.timeIntervalSince(start)) "
              + "payload-ok \(job.payload == jobs[ids.firstIndex(of: job.id)!].payload) owner \(job.leaseOwner ?? "-")"
          )
          let action: JobSettlement.Action =
            switch (step + index) % 4 {
            case 0: .complete
            case 1: .retry(after: .seconds(3), error: "err")
            case 2: .release(error: nil)
            default: .retry(after: .seconds(Int64.max), error: nil)
            }
          pending.append(JobSettlement(claim: job.claim, action: action))
        }
        clock.advance(by: .seconds(2))
      }
      _ = try await store.settleAndClaim(pending, queue: "o", limit: 0, lease: lease, clock: clock)
      let counts = try await store.counts(queue: "o", clock: clock)
      log.append("counts \(counts)")
      for record in try await store.jobs(queue: "o", status: nil, after: nil, limit: 100) {
        log.append(
          "left \(name(record.id)) \(record.status) runAt \(record.runAt.timeIntervalSince1970) "
            + "error \(record.lastError ?? "-") key \(record.deduplicationKey.map { Array($0.utf8) } ?? [])")
      }
      let wake = try await store.nextWake(queue: "o", clock: clock)
      log.append("wake \(wake.nextRun.map { $0.timeIntervalSince(start) } ?? -1)")
      return log
    }
    let reference = try await scenario(memory)
    let actual = try await scenario(postgres)
    let lines = max(reference.count, actual.count)
    for line in 0..<lines {
      let expected = line < reference.count ? reference[line] : "<none>"
      let got = line < actual.count ? actual[line] : "<none>"
      #expect(got == expected, "line \(line)")
    }
    await postgres.close()
  }

  /// A settle-and-claim the server carried out (and committed) whose answer the network lost
  /// (``AnswerLosingProxy``): the store connects again and runs the call again. The second run
  /// must not claim beside the first run's claim, which no worker hears of (it would stay running
  /// with no handler until its lease lapses, its attempt counted), nor report the first run's
  /// recorded outcome as stale (the queue would then say it was not recorded, and drop its event).
  @Test func aCallWhoseAnswerWasLostNeitherClaimsTwiceNorCallsItsRecordedOutcomeStale() async throws {
    let server = try await PostgresServer.shared()
    let proxy = try AnswerLosingProxy(target: server.port)
    defer { proxy.close() }
    let store = try await PostgresJobStore.open(
      url: proxy.url, options: .init(schema: uniqueSchema("pglostans"), reconnectTimeout: .seconds(20)))
    let clock = SystemJobClock()
    let lease = Lease(owner: "w", duration: .seconds(60))
    let ids = try await store.enqueue(["a", "b", "c", "d"].map { textJob($0) }, queue: "q", clock: clock)
      .map(\.id)
    // Claims "a", then records it and claims "b", as a worker would: the statements are prepared on
    // this connection from now on, so the call below is one round trip.
    let first = try await store.settleAndClaim([], queue: "q", limit: 1, lease: lease, clock: clock)
    let claimOfA = try #require(first.claimed.first?.claim)
    let second = try await store.settleAndClaim(
      [JobSettlement(claim: claimOfA, action: .complete)], queue: "q", limit: 1, lease: lease, clock: clock)
    #expect(first.claimed.map(\.id) == [ids[0]] && second.claimed.map(\.id) == [ids[1]])
    let claimOfB = try #require(second.claimed.first?.claim)

    proxy.arm()
    let batch = try await store.settleAndClaim(
      [JobSettlement(claim: claimOfB, action: .complete)], queue: "q", limit: 1, lease: lease, clock: clock)
    #expect(proxy.cuts == 1, "the answer of the call was lost once")
    #expect(try await store.job(ids[1])?.status == .completed)
    let running = try await store.jobs(queue: "q", status: .running, after: nil, limit: 10)
    // Known gap (the PostgreSQL guide, "Limits"): the run again cannot tell that the first run
    // committed. Nothing is lost (the orphaned claim is rescued when its lease lapses), but its
    // attempt is counted and the recorded outcome reads as not recorded.
    withKnownIssue(
      "a settle-and-claim run again after a lost answer claims twice and calls its outcome stale"
    ) {
      #expect(
        batch.staleSettlements.isEmpty,
        "the completion of b was recorded, not stale: \(batch.staleSettlements)"
      )
      #expect(
        running.map(\.id) == batch.claimed.map(\.id),
        "running in the store: \(running.map(\.id)) (attempts \(running.map(\.attempts))); claimed by the call: \(batch.claimed.map(\.id))"
      )
    }
    await store.close()
  }
}

/// A TCP proxy in front of a server that, once armed, passes the client's next bytes on to the
/// server, swallows the server's answers to them, and half a second later breaks the connection:
/// a call the server carried out whose answer the network lost.
final class AnswerLosingProxy: Sendable {
  let port: Int
  private let target: Int
  private let listener: Int32
  private let sockets = Mutex<[Int32]>([])
  private let armed = Atomic<Bool>(false)
  private let cutCount = Atomic<Int>(0)

  /// One proxied connection: whether the server's answers are swallowed.
  private final class Link: Sendable {
    let losing = Atomic<Bool>(false)
  }

  var url: String { "postgresql://postgres@127.0.0.1:\(port)/postgres" }
  /// How many connections were broken so.
  var cuts: Int { cutCount.load(ordering: .acquiring) }

  init(target: Int) throws {
    self.target = target
    (listener, port) = try PostgresServer.loopbackSocket(listening: true)
    Thread { [self] in acceptLoop() }.start()
  }

  /// The next bytes any client sends are answered into the void, then the connection breaks.
  func arm() { armed.store(true, ordering: .releasing) }

  func close() {
    shutdown(listener, Int32(SHUT_RDWR))
    for socket in sockets.withLock({ $0 }) { shutdown(socket, Int32(SHUT_RDWR)) }
  }

  private func acceptLoop() {
    PostgresServer.acceptProxied(on: listener, to: target) { client, server in
      sockets.withLock { $0 += [client, server] }
      let link = Link()
      Thread { [self] in pump(from: client, to: server, link: link, fromClient: true) }.start()
      Thread { [self] in pump(from: server, to: client, link: link, fromClient: false) }.start()
      return true
    }
  }

  private func pump(from source: Int32, to sink: Int32, link: Link, fromClient: Bool) {
    var buffer = [UInt8](repeating: 0, count: 65_536)
    while true {
      let count = buffer.withUnsafeMutableBytes { recv(source, $0.baseAddress!, $0.count, 0) }
      if count < 0 && errno == EINTR { continue }
      if count <= 0 {
        shutdown(sink, Int32(SHUT_RDWR))
        return
      }
      let cutting =
        fromClient
        && armed.compareExchange(
          expected: true, desired: false, ordering: .acquiringAndReleasing
        ).exchanged
      if cutting { link.losing.store(true, ordering: .releasing) }
      if !fromClient && link.losing.load(ordering: .acquiring) { continue }  // lost on the way
      guard
        buffer.withUnsafeBytes({
          PostgresServer.sendAll(sink, UnsafeRawBufferPointer(rebasing: $0[0..<count]))
        })
      else { return }
      if cutting {
        // The client's further bytes of the call still pass; the server carries it out meanwhile.
        Thread { [self] in
          Thread.sleep(forTimeInterval: 0.5)
          cutCount.add(1, ordering: .releasing)
          shutdown(source, Int32(SHUT_RDWR))
          shutdown(sink, Int32(SHUT_RDWR))
        }.start()
      }
    }
  }
}
