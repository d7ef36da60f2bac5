import Conveyor
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

// Behaviour tests for the queue engine (issue 7), on the in-memory store, through the public API.
// Each one failed on the engine before the rewrite (commit 496693a). None asserts on elapsed time:
// they count store calls, or wait for conditions with timeouts the old engine blew through.

/// The item these tests enqueue.
struct EngineItem: Queueable, Hashable {
  var number: Int
  var text = ""
}

/// A delegate that handles every job; tests release it to see what the queue does without one.
final class ForgettableDelegate: JobQueueDelegate {
  let handled = Log<Int>()

  func queue(
    _ queue: JobQueue<EngineItem>, handle item: EngineItem, attempts: Int,
    completion: @escaping @Sendable (JobResult) -> Void
  ) {
    handled.append(item.number)
    completion(.handled)
  }
}

/// A settable flag.
final class Flag: Sendable {
  private let state = Mutex(false)
  init() {}
  func set() { state.withLock { $0 = true } }
  var isSet: Bool { state.withLock { $0 } }
}

/// A started queue of `EngineItem`s whose one job runs until `gate` opens: its lease keeper
/// heartbeats that job meanwhile.
func queueHoldingAJob(_ configuration: JobQueueConfiguration, store: any JobStore, until gate: Gate)
  async throws -> JobQueue<EngineItem>
{
  let started = Flag()
  let queue = try JobQueue<EngineItem>(configuration: configuration, store: store) { _, _ in
    started.set()
    await gate.wait()
    return .handled
  }
  try await queue.add(EngineItem(number: 1))
  try await eventually("the job started") { started.isSet }
  return queue
}

@Suite("Queue engine")
struct QueueEngineTests {
  static let queueName = "engine"

  func configuration(
    concurrency: Int = 1, autoStart: Bool = true, lease: Duration = .seconds(60),
    poll: Duration = .milliseconds(100), clock: any JobClock = SystemJobClock(),
    retry: RetryPolicy = .fixed(.seconds(15)), maxAttempts: Int? = nil,
    log: (@Sendable (LogRecord) -> Void)? = nil
  ) -> JobQueueConfiguration {
    JobQueueConfiguration(
      identifier: Self.queueName, retryPolicy: retry, maxAttempts: maxAttempts, concurrency: concurrency,
      autoStart: autoStart, leaseDuration: lease, pollInterval: poll, clock: clock, log: log)
  }

  func encoded(_ number: Int) throws -> Data { try JSONEncoder().encode(EngineItem(number: number)) }

  // MARK: Nothing spins

  // Failed before the fix: a store that judges leases by its own clock (PostgreSQL: the
  // database's) can report a running job's lease expiry as past by the worker's clock while its
  // rescue, by its own clock, takes nothing. The loop dropped that expiry so as not to spin, and
  // with nothing waiting the queue looked finished while the job still ran: `waitUntilFinished`
  // returned early (seen once in a PostgreSQL run across a server restart).
  @Test("a lease that looks expired but is not rescued keeps the queue unfinished, without spinning")
  func unrescuedPastLeaseKeepsTheQueueUnfinished() async throws {
    let base = InMemoryJobStore()
    let gate = Gate()
    let started = Flag()
    // `holder` runs the job; `watcher`, another worker on the same store, sees its lease through
    // a store whose clock is an hour behind the worker's.
    let holder = try JobQueue<EngineItem>(configuration: configuration(poll: .milliseconds(100)), store: base)
    {
      _, _ in
      started.set()
      await gate.wait()
      return .handled
    }
    try await holder.add(EngineItem(number: 1))
    try await eventually("the job starts") { started.isSet }
    let store = InstrumentedJobStore(base)
    store.skewLeaseExpiries(by: -3600)
    let watcher = try JobQueue<EngineItem>(
      configuration: configuration(poll: .milliseconds(100)), store: store
    ) {
      _, _ in
      Issue.record("the watcher must not get the holder's running job")
      return .handled
    }
    let finished = Flag()
    let waiter = Task {
      await watcher.waitUntilFinished()
      finished.set()
    }
    // The watcher looks at the store again and again while the job runs, without spinning.
    try await eventually("the watcher tries to rescue the lease three times") {
      store.calls["rescue", default: 0] >= 3
    }
    #expect(!finished.isSet, "waitUntilFinished returned while another worker's job was still running")
    let callsBefore = store.totalCalls
    try await Task.sleep(for: .seconds(1))
    #expect(store.totalCalls - callsBefore < 200, "store calls in 1 s: \(store.calls)")
    #expect(!finished.isSet, "waitUntilFinished returned while another worker's job was still running")
    gate.open()
    try await eventually("waitUntilFinished returns once the job is done") { finished.isSet }
    waiter.cancel()
    await watcher.shutdown(gracePeriod: .seconds(1))
    await holder.shutdown(gracePeriod: .seconds(1))
  }

