import ConveyorAsyncTaskPerformer
import Foundation
import Synchronization
import Testing

// The async task performer's README, compiled against the drop-in module: the only change is
// `import ConveyorAsyncTaskPerformer` instead of `import AsyncTaskPerformer` (and, under Swift 6,
// operation subclasses restating `@unchecked Sendable`).

/// Lines "printed" by the tasks, in order.
final class Output: Sendable {
  private let lines = Mutex<[String]>([])
  func print(_ line: String) { lines.withLock { $0.append(line) } }
  var all: [String] { lines.withLock { $0 } }
}

struct SayHelloTask: AsyncTask {
  let id: Int
  let output: Output

  func execute(completion: @escaping () -> Void) {
    output.print("Hello World \(id)")
    completion()
  }
}

/// A task that completes later, the first one slowest: started all at once (the old bug), they
/// would print "start 1, start 2, start 3" before any "end".
struct SlowTask: AsyncTask {
  let id: Int
  let output: Output

  func execute(completion: @escaping @Sendable () -> Void) {
    output.print("start \(id)")
    DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(30 / id)) {
      output.print("end \(id)")
      completion()
      completion()  // a second call is ignored
    }
  }
}

struct Item: Equatable, Sendable {
  var id: Int
}

struct Bag: Equatable, Sendable {
  var items: [Item]
}

struct NotInBag: Error, Equatable {
  var itemID: Int
}

/// The README's `api`: removes an item from the bag it is given and reports the updated bag, or an
/// error if the item is not there.
final class ECommAPI: Sendable {
  let calls = Mutex<[Int]>([])

  func removeFromBag(
    item itemID: Int, from bag: Bag, completion: @escaping @Sendable (Bag?, (any Error)?) -> Void
  ) {
    calls.withLock { $0.append(itemID) }
    DispatchQueue.global().async {
      guard bag.items.contains(Item(id: itemID)) else {
        completion(nil, NotInBag(itemID: itemID))
        return
      }
      completion(Bag(items: bag.items.filter { $0.id != itemID }), nil)
    }
  }
}

// @unchecked Sendable: only immutable stored properties (the API is Sendable).
final class RemoveItemFromBagOperation: AsyncOperationWithCompletion<Bag>, @unchecked Sendable {
  let itemID: Int
  let api: ECommAPI

  init(itemID: Int, api: ECommAPI) {
    self.itemID = itemID
    self.api = api
  }

  override func main() {
    // `input` is the bag the previous operation reported (the queue's defaultValue first).
    api.removeFromBag(item: itemID, from: input ?? Bag(items: [])) { [weak self] (updatedBag, error) in
      self?.completion?(updatedBag, error)
      self?.finish()
    }
  }
}

/// Waits for a completion-handler call and returns its arguments.
func completionValue<T: Sendable>(
  _ start: (@escaping @Sendable (T) -> Void) -> Void
) async -> T {
  await withCheckedContinuation { continuation in start { continuation.resume(returning: $0) } }
}

@Suite("AsyncTaskPerformer drop-in (README)")
struct AsyncTaskPerformerReadmeTests {
  @Test("SynchronousDispatchGroup runs the README's tasks in order, then one completion")
  func readmeGroup() async {
    let output = Output()
    let tasks: [AsyncTask] = [
      SayHelloTask(id: 1, output: output), SayHelloTask(id: 2, output: output),
      SayHelloTask(id: 3, output: output),
    ]
    let synchronousDispatchGroup = SynchronousDispatchGroup()

    _ = await completionValue { (done: @escaping @Sendable (Bool) -> Void) in
      synchronousDispatchGroup.executeTasks(tasks) {
        output.print("Goodbye")
        done(true)
      }
    }
    #expect(output.all == ["Hello World 1", "Hello World 2", "Hello World 3", "Goodbye"])
  }

