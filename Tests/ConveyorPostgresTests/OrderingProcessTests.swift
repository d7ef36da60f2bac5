import Conveyor
import ConveyorPostgres
import ConveyorTestSupport
import Foundation
import Testing

@Suite("Ordering keys across processes on PostgreSQL")
struct OrderingProcessTests {
  /// Four worker processes share one schema and drain 16 ordering keys of 15 jobs each (and 60
  /// jobs without a key), some failing once, while one of them is killed with SIGKILL and started
  /// again every 300 to 500 ms for the whole drain: each key's jobs start in the order they were
  /// added, one at a time, a later one only after the one before it ended; none is lost and the
  /// store ends with every job completed once (see `OrderingProbe` for the rules, and for the
  /// one exception to "one at a time", a worker stopped past its lease, which SIGKILL is not).
  @Test func fourWorkersKeepEachKeysOrderWhileBeingKilled() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("ordering")
    let folder = try makeFolder()
    defer { try? FileManager.default.removeItem(atPath: folder) }
    let log = folder + "/ordering.log"
    let store = try await PostgresJobStore.open(url: server.url, options: .init(schema: schema))
    let outcome = try await OrderingProbe.run(
      store: store, log: log,
      start: { slot, generation in
        try WorkerProcess(
          url: server.url, schema: schema, folder: folder, name: "w\(slot)-\(generation)",
          extra: OrderingProbe.workerOptions(slot: slot) + ["--ordered-log", log, "--poll-ms", "20"])
      },
      pid: { $0.pid },
      kill: { worker in
        worker.kill()
        _ = await worker.exitStatus()
        return worker.pid
      })
    #expect(outcome.problems.isEmpty, "\(outcome.problems) (\(outcome.summary))")
    print("OrderingProcessTests (PostgreSQL): \(outcome.summary)")
    await store.close()
  }
}
