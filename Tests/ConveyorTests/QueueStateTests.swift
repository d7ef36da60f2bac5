import Foundation
import Testing

@testable import Conveyor

/// The queue's decisions, driven with plain values: no store, no tasks, no clock.
@Suite("QueueState")
struct QueueStateTests {
  func record(_ id: Int64, token: Int64 = 1) -> JobRecord {
    JobRecord(
      id: JobID(id), queue: "q", payload: Data(), status: .running, priority: 0, attempts: 1,
      runAt: Date(timeIntervalSince1970: 0), createdAt: Date(timeIntervalSince1970: 0), claimToken: token)
  }

  func outcome(_ id: Int64, token: Int64 = 1) -> PendingSettlement {
    PendingSettlement(
      settlement: JobSettlement(claim: ClaimReference(id: JobID(id), token: token), action: .complete),
      event: .succeeded(JobID(id)))
  }

  func started(concurrency: Int = 2, prefetch: Int = 0) -> QueueState {
    var state = QueueState(limits: .init(concurrency: concurrency, prefetch: prefetch))
    let started = state.start()
    #expect(started)
    return state
  }

  // MARK: Leases that may have lapsed before a job starts

  func releases(_ state: QueueState) -> [JobID] {
    state.settlements.compactMap {
      if case .release(nil) = $0.settlement.action { $0.settlement.id } else { nil }
    }
  }

  /// A reading `seconds` into uptime, the wall clock `stepped` seconds ahead of where it started.
  func at(_ seconds: Double, stepped: Double = 0) -> ClockReading {
    ClockReading(
      uptime: .milliseconds(Int64(seconds * 1000)), wallOffset: .milliseconds(Int64(stepped * 1000)))
  }

  /// The bound of a 3-second lease asked for at `seconds`.
  func lease(sentAt seconds: Double) -> LeaseBound { LeaseBound(sent: at(seconds), lease: .seconds(3)) }

  @Test func aJobStartsOnlyWhileItsLeaseHoldsForAThirdOfTheLeaseMore() {
    let state = QueueState(limits: .init(concurrency: 1, prefetch: 0, lease: .seconds(3)))
    #expect(state.mayStart(lease(sentAt: 7), now: at(9)))
    #expect(!state.mayStart(lease(sentAt: 7), now: at(9.001)))
    #expect(!state.mayStart(lease(sentAt: 7), now: at(11)), "lapsed")
    #expect(state.mayStart(nil, now: at(11)), "not tracked")
  }

  @Test func aForwardStepOfTheWallClockShortensWhatIsLeftOfALease() {
    let state = QueueState(limits: .init(concurrency: 1, prefetch: 0, lease: .seconds(3)))
    // A store dating leases by the wall clock ends the lease 1.5 s sooner after a 1.5 s step.
    #expect(!state.mayStart(lease(sentAt: 7), now: at(8, stepped: 1.5)))
    #expect(state.mayStart(lease(sentAt: 7), now: at(8, stepped: 1)))
    // A step back does not lengthen it.
    #expect(!state.mayStart(lease(sentAt: 7), now: at(9.5, stepped: -60)))
  }

  @Test func jobsWhoseLeaseMayHaveLapsedAreHandedBackInsteadOfStarted() {
    var state = QueueState(limits: .init(concurrency: 2, prefetch: 0, lease: .seconds(3)))
    _ = state.start()
    // Claimed by a call sent at 0 s and answered at 2.5 s: the lease holds until 3 s at least.
    state.claimed([record(1), record(2)], at: .milliseconds(2_500), lease: lease(sentAt: 0))
    #expect(state.takeJobsToStart(now: at(2.5)).isEmpty)
    #expect(releases(state) == [JobID(1), JobID(2)] && state.handedBackLapsed == 2)
    #expect(state.workers == 0 && state.inFlight.isEmpty)
    let step = state.takeLoopStep(canHandle: true)
    #expect(step?.settlements.count == 2, "the loop records the hand-back")
  }

