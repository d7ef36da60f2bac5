import Conveyor
import Foundation
import Synchronization

/// What the simulation knows happened, kept apart from the store, and the invariants it checks
/// against what the store and the handlers report. Each invariant is one sentence in
/// ``Invariant``.
final class SimOracle: Sendable {
  /// The rules a history must keep.
  enum Invariant: String, Sendable, CaseIterable {
    case neverLost = "an added job is never lost"
    case finishesOnce = "a job finishes at most once"
    case settlesOwnClaim = "an outcome settles only its own claim"
    case claimsWaiting = "only a waiting job is claimed, and each claim is newer than the last"
    case startsWithLease = "no handler starts on a claim whose lease may have lapsed"
    case keepsPlace =
      "a rescued job keeps its place: a queue that starts claims nothing behind a job whose lease had lapsed before"
    case pauseObeyed = "pause is obeyed by every process: a paused queue hands out no job"
    case waitUntilFinished = "waitUntilFinished never returns while a job added before it waits or runs"
    case attempts = "attempts are counted as documented: claims, less the claims given back"
    case finishes = "once faults stop, every job finishes (handled, or dead)"
    case progresses = "the engine makes progress: it does not spin without time passing"
    case stops = "a queue that is shut down ends its tasks"
    case rescuesLapsed = "a rescue hands out only jobs whose lease has lapsed"
    case renewsOwnClaim = "a heartbeat keeps only claims that are current"
    case deterministic = "every task runs on the simulation's executor"
    case historyKept =
      "a completed job stays in the store as completed, with its finishing time, until its retention passes"
    case oneAtATime =
      "an add of a key one at a time (waitingOrRunning) stores no job while another of its key waits or runs"
    case newestPayload = "a job replaced while it waited runs with the payload of the last replace"
    case eachSlotOnce = "a schedule adds at most one job for each of its slots"
    case noSlotSkipped =
      "a schedule that catches up every missed slot has a job for each slot from its creation through its last slot, but those a resume passed over"
    case firedWhenDue = "a schedule's job is added no earlier than its slot"
    case keyInOrder =
      "a job of an ordering key is claimed only once every job of its key added before it has finished"
    case withinLimit =
      "a claim never takes the queue's running jobs past its stored concurrency (a job whose lease lapsed counts until rescued)"
    case withinRate =
      "the queue's claims keep to its stored rate: at most burst + perSecond × t in any t seconds of the store's clock"
    case withinKeyLimit =
      "a claim never takes a limit key's running jobs past the key's stored limit (a job whose lease lapsed counts until rescued)"
    case withinKeyRate =
      "each limit key's claims keep to its stored rate: at most burst + perSecond × t in any t seconds of the store's clock"
    case fairnessKeyKept =
      "a claimed job carries the fairness key it was added with, through retries, replaces, rescues and crashes"
  }

  /// A broken rule, with what showed it.
  struct Violation: Sendable, CustomStringConvertible {
    var invariant: Invariant
    var detail: String
    var description: String { "\(invariant.rawValue): \(detail)" }
  }

  enum Status: Sendable, Equatable {
    case waiting
    case running(token: Int64, process: Int)
    case dead
    case done
    case removed
  }

  struct Facts: Sendable {
    var committed: Int
    var status = Status.waiting
    var token: Int64 = 0
    var claims = 0
    var releases = 0
    var completions = 0
    var handlerStarts = 0
    /// When the job was last claimed (uptime).
    var claimedAt = Duration.zero
    /// Its deduplication key and scope, as the application asked.
    var key: String? = nil
    var scope = DeduplicationScope.waiting
    /// The application's job number in its payload: as added, then as the last replace gave it.
    var payloadJob = -1
    /// The payload it was added with.
    var firstPayload = Data()
    /// Its ordering key, as the application asked.
    var orderingKey: String? = nil
    /// Its fairness key, as the application asked (the last replace's).
    var fairnessKey: String? = nil
  }

