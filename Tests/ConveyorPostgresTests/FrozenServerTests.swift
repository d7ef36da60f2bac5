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

/// A server that freezes whole (a paused virtual machine, a host whose packets are dropped): its
/// postmaster accepts no cancel request either.
@Suite("PostgreSQL: a server that freezes whole", .serialized, .timeLimit(.minutes(10)))
struct FrozenServerTests {
  /// Cancelling a call to a frozen server ends it: the cancel request, which waits for the
  /// postmaster's answer, is sent on a thread of its own, and the call's socket is shut down
  /// two seconds later whatever became of it. Before the fix `PQcancel` ran in `Task.cancel()`
  /// itself, under the call's lock: the canceller blocked until the server came back, and the
  /// shutdown (and `callTimeout`'s, which takes the same lock) never ran.
  @Test func cancellingACallToAFrozenServerEndsIt() async throws {
    let server = try await PostgresServer.start()
    defer { server.stop() }
    let connection = SerializedConnection(
      label: "FrozenServerTests", conninfo: server.url, scrubber: Scrubber(secrets: []),
      reconnectTimeout: .seconds(1)
    ) { _ in }
    try await connection.connect()
    let finished = Atomic<Bool>(false)
    let call = Task {
      defer { finished.store(true, ordering: .releasing) }
      try await connection.perform(idempotent: true, retrying: false) {
        _ = try $0.execute("SELECT pg_sleep(60)")
      }
    }
    try await Task.sleep(for: .milliseconds(300))  // the sleep is running
    let frozen = try server.freeze()
    defer { frozen.thaw() }
    #expect(frozen.pids.count >= 2, "the postmaster and the connection's backend: \(frozen.pids)")
    // Cancelled from a thread of its own: before the fix, cancelling blocked the canceller in
    // `PQcancel` until the server came back (here, the test's own task).
    Thread { call.cancel() }.start()
    let ended = await eventually(timeout: .seconds(30)) { finished.load(ordering: .acquiring) }
    #expect(ended, "the cancelled call to the frozen server had not ended after 30 s")
    frozen.thaw()
    _ = await call.result
    await connection.close()
  }

  /// How a connection is made, from its options as libpq resolved them (the conninfo, a service
  /// file, the environment): one host without blocking, with its `connect_timeout` as libpq
  /// reads it; several hosts, or a value libpq refuses, through libpq's own connect.
  @Test func theConnectPlanReadsConnectTimeoutAndHostsAsLibpqDoes() {
    let one = ["host": "127.0.0.1", "port": "5432"]
    #expect(Connection.plan(one) == (false, 30))
    #expect(Connection.plan(one.merging(["connect_timeout": "7"]) { $1 }) == (false, 7))
    #expect(Connection.plan(one.merging(["connect_timeout": " +9 "]) { $1 }) == (false, 9))
    #expect(Connection.plan(one.merging(["connect_timeout": "1"]) { $1 }) == (false, 2))
    #expect(Connection.plan(one.merging(["connect_timeout": "0"]) { $1 }) == (false, 30))
    #expect(Connection.plan(one.merging(["connect_timeout": "-3"]) { $1 }) == (false, 30))
    #expect(Connection.plan(one.merging(["connect_timeout": "5s"]) { $1 }).blocking)
    #expect(Connection.plan(one.merging(["connect_timeout": ""]) { $1 }).blocking)
    #expect(Connection.plan(["host": "a,b", "port": "1,2"]).blocking)
    #expect(Connection.plan(["hostaddr": "127.0.0.1,127.0.0.2"]).blocking)
  }

