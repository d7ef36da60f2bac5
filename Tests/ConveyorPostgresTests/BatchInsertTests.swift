import Conveyor
import Foundation
import Testing

@testable import ConveyorPostgres

/// A batch of like jobs (one priority, one run time, no keys) takes a statement of its own, with
/// one array of payloads: it must store what the general batch statement stores.
@Suite("PostgreSQL batches of like jobs")
struct BatchInsertTests {
  func job(_ text: String, runTime: RunTime, key: String? = nil, priority: Int) -> NewJob {
    NewJob(payload: Data(text.utf8), priority: priority, runTime: runTime, deduplicationKey: key)
  }

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
        texts.map { job($0, runTime: time, priority: priority) }, queue: "q", clock: clock)
      let general = try await store.enqueue(
        texts.enumerated().map {
          job($1, runTime: time, key: $0 == 4 ? "k\(index)" : nil, priority: priority)
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
      [job("m1", runTime: .now, priority: 1), job("m2", runTime: .after(.seconds(60)), priority: 2)],
      queue: "m",
      clock: clock)
    let first = try #require(try await store.job(mixed[0].id))
    let second = try #require(try await store.job(mixed[1].id))
    #expect(first.priority == 1 && second.priority == 2)
    #expect(first.status == .pending && second.runAt > first.runAt)
    await store.close()
  }
}
