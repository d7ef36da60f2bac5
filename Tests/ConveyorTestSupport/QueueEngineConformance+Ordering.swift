import Conveyor
import Foundation
import Synchronization

extension QueueEngineConformance {
  /// An item of an ordering key.
  struct Step: Queueable, Hashable {
    var key: String
    var index: Int
    var failsFirst = false
    var orderingKey: String? { key }
  }

  /// An item with an ordering key.
  struct Lined: Queueable, Hashable {
    var name: String
    var key: String
    var orderingKey: String? { key }
  }

  /// The error a failing handler of the ordering checks throws.
  struct OrderingFailure: Error {}

  /// Ordering keys through a queue, on every store.
  static let orderingChecks: [JobStoreCheck] = [
    check("a queue whose dead heads release their key runs the rest of the key; by default the key waits") {
      store in
      for policy in DeadHeadPolicy.allCases {
        var configuration = configuration("dead-\(policy.rawValue)")
        configuration.autoStart = false
        configuration.deadHeadPolicy = policy
        let runs = Runs()
        let queue = try JobQueue<Lined>(configuration: configuration, store: store) { item, _ in
          runs.append(item.name)
          return item.name == "first" ? .discard(reason: "gone for good") : .handled
        }
        let added = try await queue.add(
          contentsOf: ["first", "second", "third"].map { Lined(name: $0, key: "k") })
        queue.start()
        await queue.waitUntilFinished()
        await queue.shutdown()
        let dead = try await store.job(added[0].id)
        switch policy {
        case .holdsKey:
          try expect(runs.all == ["first"], "the key waits behind its dead head: \(runs.all)")
          try expect(dead?.orderingKey == "k", "the dead head keeps its key: \(String(describing: dead))")
          let counts = try await store.counts(queue: configuration.identifier, clock: SystemJobClock())
          try expect(counts.held == 2 && counts.dead == 1, "two held behind it: \(counts)")
        case .releasesKey:
          try expect(runs.all == ["first", "second", "third"], "the key goes on, in order: \(runs.all)")
          try expect(
            dead?.status == .dead && dead?.orderingKey == nil,
            "dead, out of its key: \(String(describing: dead))")
        }
      }
    },
    check("a queue at concurrency 4 runs each key's jobs one at a time, in order, retries included") {
      store in
      var configuration = configuration()
      configuration.autoStart = false
      configuration.concurrency = 4
      configuration.retryPolicy = .fixed(.milliseconds(20))
      let log = Mutex((running: Set<String>(), order: [String: [Int]](), overlaps: [String]()))
      let queue = try JobQueue<Step>(configuration: configuration, store: store) { step, context in
        let overlapped = log.withLock { log in
          log.order[step.key, default: []].append(step.index)
          return !log.running.insert(step.key).inserted
        }
        if overlapped { log.withLock { $0.overlaps.append("\(step.key) \(step.index)") } }
        try await Task.sleep(for: .milliseconds(2))
        log.withLock { _ = $0.running.remove(step.key) }
        if step.failsFirst && context.attempts == 1 {
          return .retry(after: .milliseconds(20), reason: "once")
        }
        return .handled
      }
      var steps: [Step] = []
      for index in 0..<6 {
        for key in ["a", "b", "c"] { steps.append(Step(key: key, index: index, failsFirst: index == 2)) }
      }
      _ = try await queue.add(contentsOf: steps)
      let counts = try await queue.count()
      try expect(counts.held == 15 && counts.ready == 3, "three heads, 15 held: \(counts)")
      queue.start()
      await queue.waitUntilFinished()
      await queue.shutdown()
      let result = log.withLock { $0 }
      try expect(result.overlaps.isEmpty, "two of a key at once: \(result.overlaps)")
      for key in ["a", "b", "c"] {
        try expect(
          result.order[key] == [0, 1, 2, 2, 3, 4, 5],
          "key \(key) in order: \(String(describing: result.order[key]))")
      }
    },
    check("a queue refuses an item whose ordering key breaks the rules, storing nothing") { store in
      let queue = try JobQueue<Step>(configuration: configuration(), store: store) { _, _ in .handled }
      for bad in ["", "a\u{0}b", String(repeating: "é", count: 257)] {
        do {
          _ = try await queue.add(contentsOf: [Step(key: "fine", index: 0), Step(key: bad, index: 1)])
          throw ConformanceFailure(description: "took the key \(bad.debugDescription.prefix(20))")
        } catch JobQueueError.invalidOrderingKey(let message) {
          try expect(!message.isEmpty, "a message")
        }
      }
      try expect(try await queue.count().total == 0, "nothing stored")
      await queue.shutdown()
    },
    check("ordering key: waitUntilFinished waits for jobs held behind a head waiting for its retry") {
      store in
      var configuration = configuration()
      configuration.autoStart = false
      configuration.retryPolicy = .fixed(.milliseconds(300))
      let runs = Runs()
      let queue = try JobQueue<Lined>(configuration: configuration, store: store) { item, context in
        runs.append("\(item.name)#\(context.attempts)")
        if item.name == "a1" && context.attempts == 1 { throw OrderingFailure() }
        return .handled
      }
      try await queue.add(Lined(name: "a1", key: "K"))
      try await queue.add(Lined(name: "a2", key: "K"))
      queue.start()
      await queue.waitUntilFinished()
      let seen = runs.all
      await queue.shutdown()
      try expect(seen == ["a1#1", "a1#2", "a2#1"], "every job ran, in order: \(seen)")
    },
    check("ordering key: a head that died under the retry policy is re-queued and runs before the rest") {
      store in
      var configuration = configuration()
      configuration.autoStart = false
      configuration.retryPolicy = .fixed(.zero)
      configuration.maxAttempts = 2
      let runs = Runs()
      let fail = Mutex(true)
      let queue = try JobQueue<Lined>(configuration: configuration, store: store) { item, context in
        runs.append("\(item.name)#\(context.attempts)")
        if item.name == "a1" && fail.withLock({ $0 }) { throw OrderingFailure() }
        return .handled
      }
      let head = try await queue.add(Lined(name: "a1", key: "K")).id
      try await queue.add(Lined(name: "a2", key: "K"))
      queue.start()
      try await waitFor("a1 to die") { try await store.job(head)?.status == .dead }
      try await Task.sleep(for: .milliseconds(200))
      try expect(runs.all == ["a1#1", "a1#2"], "a2 waits behind the dead a1: \(runs.all)")
      fail.withLock { $0 = false }
      try expect(try await queue.requeueDead([head]) == 1, "re-queued")
      try await waitFor("both to run") { runs.all.count == 4 }
      await queue.waitUntilFinished()
      await queue.shutdown()
      try expect(runs.all == ["a1#1", "a1#2", "a1#1", "a2#1"], "a1 again first, then a2: \(runs.all)")
    },
  ]
}
