import Conveyor
import ConveyorSQLite
import ConveyorTestSupport
import Foundation
import Testing

@Suite("Durable workflows across processes on SQLite", .serialized)
struct WorkflowProcessTests {
  /// Four worker processes share one file and drain 1,000 runs (`CONVEYOR_WORKFLOW_RUNS` to change) of a five-step workflow with two
  /// sleeps, while one of them is killed with SIGKILL and started again every 300 to 500 ms for
  /// the whole drain: every run completes with the right output, no step whose result was stored
  /// runs again, and no step after a sleep starts before the sleep ends (see `WorkflowProbe`).
  @Test func fourWorkersFinishEveryRunOnceWhileBeingKilled() async throws {
    let folder = try TemporaryFolder()
    let database = folder.path("workflows.sqlite")
    let log = folder.path("workflows.log")
    let store = try SQLiteJobStore(path: database)
    let outcome = try await WorkflowProbe.run(
      store: store, log: log, runs: WorkflowProbe.runCount,
      start: { slot, generation in
        try WorkerProcess(
          database: database, folder: folder, name: "w\(slot)-\(generation)", command: "workflow-work",
          extra: ["--queue", "workflows", "--log", log])
      },
      kill: { worker in
        worker.kill()
        _ = await worker.exitStatus()
      })
    #expect(outcome.problems.isEmpty, "\(outcome.problems) (\(outcome.summary))")
    print("WorkflowProcessTests (SQLite): \(outcome.summary)")
    await store.close()
  }
}
