import Conveyor
import ConveyorTestSupport
import Foundation
import Synchronization

/// The last events of a history, for the report of a violation.
final class SimTrace: Sendable {
  private struct State {
    var lines: [(at: Duration, line: String)] = []
    var next = 0
  }
  private let state = Mutex(State())
  let length: Int
  let clock: SimClock

  init(length: Int, clock: SimClock) {
    self.length = length
    self.clock = clock
  }

  func note(_ line: String) {
    let stamped = (clock.uptime(), line)
    state.withLock { state in
      if state.lines.count < length {
        state.lines.append(stamped)
      } else {
        state.lines[state.next] = stamped
      }
      state.next = (state.next + 1) % length
    }
  }

  /// The events kept, oldest first, each stamped with its uptime.
  var lines: [String] {
    let kept = state.withLock { state in
      state.lines.count < length
        ? state.lines : Array(state.lines[state.next...] + state.lines[..<state.next])
    }
    return kept.map { String(format: "%9.3f s  ", $0.at.inSeconds) + $0.line }
  }
}

/// One simulated history: the processes, the shared store, the clock, the scheduler, the faults.
final class SimWorld: Sendable {
  enum CallKind { case enqueue, settleAndClaim, heartbeat, rescue, read, change }

  /// A simulated process: its executor, its view of the store, and (for a worker) its queue.
  final class Process: Sendable {
    let id: Int
    let executor: SimProcessExecutor
    let store: SimStore
    let queue = Mutex<JobQueue<SimItem>?>(nil)
    init(id: Int, executor: SimProcessExecutor, store: SimStore) {
      self.id = id
      self.executor = executor
      self.store = store
    }
  }

  enum Phase: Sendable { case chaos, heal, cleanup }

  private struct Event: Comparable {
    var at: Duration
    var order: Int
    var action: @Sendable () -> Void

    static func == (a: Event, b: Event) -> Bool { a.order == b.order }
    static func < (a: Event, b: Event) -> Bool { a.at != b.at ? a.at < b.at : a.order < b.order }
  }

  private struct State {
    var random: SeededRandom
    var processes: [Int: Process] = [:]
    /// Worker processes alive (not crashed, not shut down).
    var alive: [Int] = []
    var nextProcess = 0
    var events = Heap<Event>()
    var eventOrder = 0
    var phase = Phase.chaos
  }

  static let queueName = "sim"
  /// The schedules the workers may declare, by the (negative) job number their payload carries:
  /// `tick` (-1), every ``SimScenario/scheduleEvery``, and `minute` (-2), a cron schedule firing
  /// each minute.
  static let scheduleNames = [-1: "tick", -2: "minute"]
  /// The application's process: it adds the jobs and pauses the queue; it never crashes.
  static let application = 0

  let seed: UInt64
  let scenario: SimScenario
  let scheduler = SimScheduler()
  let clock = SimClock()
  let base = InMemoryJobStore()
  let trace: SimTrace
  let oracle: SimOracle
  /// The lease every worker's queue asks for.
  let lease: Duration
  /// The schedules every worker declares when it starts (none without
  /// ``SimScenario/scheduleEvery``). Each catches up every slot it missed: no history leaves the
  /// queue without a firing process, or jumps the wall clock, for anywhere near 1,000 slots or
  /// 10 minutes.
  let schedules: [ScheduleDefinition]
  /// The jobs of a firing whose schedule a store with ``SimDefect/firesSlotTwice`` did not advance:
  /// the next firing adds them again.
  let unadvanced = Mutex<[NewJob]>([])
  private let state: Mutex<State>