  /// What the oracle knows of one schedule: its jobs by slot, and the stored schedule as the last
  /// call that changed it left it.
  struct ScheduleFacts: Sendable {
    var jobs: [Date: JobID] = [:]
    var stored: StoredSchedule?
    /// The slots checked so far run through this one (or the schedule's creation).
    var checkedThrough: Date?
    /// The schedule's last slot when it was last paused (the pause fired every slot due then).
    var pausedAt: Date?
    /// Slots from `from` (the pause) and through `through` were passed over by a resume.
    var pausedOver: [(from: Date, through: Date)] = []
  }

  private struct State {
    /// The queue's concurrency limit, as the application last stored it.
    var concurrencyLimit: Int?
    /// The queue's rate, as the application last stored it.
    var rate: RateLimit?
    /// The queue's limits, as the application last stored them (for the limits per key).
    var limits = QueueLimits()
    /// The store's clock (milliseconds, as it reads it) at each claim since the rate was stored,
    /// the wall clock last stepped or a call claimed nothing for a while: the last 2,000.
    var rateClaims: [Int64] = []
    /// How many wall-clock steps there were when `rateClaims` began.
    var rateSteps = 0
    /// As `rateClaims`, for each limit key with a rate: its claims since the rates per key were
    /// stored or the wall clock last stepped (the last 2,000 of each).
    var keyRateClaims: [String: [Int64]] = [:]
    /// How many wall-clock steps there were when `keyRateClaims` began.
    var keyRateSteps = 0
    var schedules: [String: ScheduleFacts] = [:]
    /// Whether a process keeps finished jobs briefly (or not at all): then they may leave the store.
    var historyMayGo = false
    var jobs: [JobID: Facts] = [:]
    var commits = 0
    /// Each lease owner's process.
    var owners: [String: Int] = [:]
    /// When each process started (the wall clock), whether it has claimed a job yet, and whether
    /// the wall clock stepped since it started (its reading at the start then no longer tells
    /// which leases had lapsed).
    var starts: [Int: (wall: Date, claimed: Bool, stepped: Bool)] = [:]
    var violation: Violation?
    var finished = 0
    /// Each step of the wall clock: when (uptime) and by how much.
    var steps: [(at: Duration, by: TimeInterval)] = []
  }

  private let state = Mutex(State())
  let store: InMemoryJobStore
  let clock: SimClock
  let queue: String
  /// Called with each notable event, for the trace.
  let note: @Sendable (@autoclosure () -> String) -> Void
  /// How much of its lease a claim must surely have left for its handler to start: a third of the
  /// lease (the engine's margin), less 2 ms for the millisecond readings the engine takes.
  let startMargin: TimeInterval

  init(
    store: InMemoryJobStore, clock: SimClock, queue: String, lease: Duration,
    note: @escaping @Sendable (@autoclosure () -> String) -> Void
  ) {

    startMargin = lease.inSeconds / 3 - 0.002
    self.store = store
    self.clock = clock
    self.queue = queue
    self.note = note
  }

  var violation: Violation? { state.withLock { $0.violation } }

  /// Jobs handled or dead so far.
  var finished: Int { state.withLock { $0.finished } }

  func fail(_ invariant: Invariant, _ detail: String) {
    state.withLock { state in
      if state.violation == nil { state.violation = Violation(invariant: invariant, detail: detail) }
    }
  }

  /// A process started at the wall clock's `wall`.
  func started(process: Int, wall: Date) {
    state.withLock { $0.starts[process] = (wall, false, false) }
  }

  /// The wall clock stepped: the first claim of a process started before is not checked against
  /// its start.
  func wallClockStepped(by seconds: TimeInterval) {
    let at = clock.uptime()
    state.withLock { state in
      for process in state.starts.keys { state.starts[process]?.stepped = true }
      state.steps.append((at, seconds))
    }
  }

  /// Whether the wall clock stepped forward and then back after `since`: a store that dates leases
  /// by the wall clock may have ended a lease during that excursion while no worker read the
  /// clock, which no worker can tell afterwards (a documented limit).
  private static func excursion(in steps: [(at: Duration, by: TimeInterval)], since: Duration) -> Bool {
    var forward = false
    for step in steps where step.at >= since {
      if step.by > 0 { forward = true } else if forward { return true }
    }
    return false
  }

  // MARK: Store calls

