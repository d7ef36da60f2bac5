import Conveyor
import ConveyorTestSupport
import Foundation
import Testing

@testable import ConveyorPostgres

/// A batch of like jobs (one priority, one run time, no keys) takes a statement of its own, with
/// one array of payloads, and an add of one job the scalar statement: each must store what the
/// general batch statement stores, deduplicate with it, and a batch a trigger cuts short is all or
/// nothing.
@Suite("PostgreSQL adds: batches and single jobs", .serialized)
struct BatchInsertTests {
  @Test func aBatchOfLikeJobsStoresWhatTheGeneralStatementStores() async throws {
    let server = try await PostgresServer.shared()
    let store = try await PostgresJobStore.open(
      url: server.url, options: .init(schema: uniqueSchema("like"), clock: .caller))
    let clock = ManualJobClock(start: Date(timeIntervalSince1970: 1_800_000_000.123))
    let times = RunTime.edgeCases(around: clock.now())
    for (index, time) in times.enumerated() {
      let priority = index - 5
      let texts = (0..<5).map { "like-\(index)-\($0)" }
      // Like jobs: the uniform statement. The same with a key on the last: the general one.
      let like = try await store.enqueue(
        texts.map { textJob($0, runTime: time, priority: priority) }, queue: "q", clock: clock)
      let general = try await store.enqueue(
        texts.enumerated().map {
          textJob($1, runTime: time, key: $0 == 4 ? "k\(index)" : nil, priority: priority)
        },
        queue: "q", clock: clock)
      #expect(like.allSatisfy(\.inserted) && general.allSatisfy(\.inserted))
      // IDs increase in the order of the call.
      #expect(like.map(\.id) == like.map(\.id).sorted() && Set(like.map(\.id)).count == 5, "\(time): IDs")
      for position in 0..<5 {
        let a = try #require(try await store.job(like[position].id))
        let b = try #require(try await store.job(general[position].id))
        #expect(String(decoding: a.payload, as: UTF8.self) == texts[position], "\(time): payload in order")
        #expect(a.payload == b.payload && a.priority == b.priority && a.priority == priority, "\(time)")
        #expect(a.status == b.status, "\(time): status \(a.status) vs \(b.status)")
        #expect(a.runAt == b.runAt, "\(time): run date \(a.runAt) vs \(b.runAt)")
        #expect(a.createdAt == b.createdAt, "\(time): created")
        #expect(a.deduplicationKey == nil && a.attempts == 0)
      }
    }
    // Different priorities or run times in one batch are not like jobs: each keeps its own.
    let mixed = try await store.enqueue(
      [textJob("m1", runTime: .now, priority: 1), textJob("m2", runTime: .after(.seconds(60)), priority: 2)],
      queue: "m",
      clock: clock)
    let first = try #require(try await store.job(mixed[0].id))
    let second = try #require(try await store.job(mixed[1].id))
    #expect(first.priority == 1 && second.priority == 2)
    #expect(first.status == .pending && second.runAt > first.runAt)
    await store.close()
  }

