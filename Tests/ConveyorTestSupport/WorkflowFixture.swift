import Conveyor
import Foundation

/// A workflow run left in a known state in a store, for the tools that show runs (`conveyor
/// show`, the dashboard): step `charge` completed with `{"id":"ch_<1>"}`, sleep `cool-off` over,
/// step `notify` retrying after its first attempt failed with `mail <server> down` (its next
/// attempt an hour away). Its input is `"<script>alert(1)</script>"`, for escaping.
public enum WorkflowFixture {
  /// The receipt step `charge` stores.
  public struct Charge: Codable, Sendable, Hashable {
    /// The charge's ID.
    public var id: String
  }

  struct Checkout: Workflow {
    let name = "checkout"
    var stepName = "notify"
    var error = "mail <server> down"
    func run(_ input: String, context: WorkflowContext) async throws -> String {
      let charge = try await context.step("charge") { Charge(id: "ch_<1>") }
      try await context.sleep(for: .milliseconds(1), name: "cool-off")
      let error = self.error
      try await context.step(
        stepName, policy: .init(maxAttempts: 3, retryPolicy: .fixed(.seconds(3_600)))
      ) { () -> Bool in
        throw FixtureError(description: error)
      }
      return charge.id + input
    }
  }

  struct FixtureError: Error, CustomStringConvertible {
    var description: String
  }

  /// Adds the run to queue `queue` of `store`, runs it until its history holds the three entries
  /// and it waits for the third step's retry; returns its ID. `stepName` and `error` replace the
  /// third step's name and error.
  public static func retryingRun(
    in store: any JobStore, queue: String = "checkout", stepName: String = "notify",
    error: String = "mail <server> down"
  ) async throws -> JobID {
    var configuration = JobQueueConfiguration(identifier: queue, pollInterval: .milliseconds(20))
    configuration.maxAttempts = nil
    let workflow = Checkout(stepName: stepName, error: error)
    let workflows = try WorkflowQueue(configuration: configuration, store: store, workflows: [workflow])
    let run = try await workflows.add(workflow, input: "<script>alert(1)</script>")
    try await QueueEngineConformance.waitFor("the run to wait for its retry") {
      guard let record = try await workflows.jobs.job(run.id), record.status == .pending else { return false }
      return try await workflows.run(run.id)?.history.count == 3
    }
    await workflows.jobs.shutdown()
    return run.id
  }
}
