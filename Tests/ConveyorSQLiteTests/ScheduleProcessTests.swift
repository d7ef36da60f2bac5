import Conveyor
import ConveyorTestSupport
import Foundation
import Testing

@testable import ConveyorSQLite

@Suite("Schedules across processes on SQLite")
struct ScheduleProcessTests {
  /// Four worker processes share one file and fire a 1-second schedule for a minute, while one
  /// of them is killed with SIGKILL and started again about every second, just after a slot (when
  /// the workers are firing it). Every slot from the first to the last fired is added once: none
  /// twice, none skipped.
  @Test func fourWorkersFireEachOneSecondSlotOnceWhileBeingKilled() async throws {
    let folder = try TemporaryFolder()
    let database = folder.path("schedules.sqlite")
    let store = try SQLiteJobStore(path: database)
    _ = try await store.saveSchedules(
      [try SlotFiringProbe.schedule()], queue: "jobs", origin: .added, clock: SystemJobClock())
    let extra = ["--forever", "1", "--lease-ms", "5000"]
    func start(_ slot: Int, _ generation: Int) throws -> WorkerProcess {
      try WorkerProcess(database: database, folder: folder, name: "w\(slot)-\(generation)", extra: extra)
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
  /// Two releases share a file during a rolling deploy: the older one cannot read a schedule the
  /// newer one stored (a catch-up policy it does not know, say), so its firing marks it not due.
  /// Once the older release is gone, the newer one declares the schedule again at start, as the
  /// guide says to: the schedule fires again from its next slot, not never.
  @Test func aScheduleAnOlderReleaseCouldNotReadFiresAgainOnceDeclaredByOneThatCan() async throws {
    let folder = try TemporaryFolder()
    let store = try SQLiteJobStore(path: folder.path("releases.sqlite"))
    let t0 = Date(timeIntervalSince1970: 1_700_000_000)
    func at(_ seconds: Double) -> FixedJobClock { FixedJobClock(t0.addingTimeInterval(seconds)) }
    let sync = try ScheduleDefinition(
      name: "sync", timing: try ScheduleTiming(every: .seconds(100)), payload: Data("sync".utf8))
    _ = try await store.saveSchedules([sync], queue: "q", origin: .declared, clock: at(0))
    _ = try await store.fireDueSchedules(queue: "q", clock: at(100))
    // What the older release reads: a policy it does not know. Its firing passes the row over.
    _ = try await store.connection.perform { db in
      try db.run("UPDATE schedules SET catch_up = 'newer-policy' WHERE name = 'sync'")
    }
    _ = try await store.fireDueSchedules(queue: "q", clock: at(200))
    // The newer release, which reads its own row, is the only one left; it declares at start.
    _ = try await store.connection.perform { db in
      try db.run("UPDATE schedules SET catch_up = 'skip' WHERE name = 'sync'")
    }
    _ = try await store.saveSchedules([sync], queue: "q", origin: .declared, clock: at(250))
    let stored = try #require(try await store.schedules(queue: "q").first)
    #expect(stored.nextDue != nil, "the declared schedule is never due again: \(stored)")
    let fired = try await store.fireDueSchedules(queue: "q", clock: at(300))
    #expect(fired.added.count == 1, "the slot at 300 fired: \(fired)")
  }
}

extension ScheduleProcessTests {
  /// Schedules stored two hours and ten minutes ago, while no worker ran: the first worker process
  /// started fires each catch-up policy's slots exactly (see `CatchUpProbe`).
  @Test func aWorkerStartedAfterDowntimeFiresEachCatchUpPolicysSlots() async throws {
    let folder = try TemporaryFolder()
    let problems = try await CatchUpProbe.check {
      let store = try SQLiteJobStore(path: folder.path("catch-up-\(UUID().uuidString).sqlite"))
      return (store, { await store.close() })
    } startWorker: { store in
      let path = try #require((store as? SQLiteJobStore)?.path)
      let worker = try WorkerProcess(database: path, folder: folder, name: "w", extra: ["--forever", "1"])
      return {
        worker.kill()
        _ = await worker.exitStatus()
      }
    }
    #expect(problems.isEmpty, "\(problems)")
  }
}

extension ScheduleProcessTests {
  /// An operator added "nightly" through a newer release, which stored a catch-up policy the older
  /// release cannot read. The older release, still running during a rolling deploy, declares a
  /// schedule of the same name at start. Declarations leave added schedules alone, readable or
  /// not: the operator's row must stay as it is, not be replaced by the declared one.
  @Test func aDeclarationLeavesAnAddedScheduleItCannotReadAlone() async throws {
    let folder = try TemporaryFolder()
    let store = try SQLiteJobStore(path: folder.path("releases.sqlite"))
    let t0 = Date(timeIntervalSince1970: 1_700_000_000)
    func at(_ seconds: Double) -> FixedJobClock { FixedJobClock(t0.addingTimeInterval(seconds)) }
    func nightly(_ text: String) throws -> ScheduleDefinition {
      try ScheduleDefinition(
        name: "nightly", timing: try ScheduleTiming(every: .seconds(100)), payload: Data(text.utf8))
    }
    _ = try await store.saveSchedules([try nightly("operator")], queue: "q", origin: .added, clock: at(0))
    _ = try await store.connection.perform { db in
      try db.run("UPDATE schedules SET catch_up = 'newer-policy' WHERE name = 'nightly'")
    }
    let summary = try await store.saveSchedules(
      [try nightly("code")], queue: "q", origin: .declared, clock: at(10))
    // The newer release reads its row again.
    _ = try await store.connection.perform { db in
      try db.run("UPDATE schedules SET catch_up = 'skip' WHERE name = 'nightly'")
    }
    let stored = try #require(try await store.schedules(queue: "q").first)
    let text = String(decoding: stored.definition.payload, as: UTF8.self)
    #expect(
      stored.origin == .added && text == "operator",
      "the declaration replaced the added schedule: \(summary), origin \(stored.origin), payload \(text)")
  }
}

extension ScheduleProcessTests {
  /// During a rolling deploy an older release cannot read a schedule the newer one stored. The
  /// newer release looks for due schedules a second after each of the older one's looks; the
  /// slot at 100 must still be fired, once, by the newer release within the grace: the older
  /// release's postponement must not hide it from the release that can fire it.
  @Test func aSlotAnOlderReleaseCannotReadIsFiredByTheNewerOneWithinTheGrace() async throws {
    let folder = try TemporaryFolder()
    let store = try SQLiteJobStore(path: folder.path("releases.sqlite"))
    let t0 = Date(timeIntervalSince1970: 1_700_000_000)
    func at(_ seconds: Double) -> FixedJobClock { FixedJobClock(t0.addingTimeInterval(seconds)) }
    let sync = try ScheduleDefinition(
      name: "sync", timing: try ScheduleTiming(every: .seconds(100)), payload: Data("sync".utf8))
    _ = try await store.saveSchedules([sync], queue: "q", origin: .declared, clock: at(0))
    func looks(readable: Bool, at seconds: Double) async throws {
      let policy = readable ? "skip" : "newer-policy"
      _ = try await store.connection.perform { db in
        try db.run("UPDATE schedules SET catch_up = '\(policy)' WHERE name = 'sync'")
      }
      _ = try await store.fireDueSchedules(queue: "q", clock: at(seconds))
    }
    for second in [100.0, 130, 160] {
      try await looks(readable: false, at: second)  // the older release
      try await looks(readable: true, at: second + 1)  // the newer release
    }
    let jobs = try await store.jobs(queue: "q", status: nil, after: nil, limit: 10)
    #expect(jobs.map(\.runAt) == [t0.addingTimeInterval(100)], "the slot at 100: \(jobs.map(\.runAt))")
  }
}
