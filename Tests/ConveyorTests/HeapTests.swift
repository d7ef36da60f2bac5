import ConveyorTestSupport
import Foundation
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

  /// Element counts held in the heap's private arrays, read through reflection.
  static func footprint<E>(_ heap: Heap<E>) -> Int {
    var total = 0
    for child in Mirror(reflecting: heap).children {
      if let array = child.value as? [E] { total += array.count }
    }
    return total
  }

  @Test(.timeLimit(.minutes(10))) func alternatingTrafficKeepsMemoryBounded() {
    // Several patterns of endless alternation with a small live set.
    var heap = Heap<Int>()
    var live: [Int] = []
    var next = 1_000_000
    var generator = SystemRandomNumberGenerator()
    for step in 0..<200_000 {
      let value: Int
      switch step % 4 {
      case 0: value = next  // in order
      case 1: value = next - Int.random(in: 0...50, using: &generator)  // straggler
      case 2: value = (live.min() ?? next)  // ties with the minimum
      default: value = next + 5
      }
      next += 1
      heap.push(value)
      live.append(value)
      if live.count > 16 || step % 3 != 0 {
        let minimum = live.min()!
        #expect(heap.pop() == minimum)
        live.remove(at: live.firstIndex(of: minimum)!)
      }
      if step % 1000 == 0 {
        #expect(heap.count == live.count)
        #expect(Self.footprint(heap) <= 4 * 1024, "footprint \(Self.footprint(heap)) with \(live.count) live")
      }
    }
  }
}