  @Test func aHeartbeatThatKeptAWaitingClaimLetsItStart() {
    var state = QueueState(limits: .init(concurrency: 1, prefetch: 0, lease: .seconds(3)))
    _ = state.start()
    state.claimed([record(1), record(2)], at: .zero, lease: lease(sentAt: 0))
    #expect(state.takeJobsToStart(now: at(0)).map(\.id) == [JobID(1)])
    // Job 2 waits while job 1 runs for 2.5 s; a heartbeat sent at 2 s kept it.
    state.renewed([ClaimReference(id: JobID(2), token: 1)], sentAt: at(2))
    let step = state.workerFinished(
      ClaimReference(id: JobID(1), token: 1), outcome: outcome(1), canHandle: true, now: at(2.5))
    #expect(step == .run(record(2), flush: true))
    #expect(releases(state).isEmpty)
  }

  @Test func aWorkerSkipsWaitingJobsWhoseLeaseMayHaveLapsedAndEndsWhenNoneIsLeft() {
    var state = QueueState(limits: .init(concurrency: 1, prefetch: 2, lease: .seconds(3)))
    _ = state.start()
    state.claimed([record(1), record(2), record(3)], at: .zero, lease: lease(sentAt: 0))
    _ = state.takeJobsToStart(now: at(0))
    state.renewed([ClaimReference(id: JobID(3), token: 1)], sentAt: at(2))
    // Job 1 ran 2.5 s: job 2's lease may lapse before a heartbeat, job 3's was renewed.
    let step = state.workerFinished(
      ClaimReference(id: JobID(1), token: 1), outcome: outcome(1), canHandle: true, now: at(2.5))
    #expect(step == .run(record(3), flush: true))
    #expect(releases(state) == [JobID(2)])
    // Nothing left that may start: the worker ends; the hand-back waits for the loop.
    state.claimed([record(4)], at: .seconds(3), lease: lease(sentAt: 0))
    #expect(state.nextForWorker(now: at(3)) == nil)
    #expect(releases(state) == [JobID(2), JobID(4)])
  }

  @Test func aStartedQueueRescuesExpiredLeasesBeforeItsFirstClaim() {
    var state = QueueState(limits: .init(concurrency: 1, prefetch: 0))
    #expect(!state.rescueDue)
    _ = state.start()
    #expect(state.rescueDue)
  }

  @Test func theLoopClaimsFreeSlotsPlusPrefetchOnlyWhenNothingIsBuffered() {
    var state = started(concurrency: 3, prefetch: 2)
    #expect(state.takeLoopStep(canHandle: true)?.claimLimit == 5)
    state.claimed([record(1), record(2)])
    #expect(state.takeLoopStep(canHandle: true)?.claimLimit == 0, "buffered jobs start first")
    #expect(state.takeJobsToStart().map(\.id) == [JobID(1), JobID(2)])
    #expect(state.takeLoopStep(canHandle: true)?.claimLimit == 3, "one slot free, plus prefetch")
    #expect(state.takeLoopStep(canHandle: false)?.claimLimit == 0, "no handler: no claim")
    state.paused = true
    let paused = state.takeLoopStep(canHandle: true)
    #expect(paused?.claimLimit == 0 && paused?.checkPause == true && paused?.needsStore == true)
  }

  @Test func startingRespectsConcurrencyAndTracksClaims() {
    var state = started(concurrency: 2)
    state.claimed([record(1, token: 4), record(2), record(3)])
    #expect(state.takeJobsToStart().map(\.id) == [JobID(1), JobID(2)])
    #expect(state.workers == 2 && state.freeSlots == 0)
    #expect(state.inFlight.contains(ClaimReference(id: JobID(1), token: 4)))
    #expect(Set(state.heldClaims.map(\.id)) == [JobID(1), JobID(2), JobID(3)], "buffered jobs are held too")
    #expect(state.computedState == .running)
  }

