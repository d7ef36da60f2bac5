import Conveyor
import Foundation
import Synchronization

extension QueueEngineConformance {
  /// An item with an ordering key.
  struct Lined: Queueable, Hashable {
    var name: String
    var key: String
    var orderingKey: String? { key }
  }

  /// The error a failing handler of the ordering checks throws.
  struct OrderingFailure: Error {}

  /// Ordering keys through the queue engine, on every store: one job of a key at a time.
  static let orderingChecks: [JobStoreCheck] = [
    check("ordering key: removing the running head does not start the next job while its handler runs") {
      store in
      var configuration = configuration()
      configuration.autoStart = false
      configuration.concurrency = 2
      let runs = Runs()
      let gate = Gate()
      let queue = try JobQueue<Lined>(configuration: configuration, store: store) { item, _ in
        runs.append("start \(item.name)")
        if item.name == "a1" { await gate.wait() }
        runs.append("end \(item.name)")
        return .handled
      }
      let head = try await queue.add(Lined(name: "a1", key: "K")).id
      try await queue.add(Lined(name: "a2", key: "K"))
      queue.start()
      try await waitFor("a1 to start") { runs.all == ["start a1"] }
      // The handler goes on (remove does not interrupt it).
      try expect(try await queue.remove(head), "removed")
      try await Task.sleep(for: .milliseconds(500))
      let during = runs.all
      gate.open()
      await queue.waitUntilFinished()
      await queue.shutdown()
      try expect(!during.contains("start a2"), "a2 started while a1's handler still ran: \(during)")
    },
    check("ordering key: cancelling the running head does not start the next job while its handler runs") {
      store in
      var configuration = configuration()
      configuration.autoStart = false
      configuration.concurrency = 2
      let runs = Runs()
      let gate = Gate()
      let queue = try JobQueue<Lined>(configuration: configuration, store: store) { item, _ in
        runs.append("start \(item.name)")
        // A handler that cannot stop at once (a write under way): it ignores cancellation.
        if item.name == "a1" { await gate.wait() }
        runs.append("end \(item.name)")
        return .handled
      }
      let head = try await queue.add(Lined(name: "a1", key: "K")).id
      try await queue.add(Lined(name: "a2", key: "K"))
      queue.start()
      try await waitFor("a1 to start") { runs.all == ["start a1"] }
      try expect(try await queue.cancel(head) == .cancelledRunning, "cancelled while running")
      try await Task.sleep(for: .milliseconds(500))
      let during = runs.all
      gate.open()
      await queue.waitUntilFinished()
      await queue.shutdown()
      try expect(!during.contains("start a2"), "a2 started while a1's handler still ran: \(during)")
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