  init(seed: UInt64, scenario: SimScenario) {
    self.seed = seed
    self.scenario = scenario
    var random = SeededRandom(seed: seed)
    lease = random.pick([.seconds(1), .seconds(2), .seconds(5)])
    state = Mutex(State(random: random))
    let trace = SimTrace(length: 120, clock: clock)
    self.trace = trace
    if let every = scenario.scheduleEvery {
      schedules = [
        try! ScheduleDefinition(
          name: "tick", timing: ScheduleTiming(every: every, catchUp: .all(atMost: 1_000)),
          payload: JSONEncoder().encode(SimItem(job: -1))),
        try! ScheduleDefinition(
          name: "minute", timing: ScheduleTiming(cron: "* * * * *", catchUp: .all(atMost: 10)),
          payload: JSONEncoder().encode(SimItem(job: -2))),
      ]
    } else {
      schedules = []
    }
    oracle = SimOracle(
      store: base, clock: clock, queue: Self.queueName, lease: lease,
      note: { trace.note($0()) })
  }

  var phase: Phase { state.withLock { $0.phase } }

  /// Draws with the history's generator.
  func draw<T>(_ body: (inout SeededRandom) -> T) -> T { state.withLock { body(&$0.random) } }

  func process(_ id: Int) -> Process? { state.withLock { $0.processes[id] } }

  private func makeProcess() -> Process {
    let id = state.withLock { state -> Int in
      defer { state.nextProcess += 1 }
      return state.nextProcess
    }
    let process = Process(
      id: id, executor: SimProcessExecutor(process: id, scheduler: scheduler),
      store: SimStore(base: base, world: self, process: id))
    state.withLock { $0.processes[id] = process }
    return process
  }

  /// Runs `body` as a task of `process`.
  private func spawn(_ process: Process, _ body: @escaping @Sendable () async -> Void) {
    Task(executorPreference: process.executor) { await body() }
  }

  /// Schedules `action` at uptime `at`.
  private func schedule(at: Duration, _ action: @escaping @Sendable () -> Void) {
    state.withLock { state in
      state.eventOrder += 1
      state.events.push(Event(at: at, order: state.eventOrder, action: action))
    }
  }

  // MARK: Store calls

  /// A store call of `process`: time on its way, perhaps a failure before it reaches the store,
  /// `body` (the store applying it), time on its way back, perhaps the answer lost.
  func call<T: Sendable>(_ process: Int, _ kind: CallKind, _ body: () async throws -> T) async throws -> T {
    let chaos = phase == .chaos
    let (before, after, fails, loses) = draw { random -> (Duration, Duration, Bool, Bool) in
      let slow = chaos && random.chance(probability: scenario.slowCall)
      let before = slow ? random.duration(lease, lease * 2) : random.duration(.zero, .microseconds(1_500))
      let after = random.duration(.zero, .microseconds(1_500))
      let fails = chaos && random.chance(probability: scenario.storeFailure)
      let loses = chaos && kind != .read && random.chance(probability: scenario.lostAnswer)
      return (before, after, fails, loses)
    }
    await clock.pass(before)
    if scheduler.condition(of: process) == .zombie { throw SimFault.dead }
    if fails {
      trace.note("p\(process) \(kind) failed before reaching the store")
      throw SimFault.refused
    }
    let value = try await body()
    await clock.pass(after)
    if scheduler.condition(of: process) == .zombie { throw SimFault.dead }
    if loses {
      trace.note("p\(process) \(kind) answer lost after the store applied it")
      throw SimFault.answerLost
    }
    return value
  }

  // MARK: Workers

  /// How the handler of `job` behaves on attempt `attempt`: drawn from the seed, the job and the
  /// attempt alone, so the scheduling does not change it. From the fourth attempt on it succeeds.
  private func behaviour(job: Int, attempt: Int) -> Behaviour {
    var random = SeededRandom(seed: seed &* 31 &+ UInt64(job) &* 1_000_003 &+ UInt64(attempt))
    let quick = random.duration(.zero, .milliseconds(40))
    guard attempt < 4, random.chance(probability: scenario.handlerTrouble) else {
      return .succeed(after: quick)
    }
    switch random.below(7) {
    case 0: return .fail(after: quick)
    case 1: return .retryNow
    case 2: return .retryLater(random.duration(.milliseconds(10), .seconds(2)))
    case 3: return .discard
    case 4: return .slow(random.duration(lease / 2, lease * 3))
    case 5: return .stubborn(random.duration(lease / 2, lease * 2))
    default: return .succeed(after: random.duration(lease / 3, lease * 2))
    }
  }

