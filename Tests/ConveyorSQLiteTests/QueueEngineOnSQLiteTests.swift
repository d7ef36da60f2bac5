import CSQLite
import Conveyor
import ConveyorSQLite
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

// Behaviour tests for the queue engine (issue 7) on real SQLite files and in worker processes.
// Each one failed on the engine before the rewrite (commit 496693a).

/// The item these tests enqueue.
private struct EngineJob: Queueable, Hashable {
  var number: Int
}

private let engineQueue = "engine"

/// Runs a raw SQL script on the file, on a connection of its own.
private func executeRaw(_ sql: String, on path: String) throws {
  var db: OpaquePointer?
  defer { sqlite3_close(db) }
  guard sqlite3_open(path, &db) == SQLITE_OK else { throw TestFailure("open failed") }
  sqlite3_busy_timeout(db, 5_000)
  guard sqlite3_exec(db, sql, nil, nil, nil) == SQLITE_OK else {
    throw TestFailure("\(sql): \(String(cString: sqlite3_errmsg(db)))")
  }
}

/// Runs `conveyor-test-worker` with `arguments` to the end; returns its status and standard output.
private func runTestWorker(_ arguments: [String], folder: TemporaryFolder) async throws -> (
  status: Int32, output: String, errors: String
) {
  let process = Process()
  process.executableURL = try testWorkerURL()
  process.arguments = arguments
  var environment = ProcessInfo.processInfo.environment
  environment["SWIFT_BACKTRACE"] = "enable=no"
  process.environment = environment
  let output = Pipe()
  process.standardOutput = output
  let errorPath = folder.path("worker-\(UUID().uuidString).stderr")
  _ = FileManager.default.createFile(atPath: errorPath, contents: nil)
  let errorFile = try FileHandle(forWritingTo: URL(fileURLWithPath: errorPath))
  process.standardError = errorFile
  try process.run()
  // On a thread of its own: a dispatch thread is one of the cooperative pool's on Linux, and
  // this waits as long as the worker runs.
  let running = process
  let (status, text) = try await onOwnThread(name: "test-worker-wait") { () -> (Int32, String) in
    let data = output.fileHandleForReading.readDataToEndOfFile()
    running.waitUntilExit()
    return (running.terminationStatus, String(decoding: data, as: UTF8.self))
  }
  try errorFile.close()
  let errors = (try? String(contentsOfFile: errorPath, encoding: .utf8)) ?? ""
  return (status, text, errors)
}

/// The number after `label` in the worker's output.
private func reported(_ label: String, in output: String) -> Int64? {
  output.split(separator: "\n").first { $0.hasPrefix(label + " ") }
    .flatMap { Int64($0.dropFirst(label.count + 1)) }
}

@Suite("Queue engine on SQLite")
struct QueueEngineOnSQLiteTests {
  func configuration(
    lease: Duration = .seconds(60), maxAttempts: Int? = nil, autoStart: Bool = true,
    poll: Duration = .milliseconds(50)
  ) -> JobQueueConfiguration {
    JobQueueConfiguration(
      identifier: engineQueue, maxAttempts: maxAttempts, autoStart: autoStart, leaseDuration: lease,
      pollInterval: poll)
  }

  // MARK: Memory

  /// Trickles `count` jobs of `bytes` bytes through a queue in a worker process; returns the growth
  /// of its resident memory in bytes.
  func trickleGrowth(count: Int, bytes: Int, database: String?) async throws -> Int64 {
    let folder = try TemporaryFolder()
    var arguments = ["trickle", "--count", String(count), "--payload-bytes", String(bytes)]
    if let database { arguments += ["--database", folder.path(database)] }
    let (status, output, errors) = try await runTestWorker(arguments, folder: folder)
    guard status == 0, let growth = reported("rss-growth-kb", in: output) else {
      throw TestFailure("worker failed (\(status)): \(output) \(errors)")
    }
    return growth * 1024
  }

  @Test("memory stays flat while jobs trickle through an in-memory queue")
  func memoryStaysFlatInMemory() async throws {
    let (count, bytes) = (5_000, 20_000)
    let growth = try await trickleGrowth(count: count, bytes: bytes, database: nil)
    #expect(growth < Int64(count * bytes) / 10, "resident memory grew \(growth / 1024) KB")
  }

