import Conveyor
import ConveyorPostgres
import ConveyorTestSupport
import Foundation
import Testing

@Suite("Ordering keys and limits across processes on PostgreSQL", .serialized)
struct FlowControlProcessTests {
  /// Four worker processes share one schema and drain 16 ordering keys of 15 jobs each (and 60
  /// jobs without a key), some failing once, while one of them is killed with SIGKILL and started
  /// again every 300 to 500 ms for the whole drain: each key's jobs start in the order they were
  /// added, one at a time, a later one only after the one before it ended; none is lost and the
  /// store ends with every job completed once (see `FlowControlProbe` for the rules, and for the
  /// one exception to "one at a time", a worker stopped past its lease, which SIGKILL is not).
  /// With a `limit`, the queue's stored concurrency: the 16 slots of the four workers never run
  /// more handlers at once than it allows, and a kill comes every 1 to 1.3 s (the killed worker's
  /// jobs keep their places until their leases lapse). With a rate, the queue's stored rate: no
  /// handler starts before the rate allows, counted from when it was stored; with rates per key,
  /// no handler of a limit key starts before its key's rate allows.
  @Test(arguments: [
    QueueLimits(), QueueLimits(concurrency: 4), QueueLimits(rate: RateLimit(perSecond: 60, burst: 5)),
    QueueLimits(keyConcurrency: 2, keyConcurrencyOverrides: ["host-0": 1]),
    QueueLimits(
      keyRate: RateLimit(perSecond: 30, burst: 2), keyRateOverrides: ["host-0": RateLimit(perSecond: 15)]),
  ])
  func fourWorkersKeepEachKeysOrderAndTheLimitsWhileBeingKilled(limits: QueueLimits) async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("ordering")
    let folder = try makeFolder()
    defer { try? FileManager.default.removeItem(atPath: folder) }
    let log = folder + "/ordering.log"
    let store = try await PostgresJobStore.open(url: server.url, options: .init(schema: schema))
    let outcome = try await FlowControlProbe.run(
      store: store, log: log, limits: limits,
      start: { slot, generation in
        try WorkerProcess(
          url: server.url, schema: schema, folder: folder, name: "w\(slot)-\(generation)",
          extra: FlowControlProbe.workerOptions(slot: slot) + ["--ordered-log", log, "--poll-ms", "20"])
      },
      pid: { $0.pid },
      kill: { worker in
        worker.kill()
        _ = await worker.exitStatus()
        return worker.pid
      })
    #expect(outcome.problems.isEmpty, "\(outcome.problems) (\(outcome.summary))")
    print("FlowControlProcessTests (PostgreSQL, \(limits)): \(outcome.summary)")
    await store.close()
  }

  /// Fair shares across processes: tenant A's 400 jobs are added first, then one job each of ten
  /// other tenants; four worker processes (four handlers each) share the queue and log each
  /// handler's start to one file. The ten tenants' turns come right after A's first job, so each
  /// starts among the first 11 jobs claimed, give or take the 16 handlers claiming at once (in
  /// the order the jobs were added, they would start after A's 400). Every job runs once.
  @Test func fourWorkersTakeEachTenantsJobsInTurn() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("fair")
    let folder = try makeFolder()
    defer { try? FileManager.default.removeItem(atPath: folder) }
    let store = try await PostgresJobStore.open(url: server.url, options: .init(schema: schema))
    let backlog = try (0..<400).map {
      NewJob(payload: try JSONEncoder().encode(TestJob(number: $0)), fairnessKey: "A")
    }
    var ids = Set(try await store.enqueue(backlog, queue: "jobs", clock: SystemJobClock()).map(\.id.rawValue))
    var tenants: Set<Int64> = []
    for tenant in 0..<10 {
      let job = NewJob(
        payload: try JSONEncoder().encode(TestJob(number: 400 + tenant)), fairnessKey: "T\(tenant)")
      let added = try await store.enqueue([job], queue: "jobs", clock: SystemJobClock())
      tenants.insert(added[0].id.rawValue)
    }
    ids.formUnion(tenants)
    let starts = folder + "/starts.log"
    let workers = try (0..<4).map {
      try WorkerProcess(
        url: server.url, schema: schema, folder: folder, name: "w\($0)",
        extra: ["--handle-ms", "5", "--concurrency", "4", "--progress", starts])
    }
    for worker in workers { #expect(await worker.exitStatus() == 0, "\(worker.logText)") }
    let started = try readIDs(starts)
    #expect(started.count == ids.count && Set(started) == ids, "each job ran once: \(started.count) starts")
    let places = tenants.compactMap { started.firstIndex(of: $0) }.sorted()
    #expect(
      places.count == tenants.count && places.allSatisfy { $0 < 11 + 16 }, "the tenants' starts: \(places)")
    #expect(try await store.counts(queue: "jobs", clock: SystemJobClock()).total == 0)
    await store.close()
  }
}
