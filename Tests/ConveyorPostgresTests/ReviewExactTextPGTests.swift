import Conveyor
import ConveyorTestSupport
import Foundation
import Testing

@testable import ConveyorPostgres

/// Review: queue names and keys compared byte for byte on PostgreSQL.
@Suite("Review exact text (PostgreSQL)")
struct ReviewExactTextPGTests {
  private static let t0 = Date(timeIntervalSince1970: 1_700_000_000)

  private static func bytes(_ text: String) -> String {
    text.unicodeScalars.map { String($0.value, radix: 16) }.joined(separator: ".")
  }

  private func open() async throws -> PostgresJobStore {
    let server = try await PostgresServer.shared()
    return try await PostgresJobStore.open(
      url: server.url, options: .init(schema: uniqueSchema(), clock: .caller))
  }

  /// `waitForWork(queue:)` answers whether the store learned of work for that queue. The listener
  /// matches a notification's queue name to its waiters with `String`'s `==` (and keeps its
  /// watched set and owed returns by `String`): an add to "caf\u{E9}" wakes the waiter of
  /// "cafe\u{301}", another queue, which has no job.
  @Test func anAddToOneQueueDoesNotWakeTheWaiterOfAnEquivalentName() async throws {
    let store = try await open()
    let composed = "caf\u{E9}"
    let decomposed = "cafe\u{301}"
    // The listener starts with this wait, and its first LISTEN ends it.
    _ = await store.waitForWork(queue: composed, timeout: .seconds(30))
    // The first wait for a queue the listener never watched may return at once: done here.
    _ = await store.waitForWork(queue: decomposed, timeout: .milliseconds(300))
    let waiter = Task { await store.waitForWork(queue: decomposed, timeout: .seconds(4)) }
    _ = try await store.enqueue(
      [NewJob(payload: Data("x".utf8), runAt: Self.t0)], queue: composed, clock: FixedJobClock(Self.t0))
    let woke = await waiter.value
    let counts = try await store.counts(queue: decomposed, clock: FixedJobClock(Self.t0))
    #expect(!woke, "the waiter of \(Self.bytes(decomposed)) was told of work; its counts: \(counts)")
    await store.close()
  }

  /// The listener keeps the returns owed to a queue's watchers (a notification that came while
  /// its watcher was between two waits) under a `String` key: the waiter of "cafe\u{301}" takes
  /// the return owed to "caf\u{E9}", whose watcher then sleeps on a ready job (a lost wake-up).
  @Test func aReturnOwedToOneQueueIsNotTakenByAnEquivalentName() async throws {
    let store = try await open()
    let composed = "caf\u{E9}"
    let decomposed = "cafe\u{301}"
    _ = await store.waitForWork(queue: composed, timeout: .seconds(30))
    _ = await store.waitForWork(queue: decomposed, timeout: .milliseconds(300))
    // No wait in progress: the add's notification is owed to the composed queue's next wait.
    _ = try await store.enqueue(
      [NewJob(payload: Data("x".utf8), runAt: Self.t0)], queue: composed, clock: FixedJobClock(Self.t0))
    try await eventually("the notification came", timeout: .seconds(30)) {
      store.listener!.owedReturns(composed) > 0
    }
    let otherWoke = await store.waitForWork(queue: decomposed, timeout: .seconds(2))
    let ownWoke = await store.waitForWork(queue: composed, timeout: .seconds(2))
    let counts = try await store.counts(queue: composed, clock: FixedJobClock(Self.t0))
    #expect(!otherWoke, "the other queue's waiter was told of work")
    #expect(ownWoke, "the composed queue's watcher missed its notification; its counts: \(counts)")
    await store.close()
  }