  func enqueued(_ results: [EnqueueResult], _ jobs: [NewJob], process: Int) {
    state.withLock { state in
      for (result, job) in zip(results, jobs) {
        let payloadJob = (try? JSONDecoder().decode(SimItem.self, from: job.payload))?.job ?? -1
        switch result.outcome {
        case .inserted:
          if let key = job.deduplicationKey, job.deduplicationScope == .waitingOrRunning,
            let other = state.jobs.first(where: { id, facts in
              id != result.id && facts.key == key
                && {
                  if case .waiting = facts.status {
                    true
                  } else if case .running = facts.status {
                    true
                  } else {
                    false
                  }
                }()
            })
          {
            state.violation =
              state.violation
              ?? Violation(
                invariant: .oneAtATime,
                detail:
                  "p\(process) stored job \(result.id) of key \(key) while job \(other.key) of it is \(other.value.status)"
              )
          }
          state.commits += 1
          state.jobs[result.id] = Facts(
            committed: state.commits, key: job.deduplicationKey, scope: job.deduplicationScope,
            payloadJob: payloadJob, firstPayload: job.payload, orderingKey: job.orderingKey,
            fairnessKey: job.fairnessKey)
        case .replaced:
          state.jobs[result.id]?.payloadJob = payloadJob
        case .existing:
          break
        }
      }
    }
    note("p\(process) added \(results.filter(\.inserted).map(\.id.description).joined(separator: ","))")
  }

  /// The facts of the settled jobs before the store applies the settlements.
  func beforeSettling(_ settlements: [JobSettlement], queue: String) -> [JobID: Facts] {
    state.withLock { state in
      Dictionary(
        settlements.compactMap { s in state.jobs[s.id].map { (s.id, $0) } }, uniquingKeysWith: { a, _ in a })
    }
  }

