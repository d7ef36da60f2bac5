import Conveyor
import Foundation

extension QueueEngineConformance {
  /// A dead head that releases its key (`DeadHeadPolicy.releasesKey`) through the engine: every way a head dies.
  static let deadHeadChecks: [JobStoreCheck] = [
    check(
      "a dead head releasing its key: attempts spent, undecodable payload and a lost worker each release the key"
    ) {
      store in
      var configuration = configuration("dead-releases")
      configuration.autoStart = false
      configuration.deadHeadPolicy = .releasesKey
      configuration.maxAttempts = 1
      let runs = Runs()
      let queue = try JobQueue<Lined>(configuration: configuration, store: store) { item, _ in
        runs.append(item.name)
        if item.name == "fails" { throw OrderingFailure() }
        return .handled
      }
      // Key a: attempts spent.
      let a = try await queue.add(contentsOf: ["fails", "a2"].map { Lined(name: $0, key: "a") })
      // Key b: an undecodable head.
      let b = try await store.enqueue(
        [NewJob(payload: Data("not json".utf8), orderingKey: "b")], queue: "dead-releases",
        clock: SystemJobClock())
      _ = try await queue.add(Lined(name: "b2", key: "b"))
      // Key c: a head claimed by a worker that vanished with its last attempt.
      let c = try await store.enqueue(
        [NewJob(payload: try JSONEncoder().encode(Lined(name: "lost", key: "c")), orderingKey: "c")],
        queue: "dead-releases", clock: SystemJobClock())
      _ = try await queue.add(Lined(name: "c2", key: "c"))
      let lost = try await store.settleAndClaim(
        [], queue: "dead-releases", limit: 10, lease: Lease(owner: "gone", duration: .milliseconds(1)),
        clock: SystemJobClock())
      try expect(lost.claimed.count == 3, "the three heads claimed by the lost worker: \(lost.claimed.count)")
      // Give a's and b's heads back so they run normally; c's lease lapses.
      let back = lost.claimed.filter { $0.orderingKey != "c" }.map {
        JobSettlement(claim: $0.claim, action: .release(error: nil))
      }
      _ = try await store.settleAndClaim(
        back, queue: "dead-releases", limit: 0, lease: Lease(owner: "gone", duration: .seconds(1)),
        clock: SystemJobClock())
      try await Task.sleep(for: .milliseconds(20))
      queue.start()
      await queue.waitUntilFinished()
      await queue.shutdown()
      try expect(
        Set(runs.all) == ["fails", "a2", "b2", "c2"], "every later job ran: \(runs.all)")
      for id in [a[0].id, b[0].id, c[0].id] {
        let dead = try await store.job(id)
        try expect(
          dead?.status == .dead && dead?.orderingKey == nil,
          "dead, out of its key: \(String(describing: dead))")
      }
    }
  ]
}
