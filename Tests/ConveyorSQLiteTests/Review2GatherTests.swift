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

/// Adversarial review of 7ca6ea3: a call of higher priority, or whose task prefers an executor,
/// takes over the wait of a leader that yields for its followers.
@Suite("Review 2: taking over a yielding leader's wait", .serialized, .timeLimit(.minutes(3)))
struct Review2GatherTests {

  // MARK: - Defects

  /// Promise 4. `enqueue` makes its caller the leader (`groups.lead()`) and only then, inside
  /// `gather`, publishes the `Gathering` a higher-priority call takes over. A call that arrives
  /// between the two (the leader's thread preempted there, on a loaded 2-core machine say) finds
  /// `leading` true and no gathering: it just waits. `gather` then publishes and yields without
  /// looking at the calls already waiting (the spinning path does: `waiting.contains { $0.priority
  /// > priority }`), so that high-priority call waits until the pool runs the background leader
  /// again, here until the background work ends.
  ///
  /// The test takes the lead itself, lets the urgent call arrive, then runs `gather` on a
  /// background task exactly as `enqueue` would: the interleaving a preemption between the two
  /// lines of `enqueue` produces, made deterministic.
  @Test func aHighPriorityCallThatArrivesBeforeTheGatheringIsPublishedWaitsForTheLeader() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("jobs.sqlite")
    let store = try await storeExpectingFourFollowers(folder)

    // `enqueue`, line 184: the leader's `groups.lead()` succeeded ...
    #expect(store.groups.lead())
    // ... and, before its `gather` published the gathering, an urgent add arrived.
    let urgent = Task.detached(priority: .high) {
      try await store.enqueue([NewJob(payload: payload("urgent"), runAt: epoch)], queue: "jobs", now: epoch)
    }
    try await eventually("the urgent add waits behind the leader") { store.groups.waitingCount == 1 }

