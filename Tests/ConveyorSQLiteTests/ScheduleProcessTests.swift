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
    let tick = try ScheduleDefinition(
      name: "tick", timing: try ScheduleTiming(every: .seconds(1)),
      payload: try JSONEncoder().encode(TestJob(number: 0)))
    _ = try await store.saveSchedules([tick], queue: "jobs", origin: .added, clock: SystemJobClock())
    let extra = ["--forever", "1", "--lease-ms", "5000"]
    var workers = try (0..<4).map {
      try WorkerProcess(database: database, folder: folder, name: "w\($0)-0", extra: extra)
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
        database: database, folder: folder, name: "w\(victim)-\(kills)", extra: extra)
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
