import Conveyor
import Foundation

extension JobStoreConformance {
  /// The history of finished jobs, on every store: what a finished job keeps, the order history
  /// pages come in, and pruning.
  static let historyChecks: [JobStoreCheck] = [
    check("a completed job is kept with its finishing time, run time and output") { store in
      _ = try await store.enqueue([job("kept"), job("gone")], queue: "q", clock: now(0))
      let claimed = try await claim(store, limit: 2, now: 1).claimed
      let output = Data(#"{"receipt":"r-1"}"#.utf8)
      let settled = try await claim(
        store, limit: 0,
        settling: [
          JobSettlement(
            claim: claimed[0].claim, action: .complete, runDuration: .milliseconds(1_234), output: output),
          JobSettlement(claim: claimed[1].claim, action: .complete, keepsHistory: false),
        ], now: 3)
      try expect(settled.staleSettlements.isEmpty, "both applied: \(settled.staleSettlements)")
      let record = try await store.job(claimed[0].id)
      try expect(record?.status == .completed, "completed: \(String(describing: record?.status))")
      try expect(record?.finishedAt == at(3), "finished at the store's time: \(String(describing: record))")
      try expect(record?.runDuration == .milliseconds(1_234), "run time: \(String(describing: record))")
      try expect(record?.output == output, "output: \(String(describing: record?.output))")
      try expect(record?.attempts == 1 && record?.leaseOwner == nil, "one attempt, no lease")
      try expect(try await store.job(claimed[1].id) == nil, "a job kept without history is deleted")
      let counts = try await store.counts(queue: "q", clock: now(4))
      try expect(counts == JobCounts(completed: 1), "one completed: \(counts)")
      // A completed job is settled: another outcome for its claim is refused.
      let late = try await claim(
        store, limit: 0, settling: [settle(claimed[0], .kill(error: "late"))], now: 5)
      try expect(late.staleSettlements == [claimed[0].claim], "refused: \(late.staleSettlements)")
      try expect(try await store.job(claimed[0].id)?.status == .completed, "still completed")
    },
    check("every failed attempt's error is kept, the latest ones, each bounded") { store in
      _ = try await store.enqueue([job("flaky")], queue: "q", clock: now(0))
      let attempts = JobHistory.maximumErrors + 3
      let long = String(repeating: "é", count: JobHistory.maximumErrorBytes)
      for attempt in 1...attempts {
        let held = try await claim(store, limit: 1, now: Double(attempt)).claimed
        let record = try expectOne(held)
        let action: JobSettlement.Action =
          attempt == attempts
          ? .kill(error: "gave up") : .retry(after: .zero, error: attempt == 2 ? long : "error \(attempt)")
        _ = try await claim(
          store, limit: 0,
          settling: [JobSettlement(claim: record.claim, action: action, runDuration: .milliseconds(attempt))],
          now: Double(attempt))
      }
      let dead = try await store.jobs(queue: "q", status: .dead, after: nil, limit: 1)
      let record = try expectOne(dead)
      try expect(record.finishedAt == at(Double(attempts)), "finished when it died: \(record)")
      try expect(record.runDuration == .milliseconds(attempts), "its last attempt's run time: \(record)")
      let expected = (4..<attempts).map { "error \($0)" } + ["gave up"]
      try expect(record.errors.count == JobHistory.maximumErrors, "the latest kept: \(record.errors.count)")
      try expect(record.errors == expected, "in order, oldest first: \(record.errors)")
      try expect(record.lastError == "gave up", "the last error: \(String(describing: record.lastError))")
      // Attempt 2's error is long: bounded when kept. Re-run to see it kept in bounds.
      _ = try await store.enqueue([job("long")], queue: "long", clock: now(0))
      let held = try expectOne(try await claim(store, "long", limit: 1, now: 1).claimed)
      _ = try await claim(store, "long", limit: 0, settling: [settle(held, .kill(error: long))], now: 2)
      let cut = try await store.jobs(queue: "long", status: .dead, after: nil, limit: 1).first
      try expect(
        cut?.errors.count == 1 && (cut?.errors[0].utf8.count ?? .max) <= JobHistory.maximumErrorBytes
          && cut?.errors[0].hasSuffix("…") == true,
        "a long error is cut: \(cut?.errors.first?.utf8.count ?? -1) bytes")
    },
    check("history pages come in the order jobs finished, from the job after the cursor") { store in
      let added = try await store.enqueue((0..<5).map { job("j\($0)") }, queue: "q", clock: now(0))
      let claimed = try await claim(store, limit: 5, now: 1).claimed
      // Finished in the order j3, j1, j4 (two at the same time: then by ID), j0; j2 stays running.
      let order: [(Int, Double)] = [(3, 2), (1, 3), (4, 3), (0, 4)]
      for (index, time) in order {
        let record = claimed.first { $0.id == added[index].id }!
        _ = try await claim(store, limit: 0, settling: [settle(record, .complete)], now: time)
      }
      let first = try await store.jobs(queue: "q", status: .completed, after: nil, limit: 2)
      try expect(first.map(text) == ["j3", "j1"], "first page: \(first.map(text))")
      let second = try await store.jobs(queue: "q", status: .completed, after: first.last?.id, limit: 2)
      try expect(second.map(text) == ["j4", "j0"], "second page: \(second.map(text))")
      let end = try await store.jobs(queue: "q", status: .completed, after: second.last?.id, limit: 2)
      try expect(end.isEmpty, "nothing after the last: \(end.map(text))")
      // A cursor that is not a completed job starts from the oldest.
      let restarted = try await store.jobs(queue: "q", status: .completed, after: added[2].id, limit: 1)
      try expect(restarted.map(text) == ["j3"], "from the oldest: \(restarted.map(text))")
      // Listing every status keeps ID order, the history included.
      let all = try await store.jobs(queue: "q", status: nil, after: nil, limit: 10)
      try expect(all.map(text) == ["j0", "j1", "j2", "j3", "j4"], "all in ID order: \(all.map(text))")
      let summaries = try await store.jobSummaries(
        queue: "q", status: .completed, after: nil, limit: 10, payloadPrefix: 1)
      try expect(
        summaries.map(\.record.id) == [3, 1, 4, 0].map { added[$0].id }, "summaries in the same order")
    },
    check("prune deletes a finished status's oldest jobs in batches, and nothing else") { store in
      // Completed at 10, 20, 30, 40 s; one dead at 15 s; one waiting; one completed elsewhere.
      let added = try await store.enqueue((0..<5).map { job("c\($0)") }, queue: "q", clock: now(0))
      _ = try await store.enqueue([job("other")], queue: "other", clock: now(0))
      let claimed = try await claim(store, limit: 5, now: 1).claimed
      for (index, time) in [(0, 10.0), (1, 20), (2, 30), (3, 40)] {
        _ = try await claim(store, limit: 0, settling: [settle(claimed[index], .complete)], now: time)
      }
      _ = try await claim(store, limit: 0, settling: [settle(claimed[4], .kill(error: "x"))], now: 15)
      _ = try await store.enqueue([job("waiting")], queue: "q", clock: now(41))
      let other = try expectOne(try await claim(store, "other", limit: 1, now: 1).claimed)
      _ = try await claim(store, "other", limit: 0, settling: [settle(other, .complete)], now: 5)
      // At 45 s, older than 10 s: finished before 35 s, the three at 10, 20, 30; one batch of 2.
      let batch = try await store.prune(
        queue: "q", status: .completed, olderThan: .seconds(10), limit: 2, clock: now(45))
      try expect(batch == 2, "a batch of at most the limit: \(batch)")
      let oldest = [try await store.job(added[0].id), try await store.job(added[1].id)]
      try expect(oldest == [nil, nil], "oldest first")
      try expect(try await store.job(added[2].id) != nil, "the third is left for the next batch")
      let rest = try await store.prune(
        queue: "q", status: .completed, olderThan: .seconds(10), limit: 2, clock: now(45))
      try expect(rest == 1, "the rest: \(rest)")
      let none = try await store.prune(
        queue: "q", status: .completed, olderThan: .seconds(10), limit: 2, clock: now(45))
      try expect(none == 0, "none left that old: \(none)")
      try expect(try await store.job(added[3].id)?.status == .completed, "the newer one is kept")
      try expect(try await store.job(added[4].id)?.status == .dead, "a dead one is another status")
      for status in [JobStatus.pending, .running] {
        let unfinished = try await store.prune(
          queue: "q", status: status, olderThan: .zero, limit: 10, clock: now(45))
        try expect(unfinished == 0, "\(status) is never pruned: \(unfinished)")
      }
      // A zero age prunes every job of the status, whenever it finished.
      let all = try await store.prune(
        queue: "q", status: .completed, olderThan: .zero, limit: 10, clock: now(45))
      try expect(all == 1, "the last completed: \(all)")
      let dead = try await store.prune(
        queue: "q", status: .dead, olderThan: .seconds(29), limit: 10, clock: now(45))
      try expect(dead == 1, "the dead one, finished at 15 s: \(dead)")
      let counts = try await store.counts(queue: "q", clock: now(45))
      try expect(counts == JobCounts(ready: 1), "the waiting job is left: \(counts)")
      try expect(
        try await store.counts(queue: "other", clock: now(45)) == JobCounts(completed: 1),
        "other queues untouched")
    },
    check("a re-queued dead job is no longer finished; a finished job holds no deduplication key") { store in
      _ = try await store.enqueue([job("a", key: "k")], queue: "q", clock: now(0))
      let held = try expectOne(try await claim(store, limit: 1, now: 1).claimed)
      _ = try await claim(store, limit: 0, settling: [settle(held, .kill(error: "x"))], now: 2)
      let again = try await store.enqueue([job("b", key: "k")], queue: "q", clock: now(3))
      try expect(again[0].inserted, "a dead job's key does not hold")
      _ = try await store.remove([again[0].id], queue: "q")
      try expect(try await store.requeueDead(nil, queue: "q", clock: now(4)) == 1, "re-queued")
      let record = try await store.job(held.id)
      try expect(
        record?.status == .pending && record?.finishedAt == nil,
        "waiting, not finished: \(String(describing: record))")
      try expect(record?.errors == ["x"], "its errors are kept: \(String(describing: record?.errors))")
      let pruned = try await store.prune(
        queue: "q", status: .dead, olderThan: .zero, limit: 10, clock: now(5))
      try expect(pruned == 0, "a re-queued job is not pruned as dead: \(pruned)")
    },
    check("a history page after a job of another queue starts from the queue's oldest") { store in
      // Queue q's jobs complete at 2 s and 4 s; another queue's job completes between them, at 3 s.
      _ = try await store.enqueue([job("q1"), job("q2")], queue: "q", clock: now(0))
      _ = try await store.enqueue([job("elsewhere")], queue: "other", clock: now(0))
      let mine = try await claim(store, limit: 2, now: 1).claimed
      let theirs = try expectOne(try await claim(store, "other", limit: 1, now: 1).claimed)
      _ = try await claim(store, limit: 0, settling: [settle(mine[0], .complete)], now: 2)
      _ = try await claim(store, "other", limit: 0, settling: [settle(theirs, .complete)], now: 3)
      _ = try await claim(store, limit: 0, settling: [settle(mine[1], .complete)], now: 4)
      // The cursor is not one of q's completed jobs: the page starts from q's oldest, as for any
      // cursor that is not one of them (it is not a place in q's history).
      let page = try await store.jobs(queue: "q", status: .completed, after: theirs.id, limit: 10)
      try expect(page.map(text) == ["q1", "q2"], "from the oldest: \(page.map(text))")
      let summaries = try await store.jobSummaries(
        queue: "q", status: .completed, after: theirs.id, limit: 10, payloadPrefix: 8)
      try expect(
        summaries.map(\.record.id) == mine.map(\.id), "summaries the same: \(summaries.map(\.record.id))")
    },
    check("prune counts each job it deletes once") { store in
      // A job dies, is re-queued and dies again within the same millisecond of the store's clock.
      _ = try await store.enqueue([job("twice")], queue: "q", clock: now(0))
      let first = try expectOne(try await claim(store, limit: 1, now: 1).claimed)
      _ = try await claim(store, limit: 0, settling: [settle(first, .kill(error: "one"))], now: 1)
      try expect(try await store.requeueDead(nil, queue: "q", clock: now(1)) == 1, "re-queued")
      let second = try expectOne(try await claim(store, limit: 1, now: 1).claimed)
      _ = try await claim(store, limit: 0, settling: [settle(second, .kill(error: "two"))], now: 1)
      let pruned = try await store.prune(
        queue: "q", status: .dead, olderThan: .zero, limit: 10, clock: now(2))
      try expect(pruned == 1, "one job deleted, counted once: \(pruned)")
      try expect(try await store.counts(queue: "q", clock: now(2)) == JobCounts(), "none left")
    },
    check("an error of NUL characters is kept within the bound") { store in
      // The bound is on the error as kept (PostgreSQL keeps a NUL as U+FFFD, 3 bytes of UTF-8).
      _ = try await store.enqueue([job("nul")], queue: "q", clock: now(0))
      let held = try expectOne(try await claim(store, limit: 1, now: 1).claimed)
      let nuls = String(repeating: "\0", count: JobHistory.maximumErrorBytes)
      _ = try await claim(store, limit: 0, settling: [settle(held, .kill(error: nuls))], now: 2)
      let record = try await store.job(held.id)
      let bytes = record?.errors.first?.utf8.count ?? .max
      try expect(record?.errors.count == 1 && bytes <= JobHistory.maximumErrorBytes, "kept \(bytes) bytes")
    },
  ]
}
