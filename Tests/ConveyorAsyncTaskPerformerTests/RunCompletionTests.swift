import ConveyorAsyncTaskPerformer
import Foundation
import Synchronization
import Testing

// Runs of the AsyncTaskPerformer drop-in end with exactly one completion, whatever the tasks and
// operations do (call back twice, fail concurrently), and cancelling one run touches no other.

/// Adds `add` to its input after `delay`, reporting twice when asked (the second must be ignored).
// @unchecked Sendable: only immutable stored properties.
final class AddOperation: AsyncOperationWithCompletion<Int>, @unchecked Sendable {
  let add: Int
  let delay: Double
  let twice: Bool
  let fail: Bool
  let log: Output
  init(add: Int, delay: Double = 0.01, twice: Bool = false, fail: Bool = false, log: Output) {
    self.add = add
    self.delay = delay
    self.twice = twice
    self.fail = fail
    self.log = log
    super.init()
  }
  override func main() {
    let input = self.input ?? 0
    log.print("start \(add)")
    DispatchQueue.global().asyncAfter(deadline: .now() + delay) {
      if self.fail {
        self.completion?(nil, NotInBag(itemID: self.add))
      } else {
        self.completion?(input + self.add, nil)
        if self.twice { self.completion?(input + 1000, nil) }
      }
      self.finish()
    }
  }
}

/// Calls back twice, the second time later.
struct TwiceTask: AsyncTask {
  let id: Int
  let output: Output
  func execute(completion: @escaping @Sendable () -> Void) {
    output.print("start \(id)")
    DispatchQueue.global().async {
      completion()
      DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(5)) { completion() }
    }
  }
}

/// Collects completions of runs and lets a test wait for them.
final class Completions: Sendable {
  private let values = Mutex<[(Int?, String?)]>([])
  func record(_ value: Int?, _ error: (any Error)?) {
    values.withLock { $0.append((value, error.map { "\($0)" })) }
  }
  var all: [(Int?, String?)] { values.withLock { $0 } }
  /// Waits up to `seconds` for `count` completions. 60 s: the tasks' callbacks run on
  /// `DispatchQueue.global()`, which on Linux shares the cooperative pool's threads, so in a full
  /// test run beside a build a completion once took over 20 s to come.
  func wait(for count: Int, seconds: Double = 60) async -> Bool {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
      if all.count >= count { return true }
      try? await Task.sleep(for: .milliseconds(10))
    }
    return all.count >= count
  }
}

@Suite("AsyncTaskPerformer drop-in: one completion per run, cancelling a run", .timeLimit(.minutes(10)))
struct RunCompletionTests {
  @Test("cancelling one run leaves another run on the same queue untouched")
  func cancelOneRun() async {
    let queue = SynchronousOperationQueue(defaultValue: 0)
    let log = Output()
    let first = Completions()
    let second = Completions()
    let handle = queue.executeOperations((1...3).map { AddOperation(add: $0, delay: 0.05, log: log) }) {
      first.record($0, $1)
    }
    queue.executeOperations((1...3).map { AddOperation(add: $0 * 10, delay: 0.05, log: log) }) {
      second.record($0, $1)
    }
    handle.cancel()
    #expect(await first.wait(for: 1))
    #expect(await second.wait(for: 1))
    try? await Task.sleep(for: .milliseconds(200))
    #expect(second.all.count == 1)
    #expect(second.all.first?.0 == 60)
    #expect(second.all.first?.1 == nil)
    #expect(first.all.count == 1)
  }

  @Test("an operation reporting twice: the next one starts once with the first value; one completion")
  func operationReportsTwice() async {
    let queue = SynchronousOperationQueue(defaultValue: 0)
    let log = Output()
    let done = Completions()
    queue.executeOperations([
      AddOperation(add: 1, twice: true, log: log), AddOperation(add: 2, log: log),
      AddOperation(add: 3, log: log),
    ]) { done.record($0, $1) }
    #expect(await done.wait(for: 1))
    try? await Task.sleep(for: .milliseconds(200))
    #expect(done.all.count == 1)
    #expect(done.all.first?.0 == 6)
    #expect(log.all == ["start 1", "start 2", "start 3"])
  }

  @Test("concurrent runs with an error: one completion per run, never twice", arguments: 0..<10)
  func concurrentErrorOnce(run: Int) async {
    let queue = SynchronousOperationQueue(defaultValue: 0, type: .concurrent(maxConcurrentOperations: 3))
    let log = Output()
    let done = Completions()
    queue.executeOperations([
      AddOperation(add: 1, delay: 0.001, fail: true, log: log),
      AddOperation(add: 2, delay: 0.001, fail: true, log: log),
      AddOperation(add: 3, delay: 0.002, twice: true, log: log),
    ]) { done.record($0, $1) }
    #expect(await done.wait(for: 1))
    try? await Task.sleep(for: .milliseconds(100))
    #expect(done.all.count == 1)
    #expect(done.all.first?.1 != nil)
  }

  @Test("a group whose tasks call back twice still runs each task once, in order, with one completion")
  func groupTasksCallBackTwice() async {
    let output = Output()
    let done = Completions()
    SynchronousDispatchGroup().executeTasks((1...5).map { TwiceTask(id: $0, output: output) }) {
      done.record(nil, nil)
    }
    #expect(await done.wait(for: 1))
    try? await Task.sleep(for: .milliseconds(200))
    #expect(done.all.count == 1)
    #expect(output.all == (1...5).map { "start \($0)" })
  }

  @Test("cancelling a group run: later tasks never start, the completion runs once")
  func cancelGroupRun() async {
    let output = Output()
    let done = Completions()
    let tasks: [AsyncTask] = (1...5).map { SlowTask(id: $0, output: output) }
    let handle = SynchronousDispatchGroup().executeTasks(tasks) { done.record(nil, nil) }
    handle.cancel()
    #expect(await done.wait(for: 1))
    try? await Task.sleep(for: .milliseconds(300))
    #expect(done.all.count == 1)
    #expect(output.all.filter { $0.hasPrefix("start") }.count <= 1)
  }
}
