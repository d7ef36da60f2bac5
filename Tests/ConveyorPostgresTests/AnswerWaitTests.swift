import Conveyor
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import ConveyorPostgres

/// A lone caller waits briefly on its own thread for its answer (`answerWait`) instead of
/// suspending at once; libpq still runs on the store's thread, and a caller never waits while
/// another call is in flight or when its connection's last call took longer than the wait.
///
/// Each test gives its connections a count of calls in flight of their own, so that the other
/// suites' calls (which run in the same process) do not decide whether these callers wait.
@Suite("PostgreSQL callers waiting briefly for their answer")
struct AnswerWaitTests {
  static func connection(
    _ server: PostgresServer, answerWait: Duration, calls: SerializedConnection.CallsInFlight
  ) -> SerializedConnection {
    SerializedConnection(
      label: "AnswerWaitTests", conninfo: server.url, scrubber: Scrubber(secrets: []),
      reconnectTimeout: .seconds(10), answerWait: answerWait, callsInFlight: calls
    ) { _ in }
  }

  static func selectOne(_ connection: SerializedConnection) async throws -> Int64 {
    try await connection.perform(idempotent: true) { try $0.execute("SELECT 1::int8").int64(0, 0) }
  }

  @Test func aLoneCallerTakesItsAnswersWithoutSuspending() async throws {
    let server = try await PostgresServer.shared()
    let waiting = Self.connection(server, answerWait: .milliseconds(5), calls: .init())
    let suspending = Self.connection(server, answerWait: .zero, calls: .init())
    // A round trip to a local server takes well under 5 ms: most answers come while waiting, but
    // on a loaded machine a call can outlast the wait, and the call after it does not wait. So
    // the calls go on until 10 were taken without suspending, for up to 3,000 calls.
    // (Before the change every caller suspended: none did.)
    func answered() -> Int {
      waiting.answeredWhileWaiting.load(ordering: .relaxed) + waiting.answeredAtOnce.load(ordering: .relaxed)
    }
    var calls = 0
    while calls < 3_000 && answered() < 10 {
      calls += 1
      #expect(try await Self.selectOne(waiting) == 1)
      #expect(try await Self.selectOne(suspending) == 1)
    }
    #expect(answered() >= 10, "\(answered()) of \(calls) answers taken while waiting")
    #expect(suspending.answeredWhileWaiting.load(ordering: .relaxed) == 0, "a zero wait never waits")
    #expect(suspending.answeredAtOnce.load(ordering: .relaxed) == 0, "a zero wait never looks")
    await waiting.close()
    await suspending.close()
  }