  enum Behaviour {
    case succeed(after: Duration)
    case fail(after: Duration)
    case retryNow
    case retryLater(Duration)
    case discard
    /// Runs long, ending early when cancelled.
    case slow(Duration)
    /// Runs long, whatever happens.
    case stubborn(Duration)
  }

  struct HandlerFailure: Error {}

  /// Starts a worker process with its queue.
  @discardableResult
  private func startWorker() -> Process {
    let process = makeProcess()
    let (concurrency, prefetch, claimsAhead, poll, maxAttempts) = draw { random in
      (
        1 + random.below(3), random.pick([0, 0, 0, 1, 2]), random.chance(probability: 0.7),
        random.pick([Duration.milliseconds(100), .milliseconds(300), .seconds(1)]),
        random.pick([nil, nil, 3, 6] as [Int?])
      )
    }
    // A time limit cuts slow and stubborn handlers short: their attempts are recorded as timed
    // out while they still run, and a stubborn one keeps its slot. Above the quick handlers'
    // 40 ms, so every job still finishes once faults stop.
    let (timeLimit, grace) = draw { random in
      (
        random.pick([nil, nil, lease / 2, lease * 2] as [Duration?]),
        random.pick([Duration.zero, .milliseconds(200), lease])
      )
    }
    // Most processes keep the history a day (nothing leaves the store in a history); some prune
    // it every second after a few seconds, or keep none, so pruning runs beside the claims.
    let retention = draw { random in
      random.pick([
        JobRetention.default, .default,
        JobRetention(
          completed: .for(.seconds(3)), cancelled: .for(.seconds(2)), dead: .for(.seconds(20)),
          interval: .seconds(1)),
        JobRetention(completed: .none, cancelled: .none, dead: .for(.seconds(5)), interval: .seconds(1)),
      ])
    }
    if retention != .default { oracle.historyMayGo() }
    var configuration = JobQueueConfiguration(
      identifier: Self.queueName, retryPolicy: .fixed(.milliseconds(500)), maxAttempts: maxAttempts,
      concurrency: concurrency, prefetch: prefetch, claimsAhead: claimsAhead, leaseDuration: lease,
      pollInterval: poll, timeLimit: timeLimit, timeLimitGrace: grace, retention: retention, clock: clock)
    configuration.runtime = .simulated(executor: process.executor, clock: clock)
    configuration.deadHeadPolicy = scenario.deadReleasesKey ? .releasesKey : .holdsKey
    let id = process.id
    oracle.started(process: id, wall: clock.now())
    let queue = try! JobQueue<SimItem>(configuration: configuration, store: process.store) {
      [weak self] item, context in
      guard let self else { return .handled }
      if scheduler.condition(of: id) != .zombie {
        oracle.handlerStarted(context.id, attempts: context.attempts, payloadJob: item.job, process: id)
      }
      // A schedule's jobs share a payload: each behaves by its own number in the store. Once
      // faults stop they behave, or a schedule firing faster than troubled handlers finish (one
      // worker, a slot a second, attempts of seconds) would keep the queue from ever finishing.
      let scheduled = item.job < 0
      let job = scheduled ? 1_000_000 + Int(context.id.rawValue) : item.job
      let behaviour =
        scheduled && phase != .chaos
        ? .succeed(after: .milliseconds(5)) : behaviour(job: job, attempt: context.attempts)
      switch behaviour {
      case .succeed(let time):
        try await clock.sleep(for: time)
        return .handled
      case .fail(let time):
        try await clock.sleep(for: time)
        throw HandlerFailure()
      case .retryNow: return .retry(after: .zero)
      case .retryLater(let delay): return .retry(after: delay)
      case .discard: return .discard(reason: "discarded by the simulation")
      case .slow(let time):
        try await clock.sleep(for: time)
        return .handled
      case .stubborn(let time):
        await clock.pass(time)
        return .handled
      }
    }
    process.queue.withLock { $0 = queue }
    state.withLock { $0.alive.append(id) }
    if !schedules.isEmpty {
      spawn(process) { [self] in await declareSchedules(on: queue) }
    }
    trace.note(
      "p\(id) started (concurrency \(concurrency), prefetch \(prefetch), ahead \(claimsAhead), poll \(poll), max \(maxAttempts.map(String.init) ?? "-"), limit \(timeLimit.map { "\($0)" } ?? "-"), history \(retention == .default ? "a day" : "pruned"))"
    )
    return process
  }

