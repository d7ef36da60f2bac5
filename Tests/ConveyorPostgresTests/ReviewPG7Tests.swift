import Conveyor
import ConveyorTestSupport
import Foundation
import Testing

@testable import ConveyorPostgres

// Review 7: batches of like jobs (one priority, one run time, no key) go through
// `SQL.insertUniform`; they must store what the general statement stores, all or nothing.

@Suite("ReviewPG7: batches of like jobs", .serialized, .timeLimit(.minutes(2)))
struct ReviewPG7Tests {
  static func open(_ schema: String, clock: PostgresJobStore.Clock) async throws -> PostgresJobStore {
    let server = try await PostgresServer.shared()
    return try await PostgresJobStore.open(
      url: server.url + "?sslmode=disable", options: .init(schema: schema, clock: clock))
  }

  /// The stored row of `id`, as text, from another session.
  static func row(_ admin: AdminConnection, _ schema: String, _ id: JobID, absolute: Bool) throws -> [String?]
  {
    try admin.query(
      """
      SELECT status, priority, encode(payload, 'hex'),
        \(absolute ? "run_at::text" : "(run_at - created_at)::text"), dedup_key IS NULL,
        attempts, queue
      FROM \(schema).jobs WHERE id = \(id.rawValue)
      """
    ).first ?? []
  }

