import Conveyor
import ConveyorSQLite
import ConveyorTestSupport
import Foundation
import Testing

// Fair shares (`NewJob.fairnessKey`) on the in-memory and SQLite stores side by side: paths the
// conformance suite's random run does not take (re-queues, give-backs, kills, lease rescues, rates
// per key, a clock stepped back, changes to scheduled jobs of a limit key) give the same turns on
// both.

private let fairQueue = "q"
private let fairT0 = Date(timeIntervalSince1970: 1_700_000_000)
private func fairAt(_ seconds: Double) -> Date { fairT0.addingTimeInterval(seconds) }
private func fairNow(_ seconds: Double) -> any JobClock { FixedJobClock(fairAt(seconds)) }
private func fairLease() -> Lease { Lease(owner: "w1", duration: .seconds(60)) }
private func fairText(_ record: JobRecord) -> String { String(decoding: record.payload, as: UTF8.self) }

private func fairJob(
  _ text: String, fair: String? = nil, at seconds: Double = 0, priority: Int = 0, dedup: String? = nil,
  onConflict: DeduplicationConflict = .useExisting, ordering: String? = nil, limitKey: String? = nil
) -> NewJob {
  NewJob(
    payload: Data(text.utf8), priority: priority, runTime: .at(fairAt(seconds)), deduplicationKey: dedup,
    onConflict: onConflict, orderingKey: ordering, limitKey: limitKey, fairnessKey: fair)
}

private func fairClaim(
  _ store: any JobStore, limit: Int = 20, settling: [JobSettlement] = [], now seconds: Double
) async throws -> [JobRecord] {
  try await store.settleAndClaim(
    settling, queue: fairQueue, limit: limit, lease: fairLease(), clock: fairNow(seconds)
  ).claimed
}

/// A fresh in-memory store and a fresh SQLite store (named for messages).
private func fairStores(_ folder: TemporaryFolder) throws -> [(String, any JobStore)] {
  [("in-memory", InMemoryJobStore()), ("SQLite", try SQLiteJobStore(path: folder.path("fair.sqlite")))]
}

@Suite("Fair shares: the in-memory and SQLite stores agree")
struct FairSharesTests {
  /// Re-queueing every dead job takes those without a deduplication key first (SQLite re-queues
  /// them in one statement), then the keyed ones oldest first: their turns follow that order on
  /// both stores.
  @Test func reQueueingEveryDeadJobGivesTheSameTurnsOnBothStores() async throws {
    let folder = try TemporaryFolder()
    var orders: [String: [String]] = [:]
    for (name, store) in try fairStores(folder) {
      _ = try await store.enqueue(
        [fairJob("k1", fair: "A", dedup: "d1"), fairJob("k2", fair: "A")], queue: fairQueue,
        clock: fairNow(0))
      let running = try await fairClaim(store, limit: 2, now: 0)
      _ = try await fairClaim(
        store, settling: running.map { JobSettlement(claim: $0.claim, action: .kill(error: "x")) }, now: 1)
      let requeued = try await store.requeueDead(nil, queue: fairQueue, clock: fairNow(2))
      #expect(requeued == 2, "\(name): \(requeued)")
      orders[name] = try await fairClaim(store, now: 3).map(fairText)
      if let sqlite = store as? SQLiteJobStore { await sqlite.close() }
    }
    #expect(orders["in-memory"] == orders["SQLite"], "stores disagree: \(orders)")
    #expect(orders["SQLite"] == ["k2", "k1"], "those without a deduplication key first: \(orders)")
  }

