import Conveyor
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

// Behaviour tests for the queue engine (issue 7), on the in-memory store, through the public API.
// Each states a promise of the README ("A durable queue"), the /// docs or issue 7. Those without
// a note failed on the engine before the rewrite (commit 496693a). None asserts on elapsed time:
// they count store calls, or wait for conditions with timeouts a hang or a spin blows through.

/// The item these tests enqueue.
struct EngineItem: Queueable, Hashable {
  var number: Int
  var text = ""
  var key: String? = nil
  var deduplicationKey: String? { key }
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
    concurrency: Int = 1, prefetch: Int = 0, autoStart: Bool = true, lease: Duration = .seconds(60),
    poll: Duration = .milliseconds(100), clock: any JobClock = SystemJobClock(),
    retry: RetryPolicy = .fixed(.seconds(15)), maxAttempts: Int? = nil,
    log: (@Sendable (LogRecord) -> Void)? = nil
  ) -> JobQueueConfiguration {
    JobQueueConfiguration(
      identifier: Self.queueName, retryPolicy: retry, maxAttempts: maxAttempts, concurrency: concurrency,
      prefetch: prefetch, autoStart: autoStart, leaseDuration: lease, pollInterval: poll, clock: clock,
      log: log)
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

  @Test("a paused queue with ready jobs and a store that keeps failing do not spin")
  func pausedAndFailingStoresDoNotSpin() async throws {
    let store = InstrumentedJobStore()
    let queue = try JobQueue<EngineItem>(configuration: configuration(poll: .milliseconds(200)), store: store)
    {
      _, _ in
      .handled
    }
    try await queue.pause()
    try await queue.add(contentsOf: (0..<5).map { EngineItem(number: $0) })
    try await Task.sleep(for: .seconds(2))
    let pausedCalls = store.totalCalls
    #expect(pausedCalls < 60, "store calls in 2 s while paused: \(store.calls)")
    store.fail("settleAndClaim", times: 1_000_000)
    store.fail("nextWake", times: 1_000_000)
    try await queue.resume()
    let before = store.totalCalls
    try await Task.sleep(for: .seconds(2))
    #expect(store.totalCalls - before < 60, "store calls in 2 s while failing: \(store.calls)")
    await queue.shutdown(gracePeriod: .seconds(1))
  }

  @Test("a prefetched buffer with a short lease keeps every job leased and handles each once")
  func prefetchWithShortLease() async throws {
    let store = InMemoryJobStore()
    let handled = Log<Int>()
    let queue = try JobQueue<EngineItem>(
      configuration: configuration(concurrency: 1, prefetch: 20, lease: .seconds(3), poll: .milliseconds(20)),
      store: store
    ) { item, _ in
      handled.append(item.number)
      try await Task.sleep(for: .milliseconds(250))
      return .handled
    }
    // 24 jobs of 250 ms: the last buffered job waits about 5 s, close to two leases, for its
    // turn. (Leases of 300 ms, then 1 s, made the same point but lost leases to a loaded
    // machine, whose cooperative pool was measured 14 s late; a lost lease hands the job back,
    // so the wait for all to be handled is long.)
    try await queue.add(contentsOf: (0..<24).map { EngineItem(number: $0) })
    try await eventually("all handled", timeout: .seconds(120)) {
      try await store.counts(queue: Self.queueName, clock: SystemJobClock()).unfinished == 0
    }
    await queue.shutdown()
    #expect(handled.all.sorted() == Array(0..<24), "handled: \(handled.all)")
  }

  // Another process holds a running job (claimed on the store directly, never heartbeated
  // by this process) and a job is scheduled an hour ahead; the store's clock is an hour behind:
  // the watcher neither finishes nor spins, and finishes once both are gone.
  @Test func aPastLookingLeaseBesideAScheduledJobKeepsTheQueueUnfinishedWithoutSpinning() async throws {
    let base = InMemoryJobStore()
    let clock = SystemJobClock()
    _ = try await base.enqueue(
      [NewJob(payload: try JSONEncoder().encode(EngineItem(number: 1)))], queue: Self.queueName, clock: clock)
    let held = try await base.settleAndClaim(
      [], queue: Self.queueName, limit: 1, lease: Lease(owner: "elsewhere", duration: .seconds(600)),
      clock: clock
    ).claimed
    #expect(held.count == 1)
    let scheduled = try await base.enqueue(
      [NewJob(payload: try JSONEncoder().encode(EngineItem(number: 2)), runTime: .after(.seconds(3600)))],
      queue: Self.queueName, clock: clock)
    let store = InstrumentedJobStore(base)
    store.skewLeaseExpiries(by: -3600)
    let watcher = try JobQueue<EngineItem>(
      configuration: configuration(concurrency: 2, poll: .milliseconds(100)), store: store
    ) {
      _, _ in
      Issue.record("the watcher must not run these jobs")
      return .handled
    }
    let finished = Flag()
    let waiter = Task {
      await watcher.waitUntilFinished()
      finished.set()
    }
    try await Task.sleep(for: .seconds(1))
    let calls = store.totalCalls
    #expect(!finished.isSet, "waitUntilFinished returned while another process's job was running")
    #expect(calls < 200, "store calls in 1 s with a 100 ms poll: \(store.calls)")
    // The other process finishes; the scheduled job is removed.
    _ = try await base.settleAndClaim(
      [JobSettlement(claim: held[0].claim, action: .complete)], queue: Self.queueName, limit: 0,
      lease: Lease(owner: "elsewhere", duration: .seconds(600)), clock: clock)
    #expect(try await base.remove([scheduled[0].id], queue: Self.queueName) == 1)
    #expect(await eventually(timeout: .seconds(90)) { finished.isSet }, "waitUntilFinished returns")
    waiter.cancel()
    await watcher.shutdown(gracePeriod: .seconds(1))
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
    // The delayed job's outcome is recorded after its handler returns: wait for it.
    try await eventually("only the blocked job is left") {
      try await queue.count().withoutHistory == JobCounts(running: 1)
    }
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
    #expect(try await worker.count().withoutHistory == JobCounts())
    await worker.shutdown(gracePeriod: .seconds(1))
  }

  // Failed before the fix: on a delegate-form queue whose delegate was released, waitUntilFinished never returns
  // even though the store holds no job at all: nextWait reports "finished" only `if canHandle`,
  // and the waiters are released only through reportFinished.
  // Promised: "Returns when the store holds no waiting or running job of this queue".
  @Test("waitUntilFinished returns on an empty queue whose delegate was released")
  func waitUntilFinishedWithReleasedDelegate() async throws {
    let store = InMemoryJobStore()
    var delegate: ForgettableDelegate? = ForgettableDelegate()
    let queue = try JobQueue<EngineItem>(
      configuration: configuration(poll: .milliseconds(50)), store: store, delegate: delegate!)
    delegate = nil
    let done = Flag()
    let waiter = Task {
      await queue.waitUntilFinished()
      done.set()
    }
    let returned = await eventually(timeout: .seconds(90)) { done.isSet }
    waiter.cancel()
    await queue.shutdown(gracePeriod: .seconds(1))
    #expect(returned, "waitUntilFinished did not return within 90 s (1,800 poll intervals) on an empty store")
  }

  @Test("waitUntilFinished does not return while another instance holds a running job")
  func waitUntilFinishedCountsAnotherInstancesRunningJob() async throws {
    let store = InMemoryJobStore()
    let gate = Gate()
    let started = Log<Int>()
    let a = try JobQueue<EngineItem>(configuration: configuration(poll: .milliseconds(50)), store: store) {
      item, _ in
      started.append(item.number)
      await gate.wait()
      return .handled
    }
    // b starts only once a holds the job, so the claim is not a race between them.
    var bConfiguration = configuration(poll: .milliseconds(50))
    bConfiguration.autoStart = false
    let b = try JobQueue<EngineItem>(configuration: bConfiguration, store: store) { _, _ in
      Issue.record("b must not get a's running job")
      return .handled
    }
    try await a.add(EngineItem(number: 1))
    try await eventually("a runs the job") { started.all == [1] }
    b.start()
    let done = Flag()
    let waiter = Task {
      await b.waitUntilFinished()
      done.set()
    }
    try await Task.sleep(for: .milliseconds(500))
    #expect(!done.isSet, "b's waitUntilFinished returned while a's job was running")
    gate.open()
    #expect(await eventually(timeout: .seconds(90)) { done.isSet })
    waiter.cancel()
    await a.shutdown()
    await b.shutdown()
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

  @Test("ManualJobClock: a retry scheduled before a wall-clock step forward runs")
  func retryAcrossAStepForward() async throws {
    let clock = ManualJobClock()
    let store = InMemoryJobStore()
    let attempts = Log<Int>()
    let queue = try JobQueue<EngineItem>(
      configuration: configuration(poll: .seconds(1), clock: clock, retry: .fixed(.seconds(30))), store: store
    ) { _, context in
      attempts.append(context.attempts)
      return context.attempts == 1 ? .retry : .handled
    }
    try await queue.add(EngineItem(number: 1))
    try await eventually("first attempt") { attempts.all == [1] }
    try await eventually("retry stored") {
      try await store.counts(queue: Self.queueName, clock: clock).scheduled == 1
    }
    clock.step(by: .seconds(31))
    try await eventually("retried within a poll interval of monotonic time") {
      clock.advance(by: .milliseconds(100))
      try await Task.sleep(for: .milliseconds(5))
      return attempts.all == [1, 2]
    }
    await queue.shutdown()
  }

  // MARK: Claims and heartbeats

  // Failed before the fix: when the same queue instance claims a job again after its first claim's lease lapsed,
  // the first attempt finishing stops the heartbeats of the second. QueueState.inFlight is keyed
  // by JobID: the re-claim overwrites inFlight[id] with the new claim, and workerFinished(id) of
  // the old attempt then deletes that entry, so LeaseKeeper.held() no longer returns the newer
  // claim. Its lease lapses while its handler still runs and the job is handed out a third time.
  // Promised: "Every claim carries its own token ... even when the same worker claimed the job
  // again"; "Heartbeats ... keep leases alive however busy the handlers are".
  @Test("a re-claim by the same worker keeps being heartbeated after the stale attempt ends")
  func sameWorkerReclaimIsStillHeartbeated() async throws {
    let clock = ManualJobClock()
    let store = InstrumentedJobStore()
    let attempts = Log<Int>()
    let messages = Log<String>()
    let first = Gate()
    let second = Gate()
    let queue = try JobQueue<EngineItem>(
      configuration: configuration(
        concurrency: 2, lease: .seconds(30), poll: .seconds(1), clock: clock,
        log: { messages.append($0.message) }),
      store: store
    ) { _, context in
      attempts.append(context.attempts)
      switch context.attempts {
      case 1: await first.wait()
      case 2: await second.wait()
      default: break
      }
      return .handled
    }
    try await queue.add(EngineItem(number: 1))
    try await eventually("attempt 1 runs") { attempts.all == [1] }
    // The wall clock jumps past the lease (as NTP may): the store sees the lease lapsed, and the
    // same queue rescues and claims the job again (its second slot is free).
    clock.step(by: .seconds(120))
    try await eventually("the same queue claimed the job again") {
      clock.advance(by: .milliseconds(100))
      try await Task.sleep(for: .milliseconds(5))
      return attempts.all == [1, 2]
    }
    // The stale first attempt ends; its outcome is refused (as promised): by the store when the
    // worker records it, or before, when a heartbeat already found the claim gone (on a loaded
    // machine the wait above may pass the 10 s between heartbeats).
    first.open()
    try await eventually("the stale outcome was refused") {
      messages.all.contains {
        $0.contains("outcome was not recorded")
          || $0.contains("the store no longer holds a job for this worker")
      }
    }
    // 45 s of monotonic time pass in small steps: a held claim is heartbeated every 10 s.
    let heartbeatsBefore = store.calls["heartbeat", default: 0]
    for _ in 0..<90 {
      clock.advance(by: .milliseconds(500))
      try await Task.sleep(for: .milliseconds(15))
    }
    let record = try await store.base.jobs(queue: Self.queueName, status: nil, after: nil, limit: 10).first
    let heartbeats = store.calls["heartbeat", default: 0] - heartbeatsBefore
    second.open()
    await queue.shutdown(gracePeriod: .seconds(5))
    #expect(attempts.all == [1, 2], "the second claim's lease lapsed while its handler ran: \(attempts.all)")
    #expect(record?.status == .running && record?.claimToken == 2, "record: \(String(describing: record))")
    #expect(heartbeats >= 3, "heartbeat store calls while the second claim ran for 45 s: \(heartbeats)")
  }

  // MARK: Pause

  // Failed before the fix: a job claimed ahead (prefetch) starts after another worker stored the pause, when
  // the holding queue has no free slot. Its loop asks the store about the pause only when it
  // claims (takeLoopStep: claimLimit 0 and checkPause false while the buffer is full, so
  // needsStore is false; nextWait reads nextWake, which carries no pause flag), and
  // QueueState.workerFinished pops the buffer while its local `paused` is false.
  // Promised: "each worker notices within its poll interval ... jobs already claimed ahead
  // (prefetch) wait."
  @Test("a prefetched job waits when another worker pauses the queue")
  func prefetchedJobWaitsAfterAPauseStoredElsewhere() async throws {
    let store = InMemoryJobStore()
    let gate = Gate()
    let started = Log<Int>()
    let worker = try JobQueue<EngineItem>(
      configuration: configuration(concurrency: 1, prefetch: 1, poll: .milliseconds(50)), store: store
    ) { item, _ in
      started.append(item.number)
      if item.number == 1 { await gate.wait() }
      return .handled
    }
    try await worker.add(contentsOf: [EngineItem(number: 1), EngineItem(number: 2)])
    try await eventually("job 1 runs and job 2 is claimed ahead") {
      try await store.counts(queue: Self.queueName, clock: SystemJobClock()).running == 2
        && started.all == [1]
    }
    // Another worker (another process, say) pauses the queue.
    let other = try JobQueue<EngineItem>(configuration: configuration(autoStart: false), store: store) {
      _, _ in
      .handled
    }
    try await other.pause()
    // Within its poll interval (50 ms), however long a loaded machine takes to run the poll.
    try await eventually("the worker to notice the stored pause") { worker.state == .paused }
    let stateAfterPolls = worker.state
    gate.open()
    try await Task.sleep(for: .milliseconds(500))
    let startedAfterPause = started.all
    await worker.shutdown(gracePeriod: .seconds(5))
    #expect(startedAfterPause == [1], "the prefetched job started while the store said paused")
    #expect(stateAfterPolls == .paused, "the worker did not notice the stored pause: \(stateAfterPolls)")
  }

  // MARK: Shutdown

  // Failed before the fix: one storage error at shutdown loses the release of an interrupted job: finalFlush
  // tries once, logs, and returns, so the job stays "running" under a lease nobody renews and is
  // later rescued with its attempt used. On its last allowed attempt (maxAttempts 1) the next
  // worker marks it dead ("the worker stopped (crashed or was killed)") without running it.
  // Promised: "Shutdown is not a crash ... given back ready ... without using an attempt. Only a
  // worker that vanishes uses up the attempt"; "Storage errors are thrown to the caller or
  // retried by the worker loop with backoff". (JobQueue+Loop.swift finalFlush.)
  @Test("a transient storage error at shutdown does not turn an interruption into a death")
  func transientErrorAtShutdownKeepsTheInterruptedAttempt() async throws {
    let clock = ManualJobClock()
    let store = InstrumentedJobStore()
    let attempts = Log<Int>()
    let configuration = configuration(
      lease: .seconds(30), poll: .milliseconds(50), clock: clock, maxAttempts: 1)
    let first = try JobQueue<EngineItem>(configuration: configuration, store: store) { _, context in
      attempts.append(context.attempts)
      try await Task.sleep(for: .seconds(3600))
      return .handled
    }
    try await first.add(EngineItem(number: 1))
    try await eventually("the handler runs") { attempts.all == [1] }
    store.fail("settleAndClaim", times: 1)  // one transient error (a busy lock, say)
    await first.shutdown(gracePeriod: .milliseconds(100))
    clock.advance(by: .seconds(31))
    let second = try JobQueue<EngineItem>(configuration: configuration, store: store) { _, context in
      attempts.append(context.attempts)
      return .handled
    }
    // Run again (as attempt 1), or (the defect) found dead without running: either way the store
    // settles; a job the second queue runs is recorded once its handler returns.
    let base = store.base
    let settled = await eventually(timeout: .seconds(90)) { attempts.count == 2 }
    _ = try? await eventually("the outcome is recorded", timeout: .seconds(10)) {
      try await base.jobs(queue: Self.queueName, status: .running, after: nil, limit: 1).isEmpty
    }
    let left = try await store.base.jobs(queue: Self.queueName, status: nil, after: nil, limit: 10).filter {
      $0.status != .completed
    }
    await second.shutdown()
    #expect(settled)
    #expect(attempts.all == [1, 1], "the interrupted job should run again as attempt 1: \(attempts.all)")
    #expect(left.isEmpty, "left: \(left.map { "\($0.status) \($0.lastError ?? "")" })")
  }

  @Test("shutdown while a worker claims for itself gives every claimed job back unused")
  func shutdownRacingWorkerClaims() async throws {
    for round in 0..<5 {
      let store = InMemoryJobStore()
      let handled = Log<Int>()
      let queue = try JobQueue<EngineItem>(
        configuration: configuration(concurrency: 2, prefetch: 3, poll: .milliseconds(20)), store: store
      ) { item, _ in
        handled.append(item.number)
        try await Task.sleep(for: .milliseconds(Int.random(in: 0...3)))
        return .handled
      }
      try await queue.add(contentsOf: (0..<200).map { EngineItem(number: $0) })
      try await Task.sleep(for: .milliseconds(Int.random(in: 5...40)))
      await queue.shutdown(gracePeriod: .milliseconds(Int.random(in: 0...5)))
      let jobs = try await store.jobs(queue: Self.queueName, status: nil, after: nil, limit: 1000).filter {
        $0.status != .completed
      }
      #expect(
        jobs.allSatisfy { $0.status == .pending }, "round \(round): \(jobs.filter { $0.status != .pending })")
      #expect(jobs.allSatisfy { $0.attempts == 0 }, "round \(round): an attempt was used by a shutdown")
      #expect(Set(handled.all).count == handled.count, "round \(round): a job was handled twice")
      #expect(handled.count + jobs.count >= 200, "round \(round): a job vanished")
    }
  }

  // MARK: Events

  // Failed before the fix: the date in `.retryScheduled` is computed when the handler returns
  // (clock.now() + delay in JobQueue+Loop.swift settlement(for:outcome:)), but the store computes
  // the run date when the settlement is recorded, which can be much later (prefetch flushes
  // outcomes in batches; a failed store call keeps them for the next turn). The event then names
  // a date the job will not run at.
  // Promised: "retryScheduled: A job will run again at the date".
  @Test("retryScheduled names the run date the store recorded")
  func retryScheduledDateMatchesTheStore() async throws {
    let clock = ManualJobClock()
    let store = InMemoryJobStore()
    let gate = Gate()
    let started = Log<Int>()
    let queue = try JobQueue<EngineItem>(
      configuration: configuration(prefetch: 2, lease: .seconds(60), poll: .seconds(1), clock: clock),
      store: store
    ) { item, _ in
      started.append(item.number)
      switch item.number {
      case 1: return .retry
      case 2: await gate.wait()
      default: break
      }
      return .handled
    }
    let recorder = EventRecorder(queue.events)
    try await queue.add(contentsOf: [EngineItem(number: 1), EngineItem(number: 2), EngineItem(number: 3)])
    try await eventually("job 2 runs after job 1 asked to retry") { started.all == [1, 2] }
    clock.advance(by: .seconds(10))
    try await recorder.wait(for: "retryScheduled") { events in
      events.contains { if case .retryScheduled = $0 { true } else { false } }
    }
    let announced = recorder.events.compactMap { event -> Date? in
      if case .retryScheduled(_, let date, _) = event { date } else { nil }
    }.first
    let stored = try await store.jobs(queue: Self.queueName, status: .pending, after: nil, limit: 10).first?
      .runAt
    gate.open()
    await queue.shutdown(gracePeriod: .seconds(5))
    #expect(
      announced == stored,
      "event says \(String(describing: announced)), store says \(String(describing: stored))")
  }

  // Failed before the fix: `.started` is published for a job whose handler never runs: process(_:) emits it
  // before the abandoned / undecodable / no-handler checks. Observers counting handler starts
  // (the event's documented meaning) count a job that no handler saw.
  // Promised: "started: A handler started on a job".
  @Test("no started event for an undecodable job whose handler never runs")
  func noStartedEventWithoutAHandler() async throws {
    let store = InMemoryJobStore()
    let ran = Log<Int>()
    let queue = try JobQueue<EngineItem>(configuration: configuration(autoStart: false), store: store) {
      item, _ in
      ran.append(item.number)
      return .handled
    }
    let recorder = EventRecorder(queue.events)
    let junk = try await store.enqueue(
      [NewJob(payload: Data("not json".utf8))], queue: Self.queueName, clock: SystemJobClock())
    queue.start()
    try await recorder.wait(for: "died") { events in
      events.contains { if case .died = $0 { true } else { false } }
    }
    await queue.shutdown()
    #expect(ran.all.isEmpty)
    let starts = recorder.count { if case .started(junk[0].id, _) = $0 { true } else { false } }
    #expect(starts == 0, "a started event for a job no handler saw: \(recorder.events)")
  }

  @Test("no event for an outcome the store refused: a removed running job")
  func noEventForARemovedRunningJob() async throws {
    let store = InMemoryJobStore()
    let gate = Gate()
    let queue = try JobQueue<EngineItem>(configuration: configuration(), store: store) { _, _ in
      await gate.wait()
      return .handled
    }
    let recorder = EventRecorder(queue.events)
    let id = try await queue.add(EngineItem(number: 1)).id
    try await recorder.wait(for: "started") { $0.contains(.started(id, attempt: 1)) }
    #expect(try await queue.remove(id))
    gate.open()
    try await recorder.wait(for: "finished") { $0.contains(.finished) }
    await queue.shutdown()
    #expect(!recorder.events.contains(.succeeded(id)))
    #expect(try await queue.count() == JobCounts())
  }

  // MARK: Deduplication

  @Test("dedup with a retried job waiting beside a newer one, and requeueDead")
  func dedupWithRetriesAndRequeue() async throws {
    let store = InMemoryJobStore()
    let gate = Gate()
    let attempts = Log<String>()
    let queue = try JobQueue<EngineItem>(
      configuration: configuration(retry: .fixed(.seconds(3600)), maxAttempts: 2), store: store
    ) { item, context in
      attempts.append("\(item.number)#\(context.attempts)")
      if item.number == 1 {
        await gate.wait()
        return .retry
      }
      return .handled
    }
    let a = try await queue.add(EngineItem(number: 1, key: "k"))
    try await eventually("1 runs") { attempts.all == ["1#1"] }
    let b = try await queue.add(EngineItem(number: 2, key: "k"))
    #expect(b.inserted, "a running job does not count")
    try await queue.pause()
    gate.open()
    try await eventually("1 retries") {
      let counts = try await store.counts(queue: Self.queueName, clock: SystemJobClock())
      return counts.unfinished == 2 && counts.running == 0
    }
    let c = try await queue.add(EngineItem(number: 3, key: "k"))
    #expect(c == EnqueueResult(id: a.id, inserted: false), "the oldest waiting job with the key")
    await queue.shutdown()
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
