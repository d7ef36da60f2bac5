import Conveyor
import ConveyorSQLite
import ConveyorTestSupport
import Foundation
import Testing

extension JobCommandTests {
  /// `show` of a workflow run (added by a program on the same file): its workflow, its input and
  /// its history line by line, and `--json` gives them as an object.
  @Test func showPrintsAWorkflowRunsHistory() async throws {
    let sandbox = try Sandbox()
    let store = try SQLiteJobStore(path: sandbox.database)
    let run = try await WorkflowFixture.retryingRun(in: store)
    await store.close()
    let lines = try await sandbox.succeed(["show", String(run.rawValue)]).lines
    #expect(lines.contains("job       a run of workflow \"checkout\" (3 in its history)"), "\(lines)")
    #expect(lines.contains("input     \"<script>alert(1)<\\/script>\""), "\(lines)")
    #expect(lines.contains("history   (oldest first)"), "\(lines)")
    #expect(
      lines.contains {
        $0.hasPrefix("  1. step \"charge\" completed (1 attempt(s), at ") && $0.hasSuffix(#"{"id":"ch_<1>"}"#)
      },
      "\(lines)")
    #expect(lines.contains { $0.hasPrefix("  2. sleep \"cool-off\" slept until ") }, "\(lines)")
    #expect(
      lines.contains("  3. step \"notify\" retrying, 1 attempt(s) failed, the last: mail <server> down"),
      "\(lines)")
    let json = try await sandbox.succeed(["show", "--json", String(run.rawValue)]).object()
    let workflow = try #require(json["workflow"] as? [String: Any], "\(json)")
    #expect(workflow["name"] as? String == "checkout")
    let history = try #require(workflow["history"] as? [[String: Any]])
    #expect(history.map { $0["state"] as? String } == ["completed", "slept", "retrying"], "\(history)")
    #expect(history[0]["result"] as? String == #"{"id":"ch_<1>"}"#, "\(history[0])")
    #expect(history[2]["error"] as? String == "mail <server> down", "\(history[2])")
  }
}

extension JobCommandTests {
  /// A step's long error is shown cut as the job's errors are (the history keeps 4,096 bytes).
  @Test func showCutsALongStepErrorLikeTheJobsErrors() async throws {
    let sandbox = try Sandbox()
    let store = try SQLiteJobStore(path: sandbox.database)
    let run = try await WorkflowFixture.retryingRun(in: store, error: String(repeating: "e", count: 100_000))
    await store.close()
    let lines = try await sandbox.succeed(["show", String(run.rawValue)]).lines
    let entry = try #require(lines.first { $0.hasPrefix("  3. step \"notify\" retrying") }, "\(lines)")
    #expect(entry.utf8.count <= JobHistory.maximumErrorBytes + 200, "\(entry.utf8.count) bytes")
  }
}
