import ConveyorAsyncTaskPerformer
import Foundation
import Synchronization
import Testing

// The example of this module's landing page (ConveyorAsyncTaskPerformer.md), verbatim between the
// markers. `Bag`, `Item` and `RemoveItemFromBagOperation` are the old README's
// (AsyncTaskPerformerReadmeTests.swift); the example's `SayHelloTask` and `print` are declared
// here, and `print` records the lines so the test can read them.

@Suite("Guide snippets: AsyncTaskPerformer drop-in", .timeLimit(.minutes(10)))
struct AsyncTaskPerformerGuideSnippetTests {
  /// The landing page's task: says hello, then completes.
  struct SayHelloTask: AsyncTask {
    let id: Int
    let output: Output

    init(id: Int) {
      self.id = id
      output = AsyncTaskPerformerGuideSnippetTests.output
    }

    func execute(completion: @escaping () -> Void) {
      output.print("Hello World \(id)")
      completion()
    }
  }

  static let output = Output()

  func print(_ line: String) { Self.output.print(line) }

  @Test func theLandingPageExampleRunsTheTasksThenTheOperations() async throws {
    let api = ECommAPI()
    let currentBag = Bag(items: [Item(id: 1), Item(id: 2), Item(id: 3), Item(id: 4)])
    let operations = [2, 4].map { RemoveItemFromBagOperation(itemID: $0, api: api) }

    // ConveyorAsyncTaskPerformer.md example begins
    let tasks: [AsyncTask] = [SayHelloTask(id: 1), SayHelloTask(id: 2), SayHelloTask(id: 3)]
    SynchronousDispatchGroup().executeTasks(tasks) {
      print("Goodbye")
    }

    let queue = SynchronousOperationQueue(defaultValue: currentBag)
    queue.executeOperations(operations) { (finalBag, error) in
      if error != nil { print(":(") } else { print("Updated Bag: \(finalBag!)") }
    }
    // ConveyorAsyncTaskPerformer.md example ends

    let expected = [
      "Hello World 1", "Hello World 2", "Hello World 3", "Goodbye",
      "Updated Bag: \(Bag(items: [Item(id: 1), Item(id: 3)]))",
    ]
    // Five lines come, whatever they say (the suite's time limit guards against a hang).
    while Self.output.all.count < expected.count {
      try await Task.sleep(for: .milliseconds(5))
    }
    // The group and the queue run side by side: each in its own order.
    let lines = Self.output.all
    #expect(Set(lines) == Set(expected))
    #expect(lines.filter { $0 != expected[4] } == Array(expected[0...3]))
  }
}