  @Test("an expired lease waiting to be rescued does not make an idle queue spin")
  func noBusyLoopWhileAnExpiredLeaseWaits() async throws {
    let base = InMemoryJobStore()
    let clock = SystemJobClock()
    _ = try await base.enqueue([NewJob(payload: try encoded(1))], queue: Self.queueName, clock: clock)
    let ghost = try await base.settleAndClaim(
      [], queue: Self.queueName, limit: 1, lease: Lease(owner: "ghost", duration: .milliseconds(300)),
      clock: clock)
    #expect(ghost.claimed.count == 1)

    let store = InstrumentedJobStore(base)
    let handled = Log<Int>()
    let queue = try JobQueue<EngineItem>(configuration: configuration(poll: .milliseconds(200)), store: store)
    {
      item, _ in
      handled.append(item.number)
      return .handled
    }
    try await Task.sleep(for: .seconds(2))
    let calls = store.totalCalls
    await queue.shutdown(gracePeriod: .seconds(1))
    #expect(calls < 100, "store calls in 2 s: \(store.calls)")
    #expect(handled.all == [1], "the ghost's job was rescued and handled")
  }

  @Test("a queue whose delegate was released does not spin, and charges no attempt")
  func releasedDelegateDoesNotSpin() async throws {
    let store = InstrumentedJobStore()
    var delegate: ForgettableDelegate? = ForgettableDelegate()
    weak let probe = delegate
    let queue = try JobQueue<EngineItem>(
      configuration: configuration(autoStart: false, poll: .milliseconds(200)), store: store,
      delegate: delegate!)
    delegate = nil
    #expect(probe == nil, "the queue holds its delegate weakly")
    try await queue.add(EngineItem(number: 1))
    try await queue.add(EngineItem(number: 2))

    queue.start()
    try await Task.sleep(for: .seconds(2))
    let calls = store.totalCalls
    #expect(calls < 100, "store calls in 2 s: \(store.calls)")
    let jobs = try await store.base.jobs(queue: Self.queueName, status: nil, after: nil, limit: 10)
    #expect(jobs.map(\.status) == [.pending, .pending], "nothing is dead or running")
    #expect(jobs.map(\.attempts) == [0, 0], "no attempt was used")
    await queue.shutdown(gracePeriod: .seconds(1))
  }

  // MARK: Nothing waits without reason

  /// A queue of concurrency 2 whose handler blocks on `gate` for item 0 and records each start.
  func busyQueue(
    store: any JobStore, gate: Gate, started: Log<String>, retryFirst: Bool = false
  ) throws -> JobQueue<EngineItem> {
    try JobQueue<EngineItem>(
      configuration: configuration(concurrency: 2, lease: .seconds(60), poll: .milliseconds(100)),
      store: store
    ) { item, context in
      started.append("\(item.number)#\(context.attempts)")
      if item.number == 0 { await gate.wait() }
      if retryFirst && item.number == 1 && context.attempts == 1 {
        return .retry(after: .milliseconds(300))
      }
      return .handled
    }
  }

