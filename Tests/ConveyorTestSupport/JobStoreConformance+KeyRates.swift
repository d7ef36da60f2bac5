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
    check("key rates: a clock stepped back stalls a key's held job no longer than one interval") {
      store in
      guard store.keepsKeyLimits else { return }
      try await store.setLimits(QueueLimits(keyRate: RateLimit(perSecond: 1)), queue: "q")
      _ = try await store.enqueue([limited("a1"), limited("a2")], queue: "q", clock: now(0))
      let first = try await claim(store, limit: 10, now: 1_000)
      try expect(texts(first) == ["a1"], "one start: \(texts(first))")
      let held = try await heldByLimit(store)
      try expect(held == ["a2"], "a2 held by the rate: \(held)")
      // The clock steps back 900 s. The bucket's stored time (1001 s) is more than a full bucket
      // ahead of the clock: cut back to 101 s ("a clock stepped back cannot stall ... for longer
      // than one interval"), so the key's next start is at 101 s.
      let back = try await claim(store, limit: 10, now: 100)
      try expect(back.claimed.isEmpty, "nothing at 100 s: \(texts(back))")
      var claimed: [String] = []
      for time in [101.0, 102, 103, 110, 200] where claimed.isEmpty {
        claimed = texts(try await claim(store, limit: 10, now: time))
      }
      try expect(
        claimed == ["a2"], "a2 starts within an interval or two of the step, not at 1001 s: \(claimed)")
    },
    check("key rates: after a clock stepped back, the next wake is within one interval") { store in
      guard store.keepsKeyLimits else { return }
      try await store.setLimits(QueueLimits(keyRate: RateLimit(perSecond: 1)), queue: "q")
      _ = try await store.enqueue([limited("a1"), limited("a2")], queue: "q", clock: now(0))
      _ = try await claim(store, limit: 10, now: 1_000)
      let wakeBefore = try await store.nextWake(queue: "q", clock: now(1_000))
      try expect(wakeBefore.nextRun == at(1_001), "a2 due at 1001 s: \(wakeBefore)")
      // The clock steps back 900 s; a claim there takes nothing.
      _ = try await claim(store, limit: 10, now: 100)
      let wake = try await store.nextWake(queue: "q", clock: now(100))
      try expect(
        wake.nextRun.map { $0 <= at(101.001) } ?? false,
        "the held job needs a worker within one interval (101 s), not at 1001 s: \(wake)")
    },
    check("key rates: the first claim at keys' next start releases every due key (70 keys)") {
      store in
      guard store.keepsKeyLimits else { return }
      try await store.setLimits(QueueLimits(keyRate: RateLimit(perSecond: 1)), queue: "q")
      let keys = (0..<70).map { "k" + String(100 + $0) }
      _ = try await store.enqueue(
        keys.flatMap { [limited("\($0)-1", $0), limited("\($0)-2", $0)] }, queue: "q", clock: now(0))
      let first = try await claim(store, limit: 500, now: 1)
      try expect(first.claimed.count == 70, "one start of each key: \(first.claimed.count)")
      let held = try await heldByLimit(store)
      try expect(held.count == 70, "the other of each held: \(held.count)")
      let wake = try await store.nextWake(queue: "q", clock: now(1))
      try expect(wake.nextRun == at(2), "every key's next start at 2 s: \(wake)")
      // Every key's bucket gives one start at 2 s: the first claim then makes each key's held job
      // ready again, and a claim of 500 takes all 70.
      let second = try await claim(store, limit: 500, now: 2)
      let left = try await heldByLimit(store)
      try expect(
        second.claimed.count == 70,
        "the first claim at 2 s takes the held job of each of the 70 keys: took \(second.claimed.count), "
          + "still held \(left.count)")
    },
    check("key rates: a claim by a clock ahead does not forget a key's bucket for the others") {
      store in
      guard store.keepsKeyLimits else { return }
      // Two workers share the store; one's clock runs 10 s ahead of the other's.
      try await store.setLimits(QueueLimits(keyRate: RateLimit(perSecond: 1)), queue: "q")
      _ = try await store.enqueue([limited("a1")], queue: "q", clock: now(0))
      let a1 = try await claim(store, limit: 1, now: 10)
      try expect(texts(a1) == ["a1"], "a1 at 10 s: \(texts(a1))")
      _ = try await store.enqueue([limited("a2")], queue: "q", clock: now(10))
      // The worker whose clock is ahead claims y1 (its claim of 1 never reaches a2); its claim
      // must not make A's bucket full for the other worker.
      _ = try await store.enqueue([job("y1", priority: 5)], queue: "q", clock: now(10))
      let ahead = try await claim(store, limit: 1, now: 20)
      try expect(texts(ahead) == ["y1"], "the worker ahead takes y1: \(texts(ahead))")
      // Back on the first worker's clock, half a second after a1 started: A's bucket (one a
      // second, bursts of 1) has no start until 11 s; two starts of A in 0.5 s exceed
      // burst + perSecond × t = 1.5.
      let second = try await claim(store, limit: 10, now: 10.5)
      try expect(
        second.claimed.isEmpty,
        "a2 must wait for 11 s (a1 started at 10 s, one a second): claimed \(texts(second)) at 10.5 s")
    },
    check("key rates: a claim by a clock ahead does not forget buckets (1,100 keys, one due)") {
      store in
      guard store.keepsKeyLimits else { return }
      try await store.setLimits(QueueLimits(keyRate: RateLimit(perSecond: 1)), queue: "q")
      _ = try await store.enqueue(
        [limited("a1"), limited("h1", "H"), limited("h2", "H")]
          + (0..<1_100).map { limited("k\($0)", "k" + String(10_000 + $0)) }, queue: "q", clock: now(0))
      let first = try await claim(store, limit: 2_000, now: 10)
      try expect(first.claimed.count == 1_102, "one of each key: \(first.claimed.count)")
      _ = try await store.enqueue([limited("a2"), job("y1", priority: 5)], queue: "q", clock: now(10))
      // A worker whose clock is 10 s ahead claims y1.
      let ahead = try await claim(store, limit: 1, now: 20)
      try expect(texts(ahead) == ["y1"], "the worker ahead takes y1: \(texts(ahead))")
      // Back at 10.5 s: A's and H's buckets give no start before 11 s.
      let second = try await claim(store, limit: 10, now: 10.5)
      try expect(
        second.claimed.isEmpty,
        "no second start of A or H within 0.5 s of their first (one a second): claimed \(texts(second))")
    },
    check("key rates: a random run claims what the in-memory store claims") { store in
      guard store.keepsKeyLimits else { return }
      let postgres = String(describing: type(of: store)).contains("Postgres")
      for round in 0..<6 {
        let queue = "q"
        _ = queue
        let reference = InMemoryJobStore()
        if round > 0 {
          // A fresh queue on the store under test for each round.
          for text in try await store.jobs(queue: "q", status: nil, after: nil, limit: 100_000) {
            _ = try await store.remove([text.id], queue: "q")
          }
          try await store.setLimits(QueueLimits(), queue: "q")
        }
        var seed: UInt64 = 0x9E37_79B9_7F4A_7C15 &+ UInt64(round) &* 7_919
        func next(_ bound: Int) -> Int {
          seed = seed &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
          return Int((seed >> 33) % UInt64(bound))
        }
        let limits = QueueLimits(
          keyConcurrency: 2, keyRate: RateLimit(perSecond: 2, burst: 2),
          keyRateOverrides: [
            "B": RateLimit(perSecond: 0.5, burst: 1), "C": RateLimit(perSecond: 5, burst: 3),
          ])
        for target in [store, reference as any JobStore] { try await target.setLimits(limits, queue: "q") }
        var ids: [[String: JobID]] = [[:], [:]]
        var running: [[String: JobRecord]] = [[:], [:]]
        var counter = 0
        var time = 1.0
        for step in 0..<120 {
          let op = next(10)
          if op < 3 {
            var jobs: [NewJob] = []
            for _ in 0..<(1 + next(4)) {
              counter += 1
              let key = ["A", "B", "C", "D", nil][next(5)]
              let text = "j\(counter)"
              jobs.append(
                key.map { limited(text, $0, priority: next(3), at: time - 1) }
                  ?? job(text, priority: next(3), at: time - 1))
            }
            for (index, target) in [store, reference as any JobStore].enumerated() {
              let added = try await target.enqueue(jobs, queue: "q", clock: now(time))
              for (job, result) in zip(jobs, added) {
                ids[index][String(decoding: job.payload, as: UTF8.self)] = result.id
              }
            }
          } else if op == 3, counter > 0 {
            let text = "j\(1 + next(counter))"
            for (index, target) in [store, reference as any JobStore].enumerated() {
              if let id = ids[index][text] { _ = try await target.cancel([id], queue: "q", clock: now(time)) }
            }
          } else if op == 4, step % 7 == 0 {
            for target in [store, reference as any JobStore] {
              try await target.setLimits(limits, queue: "q")
            }
          } else {
            let texts0 = running[0].keys.sorted().filter { _ in next(2) == 0 }
            let retry = next(3) == 0
            var answers: [[String]] = []
            for (index, target) in [store, reference as any JobStore].enumerated() {
              let settling = texts0.compactMap { running[index][$0] }.map {
                settle($0, retry ? .retry(after: .zero, error: nil) : .complete)
              }
              for text in texts0 { running[index][text] = nil }
              let batch = try await target.settleAndClaim(
                settling, queue: "q", limit: 1 + step % 4, lease: lease(), clock: now(time))
              for record in batch.claimed { running[index][text(record)] = record }
              answers.append(texts(batch))
            }
            try expect(
              answers[0] == answers[1],
              "round \(round) step \(step) at \(time) s: \(answers[0]) vs in-memory \(answers[1])")
            if !postgres {
              let held = try await heldByLimit(store).sorted()
              let expected = try await heldByLimit(reference).sorted()
              try expect(
                held == expected, "round \(round) step \(step): held \(held) vs in-memory \(expected)")
            }
          }
          time += [0.1, 0.25, 0.5, 1, 0.05, 3][next(6)]
        }
      }
    },
    check("key rates: canonically equivalent keys have buckets and overrides of their own") {
      store in
      guard store.keepsKeyLimits else { return }
      let composed = "caf\u{E9}"
      let decomposed = "cafe\u{301}"
      try await store.setLimits(
        QueueLimits(keyRateOverrides: [composed: RateLimit(perSecond: RateLimit.minimumPerSecond)]),
        queue: "q")
      let stored = try await store.limits(queue: "q")
      try expect(
        stored.keyRateOverrides.keys.map { Array($0.utf8) } == [Array(composed.utf8)],
        "the override's bytes kept: \(stored)")
      _ = try await store.enqueue(
        [
          limited("c1", composed), limited("c2", composed), limited("d1", decomposed),
          limited("d2", decomposed),
        ],
        queue: "q", clock: now(0))
      let first = try await claim(store, limit: 10, now: 1)
      try expect(texts(first) == ["c1", "d1", "d2"], "the decomposed key has no rate: \(texts(first))")
      let held = try await heldByLimit(store)
      try expect(held == ["c2"], "c2 held: \(held)")
      // The same rate for both spellings: a bucket each.
      try await store.setLimits(QueueLimits(keyRate: RateLimit(perSecond: 1)), queue: "r")
      _ = try await store.enqueue(
        [
          limited("c1", composed), limited("c2", composed), limited("d1", decomposed),
          limited("d2", decomposed),
        ],
        queue: "r", clock: now(0))
      let other = try await claim(store, "r", limit: 10, now: 1)
      try expect(texts(other) == ["c1", "d1"], "one start of each spelling: \(texts(other))")
      let usage = try await store.limitKeyUsage(queue: "r", limit: 10)
      try expect(
        usage.map { Array($0.key.utf8) } == [Array(decomposed.utf8), Array(composed.utf8)]
          && usage.allSatisfy { $0.running == 1 && $0.held == 1 },
        "two rows, by bytes: \(usage.map { ($0.key.unicodeScalars.map(\.value), $0.running, $0.held) })")
    },
    check("key rates: claims of a key over time never exceed burst + perSecond × t") {
      store in
      guard store.keepsKeyLimits else { return }
      try await store.setLimits(
        QueueLimits(
          keyConcurrency: 4, keyRate: RateLimit(perSecond: 7, burst: 3),
          keyRateOverrides: ["B": RateLimit(perSecond: 2.5, burst: 2)]), queue: "q")
      var jobs: [NewJob] = []
      for index in 0..<60 {
        jobs.append(limited("a\(index)", "A", priority: index % 3))
        jobs.append(limited("b\(index)", "B", priority: index % 2))
      }
      _ = try await store.enqueue(jobs, queue: "q", clock: now(0))
      var starts: [String: [Double]] = [:]
      var running: [JobRecord] = []
      var time = 1.0
      var step = 0
      while time < 6 {
        // Settle half of what runs (alternately complete and retry at once), then claim.
        let settling = running.enumerated().filter { $0.offset % 2 == 0 }.map {
          settle($0.element, $0.offset % 4 == 0 ? .complete : .retry(after: .zero, error: nil))
        }
        let settled = Set(settling.map(\.claim.id))
        running.removeAll { settled.contains($0.id) }
        let batch = try await claim(store, limit: 1 + step % 5, settling: settling, now: time)
        for record in batch.claimed { starts[record.limitKey ?? "", default: []].append(time) }
        running += batch.claimed
        step += 1
        time += [0.013, 0.05, 0.0007, 0.11, 0.031][step % 5]
      }
      for (key, rate) in [
        ("A", RateLimit(perSecond: 7, burst: 3)), ("B", RateLimit(perSecond: 2.5, burst: 2)),
      ] {
        let times = starts[key] ?? []
        try expect(times.count > 5, "\(key) started: \(times.count)")
        for (i, start) in times.enumerated() {
          for end in times[i...] {
            let count = times.filter { $0 >= start && $0 <= end }.count
            let bound = Double(rate.burst) + rate.perSecond * (end - start) + 1e-6
            try expect(
              Double(count) <= bound, "\(key): \(count) starts from \(start) to \(end) (bound \(bound))")
          }
        }
      }
    },
    check("key rates: a held job replaced with a higher priority starts first") { store in
      guard store.keepsKeyLimits else { return }
      try await store.setLimits(QueueLimits(keyRate: RateLimit(perSecond: 1)), queue: "q")
      _ = try await store.enqueue(
        [limited("a1"), limited("a2"), limited("a3", dedup: "d")], queue: "q", clock: now(0))
      let first = try await claim(store, limit: 10, now: 1)
      try expect(texts(first) == ["a1"], "one: \(texts(first))")
      _ = try await store.enqueue(
        [limited("a3+", priority: 5, dedup: "d", onConflict: .replace)], queue: "q", clock: now(1.2))
      let early = try await claim(store, limit: 10, now: 1.5)
      try expect(early.claimed.isEmpty, "none before 2 s: \(texts(early))")
      let wake = try await store.nextWake(queue: "q", clock: now(1.5))
      try expect(wake.nextRun.map { $0 <= at(2) } ?? false, "due at 2 s: \(wake)")
      let second = try await claim(store, limit: 10, now: 2)
      try expect(texts(second) == ["a3+"], "the higher priority first: \(texts(second))")
      let third = try await claim(store, limit: 10, now: 3)
      try expect(texts(third) == ["a2"], "then a2: \(texts(third))")
    },
    check("key rates: one a day, bursts of a million; a million a second") { store in
      guard store.keepsKeyLimits else { return }
      try await store.setLimits(
        QueueLimits(
          keyRate: RateLimit(perSecond: RateLimit.minimumPerSecond, burst: 1),
          keyRateOverrides: [
            "fast": RateLimit(perSecond: RateLimit.maximumPerSecond, burst: RateLimit.maximumBurst),
            "wide": RateLimit(perSecond: RateLimit.minimumPerSecond, burst: RateLimit.maximumBurst),
          ]), queue: "q")
      _ = try await store.enqueue(
        [limited("s1", "slow"), limited("s2", "slow")] + (1...5).map { limited("f\($0)", "fast") }
          + (1...5).map { limited("w\($0)", "wide") }, queue: "q", clock: now(0))
      let first = try await claim(store, limit: 20, now: 1)
      try expect(first.claimed.count == 11, "all but s2: \(texts(first))")
      let wake = try await store.nextWake(queue: "q", clock: now(2))
      try expect(
        wake.nextRun.map { abs($0.timeIntervalSince(at(86_401))) < 0.01 } ?? false, "a day later: \(wake)")
      let early = try await claim(store, limit: 20, now: 86_400)
      try expect(early.claimed.isEmpty, "not before: \(texts(early))")
      let day = try await claim(store, limit: 20, now: 86_401)
      try expect(texts(day) == ["s2"], "then s2: \(texts(day))")
    },
  ]
}
