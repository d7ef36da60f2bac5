import Conveyor
import ConveyorTestSupport
import Testing

@Suite("InMemoryJobStore conformance")
struct InMemoryJobStoreConformanceTests {
  @Test(arguments: JobStoreConformance.checks)
  func conformance(_ check: JobStoreCheck) async throws {
    try await check.run(InMemoryJobStore())
  }

  @Test(arguments: QueueEngineConformance.checks)
  func engine(_ check: JobStoreCheck) async throws {
    try await check.run(InMemoryJobStore())
  }
}