  // An add of one job (the scalar statement) stores exactly what the batch statement stores:
  // status, run date (clamped), priority, key, payload, for every kind of run time.
  @Test func oneJobAddsStoreWhatBatchAddsStore() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("pg3one")
    let store = try await openNamedStore(server, .init(schema: schema, clock: .caller))
    let clock = ManualJobClock(start: Date(timeIntervalSince1970: 1_800_000_000.123))
    let times = RunTime.edgeCases(around: clock.now())
    for (index, time) in times.enumerated() {
      let single = try await store.enqueue(
        [textJob("p\(index)", runTime: time, key: "s\(index)", priority: index - 5)], queue: "one",
        clock: clock)
      let batch = try await store.enqueue(
        [textJob("p\(index)", runTime: time, key: "b\(index)", priority: index - 5), textJob("filler")],
        queue: "one", clock: clock)
      let a = try #require(try await store.job(single[0].id))
      let b = try #require(try await store.job(batch[0].id))
      #expect(a.status == b.status, "\(time): status")
      #expect(a.runAt == b.runAt, "\(time): run date \(a.runAt) vs \(b.runAt)")
      #expect(a.createdAt == b.createdAt, "\(time): created")
      #expect(a.priority == b.priority && a.payload == b.payload, "\(time)")
      #expect(a.deduplicationKey == "s\(index)" && b.deduplicationKey == "b\(index)")
    }
    // Empty payload and empty key go through the scalar statement as values, not NULL.
    let empty = try await store.enqueue(
      [NewJob(payload: Data(), deduplicationKey: "")], queue: "one", clock: clock)
    let record = try #require(try await store.job(empty[0].id))
    #expect(record.payload == Data() && record.deduplicationKey == "")
    let again = try await store.enqueue(
      [NewJob(payload: Data("other".utf8), deduplicationKey: "")], queue: "one", clock: clock)
    #expect(again == [EnqueueResult(id: empty[0].id, inserted: false)])
    await store.close()
  }

  // Deduplication through the one-job statement and mixed batches: IDs in input order, the
  // existing job returned, duplicates within the batch folded.
  @Test func deduplicationAcrossOneJobAndBatchAdds() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("pg3dedup")
    let store = try await openNamedStore(server, .init(schema: schema))
    let clock = SystemJobClock()
    let first = try await store.enqueue([textJob(key: "k")], queue: "d", clock: clock)[0]
    #expect(first.inserted)
    let dup = try await store.enqueue([textJob(key: "k")], queue: "d", clock: clock)
    #expect(dup == [EnqueueResult(id: first.id, inserted: false)])
    // [existing, new key, no key, same new key, existing]: two inserts, in input order.
    let mixed = try await store.enqueue(
      [textJob(key: "k"), textJob(key: "m"), textJob(), textJob(key: "m"), textJob(key: "k")], queue: "d",
      clock: clock)
    #expect(mixed[0] == EnqueueResult(id: first.id, inserted: false))
    #expect(mixed[1].inserted && mixed[2].inserted && mixed[1].id < mixed[2].id)
    #expect(mixed[3] == EnqueueResult(id: mixed[1].id, inserted: false))
    #expect(mixed[4] == EnqueueResult(id: first.id, inserted: false))
    // One insert among duplicates takes the one-job statement.
    let oneAmong = try await store.enqueue(
      [textJob(key: "k"), textJob(key: "z"), textJob(key: "z")], queue: "d", clock: clock)
    #expect(oneAmong[0] == EnqueueResult(id: first.id, inserted: false))
    #expect(oneAmong[1].inserted && oneAmong[2] == EnqueueResult(id: oneAmong[1].id, inserted: false))
    // Another queue's key is another key.
    let other = try await store.enqueue([textJob(key: "k")], queue: "d2", clock: clock)
    #expect(other[0].inserted && other[0].id != first.id)
    #expect(try await store.counts(queue: "d", clock: clock).ready == 4)
    #expect(try await store.queueNames() == ["d", "d2"])
    await store.close()
  }

  // Fixed (failed before the fix for a batch without keys; the batch statement now checks its
  // count and fails whole): an application's BEFORE INSERT trigger that skips a row (RETURN
  // NULL), the PostgreSQL counterpart of SQLite's RAISE(IGNORE). The JobStore contract: "Methods that change jobs are
  // atomic: when one throws, nothing it was asked to change changed" (JobStore.swift:308). A
  // batch without keys is sent as one autocommit statement (PostgresJobStore.swift:263-264), and
  // the count check that throws runs after that statement committed
  // (PostgresJobStore.swift:242-246): the call fails, yet the other jobs of the batch are stored.
  @Test(arguments: [false, true])
  func aBatchAddWithARowATriggerSkipsIsAllOrNothing(keyed: Bool) async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("pg5skip")
    let store = try await PostgresJobStore.open(url: server.url, options: .init(schema: schema))
    let admin = try AdminConnection(server.url)
    try admin.query(
      """
      CREATE FUNCTION \(schema).skip() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        IF NEW.payload = '\\x64726f70'::bytea THEN RETURN NULL; END IF;
        RETURN NEW;
      END $$;
      CREATE TRIGGER skip BEFORE INSERT ON \(schema).jobs FOR EACH ROW EXECUTE FUNCTION \(schema).skip();
      """)
    let clock = SystemJobClock()
    let jobs = [textJob("a", key: keyed ? "a" : nil), textJob("drop"), textJob("c")]
    var outcome = ""
    do {
      let results = try await store.enqueue(jobs, queue: "s", clock: clock)
      outcome = "returned \(results)"
    } catch {
      outcome = "threw \(error)"
    }
    let stored = try admin.scalar("SELECT count(*) FROM \(schema).jobs") ?? "?"
    // Either all-or-nothing failure (0 stored) or an answer that reports no skipped row as added.
    if outcome.hasPrefix("threw") {
      #expect(stored == "0", "keyed=\(keyed): the add \(outcome), yet \(stored) of its jobs are stored")
    } else {
      Issue.record("keyed=\(keyed): the add \(outcome) with \(stored) jobs stored")
    }
    await store.close()
  }
}
