import Conveyor
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import ConveyorPostgres

/// Second review of `.timedOut` and the watched session setup (commit 379363d).
@Suite("Review 2: calls ended by callTimeout", .serialized, .timeLimit(.minutes(3)))
struct Review2TimedOutTests {
  /// Promise 1 ("a server silent after the handshake is cut off by callTimeout"), and the README's
  /// "Connecting never waits without bound either" / "a server that goes away while the store
  /// opens fails the call at once". Opening runs the same session setup (and the migrations) on a
  /// connection of its own (`migrating` in `PostgresJobStore.init`), with neither `callTimeout` nor
  /// any other bound: a server that stops answering right after the handshake holds
  /// `PostgresJobStore.open` (and its thread) forever, and cancelling the opening task does not
  /// end it either.
  @Test func openingAStoreOnAServerSilentAfterTheHandshakeEnds() async throws {
    let server = try await PostgresServer.start()
    defer { server.stop() }
    let proxy = try ReviewTimedOutProxy(target: server.port)
    defer { proxy.close() }
    proxy.startSilencing()
    let url = proxy.url
    let finished = Atomic<Bool>(false)
    let opening = Task {
      defer { finished.store(true, ordering: .releasing) }
      return try await PostgresJobStore.open(
        url: url,
        options: .init(
          schema: uniqueSchema("rev2to"), reconnectTimeout: .seconds(2), callTimeout: .seconds(2)))
    }
    // Promised: 30 s (callTimeout, at least 30 s for an opening).
    let ended = await eventually(timeout: .seconds(75)) { finished.load(ordering: .acquiring) }
    #expect(
      ended,
      "open had not ended 75 s after it started (callTimeout 2 s, so 30 s for opening); setups silenced: \(proxy.silenced.load(ordering: .relaxed))"
    )
    if ended, case .failure(let error as PostgresError) = await opening.result {
      #expect(error.code == .timedOut, "\(error)")
    } else if ended {
      Issue.record("opening a store on a silent server did not fail with .timedOut")
    }
    if !ended {
      Thread { opening.cancel() }.start()
      let cancelled = await eventually(timeout: .seconds(5)) { finished.load(ordering: .acquiring) }
      #expect(cancelled, "nor had it ended 5 s after it was cancelled")
    }
    proxy.close()  // frees the opening thread
    if case .success(let store) = await opening.result { await store.close() }
  }

  /// Promise 1 ("a cancelled call reaches the setup (PQcancel, then socket shutdown after 2 s)").
  /// The cancel does end the call, but the call then fails with the closed socket's
  /// `PostgresError` (libpq's "server closed the connection unexpectedly … check that the server
  /// is running"), not `CancellationError`: after the 2 s shutdown the loss is handled as any
  /// other, and with the reconnect deadline passed (here `reconnectTimeout` zero) `run` throws it
  /// without looking at the cancellation. (A cancelled first-pass connect ends with
  /// `CancellationError`; a cancelled setup should too.)
  @Test func cancellingACallWhoseSetupGetsNoAnswerThrowsCancellationError() async throws {
    let server = try await PostgresServer.start()
    defer { server.stop() }
    let proxy = try ReviewTimedOutProxy(target: server.port)
    defer { proxy.close() }
    let store = try await PostgresJobStore.open(
      url: proxy.url, options: .init(schema: uniqueSchema("rev2to"), reconnectTimeout: .zero))
    _ = try await store.queueNames()  // the store's connection is open
    proxy.startSilencing()
    try await server.terminateClientSessions()

    let finished = Atomic<Bool>(false)
    let call = Task {
      defer { finished.store(true, ordering: .releasing) }
      _ = try await store.queueNames()
    }
    // The call reconnects (its first pass: the whole connect timeout) and waits on its setup.
    let silenced = await eventually(timeout: .seconds(20)) { proxy.silenced.load(ordering: .relaxed) > 0 }
    #expect(silenced, "the call's setup was never sent")
    try await Task.sleep(for: .milliseconds(300))
    let endedBeforeCancel = finished.load(ordering: .acquiring)
    #expect(!endedBeforeCancel, "the call ended before the cancel")
    Thread { call.cancel() }.start()
    let ended = await eventually(timeout: .seconds(15)) { finished.load(ordering: .acquiring) }
    #expect(ended, "a call cancelled during its setup had not ended 15 s after the cancel")
    proxy.close()
    let result = await call.result
    if case .failure(let error) = result {
      #expect(error is CancellationError, "a cancelled call failed with \(type(of: error)): \(error)")
    } else {
      Issue.record("the cancelled call returned")
    }
    await store.close()
  }
}