  @Test(arguments: [PostgresJobStore.Clock.caller, .database])
  func likeBatchesStoreWhatTheGeneralStatementStores(_ clockKind: PostgresJobStore.Clock) async throws {
    let schema = uniqueSchema("pg7like")
    let store = try await Self.open(schema, clock: clockKind)
    let admin = try AdminConnection(try await PostgresServer.shared().url)
    let clock = FixedJobClock(Date(timeIntervalSince1970: 1_800_000_000.5))
    let large = Data((0..<(3 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 31) })
    let payloads: [Data] = [Data(), Data([0, 0, 0]), large, Data("é\u{0}x".utf8), Data()]
    let priorities = [Int.min, Int.max, 0, -1, Int(Int32.max) + 1]
    let times: [RunTime] = [
      .now, .after(.milliseconds(1)), .after(.seconds(90)), .at(clock.now()), .at(Date.distantFuture),
      .at(Date(timeIntervalSince1970: 0)),
    ]
    for priority in priorities {
      for time in times {
        let like = try await store.enqueue(
          payloads.map { NewJob(payload: $0, priority: priority, runTime: time) }, queue: "q", clock: clock)
        // Same jobs plus one with a key: the general statement.
        let general = try await store.enqueue(
          payloads.map { NewJob(payload: $0, priority: priority, runTime: time) }
            + [
              NewJob(
                payload: Data("k".utf8), priority: priority, runTime: time,
                deduplicationKey: UUID().uuidString)
            ],
          queue: "q", clock: clock)
        #expect(like.count == payloads.count && like.allSatisfy(\.inserted))
        #expect(like.map(\.id) == like.map(\.id).sorted() && Set(like.map(\.id)).count == like.count)
        for position in payloads.indices {
          var absolute = false
          if case .at = time { absolute = true }
          let a = try Self.row(admin, schema, like[position].id, absolute: absolute)
          let b = try Self.row(admin, schema, general[position].id, absolute: absolute)
          #expect(a == b, "priority \(priority), \(time), job \(position): like \(a) vs general \(b)")
          #expect(
            a.count > 1 && a[1] == String(priority),
            "priority \(priority) stored as \(a.count > 1 ? a[1] ?? "nil" : "?")")
          let record = try #require(try await store.job(like[position].id))
          #expect(record.payload == payloads[position])
        }
      }
    }
    await store.close()
  }

  /// An application's trigger drops one row of a like batch: the add fails, nothing of it is
  /// stored; also when the batch runs in a transaction (a key that exists already).
  @Test func aDroppedRowFailsTheWholeLikeBatch() async throws {
    let schema = uniqueSchema("pg7skip")
    let store = try await Self.open(schema, clock: .caller)
    let admin = try AdminConnection(try await PostgresServer.shared().url)
    let clock = SystemJobClock()
    let existing = try await store.enqueue(
      [NewJob(payload: Data("e".utf8), deduplicationKey: "e")], queue: "q", clock: clock)[0]
    try admin.query(
      """
      CREATE FUNCTION \(schema).skip() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        IF NEW.payload = '\\x736b6970'::bytea THEN RETURN NULL; END IF;
        RETURN NEW;
      END $$;
      CREATE TRIGGER skip BEFORE INSERT ON \(schema).jobs FOR EACH ROW EXECUTE FUNCTION \(schema).skip();
      """)
    func count() throws -> String? {
      try admin.query("SELECT count(*) FROM \(schema).jobs").first?.first ?? nil
    }
    let before = try count()
    await #expect(throws: (any Error).self) {
      _ = try await store.enqueue(
        ["a", "skip", "c"].map { NewJob(payload: Data($0.utf8), priority: 3) }, queue: "q", clock: clock)
    }
    #expect(try count() == before)
    await #expect(throws: (any Error).self) {
      _ = try await store.enqueue(
        [NewJob(payload: Data("e2".utf8), deduplicationKey: "e")]
          + ["a", "b", "skip"].map { NewJob(payload: Data($0.utf8), priority: 3) }, queue: "q", clock: clock)
    }
    #expect(try count() == before)
    // The store still works, through both statements.
    let ok = try await store.enqueue(
      [NewJob(payload: Data("e3".utf8), deduplicationKey: "e")]
        + ["a", "b"].map { NewJob(payload: Data($0.utf8), priority: 3) }, queue: "q", clock: clock)
    #expect(ok[0] == EnqueueResult(id: existing.id, inserted: false))
    #expect(ok[1].inserted && ok[2].inserted && ok[1].id < ok[2].id)
    await store.close()
  }

  /// Mixed batches: existing keys, duplicates in the batch, keyless jobs; results in input order.
  @Test func mixedBatchesAnswerInInputOrder() async throws {
    let schema = uniqueSchema("pg7mixed")
    let store = try await Self.open(schema, clock: .database)
    let clock = SystemJobClock()
    let e = try await store.enqueue(
      [NewJob(payload: Data("e".utf8), deduplicationKey: "e")], queue: "q", clock: clock)[0]
    let jobs: [NewJob] = [
      NewJob(payload: Data("x1".utf8)), NewJob(payload: Data("e-again".utf8), deduplicationKey: "e"),
      NewJob(payload: Data("x2".utf8)), NewJob(payload: Data("n".utf8), deduplicationKey: "n"),
      NewJob(payload: Data("n-again".utf8), deduplicationKey: "n"), NewJob(payload: Data("x3".utf8)),
    ]
    let results = try await store.enqueue(jobs, queue: "q", clock: clock)
    #expect(results.count == jobs.count)
    #expect(results[1] == EnqueueResult(id: e.id, inserted: false))
    #expect(results[4] == EnqueueResult(id: results[3].id, inserted: false))
    #expect(results[0].inserted && results[2].inserted && results[3].inserted && results[5].inserted)
    #expect(results[0].id < results[2].id && results[2].id < results[3].id && results[3].id < results[5].id)
    for index in [0, 2, 3, 5] {
      #expect(try await store.job(results[index].id)?.payload == jobs[index].payload)
    }
    // Existing keys and like jobs: the like statement in a transaction.
    let second = try await store.enqueue(
      [
        NewJob(payload: Data("y1".utf8)), NewJob(payload: Data("n2".utf8), deduplicationKey: "n"),
        NewJob(payload: Data("y2".utf8)), NewJob(payload: Data("e2".utf8), deduplicationKey: "e"),
        NewJob(payload: Data("y3".utf8)),
      ], queue: "q", clock: clock)
    #expect(second[1] == EnqueueResult(id: results[3].id, inserted: false))
    #expect(second[3] == EnqueueResult(id: e.id, inserted: false))
    #expect(second[0].inserted && second[2].inserted && second[4].inserted)
    #expect(second[0].id < second[2].id && second[2].id < second[4].id)
    for (index, text) in [(0, "y1"), (2, "y2"), (4, "y3")] {
      #expect(try await store.job(second[index].id)?.payload == Data(text.utf8))
    }
    await store.close()
  }
}
