import Conveyor
import ConveyorPostgres
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

/// Stores reaching the server through a real PgBouncer in transaction pooling mode
/// (``PostgresJobStore/Pooling/transaction(listenURL:)``): no prepared statement, no session
/// setting carries over from one transaction to the next, and `LISTEN` runs on a direct
/// connection.
@Suite(.enabled(if: PgBouncer.executable != nil, "needs pgbouncer (apt-get install pgbouncer)"))
struct PgBouncerTests {
  /// One pooler for the suite, in front of the shared server, with a pool of three server
  /// connections: fewer than the stores that share it.
  static let shared = Task {
    try await PgBouncer.start(before: try await PostgresServer.shared(), poolSize: 3)
  }

  func open(
    _ schema: String = uniqueSchema("bouncer"), clock: PostgresJobStore.Clock = .database,
    listening: Bool = true, lockTimeout: Duration = .seconds(5)
  ) async throws -> PostgresJobStore {
    let server = try await PostgresServer.shared()
    let bouncer = try await Self.shared.value
    var options = PostgresJobStore.Options(
      schema: schema, clock: clock, lockTimeout: lockTimeout,
      pooling: .transaction(listenURL: listening ? server.url : nil))
    // The conformance checks drive time with fixed clocks (see `ConformanceTests`).
    options.claimDelayCounted = nil
    return try await PostgresJobStore.open(url: bouncer.url, options: options)
  }

  @Test(arguments: JobStoreConformance.checks)
  func conformance(_ check: JobStoreCheck) async throws {
    let store = try await open(clock: .caller)
    try await check.run(store)
    await store.close()
  }

  @Test(arguments: QueueEngineConformance.checks)
  func engine(_ check: JobStoreCheck) async throws {
    let store = try await open(lockTimeout: .zero)
    try await check.run(store)
    await store.close()
  }

  struct Item: Queueable { var number: Int }

  @Test func sixStoresSharingThreeServerConnectionsHandleEveryJobOnce() async throws {
    let schema = uniqueSchema("bouncer_many")
    var stores: [PostgresJobStore] = []
    for _ in 0..<6 { stores.append(try await open(schema)) }
    let count = 300
    _ = try await stores[0].enqueue(
      (0..<count).map { NewJob(payload: try JSONEncoder().encode(Item(number: $0))) }, queue: "q",
      clock: SystemJobClock())
    let handled = Mutex<[Int: Int]>([:])
    let queues = try stores.map { store in
      try JobQueue<Item>(configuration: .init(identifier: "q", concurrency: 2), store: store) { item, _ in
        handled.withLock { $0[item.number, default: 0] += 1 }
        return .handled
      }
    }
    try await eventually("every job handled", timeout: .seconds(120)) {
      handled.withLock { $0.count } == count
    }
    for queue in queues { await queue.waitUntilFinished() }
    for queue in queues { await queue.shutdown() }
    #expect(handled.withLock { $0.values.allSatisfy { $0 == 1 } }, "each job once")
    #expect(try await stores[0].counts(queue: "q", clock: SystemJobClock()).total == 0)
    for store in stores { await store.close() }
  }

  @Test func anIdleWorkerHearsOfANewJobThroughTheDirectListener() async throws {
    let schema = uniqueSchema("bouncer_wake")
    let worker = try await open(schema)
    let adder = try await open(schema)
    let handled = Mutex(0)
    // Polling once a minute: only a notification can start the job within the test's bound.
    let queue = try JobQueue<Item>(
      configuration: .init(identifier: "q", pollInterval: .seconds(60)), store: worker
    ) { _, _ in
      handled.withLock { $0 += 1 }
      return .handled
    }
    try await Task.sleep(for: .milliseconds(500))  // the worker is idle and listening
    _ = try await adder.enqueue(
      [NewJob(payload: try JSONEncoder().encode(Item(number: 1)))], queue: "q", clock: SystemJobClock())
    try await eventually("the job runs", timeout: .seconds(30)) { handled.withLock { $0 } == 1 }
    await queue.shutdown()
    await worker.close()
    await adder.close()
  }

  @Test func withoutAListenURLARunningHandlerLearnsOfACancelAtTheClaimCheck() async throws {
    let schema = uniqueSchema("bouncer_cancel")
    let worker = try await open(schema, listening: false)
    let canceller = try await open(schema, listening: false)
    #expect(worker.cancellations(queue: "q") == nil, "no session to listen on: no announcements")
    // Heartbeats every 200 s: only the periodic check of the claims (500 ms) can reach the
    // handler within the test's wait.
    let configuration = JobQueueConfiguration(identifier: "q", leaseDuration: .seconds(600))
    let runs = Mutex<[String]>([])
    let queue = try JobQueue<Item>(configuration: configuration, store: worker) { _, _ in
      runs.withLock { $0.append("started") }
      do {
        try await Task.sleep(for: .seconds(600))
      } catch {
        runs.withLock { $0.append("cancelled") }
        throw error
      }
      return .handled
    }
    let id = try await queue.add(Item(number: 1)).id
    try await eventually("the handler to start", timeout: .seconds(60)) {
      runs.withLock { $0 } == ["started"]
    }
    #expect(try await canceller.cancel([id], queue: "q", clock: SystemJobClock()) == [.cancelledRunning])
    try await eventually("the handler to be cancelled", timeout: .seconds(60)) {
      runs.withLock { $0 } == ["started", "cancelled"]
    }
    await queue.shutdown()
    await worker.close()
    await canceller.close()
  }

  @Test func withoutAListenURLWorkersPoll() async throws {
    let store = try await open(listening: false)
    let handled = Mutex(0)
    let queue = try JobQueue<Item>(
      configuration: .init(identifier: "q", pollInterval: .milliseconds(100)), store: store
    ) { _, _ in
      handled.withLock { $0 += 1 }
      return .handled
    }
    _ = try await store.enqueue(
      (0..<5).map { NewJob(payload: try JSONEncoder().encode(Item(number: $0))) }, queue: "q",
      clock: SystemJobClock())
    try await eventually("every job runs", timeout: .seconds(60)) { handled.withLock { $0 } == 5 }
    await queue.shutdown()
    await store.close()
  }
}
