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
@Suite("PostgreSQL: a server that freezes whole", .serialized, .timeLimit(.minutes(3)))
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
}
