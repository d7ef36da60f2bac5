import Conveyor
import ConveyorTestSupport
import Foundation
import Testing

@testable import ConveyorPostgres

/// Two stores on one schema of the shared server: `worker` for the idle queue, `other` standing
/// for another process.
func openWakeStores(_ prefix: String = "wake") async throws -> (
  PostgresServer, worker: PostgresJobStore, other: PostgresJobStore
) {
  let server = try await PostgresServer.shared()
  let schema = uniqueSchema(prefix)
  let worker = try await PostgresJobStore.open(url: server.url, options: .init(schema: schema))
  let other = try await PostgresJobStore.open(url: server.url, options: .init(schema: schema))
  return (server, worker, other)
}

/// Makes sure `store`'s listener is up (it starts with the first wait) and nothing is pending.
func primeListener(_ store: PostgresJobStore, through other: PostgresJobStore, queue: String) async throws {
  var live = false
  for _ in 0..<50 where !live {
    let waiter = Task { await store.waitForWork(queue: queue, timeout: .seconds(2)) }
    try await Task.sleep(for: .milliseconds(100))
    try await other.setPaused(false, queue: queue)
    live = await waiter.value
  }
  #expect(live, "the listener hears a resume")
  while await store.waitForWork(queue: queue, timeout: .milliseconds(300)) {}
}

/// Waits until exactly `count` waits of `store`'s listener are registered (each registered wait
/// arms a timeout, freed as soon as the wait ends).
func waitsRegistered(_ store: PostgresJobStore, _ count: Int) async -> Bool {
  await eventually(timeout: .seconds(10)) { store.listener!.armedTimeouts == count }
}

/// The first value of `stream`, or nil when none comes within `seconds`.
func first(_ stream: AsyncStream<Int>, within seconds: Int = 5) async -> Int? {
  await withTaskGroup(of: Int?.self) { group in
    group.addTask {
      var iterator = stream.makeAsyncIterator()
      return await iterator.next()
    }
    group.addTask {
      try? await Task.sleep(for: .seconds(seconds))
      return nil
    }
    let value = await group.next() ?? nil
    group.cancelAll()
    return value
  }
}

/// Primes `worker`'s listener for `queue` and makes it count two watchers of the queue (two waits
/// at once, both woken by one notification), then waits until no wait is left registered.
func countTwoWatchers(_ worker: PostgresJobStore, through other: PostgresJobStore, queue: String) async throws
{
  try await primeListener(worker, through: other, queue: queue)
  // Every earlier wait's timeout freed first: a notified wait's is freed once its timer task sees
  // the cancel.
  #expect(await waitsRegistered(worker, 0))
  let first = Task { await worker.waitForWork(queue: queue, timeout: .seconds(60)) }
  let second = Task { await worker.waitForWork(queue: queue, timeout: .seconds(60)) }
  #expect(await waitsRegistered(worker, 2))
  try await other.setPaused(false, queue: queue)
  let (firstWoken, secondWoken) = (await first.value, await second.value)
  #expect(firstWoken && secondWoken, "both waiting watchers are woken")
  #expect(await waitsRegistered(worker, 0))
}
