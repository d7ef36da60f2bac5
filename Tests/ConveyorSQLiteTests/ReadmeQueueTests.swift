import Conveyor
import ConveyorSQLite
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
}