  @Test("each task starts after the previous one completed; the completion runs once, on systemQueue")
  func strictlySequential() async {
    let output = Output()
    let key = DispatchSpecificKey<String>()
    let systemQueue = DispatchQueue(label: "performer-tests.system")
    systemQueue.setSpecific(key: key, value: "system")
    let group = SynchronousDispatchGroup(systemQueue: systemQueue)
    let completions = Mutex(0)
    let onSystemQueue = Mutex(false)
    _ = await completionValue { (done: @escaping @Sendable (Bool) -> Void) in
      group.executeTasks((1...3).map { SlowTask(id: $0, output: output) }) {
        completions.withLock { $0 += 1 }
        onSystemQueue.withLock { $0 = DispatchQueue.getSpecific(key: key) == "system" }
        done(true)
      }
    }
    #expect(output.all == ["start 1", "end 1", "start 2", "end 2", "start 3", "end 3"])
    #expect(onSystemQueue.withLock { $0 })
    // Let any stray second completion arrive on the system queue before counting.
    await withCheckedContinuation { continuation in systemQueue.async { continuation.resume() } }
    #expect(completions.withLock { $0 } == 1)
  }

  @Test("SynchronousOperationQueue removes items 2 and 4 in order and reports the final bag")
  func readmeOperationQueue() async {
    let api = ECommAPI()
    let currentBag = Bag(items: [Item(id: 1), Item(id: 2), Item(id: 3), Item(id: 4)])
    let itemsToRemove = [2, 4]
    let operations = itemsToRemove.map { RemoveItemFromBagOperation(itemID: $0, api: api) }
    let synchronousOperationQueue = SynchronousOperationQueue(defaultValue: currentBag)

    let (finalBag, error) = await completionValue {
      (done: @escaping @Sendable ((Bag?, (any Error)?)) -> Void) in
      synchronousOperationQueue.executeOperations(operations) { (finalBag, error) in
        done((finalBag, error))
      }
    }
    #expect(error == nil)
    #expect(finalBag == Bag(items: [Item(id: 1), Item(id: 3)]))
    #expect(api.calls.withLock { $0 } == [2, 4])
  }

  @Test("the first error stops the run: later operations are cancelled and never run; completion once")
  func firstErrorStops() async {
    let api = ECommAPI()
    let queue = SynchronousOperationQueue(defaultValue: Bag(items: [Item(id: 1), Item(id: 2)]))
    let operations = [1, 9, 2].map { RemoveItemFromBagOperation(itemID: $0, api: api) }
    let (finalBag, error) = await completionValue {
      (done: @escaping @Sendable ((Bag?, (any Error)?)) -> Void) in
      queue.executeOperations(operations) { done(($0, $1)) }
    }
    #expect(finalBag == nil)
    #expect(error as? NotInBag == NotInBag(itemID: 9))
    #expect(api.calls.withLock { $0 } == [1, 9])
    #expect(operations[2].isCancelled)
  }

  @Test("no operations: the completion gets defaultValue")
  func emptyRun() async {
    let queue = SynchronousOperationQueue(defaultValue: Bag(items: [Item(id: 5)]))
    let (finalBag, error) = await completionValue {
      (done: @escaping @Sendable ((Bag?, (any Error)?)) -> Void) in
      queue.executeOperations([]) { done(($0, $1)) }
    }
    #expect(finalBag == Bag(items: [Item(id: 5)]))
    #expect(error == nil)
  }

  @Test("an error in one run does not cancel another run on the same queue")
  func runsAreIndependent() async {
    let api = ECommAPI()
    let queue = SynchronousOperationQueue(defaultValue: Bag(items: [Item(id: 1), Item(id: 2)]))
    async let failing = completionValue { (done: @escaping @Sendable ((Bag?, (any Error)?)) -> Void) in
      queue.executeOperations([RemoveItemFromBagOperation(itemID: 7, api: api)]) { done(($0, $1)) }
    }
    async let succeeding = completionValue { (done: @escaping @Sendable ((Bag?, (any Error)?)) -> Void) in
      queue.executeOperations([1, 2].map { RemoveItemFromBagOperation(itemID: $0, api: api) }) {
        done(($0, $1))
      }
    }
    let (failed, ok) = await (failing, succeeding)
    #expect(failed.1 != nil)
    #expect(ok.0 == Bag(items: []))
    #expect(ok.1 == nil)
  }
}
