import Conveyor
import Foundation

extension JobStoreConformance {
  static func releasing(_ record: JobRecord, _ error: String = "dead", keeps: Bool = true) -> JobSettlement {
    var settlement = JobSettlement(claim: record.claim, action: .kill(error: error), keepsHistory: keeps)
    settlement.releasesOrderingKey = true
    settlement.ordered = record.orderingKey != nil
    return settlement
  }

  /// A dead head that releases its key (`DeadHeadPolicy.releasesKey`), on every store.
  static let deadHeadChecks: [JobStoreCheck] = [
    check(
      "dead head releasing its key: releasing kill, next job scheduled in the future runs when due, not before"
    ) { store in
      _ = try await store.enqueue([ordered("a1"), ordered("a2", at: 50)], queue: "q", clock: now(0))
      let head = try expectOne(try await claim(store, limit: 10, now: 1).claimed)
      var batch = try await claim(store, limit: 10, settling: [releasing(head)], now: 2)
      try expect(batch.claimed.isEmpty, "a2 not due: \(texts(batch))")
      let counts = try await store.counts(queue: "q", clock: now(2))
      try expect(counts == JobCounts(scheduled: 1, dead: 1), "a2 scheduled: \(counts)")
      let hint = try await store.nextWake(queue: "q", clock: now(2))
      try expect(hint.nextRun == at(50), "wakes for a2: \(hint)")
      batch = try await claim(store, limit: 10, now: 50)
      try expect(texts(batch) == ["a2"], "a2 when due: \(texts(batch))")
    },
    check("dead head releasing its key: releasing kill without history deletes the job and runs the next") {
      store in
      let added = try await store.enqueue([ordered("a1"), ordered("a2")], queue: "q", clock: now(0))
      let head = try expectOne(try await claim(store, limit: 10, now: 1).claimed)
      let batch = try await claim(store, limit: 10, settling: [releasing(head, keeps: false)], now: 2)
      try expect(texts(batch) == ["a2"], "a2: \(texts(batch))")
      try expect(try await store.job(added[0].id) == nil, "a1 deleted")
    },
    check(
      "dead head releasing its key: a stale releasing kill changes nothing; the key stays with the current claim"
    ) { store in
      let added = try await store.enqueue([ordered("a1"), ordered("a2")], queue: "q", clock: now(0))
      let first = try expectOne(try await claim(store, limit: 10, now: 1, leaseFor: 10).claimed)
      _ = try await store.rescueExpiredLeases(queue: "q", clock: now(20))
      let second = try expectOne(try await claim(store, limit: 10, owner: "w2", now: 21).claimed)
      try expect(text(second) == "a1", "a1 again: \(text(second))")
      let batch = try await claim(store, limit: 10, settling: [releasing(first)], now: 22)
      try expect(batch.staleSettlements == [first.claim], "stale: \(batch.staleSettlements)")
      try expect(batch.claimed.isEmpty, "a2 must wait for the running a1: \(texts(batch))")
      let a1 = try await store.job(added[0].id)
      try expect(a1?.status == .running && a1?.orderingKey == "K", "a1 unchanged: \(String(describing: a1))")
      let after = try await claim(store, limit: 10, settling: [settle(second, .complete)], now: 23)
      try expect(texts(after) == ["a2"], "a2 after a1: \(texts(after))")
    },
    check(
      "dead head releasing its key: after a release, a job added to the key runs behind the rest, the dead job not counted"
    ) {
      store in
      _ = try await store.enqueue([ordered("a1")], queue: "q", clock: now(0))
      let head = try expectOne(try await claim(store, limit: 10, now: 1).claimed)
      _ = try await claim(store, limit: 0, settling: [releasing(head)], now: 2)
      let added = try expectOne(try await store.enqueue([ordered("a2")], queue: "q", clock: now(3)))
      try expect(try await store.job(added.id)?.isHeld == false, "a2 not held behind a released dead job")
      let batch = try await claim(store, limit: 10, now: 4)
      try expect(texts(batch) == ["a2"], "a2: \(texts(batch))")
    },
    check(
      "dead head releasing its key: requeueDead(nil) of a released dead job and a dead head of the same key"
    ) { store in
      let added = try await store.enqueue(
        [ordered("a1"), ordered("a2"), ordered("a3")], queue: "q", clock: now(0))
      let a1 = try expectOne(try await claim(store, limit: 10, now: 1).claimed)
      let next = try await claim(store, limit: 10, settling: [releasing(a1)], now: 2)
      let a2 = try expectOne(next.claimed)
      // a2 dies holding its key.
      _ = try await claim(store, limit: 0, settling: [settle(a2, .kill(error: "held"))], now: 3)
      var counts = try await store.counts(queue: "q", clock: now(3))
      try expect(counts == JobCounts(dead: 2, held: 1), "two dead, a3 held: \(counts)")
      let requeued = try await store.requeueDead(nil, queue: "q", clock: now(4))
      try expect(requeued == 2, "both: \(requeued)")
      counts = try await store.counts(queue: "q", clock: now(4))
      try expect(counts == JobCounts(ready: 2, held: 1), "a1, a2 ready; a3 held: \(counts)")
      let batch = try await claim(store, limit: 10, now: 5)
      try expect(Set(texts(batch)) == ["a1", "a2"], "a1 (no key) and a2 (head): \(texts(batch))")
      let a1again = batch.claimed.first { text($0) == "a1" }!
      try expect(a1again.orderingKey == nil, "a1 has no key")
      let a2again = batch.claimed.first { text($0) == "a2" }!
      let last = try await claim(
        store, limit: 10, settling: [releasing(a1again), settle(a2again, .complete)], now: 6)
      try expect(texts(last) == ["a3"], "a3: \(texts(last))")
      try expect(try await store.job(added[0].id)?.status == .dead, "a1 dead again")
    },
    check("dead head releasing its key: releasing kills of two keys and a completion of a third in one batch")
    { store in
      _ = try await store.enqueue(
        [
          ordered("a1"), ordered("b1", "L"), ordered("c1", "M"), ordered("a2"), ordered("b2", "L"),
          ordered("c2", "M"),
        ], queue: "q", clock: now(0))
      let heads = try await claim(store, limit: 10, now: 1).claimed
      try expect(heads.count == 3, "three heads")
      let settlements = heads.map { head in
        text(head) == "c1" ? settle(head, .complete) : releasing(head)
      }
      let batch = try await claim(store, limit: 10, settling: settlements, now: 2)
      try expect(Set(texts(batch)) == ["a2", "b2", "c2"], "the next of each: \(texts(batch))")
    },
    check(
      "dead head releasing its key: a released dead job with a deduplication key: re-queued only when no waiting job has it"
    ) {
      store in
      let added = try await store.enqueue(
        [ordered("a1", dedup: "d"), ordered("a2")], queue: "q", clock: now(0))
      let head = try expectOne(try await claim(store, limit: 10, now: 1).claimed)
      let next = try expectOne(try await claim(store, limit: 10, settling: [releasing(head)], now: 2).claimed)
      try expect(text(next) == "a2", "a2")
      let again = try expectOne(
        try await store.enqueue([ordered("a3", dedup: "d")], queue: "q", clock: now(3)))
      try expect(again.inserted, "a3 inserted: the dead a1 holds no dedup key")
      let requeued = try await store.requeueDead([added[0].id], queue: "q", clock: now(4))
      try expect(requeued == 0, "a waiting job holds d: \(requeued)")
    },
    check(
      "dead head releasing its key: the release flag on a job without a key, a retry, a release changes nothing"
    ) { store in
      _ = try await store.enqueue([job("free"), ordered("a1"), ordered("a2")], queue: "q", clock: now(0))
      let claimed = try await claim(store, limit: 10, now: 1).claimed
      let free = claimed.first { text($0) == "free" }!
      let a1 = claimed.first { text($0) == "a1" }!
      var release = JobSettlement(claim: a1.claim, action: .release(error: nil))
      release.releasesOrderingKey = true
      let batch = try await claim(store, limit: 10, settling: [releasing(free), release], now: 2)
      try expect(texts(batch) == ["a1"], "a1 again, a2 held: \(texts(batch))")
      let counts = try await store.counts(queue: "q", clock: now(2))
      try expect(counts == JobCounts(running: 1, dead: 1, held: 1), "\(counts)")
    },
    check(
      "dead head releasing its key: a releasing kill racing an add to the same key never leaves the add held with no head"
    ) {
      store in
      for round in 0..<60 {
        let key = "race\(round)"
        _ = try await store.enqueue([ordered("h\(round)", key)], queue: "q", clock: now(0))
        let head = try expectOne(try await claim(store, limit: 1, now: 1).claimed)
        async let killed = store.settleAndClaim(
          [releasing(head)], queue: "q", limit: 0, lease: lease(), clock: now(2))
        async let added = store.enqueue([ordered("n\(round)", key)], queue: "q", clock: now(2))
        _ = try await killed
        let next = try expectOne(try await added)
        let record = try await store.job(next.id)
        try expect(
          record?.isHeld == false,
          "round \(round): the add is held with no head: \(String(describing: record))")
        let batch = try await claim(store, limit: 1, now: 3)
        try expect(texts(batch) == ["n\(round)"], "round \(round): \(texts(batch))")
        _ = try await claim(store, limit: 0, settling: [settle(batch.claimed[0], .complete)], now: 4)
      }
    },
  ]
}