  func settled(
    _ settlements: [JobSettlement], before: [JobID: Facts], batch: ClaimBatch, lease: Lease, process: Int
  ) {
    let stale = Set(batch.staleSettlements)
    let paused = store.peekPaused(queue: queue)
    let wallNow = clock.now()
    var laterStart: Date?
    /// Claimed jobs of an ordering key, each with a job of its key added before it and not known
    /// to have finished.
    var earlierOfKey: [(claimed: JobID, key: String, earlier: JobID, status: Status)] = []
    state.withLock { state in
      state.owners[lease.owner] = process
      for settlement in settlements where !stale.contains(settlement.claim) {
        guard var facts = state.jobs[settlement.id] else { continue }
        guard case .running(let token, _) = facts.status, token == settlement.claim.token else {
          state.violation =
            state.violation
            ?? Violation(
              invariant: .settlesOwnClaim,
              detail:
                "job \(settlement.id): outcome of claim \(settlement.claim.token) applied while the job was \(facts.status)"
            )
          return
        }
        switch settlement.action {
        case .complete:
          facts.completions += 1
          facts.status = .done
          state.finished += 1
          if facts.completions > 1 {
            state.violation =
              state.violation
              ?? Violation(
                invariant: .finishesOnce, detail: "job \(settlement.id) completed \(facts.completions) times")
          }
        case .retry: facts.status = .waiting
        case .kill:
          facts.status = .dead
          state.finished += 1
          // Dead, out of its key (`DeadHeadPolicy.releasesKey`): the rest of the key may run.
          if settlement.releasesOrderingKey { facts.orderingKey = nil }
        case .release:
          facts.releases += 1
          facts.status = .waiting
        }
        state.jobs[settlement.id] = facts
      }
      for record in batch.claimed {
        guard var facts = state.jobs[record.id] else { continue }
        if facts.status != .waiting || record.claimToken <= facts.token {
          state.violation =
            state.violation
            ?? Violation(
              invariant: .claimsWaiting,
              detail:
                "job \(record.id) claimed (token \(record.claimToken)) while \(facts.status), last token \(facts.token)"
            )
        }
        if let key = facts.orderingKey {
          for (id, other) in state.jobs
          where id < record.id && other.orderingKey == key && other.status != .done
            && other.status != .removed
          {
            earlierOfKey.append((record.id, key, id, other.status))
          }
        }
        facts.claims += 1
        facts.claimedAt = clock.uptime()
        facts.token = record.claimToken
        facts.status = .running(token: record.claimToken, process: process)
        if record.attempts != facts.claims - facts.releases {
          state.violation =
            state.violation
            ?? Violation(
              invariant: .attempts,
              detail:
                "job \(record.id) claimed with \(record.attempts) attempts after \(facts.claims) claims and \(facts.releases) given back"
            )
        }
        state.jobs[record.id] = facts
      }
      if !batch.claimed.isEmpty {
        if paused {
          state.violation =
            state.violation
            ?? Violation(
              invariant: .pauseObeyed, detail: "p\(process) claimed \(batch.claimed.map(\.id)) while paused")
        }
        if let start = state.starts[process], !start.claimed {
          state.starts[process]?.claimed = true
          if !start.stepped { laterStart = start.wall }
        }
      }
    }
    if let start = laterStart {
      checkFirstClaim(batch.claimed, process: process, processStart: start, now: wallNow)
    }
    if !batch.claimed.isEmpty { checkRate(claimed: batch.claimed.count, process: process) }
    if !batch.claimed.isEmpty { checkKeyRates(claimed: batch.claimed, process: process) }
    if !batch.claimed.isEmpty {
      let wrong = state.withLock { state in
        batch.claimed.first { record in
          state.jobs[record.id].map { $0.fairnessKey != record.fairnessKey } ?? false
        }.map { ($0, state.jobs[$0.id]?.fairnessKey) }
      }
      if let (record, expected) = wrong {
        fail(
          .fairnessKeyKept,
          "p\(process) claimed job \(record.id) with fairness key \(record.fairnessKey ?? "none"), added with \(expected ?? "none")"
        )
      }
    }
    if !batch.claimed.isEmpty {
      let limits = state.withLock { $0.limits }
      let keys = Set(batch.claimed.compactMap(\.limitKey)).filter { limits.concurrency(forKey: $0) != nil }
      if !keys.isEmpty {
        let running = store.peekAll(queue: queue).filter { $0.status == .running }
        for key in keys.sorted() {
          let count = running.filter { $0.limitKey == key }.count
          if let limit = limits.concurrency(forKey: key), count > limit {
            fail(
              .withinKeyLimit,
              "p\(process) claimed \(batch.claimed.map(\.id)), leaving \(count) of key \(key) running under its limit of \(limit)"
            )
          }
        }
      }
    }
    if !batch.claimed.isEmpty, let limit = state.withLock({ $0.concurrencyLimit }) {
      let running = store.peekAll(queue: queue).filter { $0.status == .running }.count
      if running > limit {
        fail(
          .withinLimit,
          "p\(process) claimed \(batch.claimed.map(\.id)), leaving \(running) running under a limit of \(limit)"
        )
      }
    }
    // A dead job pruned from the store no longer holds its key (its retention passed).
    if let broken = earlierOfKey.first(where: { $0.status != .dead || store.peek($0.earlier) != nil }) {
      fail(
        .keyInOrder,
        "p\(process) claimed job \(broken.claimed) of key \(broken.key) while job \(broken.earlier) of it, added before, is \(broken.status)"
      )
    }
    if !batch.claimed.isEmpty || !settlements.isEmpty {
      note(
        "p\(process) settled \(settlements.map { "\($0.claim)\(Self.short($0.action))\(stale.contains($0.claim) ? "(stale)" : "")" }.joined(separator: " ")) claimed \(batch.claimed.map { $0.claim.description }.joined(separator: " "))"
      )
    }
  }

  private static func short(_ action: JobSettlement.Action) -> String {
    switch action {
    case .complete: "✓"
    case .retry: "↻"
    case .kill: "✗"
    case .release: "↩"
    }
  }

  /// A process's first claim: no job whose lease had lapsed before the process started (and that
  /// nobody rescued since) may come before what it claimed.
  private func checkFirstClaim(_ claimed: [JobRecord], process: Int, processStart: Date, now: Date) {
    let abandoned = store.peekAll(queue: queue).filter { record in
      record.status == .running && (record.leaseExpiresAt.map { $0 <= processStart } ?? false)
        && !claimed.contains { $0.id == record.id }
    }
    func precedes(_ a: JobRecord, _ b: JobRecord) -> Bool {
      if a.priority != b.priority { return a.priority > b.priority }
      if a.runAt != b.runAt { return a.runAt < b.runAt }
      return a.id < b.id
    }
    for old in abandoned {
      if let later = claimed.first(where: { precedes(old, $0) }) {
        fail(
          .keepsPlace,
          "p\(process)'s first claim took job \(later.id) before job \(old.id), whose lease had lapsed before it started"
        )
        return
      }
    }
  }

