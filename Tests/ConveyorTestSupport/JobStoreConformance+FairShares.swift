import Conveyor
import Foundation

extension JobStoreConformance {
  /// A job with a fairness key.
  static func fair(
    _ text: String, _ key: String = "A", priority: Int = 0, at seconds: Double = 0, limitKey: String? = nil,
    dedup: String? = nil, onConflict: DeduplicationConflict = .useExisting
  ) -> NewJob {
    NewJob(
      payload: Data(text.utf8), priority: priority, runTime: .at(at(seconds)), deduplicationKey: dedup,
      onConflict: onConflict, limitKey: limitKey, fairnessKey: key)
  }

  /// A job as a random run's trace shows it: text, fairness key, priority, run time, limit key,
  /// deduplication key and conflict rule.
  static func describe(_ job: NewJob) -> String {
    let text = String(decoding: job.payload, as: UTF8.self)
    return "\(text)/\(job.fairnessKey ?? "-")/p\(job.priority)/\(job.runTime)/\(job.limitKey ?? "-")/"
      + "\(job.deduplicationKey ?? "-")/\(job.onConflict)"
  }

  /// Adds `jobs` to queue `q` one call each, at `seconds`.
  static func addEach(_ store: any JobStore, _ jobs: [NewJob], now seconds: Double = 0) async throws {
    for job in jobs { _ = try await store.enqueue([job], queue: "q", clock: now(seconds)) }
  }

