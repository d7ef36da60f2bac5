import Conveyor
import Foundation
import Synchronization

extension JobStoreConformance {
  /// A job with an ordering key.
  static func ordered(
    _ text: String, _ key: String = "K", priority: Int = 0, at seconds: Double = 0, dedup: String? = nil,
    onConflict: DeduplicationConflict = .useExisting
  ) -> NewJob {
    NewJob(
      payload: Data(text.utf8), priority: priority, runTime: .at(at(seconds)), deduplicationKey: dedup,
      onConflict: onConflict, orderingKey: key)
  }

  /// The payloads of a claim, in claim order.
  static func texts(_ batch: ClaimBatch) -> [String] { batch.claimed.map(text) }

  /// Ordering keys, on every store: one job of a key at a time, in the order they were added.
  static let orderingChecks: [JobStoreCheck] = [
    check("ordering key: a later job of a key is held until the earlier one finishes; other keys run") {
      store in
      let added = try await store.enqueue(
        [ordered("a1"), ordered("a2"), ordered("b1", "L"), job("free")], queue: "q", clock: now(0))
      try expect(added.allSatisfy(\.inserted), "all inserted: \(added)")
      let counts = try await store.counts(queue: "q", clock: now(0))
      try expect(counts == JobCounts(ready: 3, held: 1), "three ready, one held: \(counts)")
      let held = try await store.job(added[1].id)
      try expect(
        held?.isHeld == true && held?.status == .pending && held?.orderingKey == "K",
        "a2 held, pending, with its key: \(String(describing: held))")
      let first = try await claim(store, limit: 10, now: 1)
      try expect(Set(texts(first)) == ["a1", "b1", "free"], "the heads and the free job: \(texts(first))")
      let a1 = first.claimed.first { text($0) == "a1" }!
      try expect(a1.orderingKey == "K" && !a1.isHeld, "a claimed head: \(a1)")
      let during = try await claim(store, limit: 10, now: 2)
      try expect(during.claimed.isEmpty, "a2 waits while a1 runs: \(texts(during))")
      let next = try await claim(store, limit: 10, settling: [settle(a1, .complete)], now: 3)
      try expect(texts(next) == ["a2"], "a2 once a1 completed: \(texts(next))")
      let after = try await store.counts(queue: "q", clock: now(3))
      try expect(after.held == 0 && after.running == 3, "none held: \(after)")
    },
    check("ordering key: while the head waits for a retry the rest of its key waits too") { store in
      _ = try await store.enqueue(
        [ordered("a1"), ordered("a2"), ordered("b1", "L")], queue: "q", clock: now(0))
      let heads = try await claim(store, limit: 10, now: 1)
      let a1 = heads.claimed.first { text($0) == "a1" }!
      let b1 = heads.claimed.first { text($0) == "b1" }!
      let retried = try await claim(
        store, limit: 10, settling: [settle(a1, .retry(after: .seconds(10), error: "busy"))], now: 2)
      try expect(retried.claimed.isEmpty, "a2 does not overtake a1: \(texts(retried))")
      let counts = try await store.counts(queue: "q", clock: now(2))
      try expect(counts.scheduled == 1 && counts.held == 1, "a1 scheduled, a2 held: \(counts)")
      let early = try await claim(store, limit: 10, settling: [settle(b1, .complete)], now: 5)
      try expect(early.claimed.isEmpty, "still nothing before the retry: \(texts(early))")
      let again = try await claim(store, limit: 10, now: 12)
      try expect(texts(again) == ["a1"], "a1 again, alone: \(texts(again))")
      let last = try await claim(store, limit: 10, settling: [settle(again.claimed[0], .complete)], now: 13)
      try expect(texts(last) == ["a2"], "then a2: \(texts(last))")
    },
    check("ordering key: a retry with no delay, a release and a rescued lease keep the head first") { store in
      _ = try await store.enqueue([ordered("a1"), ordered("a2")], queue: "q", clock: now(0))
      var head = try expectOne(try await claim(store, limit: 10, now: 1).claimed)
      var batch = try await claim(
        store, limit: 10, settling: [settle(head, .retry(after: .zero, error: "again"))], now: 2)
      try expect(texts(batch) == ["a1"], "a retried head is claimed again first: \(texts(batch))")
      head = batch.claimed[0]
      batch = try await claim(store, limit: 10, settling: [settle(head, .release(error: nil))], now: 3)
      try expect(texts(batch) == ["a1"], "a released head again: \(texts(batch))")
      head = batch.claimed[0]
      // The lease lapses: the head is rescued and keeps its key.
      let rescued = try await store.rescueExpiredLeases(queue: "q", clock: now(200))
      try expect(rescued == 1, "rescued: \(rescued)")
      batch = try await claim(store, limit: 10, now: 201)
      try expect(texts(batch) == ["a1"], "a rescued head again: \(texts(batch))")
      let stale = try await claim(store, limit: 10, settling: [settle(head, .complete)], now: 202)
      try expect(stale.staleSettlements == [head.claim] && stale.claimed.isEmpty, "the lapsed claim is stale")
      batch = try await claim(
        store, limit: 10,
        settling: [JobSettlement(claim: batch.claimed[0].claim, action: .complete, keepsHistory: false)],
        now: 203)
      try expect(texts(batch) == ["a2"], "a2 after a completion kept without history: \(texts(batch))")
    },
    check("ordering key: a dead head blocks its key until it is re-queued or removed") { store in
      let added = try await store.enqueue([ordered("a1"), ordered("a2")], queue: "q", clock: now(0))
      var head = try expectOne(try await claim(store, limit: 10, now: 1).claimed)
      var batch = try await claim(store, limit: 10, settling: [settle(head, .kill(error: "broken"))], now: 2)
      try expect(batch.claimed.isEmpty, "a2 stays held behind the dead a1: \(texts(batch))")
      let late = try expectOne(try await store.enqueue([ordered("a3")], queue: "q", clock: now(3)))
      try expect(try await store.job(late.id)?.isHeld == true, "a job added later is held too")
      let counts = try await store.counts(queue: "q", clock: now(3))
      try expect(counts == JobCounts(dead: 1, held: 2), "one dead, two held: \(counts)")
      let requeued = try await store.requeueDead([added[0].id], queue: "q", clock: now(4))
      try expect(requeued == 1, "re-queued: \(requeued)")
      batch = try await claim(store, limit: 10, now: 5)
      try expect(texts(batch) == ["a1"], "the re-queued head runs first: \(texts(batch))")
      head = batch.claimed[0]
      batch = try await claim(
        store, limit: 10, settling: [settle(head, .kill(error: "still broken"))], now: 6)
      try expect(batch.claimed.isEmpty, "dead again, held again: \(texts(batch))")
      let removed = try await store.remove([added[0].id], queue: "q")
      try expect(removed == 1, "removed: \(removed)")
      batch = try await claim(store, limit: 10, now: 7)
      try expect(texts(batch) == ["a2"], "a2 once the dead head is removed: \(texts(batch))")
      batch = try await claim(store, limit: 10, settling: [settle(batch.claimed[0], .complete)], now: 8)
      try expect(texts(batch) == ["a3"], "then a3: \(texts(batch))")
    },
    check(
      "ordering key: a head that dies releasing its key lets the next job run; re-queued, it runs outside it"
    ) {
      store in
      let added = try await store.enqueue(
        [ordered("a1"), ordered("a2"), ordered("a3"), ordered("b1", "L"), ordered("b2", "L")], queue: "q",
        clock: now(0))
      let heads = try await claim(store, limit: 10, now: 1).claimed
      try expect(Set(heads.map(text)) == ["a1", "b1"], "the heads: \(heads.map(text))")
      let a1 = heads.first { text($0) == "a1" }!
      let b1 = heads.first { text($0) == "b1" }!
      var releasing = settle(a1, .kill(error: "gone for good"))
      releasing.releasesOrderingKey = true
      // b1 dies holding its key, as before: b2 stays held.
      var batch = try await claim(
        store, limit: 10, settling: [releasing, settle(b1, .kill(error: "broken"))], now: 2)
      try expect(texts(batch) == ["a2"], "a2 runs once a1 died releasing the key; b2 waits: \(texts(batch))")
      let dead = try await store.job(added[0].id)
      try expect(
        dead?.status == .dead && dead?.orderingKey == nil && dead?.lastError == "gone for good",
        "a1 is dead, its key cleared: \(String(describing: dead))")
      let b1Dead = try await store.job(added[3].id)
      try expect(b1Dead?.orderingKey == "L", "b1 keeps its key: \(String(describing: b1Dead))")
      let counts = try await store.counts(queue: "q", clock: now(2))
      try expect(counts == JobCounts(running: 1, dead: 2, held: 2), "a2 running; a3, b2 held: \(counts)")
      // Re-queued, a1 runs beside a2, outside the key's order; a3 still waits for a2.
      let requeued = try await store.requeueDead([added[0].id], queue: "q", clock: now(3))
      try expect(requeued == 1, "re-queued: \(requeued)")
      try expect(try await store.job(added[0].id)?.isHeld == false, "not held: it is in no key")
      batch = try await claim(store, limit: 10, owner: "w2", now: 4)
      try expect(texts(batch) == ["a1"], "a1 runs at once: \(texts(batch))")
      let a2 = try expectOne(
        try await store.jobs(queue: "q", status: .running, after: nil, limit: 10).filter {
          text($0) == "a2"
        })
      batch = try await claim(store, limit: 10, settling: [settle(a2, .complete)], now: 5)
      try expect(texts(batch) == ["a3"], "then a3, after a2: \(texts(batch))")
      // A release flag on anything but a kill changes nothing.
      var retry = settle(batch.claimed[0], .retry(after: .seconds(60), error: "later"))
      retry.releasesOrderingKey = true
      _ = try await claim(store, limit: 0, settling: [retry], now: 6)
      let a3 = try await store.job(added[2].id)
      try expect(
        a3?.orderingKey == "K" && a3?.status == .pending, "a retry keeps the key: \(String(describing: a3))")
    },
    check("ordering key: re-queueing every dead job puts each dead head back first") { store in
      _ = try await store.enqueue(
        [ordered("a1"), ordered("a2"), ordered("b1", "L"), ordered("b2", "L")], queue: "q", clock: now(0))
      let heads = try await claim(store, limit: 10, now: 1).claimed
      try expect(heads.count == 2, "two heads: \(heads.map(text))")
      _ = try await claim(store, limit: 0, settling: heads.map { settle($0, .kill(error: "x")) }, now: 2)
      let requeued = try await store.requeueDead(nil, queue: "q", clock: now(3))
      try expect(requeued == 2, "both re-queued: \(requeued)")
      let batch = try await claim(store, limit: 10, now: 4)
      try expect(Set(texts(batch)) == ["a1", "b1"], "the heads again, not the held: \(texts(batch))")
    },
    check("ordering key: pruning or clearing a dead head lets the next job run") { store in
      _ = try await store.enqueue(
        [ordered("a1"), ordered("a2"), ordered("b1", "L"), ordered("b2", "L")], queue: "q", clock: now(0))
      let heads = try await claim(store, limit: 10, now: 1).claimed
      let a1 = heads.first { text($0) == "a1" }!
      let b1 = heads.first { text($0) == "b1" }!
      _ = try await claim(store, limit: 0, settling: [settle(a1, .kill(error: "x"))], now: 2)
      let pruned = try await store.prune(
        queue: "q", status: .dead, olderThan: .zero, limit: 10, clock: now(3))
      try expect(pruned == 1, "pruned: \(pruned)")
      var batch = try await claim(store, limit: 10, now: 4)
      try expect(texts(batch) == ["a2"], "a2 after its dead head was pruned: \(texts(batch))")
      _ = try await claim(store, limit: 0, settling: [settle(b1, .kill(error: "x"))], now: 5)
      let cleared = try await store.clear(queue: "q", statuses: [.dead])
      try expect(cleared == 1, "cleared: \(cleared)")
      batch = try await claim(store, limit: 10, now: 6)
      try expect(texts(batch) == ["b2"], "b2 after its dead head was cleared: \(texts(batch))")
    },
    check("ordering key: cancelling a held job keeps the order; cancelling the head lets the next run") {
      store in
      let added = try await store.enqueue(
        [ordered("a1"), ordered("a2"), ordered("a3"), ordered("a4")], queue: "q", clock: now(0))
      let cancelled = try await store.cancel([added[1].id], queue: "q", clock: now(1))
      try expect(cancelled == [.cancelledWaiting], "a held job is cancelled while waiting: \(cancelled)")
      let head = try expectOne(try await claim(store, limit: 10, now: 2).claimed)
      try expect(text(head) == "a1", "a1 first: \(text(head))")
      let running = try await store.cancel([head.id], queue: "q", clock: now(3))
      try expect(running == [.cancelledRunning], "the running head is cancelled: \(running)")
      var batch = try await claim(store, limit: 10, now: 4)
      try expect(texts(batch) == ["a3"], "a3 next, a2 was cancelled: \(texts(batch))")
      let waitingHead = try await store.enqueue(
        [ordered("b1", "L"), ordered("b2", "L")], queue: "q", clock: now(5))
      _ = try await store.cancel([waitingHead[0].id], queue: "q", clock: now(6))
      batch = try await claim(store, limit: 10, settling: [settle(batch.claimed[0], .complete)], now: 7)
      try expect(
        Set(texts(batch)) == ["a4", "b2"], "a4, and b2 after its waiting head was cancelled: \(texts(batch))")
    },
    check("ordering key: jobs run in the order added, whatever their priorities and run dates") { store in
      _ = try await store.enqueue(
        [ordered("late", at: 100), ordered("urgent", priority: 10), ordered("low", priority: -5)], queue: "q",
        clock: now(0))
      var batch = try await claim(store, limit: 10, now: 1)
      try expect(
        batch.claimed.isEmpty, "the first job is not due, and the others wait for it: \(texts(batch))")
      let hint = try await store.nextWake(queue: "q", clock: now(1))
      try expect(hint.nextRun == at(100), "the next run is the head's date: \(hint)")
      batch = try await claim(store, limit: 10, now: 100)
      try expect(texts(batch) == ["late"], "late first: \(texts(batch))")
      batch = try await claim(store, limit: 10, settling: [settle(batch.claimed[0], .complete)], now: 101)
      try expect(texts(batch) == ["urgent"], "then urgent: \(texts(batch))")
      batch = try await claim(store, limit: 10, settling: [settle(batch.claimed[0], .complete)], now: 102)
      try expect(texts(batch) == ["low"], "then low: \(texts(batch))")
    },
    check("ordering key: a replaced waiting job stays held in its place") { store in
      _ = try await store.enqueue(
        [ordered("a1"), ordered("a2", dedup: "d", onConflict: .replace)], queue: "q", clock: now(0))
      let again = try expectOne(
        try await store.enqueue(
          [ordered("a2-new", dedup: "d", onConflict: .replace)], queue: "q", clock: now(1)))
      try expect(again.outcome == .replaced, "replaced the held job: \(again)")
      let record = try await store.job(again.id)
      try expect(
        record?.isHeld == true && record.map(text) == "a2-new", "still held: \(String(describing: record))")
      let plain = try expectOne(
        try await store.enqueue([ordered("a2-dup", dedup: "d")], queue: "q", clock: now(1)))
      try expect(plain.outcome == .existing && plain.id == again.id, "a held job counts as waiting: \(plain)")
      var batch = try await claim(store, limit: 10, now: 2)
      try expect(texts(batch) == ["a1"], "only a1: \(texts(batch))")
      batch = try await claim(store, limit: 10, settling: [settle(batch.claimed[0], .complete)], now: 3)
      try expect(texts(batch) == ["a2-new"], "then the replaced a2: \(texts(batch))")
    },
    check("ordering keys are per queue and compared byte for byte") { store in
      let composed = "caf\u{E9}"
      let decomposed = "cafe\u{301}"
      _ = try await store.enqueue(
        [ordered("c1", composed), ordered("c2", decomposed), ordered("c3", composed)], queue: "q",
        clock: now(0))
      _ = try await store.enqueue([ordered("r1", composed)], queue: "r", clock: now(0))
      let batch = try await claim(store, limit: 10, now: 1)
      try expect(Set(texts(batch)) == ["c1", "c2"], "two keys, two heads: \(texts(batch))")
      let other = try await claim(store, "r", limit: 10, now: 1)
      try expect(texts(other) == ["r1"], "another queue's key is its own: \(texts(other))")
      let listed = try await store.jobs(queue: "q", status: .pending, after: nil, limit: 10)
      try expect(
        listed.map(text) == ["c3"] && listed[0].isHeld, "the held job is listed as pending: \(listed)")
      let names = try await store.queueNames()
      try expect(names.contains("q") && names.contains("r"), "queues listed: \(names)")
      let tally = try await store.tally(queue: "q", statuses: [.pending])
      try expect(tally.count == 1, "the held job is tallied as pending: \(tally)")
    },
    check("ordering key: a queue holding only held jobs behind a running head is listed and not finished") {
      store in
      _ = try await store.enqueue([ordered("a1"), ordered("a2")], queue: "q", clock: now(0))
      let head = try expectOne(try await claim(store, limit: 10, now: 1).claimed)
      let hint = try await store.nextWake(queue: "q", clock: now(2))
      try expect(!hint.isFinished && hint.nextLeaseExpiry != nil, "the running head: \(hint)")
      _ = try await claim(store, limit: 0, settling: [settle(head, .complete)], now: 3)
      let after = try await store.nextWake(queue: "q", clock: now(4))
      try expect(after.nextRun != nil && after.nextRun! <= at(4), "a2 is due now: \(after)")
      try expect(try await store.queueNames() == ["q"], "listed")
    },
    check("ordering key: empty, NUL and too long keys are refused and nothing of the call is stored") {
      store in
      _ = try await store.enqueue([job("kept")], queue: "q", clock: now(0))
      for bad in ["", "a\u{0}b", String(repeating: "k", count: OrderingKey.maximumBytes + 1)] {
        do {
          _ = try await store.enqueue(
            [ordered("fine", "ok"), ordered("bad", bad)], queue: "q", clock: now(1))
          throw ConformanceFailure(description: "the key \(bad.debugDescription.prefix(20)) was taken")
        } catch JobQueueError.invalidOrderingKey {
        }
      }
      let longest = String(repeating: "k", count: OrderingKey.maximumBytes)
      let fits = try expectOne(try await store.enqueue([ordered("long", longest)], queue: "q", clock: now(1)))
      try expect(fits.inserted, "a key of the longest length is taken")
      let counts = try await store.counts(queue: "q", clock: now(2))
      try expect(counts == JobCounts(ready: 2), "only the first job and the longest key's: \(counts)")
    },
    check("ordering key: eight workers draining keys never run two jobs of a key at once, and keep order") {
      store in
      let keys = 4
      let perKey = 12
      var jobs: [NewJob] = []
      for index in 0..<perKey {
        for key in 0..<keys { jobs.append(ordered("\(key)-\(index)", "key-\(key)")) }
      }
      _ = try await store.enqueue(jobs, queue: "q", clock: now(0))
      // A job may be handed out only once the one before it of its key was completed, so its
      // completion was sent (marked here just before the call that carries it) before the claim.
      let state = OrderWatch()
      try await withThrowingTaskGroup(of: Void.self) { group in
        for worker in 0..<8 {
          group.addTask {
            var settling: [(JobSettlement, String)] = []
            var idle = 0
            while idle < 50 {
              state.state.withLock { state in for (_, name) in settling { state.sent.insert(name) } }
              let batch = try await store.settleAndClaim(
                settling.map(\.0), queue: "q", limit: 2, lease: lease("w\(worker)"), clock: now(1))
              settling = batch.claimed.map { (settle($0, .complete), text($0)) }
              idle = batch.claimed.isEmpty ? idle + 1 : 0
              for record in batch.claimed {
                let parts = text(record).split(separator: "-")
                let (key, index) = (String(parts[0]), Int(parts[1])!)
                state.state.withLock { state in
                  if index > 0, !state.sent.contains("\(key)-\(index - 1)") {
                    state.violations.append("\(key)-\(index) handed out while \(key)-\(index - 1) ran")
                  }
                  state.order[key, default: []].append(index)
                }
              }
              await Task.yield()
            }
            _ = try await store.settleAndClaim(
              settling.map(\.0), queue: "q", limit: 0, lease: lease("w\(worker)"), clock: now(1))
          }
        }
        try await group.waitForAll()
      }
      let result = state.state.withLock { $0 }
      try expect(result.violations.isEmpty, "\(result.violations)")
      for key in 0..<keys {
        try expect(
          result.order["\(key)"] == Array(0..<perKey),
          "key \(key) in order: \(String(describing: result.order["\(key)"]))")
      }
      let left = try await store.counts(queue: "q", clock: now(1))
      try expect(left.total == 0, "every job completed: \(left)")
    },
    check("ordering key: clearing the pending jobs deletes every waiting job of a key, held ones too") {
      store in
      _ = try await store.enqueue(
        [ordered("a1"), ordered("a2"), ordered("a3"), ordered("a4")], queue: "q", clock: now(0))
      let cleared = try await store.clear(queue: "q", statuses: [.pending])
      let left = try await store.counts(queue: "q", clock: now(1))
      try expect(
        cleared == 4 && left.total == 0, "every pending job cleared: \(cleared) cleared, left \(left)")
    },
    check("ordering key: clearing the counted pending jobs deletes every one of them, held ones too") {
      store in
      _ = try await store.enqueue(
        [ordered("a1"), ordered("a2"), ordered("a3"), ordered("a4")], queue: "q", clock: now(0))
      let tally = try await store.tally(queue: "q", statuses: [.pending])
      try expect(tally.count == 4, "four pending: \(tally)")
      let cleared = try await store.clear(
        queue: "q", statuses: [.pending], through: tally.highestID!, expecting: tally.count)
      let left = try await store.counts(queue: "q", clock: now(1))
      try expect(
        cleared == 4 && left.total == 0,
        "every counted job cleared: \(String(describing: cleared)) cleared, left \(left)")
    },
    check(
      "ordering key: a held job that was due when added runs right after its head, though the clock stepped back"
    ) {
      store in
      // Added at 50, due at once; the wall clock then steps back to 10.
      _ = try await store.enqueue(
        [ordered("a1", at: 50), ordered("a2", at: 50), job("free", at: 50)], queue: "q", clock: now(50))
      let first = try await claim(store, limit: 10, now: 51)
      try expect(Set(texts(first)) == ["a1", "free"], "the head and the free job: \(texts(first))")
      let a1 = first.claimed.first { text($0) == "a1" }!
      _ = try await store.enqueue([job("plain", at: 50)], queue: "q", clock: now(50))
      let next = try await claim(store, limit: 10, settling: [settle(a1, .complete)], now: 10)
      try expect(
        Set(texts(next)) == ["a2", "plain"],
        "a2, due since 50, runs once a1 completed, as an unkeyed job due since 50 does: \(texts(next))")
    },
  ]
}

/// What the draining workers of the ordering check saw, shared under its lock.
final class OrderWatch: Sendable {
  let state = Mutex((sent: Set<String>(), order: [String: [Int]](), violations: [String]()))
}
