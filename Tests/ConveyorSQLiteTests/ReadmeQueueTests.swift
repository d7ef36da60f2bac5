import Conveyor
import ConveyorSQLite
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

// The README's "A durable queue" example, compiled and run. Keep the two in step.

private struct WelcomeEmail: Queueable {
  var address: String
}

@Suite("README examples: durable queue")
struct ReadmeQueueTests {
  @Test("the durable queue example runs and handles its job")
  func durableQueue() async throws {
    let folder = FileManager.default.temporaryDirectory.appendingPathComponent("readme-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
    defer { _ = try? FileManager.default.removeItem(at: folder) }
    let path = folder.appendingPathComponent("jobs.sqlite").path
    let sent = Mutex<[String]>([])

    // --- README code starts ---
    let store = try SQLiteJobStore(path: path)
    var configuration = JobQueueConfiguration(identifier: "emails")
    configuration.retryPolicy = .exponential(initial: .seconds(1), maximum: .seconds(300))
    configuration.maxAttempts = 8

    let emails = try JobQueue<WelcomeEmail>(configuration: configuration, store: store) { email, context in
      print("sending to \(email.address), attempt \(context.attempts)")
      sent.withLock { $0.append(email.address) }  // (not in the README)
      return .handled  // or .retry, .retry(after:), .discard(reason:); a thrown error retries
    }
    try await emails.add(WelcomeEmail(address: "ada@example.com"))  // committed when this returns
    await emails.waitUntilFinished()
    await emails.shutdown()
    // --- README code ends ---

    #expect(sent.withLock { $0 } == ["ada@example.com"])
    #expect(try await store.counts(queue: "emails", now: Date()).total == 0)
  }

  @Test("the job's life example cancels a job and finds it in the history")
  func jobsLife() async throws {
    let folder = try TemporaryFolder()
    let store = try SQLiteJobStore(path: folder.path("jobs.sqlite"))
    // The example cancels a job that has not run: paused, no worker can take it first (on a loaded
    // machine the job once completed before the cancel came).
    try await store.setPaused(true, queue: "emails")

    // --- README code starts ---
    var configuration = JobQueueConfiguration(identifier: "emails")
    configuration.timeLimit = .seconds(30)  // a handler past it is cancelled, then retried
    configuration.retention.completed = .days(7)  // keep a week of completed jobs (default 1 day)
    let emails = try JobQueue<WelcomeEmail>(configuration: configuration, store: store) { email, _ in
      .handled(output: ["sent": email.address])  // kept with the job
    }
    let id = try await emails.add(WelcomeEmail(address: "bob@example.com")).id
    try await emails.cancel(id)  // it never runs, or its handler is cancelled
    let job = try await emails.job(id)  // status .cancelled, finishedAt, errors, output…
    // --- README code ends ---

    #expect(job?.status == .cancelled && job?.finishedAt != nil)
    try await emails.resume()

    // --- README schedule code starts ---
    let digest = try ScheduleTiming(cron: "0 8 * * MON-FRI", timeZone: "Europe/Berlin", catchUp: .latest)
    try await emails.declareSchedules([
      try emails.schedule("digest", digest, item: WelcomeEmail(address: "team@example.com"))
    ])
    // --- README schedule code ends ---
    #expect(try await emails.schedules().map(\.name) == ["digest"])

    let done = try await emails.add(WelcomeEmail(address: "ada@example.com")).id
    await emails.waitUntilFinished()
    await emails.shutdown()
    let completed = try await emails.job(done)
    #expect(completed?.status == .completed)
    #expect(
      try completed.flatMap { try emails.output(of: $0, as: [String: String].self) } == [
        "sent": "ada@example.com"
      ])
  }
}