  /// The guide: "the conformance suite checks that SQLite ... claim[s] what the in-memory store
  /// claims through a random run of adds, retries, delays, cancellations, replacements and
  /// limits". The same random run with the paths that suite leaves out: give-backs
  /// (`.release`), kills and re-queues of chosen dead jobs, lapsed leases rescued, cancellation of
  /// running jobs, limits changed (unparking), replacements that change priority and key, and a
  /// clock that steps back. Every claim's answer must match.
  ///
  /// Thirty rounds.
  @Test(arguments: 0..<30) func randomRunWithMorePathsClaimsTheSameOnBothStores(round: Int) async throws {
    let folder = try TemporaryFolder()
    let sqlite = try SQLiteJobStore(path: folder.path("random\(round).sqlite"))
    let targets: [any JobStore] = [InMemoryJobStore(), sqlite]
    var seed: UInt64 = 0x9E37_79B9_7F4A_7C15 &+ UInt64(round) &* 7_919
    func next(_ bound: Int) -> Int {
      seed = seed &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
      return Int((seed >> 33) % UInt64(bound))
    }
    for target in targets { try await target.setLimits(QueueLimits(keyConcurrency: 2), queue: fairQueue) }
    var ids: [[String: JobID]] = [[:], [:]]
    var running: [[String: JobRecord]] = [[:], [:]]
    var counter = 0
    var time = 1.0
    var log: [String] = []
    for step in 0..<400 {
      let op = next(16)
      if op < 5 {
        var jobs: [NewJob] = []
        for _ in 0..<(1 + next(4)) {
          counter += 1
          let key = ["T1", "T2", "T3", nil][next(4)]
          let runAt = [time - 1, time - 1, time, time + 0.5, time + 2][next(5)]
          let dedup = next(4) == 0 ? "d\(next(3))" : nil
          jobs.append(
            fairJob(
              "j\(counter)", fair: key, at: runAt, priority: next(2), dedup: dedup,
              onConflict: next(2) == 0 ? .replace : .useExisting, limitKey: [nil, nil, "h", "g"][next(4)]))
        }
        for (index, target) in targets.enumerated() {
          let added = try await target.enqueue(jobs, queue: fairQueue, clock: fairNow(time))
          for (job, result) in zip(jobs, added) where result.outcome == .inserted {
            ids[index][String(decoding: job.payload, as: UTF8.self)] = result.id
          }
        }
        log.append("\(step) add \(jobs.map { String(decoding: $0.payload, as: UTF8.self) })")
      } else if op == 5, counter > 0 {
        // Cancel any job (waiting or running).
        let text = "j\(1 + next(counter))"
        for (index, target) in targets.enumerated() {
          if let id = ids[index][text] {
            _ = try await target.cancel([id], queue: fairQueue, clock: fairNow(time))
            running[index][text] = nil
          }
        }
        log.append("\(step) cancel \(text)")
      } else if op == 6, counter > 0 {
        // Re-queue some dead jobs, chosen by ID (sorted: both stores take them oldest first).
        let texts = (0..<3).map { _ in "j\(1 + next(counter))" }
        for (index, target) in targets.enumerated() {
          let chosen = texts.compactMap { ids[index][$0] }
          _ = try await target.requeueDead(chosen, queue: fairQueue, clock: fairNow(time))
        }
        log.append("\(step) requeue \(texts)")
      } else if op == 7 {
        // Leases lapse: every running job is rescued.
        var answers: [Int] = []
        for (index, target) in targets.enumerated() {
          answers.append(try await target.rescueExpiredLeases(queue: fairQueue, clock: fairNow(time + 120)))
          running[index] = [:]
        }
        log.append("\(step) rescue \(answers)")
      } else if op == 8 {
        let limits = [
          QueueLimits(keyConcurrency: 1), QueueLimits(keyConcurrency: 2), QueueLimits(),
          QueueLimits(keyRate: RateLimit(perSecond: 2, burst: 1)),
        ][next(4)]
        for target in targets { try await target.setLimits(limits, queue: fairQueue) }
        log.append("\(step) limits")
      } else {
        let chosen = running[0].keys.sorted().filter { _ in next(2) == 0 }
        let action: JobSettlement.Action = [
          .complete, .retry(after: .zero, error: nil), .retry(after: .seconds(1), error: nil),
          .release(error: nil), .kill(error: "x"),
        ][next(5)]
        var answers: [[String]] = []
        for (index, target) in targets.enumerated() {
          let settling = chosen.compactMap { running[index][$0] }.map {
            JobSettlement(claim: $0.claim, action: action)
          }
          for text in chosen { running[index][text] = nil }
          let batch = try await target.settleAndClaim(
            settling, queue: fairQueue, limit: 1 + step % 3, lease: fairLease(), clock: fairNow(time))
          for record in batch.claimed { running[index][fairText(record)] = record }
          answers.append(batch.claimed.map(fairText))
        }
        log.append("\(step) settle \(chosen) \(action) claim \(answers[0])")
        if answers[0] != answers[1] {
          var recent = log.suffix(70).joined(separator: "\n")
          for (index, target) in targets.enumerated() {
            let waiting = try await target.jobs(queue: fairQueue, status: nil, after: nil, limit: 1_000)
            let interesting = Set(answers[0] + answers[1])
            recent += "\nstore \(index):"
            for record in waiting where interesting.contains(fairText(record)) {
              recent +=
                " [\(fairText(record)) id \(record.id.rawValue) \(record.status) p\(record.priority) run \(record.runAt.timeIntervalSince(fairT0)) fair \(record.fairnessKey ?? "-") limit \(record.limitKey ?? "-") attempts \(record.attempts)]"
            }
          }
          Issue.record(
            "round \(round) step \(step) at \(time) s: in-memory \(answers[0]) vs SQLite \(answers[1])\n\(recent)"
          )
          break
        }
      }
      // Mostly forward; now and then the clock steps back.
      time += next(6) == 0 ? -0.7 : [0.001, 0.1, 0.25, 0.5, 1, 3][next(6)]
    }
    await sqlite.close()
  }

