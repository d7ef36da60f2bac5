import Conveyor
import ConveyorPostgres
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

/// Opening a store: connecting, waiting for a server that is not up yet, migrating.
@Suite("PostgreSQL: opening")
struct OpeningTests {
  /// A URL of a loopback port nobody listens on.
  func unreachableURL() throws -> String {
    let (socket, port) = try PostgresServer.loopbackSocket(listening: false)
    close(socket)
    return "postgresql://postgres@127.0.0.1:\(port)/postgres?connect_timeout=2"
  }

  @Test func aStoreOpenedBeforeItsServerStartsWaitsAndSaysSoOnce() async throws {
    let server = try await PostgresServer.start()
    defer { server.stop() }
    try await PostgresServer.onBackgroundThread { try server.control(["stop", "-m", "fast", "-w"]) }
    let waits = Mutex(0)
    let opening = Task {
      try await PostgresJobStore.open(
        url: server.url, options: .init(schema: uniqueSchema(), startupWait: .seconds(60)),
        onWait: { _ in waits.withLock { $0 += 1 } })
    }
    try await eventually("the opening says it waits") { waits.withLock { $0 } == 1 }
    try await Task.sleep(for: .milliseconds(700))  // a few more attempts fail meanwhile
    try await PostgresServer.onBackgroundThread {
      try server.control([
        "start", "-w", "-t", "60", "-l", server.folder + "/server.log", "-o", server.serverOptions,
      ])
    }
    let store = try await opening.value
    #expect(waits.withLock { $0 } == 1, "said once")
    _ = try await store.enqueue([NewJob(payload: Data("{}".utf8))], queue: "q", clock: SystemJobClock())
    #expect(try await store.counts(queue: "q", clock: SystemJobClock()).ready == 1)
    await store.close()
  }

  @Test func cancellingTheOpeningEndsItsWaitAtOnce() async throws {
    let url = try unreachableURL()
    let waiting = Mutex(false)
    let opening = Task {
      try await PostgresJobStore.open(
        url: url, options: .init(startupWait: .seconds(600)), onWait: { _ in waiting.withLock { $0 = true } })
    }
    try await eventually("the opening waits") { waiting.withLock { $0 } }
    let cancelled = ContinuousClock.now
    opening.cancel()
    await #expect(throws: CancellationError.self) { _ = try await opening.value }
    // Ended by the cancellation, not by the ten minutes of `startupWait`.
    #expect(ContinuousClock.now - cancelled < .seconds(60))
  }

  @Test func aServerThatStaysDownFailsAfterStartupWaitNamingTheLastFailure() async throws {
    let url = try unreachableURL()
    let waits = Mutex(0)
    do {
      _ = try await PostgresJobStore.open(
        url: url, options: .init(startupWait: .milliseconds(500)), onWait: { _ in waits.withLock { $0 += 1 } }
      )
      Issue.record("opened a store on a port nobody listens on")
    } catch let error as PostgresError {
      #expect(error.code == .connectionFailed)
      #expect(error.message.contains("startupWait"), "\(error)")
    }
    #expect(waits.withLock { $0 } == 1)
  }

  @Test func aFailureWaitingCannotMendFailsAtOnce() async throws {
    let server = try await PostgresServer.shared()
    let url = "postgresql://postgres@127.0.0.1:\(server.port)/no_such_database"
    let waits = Mutex(0)
    let started = ContinuousClock.now
    await #expect(throws: PostgresError.self) {
      _ = try await PostgresJobStore.open(
        url: url, options: .init(startupWait: .seconds(600)), onWait: { _ in waits.withLock { $0 += 1 } })
    }
    #expect(waits.withLock { $0 } == 0, "no wait for a database that does not exist")
    #expect(ContinuousClock.now - started < .seconds(60))
  }

  @Test func byDefaultOpeningMakesOneAttempt() async throws {
    let url = try unreachableURL()
    let waits = Mutex(0)
    await #expect(throws: PostgresError.self) {
      _ = try await PostgresJobStore.open(url: url, onWait: { _ in waits.withLock { $0 += 1 } })
    }
    #expect(waits.withLock { $0 } == 0)
  }

  /// Holds the migration lock of `schema` on a connection of its own, as another process that
  /// migrates it does, until the returned connection commits.
  func holdMigrationLock(_ server: PostgresServer, schema: String) throws -> AdminConnection {
    let holder = try AdminConnection(server.url)
    try holder.query("BEGIN")
    try holder.query("SELECT pg_advisory_xact_lock(hashtextextended('conveyor.migrate:' || '\(schema)', 0))")
    return holder
  }

  /// The wait for another process's migration is a statement of the opening, which the options
  /// bound by `callTimeout` (at least 30 s): not by `lockTimeout`, the longest a statement waits
  /// for a row lock. A migration that takes longer than `lockTimeout` (version 4 rebuilds the
  /// claim's index, in proportion to the jobs) made every worker that started meanwhile fail with
  /// "canceling statement due to lock timeout".
  @Test func anOpeningWaitsForAnotherProcessesMigrationLongerThanTheLockTimeout() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("migwait")
    let holder = try holdMigrationLock(server, schema: schema)
    // The other process's migration ends after 3 s.
    nonisolated(unsafe) let unsafeHolder = holder
    Thread {
      Thread.sleep(forTimeInterval: 3)
      _ = try? unsafeHolder.query("COMMIT")
    }.start()
    do {
      let store = try await PostgresJobStore.open(
        url: server.url, options: .init(schema: schema, lockTimeout: .seconds(1)))
      _ = try await store.enqueue([NewJob(payload: Data("{}".utf8))], queue: "q", clock: SystemJobClock())
      await store.close()
    } catch {
      Issue.record("the opening failed instead of waiting for the other process's migration: \(error)")
    }
  }

  /// Cancelling the opening ends its wait at once: also its wait for another process's
  /// migration (a long one: version 4 rebuilds the claim's index), which went on until the
  /// migration ended or `callTimeout` passed. (A worker told to stop while it starts, as
  /// `conveyor work` is by SIGTERM, then stopped only after that.)
  @Test func cancellingTheOpeningEndsItsWaitForAnotherProcessesMigration() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("migcancel")
    let holder = try holdMigrationLock(server, schema: schema)
    defer { _ = try? holder.query("COMMIT") }
    let ended = Mutex(false)
    let opening = Task {
      defer { ended.withLock { $0 = true } }
      return try await PostgresJobStore.open(
        url: server.url, options: .init(schema: schema, lockTimeout: .zero, startupWait: .seconds(60)))
    }
    let watcher = try AdminConnection(server.url)
    try await waitFor("the opening waits for the migration lock") {
      try watcher.scalar(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND "
          + "((classid::int8 << 32) | objid::int8) = hashtextextended('conveyor.migrate:' || '\(schema)', 0)")
        != "0"
    }
    opening.cancel()
    // The migration lock stays held (for a minute of `callTimeout`): only the cancellation can
    // end the opening within this bound.
    let endedInTime = await eventually(timeout: .seconds(20)) { ended.withLock { $0 } }
    #expect(endedInTime, "the opening went on after it was cancelled")
    _ = try? holder.query("COMMIT")
    if case .success(let store) = await opening.result { await store.close() }
  }

  @Test func aNegativeStartupWaitIsRefused() async throws {
    let server = try await PostgresServer.shared()
    await #expect {
      _ = try await PostgresJobStore.open(url: server.url, options: .init(startupWait: .seconds(-1)))
    } throws: { error in
      (error as? PostgresError)?.code == .invalidOptions
    }
  }
}
