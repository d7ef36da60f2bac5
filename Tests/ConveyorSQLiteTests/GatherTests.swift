import Conveyor
import ConveyorTestSupport
import Dispatch
import Foundation
import Testing

@testable import ConveyorSQLite

/// A new leader of adds waits briefly for the followers it expects (``EnqueueGroups/gather(with:)``)
/// and, on the global executor, lets other tasks run on its thread meanwhile. These tests pin down
/// when it must not: whenever the calls waiting behind it would then depend on something they
/// cannot count on.
@Suite("SQLite enqueue: a leader waiting for its followers", .serialized, .timeLimit(.minutes(3)))
struct GatherTests {
  /// A leader whose task prefers an executor of its own keeps that executor while it waits for
  /// its followers: were it to yield, another job on that executor could run first, and a job
  /// there that waits for another caller's add would leave those adds waiting for the leader
  /// forever.
  @Test func aLeaderOnItsOwnExecutorKeepsItWhileItWaitsForFollowers() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("jobs.sqlite")
    let store = try await storeExpectingFourFollowers(folder, linger: .seconds(60))

    let executor = OneThreadExecutor()
    let leader = Task(executorPreference: executor) {
      try await store.enqueue([NewJob(payload: payload("leader"), runAt: epoch)], queue: "jobs", now: epoch)
    }
    try await eventually("the leader waits for its followers") { !store.groups.isIdle }
    // Queued on the leader's executor while the leader waits: it keeps the executor's thread until
    // the other adds finished, or 30 s passed.
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
    #expect(
      await sawOthersFinish.value,
      "the adds behind the leader did not finish in 30 s while a job on the leader's executor waited for them"
    )
    _ = try await leader.value
    for other in others { #expect(try isCommitted(try await other.value[0].id, path: path)) }
    #expect(try scalar("SELECT count(*) FROM jobs", path: path) == 10)
  }

  /// A low-priority leader stops waiting for followers as soon as a call of higher priority waits
  /// behind it: that call would otherwise wait for a task the system runs last.
  @Test func aHigherPriorityAddEndsTheWaitOfALowerPriorityLeader() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("jobs.sqlite")
    let store = try await storeExpectingFourFollowers(folder, linger: .seconds(60))

    let leader = Task(priority: .background) {
      try await store.enqueue([NewJob(payload: payload("leader"), runAt: epoch)], queue: "jobs", now: epoch)
    }
    try await eventually("the leader waits for its followers") { !store.groups.isIdle }
    let urgent = Task(priority: .high) {
      try await store.enqueue([NewJob(payload: payload("urgent"), runAt: epoch)], queue: "jobs", now: epoch)
    }
    // Far less than the leader's 60 s wait for the four followers it expects.
    try await eventually("the urgent add is committed", timeout: .seconds(30)) {
      try scalar("SELECT count(*) FROM jobs WHERE payload = X'757267656E74'", path: path) == 1
    }
    #expect(try isCommitted(try await urgent.value[0].id, path: path))
    _ = try await leader.value
  }
}
