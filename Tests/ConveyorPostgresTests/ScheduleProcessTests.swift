import Conveyor
import ConveyorPostgres
import ConveyorTestSupport
import Foundation
import Testing

@Suite("Schedules across processes on PostgreSQL")
struct ScheduleProcessTests {
  /// Four worker processes share one schema and fire a 1-second schedule for a minute, on the
  /// server's clock, while one of them is killed with SIGKILL and started again about every
  /// second, just after a slot (when the workers are firing it). Every slot from the first to the
  /// last fired is added once: none twice, none skipped.
  @Test func fourWorkersFireEachOneSecondSlotOnceWhileBeingKilled() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("schedules")
    let folder = try makeFolder()
    defer { try? FileManager.default.removeItem(atPath: folder) }
    let store = try await PostgresJobStore.open(url: server.url, options: .init(schema: schema))
    let tick = try ScheduleDefinition(
      name: "tick", timing: try ScheduleTiming(every: .seconds(1)),
      payload: try JSONEncoder().encode(TestJob(number: 0)))
    _ = try await store.saveSchedules([tick], queue: "jobs", origin: .added, clock: SystemJobClock())
    let extra = ["--forever", "1", "--lease-ms", "5000"]
    var workers = try (0..<4).map {
      try WorkerProcess(url: server.url, schema: schema, folder: folder, name: "w\($0)-0", extra: extra)
    }
    var random = SeededRandom(seed: 34)
    let end = Date().addingTimeInterval(62)
    var kills = 0
    while Date() < end {
      // Just after the next whole second plus a little: when the workers fire that slot.
      let now = Date().timeIntervalSince1970
      let target = now.rounded(.down) + 1 + Double(random.below(40)) / 1_000
      try await Task.sleep(for: .milliseconds(Int64((target - now) * 1_000)))
      let victim = random.below(workers.count)
      workers[victim].kill()
      _ = await workers[victim].exitStatus()
      kills += 1
      workers[victim] = try WorkerProcess(
        url: server.url, schema: schema, folder: folder, name: "w\(victim)-\(kills)", extra: extra)
    }
    for worker in workers {
      worker.kill()
      _ = await worker.exitStatus()
    }
    var seconds: [Int64] = []
    var cursor: JobID?
    while true {
      let page = try await store.jobs(queue: "jobs", status: nil, after: cursor, limit: 1_000)
      guard let last = page.last else { break }
      seconds += page.map { Int64($0.runAt.timeIntervalSince1970.rounded(.down)) }
      cursor = last.id
    }
    let slots = seconds.sorted()
    #expect(Set(slots).count == slots.count, "a slot fired twice: \(slots)")
    #expect(slots.count >= 60, "sixty slots or more fired: \(slots.count), \(kills) kills")
    #expect(
      (slots.last ?? 0) - (slots.first ?? 0) + 1 == Int64(slots.count), "a slot was skipped: \(slots)")
    await store.close()
  }
  /// `schedules(queue:)` lists by queue and name in byte order, as SQLite and the in-memory
  /// store do (and as `queueNames()` does), whatever the database's collation: here a database
  /// of the ICU locale en-US.
  @Test func schedulesAreListedInByteOrderInAnICUDatabase() async throws {
    let server = try await PostgresServer.shared()
    let database = uniqueSchema("schedicu")
    try AdminConnection(server.url).query(
      "CREATE DATABASE \(database) TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' ENCODING 'UTF8'")
    let url = "postgresql://postgres@127.0.0.1:\(server.port)/\(database)"
    let store = try await PostgresJobStore.open(url: url, options: .init(schema: uniqueSchema("schedicu")))
    let names = ["B", "a", "a-b", "a_b", "a.b", "ab", "Z", "_x", "0"]
    let clock = SystemJobClock()
    for queue in ["b", "C"] {
      _ = try await store.saveSchedules(
        try names.map {
          try ScheduleDefinition(name: $0, timing: try ScheduleTiming(every: .seconds(60)), payload: Data())
        }, queue: queue, origin: .added, clock: clock)
    }
    func byBytes(_ left: String, _ right: String) -> Bool {
      Array(left.utf8).lexicographicallyPrecedes(Array(right.utf8))
    }
    let sortedNames = names.sorted(by: byBytes)
    let listed = try await store.schedules(queue: "b").map(\.name)
    #expect(listed == sortedNames, "one queue's schedules in byte order")
    let all = try await store.schedules(queue: nil).map { "\($0.queue)/\($0.name)" }
    #expect(all == ["C", "b"].flatMap { queue in sortedNames.map { "\(queue)/\($0)" } }, "every queue's")
    await store.close()
  }
}
