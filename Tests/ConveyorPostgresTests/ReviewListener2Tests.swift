import Conveyor
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import ConveyorPostgres

#if canImport(Glibc)
  import Glibc
#endif

@Suite("Review 2: the PostgreSQL listener", .serialized, .timeLimit(.minutes(4)))
struct ReviewListener2Tests {
  func enqueue(_ queue: String, on store: PostgresJobStore) async throws {
    _ = try await store.enqueue([NewJob(payload: Data("{}".utf8))], queue: queue, clock: SystemJobClock())
  }

  /// Counts the `true` returns of back-to-back waits for `queue` (as a queue's watcher makes them)
  /// during `span`.
  func wakeUps(_ store: PostgresJobStore, queue: String, during span: Duration) async -> Int {
    let end = ContinuousClock.now + span
    var woken = 0
    while ContinuousClock.now < end {
      let left = end - ContinuousClock.now
      if await store.waitForWork(queue: queue, timeout: max(left, .milliseconds(1))) { woken += 1 }
    }
    return woken
  }

  /// A database whose sessions the server ends after `idle` without a statement from the client.
  func idleDatabase(_ server: PostgresServer, idle: String) throws -> String {
    let admin = try AdminConnection(server.url)
    let database = uniqueSchema("rl2idle")
    try admin.query("CREATE DATABASE \(database)")
    try admin.query("ALTER DATABASE \(database) SET idle_session_timeout = '\(idle)'")
    return "postgresql://postgres@127.0.0.1:\(server.port)/\(database)"
  }

  /// idle_session_timeout (which the store's own connection copes with: ReviewPG5Tests) shorter
  /// than the listener's 10 s heartbeat: the server ends the listener's session every few seconds,
  /// and every reconnect's `LISTEN` wakes every waiter. A queue with nothing to do is woken for
  /// nothing every ~3 s, forever (and notifications sent while the listener is down are lost).
  /// Now the listener's own session turns the timeout off (`idle_session_timeout = 0`): its
  /// heartbeat already gives up a connection that went silent.
  @Test func aShortIdleSessionTimeoutMakesTheListenerWakeEveryWaiterOverAndOver() async throws {
    let server = try await PostgresServer.shared()
    let url = try idleDatabase(server, idle: "2s")
    let store = try await PostgresJobStore.open(url: url, options: .init(schema: uniqueSchema("rl2idle")))
    // The first LISTEN wakes the first wait.
    #expect(await store.waitForWork(queue: "q", timeout: .seconds(30)), "the listener is up")
    let woken = await wakeUps(store, queue: "q", during: .seconds(15))
    #expect(woken <= 1, "nothing was added, yet the waiter of queue q was woken \(woken) times in 15 s")
    await store.close()
  }

  /// The heartbeat is sent after 10 s without a byte *from the server*; idle_session_timeout
  /// counts the time without a statement *from the client*. A steady trickle of notifications
  /// (another queue's jobs, every 2 s) keeps the heartbeat from ever being sent, so even a
  /// timeout above the heartbeat (12 s) ends the listener's session again and again, each
  /// reconnect waking every waiter. Now the listener's session turns the timeout off.
  @Test func notificationsKeepTheHeartbeatFromStoppingAnIdleSessionTimeout() async throws {
    let server = try await PostgresServer.shared()
    let url = try idleDatabase(server, idle: "12s")
    let schema = uniqueSchema("rl2trickle")
    let store = try await PostgresJobStore.open(url: url, options: .init(schema: schema))
    let adder = try await PostgresJobStore.open(url: url, options: .init(schema: schema))
    #expect(await store.waitForWork(queue: "q", timeout: .seconds(30)), "the listener is up")
    // Another queue ("busy") of the same store gets a job every 2 s.
    let trickle = Task {
      while !Task.isCancelled {
        try? await enqueue("busy", on: adder)
        try? await Task.sleep(for: .seconds(2))
      }
    }
    let woken = await wakeUps(store, queue: "q", during: .seconds(30))
    trickle.cancel()
    _ = await trickle.value
    #expect(woken <= 1, "nothing was added to queue q, yet its waiter was woken \(woken) times in 30 s")
    await adder.close()
    await store.close()
  }

  /// Control: the server ending the listener's session (pg_terminate_backend): it reconnects and
  /// the new LISTEN wakes the waiter.
  @Test func controlATerminatedListenerReconnectsAndWakes() async throws {
    let server = try await PostgresServer.shared()
    let admin = try AdminConnection(server.url)
    let schema = uniqueSchema("rl2term")
    let store = try await PostgresJobStore.open(url: server.url, options: .init(schema: schema))
    #expect(await store.waitForWork(queue: "q", timeout: .seconds(30)), "the listener is up")
    let waiter = Task { await store.waitForWork(queue: "q", timeout: .seconds(60)) }
    try await Task.sleep(for: .milliseconds(500))
    try admin.query(
      "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE '%LISTEN \"\(schema).jobs\"'")
    #expect(await waiter.value, "the reconnect's LISTEN woke the waiter")
    await store.close()
  }
}
