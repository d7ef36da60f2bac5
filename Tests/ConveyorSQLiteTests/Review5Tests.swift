import Conveyor
import ConveyorTestSupport
import Foundation
import Testing

@testable import ConveyorSQLite

/// Adversarial review of version 5 on SQLite: adds whose row a trigger drops
/// (`EnqueueGroups.insert`), and retry dates.
@Suite("Review5Tests: dropped rows and retry dates", .serialized, .timeLimit(.minutes(2)))
struct Review5Tests {
  func job(_ text: String, key: String? = nil) -> NewJob {
    NewJob(payload: payload(text), runAt: epoch, deduplicationKey: key)
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
    let results = try await Review4Tests.grouped(
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

  // Retry dates on SQLite: exactly the applied retries, each the stored run date, with clamped
  // delays at a clock near the latest date a store keeps.
  @Test func retryDatesAreTheStoredRunDates() async throws {
    let folder = try TemporaryFolder()
    let store = try makeStore(folder)
    for base in [JobStoreTime.latest.addingTimeInterval(-86_400.4567), epoch.addingTimeInterval(0.0006)] {
      let clock = FixedJobClock(base)
      _ = try await store.enqueue((0..<9).map { job("j\($0)") }, queue: "r", clock: clock)
      let claimed = try await store.settleAndClaim([], queue: "r", limit: 9, lease: lease(), clock: clock)
        .claimed
      #expect(claimed.count == 9)
      let refs = claimed.map { ClaimReference(id: $0.id, token: $0.claimToken) }
      let actions: [JobSettlement.Action] = [
        .retry(after: .zero, error: "e"), .retry(after: .milliseconds(1500), error: nil),
        .retry(after: .seconds(Int64.max), error: nil),
        .retry(after: .seconds(86_400 * 365 * 200), error: nil),
        .retry(after: .seconds(-5), error: nil), .complete, .kill(error: "k"), .release(error: nil),
      ]
      var settlements = zip(refs, actions).map { JobSettlement(claim: $0, action: $1) }
      settlements.append(
        JobSettlement(
          claim: ClaimReference(id: refs[8].id, token: refs[8].token + 7),
          action: .retry(after: .seconds(1), error: nil)))
      let batch = try await store.settleAndClaim(
        settlements, queue: "r", limit: 0, lease: lease(), clock: clock)
      let retried = Set(refs[0..<5].map(\.id))
      #expect(Set(batch.retryDates.keys) == retried)
      #expect(batch.staleSettlements == [ClaimReference(id: refs[8].id, token: refs[8].token + 7)])
      for id in retried {
        let stored = try await store.job(id)?.runAt
        #expect(batch.retryDates[id] == stored, "job \(id)")
      }
      _ = try await store.clear(queue: "r", statuses: Set(JobStatus.allCases))
    }
    await store.close()
  }
}
