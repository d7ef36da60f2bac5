import Conveyor
import ConveyorTestSupport
import Testing

@testable import ConveyorSQLite

@Suite("SQLiteJobStore conformance")
struct ConformanceTests {
  /// Each check gets a fresh database file in its own temporary folder.
  @Test(arguments: JobStoreConformance.checks)
  func conformance(_ check: JobStoreCheck) async throws {
    let folder = try TemporaryFolder()
    try await check.run(try makeStore(folder))
    _ = folder
  }

  /// The queue engine on a fresh file, with the real clock (and a busy timeout short enough for
  /// the checks' leases).
  @Test(arguments: QueueEngineConformance.checks)
  func engine(_ check: JobStoreCheck) async throws {
    let folder = try TemporaryFolder()
    try await check.run(try makeStore(folder, options: .init(busyTimeout: .milliseconds(200))))
    _ = folder
  }
}