  @Test func aWorkerRunsTheNextBufferedJobThenClaimsThenExits() {
    var state = started(concurrency: 1, prefetch: 2)
    state.claimed([record(1), record(2)])
    _ = state.takeJobsToStart()
    #expect(
      state.workerFinished(ClaimReference(id: JobID(1), token: 1), outcome: outcome(1), canHandle: true)
        == .run(record(2), flush: false))
    #expect(
      state.heldClaims.contains(ClaimReference(id: JobID(1), token: 1)), "unrecorded outcome still held")
    guard
      case .claim(let settlements, let limit) = state.workerFinished(
        ClaimReference(id: JobID(2), token: 1), outcome: outcome(2), canHandle: true)
    else {
      Issue.record("expected a claim")
      return
    }
    #expect(settlements.map(\.settlement.id) == [JobID(1), JobID(2)] && limit == 3)
    #expect(state.settlements.isEmpty, "taken out to be recorded")
    #expect(state.nextForWorker() == nil)
    state.workerExited()
    #expect(state.workers == 0 && state.computedState == .idle)
  }

  @Test func stoppingPausingOrLosingTheHandlerEndsAWorker() {
    for change in [{ (s: inout QueueState) in s.stopping = true }, { $0.paused = true }] {
      var state = started(concurrency: 1)
      state.claimed([record(1), record(2)])
      _ = state.takeJobsToStart()
      change(&state)
      #expect(
        state.workerFinished(ClaimReference(id: JobID(1), token: 1), outcome: outcome(1), canHandle: true)
          == .exit)
      #expect(state.settlements.count == 1, "the outcome waits for the loop")
    }
    var state = started(concurrency: 1)
    state.claimed([record(1)])
    _ = state.takeJobsToStart()
    #expect(
      state.workerFinished(ClaimReference(id: JobID(1), token: 1), outcome: outcome(1), canHandle: false)
        == .exit)
  }

  @Test func aJobClaimedAgainWhileItsOldAttemptRunsKeepsItsNewClaimHeld() {
    var state = started(concurrency: 2)
    state.claimed([record(1, token: 1)])
    _ = state.takeJobsToStart()
    // The first claim lapsed; the same queue claimed the job again while attempt 1 still runs.
    state.claimed([record(1, token: 2)])
    _ = state.takeJobsToStart()
    _ = state.workerFinished(
      ClaimReference(id: JobID(1), token: 1), outcome: outcome(1, token: 1), canHandle: false)
    #expect(
      state.heldClaims.contains(ClaimReference(id: JobID(1), token: 2)), "the new claim is still heartbeated")
  }

  @Test func lostClaimsAreNotStarted() {
    var state = started(concurrency: 1)
    state.claimed([record(1), record(2, token: 9), record(3)])
    _ = state.takeJobsToStart()
    state.lost([ClaimReference(id: JobID(2), token: 9), ClaimReference(id: JobID(3), token: 99)])
    #expect(state.buffer.all.map(\.id) == [JobID(3)], "only the claim that matches is dropped")
  }

  @Test func aFinishWaiterIsReleasedOnlyByACheckBegunAfterItWaited() {
    var state = started()
    let early = state.beginFinishCheck()
    let waiter = UUID()
    state.addFinishWaiter(waiter)
    let stale = state.finishConfirmed(early)
    #expect(stale.waiters.isEmpty, "a check begun before the wait says nothing about jobs added since")
    #expect(stale.publish, "but the queue itself was finished")
    let fresh = state.beginFinishCheck()
    #expect(state.finishConfirmed(fresh).waiters == [waiter])
    #expect(state.finishWaiters.isEmpty)
  }

  @Test func newWorkOrHeldWorkCancelsAFinishCheck() {
    var state = started()
    state.addFinishWaiter(UUID())
    let check = state.beginFinishCheck()
    state.noteNewWork()
    #expect(state.finishConfirmed(check).waiters.isEmpty, "a job added meanwhile")
    let second = state.beginFinishCheck()
    state.claimed([record(1)])
    #expect(state.finishConfirmed(second).waiters.isEmpty, "a job held here")
    _ = state.takeJobsToStart()
    _ = state.workerFinished(ClaimReference(id: JobID(1), token: 1), outcome: outcome(1), canHandle: false)
    state.workerExited()
    _ = state.takeLoopStep(canHandle: true)
    let third = state.beginFinishCheck()
    #expect(state.finishConfirmed(third).waiters.count == 1)
  }

  @Test func finishedIsPublishedOncePerStretchOfWork() {
    var state = started()
    var check = state.beginFinishCheck()
    #expect(state.finishConfirmed(check).publish)
    check = state.beginFinishCheck()
    #expect(!state.finishConfirmed(check).publish, "not twice")
    state.sawWork()
    check = state.beginFinishCheck()
    #expect(state.finishConfirmed(check).publish, "again after work was seen")
  }

  @Test func theFinalFlushRecordsOutcomesAndGivesBackUnstartedJobs() {
    var state = started(concurrency: 1)
    state.claimed([record(1), record(2, token: 5)])
    _ = state.takeJobsToStart()
    _ = state.workerFinished(ClaimReference(id: JobID(1), token: 1), outcome: outcome(1), canHandle: true)
    state.stopping = true
    let flush = state.takeFinalFlush()
    #expect(flush.count == 1 && flush[0].settlement.id == JobID(1), "the worker took job 2 already")
    var other = started(concurrency: 1)
    other.claimed([record(1), record(2, token: 5)])
    other.stopping = true
    let releases = other.takeFinalFlush()
    #expect(releases.map(\.settlement.action) == [.release(error: nil), .release(error: nil)])
    #expect(releases.map(\.settlement.claim.token) == [1, 5])
    #expect(other.buffer.isEmpty && other.takeLoopStep(canHandle: true) == nil, "stopping, no worker: end")
  }

  // MARK: Claiming ahead

  func claimLimit(after step: WorkerStep) -> Int? {
    if case .claim(_, let limit) = step { return limit }
    return nil
  }

  @Test func aWorkerWhoseJobWasShortClaimsAheadOnlyWithPrefetchZeroAndClaimsAhead() {
    let batch = 1 + QueueState.batchedAheadJobs
    let cases: [(Int, Bool, QueueState.Ahead, Int)] = [
      (0, true, .overlap, 2), (0, true, .batch, batch), (0, true, .none, 1), (0, false, .overlap, 1),
      (0, false, .batch, 1), (2, true, .overlap, 3), (2, true, .batch, 3), (2, true, .none, 3),
    ]
    for (prefetch, claimsAhead, ahead, expected) in cases {
      var state = QueueState(limits: .init(concurrency: 1, prefetch: prefetch, claimsAhead: claimsAhead))
      _ = state.start()
      state.claimed([record(1)])
      _ = state.takeJobsToStart()
      let step = state.workerFinished(
        ClaimReference(id: JobID(1), token: 1), outcome: outcome(1), canHandle: true, ahead: ahead)
      #expect(
        claimLimit(after: step) == expected,
        "prefetch \(prefetch), claimsAhead \(claimsAhead), ahead \(ahead)")
    }
  }

  @Test func claimingAheadOverlapsASlowStoreAndBatchesACheapOne() {
    let floor = QueueState.cheapStoreCall
    func ahead(_ handler: Duration, _ call: Duration?) -> QueueState.Ahead {
      QueueState.ahead(handler: handler, lastStoreCall: call, storeCallFloor: floor)
    }
    #expect(ahead(.microseconds(5), .microseconds(40)) == .overlap, "a short job, a store on disk")
    #expect(ahead(.microseconds(5), .microseconds(2)) == .batch, "a short job, an in-memory store")
    #expect(ahead(.zero, nil) == .none, "jobs claimed before: no store call measured")
    #expect(ahead(QueueState.shortJob, .microseconds(40)) == .none, "a job of 1 ms or more")
    #expect(ahead(QueueState.shortJob, .microseconds(2)) == .none, "a job of 1 ms or more, in memory")
    #expect(ahead(.zero, .zero) == .none, "a clock that does not advance times nothing")
    #expect(QueueState.ahead(handler: .zero, lastStoreCall: .zero, storeCallFloor: .zero) == .overlap)
  }

  /// A worker running a job of a batch leaves its outcome for its next claim, due to the loop by
  /// the taken job's hold, and wakes the loop only when it would sleep past that; after a claim
  /// that overlaps, it asks the loop to record the outcome at once.
  @Test func aJobOfABatchLeavesItsOutcomeForTheNextClaim() {
    let claimedAt = Duration.seconds(1)
    let due = claimedAt + QueueState.aheadHold
    let cases: [(QueueState.Ahead, Duration?, Bool)] = [
      (.batch, claimedAt, false),  // the loop wakes before the hold passes
      (.batch, due + .seconds(1), true),  // it would sleep past it
      (.batch, nil, false),  // it is awake: it reads what is due before it sleeps
      (.overlap, claimedAt, true),
    ]
    for (ahead, loopSleepsUntil, flushes) in cases {
      var state = QueueState(limits: .init(concurrency: 1, prefetch: 0, claimsAhead: true))
      _ = state.start()
      state.claimed([record(1)])
      _ = state.takeJobsToStart()
      _ = state.workerFinished(
        ClaimReference(id: JobID(1), token: 1), outcome: outcome(1), canHandle: true, ahead: ahead)
      state.claimed([record(2), record(3)], at: claimedAt)
      #expect(state.nextForWorker()?.id == JobID(2))
      state.loopSleepsUntil = loopSleepsUntil
      let step = state.workerFinished(
        ClaimReference(id: JobID(2), token: 1), outcome: outcome(2), canHandle: true, ahead: ahead)
      let label = "\(ahead), loop asleep until \(String(describing: loopSleepsUntil))"
      guard case .run(let next, let flush) = step else {
        Issue.record("\(label): \(step)")
        continue
      }
      #expect(next.id == JobID(3) && flush == flushes, "\(label)")
      #expect(state.settlements.map(\.settlement.id) == [JobID(2)], "\(label)")
      // Due to the loop by the taken job's hold, though no job is held any more.
      #expect(state.loopDue(canHandle: true) == (ahead == .batch ? due : nil), "\(label)")
      let step2 = state.takeLoopStep(canHandle: true, now: due)
      #expect(step2?.settlements.map(\.settlement.id) == [JobID(2)], "\(label)")
      #expect(state.leftOutcomesDue == nil && state.loopDue(canHandle: true) == nil, "\(label)")
    }
  }

  /// A worker that claimed ahead wakes the loop only when the loop sleeps past the hand-back (a
  /// loop that is awake reads what is due, under the lock, before it sleeps).
  @Test func aClaimAheadWakesTheLoopOnlyWhenItWouldSleepPastTheHandBack() {
    var state = QueueState(limits: .init(concurrency: 1, prefetch: 0, claimsAhead: true))
    _ = state.start()
    state.loopSleepsUntil = .seconds(100)
    #expect(!state.loopMustWake, "nothing claimed ahead")
    state.claimed([record(1), record(2)], at: .seconds(10))
    _ = state.takeJobsToStart()
    let due = Duration.seconds(10) + QueueState.aheadHold
    #expect(state.loopMustWake, "the loop sleeps past the hand-back")
    state.loopSleepsUntil = due
    #expect(!state.loopMustWake, "the loop wakes at the hand-back")
    state.loopSleepsUntil = due - .milliseconds(1)
    #expect(!state.loopMustWake, "the loop wakes before it")
    state.loopSleepsUntil = nil
    #expect(!state.loopMustWake, "the loop is awake")
    state.loopSleepsUntil = .seconds(11)
    state.paused = true
    #expect(state.loopMustWake, "paused: the hand-back is due at once")
  }

  @Test func aJobClaimedAheadIsHandedBackAfterTheHoldWhileEverySlotIsBusy() {
    var state = QueueState(limits: .init(concurrency: 1, prefetch: 0, claimsAhead: true))
    _ = state.start()
    let claimedAt = Duration.seconds(10)
    state.claimed([record(1), record(2, token: 7)], at: claimedAt)
    #expect(state.takeJobsToStart().map(\.id) == [JobID(1)])
    #expect(state.handBackDue(canHandle: true) == claimedAt + QueueState.aheadHold)
    let early = state.takeLoopStep(canHandle: true, now: claimedAt + QueueState.aheadHold - .milliseconds(1))
    #expect(early?.settlements.isEmpty == true && early?.handedBack == 0 && early?.claimLimit == 0)
    #expect(state.heldClaims.contains(ClaimReference(id: JobID(2), token: 7)), "held until the hold ends")
    let due = state.takeLoopStep(canHandle: true, now: claimedAt + QueueState.aheadHold)
    #expect(due?.handedBack == 1 && due?.claimLimit == 0, "the slot is still busy: nothing is claimed")
    #expect(
      due?.settlements.map(\.settlement) == [
        JobSettlement(claim: ClaimReference(id: JobID(2), token: 7), action: .release(error: nil))
      ])
    #expect(state.buffer.isEmpty && state.handBackDue(canHandle: true) == nil)
    #expect(!state.heldClaims.contains(ClaimReference(id: JobID(2), token: 7)))
  }

  @Test func aJobClaimedAheadIsHandedBackAtOnceWhenPausedOrWithoutAHandler() {
    for paused in [true, false] {
      var state = QueueState(limits: .init(concurrency: 1, prefetch: 0, claimsAhead: true))
      _ = state.start()
      state.claimed([record(1), record(2)], at: .seconds(1))
      _ = state.takeJobsToStart()
      state.paused = paused
      let step = state.takeLoopStep(canHandle: paused, now: .seconds(1))
      #expect(step?.handedBack == 1 && state.buffer.isEmpty, paused ? "paused" : "no handler")
    }
  }

  @Test func prefetchedJobsAreHeldWhateverTheWait() {
    var state = started(concurrency: 1, prefetch: 1)
    state.claimed([record(1), record(2)], at: .seconds(1))
    _ = state.takeJobsToStart()
    #expect(state.handBackDue(canHandle: true) == nil)
    let step = state.takeLoopStep(canHandle: true, now: .seconds(3_600))
    #expect(step?.handedBack == 0 && step?.settlements.isEmpty == true && state.buffer.count == 1)
  }

  @Test func aStoppingQueueHandsBackUnstartedJobsAtOnceWhateverThePrefetch() {
    for prefetch in [0, 3] {
      var state = started(concurrency: 1, prefetch: prefetch)
      state.claimed([record(1), record(2)], at: .seconds(1))
      _ = state.takeJobsToStart()
      state.stopping = true
      let step = state.takeLoopStep(canHandle: true, now: .seconds(1))
      #expect(step?.handedBack == 1 && state.buffer.isEmpty, "prefetch \(prefetch)")
    }
  }

  @Test func aWorkerFinishingWhileTheLoopHandsBackEndsInsteadOfClaimingPastThem() {
    var state = QueueState(limits: .init(concurrency: 1, prefetch: 0, claimsAhead: true))
    _ = state.start()
    state.claimed([record(1), record(2)], at: .seconds(1))
    _ = state.takeJobsToStart()
    #expect(state.takeLoopStep(canHandle: true, now: .seconds(2))?.handedBack == 1)
    #expect(
      state.workerFinished(ClaimReference(id: JobID(1), token: 1), outcome: outcome(1), canHandle: true)
        == .exit, "job 2 is still held in the store: a claim now would take job 3 first")
    #expect(state.settlements.map(\.settlement.id) == [JobID(1)], "the loop records the outcome")
    state.handBackRecorded()
    state.workerExited()
    #expect(state.takeLoopStep(canHandle: true, now: .seconds(2))?.claimLimit == 1)
  }

  @Test func eachJobClaimedAheadIsHeldFromItsOwnClaim() {
    var state = QueueState(limits: .init(concurrency: 2, prefetch: 0, claimsAhead: true))
    _ = state.start()
    state.claimed([record(1), record(2), record(3)], at: .seconds(1))
    #expect(state.takeJobsToStart().count == 2)
    state.claimed([record(4), record(5)], at: .seconds(2))
    _ = state.workerFinished(ClaimReference(id: JobID(1), token: 1), outcome: outcome(1), canHandle: true)
    #expect(
      state.handBackDue(canHandle: true) == .seconds(2) + QueueState.aheadHold,
      "job 3 started: the hold runs from the claim of job 4")
  }
}