  @Test("with one handler blocked, a delayed job starts within the poll interval")
  func delayedJobStartsWhileAnotherHandlerRuns() async throws {
    let gate = Gate()
    defer { gate.open() }
    let started = Log<String>()
    let queue = try busyQueue(store: InMemoryJobStore(), gate: gate, started: started)
    try await queue.add(EngineItem(number: 0))
    try await eventually("the blocking job started") { started.all == ["0#1"] }
    try await queue.add(EngineItem(number: 1), delay: .milliseconds(300))
    try await eventually("the delayed job started", timeout: .seconds(90)) { started.all.contains("1#1") }
    #expect(try await queue.count() == JobCounts(running: 1), "only the blocked job is left")
    gate.open()
    await queue.waitUntilFinished()
    await queue.shutdown(gracePeriod: .seconds(1))
  }

  @Test("with one handler blocked, a retry starts within the poll interval")
  func retryStartsWhileAnotherHandlerRuns() async throws {
    let gate = Gate()
    defer { gate.open() }
    let started = Log<String>()
    let queue = try busyQueue(store: InMemoryJobStore(), gate: gate, started: started, retryFirst: true)
    try await queue.add(EngineItem(number: 0))
    try await eventually("the blocking job started") { started.all == ["0#1"] }
    try await queue.add(EngineItem(number: 1))
    try await eventually("the retry ran", timeout: .seconds(90)) { started.all.contains("1#2") }
    gate.open()
    await queue.waitUntilFinished()
    await queue.shutdown(gracePeriod: .seconds(1))
  }

  @Test("with one handler blocked, another instance's new job starts within the poll interval")
  func otherInstancesJobStartsWhileAnotherHandlerRuns() async throws {
    let gate = Gate()
    defer { gate.open() }
    let store = InMemoryJobStore()
    let started = Log<String>()
    let queue = try busyQueue(store: store, gate: gate, started: started)
    let producer = try JobQueue<EngineItem>(configuration: configuration(autoStart: false), store: store) {
      _, _ in .handled
    }
    try await queue.add(EngineItem(number: 0))
    try await eventually("the blocking job started") { started.all == ["0#1"] }
    // Let the queue settle into waiting (it looks once more for work right after starting a job).
    try await Task.sleep(for: .milliseconds(300))
    try await producer.add(EngineItem(number: 1))
    try await eventually("the other instance's job started", timeout: .seconds(90)) {
      started.all.contains("1#1")
    }
    gate.open()
    await queue.waitUntilFinished()
    await queue.shutdown(gracePeriod: .seconds(1))
  }

  @Test("waitUntilFinished waits for jobs another instance added to the store")
  func waitUntilFinishedCountsAnotherInstancesJobs() async throws {
    let gate = Gate()
    defer { gate.open() }
    let store = InMemoryJobStore()
    let started = Log<Int>()
    let worker = try JobQueue<EngineItem>(
      configuration: configuration(poll: .milliseconds(100)), store: store
    ) {
      item, _ in
      started.append(item.number)
      await gate.wait()
      return .handled
    }
    let producer = try JobQueue<EngineItem>(configuration: configuration(autoStart: false), store: store) {
      _, _ in .handled
    }
    // The worker has found its queue empty (and said so) before the other instance adds a job.
    await worker.waitUntilFinished()
    try await producer.add(EngineItem(number: 1))
    let returned = Flag()
    let waiter = Task {
      await worker.waitUntilFinished()
      returned.set()
    }
    try await eventually("the worker started the other instance's job") { started.all == [1] }
    try await Task.sleep(for: .milliseconds(300))
    #expect(!returned.isSet, "returned while the job was still running")
    gate.open()
    try await eventually("waitUntilFinished returned", timeout: .seconds(90)) { returned.isSet }
    await waiter.value
    #expect(try await worker.count() == JobCounts())
    await worker.shutdown(gracePeriod: .seconds(1))
  }

  // MARK: Clocks

