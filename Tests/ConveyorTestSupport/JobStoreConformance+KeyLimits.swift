import Conveyor
import Foundation

extension JobStoreConformance {
  /// A job with a limit key.
  static func limited(
    _ text: String, _ key: String = "A", priority: Int = 0, at seconds: Double = 0,
    orderingKey: String? = nil,
    dedup: String? = nil, onConflict: DeduplicationConflict = .useExisting
  ) -> NewJob {
    NewJob(
      payload: Data(text.utf8), priority: priority, runTime: .at(at(seconds)), deduplicationKey: dedup,
      onConflict: onConflict, orderingKey: orderingKey, limitKey: key)
  }

  /// The jobs of queue `q` held for their key's limit, by payload.
  static func heldByLimit(_ store: any JobStore) async throws -> [String] {
    try await store.jobs(queue: "q", status: .pending, after: nil, limit: 1_000).filter(\.isHeldByLimit).map(
      text)
  }

  /// Limits per key (``QueueLimits/keyConcurrency``), on every store that keeps them.
  static let keyLimitChecks: [JobStoreCheck] = [
    check("key limits: stored with the queue, overrides and all, and replaced whole") { store in
      guard store.keepsKeyLimits else { return }
      let limits = QueueLimits(
        concurrency: 9, keyConcurrency: 2, keyConcurrencyOverrides: ["api.example.com": 5, "ünï cödé": 1])
      try await store.setLimits(limits, queue: "q")
      let stored = try await store.limits(queue: "q")
      try expect(stored == limits, "stored as given: \(stored)")
      try await store.setLimits(QueueLimits(keyConcurrencyOverrides: ["b": 3]), queue: "q")
      let replaced = try await store.limits(queue: "q")
      try expect(replaced == QueueLimits(keyConcurrencyOverrides: ["b": 3]), "replaced whole: \(replaced)")
      try await store.setLimits(QueueLimits(keyConcurrency: 1), queue: "only-keys")
      let listed = try await store.queueNames()
      try expect(listed.contains("only-keys"), "a queue with only a key limit is listed: \(listed)")
      try await store.setLimits(QueueLimits(), queue: "only-keys")
      let after = try await store.queueNames()
      try expect(!after.contains("only-keys"), "not once it is removed: \(after)")
    },
    check("key limits: limits out of range and bad keys are refused, the stored ones kept") { store in
      guard store.keepsKeyLimits else { return }
      let good = QueueLimits(keyConcurrency: 2, keyConcurrencyOverrides: ["a": 4])
      try await store.setLimits(good, queue: "q")
      let tooMany = Dictionary(
        uniqueKeysWithValues: (0...QueueLimits.maximumKeyOverrides).map { ("k\($0)", 1) })
      let bad: [QueueLimits] = [
        QueueLimits(keyConcurrency: 0), QueueLimits(keyConcurrency: -1),
        QueueLimits(keyConcurrency: QueueLimits.maximumConcurrency + 1),
        QueueLimits(keyConcurrencyOverrides: ["a": 0]), QueueLimits(keyConcurrencyOverrides: ["": 1]),
        QueueLimits(keyConcurrencyOverrides: ["a\u{0}b": 1]),
        QueueLimits(keyConcurrencyOverrides: [String(repeating: "x", count: LimitKey.maximumBytes + 1): 1]),
        QueueLimits(keyConcurrencyOverrides: tooMany),
      ]
      for limits in bad {
        do {
          try await store.setLimits(limits, queue: "q")
          throw ConformanceFailure(description: "\(limits.keyConcurrencyOverrides.count) overrides accepted")
        } catch JobQueueError.invalidLimits(let message) {
          try expect(!message.isEmpty, "the error says what is wrong")
        }
      }
      let kept = try await store.limits(queue: "q")
      try expect(kept == good, "the stored limits are kept: \(kept)")
    },
    check("key limits: a bad limit key is refused and nothing of the call stored") { store in
      guard store.keepsKeyLimits else { return }
      for key in ["", "a\u{0}b", String(repeating: "é", count: LimitKey.maximumBytes / 2 + 1)] {
        do {
          _ = try await store.enqueue([job("fine"), limited("bad", key)], queue: "q", clock: now(0))
          throw ConformanceFailure(description: "limit key of \(key.utf8.count) bytes accepted")
        } catch JobQueueError.invalidLimitKey(let message) {
          try expect(message.contains("limit key"), "the error names the limit key: \(message)")
        }
      }
      let counts = try await store.counts(queue: "q", clock: now(0))
      try expect(counts == JobCounts(), "nothing stored: \(counts)")
    },
    check("key limits: a claim takes no more of a key than its limit and holds the rest; other keys run") {
      store in
      guard store.keepsKeyLimits else { return }
      try await store.setLimits(QueueLimits(keyConcurrency: 2, keyConcurrencyOverrides: ["B": 1]), queue: "q")
      _ = try await store.enqueue(
        [
          limited("a1"), limited("a2"), limited("a3"), limited("b1", "B"), limited("b2", "B"), job("free"),
          limited("a4"),
          limited("c1", "C"),
        ], queue: "q", clock: now(0))
      let first = try await claim(store, limit: 10, now: 1)
      try expect(
        texts(first) == ["a1", "a2", "b1", "free", "c1"], "two of A, one of B, the rest: \(texts(first))")
      try expect(first.claimed.first?.limitKey == "A", "a claimed job carries its key")
      let held = try await heldByLimit(store)
      try expect(held == ["a3", "b2", "a4"], "the others of full keys are held: \(held)")
      let counts = try await store.counts(queue: "q", clock: now(1))
      try expect(counts == JobCounts(running: 5, held: 3), "held, not ready: \(counts)")
      let record = try await store.job(first.claimed[0].id)
      try expect(
        record?.limitKey == "A" && record?.isHeldByLimit == false, "stored key: \(String(describing: record))"
      )
      let none = try await claim(store, limit: 10, now: 2)
      try expect(none.claimed.isEmpty, "nothing while the keys are full: \(texts(none))")
      let wake = try await store.nextWake(queue: "q", clock: now(2))
      try expect(wake.nextRun == nil, "held jobs need no worker: \(wake)")
      // a1 completes: one place of A, taken by the first held job of A (claim order).
      let next = try await claim(store, limit: 10, settling: [settle(first.claimed[0], .complete)], now: 3)
      try expect(texts(next) == ["a3"], "a3 takes a1's place: \(texts(next))")
      let stillHeld = try await heldByLimit(store)
      try expect(stillHeld == ["b2", "a4"], "a4 still held: \(stillHeld)")
    },
    check("key limits: the usage per key counts running and held jobs, most held first, bytes apart") {
      store in
      guard store.keepsKeyLimits else { return }
      let usageBefore = try await store.limitKeyUsage(queue: "q", limit: 10)
      try expect(usageBefore.isEmpty, "no key before any job: \(usageBefore)")
      // "é" precomposed and decomposed are two keys; "Z" and a job without a key run unbounded.
      let composed = "\u{E9}"
      let decomposed = "e\u{301}"
      try await store.setLimits(
        QueueLimits(keyConcurrency: 1, keyConcurrencyOverrides: ["A": 2, "Z": 5]), queue: "q")
      _ = try await store.enqueue(
        [
          limited("a1"), limited("a2"), limited("a3"), limited("a4"), limited("a5"),
          limited("c1", composed), limited("c2", composed), limited("d1", decomposed),
          limited("z1", "Z"), job("free"),
        ], queue: "q", clock: now(0))
      _ = try await claim(store, limit: 20, now: 1)
      _ = try await store.enqueue([limited("other", "q2")], queue: "q2", clock: now(1))
      let usage = try await store.limitKeyUsage(queue: "q", limit: 10)
      try expect(
        usage == [
          LimitKeyUsage(key: "A", running: 2, held: 3), LimitKeyUsage(key: composed, running: 1, held: 1),
          LimitKeyUsage(key: "Z", running: 1, held: 0), LimitKeyUsage(key: decomposed, running: 1, held: 0),
        ], "by held, then running, then bytes (\"Z\" is 0x5A, \"e\" 0x65): \(usage)")
      let first = try await store.limitKeyUsage(queue: "q", limit: 2)
      try expect(first == Array(usage.prefix(2)), "the first two: \(first)")
      let none = try await store.limitKeyUsage(queue: "q", limit: 0)
      try expect(none.isEmpty, "a limit of 0 reads nothing: \(none)")
      let elsewhere = try await store.limitKeyUsage(queue: "q2", limit: 10)
      try expect(
        elsewhere.isEmpty, "a waiting job of another queue is neither running nor held: \(elsewhere)")
    },
    check("key limits: every way a job stops running gives its key's place to a held job") { store in
      guard store.keepsKeyLimits else { return }
      try await store.setLimits(QueueLimits(keyConcurrency: 1), queue: "q")
      let ways = ["complete", "retry", "kill", "release", "cancel", "remove", "rescue"]
      for (index, way) in ways.enumerated() {
        let key = "K\(index)"
        let base = Double(index * 100)
        _ = try await store.enqueue(
          [limited("\(way)-1", key, at: base), limited("\(way)-2", key, at: base)], queue: "q",
          clock: now(base))
        let running = try await claim(store, limit: 10, now: base + 1, leaseFor: 10)
        try expect(texts(running) == ["\(way)-1"], "\(way): one runs: \(texts(running))")
        let one = running.claimed[0]
        let heldNow = try await heldByLimit(store)
        try expect(heldNow == ["\(way)-2"], "\(way): the second is held: \(heldNow)")
        var settling: [JobSettlement] = []
        switch way {
        case "complete": settling = [settle(one, .complete)]
        case "retry": settling = [settle(one, .retry(after: .seconds(100_000), error: "again"))]
        case "kill": settling = [settle(one, .kill(error: "dead"))]
        case "release": settling = [settle(one, .release(error: nil))]
        case "cancel": _ = try await store.cancel([one.id], queue: "q", clock: now(base + 2))
        case "remove": _ = try await store.remove([one.id], queue: "q")
        default: _ = try await store.rescueExpiredLeases(queue: "q", clock: now(base + 20))
        }
        let after = try await claim(store, limit: 10, settling: settling, now: base + 30)
        let expected = way == "release" || way == "rescue" ? ["\(way)-1"] : ["\(way)-2"]
        try expect(texts(after) == expected, "\(way): the key's place is taken again: \(texts(after))")
        if way == "release" || way == "rescue" {
          // The job given back went first (its old place); the held one waits for it.
          let still = try await heldByLimit(store)
          try expect(still == ["\(way)-2"], "\(way): the second is held again: \(still)")
          let end = try await claim(
            store, limit: 10, settling: [settle(after.claimed[0], .complete)], now: base + 31)
          try expect(texts(end) == ["\(way)-2"], "\(way): then the second: \(texts(end))")
          _ = try await claim(store, limit: 10, settling: [settle(end.claimed[0], .complete)], now: base + 32)
        } else {
          _ = try await claim(
            store, limit: 10, settling: [settle(after.claimed[0], .complete)], now: base + 32)
        }
        let left = try await heldByLimit(store)
        try expect(left.isEmpty, "\(way): none held at the end: \(left)")
      }
    },
    check("key limits: setting limits again makes every held job claimable; a raised limit takes more") {
      store in
      guard store.keepsKeyLimits else { return }
      try await store.setLimits(QueueLimits(keyConcurrency: 1), queue: "q")
      _ = try await store.enqueue((1...4).map { limited("a\($0)") }, queue: "q", clock: now(0))
      let first = try await claim(store, limit: 10, now: 1)
      try expect(texts(first) == ["a1"], "one: \(texts(first))")
      let held = try await heldByLimit(store)
      try expect(held == ["a2", "a3", "a4"], "three held: \(held)")
      try await store.setLimits(QueueLimits(keyConcurrency: 1, keyConcurrencyOverrides: ["A": 3]), queue: "q")
      let none = try await heldByLimit(store)
      try expect(none.isEmpty, "none held once the limits are set again: \(none)")
      let more = try await claim(store, limit: 10, now: 2)
      try expect(texts(more) == ["a2", "a3"], "two more under the override: \(texts(more))")
      try await store.setLimits(QueueLimits(), queue: "q")
      let rest = try await claim(store, limit: 10, now: 3)
      try expect(texts(rest) == ["a4"], "no limit: the rest: \(texts(rest))")
    },
    check(
      "key limits: a held job replaced by a duplicate is no longer held; an ordered head keeps its key's order"
    ) { store in
      guard store.keepsKeyLimits else { return }
      try await store.setLimits(QueueLimits(keyConcurrency: 1), queue: "q")
      _ = try await store.enqueue(
        [
          limited("a1"), limited("a2", dedup: "d"), limited("o1", orderingKey: "O"),
          limited("o2", orderingKey: "O"),
        ],
        queue: "q", clock: now(0))
      let first = try await claim(store, limit: 10, now: 1)
      try expect(texts(first) == ["a1"], "one of A: \(texts(first))")
      let held = try await heldByLimit(store)
      try expect(held == ["a2", "o1"], "a2 and the head of O held for A: \(held)")
      let replaced = try await store.enqueue(
        [limited("a2'", dedup: "d", onConflict: .replace)], queue: "q", clock: now(2))
      try expect(replaced.first?.outcome == .replaced, "replaced: \(replaced)")
      let afterReplace = try await heldByLimit(store)
      try expect(afterReplace == ["o1"], "the replaced job is not held for the limit: \(afterReplace)")
      // a1 completes: a2' (claimable) and o1 (made claimable) compete in claim order; o2 waits behind o1.
      let next = try await claim(store, limit: 10, settling: [settle(first.claimed[0], .complete)], now: 3)
      try expect(texts(next) == ["a2'"], "the first in claim order: \(texts(next))")
      let end = try await claim(store, limit: 10, settling: [settle(next.claimed[0], .complete)], now: 4)
      try expect(texts(end) == ["o1"], "then the ordered head: \(texts(end))")
      let last = try await claim(store, limit: 10, settling: [settle(end.claimed[0], .complete)], now: 5)
      try expect(texts(last) == ["o2"], "then its successor: \(texts(last))")
    },
    check(
      "key limits: a job a stop made claimable that is cancelled or removed before it runs passes its place on"
    ) { store in
      guard store.keepsKeyLimits else { return }
      try await store.setLimits(QueueLimits(keyConcurrency: 1), queue: "q")
      for (index, way) in ["cancel", "remove"].enumerated() {
        let key = "K\(index)"
        let base = Double(index * 100)
        let added = try await store.enqueue(
          [
            limited("\(way)-1", key, at: base), limited("\(way)-2", key, at: base),
            limited("\(way)-3", key, at: base),
          ],
          queue: "q", clock: now(base))
        let first = try await claim(store, limit: 10, now: base + 1)
        try expect(texts(first) == ["\(way)-1"], "\(way): one runs: \(texts(first))")
        // It completes without a claim after it: the second is claimable again.
        _ = try await claim(store, limit: 0, settling: [settle(first.claimed[0], .complete)], now: base + 2)
        let afterStop = try await heldByLimit(store)
        try expect(afterStop == ["\(way)-3"], "\(way): the second made claimable: \(afterStop)")
        if way == "cancel" {
          _ = try await store.cancel([added[1].id], queue: "q", clock: now(base + 3))
        } else {
          _ = try await store.remove([added[1].id], queue: "q")
        }
        // Nothing of the key runs: the third must not wait for a stop that never comes.
        let next = try await claim(store, limit: 10, now: base + 4)
        try expect(texts(next) == ["\(way)-3"], "\(way): the third runs: \(texts(next))")
        _ = try await claim(store, limit: 0, settling: [settle(next.claimed[0], .complete)], now: base + 5)
      }
    },
    check("key limits: keys are compared byte for byte, overrides too") { store in
      guard store.keepsKeyLimits else { return }
      // The precomposed "é" has a limit of 1; the decomposed spelling is another key, with none.
      try await store.setLimits(QueueLimits(keyConcurrencyOverrides: ["\u{E9}": 1]), queue: "q")
      _ = try await store.enqueue(
        [
          limited("d1", "e\u{301}"), limited("d2", "e\u{301}"), limited("p1", "\u{E9}"),
          limited("p2", "\u{E9}"),
        ],
        queue: "q", clock: now(0))
      let first = try await claim(store, limit: 10, now: 1)
      try expect(texts(first) == ["d1", "d2", "p1"], "the decomposed key is not bound: \(texts(first))")
    },
    check("key limits: every kind of add stores the job's limit key") { store in
      guard store.keepsKeyLimits else { return }
      var batches: [[NewJob]] = [
        [NewJob(payload: Data("one".utf8), limitKey: "L1")],
        [NewJob(payload: Data("dedup".utf8), deduplicationKey: "d1", limitKey: "L2")],
        [
          NewJob(
            payload: Data("scope".utf8), deduplicationKey: "d2",
            deduplicationScope: .completedWithin(.seconds(60)),
            limitKey: "L3")
        ],
        [NewJob(payload: Data("replace".utf8), deduplicationKey: "d3", onConflict: .replace, limitKey: "L4")],
        [NewJob(payload: Data("later".utf8), runTime: .after(.seconds(5)), limitKey: "L5")],
        [NewJob(payload: Data("u1".utf8), limitKey: "L6"), NewJob(payload: Data("u2".utf8), limitKey: "L6")],
        [NewJob(payload: Data("mixed1".utf8)), NewJob(payload: Data("mixed2".utf8), limitKey: "L7")],
        [NewJob(payload: Data("ordered".utf8), orderingKey: "O", limitKey: "L8")],
      ]
      batches.append((0..<300).map { NewJob(payload: Data("big\($0)".utf8), limitKey: "L9") })
      for batch in batches {
        let results = try await store.enqueue(batch, queue: "q", clock: now(0))
        for (job, result) in zip(batch, results) {
          let record = try await store.job(result.id)
          try expect(
            record?.limitKey == job.limitKey,
            "\(String(decoding: job.payload, as: UTF8.self)): stored \(String(describing: record?.limitKey))")
        }
      }
    },
    check("key limits: clearing running jobs, and cancelling without naming the queue, free the key's place")
    {
      store in
      guard store.keepsKeyLimits else { return }
      try await store.setLimits(QueueLimits(keyConcurrency: 1), queue: "q")
      for (index, way) in ["clear", "cancel-any", "tallied"].enumerated() {
        let key = "K\(index)"
        let base = Double(index * 100)
        _ = try await store.enqueue(
          [limited("\(way)-1", key, at: base), limited("\(way)-2", key, at: base)], queue: "q",
          clock: now(base))
        let running = try await claim(store, limit: 10, now: base + 1)
        try expect(texts(running) == ["\(way)-1"], "\(way): one runs: \(texts(running))")
        switch way {
        case "clear": _ = try await store.clear(queue: "q", statuses: [.running])
        case "cancel-any":
          _ = try await store.cancel([running.claimed[0].id], queue: nil, clock: now(base + 2))
        default:
          let tally = try await store.tally(queue: "q", statuses: [.running])
          _ = try await store.clear(
            queue: "q", statuses: [.running], through: tally.highestID ?? running.claimed[0].id,
            expecting: tally.count)
        }
        let after = try await claim(store, limit: 10, now: base + 3)
        try expect(texts(after) == ["\(way)-2"], "\(way): the held job runs: \(texts(after))")
        _ = try await claim(store, limit: 0, settling: [settle(after.claimed[0], .complete)], now: base + 4)
      }
    },
    check("key limits: each queue has its own; a stop in one queue frees nothing in another") { store in
      guard store.keepsKeyLimits else { return }
      try await store.setLimits(QueueLimits(keyConcurrency: 1), queue: "q")
      try await store.setLimits(QueueLimits(keyConcurrency: 1), queue: "r")
      _ = try await store.enqueue([limited("q1"), limited("q2")], queue: "q", clock: now(0))
      _ = try await store.enqueue([limited("r1"), limited("r2"), limited("r3")], queue: "r", clock: now(0))
      let q = try await claim(store, "q", limit: 10, now: 1)
      let r = try await claim(store, "r", limit: 10, now: 1)
      try expect(texts(q) == ["q1"] && texts(r) == ["r1"], "one per queue: \(texts(q)) \(texts(r))")
      let q2 = try await claim(store, "q", limit: 10, settling: [settle(q.claimed[0], .complete)], now: 2)
      try expect(texts(q2) == ["q2"], "q2: \(texts(q2))")
      let rNone = try await claim(store, "r", limit: 10, now: 3)
      try expect(rNone.claimed.isEmpty, "r's key still runs r1: \(texts(rNone))")
      try await store.setLimits(QueueLimits(keyConcurrency: 3), queue: "q")
      let rStill = try await claim(store, "r", limit: 10, now: 4)
      try expect(rStill.claimed.isEmpty, "setting q's limits leaves r's held jobs: \(texts(rStill))")
      let rNext = try await claim(store, "r", limit: 10, settling: [settle(r.claimed[0], .complete)], now: 5)
      try expect(texts(rNext) == ["r2"], "r2: \(texts(rNext))")
    },
  ]
}
