import Conveyor
import ConveyorSQLite
import ConveyorTestSupport
import Foundation
import Testing

/// The stores the helpers are tested on: the in-memory store and a SQLite file in a fresh
/// temporary folder.
enum StoreKind: String, CaseIterable, Sendable, CustomTestStringConvertible {
  case inMemory
  case sqlite

  var testDescription: String { rawValue }

  /// A new, empty store of this kind (the folder holding a SQLite file lives as long as it).
  func make() throws -> TestStore {
    switch self {
    case .inMemory: return TestStore(store: InMemoryJobStore(), folder: nil)
    case .sqlite:
      let folder = try TemporaryFolder(prefix: "conveyor-testing")
      return TestStore(store: try SQLiteJobStore(path: folder.path("jobs.sqlite")), folder: folder)
    }
  }
}

/// A store and, for a SQLite file, the temporary folder that holds it.
struct TestStore: Sendable {
  let store: any JobStore
  let folder: TemporaryFolder?
}

/// The job type of these tests.
struct SendEmail: Queueable, Equatable {
  var to: String
  var subject = "Hello"
}

/// Another job type, to check that items of a different type never match.
struct ResizeImage: Queueable, Equatable {
  var width: Int
}

/// A queue of `SendEmail` on `clock`, started, with a fixed 15 s retry.
func emailQueue(
  _ store: any JobStore, clock: ManualJobClock, identifier: String = "emails", maxAttempts: Int? = nil,
  handler: @escaping JobQueue<SendEmail>.Handler
) throws -> JobQueue<SendEmail> {
  try JobQueue<SendEmail>(
    configuration: .init(
      identifier: identifier, retryPolicy: .fixed(.seconds(15)), maxAttempts: maxAttempts, clock: clock),
    store: store, handler: handler)
}
