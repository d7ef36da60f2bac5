import Conveyor
import Foundation

extension JobStoreConformance {
  /// A job with a deduplication key and the given scope and conflict choice.
  static func keyed(
    _ text: String, key: String = "k", scope: DeduplicationScope = .waiting,
    onConflict: DeduplicationConflict = .useExisting, priority: Int = 0, at seconds: Double = 0,
    timeLimit: Duration? = nil
  ) -> NewJob {
    NewJob(
      payload: Data(text.utf8), priority: priority, runTime: .at(at(seconds)), deduplicationKey: key,
      deduplicationScope: scope, onConflict: onConflict, timeLimit: timeLimit)
  }

  /// Deduplication scopes and replacing a waiting job, on every store.
  static let deduplicationChecks: [JobStoreCheck] = [
    check("scope waiting: a running job of the key does not stop a new one") { store in
      let first = try expectOne(try await store.enqueue([keyed("a")], queue: "q", clock: now(0)))
      let waiting = try expectOne(try await store.enqueue([keyed("b")], queue: "q", clock: now(0)))
      try expect(waiting.outcome == .existing && waiting.id == first.id, "merged while waiting: \(waiting)")
      _ = try await claim(store, now: 1)
      let second = try expectOne(try await store.enqueue([keyed("c")], queue: "q", clock: now(1)))
      try expect(second.outcome == .inserted, "stored beside the running job: \(second)")
    },
    check("scope waitingOrRunning: a running job of the key stops a new one until it finishes") { store in
      let first = try expectOne(
        try await store.enqueue([keyed("a", scope: .waitingOrRunning)], queue: "q", clock: now(0)))
      let held = try expectOne(try await claim(store, now: 1).claimed)
      let during = try expectOne(
        try await store.enqueue([keyed("b", scope: .waitingOrRunning)], queue: "q", clock: now(1)))
      try expect(during.outcome == .existing && during.id == first.id, "the running job: \(during)")
      // Other keys and queues are not affected.
      let other = try expectOne(
        try await store.enqueue(
          [keyed("c", key: "other", scope: .waitingOrRunning)], queue: "q", clock: now(1)))
      try expect(other.outcome == .inserted, "another key: \(other)")
      let elsewhere = try expectOne(
        try await store.enqueue([keyed("d", scope: .waitingOrRunning)], queue: "r", clock: now(1)))
      try expect(elsewhere.outcome == .inserted, "another queue: \(elsewhere)")
      _ = try await claim(store, limit: 0, settling: [settle(held, .complete)], now: 2)
      let after = try expectOne(
        try await store.enqueue([keyed("e", scope: .waitingOrRunning)], queue: "q", clock: now(2)))
      try expect(after.outcome == .inserted, "a completed job does not count: \(after)")
    },
    check("scope completedWithin: a job completed within the period stops a new one, then not") { store in
      let scope = DeduplicationScope.completedWithin(.seconds(3_600))
      let first = try expectOne(
        try await store.enqueue([keyed("a", scope: scope)], queue: "q", clock: now(0)))
      let held = try expectOne(try await claim(store, now: 1).claimed)
      _ = try await claim(store, limit: 0, settling: [settle(held, .complete)], now: 10)
      let within = try expectOne(
        try await store.enqueue([keyed("b", scope: scope)], queue: "q", clock: now(3_609)))
      try expect(within.outcome == .existing && within.id == first.id, "completed 3,599 s before: \(within)")
      let edge = try expectOne(
        try await store.enqueue([keyed("c", scope: scope)], queue: "q", clock: now(3_610)))
      try expect(edge.outcome == .existing, "completed exactly the period before still counts: \(edge)")
      let later = try expectOne(
        try await store.enqueue([keyed("d", scope: scope)], queue: "q", clock: now(3_611)))
      try expect(later.outcome == .inserted, "completed longer ago: \(later)")
    },
    check("scope completedWithin: dead and cancelled jobs do not count") { store in
      let scope = DeduplicationScope.completedWithin(.seconds(3_600))
      _ = try await store.enqueue([keyed("dies", scope: scope)], queue: "q", clock: now(0))
      let held = try expectOne(try await claim(store, now: 1).claimed)
      _ = try await claim(store, limit: 0, settling: [settle(held, .kill(error: "no"))], now: 2)
      let afterDeath = try expectOne(
        try await store.enqueue([keyed("again", scope: scope)], queue: "q", clock: now(3)))
      try expect(afterDeath.outcome == .inserted, "a dead job does not count: \(afterDeath)")
      let cancelled = try await store.cancel([afterDeath.id], queue: "q", clock: now(4))
      try expect(cancelled == [.cancelledWaiting], "cancelled: \(cancelled)")
      let afterCancel = try expectOne(
        try await store.enqueue([keyed("third", scope: scope)], queue: "q", clock: now(5)))
      try expect(afterCancel.outcome == .inserted, "a cancelled job does not count: \(afterCancel)")
    },
    check("onConflict replace: a waiting job takes the new payload, priority, run time and time limit") {
      store in
      let first = try expectOne(
        try await store.enqueue([keyed("old", onConflict: .replace, at: 5)], queue: "q", clock: now(0)))
      try expect(first.outcome == .inserted, "inserted: \(first)")
      let replaced = try expectOne(
        try await store.enqueue(
          [keyed("new", onConflict: .replace, priority: 7, at: 30, timeLimit: .seconds(9))], queue: "q",
          clock: now(1)))
      try expect(replaced.outcome == .replaced && replaced.id == first.id, "replaced in place: \(replaced)")
      let record = try await store.job(first.id)
      try expect(record.map(text) == "new", "the new payload: \(String(describing: record.map(text)))")
      try expect(
        record?.priority == 7 && record?.runAt == at(30),
        "priority and run time: \(String(describing: record))")
      try expect(record?.timeLimit == .seconds(9), "time limit: \(String(describing: record?.timeLimit))")
      let counts = try await store.counts(queue: "q", clock: now(1))
      try expect(counts == JobCounts(scheduled: 1), "still one job, scheduled: \(counts)")
      // Not due at its old time; due at its new one, with its new payload.
      try expect(try await claim(store, now: 10).claimed.isEmpty, "not due at its old run time")
      let held = try expectOne(try await claim(store, now: 30).claimed)
      try expect(text(held) == "new" && held.id == first.id, "runs once, with the new payload: \(text(held))")
      // Made ready again by a replace with an earlier time.
      _ = try await claim(store, limit: 0, settling: [settle(held, .complete)], now: 31)
      let next = try expectOne(
        try await store.enqueue([keyed("later", onConflict: .replace, at: 100)], queue: "q", clock: now(31)))
      let sooner = try expectOne(
        try await store.enqueue([keyed("sooner", onConflict: .replace, at: 31)], queue: "q", clock: now(31)))
      try expect(sooner.outcome == .replaced && sooner.id == next.id, "replaced: \(sooner)")
      let ready = try expectOne(try await claim(store, now: 31).claimed)
      try expect(text(ready) == "sooner", "ready at once with the new payload: \(text(ready))")
    },
    check("onConflict replace keeps the waiting job's attempts, errors and place") { store in
      _ = try await store.enqueue([keyed("a", onConflict: .replace), job("b")], queue: "q", clock: now(0))
      let held = try expectOne(try await claim(store, now: 1).claimed)
      _ = try await claim(
        store, limit: 0, settling: [settle(held, .retry(after: .zero, error: "boom"))], now: 2)
      let replaced = try expectOne(
        try await store.enqueue([keyed("a2", onConflict: .replace)], queue: "q", clock: now(3)))
      try expect(replaced.outcome == .replaced && replaced.id == held.id, "replaced: \(replaced)")
      let record = try await store.job(held.id)
      try expect(
        record?.attempts == 1 && record?.errors == ["boom"],
        "attempts and errors kept: \(String(describing: record))")
      try expect(record?.lastError == "boom", "last error kept")
      // The retried job went behind "b"; the replace keeps that place.
      let order = try await claim(store, limit: 2, now: 4).claimed.map(text)
      try expect(order == ["b", "a2"], "its place: \(order)")
    },
    check("onConflict replace does not touch a running job") { store in
      let first = try expectOne(
        try await store.enqueue([keyed("a", onConflict: .replace)], queue: "q", clock: now(0)))
      let held = try expectOne(try await claim(store, now: 1).claimed)
      // Scope waiting: a new job runs after the running one.
      let waiting = try expectOne(
        try await store.enqueue([keyed("b", onConflict: .replace)], queue: "q", clock: now(1)))
      try expect(waiting.outcome == .inserted && waiting.id != first.id, "a new job: \(waiting)")
      // Scope waitingOrRunning: the waiting one is replaced...
      let again = try expectOne(
        try await store.enqueue(
          [keyed("c", scope: .waitingOrRunning, onConflict: .replace)], queue: "q", clock: now(1)))
      try expect(again.outcome == .replaced && again.id == waiting.id, "the waiting one replaced: \(again)")
      try expect(try await store.job(held.id).map(text) == "a", "the running job's payload is untouched")
      // ...and with none waiting, the running one is the existing job, untouched.
      _ = try await store.remove([waiting.id], queue: "q")
      let running = try expectOne(
        try await store.enqueue(
          [keyed("d", scope: .waitingOrRunning, onConflict: .replace)], queue: "q", clock: now(1)))
      try expect(running.outcome == .existing && running.id == first.id, "the running job: \(running)")
      try expect(try await store.job(held.id).map(text) == "a", "still untouched")
    },
    check("a batch is taken in order: a later job of a key sees the earlier one") { store in
      let results = try await store.enqueue(
        [
          keyed("a", onConflict: .replace), keyed("b", onConflict: .replace),
          keyed("x", key: "other", scope: .waitingOrRunning), job("plain"),
          keyed("y", key: "other", scope: .waitingOrRunning),
        ], queue: "q", clock: now(0))
      try expect(
        results.map(\.outcome) == [.inserted, .replaced, .inserted, .inserted, .existing],
        "outcomes: \(results.map(\.outcome))")
      try expect(results[1].id == results[0].id && results[4].id == results[2].id, "IDs: \(results)")
      try expect(try await store.job(results[0].id).map(text) == "b", "the later payload")
      let counts = try await store.counts(queue: "q", clock: now(0))
      try expect(counts == JobCounts(ready: 3), "three jobs: \(counts)")
    },
  ]
}
