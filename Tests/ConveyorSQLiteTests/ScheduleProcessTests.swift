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
}

extension ScheduleProcessTests {
  /// Schedules stored two hours and ten minutes ago, while no worker ran: the first worker process
  /// started fires each catch-up policy's slots exactly (see `CatchUpProbe`).
  @Test func aWorkerStartedAfterDowntimeFiresEachCatchUpPolicysSlots() async throws {
    for attempt in 0..<3 {
      let folder = try TemporaryFolder()
      let database = folder.path("catch-up.sqlite")
      let store = try SQLiteJobStore(path: database)
      _ = try await store.saveSchedules(
        try CatchUpProbe.definitions(), queue: "jobs", origin: .added, clock: CatchUpProbe.storedClock())
      try await store.setPaused(true, queue: "jobs")  // the jobs stay where the test reads them
      let start = Date()
      let worker = try WorkerProcess(
        database: database, folder: folder, name: "w", extra: ["--forever", "1"])
      try await eventually("the first firing") {
        try await !store.jobs(queue: "jobs", status: nil, after: nil, limit: 1).isEmpty
      }
      let end = Date()
      worker.kill()
      _ = await worker.exitStatus()
      let jobs = try await store.jobs(queue: "jobs", status: nil, after: nil, limit: 1_000)
      await store.close()
      do {
        let problems = try CatchUpProbe.problems(in: jobs, firedBetween: start, and: end)
        #expect(problems.isEmpty, "\(problems)")
        return
      } catch is CatchUpProbeUndecided {
        if attempt == 2 { Issue.record("three firings straddled a minute") }
      }
    }
  }
}
