import Conveyor
import ConveyorTestSupport
import Dispatch
import Foundation
import Synchronization
import Testing

@testable import ConveyorSQLite

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// Adversarial review of commit 31d8d30: a new leader waiting for the followers it expects
/// `await Task.yield()`s on the global executor.
@Suite("Review: a leader that yields while it waits for its followers", .serialized, .timeLimit(.minutes(3)))
struct ReviewGatherTests {

  // MARK: - Defects

  /// Promise 4. Followers whose tasks prefer an executor of their own (a thread the pool does not
  /// own, like the library's own `ThreadExecutor`/`BlockingBridge`, or a `OneThreadExecutor`)
  /// never need the cooperative pool: their continuation resumes on their own thread. Before
  /// 31d8d30 a leader held its pool thread while it waited for followers (`sched_yield`, at most
  /// 50 µs), so they waited for a running task only. Now a leader on the global executor gives
  /// its thread away (`Task.yield()`) and is queued behind whatever the pool had queued: every
  /// call queued behind it then waits until the pool runs the leader's task again, for as long as
  /// other work keeps every pool thread busy.
  ///
  /// `linger` nil: the default 50 µs wait. The leader's task starts CPU-bound work just before
  /// its add (a handler scheduling work, say): the leader's yield queues it behind that work.
  /// `linger` 60 s: the same, the leader's wait made long only to widen the window.
  @Test(arguments: [nil, Duration.seconds(60)])
  func followersOnTheirOwnThreadsDoNotWaitForABusyPool(linger: Duration?) async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("jobs.sqlite")
    let store = try await storeExpectingFourFollowers(folder, linger: linger)