  /// Rows are merged by the name's bytes, then written under `storable(name)` (NUL as U+FFFD): two
  /// names that differ only there become one key twice in one `INSERT … ON CONFLICT DO UPDATE`.
  @Test func activityOfNamesThatStoreAlikeIsRecorded() async throws {
    let store = try await open()
    let minute = QueueActivity.minute(containing: Date().addingTimeInterval(-60))
    do {
      try await store.recordActivity([
        QueueActivity(queue: "a\0b", minute: minute, succeeded: 1),
        QueueActivity(queue: "a\u{FFFD}b", minute: minute, succeeded: 2),
        QueueActivity(queue: "mail", minute: minute, succeeded: 5),
      ])
    } catch {
      Issue.record("recordActivity failed (every queue's counts lost): \(error)")
    }
    let rows = try await store.activity(since: minute, limit: 10)
    #expect(
      rows.reduce(0) { $0 + $1.succeeded } == 8, "rows: \(rows.map { (Self.bytes($0.queue), $0.succeeded) })")
    await store.close()
  }

  /// `activity(since:limit:)` is sorted by queue and then minute with `String`'s `<`: two
  /// equivalent names' minutes interleave.
  @Test func activityOfEquivalentNamesIsNotInterleaved() async throws {
    let store = try await open()
    let composed = "caf\u{E9}"
    let decomposed = "cafe\u{301}"
    let m1 = QueueActivity.minute(containing: Date().addingTimeInterval(-600))
    try await store.recordActivity([
      QueueActivity(queue: composed, minute: m1, succeeded: 1),
      QueueActivity(queue: decomposed, minute: m1.addingTimeInterval(60), succeeded: 2),
      QueueActivity(queue: composed, minute: m1.addingTimeInterval(120), succeeded: 3),
    ])
    let rows = try await store.activity(since: m1, limit: 10)
    #expect(
      rows.map { Self.bytes($0.queue) } == [
        Self.bytes(decomposed), Self.bytes(composed), Self.bytes(composed),
      ],
      "rows: \(rows.map { (Self.bytes($0.queue), $0.succeeded) })")
    await store.close()
  }

  /// Keys of odd content, equivalent variants, in one batch and across calls; a key too long for
  /// the index is refused with a clear error.
  @Test func oddAndLongKeysWork() async throws {
    let store = try await open()
    var generator = SystemRandomNumberGenerator()
    let alphabet = Array("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
    let long = String((0..<6000).map { _ in alphabet.randomElement(using: &generator)! })
    let keys = [
      "caf\u{E9}", "cafe\u{301}", "", "\0", "a\0b", "a\u{FFFD}b", "a\u{323}\u{307}", "a\u{307}\u{323}",
      "\u{AC00}", "\u{1100}\u{1161}", "K", "\u{212A}", "\u{10FFFF}",
    ]
    let clock = FixedJobClock(Self.t0)
    let first = try await store.enqueue(
      (keys + keys.reversed()).map { NewJob(payload: Data($0.utf8), runAt: Self.t0, deduplicationKey: $0) },
      queue: "q", clock: clock)
    #expect(first.prefix(keys.count).allSatisfy { $0.inserted })
    #expect(Array(first.suffix(keys.count).map(\.id)) == first.prefix(keys.count).map(\.id).reversed())
    #expect(Set(first.map(\.id)).count == keys.count)
    let listed = try await store.jobs(queue: "q", status: nil, after: nil, limit: 100)
    #expect(listed.map { $0.deduplicationKey.map { Array($0.utf8) } } == keys.map { Array($0.utf8) })
    // A key too long for PostgreSQL's index (SQLite and the in-memory store take any length) is
    // refused with an error that says what to do, and nothing of the add is stored (a documented
    // limit of `NewJob.deduplicationKey`; the error was PostgreSQL's own before).
    let before = try await store.counts(queue: "q", clock: clock)
    do {
      _ = try await store.enqueue(
        [
          NewJob(payload: Data("short".utf8), runAt: Self.t0),
          NewJob(payload: Data("long".utf8), runAt: Self.t0, deduplicationKey: long),
        ], queue: "q", clock: clock)
      Issue.record("a 6000-character random key was taken; update the documented limit")
    } catch let error as PostgresError {
      #expect(error.description.contains("deduplication key of 6000 bytes is too long"), "\(error)")
      #expect(error.description.contains("use a shorter key"), "\(error)")
    }
    #expect(try await store.counts(queue: "q", clock: clock) == before, "nothing of the add was stored")
    await store.close()
  }

  /// Two stores enqueue overlapping keys (with equivalent variants) in opposite orders, many times
  /// at once: no deadlock, one job per key.
  @Test func overlappingBatchesInOppositeOrdersDoNotDeadlock() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema()
    let a = try await PostgresJobStore.open(url: server.url, options: .init(schema: schema, clock: .caller))
    let b = try await PostgresJobStore.open(url: server.url, options: .init(schema: schema, clock: .caller))
    let keys = (0..<12).flatMap { ["k\($0)\u{E9}", "k\($0)e\u{301}"] }
    let clock = FixedJobClock(Self.t0)
    for round in 0..<20 {
      let queue = "q\(round)"
      async let one = a.enqueue(
        keys.map { NewJob(payload: Data($0.utf8), runAt: Self.t0, deduplicationKey: $0) }, queue: queue,
        clock: clock)
      async let two = b.enqueue(
        keys.reversed().map { NewJob(payload: Data($0.utf8), runAt: Self.t0, deduplicationKey: $0) },
        queue: queue,
        clock: clock)
      let (x, y) = try await (one, two)
      #expect(x.map(\.id) == y.map(\.id).reversed(), "round \(round)")
      #expect(Set(x.map(\.id)).count == keys.count)
      #expect(x.filter { $0.inserted }.count + y.filter { $0.inserted }.count == keys.count)
    }
    await a.close()
    await b.close()
  }
}