  @Test("memory stays flat while jobs trickle through a SQLite queue")
  func memoryStaysFlatOnSQLite() async throws {
    let (count, bytes) = (5_000, 20_000)
    let growth = try await trickleGrowth(count: count, bytes: bytes, database: "trickle.sqlite")
    #expect(growth < Int64(count * bytes) / 10, "resident memory grew \(growth / 1024) KB")
  }

  /// A step's timeout is freed when the step ends in time. The timer was a `Task.sleep`, whose
  /// cancellation on Linux leaves the sleep scheduled until its deadline (about 700 bytes each):
  /// a service running steps with an hour's timeout held an hour of them.
  @Test("memory stays flat while steps with an hour's timeout end at once")
  func stepTimeoutsAreFreedWhenTheStepEnds() async throws {
    let count = 50_000
    let folder = try TemporaryFolder()
    let (status, output, errors) = try await runTestWorker(
      ["timeouts", "--count", String(count)], folder: folder)
    guard status == 0, let growth = reported("rss-growth-kb", in: output) else {
      throw TestFailure("worker failed (\(status)): \(output) \(errors)")
    }
    #expect(
      growth * 1024 < Int64(count) * 100, "resident memory grew \(growth) KB over \(count) runs: \(output)")
  }

  // MARK: Heartbeats off the cooperative pool

  @Test("CPU-bound handlers filling the cooperative pool do not let leases lapse")
  func heartbeatsSurviveCPUBoundHandlers() async throws {
    // In a worker process: its handlers block every thread of its cooperative pool for 1.5 s.
    let folder = try TemporaryFolder()
    let (status, output, errors) = try await runTestWorker(["starve", "--lease-ms", "500"], folder: folder)
    #expect(status == 0, "\(errors.suffix(500))")
    let width = try #require(reported("width", in: output))
    let lines = output.split(separator: "\n").map(String.init)
    #expect(
      lines.contains("handled " + (1...width).map(String.init).joined(separator: ",")),
      "each job handled exactly once: \(output)")
    #expect(lines.contains("rescued 0"), "leases lapsed and were rescued: \(output)")
    #expect(!lines.contains { $0.hasPrefix("warning ") }, "\(output)")
  }

  // MARK: No traps

  @Test("an exponential retry policy with a huge maximum does not trap after attempt 200")
  func exponentialRetryWithHugeMaximum() async throws {
    let folder = try TemporaryFolder()
    let (status, output, errors) = try await runTestWorker(
      ["trap-check", "--case", "exponential-maximum"], folder: folder)
    #expect(status == 0, "the worker trapped: \(errors.suffix(500))")
    let seconds = reported("delay-seconds", in: output)
    #expect((seconds ?? 0) > 50 * 365 * 86_400, "delay: \(output)")
  }

  @Test(
    "add(_:runAt:) refuses a date that is not finite with invalidSchedule",
    arguments: ["nan-run-date", "infinite-run-date"])
  func nonFiniteRunDateIsRefused(check: String) async throws {
    let folder = try TemporaryFolder()
    let (status, output, errors) = try await runTestWorker(["trap-check", "--case", check], folder: folder)
    #expect(status == 0, "the worker trapped: \(errors.suffix(500))")
    #expect(output == "invalidSchedule\n")
  }

  @Test("huge delays, run dates and retry delays are clamped on SQLite, not trapped")
  func hugeDelaysAreClamped() async throws {
    let folder = try TemporaryFolder()
    let store = try SQLiteJobStore(path: folder.path("jobs.sqlite"))
    let queue = try JobQueue<EngineJob>(configuration: configuration(), store: store) { _, context in
      context.attempts == 1 ? .retry(after: .seconds(Int64.max)) : .handled
    }
    try await queue.add(EngineJob(number: 1), delay: .seconds(Int64.max))
    try await queue.add(EngineJob(number: 2), runAt: .distantFuture)
    try await queue.add(EngineJob(number: 3), runAt: Date(timeIntervalSince1970: 1e300))
    try await queue.add(EngineJob(number: 4))
    try await eventually("the retry is scheduled") { try await queue.count() == JobCounts(scheduled: 4) }
    let farAhead = Date().addingTimeInterval(50 * 365 * 86_400)
    let jobs = try await queue.jobs()
    #expect(jobs.count == 4)
    for job in jobs { #expect(job.runAt > farAhead, "job \(job.id) runs at \(job.runAt)") }
    await queue.shutdown(gracePeriod: .seconds(1))
  }

  @Test("a busy timeout of Int64.max seconds opens the store")
  func hugeBusyTimeoutOpens() async throws {
    let folder = try TemporaryFolder()
    let store = try SQLiteJobStore(
      path: folder.path("jobs.sqlite"), options: .init(busyTimeout: .seconds(Int64.max)))
    let results = try await store.enqueue(
      [NewJob(payload: Data("{\"number\":1}".utf8))], queue: engineQueue, clock: SystemJobClock())
    #expect(results.map(\.inserted) == [true])
  }

  @Test(
    "a row whose attempts is Int64.max is claimed and settled without a trap",
    arguments: [nil, 3] as [Int?])
  func maximalAttemptsDoNotTrap(maxAttempts: Int?) async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("jobs.sqlite")
    let store = try SQLiteJobStore(path: path)
    _ = try await store.enqueue(
      [NewJob(payload: Data("{\"number\":1}".utf8))], queue: engineQueue, clock: SystemJobClock())
    try executeRaw("UPDATE jobs SET attempts = 9223372036854775807", on: path)
    let handled = Log<Int>()
    let queue = try JobQueue<EngineJob>(
      configuration: configuration(maxAttempts: maxAttempts), store: store
    ) { item, _ in
      handled.append(item.number)
      return .handled
    }
    try await eventually("the job was settled") {
      try await queue.count().unfinished == 0
    }
    await queue.shutdown(gracePeriod: .seconds(1))
    if maxAttempts == nil {
      #expect(handled.all == [1])
      #expect(try await queue.count().withoutHistory == JobCounts())
    } else {
      #expect(handled.all.isEmpty, "a job past its attempts is not handled")
      #expect(try await queue.count() == JobCounts(dead: 1))
    }
  }

  // MARK: Leases and the write lock

  @Test("a lease shorter than twice the busy timeout is refused at init, naming busyTimeout")
  func leaseShorterThanTwiceTheBusyTimeoutIsRefused() throws {
    let folder = try TemporaryFolder()
    let store = try SQLiteJobStore(path: folder.path("jobs.sqlite"), options: .init(busyTimeout: .seconds(5)))
    #expect {
      _ = try JobQueue<EngineJob>(
        configuration: configuration(lease: .seconds(6), autoStart: false), store: store
      ) { _, _ in .handled }
    } throws: { error in
      guard case .invalidConfiguration(let message) = error as? JobQueueError else { return false }
      return message.contains("busyTimeout")
    }
    // Twice the busy timeout is enough.
    _ = try JobQueue<EngineJob>(
      configuration: configuration(lease: .seconds(10), autoStart: false), store: store
    ) { _, _ in .handled }
  }

  @Test("a claim that waited for another connection's write lock gets its full lease")
  func leaseIsCountedFromWhenTheLockWasTaken() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("jobs.sqlite")
    let store = try SQLiteJobStore(path: path, options: .init(busyTimeout: .seconds(3)))
    _ = try await store.enqueue(
      [NewJob(payload: Data("{\"number\":1}".utf8))], queue: engineQueue, clock: SystemJobClock())

    var db: OpaquePointer?
    guard sqlite3_open(path, &db) == SQLITE_OK,
      sqlite3_exec(db, "BEGIN IMMEDIATE", nil, nil, nil) == SQLITE_OK
    else {
      sqlite3_close(db)
      throw TestFailure("could not take the write lock")
    }
    nonisolated(unsafe) let holder = db
    let released = Mutex<Date?>(nil)
    let thread = Thread {
      Thread.sleep(forTimeInterval: 1.5)
      released.withLock { $0 = Date() }
      sqlite3_exec(holder, "ROLLBACK", nil, nil, nil)
      sqlite3_close(holder)
    }
    thread.start()

    let batch = try await store.settleAndClaim(
      [], queue: engineQueue, limit: 1, lease: Lease(owner: "waiter", duration: .seconds(6)),
      clock: SystemJobClock())
    let releasedAt = try #require(released.withLock { $0 }, "the claim did not wait for the lock")
    let expiry = try #require(batch.claimed.first?.leaseExpiresAt)
    #expect(
      expiry.timeIntervalSince(releasedAt) > 5,
      "the lease ends \(expiry.timeIntervalSince(releasedAt)) s after the lock was released")
  }
}
