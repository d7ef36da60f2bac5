import Testing

@testable import Conveyor

@Suite("OperationStateMachine")
struct OperationStateMachineTests {
  typealias Machine = OperationStateMachine<Int, TestError>

  @Test func startsOnce() {
    var machine = Machine()
    let first = machine.start()
    let second = machine.start()
    #expect(first == .run)
    #expect(second == .ignore)
  }

  @Test func cancelledBeforeStartFinishesWithoutRunning() throws {
    var machine = Machine()
    let completion = machine.complete(.failure(.cancelled), finishesNow: true)
    let decided = try #require(completion)
    #expect(!decided.publishFinished)  // not started: the queue's start() finishes it
    #expect(decided.deliver == nil)
    let action = machine.start()
    #expect(action == .finishWithoutRunning)
    #expect(machine.isCancelled)
    #expect(machine.result == nil)
  }

  @Test func outcomeIsDecidedOnce() throws {
    var machine = Machine()
    machine.successHandler = { _ in }
    _ = machine.start()
    let completion = machine.complete(.success(1), finishesNow: true)
    let decided = try #require(completion)
    #expect(decided.publishFinished)
    #expect(decided.deliver != nil)
    let second = machine.complete(.success(2), finishesNow: true)
    let cancel = machine.complete(.failure(.cancelled), finishesNow: true)
    #expect(second == nil)
    #expect(cancel == nil)
    #expect(try machine.result?.get() == 1)
    #expect(machine.successHandler == nil)  // released once used
  }

  @Test func synchronousOperationsPublishFinishWhenStartReturns() throws {
    var machine = Machine()
    _ = machine.start()
    let completion = machine.complete(.failure(.failed(TestError(code: 1))), finishesNow: false)
    let decided = try #require(completion)
    #expect(!decided.publishFinished)
  }

  @Test func phaseOnlyMovesForward() {
    var machine = Machine()
    machine.publish(.finished)
    machine.publish(.executing)
    #expect(machine.phase == .finished)
    let first = machine.claimFinish()
    let second = machine.claimFinish()
    #expect(first)
    #expect(!second)
  }
}
