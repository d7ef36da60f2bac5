import Conveyor
import ConveyorTestSupport
import Foundation
import Synchronization

@testable import ConveyorSQLite

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// Leaves `store` with a last lead that had four followers, so the next leader expects four (for the
/// tests of the wait for followers).
func leadWithFourFollowers(_ store: SQLiteJobStore) async throws {
  let clock = GateClock()
  let leader = Task(executorPreference: OneThreadExecutor()) {
    try await store.enqueue([NewJob(payload: payload("first"), runAt: epoch)], queue: "jobs", clock: clock)
  }
  try await eventually("the first leader is inside its transaction") { clock.entered }
  let followers = (0..<4).map { index in
    Task {
      try await store.enqueue(
        [NewJob(payload: payload("follower \(index)"), runAt: epoch)], queue: "jobs", now: epoch)
    }
  }
  try await eventually("four adds wait behind the first leader") { store.groups.waitingCount == 4 }
  clock.open()
  _ = try await leader.value
  for follower in followers { _ = try await follower.value }
  try await eventually("the first lead ended") { store.groups.isIdle }
}

/// A store on a new file in `folder` after ``leadWithFourFollowers(_:)``, whose next leader waits
/// up to `linger` for the four followers it expects (50 µs when nil).
func storeExpectingFourFollowers(_ folder: TemporaryFolder, linger: Duration? = nil) async throws
  -> SQLiteJobStore
{
  let store = try makeStore(folder)
  try await leadWithFourFollowers(store)
  if let linger { store.groups.setFollowerLinger(linger) }
  return store
}

/// CPU-bound work on the cooperative pool: `count` tasks at `priority`, each computing (never
/// waiting on a lock, a semaphore or a sleep) until ``finish()`` or 30 s, the bound that turns a
/// stall into a failure instead of a hang. Models handlers doing CPU-bound work, which the library
/// supports (see `LeaseKeeper`: "even when handlers keep every thread of the cooperative pool busy
/// with CPU-bound work").
final class CPUWork: Sendable {
  private let done = Flag()
  private let running = Counter()
  private let tasks = Mutex<[Task<Void, Never>]>([])
  private let count: Int
  private let priority: TaskPriority

  init(count: Int = ProcessInfo.processInfo.activeProcessorCount, priority: TaskPriority) {
    self.count = count
    self.priority = priority
  }

  /// Starts the tasks (they run once the pool has a thread for them).
  func start() {
    let done = self.done
    let running = self.running
    let started = (0..<count).map { _ in
      Task.detached(priority: priority) {
        running.increment()
        let end = ContinuousClock.now + .seconds(30)
        var checksum: UInt64 = 0
        while !done.value && ContinuousClock.now < end {
          for index in 0..<1_000 { checksum = checksum &* 31 &+ UInt64(index) }
        }
        if checksum == 42 { print("") }
      }
    }
    tasks.withLock { $0 += started }
  }

  /// Whether every task is running.
  var allRunning: Bool { running.value == count }

  func finish() { done.set() }

  func wait() async {
    for task in tasks.withLock({ $0 }) { await task.value }
  }
}

/// Polls `condition` on the calling thread, which must be one the test owns (never a pool
/// thread), every 0.2 ms until it holds or `timeout` passed; returns whether it held.
func waitOnOwnThread(timeout: Duration, _ condition: () -> Bool) -> Bool {
  let deadline = ContinuousClock.now + timeout
  while !condition() {
    if ContinuousClock.now >= deadline { return false }
    usleep(200)
  }
  return true
}
