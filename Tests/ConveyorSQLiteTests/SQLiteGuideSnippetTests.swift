import Conveyor
import ConveyorSQLite
import ConveyorTestSupport
import Foundation
import Testing

// The examples of the "Using the SQLite store" guide
// (Sources/ConveyorSQLite/ConveyorSQLite.docc/UsingTheSQLiteStore.md) and of the module's landing
// page (ConveyorSQLite.md), verbatim between the markers, so they compile (and, where they do not
// write to the user's own data folder, run).

// UsingTheSQLiteStore.md example begins
private struct Payment: Queueable {
  var orderID: Int
  var cents: Int
}

/// Opens the payments database with every commit flushed to the disk, adds a job, and closes
/// the file (one self-contained file afterwards).
private func recordPayment(_ payment: Payment, databasePath: String) async throws {
  let store = try await SQLiteJobStore.open(
    path: databasePath, options: .init(synchronous: .full, busyTimeout: .seconds(10)))
  let payments = try JobQueue<Payment>(
    configuration: .init(identifier: "payments", autoStart: false), store: store
  ) { _, _ in .handled }
  try await payments.add(payment)  // on the disk when this returns, even after a power loss
  await payments.shutdown()
  await store.close()
}
// UsingTheSQLiteStore.md example ends

private struct Email: Queueable {
  var to: String
  var body: String
}

/// The landing page's `mailer`.
private struct Mailer {
  func send(_ email: Email) async throws {}
}

private let mailer = Mailer()

/// The landing page's example. Compiled, not run: it opens the database in the user's own data
/// folder (`$XDG_DATA_HOME/conveyor/outbox.sqlite`).
private func landingPageExample() async throws {
  // ConveyorSQLite.md example begins
  let store = try SQLiteJobStore(path: SQLiteJobStore.defaultDatabaseURL(name: "outbox").path)
  let queue = try JobQueue<Email>(configuration: .init(identifier: "emails"), store: store) { email, _ in
    try await mailer.send(email)
    return .handled
  }
  try await queue.add(Email(to: "ada@example.com", body: "Hello"))
  // ConveyorSQLite.md example ends
  await queue.shutdown()
}

@Suite("Guide snippets: SQLite store", .timeLimit(.minutes(10)))
struct SQLiteGuideSnippetTests {
  @Test func aPaymentIsInTheClosedFile() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("payments.sqlite")
    try await recordPayment(Payment(orderID: 42, cents: 1_999), databasePath: path)
    // Closed: no write-ahead log beside the file, and the job is in it.
    #expect(!FileManager.default.fileExists(atPath: path + "-wal"))
    let store = try SQLiteJobStore(path: path)
    #expect(try await store.counts(queue: "payments", now: Date()) == JobCounts(ready: 1))
    await store.close()
  }
}
