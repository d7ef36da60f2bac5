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

/// A TCP proxy in front of the server that can make the listener's connection go silent: it can
/// swallow the next `LISTEN` (and everything after it on that connection, as a server that stopped
/// answering), or cut the listener's connections on the server side while keeping the client
/// side open and silent (a server that died or failed over, whose FIN/RST never reached us).
final class ListenerProxy: Sendable {
  private struct Link {
    var client: Int32
    var server: Int32
    var isListener = false
    var answered = false
    var swallowing = false
    var cut = false
    var clientClosed = false
  }

  private struct State {
    var links: [Link] = []
    var swallowNextListen = false
    var swallowedListens = 0
    var closed = false
  }

  let port: Int
  private let target: Int
  private let listener: Int32
  private let state = Mutex(State())

  var url: String { "postgresql://postgres@127.0.0.1:\(port)/postgres" }

  init(target: Int) throws {
    self.target = target
    (listener, port) = try PostgresServer.loopbackSocket(listening: true)
    let thread = Thread { [self] in acceptLoop() }
    thread.name = "ListenerProxy.accept"
    thread.start()
  }

  func swallowNextListen() { state.withLock { $0.swallowNextListen = true } }
  var swallowedListens: Int { state.withLock { $0.swallowedListens } }
  /// Listener connections (ones that sent `LISTEN`) whose client has not closed its socket.
  var openListenerClients: Int {
    state.withLock { $0.links.filter { $0.isListener && !$0.clientClosed }.count }
  }
  /// Whether a listener connection got the server's answer to its `LISTEN`.
  var listenerAnswered: Bool {
    state.withLock { $0.links.contains { $0.isListener && $0.answered && !$0.cut } }
  }

  /// Closes the server side of every listener connection; the client side stays open, silent.
  func cutListeners() {
    let servers = state.withLock { state -> [Int32] in
      var servers: [Int32] = []
      for index in state.links.indices where state.links[index].isListener && !state.links[index].cut {
        state.links[index].cut = true
        servers.append(state.links[index].server)
      }
      return servers
    }
    for server in servers { shutdown(server, Int32(SHUT_RDWR)) }
  }

  func close() {
    let sockets = state.withLock { state -> [Int32] in
      state.closed = true
      return state.links.flatMap { [$0.client, $0.server] }
    }
    shutdown(listener, Int32(SHUT_RDWR))
    for socket in sockets { shutdown(socket, Int32(SHUT_RDWR)) }
  }

  private func acceptLoop() {
    PostgresServer.acceptProxied(on: listener, to: target) { client, server in
      let index = state.withLock { state -> Int? in
        if state.closed { return nil }
        state.links.append(Link(client: client, server: server))
        return state.links.count - 1
      }
      guard let index else {
        shutdown(client, Int32(SHUT_RDWR))
        shutdown(server, Int32(SHUT_RDWR))
        return false
      }
      Thread { [self] in clientToServer(index) }.start()
      Thread { [self] in serverToClient(index) }.start()
      return true
    }
  }

  private func clientToServer(_ index: Int) {
    let (client, server) = state.withLock { ($0.links[index].client, $0.links[index].server) }
    var buffer = [UInt8](repeating: 0, count: 65_536)
    while true {
      let count = buffer.withUnsafeMutableBytes { recv(client, $0.baseAddress!, $0.count, 0) }
      if count < 0 && errno == EINTR { continue }
      if count <= 0 {
        let cut = state.withLock { state -> Bool in
          state.links[index].clientClosed = true
          return state.links[index].cut
        }
        if !cut { shutdown(server, Int32(SHUT_WR)) }
        return
      }
      let chunk = Array(buffer[0..<count])
      let isListen = String(decoding: chunk, as: UTF8.self).contains("LISTEN")
      let forward = state.withLock { state -> Bool in
        if isListen {
          state.links[index].isListener = true
          if state.swallowNextListen {
            state.swallowNextListen = false
            state.swallowedListens += 1
            state.links[index].swallowing = true
          }
        }
        return !state.links[index].cut && !state.links[index].swallowing
      }
      if forward { _ = chunk.withUnsafeBytes { PostgresServer.sendAll(server, $0) } }
    }
  }

  private func serverToClient(_ index: Int) {
    let (client, server) = state.withLock { ($0.links[index].client, $0.links[index].server) }
    var buffer = [UInt8](repeating: 0, count: 65_536)
    while true {
      let count = buffer.withUnsafeMutableBytes { recv(server, $0.baseAddress!, $0.count, 0) }
      if count < 0 && errno == EINTR { continue }
      let cut = state.withLock { state -> Bool in
        if count > 0 && state.links[index].isListener { state.links[index].answered = true }
        return state.links[index].cut
      }
      if cut { return }  // the client hears nothing, not even the close
      if count <= 0 {
        shutdown(client, Int32(SHUT_WR))
        return
      }
      _ = buffer.withUnsafeBytes {
        PostgresServer.sendAll(client, UnsafeRawBufferPointer(rebasing: $0[0..<count]))
      }
    }
  }
}

