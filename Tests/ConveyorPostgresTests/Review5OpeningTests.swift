import CLibPQ
import Conveyor
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import ConveyorPostgres

#if canImport(Glibc)
  import Glibc
#endif

/// Review of 7b0e76b: `SocketDeadline` and the bound on opening a store.
@Suite("Review 5: opening a store under SocketDeadline", .timeLimit(.minutes(3)))
struct Review5OpeningTests {
  /// "Two processes migrating at once both succeed". A second opener waits for the migration
  /// advisory lock while the first migrates; its wait is one statement of the opening, which gets
  /// `callTimeout` but at least 30 s, so a migration longer than a short `callTimeout` (5 s here)
  /// does not fail it. (The review's version held the lock 34 s, past the 30 s floor, and the
  /// opening failed with `.timedOut`: as documented now, a wait longer than that needs a larger
  /// `callTimeout`.) Here another session holds the migration lock for 8 s, standing in for the
  /// other process's migration.
  @Test func aSecondOpenerWaitsForAFirstOpenersLongMigration() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("rev5")
    let holder = try AdminConnection(server.url)
    try holder.query("BEGIN")
    try holder.query("SELECT pg_advisory_xact_lock(hashtextextended('conveyor.migrate:' || '\(schema)', 0))")
    // The "first process" finishes its migration after 8 s.
    nonisolated(unsafe) let unsafeHolder = holder
    Thread {
      Thread.sleep(forTimeInterval: 8)
      _ = try? unsafeHolder.query("COMMIT")
    }.start()
    do {
      let store = try await PostgresJobStore.open(
        url: server.url, options: .init(schema: schema, lockTimeout: .zero, callTimeout: .seconds(5)))
      _ = try await store.queueNames()
      await store.close()
    } catch {
      Issue.record("the second opener failed instead of waiting for the first's migration: \(error)")
    }
  }

  /// The init's DocC: a server that stops answering before the handshake (a frozen host: the
  /// kernel accepts the TCP connection) fails the opening with `.connectionFailed` after the
  /// connect timeout (here the URL's 3 s), whatever `callTimeout` says. (The DocC said `.timedOut`
  /// after `callTimeout`, at least 30 s.)
  @Test func aFrozenServerFailsTheOpeningAsDocumented() async throws {
    let server = try await PostgresServer.start()
    defer { server.stop() }
    let frozen = try server.freezePostmaster()
    defer { frozen.thaw() }
    do {
      _ = try await PostgresJobStore.open(
        url: server.url + "?connect_timeout=3",
        options: .init(schema: uniqueSchema("rev5"), callTimeout: .seconds(40)))
      Issue.record("opened a store on a frozen server")
    } catch let error as PostgresError {
      #expect(error.code == .connectionFailed, "code \(error.code): \(error)")
    }
  }

  /// `SocketDeadline` shuts down a descriptor number, not a socket. libpq closes its socket
  /// itself as soon as it sees a lost connection (`pqDropConnection`), before the error reaches
  /// the `defer { disarm() }`; a descriptor opened meanwhile by any other thread of the process
  /// gets the same number, and a timer firing in that window shuts down that other socket.
  /// (Here the window is held open; in the store it is short. The deadline now keeps a `dup` of
  /// the descriptor, closed by `disarm`, and acts only on the right socket.)
  @Test func aDeadlineDoesNotShutDownAReusedDescriptor() async throws {
    var first: [Int32] = [0, 0]
    #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &first) == 0)
    let deadline = SocketDeadline(socket: first[0], after: .milliseconds(200))
    // The connection's owner (libpq) closes its socket…
    close(first[0])
    // …and another part of the process opens one, which gets the same number.
    var other: [Int32] = [0, 0]
    #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &other) == 0)
    defer {
      close(other[0])
      close(other[1])
      close(first[1])
    }
    #expect(
      other[0] == first[0] || other[1] == first[0], "the descriptor was not reused; the test proves nothing")
    try await Task.sleep(for: .seconds(1))
    deadline.disarm()
    // The other socket still works both ways.
    var byte: UInt8 = 7
    let sent = send(other[1], &byte, 1, Int32(MSG_NOSIGNAL))
    let sentBack = send(other[0], &byte, 1, Int32(MSG_NOSIGNAL))
    #expect(sent == 1 && sentBack == 1, "another socket of the process was shut down (\(sent), \(sentBack))")
  }
}
