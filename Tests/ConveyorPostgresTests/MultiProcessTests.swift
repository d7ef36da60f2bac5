import Conveyor
import ConveyorPostgres
import Foundation
import Testing

@Suite("PostgresJobStore across processes", .serialized)
struct MultiProcessTests {
  @Test func fourWorkersDrainTenThousandJobsEachOnce() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("drain")
    let folder = try makeFolder()
    defer { try? FileManager.default.removeItem(atPath: folder) }
    let store = try await PostgresJobStore.open(url: server.url, options: .init(schema: schema))
    let ids = try await enqueue(10_000, into: store)
    let workers = try (0..<4).map {
      try WorkerProcess(
        url: server.url, schema: schema, folder: folder, name: "w\($0)",
        extra: ["--handle-ms", "1", "--concurrency", "4"])
    }
    for worker in workers { #expect(await worker.exitStatus() == 0, "\(worker.logText)") }
    let handled = try workers.flatMap { try readIDs($0.output) }
    #expect(handled.count == 10_000, "no job handled twice")
    #expect(ids.subtracting(handled).isEmpty, "every job handled: \(ids.subtracting(handled).count) lost")
    #expect(try await store.counts(queue: "jobs", clock: SystemJobClock()).total == 0)
    await store.close()
  }

  @Test func aKilledWorkersJobRunsAgainAfterItsLease() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("kill")
    let folder = try makeFolder()
    defer { try? FileManager.default.removeItem(atPath: folder) }
    let store = try await PostgresJobStore.open(url: server.url, options: .init(schema: schema))
    let ids = try await enqueue(300, into: store)
    let victim = try WorkerProcess(
      url: server.url, schema: schema, folder: folder, name: "victim",
      extra: ["--lease-ms", "1000", "--handle-ms", "500", "--concurrency", "5"])
    // Half a second a job, far longer than a claim: the kill finds the victim inside handlers
    // (with 40 ms, a loaded machine once killed it while all five workers waited for a claim).
    try await waitForLines(victim.progress, count: 12)
    victim.kill()
    #expect(await victim.exitStatus() != 0)
    let started = try readIDs(victim.progress)
    let finished = Set(try readIDs(victim.output))
    let interrupted = Set(started.filter { !finished.contains($0) })
    #expect(!interrupted.isEmpty, "killed inside a handler")
    let survivor = try WorkerProcess(
      url: server.url, schema: schema, folder: folder, name: "survivor",
      extra: ["--lease-ms", "1000", "--handle-ms", "2", "--concurrency", "5"])
    #expect(await survivor.exitStatus() == 0, "\(survivor.logText)")
    let handled = try readIDs(victim.output) + readIDs(survivor.output)
    #expect(ids.subtracting(handled).isEmpty, "zero lost: \(ids.subtracting(handled).count) lost")
    #expect(interrupted.isSubset(of: Set(try readIDs(survivor.output))), "the interrupted jobs ran again")
    #expect(handled.count - ids.count <= 5, "only the killed worker's jobs ran twice")
    await store.close()
  }

  /// Runs 4 workers on 3,000 jobs and calls `disrupt` once a few hundred are done; every worker
  /// must finish on its own with every job handled.
  func survive(
    server: PostgresServer, schema: String, disrupt: @Sendable () async throws -> Void
  ) async throws {
    let folder = try makeFolder()
    defer { try? FileManager.default.removeItem(atPath: folder) }
    let address = url(server, application: schema)
    let store = try await PostgresJobStore.open(url: address, options: .init(schema: schema))
    let ids = try await enqueue(3_000, into: store)
    let workers = try (0..<4).map {
      try WorkerProcess(
        url: address, schema: schema, folder: folder, name: "w\($0)",
        extra: ["--handle-ms", "2", "--concurrency", "4", "--lease-ms", "5000"])
    }
    // Every worker past `open` first: a worker still opening its store when the server goes away
    // fails at once, by design (a store that cannot open reports it), which a loaded fresh-clone
    // run once met ("terminating connection due to administrator command" from one of the four).
    for worker in workers { try await waitForLines(worker.output, count: 1) }
    try await waitForLines(workers[0].output, count: 100)
    try await disrupt()
    for worker in workers { #expect(await worker.exitStatus() == 0, "\(worker.logText)") }
    let handled = try workers.flatMap { try readIDs($0.output) }
    #expect(ids.subtracting(handled).isEmpty, "zero lost: \(ids.subtracting(handled).count) lost")
    // At least once: only jobs whose outcome was in flight when the connection broke run twice.
    #expect(handled.count - ids.count <= 4 * 4 * 2, "few duplicates: \(handled.count - ids.count)")
    #expect(try await store.counts(queue: "jobs", clock: SystemJobClock()).total == 0)
    let errors = workers.map { $0.logText.trimmingCharacters(in: .whitespacesAndNewlines) }
    print("\(schema): duplicates \(handled.count - ids.count), store errors logged by the workers: \(errors)")
    await store.close()
  }

  @Test func workersFinishAfterTheServerRestartsMidRun() async throws {
    let server = try await PostgresServer.start()
    defer { server.stop() }
    try await survive(server: server, schema: uniqueSchema("restart")) {
      try await server.restart()
    }
  }

  @Test func workersFinishAfterEveryConnectionIsTerminated() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("terminate")
    try await survive(server: server, schema: schema) {
      let admin = try AdminConnection(server.url)
      for _ in 0..<2 {
        let killed = try admin.query(
          "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '\(schema)'")
        #expect(killed.count >= 4, "the workers' connections were terminated: \(killed.count)")
        try await Task.sleep(for: .milliseconds(300))
      }
    }
  }
}
