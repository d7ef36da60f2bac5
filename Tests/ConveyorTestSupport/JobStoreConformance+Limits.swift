import Conveyor
import Foundation
import Synchronization

extension JobStoreConformance {
  /// Limits stored with a queue (``QueueLimits``), on every store.
  /// Whether `date` is `seconds` after `t0`, to the millisecond (a store may compute it as a wait
  /// added to the caller's time).
  static func near(_ date: Date?, _ seconds: Double) -> Bool {
    date.map { abs($0.timeIntervalSince(at(seconds))) < 0.001 } ?? false
  }

  /// A claim of queue `q` at `date`.
  static func claim(_ store: any JobStore, at date: Date, limit: Int = 1, owner: String = "w1") async throws
    -> ClaimBatch
  {
    try await store.settleAndClaim(
      [], queue: "q", limit: limit, lease: lease(owner), clock: FixedJobClock(date))
  }

  /// `value`, or a failure saying `message`.
  static func requireValue<T>(_ value: T?, _ message: String) throws -> T {
    guard let value else { throw ConformanceFailure(description: message) }
    return value
  }

  static let limitChecks: [JobStoreCheck] = [
    check("limits: none until set; set limits are stored per queue and replaced whole") { store in
      let none = try await store.limits(queue: "q")
      try expect(none == QueueLimits() && none.isEmpty, "no limits at first: \(none)")
      try await store.setLimits(QueueLimits(concurrency: 3), queue: "q")
      try await store.setLimits(QueueLimits(concurrency: 7), queue: "Q")
      let q = try await store.limits(queue: "q")
      let other = try await store.limits(queue: "Q")
      try expect(q.concurrency == 3 && other.concurrency == 7, "each queue its own: \(q), \(other)")
      try await store.setLimits(QueueLimits(), queue: "q")
      let removed = try await store.limits(queue: "q")
      try expect(removed.isEmpty, "removed: \(removed)")
      try await store.setLimits(QueueLimits(concurrency: QueueLimits.maximumConcurrency), queue: "q")
      let largest = try await store.limits(queue: "q").concurrency
      try expect(
        largest == QueueLimits.maximumConcurrency, "the largest limit is kept: \(String(describing: largest))"
      )
    },
    check("rate: stored with the queue, beside the concurrency, and removed whole") { store in
      guard store.keepsRateLimits else { return }
      let limits = QueueLimits(concurrency: 3, rate: RateLimit(perSecond: 2.5, burst: 4))
      try await store.setLimits(limits, queue: "q")
      let stored = try await store.limits(queue: "q")
      try expect(stored == limits, "stored as given: \(stored)")
      for rate in [RateLimit.minimumPerSecond, 1.0 / 3, RateLimit.maximumPerSecond] {
        let given = QueueLimits(rate: RateLimit(perSecond: rate, burst: RateLimit.maximumBurst))
        try await store.setLimits(given, queue: "q")
        let kept = try await store.limits(queue: "q")
        try expect(kept == given, "\(rate)/s kept exactly: \(kept)")
      }
      try await store.setLimits(QueueLimits(rate: RateLimit(perSecond: 1)), queue: "a-queue")
      let listed = try await store.queueNames()
      try expect(listed == ["a-queue", "q"], "a queue with only a rate is listed: \(listed)")
      try await store.setLimits(QueueLimits(), queue: "a-queue")
      let after = try await store.queueNames()
      try expect(after == ["q"], "not once the rate is removed: \(after)")
    },
    check("rate: a rate out of range is refused and the stored one kept") { store in
      guard store.keepsRateLimits else { return }
      let good = QueueLimits(rate: RateLimit(perSecond: 5, burst: 2))
      try await store.setLimits(good, queue: "q")
      let bad: [RateLimit] = [
        RateLimit(perSecond: .nan), RateLimit(perSecond: .infinity), RateLimit(perSecond: 0),
        RateLimit(perSecond: -1), RateLimit(perSecond: RateLimit.minimumPerSecond / 2),
        RateLimit(perSecond: RateLimit.maximumPerSecond * 2), RateLimit(perSecond: 1, burst: 0),
        RateLimit(perSecond: 1, burst: -3), RateLimit(perSecond: 1, burst: RateLimit.maximumBurst + 1),
      ]
      for rate in bad {
        do {
          try await store.setLimits(QueueLimits(rate: rate), queue: "q")
          throw ConformanceFailure(description: "\(rate) was accepted")
        } catch JobQueueError.invalidLimits(let message) {
          try expect(message.contains("from"), "the error says the range: \(message)")
        }
      }
      let kept = try await store.limits(queue: "q")
      try expect(kept == good, "the stored rate is kept: \(kept)")
    },
    check("rate: claims take no more starts than the bucket holds, and say when the next comes") { store in
      guard store.keepsRateLimits else { return }
      _ = try await store.enqueue((1...20).map { job("j\($0)") }, queue: "q", clock: now(0))
      _ = try await store.enqueue([job("other")], queue: "r", clock: now(0))
      // 2 a second, 3 at once: a start every 0.5 s once the burst is spent.
      try await store.setLimits(QueueLimits(rate: RateLimit(perSecond: 2, burst: 3)), queue: "q")
      let burst = try await claim(store, limit: 10, now: 10)
      try expect(texts(burst) == ["j1", "j2", "j3"], "a full bucket gives its burst: \(texts(burst))")
      try expect(
        near(burst.nextStart, 10.5), "next start after one interval: \(String(describing: burst.nextStart))")
      try expect(!burst.full, "a rate is not a concurrency limit")
      let empty = try await claim(store, limit: 10, owner: "w2", now: 10.2)
      try expect(empty.claimed.isEmpty, "no start left: \(texts(empty))")
      try expect(near(empty.nextStart, 10.5), "still 10.5: \(String(describing: empty.nextStart))")
      let wake = try await store.nextWake(queue: "q", clock: now(10.2))
      try expect(near(wake.nextRun, 10.5), "ready jobs need a worker at the next start: \(wake)")
      let elsewhere = try await claim(store, "r", limit: 10, now: 10.2)
      try expect(texts(elsewhere) == ["other"] && elsewhere.nextStart == nil, "another queue is free")
      let one = try await claim(store, limit: 10, now: 10.5)
      try expect(texts(one) == ["j4"], "one start at 10.5: \(texts(one))")
      let two = try await claim(store, limit: 10, now: 11.6)
      try expect(texts(two) == ["j5", "j6"], "two starts by 11.6: \(texts(two))")
      try expect(near(two.nextStart, 12), "the next at 12: \(String(describing: two.nextStart))")
      // A quiet spell refills the bucket to its burst, no more.
      let refilled = try await claim(store, limit: 10, now: 100)
      try expect(refilled.claimed.count == 3, "three after a quiet spell: \(texts(refilled))")
      // A settlement frees no start: a retry and a completion in the same call take none back.
      let settled = try await claim(
        store, limit: 10,
        settling: [
          settle(refilled.claimed[0], .complete), settle(refilled.claimed[1], .release(error: nil)),
        ],
        now: 100)
      try expect(settled.claimed.isEmpty, "settling gives no start: \(texts(settled))")
      // A claim that finds fewer jobs than starts keeps the rest.
      try await store.setLimits(QueueLimits(rate: RateLimit(perSecond: 1, burst: 50)), queue: "r")
      _ = try await store.enqueue([job("r1"), job("r2")], queue: "r", clock: now(200))
      let few = try await claim(store, "r", limit: 10, now: 200)
      try expect(
        texts(few) == ["r1", "r2"] && few.nextStart == nil,
        "starts left: \(String(describing: few.nextStart))")
    },
    check("rate: a claim at the next start the store reported takes a start") { store in
      guard store.keepsRateLimits else { return }
      for (index, perSecond) in [3.0, 7, 1.0 / 3, 13, 0.7, 30].enumerated() {
        try await store.setLimits(QueueLimits(), queue: "q")
        _ = try await store.enqueue((1...8).map { job("j\(index)-\($0)") }, queue: "q", clock: now(0))
        try await store.setLimits(QueueLimits(rate: RateLimit(perSecond: perSecond)), queue: "q")
        var date = at(Double(index) * 1000 + 10)
        for step in 0..<6 {
          let batch = try await claim(store, at: date)
          try expect(
            batch.claimed.count == 1,
            "\(perSecond)/s, step \(step): a claim at the next start reported (\(date.timeIntervalSince1970)) "
              + "took nothing; it now says \(String(describing: batch.nextStart?.timeIntervalSince1970))")
          date = try requireValue(batch.nextStart, "\(perSecond)/s: no next start after the last start")
        }
        // The rest drained, so the next rate starts from an empty queue.
        try await store.setLimits(QueueLimits(), queue: "q")
        let rest = try await claim(store, at: date, limit: 100)
        for record in rest.claimed {
          _ = try await store.settleAndClaim(
            [settle(record, .complete)], queue: "q", limit: 0, lease: lease(), clock: FixedJobClock(date))
        }
      }
    },
    check("rate: the next wake is no earlier than the next start a claim reported") { store in
      guard store.keepsRateLimits else { return }
      _ = try await store.enqueue((1...4).map { job("j\($0)") }, queue: "q", clock: now(0))
      try await store.setLimits(QueueLimits(rate: RateLimit(perSecond: 3)), queue: "q")
      let first = try await claim(store, limit: 1, now: 10)
      let nextStart = try requireValue(first.nextStart, "a next start after the only one")
      let wake = try await store.nextWake(queue: "q", clock: now(10))
      let run = try requireValue(wake.nextRun, "ready jobs: a run date")
      try expect(
        run >= nextStart,
        "the run date \(run.timeIntervalSince1970) is before the next start \(nextStart.timeIntervalSince1970)"
      )
    },
    check("rate: no next start when the claim stopped before the rate (paused, full)") { store in
      guard store.keepsRateLimits else { return }
      _ = try await store.enqueue((1...4).map { job("j\($0)") }, queue: "q", clock: now(0))
      try await store.setLimits(QueueLimits(concurrency: 2, rate: RateLimit(perSecond: 1)), queue: "q")
      let one = try await claim(store, limit: 1, now: 10)
      try expect(one.claimed.count == 1 && near(one.nextStart, 11), "one start, the next at 11")
      try await store.setPaused(true, queue: "q")
      let paused = try await claim(store, limit: 4, now: 10.2)
      try expect(
        paused.claimed.isEmpty && paused.nextStart == nil,
        "paused: \(String(describing: paused.nextStart?.timeIntervalSince(t0)))")
      try await store.setPaused(false, queue: "q")
      try await store.setLimits(QueueLimits(concurrency: 1, rate: RateLimit(perSecond: 1)), queue: "q")
      let full = try await claim(store, limit: 4, now: 10.3)
      try expect(
        full.claimed.isEmpty && full.full && full.nextStart == nil,
        "full: \(String(describing: full.nextStart?.timeIntervalSince(t0)))")
    },
    check("rate: starts are counted to the microsecond, not the stored dates' millisecond") { store in
      guard store.keepsRateLimits else { return }
      _ = try await store.enqueue((1...20).map { job("j\($0)") }, queue: "q", clock: now(0))
      // 1,000 a second, one at a time: claims 0.2 ms apart take one start between them.
      try await store.setLimits(QueueLimits(rate: RateLimit(perSecond: 1000)), queue: "q")
      let first = try await claim(store, limit: 1, now: 10.0004)
      let second = try await claim(store, limit: 1, now: 10.0006)
      try expect(first.claimed.count == 1 && second.claimed.isEmpty, "0.2 ms apart: \(texts(second))")
      // 100,000 a second: a start every 10 µs, so ten claims 12 µs apart take ten starts within
      // two milliseconds.
      try await store.setLimits(QueueLimits(rate: RateLimit(perSecond: 100_000)), queue: "q")
      var starts = 0
      for step in 0..<10 {
        starts += try await claim(store, limit: 1, now: 20 + Double(step) * 0.000_012).claimed.count
      }
      try expect(starts == 10, "\(starts) of 10 starts at 100,000 a second")
    },
    check("rate: a clock stepped back stalls the queue one interval at most") { store in
      guard store.keepsRateLimits else { return }
      _ = try await store.enqueue((1...10).map { job("j\($0)", at: -5000) }, queue: "q", clock: now(-5000))
      try await store.setLimits(QueueLimits(rate: RateLimit(perSecond: 1, burst: 2)), queue: "q")
      let first = try await claim(store, limit: 10, now: 1000)
      try expect(first.claimed.count == 2, "the burst: \(texts(first))")
      // The clock goes back an hour: the stored time is an hour ahead.
      let back = try await claim(store, limit: 10, now: -2600)
      try expect(back.claimed.isEmpty, "none at once: \(texts(back))")
      try expect(
        back.nextStart.map { $0 <= at(-2598) } ?? false,
        "within one interval (and the burst's): \(String(describing: back.nextStart))")
      let wake = try await store.nextWake(queue: "q", clock: now(-2600))
      try expect(wake.nextRun.map { $0 <= at(-2598) } ?? false, "no hour-long wait: \(wake)")
      let later = try await claim(store, limit: 1, now: -2598)
      try expect(later.claimed.count == 1, "a start after the interval: \(texts(later))")
    },
    check("rate: a paused or full queue's claim takes no start") { store in
      guard store.keepsRateLimits else { return }
      _ = try await store.enqueue((1...4).map { job("j\($0)") }, queue: "q", clock: now(0))
      try await store.setLimits(
        QueueLimits(concurrency: 1, rate: RateLimit(perSecond: 1, burst: 2)), queue: "q")
      try await store.setPaused(true, queue: "q")
      let paused = try await claim(store, limit: 4, now: 10)
      try expect(paused.claimed.isEmpty && paused.nextStart == nil, "paused: \(texts(paused))")
      try await store.setPaused(false, queue: "q")
      let one = try await claim(store, limit: 4, now: 10)
      try expect(texts(one) == ["j1"] && one.full && one.nextStart == nil, "one place, a start left")
      let full = try await claim(store, limit: 4, now: 10)
      try expect(full.claimed.isEmpty && full.full, "full: \(texts(full))")
      // The start the full claims did not take is still there.
      let next = try await claim(store, limit: 4, settling: [settle(one.claimed[0], .complete)], now: 10)
      try expect(texts(next) == ["j2"] && near(next.nextStart, 11), "the burst's second: \(texts(next))")
    },
    check("limits: a queue with a stored limit and no jobs is listed, until the limit is removed") { store in
      _ = try await store.enqueue([job("a")], queue: "b-queue", clock: now(0))
      try await store.setLimits(QueueLimits(concurrency: 2), queue: "a-queue")
      let listed = try await store.queueNames()
      try expect(listed == ["a-queue", "b-queue"], "an operator sees the limit before any job: \(listed)")
      try await store.setLimits(QueueLimits(), queue: "a-queue")
      let after = try await store.queueNames()
      try expect(after == ["b-queue"], "listed no longer once the limit is removed: \(after)")
    },
    check("limits: a queue with a limit and a pause flag is listed until both are gone") { store in
      try await store.setLimits(QueueLimits(concurrency: 1), queue: "q")
      try await store.setPaused(true, queue: "q")
      try await store.setLimits(QueueLimits(), queue: "q")
      let paused = try await store.queueNames()
      try expect(paused == ["q"], "still paused, still listed: \(paused)")
      try await store.setLimits(QueueLimits(concurrency: 1), queue: "q")
      try await store.setPaused(false, queue: "q")
      let limited = try await store.queueNames()
      try expect(limited == ["q"], "resumed with a limit, still listed: \(limited)")
      try await store.setLimits(QueueLimits(), queue: "q")
      let gone = try await store.queueNames()
      try expect(gone.isEmpty, "neither left: \(gone)")
    },
    check("limits: lapsed leases under a limit lowered to them or below fill it, whatever its size") {
      store in
      _ = try await store.enqueue((1...6).map { job("j\($0)") }, queue: "q", clock: now(0))
      let four = try await claim(store, limit: 4, now: 1, leaseFor: 10)
      try expect(four.claimed.count == 4, "four running: \(texts(four))")
      for limit in [1, 4] {
        try await store.setLimits(QueueLimits(concurrency: limit), queue: "q")
        let none = try await claim(store, limit: 5, owner: "w2", now: 20)
        try expect(none.claimed.isEmpty && none.full, "\(limit): lapsed, not rescued, full: \(texts(none))")
        let wake = try await store.nextWake(queue: "q", clock: now(20))
        try expect(wake.nextRun == nil && wake.nextLeaseExpiry != nil, "\(limit): no run date: \(wake)")
      }
      try await store.setLimits(QueueLimits(concurrency: 5), queue: "q")
      let wake = try await store.nextWake(queue: "q", clock: now(20))
      try expect(wake.nextRun != nil, "a place under 5: \(wake)")
      let one = try await claim(store, limit: 5, owner: "w2", now: 20)
      try expect(texts(one) == ["j5"] && one.full, "one place: \(texts(one)), full \(one.full)")
      try await store.setLimits(QueueLimits(concurrency: QueueLimits.maximumConcurrency), queue: "q")
      let last = try await claim(store, limit: 5, owner: "w2", now: 20)
      try expect(texts(last) == ["j6"] && !last.full, "far below the largest limit: \(texts(last))")
    },
    check("limits: a limit out of range is refused and the stored one kept") { store in
      try await store.setLimits(QueueLimits(concurrency: 2), queue: "q")
      for bad in [0, -1, Int.min, QueueLimits.maximumConcurrency + 1, Int.max] {
        do {
          try await store.setLimits(QueueLimits(concurrency: bad), queue: "q")
          throw ConformanceFailure(description: "a concurrency of \(bad) was accepted")
        } catch JobQueueError.invalidLimits(let message) {
          try expect(message.contains("from 1 to"), "the error says the range: \(message)")
        }
      }
      let kept = try await store.limits(queue: "q")
      try expect(kept.concurrency == 2, "the stored limit is kept: \(kept)")
    },
    check("limits: claims never take a queue's running jobs past its concurrency") { store in
      _ = try await store.enqueue((1...6).map { job("j\($0)") }, queue: "q", clock: now(0))
      _ = try await store.enqueue([job("other")], queue: "r", clock: now(0))
      try await store.setLimits(QueueLimits(concurrency: 2), queue: "q")
      let first = try await claim(store, limit: 10, now: 1)
      try expect(texts(first) == ["j1", "j2"], "two of ten asked for: \(texts(first))")
      try expect(first.full, "the claim says the limit is filled")
      let second = try await claim(store, limit: 10, owner: "w2", now: 1)
      try expect(second.claimed.isEmpty && !second.paused, "no place left, not paused: \(texts(second))")
      let elsewhere = try await claim(store, "r", limit: 10, now: 1)
      try expect(texts(elsewhere) == ["other"], "another queue is not limited: \(texts(elsewhere))")
      try expect(!elsewhere.full, "a queue without a limit is never full")
      // A settlement in the same call frees its place before the claim counts.
      let next = try await claim(store, limit: 10, settling: [settle(first.claimed[0], .complete)], now: 2)
      try expect(texts(next) == ["j3"], "one place freed, one claimed: \(texts(next))")
      // A retry, a release and a death free places too.
      let after = try await claim(
        store, limit: 10,
        settling: [
          settle(first.claimed[1], .retry(after: .seconds(60), error: "busy")),
          settle(next.claimed[0], .kill(error: "bad")),
        ], now: 3)
      try expect(texts(after) == ["j4", "j5"], "two places freed: \(texts(after))")
      let counts = try await store.counts(queue: "q", clock: now(3))
      try expect(counts.running == 2, "two running: \(counts)")
    },
    check("limits: a full queue needs no worker for its waiting jobs until a place frees") { store in
      _ = try await store.enqueue([job("a"), job("b")], queue: "q", clock: now(0))
      try await store.setLimits(QueueLimits(concurrency: 1), queue: "q")
      try await store.setLimits(QueueLimits(concurrency: 2), queue: "q")
      let belowLimit = try await claim(store, limit: 0, now: 1)
      try expect(!belowLimit.full, "a call that asks for nothing says nothing of the limit")
      try await store.setLimits(QueueLimits(concurrency: 1), queue: "q")
      let running = try await claim(store, limit: 5, now: 1)
      try expect(texts(running) == ["a"], "one running: \(texts(running))")
      let full = try await store.nextWake(queue: "q", clock: now(2))
      try expect(full.nextRun == nil && full.nextLeaseExpiry != nil, "no run date while full: \(full)")
      try expect(!full.isFinished, "not finished while a job runs: \(full)")
      _ = try await claim(store, limit: 0, settling: [settle(running.claimed[0], .complete)], now: 3)
      let free = try await store.nextWake(queue: "q", clock: now(3))
      try expect(free.nextRun != nil, "b needs a worker once a runs no more: \(free)")
    },
    check("limits: a limit lowered below the running jobs claims nothing until fewer run") { store in
      _ = try await store.enqueue((1...5).map { job("j\($0)") }, queue: "q", clock: now(0))
      let four = try await claim(store, limit: 4, now: 1)
      try expect(four.claimed.count == 4, "four running without a limit: \(texts(four))")
      try await store.setLimits(QueueLimits(concurrency: 2), queue: "q")
      let none = try await claim(store, limit: 1, settling: [settle(four.claimed[0], .complete)], now: 2)
      try expect(none.claimed.isEmpty, "three still run, above the limit: \(texts(none))")
      let stillNone = try await claim(store, limit: 1, settling: [settle(four.claimed[1], .complete)], now: 3)
      try expect(stillNone.claimed.isEmpty, "two still run, at the limit: \(texts(stillNone))")
      let one = try await claim(store, limit: 5, settling: [settle(four.claimed[2], .complete)], now: 4)
      try expect(texts(one) == ["j5"], "a place once one ran under the limit: \(texts(one))")
      try await store.setLimits(QueueLimits(), queue: "q")
      _ = try await store.enqueue([job("j6"), job("j7")], queue: "q", clock: now(5))
      let free = try await claim(store, limit: 5, now: 6)
      try expect(texts(free) == ["j6", "j7"], "no bound once removed: \(texts(free))")
    },
    check("limits: a lapsed lease keeps its place until the job is rescued") { store in
      _ = try await store.enqueue([job("a"), job("b")], queue: "q", clock: now(0))
      try await store.setLimits(QueueLimits(concurrency: 1), queue: "q")
      let a = try expectOne(try await claim(store, limit: 5, now: 1, leaseFor: 10).claimed)
      let lapsed = try await claim(store, limit: 5, owner: "w2", now: 20)
      try expect(lapsed.claimed.isEmpty, "a lapsed job still counts until rescued: \(texts(lapsed))")
      let rescued = try await store.rescueExpiredLeases(queue: "q", clock: now(21))
      try expect(rescued == 1, "rescued: \(rescued)")
      let again = try expectOne(try await claim(store, limit: 5, owner: "w2", now: 22).claimed)
      try expect(text(again) == "a", "the rescued job first, alone: \(text(again)) of \(text(a))")
    },
    check("limits: a paused queue with a limit claims nothing and says so") { store in
      _ = try await store.enqueue([job("a")], queue: "q", clock: now(0))
      try await store.setLimits(QueueLimits(concurrency: 5), queue: "q")
      try await store.setPaused(true, queue: "q")
      let paused = try await claim(store, limit: 5, now: 1)
      try expect(paused.claimed.isEmpty && paused.paused, "paused: \(texts(paused))")
      try await store.setPaused(false, queue: "q")
      let resumed = try await claim(store, limit: 5, now: 2)
      try expect(texts(resumed) == ["a"], "resumed: \(texts(resumed))")
      let kept = try await store.limits(queue: "q")
      try expect(kept.concurrency == 5, "pausing kept the limit: \(kept)")
    },
    check("limits: eight workers draining a queue never hold more jobs than its concurrency") { store in
      _ = try await store.enqueue((0..<60).map { job("j\($0)") }, queue: "q", clock: now(0))
      try await store.setLimits(QueueLimits(concurrency: 3), queue: "q")
      let watch = RunningWatch()
      try await withThrowingTaskGroup(of: Void.self) { group in
        for worker in 0..<8 {
          group.addTask {
            var settling: [JobSettlement] = []
            var idle = 0
            while idle < 50 {
              // Marked done before the call that carries the completion: the store may count the
              // place free only once it has it.
              watch.state.withLock { $0.running -= settling.count }
              let batch = try await store.settleAndClaim(
                settling, queue: "q", limit: 2, lease: lease("w\(worker)"), clock: now(1))
              watch.state.withLock {
                $0.running += batch.claimed.count
                $0.most = max($0.most, $0.running)
                $0.done += settling.count
              }
              settling = batch.claimed.map { settle($0, .complete) }
              idle = batch.claimed.isEmpty ? idle + 1 : 0
              await Task.yield()
            }
            watch.state.withLock { $0.running -= settling.count }
            _ = try await store.settleAndClaim(
              settling, queue: "q", limit: 0, lease: lease("w\(worker)"), clock: now(1))
            watch.state.withLock { $0.done += settling.count }
          }
        }
        try await group.waitForAll()
      }
      let result = watch.state.withLock { $0 }
      try expect(result.most <= 3, "at most 3 held at once, saw \(result.most)")
      try expect(result.done == 60, "every job completed: \(result.done)")
      let left = try await store.counts(queue: "q", clock: now(1))
      try expect(left.total == 0, "nothing left: \(left)")
    },
  ]
}

/// Counts of jobs held by the workers of a check, shared by its tasks.
package final class RunningWatch: Sendable {
  /// Jobs held now, the most held at once, and jobs completed.
  package let state = Mutex((running: 0, most: 0, done: 0))

  package init() {}
}
