import Conveyor
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import ConveyorPostgres

/// A queue's concurrency limit under real concurrency: several stores (a connection each, so
/// claims truly overlap, which one store's serialized connection never does) drain one queue.
@Suite("PostgresJobStore concurrency limits under concurrency", .serialized)
struct LimitConcurrencyTests {
  /// The observer's reading: the most running jobs seen committed, and whether to stop.
  final class Observer: Sendable {
    let state = Mutex((most: 0, stop: false))
  }

  /// Six workers, each on its own connection, claim two jobs at a time from a queue limited to
  /// three, complete them after a moment, and claim again; an observer reads the committed count
  /// of running jobs all along. Neither the workers' own count nor the committed one ever exceeds
  /// three, and every job completes once.
  @Test func claimsOnManyConnectionsNeverExceedTheLimit() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("limits")
    let options = PostgresJobStore.Options(schema: schema)
    var opened: [PostgresJobStore] = []
    for _ in 0..<6 { opened.append(try await PostgresJobStore.open(url: server.url, options: options)) }
    let stores = opened
    let clock = SystemJobClock()
    let jobs = 300
    _ = try await stores[0].enqueue(
      (0..<jobs).map { NewJob(payload: Data("j\($0)".utf8), runAt: Date(timeIntervalSince1970: 0)) },
      queue: "q", clock: clock)
    try await stores[0].setLimits(QueueLimits(concurrency: 3), queue: "q")
    let watch = RunningWatch()
    let observer = Observer()
    let url = server.url
    try await withThrowingTaskGroup(of: Void.self) { group in
      for (index, store) in stores.enumerated() {
        group.addTask {
          let lease = Lease(owner: "w\(index)", duration: .seconds(60))
          var settling: [JobSettlement] = []
          var idle = 0
          while idle < 20 {
            watch.state.withLock { $0.running -= settling.count }
            let batch = try await store.settleAndClaim(
              settling, queue: "q", limit: 2, lease: lease, clock: clock)
            watch.state.withLock {
              $0.running += batch.claimed.count
              $0.most = max($0.most, $0.running)
              $0.done += settling.count
            }
            settling = batch.claimed.map {
              JobSettlement(claim: $0.claim, action: .complete, keepsHistory: true)
            }
            idle = batch.claimed.isEmpty ? idle + 1 : 0
            try await Task.sleep(for: .milliseconds(batch.claimed.isEmpty ? 5 : 1))
          }
          watch.state.withLock { $0.running -= settling.count }
          _ = try await store.settleAndClaim(settling, queue: "q", limit: 0, lease: lease, clock: clock)
          watch.state.withLock { $0.done += settling.count }
        }
      }
      group.addTask {
        let admin = try AdminConnection(url)
        while !observer.state.withLock({ $0.stop }) {
          let rows = try await admin.queryOffPool(
            "SELECT count(*) FROM \(schema).jobs WHERE queue = 'q' AND status = 'running'")
          let running = Int((rows.first?.first ?? nil) ?? "0") ?? 0
          observer.state.withLock { $0.most = max($0.most, running) }
          try await Task.sleep(for: .milliseconds(1))
        }
      }
      // The observer stops once the workers are done.
      while watch.state.withLock({ $0.done }) < jobs {
        try await Task.sleep(for: .milliseconds(20))
        try #require(!group.isEmpty)
      }
      observer.state.withLock { $0.stop = true }
      try await group.waitForAll()
    }
    let result = watch.state.withLock { $0 }
    #expect(result.most <= 3, "the workers held at most 3 at once, saw \(result.most)")
    #expect(observer.state.withLock { $0.most } <= 3, "the database never showed more than 3 running")
    #expect(result.done == jobs)
    let counts = try await stores[0].counts(queue: "q", clock: clock)
    #expect(counts.completed == jobs && counts.running == 0 && counts.ready == 0, "\(counts)")
    for store in stores { await store.close() }
  }
}
