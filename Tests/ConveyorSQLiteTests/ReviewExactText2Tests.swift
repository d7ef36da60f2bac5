import Conveyor
import ConveyorTestSupport
import Foundation
import Testing

@testable import ConveyorSQLite

/// Review: queue names and keys compared byte for byte, the same in SQLite and in memory.
@Suite("Review exact text 2 (SQLite)")
struct ReviewExactText2Tests {
  private func job(_ text: String, key: String? = nil, priority: Int = 0) -> NewJob {
    NewJob(payload: payload(text), priority: priority, runAt: epoch, deduplicationKey: key)
  }

  private static func bytes(_ text: String?) -> String {
    text.map { $0.unicodeScalars.map { String($0.value, radix: 16) }.joined(separator: ".") } ?? "nil"
  }

  private static func describe(_ record: JobRecord) -> String {
    "\(record.id.rawValue) q=\(bytes(record.queue)) k=\(bytes(record.deduplicationKey)) \(record.status) a=\(record.attempts)"
  }

  /// The same calls on SQLite and on the in-memory store, with canonically equivalent (and
  /// compatibility-equivalent) queue names and keys; every answer is written down and compared.
  private static func script(_ store: any JobStore) async throws -> [String] {
    var log: [String] = []
    let composed = "caf\u{E9}"
    let decomposed = "cafe\u{301}"
    let queues = [composed, decomposed, "f", "\u{AC00}", "\u{1100}\u{1161}", "K", "\u{212A}", "q"]
    let keys = [
      composed, decomposed, "", "\0", "a\0b", "a\u{FFFD}b", "a\u{323}\u{307}", "a\u{307}\u{323}",
      "\u{AC00}", "\u{1100}\u{1161}", "K", "\u{212A}", String(repeating: "z", count: 5000),
    ]
    for queue in queues {
      let batch =
        keys.map { NewJob(payload: payload($0), runAt: epoch, deduplicationKey: $0) }
        + keys.reversed().map { NewJob(payload: payload($0), runAt: epoch, deduplicationKey: $0) }
      let results = try await store.enqueue(batch, queue: queue, now: epoch)
      log.append("enqueue \(bytes(queue)): \(results.map { "\($0.id.rawValue)\($0.inserted ? "+" : "=")" })")
    }
    for queue in queues {
      let again = try await store.enqueue(
        keys.map { NewJob(payload: payload("again"), runAt: epoch, deduplicationKey: $0) }, queue: queue,
        now: epoch)
      log.append("again \(bytes(queue)): \(again.map { "\($0.id.rawValue)\($0.inserted ? "+" : "=")" })")
    }
    log.append("names \(try await store.queueNames().map { bytes($0) })")
    // Claim two from the composed queue; kill one, let the other run; dedup checks on both.
    let claimed = try await store.settleAndClaim(
      [], queue: composed, limit: 2, lease: lease(), now: epoch)
    log.append("claimed \(claimed.claimed.map(describe))")
    let whileRunning = try await store.enqueue(
      claimed.claimed.map {
        NewJob(payload: payload("new"), runAt: epoch, deduplicationKey: $0.deduplicationKey)
      },
      queue: composed, now: epoch)
    log.append("while running \(whileRunning.map { "\($0.id.rawValue)\($0.inserted ? "+" : "=")" })")
    let killed = try await store.settleAndClaim(
      claimed.claimed.map { JobSettlement(claim: $0.claim, action: .kill(error: "x")) }, queue: composed,
      limit: 0,
      lease: lease(), now: epoch)
    log.append("kill stale \(killed.staleSettlements)")
    log.append(
      "requeue held \(try await store.requeueDead(nil, queue: composed, clock: FixedJobClock(epoch)))")
    // The waiting copies go away: the dead ones can come back.
    _ = try await store.remove(whileRunning.map(\.id), queue: composed)
    log.append("requeue \(try await store.requeueDead(nil, queue: composed, clock: FixedJobClock(epoch)))")
    try await store.setPaused(true, queue: decomposed)
    try await store.setPaused(true, queue: "\u{212A}")
    for queue in queues {
      let paused = try await store.isPaused(queue: queue)
      let counts = try await store.counts(queue: queue, now: epoch)
      let hint = try await store.nextWake(queue: queue, clock: FixedJobClock(epoch))
      log.append("\(bytes(queue)) paused=\(paused) counts=\(counts) wake=\(hint)")
      let listed = try await store.jobs(queue: queue, status: nil, after: nil, limit: 100)
      log.append("\(bytes(queue)) jobs \(listed.map(describe))")
    }
    log.append("cleared \(try await store.clear(queue: "\u{1100}\u{1161}", statuses: [.pending]))")
    log.append("names \(try await store.queueNames().map { bytes($0) })")
    log.append("removed \(try await store.remove([JobID(1), JobID(2)], queue: decomposed))")
    log.append("names \(try await store.queueNames().map { bytes($0) })")
    return log
  }

  @Test func sqliteAnswersAsTheInMemoryStoreDoes() async throws {
    let folder = try TemporaryFolder()
    let sqlite = try makeStore(folder)
    let onDisk = try await Self.script(sqlite)
    let inMemory = try await Self.script(InMemoryJobStore())
    for (index, (a, b)) in zip(onDisk, inMemory).enumerated() where a != b {
      Issue.record("step \(index) differs:\n  SQLite:    \(a)\n  in memory: \(b)")
    }
    #expect(onDisk.count == inMemory.count)
  }

  /// `activity(since:limit:)` is "sorted by queue and then minute": the rows are sorted with
  /// `String`'s `<`, which takes two canonically equivalent names for one, so the minutes of two
  /// queues interleave (and the queues come in `String` order, not the bytes' order).
  @Test func activityOfEquivalentNamesIsNotInterleaved() async throws {
    let folder = try TemporaryFolder()
    let store = try makeStore(folder)
    let composed = "caf\u{E9}"
    let decomposed = "cafe\u{301}"
    let m1 = QueueActivity.minute(containing: Date().addingTimeInterval(-600))
    let m2 = m1.addingTimeInterval(60)
    let m3 = m1.addingTimeInterval(120)
    try await store.recordActivity([
      QueueActivity(queue: composed, minute: m1, succeeded: 1),
      QueueActivity(queue: decomposed, minute: m2, succeeded: 2),
      QueueActivity(queue: composed, minute: m3, succeeded: 3),
    ])
    let rows = try await store.activity(since: m1, limit: 10)
    let order = rows.map { Self.bytes($0.queue) }
    // Byte order: "cafe\u{301}" (…65 CC 81) before "caf\u{E9}" (…C3 A9); each queue's minutes together.
    #expect(
      order == [Self.bytes(decomposed), Self.bytes(composed), Self.bytes(composed)],
      "rows: \(rows.map { (Self.bytes($0.queue), $0.succeeded) })")
  }
}