  @Test("a wall-clock step back of an hour does not stop heartbeats")
  func wallClockStepBackKeepsHeartbeating() async throws {
    let clock = ManualJobClock()
    let store = InstrumentedJobStore()
    let gate = Gate()
    defer { gate.open() }
    let started = Log<String>()
    let holder = try JobQueue<EngineItem>(
      configuration: configuration(lease: .seconds(30), poll: .seconds(1), clock: clock), store: store
    ) { _, _ in
      started.append("holder")
      await gate.wait()
      return .handled
    }
    try await holder.add(EngineItem(number: 1))
    try await eventually("the holder started the job") { started.all == ["holder"] }
    let rival = try JobQueue<EngineItem>(
      configuration: configuration(lease: .seconds(30), poll: .seconds(1), clock: clock), store: store
    ) { _, _ in
      started.append("rival")
      return .handled
    }

    clock.step(by: .seconds(-3600))
    let heartbeatsBefore = store.calls["heartbeat"] ?? 0
    @Sendable func leaseAhead() async throws -> TimeInterval? {
      let running = try await store.base.jobs(queue: Self.queueName, status: .running, after: nil, limit: 1)
      return running.first?.leaseExpiresAt.map { $0.timeIntervalSince(clock.now()) }
    }
    // Every loop of the two queues asleep on the clock (the holder's lease keeper, the rival's
    // poll): the most sleeps seen over half a second.
    let asleep = try await mostAsleep(on: clock)
    // Three leases' worth, in 5 s steps; heartbeats are due every 10 s of monotonic time. Each
    // step waits until the loops the last one woke sleep again: when the lease keeper slept its
    // 10 s from when its heartbeat returned, steps that ran ahead of it on a loaded machine (or
    // alone) made its next heartbeat due after the check that waited for it, which does not move
    // the clock (it now counts from when the heartbeat started; see
    // slowHeartbeatReturnKeepsTheSchedule).
    for step in 1...18 {
      try await waitUntilAsleep(asleep, on: clock)
      clock.advance(by: .seconds(5))
      if step * 5 >= 20 {
        try await eventually("the lease renewed from the stepped-back clock (at +\(step * 5) s)") {
          guard let ahead = try await leaseAhead() else { return false }
          return ahead > 15 && ahead <= 30
        }
      } else {
        try await Task.sleep(for: .milliseconds(20))
      }
    }
    let heartbeats = (store.calls["heartbeat"] ?? 0) - heartbeatsBefore
    #expect(heartbeats >= 6, "heartbeats after the step: \(heartbeats)")
    #expect(started.all == ["holder"], "the rival never got the job")
    let running = try await store.base.jobs(queue: Self.queueName, status: .running, after: nil, limit: 1)
    #expect(running.count == 1)
    gate.open()
    await holder.waitUntilFinished()
    await rival.shutdown(gracePeriod: .seconds(1))
    await holder.shutdown(gracePeriod: .seconds(1))
  }

  /// A user's clock with a monotonic reading of its own (`uptime()`: here the manual clock's plus
  /// a day) that leaves `sleep(untilUptime:)` to the protocol's default.
  struct OwnUptimeClock: JobClock {
    let base: ManualJobClock
    func now() -> Date { base.now() }
    func sleep(until deadline: Date) async throws { try await base.sleep(until: deadline) }
    func uptime() -> Duration { base.uptime() + .seconds(86_400) }
  }

  // Failed before the fix: the default `sleep(untilUptime:)` read its deadline as a date after
  // 1970, right only for the default `uptime()`; with a clock of its own, every sleep's deadline
  // lay in 1970 and returned at once, and the idle queue's loop called its store without pause.
  @Test("a clock with its own uptime() and the default sleep(untilUptime:) does not make a queue spin")
  func ownUptimeWithTheDefaultSleepDoesNotSpin() async throws {
    let manual = ManualJobClock()
    let store = InstrumentedJobStore()
    let handled = Flag()
    let queue = try JobQueue<EngineItem>(
      configuration: configuration(poll: .seconds(1), clock: OwnUptimeClock(base: manual)), store: store
    ) { _, _ in
      handled.set()
      return .handled
    }
    try await waitUntilAsleep(try await mostAsleep(on: manual), on: manual)
    let callsBefore = store.totalCalls
    try await Task.sleep(for: .milliseconds(500))
    #expect(store.totalCalls - callsBefore < 20, "store calls in 0.5 s with the clock still: \(store.calls)")
    // The sleeps end when the clock moves: a job added by another instance starts at the next poll.
    _ = try await store.base.enqueue(
      [NewJob(payload: try encoded(1), runAt: manual.now())], queue: Self.queueName, now: manual.now())
    manual.advance(by: .seconds(1))
    try await eventually("the job ran at the next poll") { handled.isSet }
    await queue.shutdown(gracePeriod: .seconds(1))
  }