  /// Cancelling a *scheduled* job of a limit key lets none of the key's held jobs go (only a job
  /// that was ready or running can be the one a stop made claimable), so a new fair job's turn
  /// starts from the same head on both stores.
  @Test func cancellingAScheduledJobOfALimitKeyMovesNoTurn() async throws {
    let folder = try TemporaryFolder()
    var orders: [String: [String]] = [:]
    for (name, store) in try fairStores(folder) {
      try await store.setLimits(QueueLimits(keyConcurrency: 1), queue: fairQueue)
      _ = try await store.enqueue([fairJob("r1", limitKey: "h")], queue: fairQueue, clock: fairNow(0))
      let running = try await fairClaim(store, now: 0)
      #expect(running.map(fairText) == ["r1"], "\(name): \(running.map(fairText))")
      _ = try await store.enqueue([fairJob("p1", limitKey: "h")], queue: fairQueue, clock: fairNow(0))
      let held = try await fairClaim(store, now: 0)
      #expect(held.isEmpty, "\(name): p1 held by h's limit: \(held.map(fairText))")
      let later = try await store.enqueue(
        [fairJob("s1", at: 100, limitKey: "h")], queue: fairQueue, clock: fairNow(0))
      _ = try await store.cancel(later.map(\.id), queue: fairQueue, clock: fairNow(1))
      _ = try await store.enqueue(
        [fairJob("a1", fair: "A", at: 1), fairJob("x", at: 0.5)], queue: fairQueue, clock: fairNow(1))
      orders[name] = try await fairClaim(store, now: 2).map(fairText)
      if let sqlite = store as? SQLiteJobStore { await sqlite.close() }
    }
    #expect(orders["in-memory"] == orders["SQLite"], "stores disagree: \(orders)")
  }

  /// As above, by a replacement (`onConflict: .replace`) of a scheduled job of a limit key.
  @Test func replacingAScheduledJobOfALimitKeyMovesNoTurn() async throws {
    let folder = try TemporaryFolder()
    var orders: [String: [String]] = [:]
    for (name, store) in try fairStores(folder) {
      try await store.setLimits(QueueLimits(keyConcurrency: 1), queue: fairQueue)
      _ = try await store.enqueue([fairJob("r1", limitKey: "h")], queue: fairQueue, clock: fairNow(0))
      _ = try await fairClaim(store, now: 0)
      _ = try await store.enqueue([fairJob("p1", limitKey: "h")], queue: fairQueue, clock: fairNow(0))
      let held = try await fairClaim(store, now: 0)
      #expect(held.isEmpty, "\(name): p1 held by h's limit: \(held.map(fairText))")
      _ = try await store.enqueue(
        [fairJob("s1", at: 100, dedup: "s", limitKey: "h")], queue: fairQueue, clock: fairNow(0))
      _ = try await store.enqueue(
        [fairJob("s1'", at: 100, dedup: "s", onConflict: .replace, limitKey: "h")], queue: fairQueue,
        clock: fairNow(1))
      _ = try await store.enqueue(
        [fairJob("a1", fair: "A", at: 1), fairJob("x", at: 0.5)], queue: fairQueue, clock: fairNow(1))
      orders[name] = try await fairClaim(store, now: 2).map(fairText)
      if let sqlite = store as? SQLiteJobStore { await sqlite.close() }
    }
    #expect(orders["in-memory"] == orders["SQLite"], "stores disagree: \(orders)")
  }
}