  /// Before a rescue: the lease expiry of each running job.
  func beforeRescue() -> [JobID: Date] {
    Dictionary(
      uniqueKeysWithValues: store.peekAll(queue: queue).compactMap { record in
        record.status == .running ? record.leaseExpiresAt.map { (record.id, $0) } : nil
      })
  }

  /// After a rescue judged at the wall clock's `now`: every job it made waiting had a lapsed lease
  /// (to the 2 ms a store's millisecond dates allow).
  func checkRescue(before: [JobID: Date], now: Date, process: Int) {
    for (id, expiry) in before.sorted(by: { $0.key < $1.key }) where expiry.timeIntervalSince(now) > 0.002 {
      if store.peek(id)?.status == .pending {
        fail(
          .rescuesLapsed,
          "p\(process)'s rescue handed out job \(id) whose lease held \(expiry.timeIntervalSince(now)) s more"
        )
        return
      }
    }
  }

  /// After a heartbeat: every claim the store said it keeps was the job's current claim before.
  func checkHeartbeat(held: [ClaimReference], before: [JobID: Int64], process: Int) {
    for claim in held where before[claim.id] != claim.token {
      fail(
        .renewsOwnClaim,
        "p\(process)'s heartbeat kept claim \(claim) while the job's claim was \(before[claim.id].map { "#\($0)" } ?? "none")"
      )
      return
    }
  }

  /// Jobs the store made waiting again after their lease lapsed.
  func rescued() {
    reconcile(from: { if case .running = $0 { true } else { false } }, to: .pending)
  }

  /// Dead jobs the store made waiting again.
  func requeued() {
    reconcile(from: { $0 == .dead }, to: .pending)
  }

  private func reconcile(from matches: (Status) -> Bool, to stored: JobStatus) {
    let candidates = state.withLock { $0.jobs.filter { matches($0.value.status) }.map(\.key) }
    let moved = candidates.filter { store.peek($0)?.status == stored }
    state.withLock { state in
      for id in moved {
        if state.jobs[id]?.status == .dead { state.finished -= 1 }
        state.jobs[id]?.status = .waiting
      }
    }
    if !moved.isEmpty { note("back to waiting: \(moved.sorted().map(\.description).joined(separator: ","))") }
  }

  func removed(_ ids: [JobID]) {
    state.withLock { state in
      for id in ids where state.jobs[id] != nil {
        if state.jobs[id]?.status == .dead { state.finished -= 1 }
        state.jobs[id]?.status = .removed
      }
    }
  }

  func paused(_ paused: Bool, queue: String) {
    note("queue \(paused ? "paused" : "resumed")")
  }

  /// Claims of `claimed` jobs at the store's clock now, against the stored rate: for every
  /// earlier claim since the rate was stored (or the wall clock stepped: a step forward fills the
  /// bucket as a quiet spell would, and one back makes the store stricter), the claims from it
  /// through these number at most `burst + perSecond × t`, `t` the time between them. GCRA gives
  /// that from any state of its bucket, so the window restarts at each change of the rate.
  private func checkRate(claimed: Int, process: Int) {
    let now = JobStoreTime.milliseconds(clock.now())
    let broken = state.withLock { state -> String? in
      guard let rate = state.rate else { return nil }
      if state.steps.count != state.rateSteps {
        state.rateClaims = []
        state.rateSteps = state.steps.count
      }
      state.rateClaims += Array(repeating: now, count: claimed)
      if state.rateClaims.count > 2_000 { state.rateClaims.removeFirst(state.rateClaims.count - 2_000) }
      let claims = state.rateClaims
      for (index, earlier) in claims.enumerated() {
        let count = claims.count - index
        let seconds = Double(now - earlier) / 1_000
        if Double(count) > Double(rate.burst) + rate.perSecond * seconds + 1e-9 {
          return "p\(process) claimed \(claimed) at \(now) ms: \(count) claims in \(seconds) s under \(rate)"
        }
      }
      return nil
    }
    if let broken { fail(.withinRate, broken) }
  }

