import Conveyor
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import ConveyorSQLite

/// A message the in-process queue tests enqueue.
private struct Message: Queueable {
  var text: String
}

/// A numbered item of the in-process queue tests.
private struct Numbered: Queueable, Hashable {
  var number: Int
}

@Suite("JobQueue on SQLiteJobStore")
struct JobQueueOnSQLiteTests {
  @Test func handledAndDeadJobsAreKeptAcrossReopen() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("queue.sqlite")
    let seen = Mutex<[String: Int]>([:])
    do {
      let store = try SQLiteJobStore(path: path)
      let configuration = JobQueueConfiguration(
        identifier: "messages", retryPolicy: .fixed(.milliseconds(10)), maxAttempts: 2, concurrency: 2)
      let queue = try JobQueue<Message>(configuration: configuration, store: store) { message, context in
        seen.withLock { $0[message.text, default: 0] += 1 }
        switch message.text {
        case "fails": throw TestFailure("always fails")
        case "flaky" where context.attempts == 1: return .retry
        default: return .handled
        }
      }
      try await queue.add(contentsOf: (0..<20).map { Message(text: "ok \($0)") })
      try await queue.add(Message(text: "flaky"))
      try await queue.add(Message(text: "fails"))
      await queue.waitUntilFinished()
      await queue.shutdown(gracePeriod: .seconds(5))
    }
    #expect(seen.withLock { $0["flaky"] } == 2)
    #expect(seen.withLock { $0["fails"] } == 2)
    #expect(seen.withLock { $0.count } == 22)

    // Reopened from the file: the handled jobs are completed, the dead one is kept with its error.
    let reopened = try SQLiteJobStore(path: path)
    #expect(try await reopened.counts(queue: "messages", now: Date()) == JobCounts(dead: 1, completed: 21))
    let dead = try #require(
      try await reopened.jobs(queue: "messages", status: .dead, after: nil, limit: 10).first)
    #expect(dead.attempts == 2)
    #expect(dead.lastError?.contains("always fails") == true)
    #expect(try JSONDecoder().decode(Message.self, from: dead.payload).text == "fails")
  }

  /// A call cancelled while its block runs is interrupted, whether the cancellation lands while
  /// a statement runs or just before the statement starts (where `sqlite3_interrupt` alone is
  /// lost and the endless query below would never end). The time limit turns a miss into a failure.
  @Test(.timeLimit(.minutes(10)), arguments: ["while the statement runs", "before the statement starts"])
  func cancellingARunningCallInterruptsIt(_ moment: String) async throws {
    let folder = try TemporaryFolder()
    let connection = try SerializedConnection(
      label: "test", connection: try Connection(path: folder.path("interrupt.sqlite"), create: true),
      closedError: { TestFailure("closed") })
    let endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
    let started = Atomic<Bool>(false)
    let cancelled = DispatchSemaphore(value: 0)
    let holdUntilCancelled = moment == "before the statement starts"
    let task = Task {
      try await connection.perform {
        started.store(true, ordering: .releasing)
        if holdUntilCancelled { cancelled.wait() }
        return try $0.scalar(endless)
      }
    }
    try await eventually("the block is running") { started.load(ordering: .acquiring) }
    if !holdUntilCancelled { try await Task.sleep(for: .milliseconds(50)) }
    task.cancel()
    cancelled.signal()
    await #expect(throws: CancellationError.self) { try await task.value }
    // The interrupt does not leak into the next call.
    #expect(try await connection.perform { try $0.scalar("SELECT 42") } == 42)
  }

  // Failed before the fix (as QueueEngineTests.prefetchedJobWaitsAfterAPauseStoredElsewhere, here with two
  // connections to one file as two processes have): a job claimed ahead starts after another
  // worker stored the pause.
  @Test("on SQLite, a prefetched job waits when another connection pauses the queue")
  func prefetchedJobWaitsAfterAPauseOnSQLite() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("pause.sqlite")
    let workerStore = try SQLiteJobStore(path: path)
    let otherStore = try SQLiteJobStore(path: path)
    let gate = Gate()
    let started = Log<Int>()
    let worker = try JobQueue<Numbered>(
      configuration: .init(
        identifier: "numbers", concurrency: 1, prefetch: 1, pollInterval: .milliseconds(50)),
      store: workerStore
    ) { item, _ in
      started.append(item.number)
      if item.number == 1 { await gate.wait() }
      return .handled
    }
    try await worker.add(contentsOf: [Numbered(number: 1), Numbered(number: 2)])
    try await eventually("job 1 runs and job 2 is claimed ahead") {
      try await otherStore.counts(queue: "numbers", clock: SystemJobClock()).running == 2
        && started.all == [1]
    }
    try await otherStore.setPaused(true, queue: "numbers")
    // The worker notices at its next look at the store (every 50 ms); a loaded machine may delay
    // that look, so wait for the queue to say so (a queue that never notices fails here).
    try await eventually("the worker sees the stored pause") { worker.state == .paused }
    gate.open()
    try await Task.sleep(for: .milliseconds(500))
    let startedAfterPause = started.all
    await worker.shutdown(gracePeriod: .seconds(5))
    await workerStore.close()
    await otherStore.close()
    #expect(startedAfterPause == [1], "the prefetched job started while the file said paused")
  }

  @Test("two queues on two connections to one file: every job handled exactly once")
  func twoConnectionsShareTheWork() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("shared.sqlite")
    let handled = Log<Int>()
    var queues: [JobQueue<Numbered>] = []
    var stores: [SQLiteJobStore] = []
    for _ in 0..<2 {
      let store = try SQLiteJobStore(path: path)
      stores.append(store)
      queues.append(
        try JobQueue<Numbered>(
          configuration: .init(
            identifier: "numbers", concurrency: 2, prefetch: 2, pollInterval: .milliseconds(20)),
          store: store
        ) { item, context in
          handled.append(item.number)
          return item.number % 9 == 0 && context.attempts == 1 ? .retry(after: .milliseconds(5)) : .handled
        })
    }
    try await queues[0].add(contentsOf: (0..<150).map { Numbered(number: $0) })
    try await queues[1].add(contentsOf: (150..<300).map { Numbered(number: $0) })
    let probe = stores[0]
    try await eventually("all done", timeout: .seconds(60)) {
      try await probe.counts(queue: "numbers", clock: SystemJobClock()).unfinished == 0
    }
    for queue in queues { await queue.shutdown() }
    for store in stores { await store.close() }
    let retried = (0..<300).filter { $0 % 9 == 0 }
    #expect(handled.all.sorted() == (Array(0..<300) + retried).sorted())
  }
}

