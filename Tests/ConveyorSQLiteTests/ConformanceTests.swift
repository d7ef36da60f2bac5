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
}
