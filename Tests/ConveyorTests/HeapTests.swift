import ConveyorTestSupport
import Testing

@testable import Conveyor

/// `Heap` keeps elements pushed in order in a sorted run beside the binary heap; these tests check
/// it against a sorted array for in-order, out-of-order and mixed traffic.
@Suite struct HeapTests {
  /// Pushes and pops at random against a sorted array; `nextValue` chooses the pushed values.
  func check(seed: UInt64, operations: Int, nextValue: (inout SeededRandom, Int) -> Int) {
    var generator = SeededRandom(seed: seed)
    var heap = Heap<Int>()
    var reference: [Int] = []
    for step in 0..<operations {
      if Int.random(in: 0..<3, using: &generator) > 0 {
        let value = nextValue(&generator, step)
        heap.push(value)
        reference.insert(value, at: reference.firstIndex { $0 > value } ?? reference.count)
      } else {
        #expect(
          heap.pop() == (reference.isEmpty ? nil : reference.removeFirst()), "seed \(seed), step \(step)")
      }
      #expect(heap.peek == reference.first, "seed \(seed), step \(step)")
      #expect(heap.count == reference.count, "seed \(seed), step \(step)")
    }
    while let value = heap.pop() { #expect(value == reference.removeFirst()) }
    #expect(reference.isEmpty)
  }

  @Test func inOrderPushesPopInOrder() {
    for seed in 1...5 as ClosedRange<UInt64> { check(seed: seed, operations: 5_000) { _, step in step } }
  }

  @Test func randomPushesPopInOrder() {
    for seed in 1...5 as ClosedRange<UInt64> {
      check(seed: seed, operations: 3_000) { generator, _ in Int.random(in: 0..<500, using: &generator) }
    }
  }

  @Test func mostlyInOrderPushesWithStragglersPopInOrder() {
    // Mostly rising values with duplicates and a few from the past: both the run and the heap
    // hold elements, and the run is compacted along the way (more than 1,024 pops).
    for seed in 1...5 as ClosedRange<UInt64> {
      check(seed: seed, operations: 6_000) { generator, step in
        Int.random(in: 0..<10, using: &generator) == 0
          ? Int.random(in: 0...step, using: &generator) : step / 2
      }
    }
  }

  @Test func aLongRunIsCompactedAndStillPopsInOrder() {
    var heap = Heap<Int>()
    for value in 0..<10_000 { heap.push(value) }
    for value in 0..<6_000 { #expect(heap.pop() == value) }
    heap.push(5)  // out of order: into the heap part
    heap.push(10_000)
    #expect(heap.pop() == 5)
    for value in 6_000...10_000 { #expect(heap.pop() == value) }
    #expect(heap.pop() == nil)
    #expect(heap.count == 0)
  }
}
