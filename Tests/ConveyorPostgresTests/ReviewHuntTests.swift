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

/// Reconnecting to a server that froze whole.
///
/// When a call's connection breaks, `SerializedConnection.run` opens a new one with
/// `Connection(conninfo:)`, i.e. a blocking `PQconnectdb` on the store's thread. Against a server
/// that froze whole (its kernel still accepts the TCP connection into the listen backlog, the
/// postmaster never answers the startup packet) and a URL without `connect_timeout`, `PQconnectdb`
/// waits without bound. Nothing ends it:
/// - `callTimeout` only watches `body(connection)`: `watch(operation)` is called after
///   `connected()` returns;
/// - `reconnectTimeout`'s deadline is only looked at after the connect has thrown;
/// - cancelling sends `PQcancel` / shuts down the socket of `cancelHandle`, which `drop()` set to
///   nil before connecting: there is no handle, so both do nothing.
/// The store's thread stays stuck, so every later call and `close()` wait behind it too.
@Suite("Review hunt: reconnecting to a frozen PostgreSQL server", .serialized, .timeLimit(.minutes(3)))
struct ReviewHuntTests {
  /// `callTimeout` (5 s) ends the statement sent to the frozen server; the call, whose
  /// `reconnectTimeout` (5 s) has passed by then, should fail at once. It never ended: the reconnect's `PQconnectdb` waited for
  /// the frozen postmaster, outside `callTimeout`'s watch and past `reconnectTimeout`.
  ///
  /// (The timeouts were 2 s and 3 s: in a loaded CI run the first call, before the freeze, took
  /// longer than 2 s, and failed.)
  @Test func aCallToAFrozenServerEndsWithinCallTimeoutAndReconnectTimeout() async throws {
    let server = try await PostgresServer.start()
    defer { server.stop() }
    let store = try await PostgresJobStore.open(
      url: server.url,
      options: .init(schema: uniqueSchema("hunt"), reconnectTimeout: .seconds(5), callTimeout: .seconds(5)))
    _ = try await store.queueNames()  // the store's connection is open

    let frozen = try server.freeze()
    defer { frozen.thaw() }

    let finished = Atomic<Bool>(false)
    let call = Task {
      defer { finished.store(true, ordering: .releasing) }
      _ = try await store.queueNames()
    }
    // Promised: about callTimeout (5 s), then no further attempt.
    let ended = await eventually(timeout: .seconds(30)) { finished.load(ordering: .acquiring) }
    #expect(
      ended,
      "a call to a frozen server had not ended 30 s after it started (callTimeout 5 s, reconnectTimeout 5 s)")
    if ended, case .failure(let error as PostgresError) = await call.result {
      #expect(error.code == .timedOut, "\(error)")
    }

    // And close() cannot return either while the store's thread is stuck in the connect.
    let closed = Atomic<Bool>(false)
    let closing = Task {
      await store.close()
      closed.store(true, ordering: .releasing)
    }
    let closedInTime = await eventually(timeout: .seconds(20)) { closed.load(ordering: .acquiring) }
    #expect(closedInTime, "close() had not returned 20 s after it was called (the store's thread is stuck)")

    frozen.thaw()
    _ = await call.result
    await closing.value
  }

  /// The README: "a cancelled call ends even against a server that froze whole", two seconds
  /// after the cancel. A call whose connection the server had closed while idle (a restart, an
  /// idle timeout, `pg_terminate_backend`) reconnects first; if the server froze meanwhile,
  /// cancelling that call does nothing: there is no cancel handle (and no socket) while
  /// `PQconnectdb` runs.
  @Test func cancellingACallThatIsReconnectingToAFrozenServerEndsIt() async throws {
    let server = try await PostgresServer.start()
    defer { server.stop() }
    let store = try await PostgresJobStore.open(url: server.url, options: .init(schema: uniqueSchema("hunt")))
    _ = try await store.queueNames()  // the store's connection is open

    // The server ends the store's idle session, then freezes whole.
    try await server.terminateClientSessions()
    let frozen = try server.freeze()
    defer { frozen.thaw() }

    let finished = Atomic<Bool>(false)
    let call = Task {
      defer { finished.store(true, ordering: .releasing) }
      _ = try await store.queueNames()
    }
    try await Task.sleep(for: .seconds(1))  // the call is reconnecting
    let endedBeforeCancel = finished.load(ordering: .acquiring)
    #expect(!endedBeforeCancel, "the call ended before it was cancelled")
    Thread { call.cancel() }.start()
    // Promised: two seconds after the cancel.
    let ended = await eventually(timeout: .seconds(20)) { finished.load(ordering: .acquiring) }
    #expect(ended, "the cancelled call (reconnecting to a frozen server) had not ended 20 s after the cancel")

    frozen.thaw()
    _ = await call.result
    await store.close()
  }
}