/// The store's listener (one connection per store that `LISTEN`s for its queues): it must end
/// when the store closes, retry a `LISTEN` that got no answer, reconnect when its connection
/// silently died or the server ends idle sessions, and wake the first wait for a new queue.
@Suite("PostgreSQL: the listener", .serialized, .timeLimit(.minutes(10)))
struct ListenerTests {
  struct Item: Queueable { var number: Int }

  func enqueue(_ number: Int, on store: PostgresJobStore, queue: String) async throws {
    _ = try await store.enqueue(
      [NewJob(payload: try JSONEncoder().encode(Item(number: number)))], queue: queue, clock: SystemJobClock()
    )
  }

  /// An idle queue polling only every 10 minutes: within the bounds below only a notification (or
  /// a listener's `LISTEN`, which wakes every waiter) can start its job.
  final class Handled: Sendable {
    let items = Mutex<[Int]>([])
    func withLock<R>(_ body: (inout [Int]) -> R) -> R { items.withLock { body(&$0) } }
  }

  /// A store reached through `proxy`, whose listener gives up a statement unanswered after its
  /// `callTimeout` (5 s), and another store on the same schema, reached directly.
  func storesBehind(_ proxy: ListenerProxy, server: PostgresServer, schema: String) async throws -> (
    PostgresJobStore, other: PostgresJobStore
  ) {
    let store = try await PostgresJobStore.open(
      url: proxy.url, options: .init(schema: schema, callTimeout: .seconds(5)))
    let other = try await PostgresJobStore.open(url: server.url, options: .init(schema: schema))
    return (store, other)
  }

  func close(_ stores: PostgresJobStore...) async {
    for store in stores { await store.close() }
  }

  func idleQueue(on store: PostgresJobStore, queue: String) throws -> (JobQueue<Item>, Handled) {
    let handled = Handled()
    let configuration = JobQueueConfiguration(identifier: queue, pollInterval: .seconds(600))
    let jobQueue = try JobQueue<Item>(configuration: configuration, store: store) { [handled] item, _ in
      handled.withLock { $0.append(item.number) }
      return .handled
    }
    return (jobQueue, handled)
  }

