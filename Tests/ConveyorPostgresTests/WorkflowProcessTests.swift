import Conveyor
import ConveyorPostgres
import ConveyorTestSupport
import Foundation
import Testing

@Suite("Durable workflows across processes on PostgreSQL", .serialized)
struct WorkflowProcessTests {
  /// Four worker processes share one schema and drain 1,000 runs (`CONVEYOR_WORKFLOW_RUNS` to change) of a five-step workflow with two
  /// sleeps, while one of them is killed with SIGKILL and started again every 300 to 500 ms for
  /// the whole drain: every run completes with the right output, no step whose result was stored
  /// runs again, and no step after a sleep starts before the sleep ends (see `WorkflowProbe`).
  @Test func fourWorkersFinishEveryRunOnceWhileBeingKilled() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("workflows")
    let folder = try makeFolder()
    defer { try? FileManager.default.removeItem(atPath: folder) }
    let log = folder + "/workflows.log"
    let store = try await PostgresJobStore.open(url: server.url, options: .init(schema: schema))
    let outcome = try await WorkflowProbe.run(
      store: store, log: log, runs: WorkflowProbe.runCount,
      start: { slot, generation in
        try WorkerProcess(
          url: server.url, schema: schema, folder: folder, name: "w\(slot)-\(generation)",
          extra: ["--queue", "workflows", "--lease-ms", "2000", "--workflow-log", log])
      },
      kill: { worker in
        worker.kill()
        _ = await worker.exitStatus()
      })
    #expect(outcome.problems.isEmpty, "\(outcome.problems) (\(outcome.summary))")
    print("WorkflowProcessTests (PostgreSQL): \(outcome.summary)")
    await store.close()
  }
}