  /// Each limit key's claims keep to its rate (as ``checkRate(claimed:process:)`` for the queue's).
  private func checkKeyRates(claimed: [JobRecord], process: Int) {
    let now = JobStoreTime.milliseconds(clock.now())
    let broken = state.withLock { state -> String? in
      guard state.limits.hasKeyRates else { return nil }
      if state.steps.count != state.keyRateSteps {
        state.keyRateClaims = [:]
        state.keyRateSteps = state.steps.count
      }
      for key in Set(claimed.compactMap(\.limitKey)).sorted() {
        guard let rate = state.limits.rate(forKey: key) else { continue }
        let count = claimed.filter { $0.limitKey == key }.count
        var claims = state.keyRateClaims[key, default: []] + Array(repeating: now, count: count)
        if claims.count > 2_000 { claims.removeFirst(claims.count - 2_000) }
        state.keyRateClaims[key] = claims
        for (index, earlier) in claims.enumerated() {
          let within = claims.count - index
          let seconds = Double(now - earlier) / 1_000
          if Double(within) > Double(rate.burst) + rate.perSecond * seconds + 1e-9 {
            return
              "p\(process) claimed \(count) of key \(key) at \(now) ms: \(within) claims in \(seconds) s under \(rate)"
          }
        }
      }
      return nil
    }
    if let broken { fail(.withinKeyRate, broken) }
  }

  /// The application stored these limits (the store has them from this moment).
  func limitsSet(_ limits: QueueLimits) {
    state.withLock { state in
      state.concurrencyLimit = limits.concurrency
      if state.limits.keyRate != limits.keyRate || state.limits.keyRateOverrides != limits.keyRateOverrides {
        state.keyRateClaims = [:]
      }
      state.limits = limits
      if state.rate != limits.rate {
        state.rate = limits.rate
        state.rateClaims = []
      }
    }
    note("concurrency limit \(limits.concurrency.map(String.init) ?? "none")")
  }

  // MARK: Schedules

  /// A process's call stored or changed the schedules, which are now `stored`.
  func schedulesStored(_ stored: [StoredSchedule], process: Int) {
    state.withLock { state in
      for schedule in stored { Self.update(&state, with: schedule) }
    }
    note("p\(process) stored schedules \(stored.map { "\($0.name) next \($0.nextDue.map(Self.at) ?? "-")" })")
  }

  /// A process's call paused or resumed a schedule: it was `before`, it is `after`. A pause fires
  /// the slots due then; a resume passes over the slots that came while the schedule was paused,
  /// after the pause's last slot, and no other.
  func schedulePaused(_ paused: Bool, before: StoredSchedule?, after: StoredSchedule?, process: Int) {
    state.withLock { state in
      guard let before, let after else { return }
      if paused && !before.paused {
        state.schedules[after.name, default: ScheduleFacts()].pausedAt = after.lastSlot ?? after.createdAt
      } else if !paused && before.paused, let through = after.lastSlot,
        let pausedAt = state.schedules[after.name]?.pausedAt
      {
        state.schedules[after.name, default: ScheduleFacts()].pausedOver.append(
          (pausedAt.addingTimeInterval(0.001), through))
      }
      Self.update(&state, with: after)
    }
    note(
      "p\(process) schedule \(before?.name ?? "?") \(paused ? "paused" : "resumed")\(after.flatMap(\.lastSlot).map { ", last slot \(Self.at($0))" } ?? "")"
    )
  }