  @Test func noCallerWaitsWhileAnotherCallIsInFlight() async throws {
    let server = try await PostgresServer.shared()
    // An overlap keeps callers from waiting for 500 ms, far longer than a loaded machine
    // deschedules a thread.
    let calls = SerializedConnection.CallsInFlight(busyFor: .milliseconds(500))
    let slow = Self.connection(server, answerWait: .milliseconds(5), calls: calls)
    let quick = Self.connection(server, answerWait: .milliseconds(5), calls: calls)
    // A call that lasts until it is cancelled.
    let sleeping = Task {
      try await slow.perform(idempotent: true) { _ = try $0.execute("SELECT pg_sleep(60)") }
    }
    while calls.count.load(ordering: .relaxed) == 0 { try await Task.sleep(for: .milliseconds(1)) }
    for _ in 0..<20 { #expect(try await Self.selectOne(quick) == 1) }
    // The sleep was in flight for each of them: none waited. (A caller descheduled after it
    // submitted its call may find its answer there and take it, without waiting: answeredAtOnce.)
    #expect(calls.count.load(ordering: .relaxed) == 1, "the sleep outlasts the quick calls")
    #expect(quick.answeredWhileWaiting.load(ordering: .relaxed) == 0)
    sleeping.cancel()
    await #expect(throws: CancellationError.self) { try await sleeping.value }
    #expect(calls.count.load(ordering: .relaxed) == 0)
    // Alone again, once the overlap is 500 ms old, the quick caller waits.
    try await Task.sleep(for: .milliseconds(600))
    for _ in 0..<3_000 where quick.answeredWhileWaiting.load(ordering: .relaxed) == 0 {
      #expect(try await Self.selectOne(quick) == 1)
    }
    #expect(quick.answeredWhileWaiting.load(ordering: .relaxed) > 0)
    await slow.close()
    await quick.close()
  }

  /// A caller descheduled after it submitted its call (a loaded machine) may find its answer
  /// there when it first looks. It takes it at once, even while another call is in flight: that
  /// costs nothing, and parking would only resume it at once through the executor. Only an answer
  /// it had to wait for counts as waited. (Before, it parked: a suspension for nothing; and had the
  /// overlap aged past `busyFor` meanwhile, it counted as waited while another call was in flight,
  /// which failed `noCallerWaitsWhileAnotherCallIsInFlight` in a loaded CI run.)
  @Test func anAnswerAlreadyThereIsTakenAtOnceWithoutWaiting() throws {
    let calls = SerializedConnection.CallsInFlight(busyFor: .seconds(60))
    calls.begin()  // another call in flight
    let handoff = SerializedConnection.Handoff<Int>(calls)
    handoff.deliver(.success(7))
    #expect(!calls.isQuiet)
    let (answer, spent, waited) = handoff.waitBriefly(nanoseconds: 1_000_000)
    #expect(try answer?.get() == 7)
    #expect(spent == 0)
    #expect(!waited)
    // Still pending: a call in flight beside it keeps it from waiting.
    let pending = SerializedConnection.Handoff<Int>(calls)
    let (none, _, waitedForNone) = pending.waitBriefly(nanoseconds: 1_000_000)
    #expect(none == nil)
    #expect(!waitedForNone)
    pending.deliver(.success(8))
    calls.end()
  }

  /// Workers that take turns come and go between each other's calls: after calls overlap, no
  /// caller waits for a while, even alone.
  @Test func afterCallsOverlapNoCallerWaitsForAWhile() async throws {
    let server = try await PostgresServer.shared()
    // An hour: the loop below may take minutes on a loaded machine, and `calls` must stay busy
    // through it.
    let calls = SerializedConnection.CallsInFlight(busyFor: .seconds(3_600))
    let quiet = SerializedConnection.CallsInFlight(busyFor: .seconds(60))
    #expect(calls.isQuiet && quiet.isQuiet)
    calls.begin()
    calls.begin()  // two calls overlap
    calls.end()
    calls.end()
    #expect(calls.count.load(ordering: .relaxed) == 0)
    #expect(!calls.isQuiet, "an overlap keeps callers from waiting for busyFor")
    let connection = Self.connection(server, answerWait: .milliseconds(5), calls: calls)
    let alone = Self.connection(server, answerWait: .milliseconds(5), calls: quiet)
    for _ in 0..<50 {
      #expect(try await Self.selectOne(connection) == 1)
      #expect(try await Self.selectOne(alone) == 1)
    }
    // On a loaded machine the alone's calls can outlast its wait: up to 3,000 more until one
    // was waited for.
    for _ in 0..<3_000 where alone.answeredWhileWaiting.load(ordering: .relaxed) == 0 {
      #expect(try await Self.selectOne(alone) == 1)
    }
    #expect(connection.answeredWhileWaiting.load(ordering: .relaxed) == 0)
    #expect(alone.answeredWhileWaiting.load(ordering: .relaxed) > 0, "the same calls, never overlapped, wait")
    await connection.close()
    await alone.close()
  }

  @Test func aConnectionWhoseLastCallOutlastedTheWaitIsNotWaitedFor() async throws {
    let server = try await PostgresServer.shared()
    let connection = Self.connection(server, answerWait: .milliseconds(5), calls: .init())
    try await connection.perform(idempotent: true) { _ = try $0.execute("SELECT pg_sleep(0.05)") }
    let before = connection.answeredWhileWaiting.load(ordering: .relaxed)
    #expect(try await Self.selectOne(connection) == 1)
    #expect(
      connection.answeredWhileWaiting.load(ordering: .relaxed) == before,
      "the call after a 50 ms one suspends at once")
    await connection.close()
  }

  /// A loop of calls answered while waiting never suspends: it lets the other tasks of its
  /// thread run now and then. Here the loop and a second task share a one-thread executor; the
  /// second task runs before the loop ends.
  @Test func aLoopOfWaitedCallsLetsOtherTasksOfItsThreadRun() async throws {
    let server = try await PostgresServer.shared()
    let connection = Self.connection(server, answerWait: .milliseconds(5), calls: .init())
    let executor = OneThreadExecutor()
    _ = try await Self.selectOne(connection)  // connects: that call outlasts the wait
    let counts = Counts()
    try await withTaskExecutorPreference(executor) { () async throws(any Error) -> Void in
      for call in 0..<300 {
        let one = try await Self.selectOne(connection)
        counts.calls.withLock { $0 += one == 1 ? 1 : 1_000 }
        if call == 0 {
          Task(executorPreference: executor) {
            counts.ranAfter.withLock { $0 = counts.calls.withLock { $0 } }
          }
        }
      }
    }
    let after = try #require(
      counts.ranAfter.withLock { $0 }, "the other task had not run when the loop ended")
    #expect(after < 300, "it ran after \(after) calls")  // without the yield: after all 300
    #expect(counts.calls.withLock { $0 } == 300, "every call answered 1")
    await connection.close()
  }

  /// A caller that waits for its answer still ends at once when its task is cancelled.
  @Test func aWaitingCallerIsCancelled() async throws {
    let server = try await PostgresServer.shared()
    let connection = Self.connection(server, answerWait: .milliseconds(5), calls: .init())
    #expect(try await Self.selectOne(connection) == 1)
    let started = ContinuousClock.now
    let sleeping = Task {
      try await connection.perform(idempotent: true) { _ = try $0.execute("SELECT pg_sleep(30)") }
    }
    try await Task.sleep(for: .milliseconds(100))
    sleeping.cancel()
    await #expect(throws: CancellationError.self) { try await sleeping.value }
    #expect(ContinuousClock.now - started < .seconds(20), "the server's sleep was cancelled")
    #expect(try await Self.selectOne(connection) == 1, "the connection is usable after")
    await connection.close()
  }
}

/// Calls made, and how many had been made when the other task ran.
private final class Counts: Sendable {
  let calls = Mutex(0)
  let ranAfter = Mutex<Int?>(nil)
}