  // MARK: Faults and the application

  private func randomAlive() -> Process? {
    state.withLock { state in
      state.alive.isEmpty ? nil : state.processes[state.alive[state.random.below(state.alive.count)]]
    }
  }

  private func markGone(_ id: Int) { state.withLock { $0.alive.removeAll { $0 == id } } }

  /// Times in `0..<span` at which something happens `perMinute` times a minute on average.
  private func times(_ perMinute: Double, within span: Duration) -> [Duration] {
    guard perMinute > 0 else { return [] }
    return draw { random in
      let count = Int((perMinute * span.inSeconds / 60).rounded()) + (random.chance(probability: 0.5) ? 1 : 0)
      return (0..<count).map { _ in random.duration(.zero, span) }.sorted()
    }
  }

  private func planChaos(application: Process) {
    let span = scenario.chaos
    // The application adds the jobs over the first two thirds of the chaos.
    for job in 0..<scenario.jobs {
      let at = draw { $0.duration(.zero, span * 2 / 3) }
      schedule(at: at) { [self] in spawn(application) { await self.add(job, from: application) } }
    }
    for at in times(scenario.crashesPerMinute, within: span) {
      schedule(at: at) { [self] in
        guard let victim = randomAlive() else { return }
        markGone(victim.id)
        scheduler.set(.crashed, for: victim.id)
        trace.note("p\(victim.id) killed")
        let restart = draw { $0.duration(.zero, lease * 2) }
        schedule(at: clock.uptime() + restart) { [self] in startWorker() }
      }
    }
    for at in times(scenario.stallsPerMinute, within: span) {
      schedule(at: at) { [self] in
        guard let victim = randomAlive(), scheduler.condition(of: victim.id) == .running else { return }
        let until = clock.uptime() + draw { $0.duration(lease, lease * 3) }
        scheduler.set(.stalled(until: until), for: victim.id)
        trace.note("p\(victim.id) stalled until \(until)")
      }
    }
    for at in times(scenario.clockStepsPerMinute, within: span) {
      schedule(at: at) { [self] in
        let step = draw { random in
          (random.chance(probability: 0.5) ? 1 : -1) * random.duration(lease / 2, lease * 3).inSeconds
        }
        clock.step(by: step)
        oracle.wallClockStepped(by: step)
        trace.note("wall clock stepped by \(step) s")
      }
    }
    if let jump = scenario.clockJump {
      let at = draw { $0.duration(.zero, span) }
      schedule(at: at) { [self] in
        clock.step(by: jump.inSeconds)
        oracle.wallClockStepped(by: jump.inSeconds)
        trace.note("wall clock jumped by \(jump.inSeconds) s")
      }
    }
    for at in times(scenario.shutdownsPerMinute, within: span) {
      schedule(at: at) { [self] in
        guard let victim = randomAlive(), let queue = victim.queue.withLock({ $0 }) else { return }
        markGone(victim.id)
        let grace = draw { $0.duration(.zero, lease) }
        trace.note("p\(victim.id) shutting down (grace \(grace))")
        spawn(victim) { [self] in
          await queue.shutdown(gracePeriod: grace)
          trace.note("p\(victim.id) stopped")
          // A restart, unless the history is being cleaned up (nothing would stop the new one).
          if phase != .cleanup { startWorker() }
        }
      }
    }
    // The application stores the queue's concurrency limit as the history starts, and changes it
    // now and then during the chaos.
    if scenario.concurrencyLimit != nil || scenario.rate != nil || scenario.keyConcurrency != nil
      || scenario.keyRate != nil
    {
      let limits = Self.limits(scenario, concurrency: scenario.concurrencyLimit)
      spawn(application) { [self] in await setLimits(limits, from: application) }
    }
    for at in times(scenario.limitChangesPerMinute, within: span) {
      schedule(at: at) { [self] in
        let limit = draw { $0.pick([1, 2, 4, nil] as [Int?]) }
        let limits = Self.limits(scenario, concurrency: limit)
        spawn(application) { [self] in await setLimits(limits, from: application) }
      }
    }
    for at in times(scenario.pausesPerMinute, within: span) {
      schedule(at: at) { [self] in
        spawn(application) { [self] in await setPaused(true, from: application) }
        let resume = draw { $0.duration(.milliseconds(100), lease * 2) }
        schedule(at: clock.uptime() + resume) { [self] in
          spawn(application) { [self] in await setPaused(false, from: application) }
        }
      }
    }
    // An operator pauses the `tick` schedule through a worker's queue and resumes it a little
    // later (either call is lost if that worker dies meanwhile).
    if !schedules.isEmpty {
      for at in times(scenario.schedulePausesPerMinute, within: span) {
        schedule(at: at) { [self] in
          guard let operatorProcess = randomAlive(), let queue = operatorProcess.queue.withLock({ $0 }) else {
            return
          }
          spawn(operatorProcess) { [self] in await pauseTick(true, on: queue) }
          let resume = draw { $0.duration(.milliseconds(100), lease * 3) }
          schedule(at: clock.uptime() + resume) { [self] in
            guard let other = randomAlive(), let queue = other.queue.withLock({ $0 }) else { return }
            spawn(other) { [self] in await pauseTick(false, on: queue) }
          }
        }
      }
    }
    // waitUntilFinished callers, on workers.
    for at in times(3, within: span) {
      schedule(at: at) { [self] in
        guard let waiter = randomAlive(), let queue = waiter.queue.withLock({ $0 }) else { return }
        let registered = oracle.registerWaiter()
        spawn(waiter) { [self] in
          await queue.waitUntilFinished()
          if scheduler.condition(of: waiter.id) != .zombie {
            oracle.waiterReturned(registeredAfter: registered, process: waiter.id)
          }
        }
      }
    }
  }