  /// A process's firing at the wall clock's `now` added `records` (the stored jobs, as the store
  /// holds them now), and left the schedules as `stored`.
  func schedulesFired(_ records: [JobRecord], stored: [StoredSchedule], now: Date, process: Int) {
    state.withLock { state in
      for record in records {
        let payloadJob = (try? JSONDecoder().decode(SimItem.self, from: record.payload))?.job ?? 0
        guard let name = SimWorld.scheduleNames[payloadJob] else {
          state.violation =
            state.violation
            ?? Violation(
              invariant: .eachSlotOnce, detail: "job \(record.id) fired with the payload of no schedule")
          continue
        }
        // Jitter is zero: a job runs at its slot.
        let slot = record.runAt
        if let other = state.schedules[name]?.jobs[slot], other != record.id {
          state.violation =
            state.violation
            ?? Violation(
              invariant: .eachSlotOnce,
              detail:
                "p\(process) added job \(record.id) for slot \(Self.at(slot)) of \(name), which job \(other) has"
            )
        }
        if record.createdAt < slot || now < slot {
          state.violation =
            state.violation
            ?? Violation(
              invariant: .firedWhenDue,
              detail:
                "p\(process) added job \(record.id) of \(name) at \(Self.at(now)) (dated \(Self.at(record.createdAt))), before its slot \(Self.at(slot))"
            )
        }
        state.schedules[name, default: ScheduleFacts()].jobs[slot] = record.id
        state.commits += 1
        state.jobs[record.id] = Facts(
          committed: state.commits, payloadJob: payloadJob, firstPayload: record.payload)
      }
      for schedule in stored { Self.update(&state, with: schedule) }
    }
    if !records.isEmpty {
      note("p\(process) fired \(records.map { "\($0.id)@\(Self.at($0.runAt))" }.joined(separator: ","))")
    }
  }

  /// Keeps `schedule` as stored and checks its slots up to its last one.
  private static func update(_ state: inout State, with schedule: StoredSchedule) {
    var facts = state.schedules[schedule.name, default: ScheduleFacts()]
    facts.stored = schedule
    defer { state.schedules[schedule.name] = facts }
    guard let last = schedule.lastSlot, case .all = schedule.definition.timing.catchUp else { return }
    var cursor = facts.checkedThrough ?? schedule.createdAt
    while let slot = schedule.definition.timing.nextSlot(after: cursor), slot <= last {
      cursor = slot
      if facts.jobs[slot] == nil
        && !facts.pausedOver.contains(where: { $0.from <= slot && slot <= $0.through })
      {
        state.violation =
          state.violation
          ?? Violation(
            invariant: .noSlotSkipped,
            detail:
              "\(schedule.name)'s last slot is \(at(last)), but slot \(at(slot)) has no job and passed in no pause"
          )
        break
      }
    }
    facts.checkedThrough = cursor
  }

  /// A wall-clock date as seconds since the simulation's epoch.
  static func at(_ date: Date) -> String {
    String(format: "%.3fs", date.timeIntervalSince(SimClock.epoch))
  }

  // MARK: Handlers

  /// The payload job `id` was added with (for ``SimDefect/runsStalePayload``).
  func firstPayload(of id: JobID) -> Data? { state.withLock { $0.jobs[id]?.firstPayload } }

  /// A handler of `process` starts on job `id` as its attempt `attempts`, with the payload of
  /// the application's job `payloadJob`.
  func handlerStarted(_ id: JobID, attempts: Int, payloadJob: Int, process: Int) {
    let record = store.peek(id)
    let now = clock.now()
    state.withLock { state in
      guard var facts = state.jobs[id] else { return }
      facts.handlerStarts += 1
      state.jobs[id] = facts
      let excused = Self.excursion(in: state.steps, since: facts.claimedAt)
      guard
        let record, record.status == .running, let owner = record.leaseOwner,
        state.owners[owner] == process, let expiry = record.leaseExpiresAt,
        excused || expiry.timeIntervalSince(now) >= startMargin
      else {
        if excused {
          note(
            "p\(process) starts job \(id) whose lease lapsed in a wall-clock excursion (a documented limit)")
          return
        }
        state.violation =
          state.violation
          ?? Violation(
            invariant: .startsWithLease,
            detail:
              "p\(process) started job \(id) while the store holds it as \(record.map { "\($0.status) by \($0.leaseOwner.flatMap { state.owners[$0] }.map { "p\($0)" } ?? "nobody") until \($0.leaseExpiresAt.map { "\($0.timeIntervalSince(now)) s from now" } ?? "-")" } ?? "gone")"
          )
        return
      }
      if payloadJob != facts.payloadJob {
        state.violation =
          state.violation
          ?? Violation(
            invariant: .newestPayload,
            detail:
              "p\(process) started job \(id) with the payload of job \(payloadJob); the last replace gave it \(facts.payloadJob)"
          )
      }
      if attempts != facts.claims - facts.releases {
        state.violation =
          state.violation
          ?? Violation(
            invariant: .attempts,
            detail:
              "job \(id) started as attempt \(attempts) after \(facts.claims) claims and \(facts.releases) given back"
          )
      }
    }
    note("p\(process) handles \(id) attempt \(attempts)")
  }

