import Conveyor
import ConveyorPostgres
import ConveyorTestSupport
import Testing

@Suite("PostgresJobStore conformance")
struct ConformanceTests {
  /// Each check gets a fresh schema on the shared server, and the callers' clock (the suite
  /// drives time with fixed clocks; a claim's delay on the server, which a loaded machine makes
  /// long now and then, is not added to it: `LimitConcurrencyTests` checks that it is).
  @Test(arguments: JobStoreConformance.checks)
  func conformance(_ check: JobStoreCheck) async throws {
    let server = try await PostgresServer.shared()
    var options = PostgresJobStore.Options(schema: uniqueSchema(), clock: .caller)
    options.claimDelayCounted = nil
    let store = try await PostgresJobStore.open(url: server.url, options: options)
    try await check.run(store)
    await store.close()
  }

  /// The queue engine on a fresh schema, with the database's clock and no lock timeout, so the
  /// checks' short leases are allowed. (A short one fails commits that wait for the lock every
  /// `NOTIFY` of the server takes at commit, which other tests' servers hold while frozen.)
  @Test(arguments: QueueEngineConformance.checks)
  func engine(_ check: JobStoreCheck) async throws {
    let server = try await PostgresServer.shared()
    let store = try await PostgresJobStore.open(
      url: server.url, options: .init(schema: uniqueSchema(), lockTimeout: .zero))
    try await check.run(store)
    await store.close()
  }
}