  /// The application adds job `job`, trying again while the store refuses the call (a lost
  /// answer may have committed it: it is not added again, as an application could not tell).
  private func add(_ job: Int, from process: Process) async {
    var new = Self.newJob(job)
    if scenario.keyConcurrency != nil || scenario.keyRate != nil { new.limitKey = "host-\(job % 3)" }
    if scenario.fairShares, new.orderingKey == nil { new.fairnessKey = "tenant-\(job % 4)" }
    while true {
      do {
        _ = try await process.store.enqueue([new], queue: Self.queueName, clock: clock)
        return
      } catch SimFault.refused {
        try? await clock.sleep(for: .milliseconds(50))
      } catch {
        return
      }
    }
  }

  /// The job the application adds as its `job`th: most without a key; every sixth from the
  /// second on with one of three keys added one at a time (`.waitingOrRunning`); every sixth from
  /// the fifth on with one of two keys that replace their waiting job (a debounce); every sixth
  /// from the fourth on with one of two ordering keys. Chosen by the number alone, so it draws
  /// nothing from the seed.
  static func newJob(_ job: Int) -> NewJob {
    let order = job % 6 == 3 ? "order-\(job / 6 % 2)" : nil
    let payload = try! JSONEncoder().encode(SimItem(job: job, order: order))
    switch job % 6 {
    case 3:
      return NewJob(payload: payload, orderingKey: order)
    case 1:
      return NewJob(
        payload: payload, deduplicationKey: "one-\(job % 3)", deduplicationScope: .waitingOrRunning)
    case 4:
      return NewJob(payload: payload, deduplicationKey: "latest-\(job % 2)", onConflict: .replace)
    default:
      return NewJob(payload: payload)
    }
  }