  /// `stop()` promises to end the thread within a quarter second. A listener whose `LISTEN` got
  /// no answer (the server stopped answering right after the connection was made) sat in a
  /// blocking `PQexec` that neither `stop()` nor any timeout reached: closing the store left the
  /// thread and its connection open for good. Now `LISTEN` is sent without blocking, and the wait
  /// for its answer notices `stop()`.
  @Test func closingTheStoreEndsAListenerWhoseListenGetsNoAnswer() async throws {
    let server = try await PostgresServer.shared()
    let proxy = try ListenerProxy(target: server.port)
    defer { proxy.close() }
    proxy.swallowNextListen()
    let store = try await PostgresJobStore.open(
      url: proxy.url, options: .init(schema: uniqueSchema("rlstop")))
    let waiter = Task { await store.waitForWork(queue: "q", timeout: .seconds(600)) }
    #expect(
      await eventually(timeout: .seconds(30)) { proxy.swallowedListens == 1 }, "the listener sent LISTEN")
    await store.close()
    #expect(await waiter.value == false)
    let ended = await eventually(timeout: .seconds(30)) { proxy.openListenerClients == 0 }
    #expect(
      ended, "30 s after close() the listener's connection was still open (its thread blocked in LISTEN)")
  }

  /// A `LISTEN` that gets no answer was never given up: the listener never reconnected, so every
  /// later notification was lost and an idle queue waited out its whole poll interval. Now it is
  /// given up after `callTimeout`, and the next `LISTEN` wakes the queue.
  @Test func aListenThatGetsNoAnswerIsRetried() async throws {
    let server = try await PostgresServer.shared()
    let proxy = try ListenerProxy(target: server.port)
    defer { proxy.close() }
    proxy.swallowNextListen()
    let (store, other) = try await storesBehind(proxy, server: server, schema: uniqueSchema("rlhang"))
    let (jobQueue, handled) = try idleQueue(on: store, queue: "q")
    #expect(
      await eventually(timeout: .seconds(30)) { proxy.swallowedListens == 1 }, "the listener sent LISTEN")
    try await Task.sleep(for: .milliseconds(500))  // the loop found nothing and waits
    try await enqueue(1, on: other, queue: "q")
    let started = await eventually(timeout: .seconds(90)) { handled.withLock { $0 == [1] } }
    #expect(started, "90 s on, the idle queue (polling every 10 min) had not started the job")
    await jobQueue.shutdown(gracePeriod: .seconds(2))
    proxy.close()
    await close(store, other)
  }

  /// A listener whose connection died without a word reaching it (the server crashed or failed
  /// over, and its FIN/RST was lost) never noticed: it only read, so it waited on a dead socket
  /// for good (or for TCP keepalive's two hours) and every notification was lost. Now it sends
  /// `SELECT 1` after 10 s of silence and gives the connection up when no answer comes within
  /// `callTimeout`.
  @Test func aListenerWhoseConnectionSilentlyDiedReconnects() async throws {
    let server = try await PostgresServer.shared()
    let proxy = try ListenerProxy(target: server.port)
    defer { proxy.close() }
    let (store, other) = try await storesBehind(proxy, server: server, schema: uniqueSchema("rlcut"))
    let (jobQueue, handled) = try idleQueue(on: store, queue: "q")
    #expect(await eventually(timeout: .seconds(30)) { proxy.listenerAnswered }, "the listener is up")
    try await Task.sleep(for: .milliseconds(500))
    try await enqueue(1, on: other, queue: "q")
    #expect(await eventually(timeout: .seconds(30)) { handled.withLock { $0 == [1] } }, "the listener works")
    try await Task.sleep(for: .seconds(1))  // job 1 settled; the queue is idle again
    proxy.cutListeners()
    try await enqueue(2, on: other, queue: "q")
    let started = await eventually(timeout: .seconds(90)) { handled.withLock { $0 == [1, 2] } }
    #expect(started, "90 s on, the idle queue (polling every 10 min) had not started the job")
    await jobQueue.shutdown(gracePeriod: .seconds(2))
    proxy.close()
    await close(store, other)
  }

  /// Once the store is closed, `waitForWork` returned false at once whatever its timeout (the
  /// continuation was resumed inside `withCheckedContinuation`, so the task did not even
  /// suspend), and a queue's watcher calls it again at once: a queue still running on a closed
  /// store (being shut down with a grace period, say) held a thread of the cooperative pool in a
  /// busy loop until it stopped, and as many such queues as cores hung the process. Now a wait on
  /// a closed store lasts its timeout, as the default `waitForWork` does: 100 ms waits for a
  /// second are at most eleven calls, where the busy loop made millions.
  @Test func aWaitOnAClosedStoreLastsItsTimeout() async throws {
    let server = try await PostgresServer.shared()
    let store = try await PostgresJobStore.open(
      url: server.url, options: .init(schema: uniqueSchema("rlspin")))
    _ = await store.waitForWork(queue: "q", timeout: .milliseconds(100))  // the listener runs
    await store.close()
    let end = ContinuousClock.now + .seconds(1)
    var calls = 0
    while ContinuousClock.now < end {
      _ = await store.waitForWork(queue: "q", timeout: .milliseconds(100))
      calls += 1
    }
    #expect(calls <= 11, "\(calls) waits of 100 ms returned within one second on a closed store")
  }

  /// The first wait for a queue the store's listener never watched returns at once: a queue that
  /// starts on a store whose listener already runs (another queue started it) looks at the store,
  /// then waits; a notification for it between the two was not kept (nobody watched the name),
  /// and the queue slept out its poll interval.
  @Test func theFirstWaitForANewQueueOfARunningListenerReturnsAtOnce() async throws {
    let server = try await PostgresServer.shared()
    let store = try await PostgresJobStore.open(
      url: server.url, options: .init(schema: uniqueSchema("rlnew")))
    // The listener runs, for queue "a".
    #expect(await store.waitForWork(queue: "a", timeout: .seconds(30)), "the first LISTEN wakes the waiter")
    let woken = await store.waitForWork(queue: "b", timeout: .seconds(30))
    #expect(woken, "the first wait for queue b waited out its 30 s")
    #expect(await store.waitForWork(queue: "b", timeout: .milliseconds(300)) == false, "only the first")
    await store.close()
  }

  /// Control for the proxy: without swallowing, close() does close the listener's connection.
  @Test func controlClosingTheStoreClosesAnAnsweredListener() async throws {
    let server = try await PostgresServer.shared()
    let proxy = try ListenerProxy(target: server.port)
    defer { proxy.close() }
    let store = try await PostgresJobStore.open(url: proxy.url, options: .init(schema: uniqueSchema("rlctl")))
    let waiter = Task { await store.waitForWork(queue: "q", timeout: .seconds(600)) }
    #expect(await eventually(timeout: .seconds(30)) { proxy.listenerAnswered })
    #expect(await waiter.value == true)  // the first LISTEN wakes every waiter
    await store.close()
    #expect(await eventually(timeout: .seconds(30)) { proxy.openListenerClients == 0 })
  }

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

  /// idle_session_timeout (which the store's own connection copes with: IdleConnectionTests) shorter
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
      "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE '%LISTEN \"\(schema).jobs\"%' "
        + "AND pid <> pg_backend_pid()")
    #expect(await waiter.value, "the reconnect's LISTEN woke the waiter")
    await store.close()
  }
}