    // The leader resumes, at background priority, after its task scheduled background work.
    let work = CPUWork(priority: .background)
    let leader = Task.detached(priority: .background) {
      work.start()
      let gathered = await store.groups.gather(
        with: [NewJob(payload: payload("leader"), runAt: epoch)], queue: "jobs", clock: FixedJobClock(epoch))
      // Then as `enqueue` does when it cannot commit inline: the store's thread commits the calls
      // the leader took. (Committing them inline instead would change nothing here.)
      if case .followers(let followers) = gathered, store.groups.handOver(followers) {
        store.connection.submit { db in store.flushEnqueueGroups(db) }
      }
    }
    let busy =
      (try? await eventually("the background work runs", timeout: .seconds(5)) { work.allRunning }) != nil
    let committed = await eventually(timeout: .seconds(10)) {
      (try? scalar("SELECT count(*) FROM jobs WHERE payload = X'757267656E74'", path: path)) == 1
    }
    let state =
      "background work running: \(busy), leader still leading: \(!store.groups.isIdle), "
      + "calls waiting: \(store.groups.waitingCount)"
    work.finish()
    await work.wait()
    #expect(
      committed,
      "a high-priority add was not committed in 10 s: it arrived before the background leader published its gathering, and waits for that leader, which yielded behind background work (\(state))"
    )
    await leader.value
    #expect(try isCommitted(try await urgent.value[0].id, path: path))
    #expect(await eventually(timeout: .seconds(30)) { store.groups.isIdle && store.groups.waitingCount == 0 })
  }

  // MARK: - Promises that held

  /// Promises 1, 2, 5: a high-priority add takes over a yielding leader's wait (60 s linger) while
  /// other adds of the leader's priority wait too; the leader's task is cancelled meanwhile. Every
  /// call returns its own committed job, and the groups end idle.
  @Test(arguments: [false, true])
  func aTakeoverCommitsEveryCallOnce(cancelLeader: Bool) async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("jobs.sqlite")
    let store = try await storeExpectingFourFollowers(folder, linger: .seconds(60))
    let leader = Task(priority: .low) {
      try await store.enqueue([NewJob(payload: payload("leader"), runAt: epoch)], queue: "jobs", now: epoch)
    }
    try await eventually("the leader waits for its followers") { !store.groups.isIdle }
    if cancelLeader { leader.cancel() }
    let same = (0..<2).map { index in
      Task(priority: .low) {
        try await store.enqueue(
          [NewJob(payload: payload("low \(index)"), runAt: epoch)], queue: "jobs", now: epoch)
      }
    }
    try await eventually("two adds wait behind the leader") { store.groups.waitingCount == 2 }
    let urgent = Task(priority: .high) {
      try await store.enqueue([NewJob(payload: payload("urgent"), runAt: epoch)], queue: "jobs", now: epoch)
    }
    var ids = Set<Int64>()
    for call in [leader, urgent] + same {
      let results = try await call.value
      #expect(try isCommitted(results[0].id, path: path))
      ids.insert(results[0].id.rawValue)
    }
    #expect(ids.count == 4)
    #expect(try scalar("SELECT count(*) FROM jobs", path: path) == 9)
    #expect(await eventually(timeout: .seconds(30)) { store.groups.isIdle && store.groups.waitingCount == 0 })
  }

  /// Promise 3 through a takeover: the leader's own call (or the taker's) is rejected by a
  /// trigger; it fails alone, the others commit.
  @Test(arguments: ["leader", "taker"])
  func aRejectedCallInATakenOverGroupFailsAlone(rejected: String) async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("jobs.sqlite")
    let store = try await storeExpectingFourFollowers(folder)
    try Connection(path: path, create: false).execute(
      "CREATE TRIGGER reject BEFORE INSERT ON jobs WHEN NEW.dedup_key LIKE 'bad%' BEGIN SELECT RAISE(ABORT, 'no'); END"
    )
    store.groups.setFollowerLinger(.seconds(60))
    let leader = Task(priority: .low) {
      try await store.enqueue(
        [
          NewJob(
            payload: payload("leader"), runAt: epoch, deduplicationKey: rejected == "leader" ? "bad" : nil)
        ],
        queue: "jobs", now: epoch)
    }
    try await eventually("the leader waits for its followers") { !store.groups.isIdle }
    let other = Task(priority: .low) {
      try await store.enqueue([NewJob(payload: payload("other"), runAt: epoch)], queue: "jobs", now: epoch)
    }
    try await eventually("an add waits behind the leader") { store.groups.waitingCount == 1 }
    let taker = Task(executorPreference: OneThreadExecutor()) {
      try await store.enqueue(
        [
          NewJob(payload: payload("taker"), runAt: epoch, deduplicationKey: rejected == "taker" ? "bad" : nil)
        ],
        queue: "jobs", now: epoch)
    }
    for (name, call) in [("leader", leader), ("taker", taker)] {
      if name == rejected {
        await #expect(throws: SQLiteError.self) { try await call.value }
      } else {
        #expect(try isCommitted(try await call.value[0].id, path: path))
      }
    }
    #expect(try isCommitted(try await other.value[0].id, path: path))
    #expect(try scalar("SELECT count(*) FROM jobs", path: path) == 7)
    #expect(await eventually(timeout: .seconds(30)) { store.groups.isIdle && store.groups.waitingCount == 0 })
  }

  /// Promise 1: the store closed while the leader yields, then a call takes the wait over: the
  /// flush runs on a closed connection; every call fails with `closed`, none hangs.
  @Test func aTakeoverAfterCloseFailsEveryCall() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("jobs.sqlite")
    let store = try await storeExpectingFourFollowers(folder, linger: .seconds(60))
    let leader = Task(priority: .low) {
      try await store.enqueue([NewJob(payload: payload("leader"), runAt: epoch)], queue: "jobs", now: epoch)
    }
    try await eventually("the leader waits for its followers") { !store.groups.isIdle }
    await store.close()
    let taker = Task(priority: .high) {
      try await store.enqueue([NewJob(payload: payload("taker"), runAt: epoch)], queue: "jobs", now: epoch)
    }
    for call in [leader, taker] {
      switch await outcome(of: { try await call.value }) {
      case .success(let results): Issue.record("a call on a closed store returned \(results)")
      case .failure(let error as SQLiteJobStoreError): #expect(error.code == .closed)
      case .failure(let error): Issue.record("unexpected error \(error)")
      }
    }
    #expect(try scalar("SELECT count(*) FROM jobs", path: path) == 5)
  }

  /// Promises 1, 2, 5: a takeover, then at once a new lead with followers and a new leader that
  /// gathers and is taken over in turn. Every call is answered once, with its own committed job.
  /// (Holding the first leader off the pool meanwhile, with CPU-bound work, holds every pool
  /// thread on this 2-core machine, so the second lead could not run either: the interleaving
  /// where the first leader runs again during the second gathering is argued from the code: it
  /// compares its own slot, `state.gathering?.slot === slot`.)
  @Test func aNewGatheringRightAfterATakeover() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("jobs.sqlite")
    let store = try await storeExpectingFourFollowers(folder, linger: .seconds(60))
    let first = Task.detached(priority: .background) {
      try await store.enqueue(
        [NewJob(payload: payload("first leader"), runAt: epoch)], queue: "jobs", now: epoch)
    }
    try await eventually("the first leader waits for its followers") { !store.groups.isIdle }
    let taker = Task(executorPreference: OneThreadExecutor()) {
      try await store.enqueue([NewJob(payload: payload("taker 1"), runAt: epoch)], queue: "jobs", now: epoch)
    }
    _ = try await taker.value
    try await eventually("the takeover's flush ended") { store.groups.isIdle }
    // A second lead with four followers (the next leader expects four again), then a second
    // gathering leader at background priority, taken over in turn.
    try await leadWithFourFollowers(store)
    let second = Task.detached(priority: .background) {
      try await store.enqueue(
        [NewJob(payload: payload("second leader"), runAt: epoch)], queue: "jobs", now: epoch)
    }
    try await eventually("the second leader waits for its followers") { !store.groups.isIdle }
    let taker2 = Task(priority: .high) {
      try await store.enqueue([NewJob(payload: payload("taker 2"), runAt: epoch)], queue: "jobs", now: epoch)
    }
    let takerCommitted = try isCommitted(try await taker2.value[0].id, path: path)
    #expect(takerCommitted)
    #expect(try isCommitted(try await first.value[0].id, path: path))
    #expect(try isCommitted(try await second.value[0].id, path: path))
    #expect(try scalar("SELECT count(*) FROM jobs", path: path) == 14)
    #expect(await eventually(timeout: .seconds(30)) { store.groups.isIdle && store.groups.waitingCount == 0 })
  }
}
