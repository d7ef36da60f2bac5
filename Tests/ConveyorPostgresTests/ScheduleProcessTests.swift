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
}

extension ScheduleProcessTests {
  /// Schedules stored two hours and ten minutes ago (on the caller's clock, the test's), while no
  /// worker ran: the first worker process started fires each catch-up policy's slots exactly
  /// (see `CatchUpProbe`), judged by the server's clock on the same machine.
  @Test func aWorkerStartedAfterDowntimeFiresEachCatchUpPolicysSlots() async throws {
    let server = try await PostgresServer.shared()
    for attempt in 0..<3 {
      let schema = uniqueSchema("catchup")
      let folder = try makeFolder()
      defer { try? FileManager.default.removeItem(atPath: folder) }
      let setup = try await PostgresJobStore.open(
        url: server.url, options: .init(schema: schema, clock: .caller))
      _ = try await setup.saveSchedules(
        try CatchUpProbe.definitions(), queue: "jobs", origin: .added, clock: CatchUpProbe.storedClock())
      try await setup.setPaused(true, queue: "jobs")  // the jobs stay where the test reads them
      let start = Date()
      let worker = try WorkerProcess(
        url: server.url, schema: schema, folder: folder, name: "w", extra: ["--forever", "1"])
      try await eventually("the first firing") {
        try await !setup.jobs(queue: "jobs", status: nil, after: nil, limit: 1).isEmpty
      }
      let end = Date()
      worker.kill()
      _ = await worker.exitStatus()
      let jobs = try await setup.jobs(queue: "jobs", status: nil, after: nil, limit: 1_000)
      await setup.close()
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
