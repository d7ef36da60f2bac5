import Conveyor
import ConveyorTestSupport
import Foundation
import Testing

@testable import ConveyorSQLite

@Suite("Ordering keys and limits across processes on SQLite", .serialized)
struct FlowControlProcessTests {
  /// Four worker processes share one file and drain 16 ordering keys of 15 jobs each (and 60
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
    let folder = try TemporaryFolder()
    let database = folder.path("ordering.sqlite")
    let log = folder.path("ordering.log")
    let store = try SQLiteJobStore(path: database)
    let outcome = try await FlowControlProbe.run(
      store: store, log: log, limits: limits,
      start: { slot, generation in
        try WorkerProcess(
          database: database, folder: folder, name: "w\(slot)-\(generation)", command: "ordered-work",
          extra: FlowControlProbe.workerOptions(slot: slot) + ["--log", log])
      },
      pid: { $0.process.processIdentifier },
      kill: { worker in
        worker.kill()
        _ = await worker.exitStatus()
        return worker.process.processIdentifier
      })
    #expect(outcome.problems.isEmpty, "\(outcome.problems) (\(outcome.summary))")
    print("FlowControlProcessTests (SQLite, \(limits)): \(outcome.summary)")
    await store.close()
  }

  /// The probe's rule for rates per key can fail: three starts of `host-0` within 100 ms break a
  /// rate of 10 a second with bursts of 2, and keep one of 30 a second.
  @Test func theProbeReportsStartsOverItsKeysRate() {
    // key-0 and key-4 share host-0; the rate was stored at 1000 ms.
    let log = """
      start key-0 0 100 1 1000
      end key-0 0 100 1 1001
      start key-4 0 101 1 1010
      end key-4 0 101 1 1011
      start key-0 1 100 1 1050
      end key-0 1 100 1 1051
      """
    let slow = FlowControlProbe.problems(
      inLog: log, limits: QueueLimits(keyRateOverrides: ["host-0": RateLimit(perSecond: 10, burst: 2)]),
      since: 1000
    ).0
    #expect(slow.contains { $0.hasPrefix("over the rate of key host-0") }, "\(slow)")
    let fast = FlowControlProbe.problems(
      inLog: log, limits: QueueLimits(keyRate: RateLimit(perSecond: 30, burst: 2)), since: 1000
    ).0
    #expect(!fast.contains { $0.contains("over the rate") }, "\(fast)")
  }

  /// The probe's rule for limits per key can fail: a log with two jobs of `host-0` in flight at
  /// once breaks a limit of 1, and the same log keeps a limit of 2.
  @Test func theProbeReportsAStartOverItsKeysLimit() {
    // key-0 index 0 and key-4 index 0 share host-0 (four ordering keys a limit key).
    let log = """
      start key-0 0 100 1 1
      start key-4 0 101 1 2
      end key-0 0 100 1 3
      end key-4 0 101 1 4
      """
    let one = FlowControlProbe.problems(
      inLog: log, limits: QueueLimits(keyConcurrencyOverrides: ["host-0": 1])
    ).0
    #expect(one.contains { $0.hasPrefix("over the limit of key host-0 (1)") }, "\(one)")
    let two = FlowControlProbe.problems(inLog: log, limits: QueueLimits(keyConcurrency: 2)).0
    #expect(!two.contains { $0.contains("over the limit of key") }, "\(two)")
  }
}