  // Failed before the fix: the lease keeper slept a third of the lease from when a heartbeat
  // returned, while the store computes the new expiry when the heartbeat runs, so a heartbeat slow
  // to return (a store thread slow to resume its caller, a starved machine) pushed the next one
  // out by as long and ate into the lease's margin. (A test stepping the clock ahead of the keeper
  // met this too: JobQueueTests' lease test timed out once, in a loaded full run.) Heartbeats are
  // now due every third of the lease from when the last one started.
  @Test("a heartbeat slow to return does not push the next one out")
  func slowHeartbeatReturnKeepsTheSchedule() async throws {
    let clock = ManualJobClock()
    let store = InstrumentedJobStore()
    store.delayHeartbeatReturns(by: .milliseconds(500))
    let gate = Gate()
    defer { gate.open() }
    let queue = try await queueHoldingAJob(
      configuration(lease: .seconds(30), poll: .seconds(1), clock: clock), store: store, until: gate)
    _ = try await mostAsleep(on: clock)
    // The first heartbeat is due at +10 s. It extends the lease to +40 s, then takes half a second
    // to return; meanwhile the clock moves on to +20 s, when the next one is due.
    clock.advance(by: .seconds(10))
    try await eventually("the first heartbeat ran") { store.calls["heartbeat", default: 0] >= 1 }
    clock.advance(by: .seconds(10))
    try await eventually("the heartbeat due at +20 s ran without another step", timeout: .seconds(20)) {
      store.calls["heartbeat", default: 0] >= 2
    }
    try await eventually("the lease runs to +50 s") {
      let running = try await store.base.jobs(queue: Self.queueName, status: .running, after: nil, limit: 1)
      return running.first?.leaseExpiresAt.map { $0.timeIntervalSince(clock.now()) } == 30
    }
    gate.open()
    await queue.waitUntilFinished()
    await queue.shutdown(gracePeriod: .seconds(1))
  }

  // MARK: No traps

  @Test("huge delays, run dates and retry delays are clamped, not trapped")
  func hugeDelaysAreClamped() async throws {
    let clock = SystemJobClock()
    let store = InMemoryJobStore()
    let queue = try JobQueue<EngineItem>(configuration: configuration(poll: .milliseconds(50)), store: store)
    {
      item, context in
      context.attempts == 1 ? .retry(after: .seconds(Int64.max)) : .handled
    }
    try await queue.add(EngineItem(number: 1), delay: .seconds(Int64.max))
    try await queue.add(EngineItem(number: 2), runAt: .distantFuture)
    try await queue.add(EngineItem(number: 3), runAt: Date(timeIntervalSince1970: 1e300))
    try await queue.add(EngineItem(number: 4))
    try await eventually("the retry is scheduled") {
      try await queue.count() == JobCounts(scheduled: 4)
    }
    let latest = Date(timeIntervalSince1970: 253_402_300_799)  // the end of year 9999
    let farAhead = clock.now().addingTimeInterval(50 * 365 * 86_400)
    for job in try await queue.jobs() {
      #expect(job.runAt > farAhead, "job \(job.id) runs at \(job.runAt)")
      #expect(job.runAt <= latest, "job \(job.id) runs at \(job.runAt)")
    }
    await queue.shutdown(gracePeriod: .seconds(1))
  }

  @Test("a lease of Int64.max seconds is a configuration error")
  func hugeLeaseIsRefused() throws {
    #expect(throws: JobQueueError.self) {
      try configuration(lease: .seconds(Int64.max)).validate()
    }
    #expect(throws: JobQueueError.self) {
      _ = try JobQueue<EngineItem>(
        configuration: configuration(autoStart: false, lease: .seconds(Int64.max)), store: InMemoryJobStore()
      ) { _, _ in .handled }
    }
  }
}