    let work = CPUWork(priority: .medium)
    let leader = Task.detached(priority: .medium) {
      work.start()
      return try await store.enqueue(
        [NewJob(payload: payload("leader"), runAt: epoch)], queue: "jobs", now: epoch)
    }
    // From here the pool may be busy: the rest runs on threads the test owns.
    let followerExecutor = OneThreadExecutor()
    let finished = Counter()
    let orchestration = Task(executorPreference: OneThreadExecutor()) {
      () -> (finished: Bool, state: String, followers: [Task<[EnqueueResult], any Error>]) in
      // Before 31d8d30 the spinning leader kept one pool thread until its lead ended, so not every
      // CPU task could start meanwhile: the test then goes on after 5 s and its adds lead.
      let busy = waitOnOwnThread(timeout: .seconds(5)) { work.allRunning }
      let leading = !store.groups.isIdle
      let followers = (0..<4).map { index in
        Task(executorPreference: followerExecutor) { () throws -> [EnqueueResult] in
          let result = try await store.enqueue(
            [NewJob(payload: payload("own-thread follower \(index)"), runAt: epoch)], queue: "jobs",
            now: epoch)
          finished.increment()
          return result
        }
      }
      let done = waitOnOwnThread(timeout: .seconds(10)) { finished.value == 4 }
      let state =
        "pool busy: \(busy), leader leading when the adds came: \(leading), "
        + "leader still leading: \(!store.groups.isIdle), calls waiting: \(store.groups.waitingCount), "
        + "adds finished: \(finished.value) of 4"
      work.finish()
      return (done, state, followers)
    }
    let outcome = await orchestration.value
    await work.wait()
    let finishedWhileBusy = outcome.finished
    #expect(
      finishedWhileBusy,
      "4 adds from tasks on their own thread did not finish in 10 s while CPU-bound work kept the pool busy: they wait for a leader that gave its pool thread away (\(outcome.state))"
    )
    // The pool is free again: everything completes and is committed.
    #expect(try isCommitted(try await leader.value[0].id, path: path))
    for follower in outcome.followers { #expect(try isCommitted(try await follower.value[0].id, path: path)) }
    #expect(try scalar("SELECT count(*) FROM jobs", path: path) == 10)
  }

  /// Promise 5. A background-priority leader that yields while it waits for followers is queued
  /// at background priority: a high-priority add that arrives meanwhile waits until the pool runs
  /// background work again. The priority check in `gather` cannot help: the leader must run to
  /// make it. Here background CPU-bound work (started by the leader's task just before its add)
  /// keeps the background threads busy, while the high-priority add's own priority has threads
  /// free (the test body, at medium priority, keeps running and polling).
  @Test(arguments: [nil, Duration.seconds(60)])
  func aHighPriorityAddDoesNotWaitForBackgroundWork(linger: Duration?) async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("jobs.sqlite")
    let store = try await storeExpectingFourFollowers(folder, linger: linger)

    let work = CPUWork(priority: .background)
    let leader = Task.detached(priority: .background) {
      work.start()
      return try await store.enqueue(
        [NewJob(payload: payload("leader"), runAt: epoch)], queue: "jobs", now: epoch)
    }
    // Before 31d8d30 the spinning leader kept one thread until its lead ended: the test then goes
    // on after 5 s, and the urgent add leads.
    let busy =
      (try? await eventually("the background work runs", timeout: .seconds(5)) { work.allRunning }) != nil
    let leading = !store.groups.isIdle
    let urgent = Task.detached(priority: .high) {
      try await store.enqueue([NewJob(payload: payload("urgent"), runAt: epoch)], queue: "jobs", now: epoch)
    }
    let committed = await eventually(timeout: .seconds(10)) {
      (try? scalar("SELECT count(*) FROM jobs WHERE payload = X'757267656E74'", path: path)) == 1
    }
    let state =
      "background work running: \(busy), leader leading when the urgent add came: \(leading), "
      + "leader still leading: \(!store.groups.isIdle), calls waiting: \(store.groups.waitingCount)"
    work.finish()
    await work.wait()
    #expect(
      committed,
      "a high-priority add was not committed in 10 s: it waits for a background leader that yielded behind background work (\(state))"
    )
    #expect(try isCommitted(try await urgent.value[0].id, path: path))
    #expect(try isCommitted(try await leader.value[0].id, path: path))
    #expect(try scalar("SELECT count(*) FROM jobs", path: path) == 7)
  }

  // MARK: - Promises that held

  /// Promises 1 and 7: closing the store while a leader yields in its wait for followers fails
  /// every call clearly (closed), commits nothing, and no call hangs.
  @Test func closingWhileTheLeaderYieldsFailsEveryCallClearly() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("jobs.sqlite")
    let store = try await storeExpectingFourFollowers(folder, linger: .seconds(60))
    let leader = Task {
      try await store.enqueue([NewJob(payload: payload("leader"), runAt: epoch)], queue: "jobs", now: epoch)
    }
    try await eventually("the leader waits for its followers") { !store.groups.isIdle }
    await store.close()
    let followers = (0..<4).map { index in
      Task {
        try await store.enqueue(
          [NewJob(payload: payload("late \(index)"), runAt: epoch)], queue: "jobs", now: epoch)
      }
    }
    for call in [leader] + followers {
      let result = await outcome { try await call.value }
      switch result {
      case .success(let results): Issue.record("a call on a closed store returned \(results)")
      case .failure(let error as SQLiteJobStoreError): #expect(error.code == .closed)
      case .failure(let error): Issue.record("unexpected error \(error)")
      }
    }
    #expect(try scalar("SELECT count(*) FROM jobs", path: path) == 5)
  }

  /// Promises 1 and 2: a leader cancelled while it yields, with and without followers, and
  /// followers of a higher priority and cancelled ones: a call that returned committed its job, a
  /// call that threw committed nothing, none hangs.
  @Test(arguments: [0, 1, 4])
  func cancellingAYieldingLeader(followerCount: Int) async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("jobs.sqlite")
    let store = try await storeExpectingFourFollowers(
      folder, linger: followerCount == 0 ? .milliseconds(200) : .seconds(60))
    let leader = Task {
      try await store.enqueue([NewJob(payload: payload("leader"), runAt: epoch)], queue: "jobs", now: epoch)
    }
    try await eventually("the leader waits for its followers") { !store.groups.isIdle }
    leader.cancel()
    let followers = (0..<followerCount).map { index in
      Task(priority: index == 0 ? .high : .medium) {
        if index == 2 { withUnsafeCurrentTask { $0?.cancel() } }
        return try await store.enqueue(
          [NewJob(payload: payload("f\(index)"), runAt: epoch)], queue: "jobs", now: epoch)
      }
    }
    var committed = 5
    for call in [leader] + followers {
      switch await outcome(of: { try await call.value }) {
      case .success(let results):
        #expect(try isCommitted(results[0].id, path: path))
        committed += 1
      case .failure(let error): #expect(error is CancellationError, "\(error)")
      }
    }
    #expect(try scalar("SELECT count(*) FROM jobs", path: path) == Int64(committed))
    #expect(await eventually(timeout: .seconds(30)) { store.groups.isIdle })
  }

  /// Promise 3: a rejected call among the followers gathered by a yielding leader fails alone.
  @Test func aRejectedFollowerOfAYieldingLeaderFailsAlone() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("jobs.sqlite")
    let store = try await storeExpectingFourFollowers(folder)
    try Connection(path: path, create: false).execute(
      "CREATE TRIGGER reject BEFORE INSERT ON jobs WHEN NEW.dedup_key LIKE 'bad%' BEGIN SELECT RAISE(ABORT, 'no'); END"
    )
    store.groups.setFollowerLinger(.seconds(60))
    let leader = Task {
      try await store.enqueue([NewJob(payload: payload("leader"), runAt: epoch)], queue: "jobs", now: epoch)
    }
    try await eventually("the leader waits for its followers") { !store.groups.isIdle }
    let followers = (0..<4).map { index in
      Task {
        try await store.enqueue(
          [NewJob(payload: payload("f\(index)"), runAt: epoch, deduplicationKey: index == 1 ? "bad" : nil)],
          queue: "jobs", now: epoch)
      }
    }
    #expect(try isCommitted(try await leader.value[0].id, path: path))
    for (index, follower) in followers.enumerated() {
      if index == 1 {
        await #expect(throws: SQLiteError.self) { try await follower.value }
      } else {
        #expect(try isCommitted(try await follower.value[0].id, path: path))
      }
    }
    #expect(try scalar("SELECT count(*) FROM jobs", path: path) == 9)
  }

  /// Promise 4: a leader whose preference for an executor comes from a
  /// `withTaskExecutorPreference` scope, or is inherited by a child task (`async let`), keeps the
  /// executor while it waits for followers, as one started with `Task(executorPreference:)` does.
  @Test(arguments: ["scope", "child"])
  func aLeaderPreferringAnExecutorThroughAScopeOrAParentKeepsIt(_ how: String) async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("jobs.sqlite")
    let store = try await storeExpectingFourFollowers(folder, linger: .seconds(60))

    let executor = OneThreadExecutor()
    let add: @Sendable () async throws -> [EnqueueResult] = {
      try await store.enqueue([NewJob(payload: payload("leader"), runAt: epoch)], queue: "jobs", now: epoch)
    }
    let leader: Task<[EnqueueResult], any Error>
    if how == "scope" {
      leader = Task { try await withTaskExecutorPreference(executor) { try await add() } }
    } else {
      leader = Task(executorPreference: executor) {
        async let result = add()
        return try await result
      }
    }
    try await eventually("the leader waits for its followers") { !store.groups.isIdle }
    let othersDone = DispatchSemaphore(value: 0)
    let finished = Counter()
    let sawOthersFinish = Task(executorPreference: executor) { () -> Bool in
      othersDone.wait(timeout: .now() + 30) == .success
    }
    let others = (0..<4).map { index in
      Task {
        let result = try await store.enqueue(
          [NewJob(payload: payload("other \(index)"), runAt: epoch)], queue: "jobs", now: epoch)
        if finished.increment() == 4 { othersDone.signal() }
        return result
      }
    }
    #expect(await sawOthersFinish.value, "the adds behind the leader did not finish in 30 s")
    _ = try await leader.value
    for other in others { #expect(try isCommitted(try await other.value[0].id, path: path)) }
    #expect(try scalar("SELECT count(*) FROM jobs", path: path) == 10)
  }
}