  /// Opening a store on a frozen server gives up after the URL's `connect_timeout`, with an
  /// error that says so. Before, the connection was made with `PQconnectdb`, whose timeout the
  /// store now applies itself (its connect no longer blocks, so that cancellation reaches it).
  @Test func openingAStoreOnAFrozenServerGivesUpAfterConnectTimeout() async throws {
    let server = try await PostgresServer.start()
    defer { server.stop() }
    let frozen = try server.freeze()
    defer { frozen.thaw() }
    let outcome = Mutex<Result<PostgresJobStore, any Error>?>(nil)
    let opening = Task {
      let result: Result<PostgresJobStore, any Error>
      do {
        result = .success(try await PostgresJobStore.open(url: server.url + "?connect_timeout=2"))
      } catch {
        result = .failure(error)
      }
      outcome.withLock { $0 = result }
    }
    let ended = await eventually(timeout: .seconds(30)) { outcome.withLock { $0 != nil } }
    frozen.thaw()
    #expect(ended, "opening a store on a frozen server had not ended after 30 s (connect_timeout=2)")
    await opening.value
    guard case .failure(let error as PostgresError) = outcome.withLock({ $0 }) else {
      Issue.record("expected a PostgresError, got \(String(describing: outcome.withLock { $0 }))")
      return
    }
    #expect(error.code == .connectionFailed)
    #expect(
      error.message.contains("within 2.0 s") && error.message.contains("connect_timeout"), "\(error.message)")
  }

  /// A job added while the store's listener is still connecting starts at once when it is up,
  /// not at the next poll. The listener connects with the first wait for work, that is when a
  /// queue starts; a notification sent before its `LISTEN` is lost. Before the fix, only a
  /// *re*connect woke the waiters, so an idle queue whose first claim found nothing slept out its
  /// poll interval (here ten minutes). Freezing only the postmaster holds the listener's connect
  /// while the store's own connection and the producer's, already made, go on working.
  @Test func aJobAddedWhileTheListenerConnectsStartsWhenItIsUp() async throws {
    let server = try await PostgresServer.start()
    defer { server.stop() }
    let store = try await PostgresJobStore.open(url: server.url)
    let producer = try await PostgresJobStore.open(url: server.url)
    // Each store connects with its first call: both connect before the freeze.
    _ = try await store.queueNames()
    _ = try await producer.queueNames()
    let postmaster = try server.freezePostmaster()
    defer { postmaster.thaw() }
    struct Item: Queueable { var number: Int }
    let (stream, continuation) = AsyncStream.makeStream(of: Int.self)
    let configuration = JobQueueConfiguration(identifier: "early", pollInterval: .seconds(600))
    let queue = try JobQueue<Item>(configuration: configuration, store: store) { item, _ in
      continuation.yield(item.number)
      return .handled
    }
    // The loop's first claim finds nothing while the listener waits for the frozen postmaster.
    try await Task.sleep(for: .seconds(1))
    _ = try await producer.enqueue(
      [NewJob(payload: try JSONEncoder().encode(Item(number: 7)))], queue: "early", clock: SystemJobClock())
    try await Task.sleep(for: .milliseconds(300))
    postmaster.thaw()
    let started = Atomic<Bool>(false)
    let reader = Task {
      var iterator = stream.makeAsyncIterator()
      if await iterator.next() == 7 { started.store(true, ordering: .releasing) }
    }
    let ran = await eventually(timeout: .seconds(60)) { started.load(ordering: .acquiring) }
    #expect(ran, "the job added before the listener was up had not started after 60 s (poll: 600 s)")
    reader.cancel()
    continuation.finish()
    await queue.shutdown(gracePeriod: .seconds(5))
    await store.close()
    await producer.close()
  }

  // MARK: Reconnecting to a frozen server

  // Reconnecting to a server that froze whole.
  //
  // When a call's connection breaks, `SerializedConnection.run` opens a new one with
  // `Connection(conninfo:)`, i.e. a blocking `PQconnectdb` on the store's thread. Against a server
  // that froze whole (its kernel still accepts the TCP connection into the listen backlog, the
  // postmaster never answers the startup packet) and a URL without `connect_timeout`, `PQconnectdb`
  // waits without bound. Nothing ends it:
  // - `callTimeout` only watches `body(connection)`: `watch(operation)` is called after
  //   `connected()` returns;
  // - `reconnectTimeout`'s deadline is only looked at after the connect has thrown;
  // - cancelling sends `PQcancel` / shuts down the socket of `cancelHandle`, which `drop()` set to
  //   nil before connecting: there is no handle, so both do nothing.
  // The store's thread stays stuck, so every later call and `close()` wait behind it too.

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

  // MARK: A server that stops answering

  // Failed before the fix: a server that stops answering (a network cut without a reset, simulated by SIGSTOP on
  // the store's backend) hangs every call forever: no keepalive, `tcp_user_timeout` or statement
  // timeout is set (Connection.init / SerializedConnection.connected), so the reconnect with
  // backoff promised for "a network cut" never starts; and cancelling the calling task does not
  // end the call either, because `perform` only resumes its continuation when the blocked
  // `PQexecParams` returns (SerializedConnection.perform), which PQcancel cannot make happen.
  @Test func aCallToAServerThatStopsAnsweringEndsAndCancellationEndsIt() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("hang")
    let store = try await openNamedStore(
      server, .init(schema: schema, reconnectTimeout: .seconds(3), callTimeout: .seconds(5)))
    _ = try await store.counts(queue: "h", clock: SystemJobClock())
    let admin = try AdminConnection(server.url)
    // The opening's own connection (its migrations) is closed, but its backend may take a moment
    // to leave pg_stat_activity: wait (a minute at most) until only the store's is there.
    let query =
      "SELECT pid FROM pg_stat_activity WHERE application_name = '\(schema)' AND backend_type = 'client backend'"
    var pids = try admin.query(query)
    let deadline = ContinuousClock.now + .seconds(60)
    while pids.count > 1 && ContinuousClock.now < deadline {
      try await Task.sleep(for: .milliseconds(20))
      pids = try admin.query(query)
    }
    #expect(pids.count == 1, "one store connection: \(pids)")
    guard let text = pids.first?.first ?? nil, let pid = Int32(text) else { return }
    kill(pid, SIGSTOP)
    defer { kill(pid, SIGCONT) }

    let finished = Flag()
    let call = Task {
      defer { finished.set() }
      _ = try await store.counts(queue: "h", clock: SystemJobClock())
    }
    let endedOnItsOwn = await becomes(finished, within: 15)
    #expect(endedOnItsOwn, "a call to an unresponsive server fails (or reconnects) instead of hanging")
    call.cancel()
    let endedWhenCancelled = await becomes(finished, within: 5)
    #expect(endedWhenCancelled, "cancelling the calling task ends the call")
    kill(pid, SIGCONT)
    _ = await call.result
    await store.close()
  }

  /// A call that is reconnecting to a stopped server ends promptly when its task is cancelled.
  @Test func cancellingACallThatIsReconnectingEndsIt() async throws {
    let server = try await PostgresServer.start()
    defer { server.stop() }
    let store = try await PostgresJobStore.open(
      url: server.url, options: .init(schema: uniqueSchema("rc"), reconnectTimeout: .seconds(120)))
    _ = try await store.counts(queue: "r", clock: SystemJobClock())
    try server.control(["stop", "-m", "immediate", "-w"])
    let finished = Flag()
    let call = Task {
      defer { finished.set() }
      _ = try await store.counts(queue: "r", clock: SystemJobClock())
    }
    try await Task.sleep(for: .seconds(2))
    #expect(!finished.isSet, "still reconnecting")
    call.cancel()
    #expect(await becomes(finished, within: 3), "cancellation ends the reconnect")
    let result = await call.result
    #expect(throws: (any Error).self) { try result.get() }
    await store.close()
  }
}
