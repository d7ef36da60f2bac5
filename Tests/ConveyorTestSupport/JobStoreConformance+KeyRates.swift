import Conveyor
import Foundation

extension JobStoreConformance {
  /// Rates per key (``QueueLimits/keyRate``), on every store that keeps limits per key.
  static let keyRateChecks: [JobStoreCheck] = [
    check("key rates: stored with the queue, overrides and all; bad rates refused, the stored ones kept") {
      store in
      guard store.keepsKeyLimits else { return }
      let limits = QueueLimits(
        keyConcurrency: 3, keyRate: RateLimit(perSecond: 10, burst: 5),
        keyRateOverrides: [
          "api.example.com": RateLimit(perSecond: 0.5), "ünï": RateLimit(perSecond: 2, burst: 2),
        ])
      try await store.setLimits(limits, queue: "q")
      let stored = try await store.limits(queue: "q")
      try expect(stored == limits, "stored as given: \(stored)")
      let tooMany = Dictionary(
        uniqueKeysWithValues: (0...QueueLimits.maximumKeyOverrides).map {
          ("k\($0)", RateLimit(perSecond: 1))
        })
      let bad: [QueueLimits] = [
        QueueLimits(keyRate: RateLimit(perSecond: .nan)), QueueLimits(keyRate: RateLimit(perSecond: 0)),
        QueueLimits(keyRate: RateLimit(perSecond: 1, burst: 0)),
        QueueLimits(keyRateOverrides: ["a": RateLimit(perSecond: -1)]),
        QueueLimits(keyRateOverrides: ["": RateLimit(perSecond: 1)]),
        QueueLimits(keyRateOverrides: ["a\u{0}b": RateLimit(perSecond: 1)]),
        QueueLimits(keyRateOverrides: tooMany),
      ]
      for limits in bad {
        do {
          try await store.setLimits(limits, queue: "q")
          throw ConformanceFailure(description: "accepted: \(limits.keyRate.map(\.perSecond) ?? 0)")
        } catch JobQueueError.invalidLimits(let message) {
          try expect(message.contains("rate") || message.contains("key"), "the error says what: \(message)")
        }
      }
      let kept = try await store.limits(queue: "q")
      try expect(kept == limits, "the stored limits are kept: \(kept)")
      try await store.setLimits(QueueLimits(keyRate: RateLimit(perSecond: 1)), queue: "only-rate")
      let listed = try await store.queueNames()
      try expect(listed.contains("only-rate"), "a queue with only a rate per key is listed: \(listed)")
    },
    check("key rates: each key starts no faster than its rate, in claim order; other keys and jobs run") {
      store in
      guard store.keepsKeyLimits else { return }
      // One a second with bursts of 2 for every key, and one every 2 seconds for B.
      try await store.setLimits(
        QueueLimits(
          keyRate: RateLimit(perSecond: 1, burst: 2), keyRateOverrides: ["B": RateLimit(perSecond: 0.5)]),
        queue: "q")
      _ = try await store.enqueue(
        [
          limited("a1"), limited("a2"), limited("a3"), limited("a4"), limited("b1", "B"), limited("b2", "B"),
          job("free"), limited("c1", "C"),
        ], queue: "q", clock: now(0))
      let first = try await claim(store, limit: 10, now: 1)
      try expect(texts(first) == ["a1", "a2", "b1", "free", "c1"], "A's burst, one of B: \(texts(first))")
      let held = try await heldByLimit(store)
      try expect(held == ["a3", "a4", "b2"], "the others held: \(held)")
      let wake = try await store.nextWake(queue: "q", clock: now(1))
      try expect(wake.nextRun == at(2), "the next start of A is due at 2 s: \(wake)")
      let early = try await claim(store, limit: 10, now: 1.5)
      try expect(early.claimed.isEmpty, "nothing before then: \(texts(early))")
      let second = try await claim(store, limit: 10, now: 2)
      try expect(texts(second) == ["a3"], "one of A a second: \(texts(second))")
      let wakeAgain = try await store.nextWake(queue: "q", clock: now(2))
      try expect(wakeAgain.nextRun == at(3), "then A's and B's next at 3 s: \(wakeAgain)")
      let third = try await claim(store, limit: 10, now: 3)
      try expect(texts(third) == ["a4", "b2"], "A's next and B's after 2 s: \(texts(third))")
      let none = try await heldByLimit(store)
      try expect(none.isEmpty, "none held: \(none)")
      // A quiet spell fills A's bucket: a burst again, no more.
      _ = try await store.enqueue((5...8).map { limited("a\($0)", at: 10) }, queue: "q", clock: now(10))
      let burst = try await claim(store, limit: 10, now: 20)
      try expect(texts(burst) == ["a5", "a6"], "a full bucket gives its burst: \(texts(burst))")
    },
    check("key rates: a rate and a concurrency limit on one key both bind; a stop does not beat the rate") {
      store in
      guard store.keepsKeyLimits else { return }
      try await store.setLimits(
        QueueLimits(keyConcurrency: 1, keyRate: RateLimit(perSecond: 0.1, burst: 2)), queue: "q")
      _ = try await store.enqueue((1...4).map { limited("a\($0)") }, queue: "q", clock: now(0))
      let first = try await claim(store, limit: 10, now: 1)
      try expect(texts(first) == ["a1"], "the concurrency limit: one: \(texts(first))")
      // a1 ends: a2 may run (the bucket's second start) at once.
      let second = try await claim(store, limit: 10, settling: [settle(first.claimed[0], .complete)], now: 2)
      try expect(texts(second) == ["a2"], "the burst's second start: \(texts(second))")
      // a2 ends: the bucket is empty until 11 s (one start every 10 s after the burst of 2).
      let third = try await claim(store, limit: 10, settling: [settle(second.claimed[0], .complete)], now: 3)
      try expect(third.claimed.isEmpty, "the rate holds a3 though nothing runs: \(texts(third))")
      let wake = try await store.nextWake(queue: "q", clock: now(3))
      try expect(wake.nextRun == at(11), "due when the bucket gives a start: \(wake)")
      let fourth = try await claim(store, limit: 10, now: 11)
      try expect(texts(fourth) == ["a3"], "then a3: \(texts(fourth))")
    },
    check("key rates: setting limits again makes held jobs claimable; removing the rate lets them all run") {
      store in
      guard store.keepsKeyLimits else { return }
      try await store.setLimits(QueueLimits(keyRate: RateLimit(perSecond: 0.001)), queue: "q")
      _ = try await store.enqueue((1...3).map { limited("a\($0)") }, queue: "q", clock: now(0))
      let first = try await claim(store, limit: 10, now: 1)
      try expect(texts(first) == ["a1"], "one start: \(texts(first))")
      let sameRate = QueueLimits(
        keyRate: RateLimit(perSecond: 0.001), keyRateOverrides: ["B": RateLimit(perSecond: 1)])
      try await store.setLimits(sameRate, queue: "q")
      let again = try await claim(store, limit: 10, now: 2)
      try expect(again.claimed.isEmpty, "A's bucket is kept while its rate is set: \(texts(again))")
      try await store.setLimits(QueueLimits(), queue: "q")
      let rest = try await claim(store, limit: 10, now: 3)
      try expect(texts(rest) == ["a2", "a3"], "no rate: the rest: \(texts(rest))")
    },
    check("key rates: a job held by its key's rate that is cancelled leaves the others due") { store in
      guard store.keepsKeyLimits else { return }
      try await store.setLimits(QueueLimits(keyRate: RateLimit(perSecond: 1)), queue: "q")
      let added = try await store.enqueue((1...3).map { limited("a\($0)") }, queue: "q", clock: now(0))
      _ = try await claim(store, limit: 10, now: 1)
      _ = try await store.cancel([added[1].id], queue: "q", clock: now(1.2))
      let next = try await claim(store, limit: 10, now: 2)
      try expect(texts(next) == ["a3"], "the next start goes to a3: \(texts(next))")
      let usage = try await store.limitKeyUsage(queue: "q", limit: 10)
      try expect(usage == [LimitKeyUsage(key: "A", running: 2, held: 0)], "\(usage)")
    },
  ]
}
