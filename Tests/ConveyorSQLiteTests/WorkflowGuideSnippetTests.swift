import Conveyor
import ConveyorSQLite
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

// The examples of the "Durable workflows" guide (Sources/Conveyor/Conveyor.docc/Workflows.md),
// verbatim between the markers, so they compile and run. Types the examples declare are at file
// scope here, with the services they call.

/// What the guide's checkout calls: counts charges and shipments.
private final class Payments: Sendable {
  let calls = Mutex<[String]>([])
  func charge(_ order: String, cents: Int) async throws -> String {
    calls.withLock { $0.append("charge \(order)") }
    return "ch_\(order)_\(cents)"
  }
  func ship(_ order: String) async throws -> String {
    calls.withLock { $0.append("ship \(order)") }
    return "sh_\(order)"
  }
}

private struct Upload: Codable, Sendable, Equatable {
  var bytes: Int
  var stage: String
  static let empty = Upload(bytes: 0, stage: "new")
}

private func fetch(_ upload: Upload) async throws -> Upload { Upload(bytes: 1_000, stage: "fetched") }
private func shrink(_ upload: Upload) async throws -> Upload {
  Upload(bytes: upload.bytes / 10, stage: "shrunk")
}

// Workflows.md example 1: the types.
private struct Order: Codable, Sendable {
  var id: String
  var cents: Int
}
private struct Receipt: Codable, Sendable {
  var charge: String
  var shipment: String
}

private struct Checkout: Workflow {
  let payments: Payments

  func run(_ order: Order, context: WorkflowContext) async throws -> Receipt {
    let charge = try await context.step("charge") {
      try await payments.charge(order.id, cents: order.cents)
    }
    try await context.sleep(for: .seconds(3600))  // an hour, holding no worker
    let shipment = try await context.step("ship", policy: .init(maxAttempts: 10)) {
      try await payments.ship(order.id)
    }
    return Receipt(charge: charge, shipment: shipment)
  }
}

@Suite("Guide snippets: durable workflows", .timeLimit(.minutes(10)))
struct WorkflowGuideSnippetTests {
  @Test func theCheckoutChargesOnceAndSleeps() async throws {
    let folder = try TemporaryFolder()
    let databasePath = folder.path("jobs.sqlite")
    let payments = Payments()
    let order = Order(id: "A-1", cents: 4_200)
    // Workflows.md example 1 begins
    let store = try SQLiteJobStore(path: databasePath)
    let workflows = try WorkflowQueue(
      configuration: JobQueueConfiguration(identifier: "checkout"), store: store,
      workflows: [Checkout(payments: payments)])
    let run = try await workflows.add(Checkout(payments: payments), input: order, key: order.id)
    // Later, from any process sharing the store:
    switch try await workflows.status(of: run.id, as: Checkout.self) {
    case .completed(let receipt?): print(receipt)
    case .dead(let reason): print("stopped: \(reason)")
    default: break
    }
    // Workflows.md example 1 ends
    try await QueueEngineConformance.waitFor("the run to sleep") {
      guard try await workflows.run(run.id)?.history.count == 2 else { return false }
      if case .waiting = try await workflows.status(of: run.id, as: Checkout.self) { return true }
      return false
    }
    await workflows.jobs.shutdown()
    #expect(payments.calls.withLock { $0 } == ["charge A-1"])
    let waiting = try #require(try await workflows.jobs.job(run.id))
    #expect(waiting.runAt.timeIntervalSinceNow > 3_500, "scheduled an hour ahead: \(waiting.runAt)")
    await store.close()
  }

  @Test func aPipelineRunsAsAWorkflow() async throws {
    let folder = try TemporaryFolder()
    let store = try SQLiteJobStore(path: folder.path("jobs.sqlite"))
    let configuration = JobQueueConfiguration(identifier: "uploads")
    let upload = Upload(bytes: 0, stage: "new")
    // Workflows.md example 2 begins
    let resize = Pipeline(defaultValue: Upload.empty)
      .then { try await fetch($0) }
      .then { try await shrink($0) }
      .workflow(named: "resize")
    let workflows = try WorkflowQueue(configuration: configuration, store: store, workflows: [resize])
    try await workflows.add(resize, input: upload)
    // Workflows.md example 2 ends
    let run = try #require(try await workflows.jobs.jobs().first)
    try await QueueEngineConformance.waitFor("the run to finish") {
      try await workflows.jobs.job(run.id)?.status == .completed
    }
    await workflows.jobs.shutdown()
    #expect(
      try await workflows.status(of: run.id, as: PipelineWorkflow<Upload>.self)
        == .completed(Upload(bytes: 100, stage: "shrunk")))
    await store.close()
  }
}
