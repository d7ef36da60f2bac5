import Conveyor
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import ConveyorPostgres

#if canImport(Glibc)
  import Glibc
#endif

/// Review of 7bd3d0f (the cancel request sent on a thread of its own).
@Suite("Review session 21: PostgreSQL cancel requests", .serialized, .timeLimit(.minutes(3)))
struct ReviewSession21Tests {
  /// A cancel request meant for a call must not end the next call on the same connection.
  /// Failed before the fix (B failed with 57014); now a cancelled block that ends while its
  /// request is on its way drops its connection, and B runs on a new backend.
  ///
  /// `Operation.whileRunning` sends the cancel under the operation's lock "so the block cannot
  /// finish and let the next block's statement be cancelled instead". Before 7bd3d0f, `PQcancel`
  /// returned only once the postmaster had handled the request, so that held. Now the request
  /// is only *started* under the lock: its thread may reach the postmaster after the cancelled
  /// call finished on its own and the next call's statement started on the same backend (same
  /// PID and cancel key), which it then cancels.
  ///
  /// The delay is made deterministic by stopping only the postmaster (SIGSTOP): the connection's
  /// backend keeps running, so call A finishes on its own; the cancel request sits in the
  /// postmaster's listen backlog until SIGCONT, which is sent while call B (never cancelled)
  /// runs. On a loaded machine the same happens whenever the cancel thread starts or connects
  /// later than the cancelled statement ends.
  @Test func aCancelRequestForOneCallDoesNotEndTheNextCall() async throws {
    let server = try await PostgresServer.start()
    defer { server.stop() }
    let connection = SerializedConnection(
      label: "ReviewSession21", conninfo: server.url, scrubber: Scrubber(secrets: []),
      reconnectTimeout: .seconds(30)  // B reconnects while the postmaster may still be stopped
    ) { _ in }
    try await connection.connect()
    let backendBefore = try await connection.perform(idempotent: true) {
      try $0.execute("SELECT pg_backend_pid()::int8", prepared: false).int64(0, 0)
    }

    let postmaster = try server.postmaster()
    // Call A: short enough to end on its own well before the socket shutdown (2 s after the
    // cancellation).
    let callA = Task {
      try await connection.perform(idempotent: true, retrying: false) {
        _ = try $0.execute("SELECT pg_sleep(0.6)", prepared: false)
      }
    }
    try await Task.sleep(for: .milliseconds(200))  // A's block is running
    let frozen = Freeze([postmaster])
    defer { frozen.thaw() }
    callA.cancel()  // returns at once: the request waits in the postmaster's backlog
    // A ends on its own (its backend is not stopped): it returns, or fails with a cancellation;
    // either way it is over.
    _ = await callA.result

    // Call B, on the same connection and backend, never cancelled.
    let callB = Task {
      try await connection.perform(idempotent: true, retrying: false) {
        try $0.execute("SELECT pg_backend_pid()::int8, pg_sleep(1.5)", prepared: false).int64(0, 0)
      }
    }
    try await Task.sleep(for: .milliseconds(400))  // B's statement is running
    frozen.thaw()  // A's cancel request now reaches the server
    let resultB = await callB.result
    switch resultB {
    case .success:
      break  // on the same backend, or on a new connection (a fix may drop the one A's request targets)
    case .failure(let error):
      Issue.record(
        "call B, never cancelled, failed: \(error) (A's stale cancel request ended B's statement on backend \(backendBefore))"
      )
    }
    await connection.close()
  }
}
