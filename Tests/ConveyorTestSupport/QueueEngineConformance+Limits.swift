import Conveyor
import Foundation
import Synchronization

extension QueueEngineConformance {
  /// Queue limits (``QueueLimits``) through queues, on every store.
  static let limitChecks: [JobStoreCheck] = [
    check("two queues sharing a store never run more handlers at once than the stored concurrency") {
      store in
      let inFlight = RunningWatch()
      var queues: [JobQueue<Named>] = []
      for index in 0..<2 {
        var configuration = configuration()
        configuration.autoStart = false
        configuration.concurrency = 4
        configuration.prefetch = index  // one prefetches: a job claimed ahead takes a place too
        queues.append(
          try JobQueue<Named>(configuration: configuration, store: store) { _, _ in
            inFlight.state.withLock {
              $0.running += 1
              $0.most = max($0.most, $0.running)
            }
            try await Task.sleep(for: .milliseconds(3))
            inFlight.state.withLock {
              $0.running -= 1
              $0.done += 1
            }
            return .handled
          })
      }
      try await queues[0].setLimits(QueueLimits(concurrency: 3))
      let stored = try await queues[1].limits()
      try expect(stored.concurrency == 3, "the other queue reads the stored limit: \(stored)")
      _ = try await queues[0].add(contentsOf: (0..<60).map { Named(name: "j\($0)") })
      for queue in queues { queue.start() }
      // Waits on the store's state, not on a deadline: this check is about the bound, and a
      // whole-suite run on a loaded machine once starved it for a minute.
      for queue in queues { await queue.waitUntilFinished() }
      for queue in queues { await queue.shutdown() }
      let result = inFlight.state.withLock { $0 }
      try expect(result.done == 60, "every job ran once: \(result.done)")
      try expect(result.most <= 3, "at most 3 handlers at once across both queues, saw \(result.most)")
      try expect(result.most >= 2, "the queues ran jobs side by side: at most \(result.most) at once")
    },
    check("queues under a stored rate start jobs spaced by it, waking for each start without polling") {
      store in
      guard store.keepsRateLimits else { return }
      let starts = Mutex<[ContinuousClock.Instant]>([])
      var queues: [JobQueue<Named>] = []
      for index in 0..<2 {
        // A poll far longer than the whole drain: a queue that waited for its poll would not finish.
        var configuration = configuration(pollInterval: .seconds(120))
        configuration.autoStart = false
        configuration.concurrency = 4
        configuration.prefetch = index
        queues.append(
          try JobQueue<Named>(configuration: configuration, store: store) { _, _ in
            starts.withLock { $0.append(.now) }
            return .handled
          })
      }
      // 10 a second, one at a time: 8 jobs take at least 0.7 s to start.
      try await queues[0].setLimits(QueueLimits(rate: RateLimit(perSecond: 10)))
      let stored = try await queues[1].limits()
      try expect(stored.rate == RateLimit(perSecond: 10), "the other queue reads the stored rate: \(stored)")
      _ = try await queues[0].add(contentsOf: (0..<8).map { Named(name: "j\($0)") })
      let began = ContinuousClock.now
      for queue in queues { queue.start() }
      try await waitFor("eight starts") { starts.withLock { $0.count } == 8 }
      let took = ContinuousClock.now - began
      for queue in queues { await queue.shutdown() }
      let times = starts.withLock { $0 }.sorted()
      // Handlers start a little after their claims, by varying amounts; half the spacing the rate
      // sets is far beyond the jitter and far from the few milliseconds 8 unlimited jobs take.
      let spread = times[times.count - 1] - times[0]
      try expect(spread >= .milliseconds(350), "8 starts at 10 a second spread over \(spread)")
      try expect(took < .seconds(60), "each start woke a queue, none waited for a poll: \(took)")
    },
    check("a queue refuses a rate out of range, or one its store cannot keep, and keeps the stored limits") {
      store in
      // A store written before rates (one that answers `keepsRateLimits` with the default) is
      // never handed one it would drop.
      let older = try JobQueue<Named>(configuration: configuration(), store: InstrumentedJobStore(store)) {
        _, _ in .handled
      }
      do {
        try await older.setLimits(QueueLimits(concurrency: 1, rate: RateLimit(perSecond: 1)))
        throw ConformanceFailure(description: "a store that keeps no rate took one")
      } catch JobQueueError.invalidLimits(let message) {
        try expect(message.contains("keeps no rate limits"), "the message says why: \(message)")
      }
      await older.shutdown()
      let nothing = try await store.limits(queue: "engine")
      try expect(nothing.isEmpty, "nothing was stored: \(nothing)")
      let queue = try JobQueue<Named>(configuration: configuration(), store: store) { _, _ in .handled }
      guard store.keepsRateLimits else { return await queue.shutdown() }
      let good = QueueLimits(concurrency: 2, rate: RateLimit(perSecond: 3, burst: 2))
      try await queue.setLimits(good)
      for bad in [RateLimit(perSecond: .nan), RateLimit(perSecond: 0), RateLimit(perSecond: 1, burst: 0)] {
        do {
          try await queue.setLimits(QueueLimits(rate: bad))
          throw ConformanceFailure(description: "took \(bad)")
        } catch JobQueueError.invalidLimits(let message) {
          try expect(message.contains("rate"), "the message says what: \(message)")
        }
      }
      let kept = try await queue.limits()
      try expect(kept == good, "kept: \(kept)")
      await queue.shutdown()
    },
    check("a queue refuses limits out of range and keeps the stored ones") { store in
      let queue = try JobQueue<Named>(configuration: configuration(), store: store) { _, _ in .handled }
      try await queue.setLimits(QueueLimits(concurrency: 4))
      for bad in [0, -3, QueueLimits.maximumConcurrency + 1] {
        do {
          try await queue.setLimits(QueueLimits(concurrency: bad))
          throw ConformanceFailure(description: "took a concurrency of \(bad)")
        } catch JobQueueError.invalidLimits(let message) {
          try expect(message.contains("\(bad)"), "the message names the value: \(message)")
        }
      }
      let kept = try await queue.limits()
      try expect(kept.concurrency == 4, "kept: \(kept)")
      await queue.shutdown()
    },
    check("a queue at its stored limit starts the waiting jobs as places free, and raising it frees more") {
      store in
      var configuration = configuration()
      configuration.autoStart = false
      configuration.concurrency = 4
      let gate = Mutex(false)
      let runs = Runs()
      let queue = try JobQueue<Named>(configuration: configuration, store: store) { item, _ in
        runs.append(item.name)
        while !gate.withLock({ $0 }) { try await Task.sleep(for: .milliseconds(2)) }
        return .handled
      }
      try await queue.setLimits(QueueLimits(concurrency: 1))
      _ = try await queue.add(contentsOf: (0..<4).map { Named(name: "j\($0)") })
      queue.start()
      try await waitFor("one job to start") { runs.all.count == 1 }
      try await Task.sleep(for: .milliseconds(150))
      try expect(runs.all == ["j0"], "one at a time under a limit of 1: \(runs.all)")
      try await queue.setLimits(QueueLimits(concurrency: 3))
      try await waitFor("two more to start once the limit is raised") { runs.all.count == 3 }
      gate.withLock { $0 = true }
      await queue.waitUntilFinished()
      try expect(runs.all.count == 4, "every job ran: \(runs.all)")
      await queue.shutdown()
    },
    check("a queue at its stored limit does not claim again for every job added while no place is free") {
      store in
      // Its own job holds the one place; jobs added meanwhile wake the loop, which may look, but
      // a claim that cannot take anything (on SQLite a write transaction; on PostgreSQL one under
      // the queue's limit lock) should not follow every add: about one per poll interval.
      let gate = Mutex(false)
      let started = Mutex(0)
      let counted = InstrumentedJobStore(store)
      var configuration = configuration(pollInterval: .milliseconds(250))
      configuration.autoStart = false
      configuration.concurrency = 4
      let queue = try JobQueue<Named>(configuration: configuration, store: counted) { _, _ in
        started.withLock { $0 += 1 }
        while !gate.withLock({ $0 }) { try await Task.sleep(for: .milliseconds(2)) }
        return .handled
      }
      try await queue.setLimits(QueueLimits(concurrency: 1))
      _ = try await queue.add(Named(name: "first"))
      queue.start()
      try await waitFor("the first job to start") { started.withLock { $0 } == 1 }
      try await Task.sleep(for: .milliseconds(100))
      counted.resetCalls()
      let clock = ContinuousClock()
      let began = clock.now
      for index in 0..<50 {
        _ = try await queue.add(Named(name: "j\(index)"))
        try await Task.sleep(for: .milliseconds(10))
      }
      let took = clock.now - began
      let calls = counted.calls
      let claims = calls["settleAndClaim", default: 0]
      let allowed = Int((took / .milliseconds(250)).rounded(.up)) * 2 + 4
      try expect(started.withLock { $0 } == 1, "one job at a time under a limit of 1")
      try expect(
        claims <= allowed,
        "50 adds over \(took) while full: at most \(allowed) claims expected, saw \(claims): \(calls)")
      gate.withLock { $0 = true }
      await queue.waitUntilFinished()
      await queue.shutdown()
    },
    check("a queue that found itself full waits for its poll when a place frees elsewhere, then claims") {
      store in
      let counted = InstrumentedJobStore(store)
      var configuration = configuration(pollInterval: .seconds(1))
      configuration.autoStart = false
      configuration.concurrency = 2
      let runs = Runs()
      let queue = try JobQueue<Named>(configuration: configuration, store: counted) { item, _ in
        runs.append(item.name)
        return .handled
      }
      try await queue.setLimits(QueueLimits(concurrency: 1))
      _ = try await queue.add(contentsOf: [Named(name: "elsewhere"), Named(name: "here")])
      // Another process's worker holds the one place.
      let other = try await store.settleAndClaim(
        [], queue: configuration.identifier, limit: 1, lease: Lease(owner: "other", duration: .seconds(60)),
        clock: SystemJobClock())
      let held = try JobStoreConformance.expectOne(other.claimed)
      queue.start()
      try await waitFor("the queue to find itself full") { counted.calls["settleAndClaim", default: 0] >= 1 }
      try await Task.sleep(for: .milliseconds(100))
      counted.resetCalls()
      // The place frees elsewhere: the store now has a ready job and a free place.
      _ = try await store.settleAndClaim(
        [JobSettlement(claim: held.claim, action: .complete)], queue: configuration.identifier, limit: 0,
        lease: Lease(owner: "other", duration: .seconds(60)), clock: SystemJobClock())
      // A job added here wakes the loop while it waits: it must not turn and turn again until
      // its wait is over because the store now shows a ready job and a free place.
      _ = try await queue.add(Named(name: "later"))
      try await Task.sleep(for: .milliseconds(300))
      // Looks and claims (a turning loop made 1,209 in 300 ms); the queue's periodic checks of
      // its claims and its pruning come on their own clocks.
      let calls = counted.calls
      try expect(
        calls["nextWake", default: 0] + calls["settleAndClaim", default: 0] <= 10,
        "the queue waits for its poll, not turning without claiming: \(calls)")
      try await waitFor("the waiting jobs to run after the poll") { runs.all == ["here", "later"] }
      await queue.shutdown()
    },
  ]
}