/// The README's SQLite example, as written there except for the database location.
private struct Email: Queueable {
  var to: String
  var body: String
}

@Suite("README: SQLite store")
struct SQLiteReadmeTests {
  @Test func readmeExampleRuns() async throws {
    let folder = try TemporaryFolder()
    let sent = Mutex<[String]>([])
    // README: let store = try SQLiteJobStore(name: "outbox")
    let store = try SQLiteJobStore(path: folder.path("outbox.sqlite"))
    let queue = try JobQueue<Email>(
      configuration: .init(identifier: "emails", maxAttempts: 5, concurrency: 4), store: store
    ) { email, context in
      sent.withLock { $0.append(email.to) }  // README: try await mailer.send(email)
      return .handled
    }
    try await queue.add(Email(to: "ada@example.com", body: "Hello"))
    await queue.waitUntilFinished()
    await queue.shutdown(gracePeriod: .seconds(5))
    #expect(sent.withLock { $0 } == ["ada@example.com"])
  }
}

/// The item type as an older release stored it.
private struct ReminderV1: Queueable {
  var text: String
}

/// The item type after a change that old payloads no longer decode into.
private struct ReminderV2: Queueable {
  var text: String
  var dueInDays: Int
}

@Suite("JobQueue on SQLiteJobStore: changed item types")
struct ChangedItemTypeTests {
  @Test("a payload the new item type cannot decode becomes a dead job with the error; the rest go on")
  func undecodablePayloadsAreKeptAsDeadJobs() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("reminders.sqlite")
    let oldPayload: Data
    do {
      // An older release queued these and stopped.
      let old = try JobQueue<ReminderV1>(
        configuration: .init(identifier: "reminders", autoStart: false), store: try SQLiteJobStore(path: path)
      ) { _, _ in .handled }
      try await old.add(ReminderV1(text: "call the bank"))
      oldPayload = try #require(try await old.jobs().first?.payload)
    }
    let handled = Mutex<[String]>([])
    let store = try SQLiteJobStore(path: path)
    let queue = try JobQueue<ReminderV2>(
      configuration: .init(identifier: "reminders", autoStart: false), store: store
    ) { reminder, _ in
      handled.withLock { $0.append(reminder.text) }
      return .handled
    }
    try await queue.add(ReminderV2(text: "water the plants", dueInDays: 2))
    queue.start()
    await queue.waitUntilFinished()
    await queue.shutdown()
    #expect(handled.withLock { $0 } == ["water the plants"], "the decodable job still ran")

    // Reopen: the dead job is stored, with the decode error and its payload as it was.
    let reopened = try SQLiteJobStore(path: path)
    let dead = try await reopened.jobs(queue: "reminders", status: .dead, after: nil, limit: 10)
    #expect(dead.count == 1)
    #expect(dead.first?.payload == oldPayload)
    #expect(dead.first?.lastError?.contains("undecodable payload") == true)
    #expect(dead.first?.lastError?.contains("dueInDays") == true, "the error names the missing field")
    #expect(try await reopened.counts(queue: "reminders", now: Date()).withoutHistory == JobCounts(dead: 1))
  }
}