  // MARK: Checks

  /// A `waitUntilFinished` caller registers: the commits made so far.
  func registerWaiter() -> Int { state.withLock { $0.commits } }

  /// A `waitUntilFinished` registered after `commits` returned.
  func waiterReturned(registeredAfter commits: Int, process: Int) {
    let all = store.peekAll(queue: queue)
    // A job held behind a dead job of its ordering key waits for an operator, as dead jobs do.
    let deadKeys = Set(all.filter { $0.status == .dead }.compactMap(\.orderingKey))
    let unfinished = all.filter {
      ($0.status == .pending || $0.status == .running)
        && !($0.isHeld && deadKeys.contains($0.orderingKey ?? ""))
    }
    let early = state.withLock { state in
      unfinished.filter { (state.jobs[$0.id]?.committed ?? .max) <= commits }.map(\.id)
    }
    if let first = early.first {
      fail(
        .waitUntilFinished,
        "p\(process)'s waitUntilFinished returned while job \(first) (added before) was \(store.peek(first)?.status.rawValue ?? "?")"
      )
    }
    note("p\(process) waitUntilFinished returned")
  }

  /// Noted when a process keeps finished jobs briefly (or not at all), so a completed job may
  /// leave the store.
  func historyMayGo() { state.withLock { $0.historyMayGo = true } }

  /// Every completed job is in the store as completed, with its finishing time, unless a process
  /// keeps finished jobs briefly.
  func checkHistory() {
    let (done, mayGo) = state.withLock { state in
      (state.jobs.filter { $0.value.status == .done }.map(\.key).sorted(), state.historyMayGo)
    }
    for id in done {
      guard let record = store.peek(id) else {
        if mayGo { continue }
        fail(
          .historyKept,
          "job \(id) completed, then left the store while every process keeps completed jobs a day")
        return
      }
      guard record.status == .completed, record.finishedAt != nil else {
        fail(
          .historyKept,
          "job \(id) completed, but the store holds it as \(record.status) finished at \(String(describing: record.finishedAt))"
        )
        return
      }
    }
  }

  /// Every job not finished for good is in the store (a dead one may be pruned when a process
  /// keeps dead jobs briefly).
  func checkNothingLost() {
    let expected = state.withLock { state in
      state.jobs.filter {
        $0.value.status != .done && $0.value.status != .removed
          && !($0.value.status == .dead && state.historyMayGo)
      }.map(\.key)
    }
    for id in expected where store.peek(id) == nil {
      fail(.neverLost, "job \(id) is gone from the store, never handled")
      return
    }
  }

  /// Whether every job the history added is handled, dead or removed (or waits behind a dead job
  /// of its ordering key, which blocks the key until an operator acts, as documented).
  var allFinished: Bool { unfinished.isEmpty }

  /// The jobs not finished, for the liveness report.
  var unfinished: [(JobID, Status)] {
    state.withLock { state in
      let deadKeys = state.jobs.filter { $0.value.status == .dead }.compactMap { id, facts in
        facts.orderingKey.map { ($0, id) }
      }
      func blocked(_ id: JobID, _ facts: Facts) -> Bool {
        guard facts.status == .waiting, let key = facts.orderingKey else { return false }
        return deadKeys.contains { $0.0 == key && $0.1 < id }
      }
      return state.jobs.filter {
        ![.done, .dead, .removed].contains($0.value.status) && !blocked($0.key, $0.value)
      }
      .map { ($0.key, $0.value.status) }
      .sorted { $0.0 < $1.0 }
    }
  }

  var jobCount: Int { state.withLock { $0.jobs.count } }
}
