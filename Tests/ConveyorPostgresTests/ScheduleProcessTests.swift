import Conveyor
import ConveyorPostgres
import ConveyorTestSupport
import Foundation
import Synchronization
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
    _ = try await store.saveSchedules(
      [try SlotFiringProbe.schedule()], queue: "jobs", origin: .added, clock: SystemJobClock())
    let extra = ["--forever", "1", "--lease-ms", "5000"]
    func start(_ slot: Int, _ generation: Int) throws -> WorkerProcess {
      try WorkerProcess(
        url: server.url, schema: schema, folder: folder, name: "w\(slot)-\(generation)", extra: extra)
    }
    let kills = try await SlotFiringProbe.killJustAfterSlots(
      try (0..<4).map { try start($0, 0) }, for: 62,
      kill: { worker in
        worker.kill()
        _ = await worker.exitStatus()
      }, start: start)
    let problems = try await SlotFiringProbe.problems(store, queue: "jobs", least: 60)
    #expect(problems.isEmpty, "\(problems) (\(kills) kills)")
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

extension ScheduleProcessTests {
  /// Schedules stored two hours and ten minutes ago (on the caller's clock, the test's), while no
  /// worker ran: the first worker process started fires each catch-up policy's slots exactly
  /// (see `CatchUpProbe`), judged by the server's clock on the same machine.
  @Test func aWorkerStartedAfterDowntimeFiresEachCatchUpPolicysSlots() async throws {
    let server = try await PostgresServer.shared()
    let folder = try makeFolder()
    defer { try? FileManager.default.removeItem(atPath: folder) }
    let schemas = Mutex<[String]>([])
    let problems = try await CatchUpProbe.check {
      let schema = uniqueSchema("catchup")
      schemas.withLock { $0.append(schema) }
      let store = try await PostgresJobStore.open(
        url: server.url, options: .init(schema: schema, clock: .caller))
      return (store, { await store.close() })
    } startWorker: { _ in
      let schema = schemas.withLock { $0.last ?? "" }
      let worker = try WorkerProcess(
        url: server.url, schema: schema, folder: folder, name: "w", extra: ["--forever", "1"])
      return {
        worker.kill()
        _ = await worker.exitStatus()
      }
    }
    #expect(problems.isEmpty, "\(problems)")
  }
}

extension ScheduleProcessTests {
  /// With `Clock.database` a pause and a declaration judge the slots they fire by the server's
  /// clock, as a firing does, whatever the caller's clock says (here years behind): the pause
  /// fires the slot due before it, the resume skips none after it, and each slot is added once.
  @Test func aPauseAndADeclarationFireTheSlotsDueByTheServersClock() async throws {
    let server = try await PostgresServer.shared()
    let store = try await PostgresJobStore.open(
      url: server.url, options: .init(schema: uniqueSchema("schedclock")))
    let behind = FixedJobClock(Date(timeIntervalSince1970: 1_700_000_000))
    func every(_ text: String) throws -> ScheduleDefinition {
      try ScheduleDefinition(
        name: "s", timing: try ScheduleTiming(every: .seconds(1)), payload: Data(text.utf8))
    }
    _ = try await store.saveSchedules([try every("a")], queue: "q", origin: .declared, clock: behind)
    let created = try #require(try await store.schedules(queue: "q").first).createdAt
    try await Task.sleep(for: .milliseconds(1_300))
    #expect(try await store.setSchedulePaused(true, name: "s", queue: "q", clock: behind))
    let paused = try await store.jobs(queue: "q", status: nil, after: nil, limit: 100)
    #expect(!paused.isEmpty, "the pause fired no slot due by the server's clock")
    #expect(
      paused.allSatisfy { $0.runAt > created }, "slots from before the schedule: \(paused.map(\.runAt))")
    #expect(try await store.setSchedulePaused(false, name: "s", queue: "q", clock: behind))
    let resumedAt = try #require(try await store.schedules(queue: "q").first).lastSlot
    try await Task.sleep(for: .milliseconds(1_300))
    _ = try await store.saveSchedules([try every("b")], queue: "q", origin: .declared, clock: behind)
    let jobs = try await store.jobs(queue: "q", status: nil, after: nil, limit: 100)
    let saved = jobs.filter {
      String(decoding: $0.payload, as: UTF8.self) == "a" && !paused.map(\.id).contains($0.id)
    }
    #expect(!saved.isEmpty, "the declaration fired no slot due by the server's clock with the old item")
    #expect(
      saved.allSatisfy { $0.runAt > (resumedAt ?? created) },
      "a slot of the pause fired: \(saved.map(\.runAt))")
    #expect(Set(jobs.map(\.runAt)).count == jobs.count, "a slot fired twice: \(jobs.map(\.runAt))")
    await store.close()
  }
}