  /// Fair shares (``NewJob/fairnessKey``), on every store that keeps them.
  static let fairShareChecks: [JobStoreCheck] = [
    check("fair shares: a store that keeps none refuses a fairness key and stores nothing of the call") {
      store in
      guard !store.keepsFairShares else { return }
      do {
        _ = try await store.enqueue([job("plain"), fair("a1")], queue: "q", clock: now(0))
        throw ConformanceFailure(description: "a fairness key was accepted by a store that keeps none")
      } catch JobQueueError.invalidFairnessKey(let message) {
        try expect(message.contains("fairness key"), "the error says what: \(message)")
      }
      let left = try await store.jobs(queue: "q", status: nil, after: nil, limit: 10)
      try expect(left.isEmpty, "nothing stored: \(left.map(text))")
    },
    check("fair shares: keys take turns, whenever each added its jobs; the key is stored") { store in
      guard store.keepsFairShares else { return }
      _ = try await store.enqueue((1...6).map { fair("a\($0)") }, queue: "q", clock: now(0))
      _ = try await store.enqueue([fair("b1", "B"), fair("b2", "B")], queue: "q", clock: now(0))
      _ = try await store.enqueue([fair("c1", "C")], queue: "q", clock: now(0))
      let stored = try await store.jobs(queue: "q", status: .pending, after: nil, limit: 100)
      try expect(stored.filter { $0.fairnessKey == "B" }.map(text) == ["b1", "b2"], "keys stored: \(stored)")
      let claimed = try await claim(store, limit: 20, now: 1)
      try expect(
        texts(claimed) == ["a1", "b1", "c1", "a2", "b2", "a3", "a4", "a5", "a6"],
        "round robin across keys: \(texts(claimed))")
      let record = try await store.job(claimed.claimed[1].id)
      try expect(record?.fairnessKey == "B", "the record keeps its key: \(String(describing: record))")
    },
    check("fair shares: a key that joins a backlog waits one job of each key in turn, not the backlog") {
      store in
      guard store.keepsFairShares else { return }
      try await addEach(store, (1...6).map { fair("a\($0)") })
      let first = try await claim(store, limit: 3, now: 1)
      try expect(texts(first) == ["a1", "a2", "a3"], "A's first three: \(texts(first))")
      try await addEach(store, [fair("b1", "B"), fair("b2", "B"), fair("c1", "C")], now: 2)
      let rest = try await claim(store, limit: 20, now: 3)
      try expect(texts(rest) == ["a4", "b1", "c1", "a5", "b2", "a6"], "B and C at the head: \(texts(rest))")
    },
    check("fair shares: within a priority; a higher priority still goes first") { store in
      guard store.keepsFairShares else { return }
      try await addEach(store, (1...3).map { fair("a\($0)") } + [fair("b1", "B", priority: 5)])
      try await addEach(store, [fair("b2", "B"), fair("c1", "C", priority: 5)])
      let claimed = try await claim(store, limit: 20, now: 1)
      try expect(
        texts(claimed) == ["b1", "c1", "a1", "b2", "a2", "a3"], "by priority, then turns: \(texts(claimed))")
    },
    check("fair shares: a job retried into the ready state takes its key's next turn") { store in
      guard store.keepsFairShares else { return }
      _ = try await store.enqueue(
        (1...3).map { fair("a\($0)") } + (1...3).map { fair("b\($0)", "B") }, queue: "q", clock: now(0))
      let first = try await claim(store, limit: 1, now: 1)
      try expect(texts(first) == ["a1"], "a1: \(texts(first))")
      let rest = try await claim(
        store, limit: 20, settling: [settle(first.claimed[0], .retry(after: .zero, error: "again"))], now: 2)
      try expect(texts(rest) == ["b1", "a2", "b2", "a3", "b3", "a1"], "a1 behind A's jobs: \(texts(rest))")
    },
    check("fair shares: a job whose run date comes takes its turn then, not its run date's place") { store in
      guard store.keepsFairShares else { return }
      _ = try await store.enqueue((1...4).map { fair("a\($0)") }, queue: "q", clock: now(0))
      _ = try await store.enqueue([fair("b1", "B", at: 10), job("x", at: 10)], queue: "q", clock: now(0))
      let first = try await claim(store, limit: 1, now: 1)
      try expect(texts(first) == ["a1"], "a1: \(texts(first))")
      // b1 comes due at 10 s behind A's three; its turn puts it after the next of A.
      let rest = try await claim(store, limit: 20, now: 20)
      try expect(texts(rest) == ["a2", "b1", "a3", "a4", "x"], "b1 at the head: \(texts(rest))")
      // A retry with a delay takes a turn when it comes due too.
      _ = try await store.enqueue((5...7).map { fair("a\($0)", at: 20) }, queue: "q", clock: now(20))
      let b = try await store.enqueue([fair("b2", "B", at: 20)], queue: "q", clock: now(20))
      let claimedB = try await claim(store, limit: 1, now: 20)
      try expect(texts(claimedB) == ["a5"], "a5 first (added first): \(texts(claimedB))")
      let second = try await claim(store, limit: 1, now: 20)
      try expect(second.claimed.map(\.id) == [b[0].id], "then b2: \(texts(second))")
      let later = try await claim(
        store, limit: 20, settling: [settle(second.claimed[0], .retry(after: .seconds(5), error: nil))],
        now: 21)
      try expect(texts(later) == ["a6", "a7"], "b2 waits: \(texts(later))")
      // Added at 30 s with an earlier run date, A's next turns come before b2's run date.
      _ = try await store.enqueue((8...9).map { fair("a\($0)", at: 20) }, queue: "q", clock: now(30))
      let last = try await claim(store, limit: 20, now: 30)
      try expect(texts(last) == ["b2", "a8", "a9"], "b2 takes its turn at the head: \(texts(last))")
    },
    check("fair shares: after the queue ran empty every key starts even, however far ahead its turns ran") {
      store in
      guard store.keepsFairShares else { return }
      // Ten turns of A, a millisecond each, run ahead of the clock: claimed at 5 ms.
      _ = try await store.enqueue((1...10).map { fair("a\($0)") }, queue: "q", clock: now(0))
      let all = try await claim(store, limit: 20, now: 0.005)
      try expect(all.claimed.count == 10, "A's ten: \(texts(all))")
      try await addEach(
        store, [fair("b1", "B", at: 0.005), fair("b2", "B", at: 0.005), fair("b3", "B", at: 0.005)],
        now: 0.005)
      try await addEach(store, [fair("a11", at: 0.005)], now: 0.005)
      let next = try await claim(store, limit: 20, now: 0.006)
      try expect(texts(next) == ["b1", "b2", "a11", "b3"], "A is not behind all of B: \(texts(next))")
    },
    check("fair shares: a job without a fairness key keeps its run date as its place") { store in
      guard store.keepsFairShares else { return }
      try await addEach(store, [job("x")] + (1...3).map { fair("a\($0)") } + [job("y", at: 0.001)])
      let claimed = try await claim(store, limit: 20, now: 1)
      try expect(
        texts(claimed) == ["x", "a1", "a2", "y", "a3"], "turns a millisecond apart: \(texts(claimed))")
    },
    check("fair shares: a job held by its limit key keeps its turn; limits and turns both bind") { store in
      guard store.keepsFairShares, store.keepsKeyLimits else { return }
      try await store.setLimits(QueueLimits(keyConcurrency: 1), queue: "q")
      _ = try await store.enqueue(
        [fair("a1", limitKey: "h"), fair("a2", limitKey: "h"), fair("a3")], queue: "q", clock: now(0))
      _ = try await store.enqueue([fair("b1", "B"), fair("b2", "B")], queue: "q", clock: now(0))
      let first = try await claim(store, limit: 20, now: 1)
      try expect(texts(first) == ["a1", "b1", "b2", "a3"], "a2 held by h's limit: \(texts(first))")
      let second = try await claim(
        store, limit: 20, settling: [settle(first.claimed[0], .complete)], now: 2)
      try expect(texts(second) == ["a2"], "then a2: \(texts(second))")
    },
    check("fair shares: bad keys and a fairness key with an ordering key are refused; nothing stored") {
      store in
      guard store.keepsFairShares else { return }
      _ = try await store.enqueue([fair("kept")], queue: "q", clock: now(0))
      let long = String(repeating: "k", count: FairnessKey.maximumBytes + 1)
      let bad: [NewJob] = [
        fair("empty", ""), fair("nul", "a\u{0}b"), fair("long", long),
        NewJob(payload: Data("ordered".utf8), orderingKey: "o", fairnessKey: "A"),
      ]
      for job in bad {
        do {
          _ = try await store.enqueue([fair("first"), job], queue: "q", clock: now(0))
          throw ConformanceFailure(description: "accepted: \(String(decoding: job.payload, as: UTF8.self))")
        } catch JobQueueError.invalidFairnessKey(let message) {
          try expect(message.contains("fairness key"), "the error says what: \(message)")
        }
      }
      let left = try await store.jobs(queue: "q", status: nil, after: nil, limit: 100)
      try expect(left.map(text) == ["kept"], "nothing of a refused call stored: \(left.map(text))")
    },
    check("fair shares: a replaced waiting job takes a turn again, or none while it is scheduled") { store in
      guard store.keepsFairShares else { return }
      _ = try await store.enqueue(
        [fair("a1"), fair("a2"), fair("b1", "B", dedup: "d"), fair("b2", "B")], queue: "q", clock: now(0))
      let replaced = try await store.enqueue(
        [fair("b1'", "B", dedup: "d", onConflict: .replace)], queue: "q", clock: now(0))
      try expect(replaced.first?.outcome == .replaced, "replaced: \(replaced)")
      let claimed = try await claim(store, limit: 20, now: 1)
      try expect(texts(claimed) == ["a1", "a2", "b2", "b1'"], "b1' takes B's next turn: \(texts(claimed))")
      _ = try await store.enqueue([fair("a3"), fair("b3", "B", dedup: "e")], queue: "q", clock: now(2))
      _ = try await store.enqueue(
        [fair("b3'", "B", at: 5, dedup: "e", onConflict: .replace)], queue: "q", clock: now(2))
      _ = try await store.enqueue([fair("a4", at: 2)], queue: "q", clock: now(2))
      let later = try await claim(store, limit: 20, now: 6)
      try expect(texts(later) == ["a3", "a4", "b3'"], "due at 5 s, it takes a turn then: \(texts(later))")
    },
    check("fair shares: dead jobs re-queued by ID take their turns in ID order") { store in
      guard store.keepsFairShares else { return }
      // FairTurns: re-queued "by one call as the re-queue takes them"; the in-memory and SQLite
      // stores take the IDs given in ID order, with or without a deduplication key.
      let added = try await store.enqueue(
        [fair("a1", dedup: "d"), fair("a2"), fair("a3", dedup: "e"), fair("a4")], queue: "q", clock: now(0))
      let running = try await claim(store, limit: 4, now: 0)
      try expect(texts(running) == ["a1", "a2", "a3", "a4"], "all four: \(texts(running))")
      _ = try await claim(
        store, limit: 0, settling: running.claimed.map { settle($0, .kill(error: "x")) }, now: 1)
      let count = try await store.requeueDead(added.map(\.id), queue: "q", clock: now(2))
      try expect(count == 4, "four re-queued: \(count)")
      let claimed = try await claim(store, limit: 20, now: 3)
      try expect(texts(claimed) == ["a1", "a2", "a3", "a4"], "in ID order: \(texts(claimed))")
    },
    check("fair shares: a random run with give-backs, lapsed leases, kills, re-queues and clock steps agrees")
    {
      store in
      guard store.keepsFairShares else { return }
      for round in 0..<12 {
        let reference = InMemoryJobStore()
        let queue = "g\(round)"
        var seed: UInt64 = 0x9E37_79B9_7F4A_7C15 &+ UInt64(round) &* 1_000_003
        func next(_ bound: Int) -> Int {
          seed = seed &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
          return Int((seed >> 33) % UInt64(bound))
        }
        let targets: [any JobStore] = [store, reference]
        if store.keepsKeyLimits {
          for target in targets { try await target.setLimits(QueueLimits(keyConcurrency: 1), queue: queue) }
        }
        var ids: [[String: JobID]] = [[:], [:]]
        var running: [[String: JobRecord]] = [[:], [:]]
        var counter = 0
        var time = 1.0
        var trace: [String] = []
        for step in 0..<120 {
          let op = next(14)
          if op < 5 {
            var jobs: [NewJob] = []
            for _ in 0..<(1 + next(3)) {
              counter += 1
              let text = "j\(counter)"
              let key = ["T1", "T2", "T3", nil][next(4)]
              let runAt = [time - 1, time, time - 0.002, time + 0.3, time + 1][next(5)]
              let limitKey = store.keepsKeyLimits && next(3) == 0 ? ["h", "i"][next(2)] : nil
              let dedup = next(5) == 0 ? "d\(next(3))" : nil
              jobs.append(
                NewJob(
                  payload: Data(text.utf8), priority: next(3), runTime: .at(at(runAt)),
                  deduplicationKey: dedup,
                  onConflict: next(2) == 0 ? .replace : .useExisting, limitKey: limitKey, fairnessKey: key))
            }
            trace.append("\(step) at \(time) s: add \(jobs.map(describe))")
            for (index, target) in targets.enumerated() {
              let added = try await target.enqueue(jobs, queue: queue, clock: now(time))
              if index == 0 { trace.append("  \(added.map(\.outcome))") }
              for (job, result) in zip(jobs, added) where result.outcome == .inserted {
                ids[index][String(decoding: job.payload, as: UTF8.self)] = result.id
              }
            }
          } else if op == 5, counter > 0 {
            let text = "j\(1 + next(counter))"
            trace.append("\(step) at \(time) s: cancel \(text)")
            for (index, target) in targets.enumerated() {
              if let id = ids[index][text] {
                _ = try await target.cancel([id], queue: queue, clock: now(time))
                running[index][text] = nil
              }
            }
          } else if op == 6 {
            trace.append("\(step) at \(time) s: re-queue every dead job")
            var counts: [Int] = []
            for target in targets {
              counts.append(try await target.requeueDead(nil, queue: queue, clock: now(time)))
            }
            trace.append("  \(counts)")
          } else if op == 7 {
            // Leases lapse: every running job is handed out again (60-s leases).
            time += 61
            trace.append("\(step) at \(time) s: rescue")
            var counts: [Int] = []
            for (index, target) in targets.enumerated() {
              counts.append(try await target.rescueExpiredLeases(queue: queue, clock: now(time)))
              running[index] = [:]
            }
            trace.append("  \(counts)")
          } else {
            let chosen = Array(running[0].keys.sorted().filter { _ in next(2) == 0 }.prefix(1))
            let action: JobSettlement.Action = [
              .complete, .retry(after: .zero, error: nil), .retry(after: .seconds(1), error: nil),
              .release(error: nil), .kill(error: "dead"),
            ][next(5)]
            var answers: [[String]] = []
            trace.append("\(step) at \(time) s: settle \(chosen) \(action), claim \(1 + step % 3)")
            for (index, target) in targets.enumerated() {
              let settling = chosen.compactMap { running[index][$0] }.map { settle($0, action) }
              for text in chosen { running[index][text] = nil }
              let batch = try await target.settleAndClaim(
                settling, queue: queue, limit: 1 + step % 3, lease: lease(), clock: now(time))
              for record in batch.claimed { running[index][text(record)] = record }
              answers.append(texts(batch))
            }
            trace.append("  \(answers[0]) / \(answers[1])")
            try expect(
              answers[0] == answers[1],
              "round \(round) step \(step) at \(time) s: \(answers[0]) vs in-memory \(answers[1]); the run:\n"
                + trace.joined(separator: "\n"))
          }
          // Now and then the clock steps back a little.
          time += [0.001, 0.002, 0.1, 0.5, 1, -0.05][next(6)]
        }
      }
    },
    check(
      "fair shares: a replaced job held by its limit key takes its turn after the other jobs' head, not its own"
    ) {
      store in
      guard store.keepsFairShares, store.keepsKeyLimits else { return }
      try await store.setLimits(QueueLimits(keyConcurrency: 1), queue: "q")
      _ = try await store.enqueue(
        [NewJob(payload: Data("r".utf8), runTime: .at(at(0)), limitKey: "h")], queue: "q", clock: now(0))
      let running = try await claim(store, limit: 1, now: 0)
      try expect(texts(running) == ["r"], "r runs, h at its limit: \(texts(running))")
      // a1 takes turn 0 and is held by h's limit.
      _ = try await store.enqueue([fair("a1", limitKey: "h", dedup: "d")], queue: "q", clock: now(0))
      let none = try await claim(store, limit: 1, now: 0)
      try expect(none.claimed.isEmpty, "a1 held: \(texts(none))")
      try await addEach(store, [job("y", at: 0.005), job("x", at: 0.010)], now: 0.010)
      // Replaced, a1 takes a new turn: the head is the first *other* waiting job (y, 5 ms).
      let replaced = try await store.enqueue(
        [fair("a1'", at: 0.010, limitKey: "h", dedup: "d", onConflict: .replace)], queue: "q",
        clock: now(0.010))
      try expect(replaced.first?.outcome == .replaced, "replaced: \(replaced)")
      // B joins at the head, 5 ms, behind y (added first).
      try await addEach(store, [fair("b1", "B", at: 0.010)], now: 0.010)
      let claimed = try await claim(store, limit: 3, now: 0.010)
      try expect(texts(claimed) == ["y", "b1", "x"], "b1 at the head, a1' held again: \(texts(claimed))")
    },
    check("fair shares: a random run claims what the in-memory store claims") { store in
      guard store.keepsFairShares else { return }
      for round in 0..<4 {
        let reference = InMemoryJobStore()
        let queue = "f\(round)"
        var seed: UInt64 = 0xD1B5_4A32_D192_ED03 &+ UInt64(round) &* 104_729
        func next(_ bound: Int) -> Int {
          seed = seed &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
          return Int((seed >> 33) % UInt64(bound))
        }
        let targets: [any JobStore] = [store, reference]
        if store.keepsKeyLimits {
          for target in targets { try await target.setLimits(QueueLimits(keyConcurrency: 2), queue: queue) }
        }
        var ids: [[String: JobID]] = [[:], [:]]
        var running: [[String: JobRecord]] = [[:], [:]]
        var counter = 0
        var time = 1.0
        var trace: [String] = []
        for step in 0..<150 {
          let op = next(10)
          if op < 4 {
            var jobs: [NewJob] = []
            for _ in 0..<(1 + next(4)) {
              counter += 1
              let text = "j\(counter)"
              let key = ["T1", "T2", "T3", "T4", nil][next(5)]
              let runAt = [time - 1, time - 1, time - 1, time + 0.5, time + 2][next(5)]
              let limitKey = store.keepsKeyLimits && next(4) == 0 ? "h" : nil
              let dedup = next(6) == 0 ? "d\(next(3))" : nil
              jobs.append(
                NewJob(
                  payload: Data(text.utf8), priority: next(2), runTime: .at(at(runAt)),
                  deduplicationKey: dedup,
                  onConflict: next(2) == 0 ? .replace : .useExisting, limitKey: limitKey, fairnessKey: key))
            }
            trace.append("\(step) at \(time) s: add \(jobs.map(describe))")
            for (index, target) in targets.enumerated() {
              let added = try await target.enqueue(jobs, queue: queue, clock: now(time))
              if index == 0 { trace.append("  \(added.map(\.outcome))") }
              for (job, result) in zip(jobs, added) where result.outcome == .inserted {
                ids[index][String(decoding: job.payload, as: UTF8.self)] = result.id
              }
            }
          } else if op == 4, counter > 0 {
            let text = "j\(1 + next(counter))"
            trace.append("\(step) at \(time) s: cancel \(text)")
            for (index, target) in targets.enumerated() {
              if let id = ids[index][text] {
                _ = try await target.cancel([id], queue: queue, clock: now(time))
              }
            }
          } else {
            // One job a call: the order in which several jobs settled by one call take their
            // turns is each store's own (see `FairTurns`); `FairSharesTests` checks SQLite's
            // batches against the in-memory store's.
            let chosen = Array(running[0].keys.sorted().filter { _ in next(2) == 0 }.prefix(1))
            let action: JobSettlement.Action = [
              .complete, .retry(after: .zero, error: nil), .retry(after: .seconds(1), error: nil),
            ][next(3)]
            var answers: [[String]] = []
            trace.append("\(step) at \(time) s: settle \(chosen) \(action), claim \(1 + step % 3)")
            for (index, target) in targets.enumerated() {
              let settling = chosen.compactMap { running[index][$0] }.map { settle($0, action) }
              for text in chosen { running[index][text] = nil }
              let batch = try await target.settleAndClaim(
                settling, queue: queue, limit: 1 + step % 3, lease: lease(), clock: now(time))
              for record in batch.claimed { running[index][text(record)] = record }
              answers.append(texts(batch))
            }
            trace.append("  \(answers[0]) / \(answers[1])")
            try expect(
              answers[0] == answers[1],
              "round \(round) step \(step) at \(time) s: \(answers[0]) vs in-memory \(answers[1]); the run:\n"
                + trace.joined(separator: "\n"))
          }
          time += [0.001, 0.1, 0.25, 0.5, 1, 3][next(6)]
        }
      }
    },
  ]
}