  /// The limits the application stores, with concurrency `concurrency`: the scenario's rate, its
  /// limit per key with `host-0`'s own limit of 1, its rate per key with `host-1`'s own rate of 2
  /// a second.
  static func limits(_ scenario: SimScenario, concurrency: Int?) -> QueueLimits {
    QueueLimits(
      concurrency: concurrency, rate: scenario.rate, keyConcurrency: scenario.keyConcurrency,
      keyConcurrencyOverrides: scenario.keyConcurrency == nil ? [:] : ["host-0": 1],
      keyRate: scenario.keyRate,
      keyRateOverrides: scenario.keyRate == nil ? [:] : ["host-1": RateLimit(perSecond: 2)])
  }

  private func setLimits(_ limits: QueueLimits, from process: Process) async {
    await untilApplied { try await process.store.setLimits(limits, queue: Self.queueName) }
  }

  /// Runs an operator's change until the store applied it: again after a refusal, and not after
  /// an answer lost once it was applied (chaos only).
  private func untilApplied(_ change: () async throws -> Void) async {
    while true {
      do {
        return try await change()
      } catch SimFault.refused {
        try? await clock.sleep(for: .milliseconds(50))
      } catch {
        return
      }
    }
  }

  private func setPaused(_ paused: Bool, from process: Process) async {
    await untilApplied { try await process.store.setPaused(paused, queue: Self.queueName) }
  }

  /// A worker declares the schedules as it starts, trying again while the store refuses the call.
  private func declareSchedules(on queue: JobQueue<SimItem>) async {
    while true {
      do {
        try await queue.declareSchedules(schedules)
        return
      } catch SimFault.refused {
        try? await clock.sleep(for: .milliseconds(50))
      } catch {
        return
      }
    }
  }

  /// Pauses or resumes the `tick` schedule through `queue`, trying again while the store refuses.
  private func pauseTick(_ paused: Bool, on queue: JobQueue<SimItem>) async {
    while true {
      do {
        if paused { try await queue.pauseSchedule("tick") } else { try await queue.resumeSchedule("tick") }
        return
      } catch SimFault.refused {
        try? await clock.sleep(for: .milliseconds(50))
      } catch {
        return
      }
    }
  }

  /// The application resumes the `tick` schedule once faults stop.
  private func resumeTick(from process: Process) async {
    while true {
      do {
        _ = try await process.store.setSchedulePaused(
          false, name: "tick", queue: Self.queueName, clock: clock)
        return
      } catch SimFault.refused {
        try? await clock.sleep(for: .milliseconds(50))
      } catch {
        return
      }
    }
  }

  /// Faults stop: the queue and its schedule are resumed, and a worker started if none is alive.
  private func heal() {
    state.withLock { $0.phase = .heal }
    trace.note("faults stop")
    for id in state.withLock({ $0.processes.keys.sorted() }) {
      if case .stalled = scheduler.condition(of: id) { scheduler.set(.running, for: id) }
    }
    if let application = process(Self.application) {
      spawn(application) { [self] in await setPaused(false, from: application) }
      if !schedules.isEmpty { spawn(application) { [self] in await resumeTick(from: application) } }
    }
    if state.withLock({ $0.alive.isEmpty }) { startWorker() }
  }

  /// Stops every worker (the live ones gracefully; the crashed ones as zombies whose store calls
  /// fail), so their tasks end.
  private func cleanUp() {
    state.withLock { $0.phase = .cleanup }
    let all = state.withLock { Array($0.processes.values).sorted { $0.id < $1.id } }
    for process in all {
      if scheduler.condition(of: process.id) == .crashed { scheduler.set(.zombie, for: process.id) }
      guard let queue = process.queue.withLock({ $0 }) else { continue }
      spawn(process) { await queue.shutdown(gracePeriod: .zero) }
    }
  }

