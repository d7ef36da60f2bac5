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
