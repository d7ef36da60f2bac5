import ConveyorTestSupport
import Testing

@testable import Conveyor

@Suite("OperationControl and OperationStateMachine")
struct OperationStateMachineTests {
  typealias Machine = OperationStateMachine

  @Test func startsOnce() {
    let control = OperationControl()
    let first = control.claimStart()
    let second = control.claimStart()
    #expect(first == .run)
    #expect(second == .ignore)
  }

  @Test func cancelledBeforeStartFinishesWithoutRunning() {
    let control = OperationControl()
    let started = control.claimOutcome(cancelling: true)
    #expect(started == false)  // not started: the queue's start() finishes it
    let (cancelled, decided, finished) = (control.isCancelled, control.isDecided, control.isFinished)
    #expect(cancelled && decided && !finished)
    let action = control.claimStart()
    #expect(action == .finishWithoutRunning)
  }

  @Test func outcomeIsClaimedOnce() {
    let control = OperationControl()
    _ = control.claimStart()
    let first = control.claimOutcome(cancelling: false)
    let second = control.claimOutcome(cancelling: true)
    #expect(first == true)
    #expect(second == nil)
    let cancelled = control.isCancelled
    #expect(!cancelled)
  }

  @Test func finishedWinsOverExecuting() {
    let control = OperationControl()
    control.publishFinished()
    control.publishExecuting()
    let (finished, executing) = (control.isFinished, control.isExecuting)
    #expect(finished && !executing)
    let first = control.claimFinish()
    let second = control.claimFinish()
    #expect(first)
    #expect(!second)
  }

  @Test func outcomeIsRecordedOnceAndHandlersReleased() throws {
    var machine = Machine()
    machine.successHandler = { _ in }
    let completion = machine.complete(.success(1))
    let decided = try #require(completion)
    #expect(decided.deliver != nil)
    #expect(decided.task == nil)
    let second = machine.complete(.success(2))
    #expect(second == nil)
    #expect(try machine.outcome?.result(Int.self, TestError.self)?.get() == 1)
    #expect(machine.successHandler == nil)
  }

  @Test func cancellationHasNoResultAndNoHandler() throws {
    var machine = Machine()
    machine.successHandler = { _ in }
    machine.failureHandler = { _ in }
    let completion = machine.complete(.cancelled)
    let decided = try #require(completion)
    #expect(decided.deliver == nil)
    #expect(machine.outcome?.result(Int.self, TestError.self) == nil)
  }
}
