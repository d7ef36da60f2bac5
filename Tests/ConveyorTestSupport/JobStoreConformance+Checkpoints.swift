import Conveyor
import Foundation

extension JobStoreConformance {
  /// A running job's payload replaced under its claim (``JobStore/checkpoint(_:payload:queue:)``),
  /// on every store.
  static let checkpointChecks: [JobStoreCheck] = [
    check("a checkpoint replaces a running job's payload; the next claim reads it") { store in
      _ = try await store.enqueue([job("start")], queue: "q", clock: now(0))
      let first = try expectOne(try await claim(store, now: 1).claimed)
      let saved = Data([0, 1, 2, 255]) + Data("step 1".utf8)
      try expect(try await store.checkpoint(first.claim, payload: saved, queue: "q"), "current claim saves")
      try expect(try await store.job(first.id)?.payload == saved, "stored while running")
      // A retry, a release and a rescued lease all hand out the checkpoint.
      let retried = try await claim(
        store, settling: [settle(first, .retry(after: .zero, error: nil))], now: 2)
      let second = try expectOne(retried.claimed)
      try expect(second.payload == saved, "the retry's claim reads the checkpoint")
      try expect(
        try await store.checkpoint(second.claim, payload: Data("step 2".utf8), queue: "q"), "second saves")
      let released = try await claim(store, settling: [settle(second, .release(error: nil))], now: 3)
      let third = try expectOne(released.claimed)
      try expect(text(third) == "step 2", "the release's claim reads it: \(text(third))")
      try expect(
        try await store.checkpoint(third.claim, payload: Data("step 3".utf8), queue: "q"), "third saves")
      try expect(try await store.rescueExpiredLeases(queue: "q", clock: now(100)) == 1, "lease lapsed")
      let fourth = try expectOne(try await claim(store, now: 101).claimed)
      try expect(text(fourth) == "step 3", "the rescued job's claim reads it: \(text(fourth))")
    },
    check("a checkpoint under a stale claim writes nothing") { store in
      let added = try await store.enqueue([job("start"), job("other")], queue: "q", clock: now(0))
      let first = try expectOne(try await claim(store, now: 1, leaseFor: 10).claimed)
      try expect(try await store.rescueExpiredLeases(queue: "q", clock: now(20)) == 1, "lease lapsed")
      let second = try expectOne(try await claim(store, now: 21).claimed)
      try expect(second.id == first.id && second.claimToken != first.claimToken, "claimed again")
      let late = try await store.checkpoint(first.claim, payload: Data("late".utf8), queue: "q")
      try expect(!late, "the old claim's checkpoint is refused")
      try expect(text(try await store.job(first.id)!) == "start", "payload kept")
      // Another queue's name, a waiting job, a finished job and a missing job: nothing written.
      try expect(
        try await store.checkpoint(second.claim, payload: Data("x".utf8), queue: "other") == false,
        "another queue's name")
      let waiting = try await store.job(added[1].id)!
      try expect(
        try await store.checkpoint(waiting.claim, payload: Data("x".utf8), queue: "q") == false,
        "a waiting job")
      _ = try await claim(store, limit: 0, settling: [settle(second, .complete)], now: 22)
      try expect(
        try await store.checkpoint(second.claim, payload: Data("x".utf8), queue: "q") == false,
        "a completed job")
      try expect(text(try await store.job(first.id)!) == "start", "still the first payload")
      try expect(text(try await store.job(added[1].id)!) == "other", "the waiting job's payload kept")
      try expect(
        try await store.checkpoint(
          ClaimReference(id: JobID(rawValue: 999_999), token: 1), payload: Data("x".utf8), queue: "q")
          == false,
        "a missing job")
    },
    check("a checkpoint under a lapsed lease nobody rescued yet still saves") { store in
      _ = try await store.enqueue([job("start")], queue: "q", clock: now(0))
      let first = try expectOne(try await claim(store, now: 1, leaseFor: 10).claimed)
      // Past the lease's end (by any clock): the claim is still the job's current one.
      try expect(
        try await store.checkpoint(first.claim, payload: Data("saved".utf8), queue: "q"), "still current")
      try expect(text(try await store.job(first.id)!) == "saved", "saved")
    },
  ]
}