  // MARK: Running

  /// Runs the history to its end and returns what happened.
  func run() -> SimOutcome {
    scheduler.bind()
    let application = makeProcess()
    for _ in 0..<scenario.workers { startWorker() }
    planChaos(application: application)
    var steps = 0
    var stepsAtThisTime = 0
    // Once faults stop, every job finishes within this: ten minutes, and time for each job's
    // troubled attempts (each at most three leases long) run one at a time.
    let healLimit = scenario.chaos + .seconds(600) + lease * 9 * scenario.jobs
    var violation: SimOracle.Violation?
    loop: while true {
      if let found = oracle.violation {
        violation = found
        break
      }
      if let (job, process) = scheduler.next(&stateRandom) {
        self.process(process)?.executor.run(job)
          ?? SimProcessExecutor(process: process, scheduler: scheduler).run(job)
        steps += 1
        stepsAtThisTime += 1
        if stepsAtThisTime > 200_000 {
          violation = .init(invariant: .progresses, detail: "200,000 steps without time passing")
          break
        }
        if steps % 512 == 0 {
          oracle.checkNothingLost()
          oracle.checkHistory()
        }
        continue
      }
      let now = clock.uptime()
      switch phase {
      case .chaos where now >= scenario.chaos:
        heal()
        continue loop
      case .heal where oracle.allFinished:
        break loop
      case .heal where now >= healLimit:
        violation = .init(
          invariant: .finishes,
          detail:
            "\(healLimit) after the start, jobs still unfinished: \(oracle.unfinished.prefix(5).map { "\($0.0) \($0.1)" })"
        )
        break loop
      default: break
      }
      let nextEvent = state.withLock { $0.events.peek?.at }
      let candidates = [clock.nextDeadline, scheduler.nextStallEnd, nextEvent].compactMap { $0 }
      guard var next = candidates.min() else {
        if phase == .chaos {
          clock.advance(to: scenario.chaos)
          continue loop
        }
        break loop
      }
      if phase == .chaos { next = min(next, max(scenario.chaos, now)) }
      clock.advance(to: next)
      stepsAtThisTime = 0
      scheduler.endStalls(at: next)
      while let event = state.withLock({ state in
        state.events.peek.flatMap { $0.at <= next ? state.events.pop() : nil }
      }) {
        event.action()
      }
    }
    if violation == nil {
      oracle.checkNothingLost()
      oracle.checkHistory()
      violation = oracle.violation
    }
    if scheduler.counts.foreign > 0 && violation == nil {
      violation = .init(
        invariant: .deterministic, detail: "\(scheduler.counts.foreign) jobs came from another thread")
    }
    let end = clock.uptime()
    cleanUp()
    if !drain() && violation == nil {
      violation = .init(
        invariant: .stops, detail: "tasks still ran \(Self.drainLimit) steps after every queue was shut down")
    }
    return SimOutcome(
      seed: seed, scenario: scenario, violation: violation?.description, trace: trace.lines,
      lifecycles: oracle.finished, steps: steps, simulated: end)
  }

  /// The history's generator, for the scheduler's picks.
  private var stateRandom: SeededRandom {
    get { state.withLock { $0.random } }
    set { state.withLock { $0.random = newValue } }
  }

  /// Runs what is left after the clean-up until nothing is runnable and no sleep is due within a
  /// simulated hour. False if tasks were still running after ``drainLimit`` steps.
  private func drain() -> Bool {
    var steps = 0
    while steps < Self.drainLimit {
      if let (job, process) = scheduler.next(&stateRandom) {
        self.process(process)?.executor.run(job)
        steps += 1
        continue
      }
      guard let next = clock.nextDeadline, next < clock.uptime() + .seconds(3_600) else { return true }
      clock.advance(to: next)
    }
    return false
  }

  /// The most steps the clean-up may take.
  static let drainLimit = 200_000

}
