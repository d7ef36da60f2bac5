import ConveyorTestSupport
import Testing

@testable import Conveyor

/// `JobTable` keeps recent IDs in a window array and the rest in a dictionary; these tests check
/// it against a plain dictionary for the traffic a store sees (rising IDs, jobs leaving roughly in
/// order, stragglers, several queues sharing one ID sequence) and for hostile IDs, and check that
/// the window never holds more empty positions than it promises.
@Suite struct JobTableTests {
  /// The window's promise: it spans at most twice its live values, or `minimumSpan` positions.
  func expectBounded(_ table: JobTable<Int>, _ context: String) {
    let windowCount = table.count - table.overflowCount
    #expect(
      table.windowSpan <= max(JobTable<Int>.minimumSpan, 2 * windowCount),
      "\(context): span \(table.windowSpan) for \(windowCount) live values")
  }

  /// Runs random traffic against a dictionary. `nextID` picks the ID of each new value from the
  /// highest one handed out so far; removals and updates pick among the held IDs, favouring the
  /// oldest when `inOrder`.
  func check(
    seed: UInt64, operations: Int, inOrder: Bool, nextID: (inout SeededRandom, Int64) -> Int64
  ) {
    var generator = SeededRandom(seed: seed)
    var table = JobTable<Int>()
    var reference: [JobID: Int] = [:]
    var held: [JobID] = []
    var highest: Int64 = 0
    for step in 0..<operations {
      let context = "seed \(seed), step \(step)"
      switch generator.below(10) {
      case 0..<5:
        let id = JobID(nextID(&generator, highest))
        highest = max(highest, id.rawValue)
        if reference[id] == nil { held.append(id) }
        table[id] = step
        reference[id] = step
      case 5..<8 where !held.isEmpty:
        // Mostly the oldest few (jobs leave roughly in order), now and then any.
        let index =
          inOrder && !generator.chance(percent: 10)
          ? generator.below(min(held.count, 4)) : generator.below(held.count)
        let id = held.remove(at: index)
        #expect(table.removeValue(for: id) == reference.removeValue(forKey: id), "\(context)")
      case 8 where !held.isEmpty:
        let id = generator.pick(held)
        #expect(
          table.update(id) { value -> Int in
            value += 1
            return value
          } == reference[id].map { $0 + 1 }, "\(context)")
        reference[id]? += 1
      default:
        // A lookup of an ID that may or may not be held, near the held ones or far off.
        let id = JobID(
          generator.chance(percent: 50) ? highest - Int64(generator.below(50)) : Int64(generator.next() >> 1))
        #expect(table[id] == reference[id], "\(context)")
        #expect(table.update(id) { $0 } == reference[id], "\(context)")
      }
      #expect(table.count == reference.count, "\(context)")
      expectBounded(table, context)
    }
    #expect(Set(table.keys) == Set(reference.keys))
    #expect(table.values.sorted() == reference.values.sorted())
    for (id, value) in reference { #expect(table[id] == value) }
  }

  @Test func risingIDsLeavingInOrderMatchADictionary() {
    for seed in 1...5 as ClosedRange<UInt64> {
      check(seed: seed, operations: 20_000, inOrder: true) { _, highest in highest + 1 }
    }
  }

  @Test func risingIDsLeavingAtRandomMatchADictionary() {
    // Jobs claimed in priority order: the window thins, and its older half moves to the overflow.
    for seed in 1...5 as ClosedRange<UInt64> {
      check(seed: seed, operations: 20_000, inOrder: false) { _, highest in highest + 1 }
    }
  }

  @Test func idsWithGapsMatchADictionary() {
    // Several queues share one ID sequence: each queue's table sees gaps, mostly small, now and
    // then one of thousands.
    for seed in 1...5 as ClosedRange<UInt64> {
      check(seed: seed, operations: 20_000, inOrder: true) { generator, highest in
        highest + 1 + Int64(generator.chance(percent: 2) ? generator.below(20_000) : generator.below(20))
      }
    }
  }

  @Test func idsOutOfOrderAndHostileMatchADictionary() {
    // IDs a store never hands out (behind the window, negative, at the ends of Int64) still behave
    // as keys; nothing traps.
    for seed in 1...5 as ClosedRange<UInt64> {
      check(seed: seed, operations: 10_000, inOrder: false) { generator, highest in
        switch generator.below(10) {
        case 0: return Int64.max - Int64(generator.below(3))
        case 1: return Int64.min + Int64(generator.below(3))
        case 2: return -Int64(generator.below(1_000))
        case 3: return Int64(generator.below(Int(max(1, min(highest, 1 << 40)))))
        default: return min(highest, Int64.max - 10) + 1
        }
      }
    }
  }

  @Test func aJobThatOutlivesThousandsMovesToTheOverflowAndTheWindowShrinks() {
    var table = JobTable<Int>()
    table[JobID(1)] = 1  // a dead job, kept
    for id in 2...100_000 as ClosedRange<Int64> {
      table[JobID(id)] = Int(id)
      // Handled in order, as a queue does, a few behind the newest.
      if id >= 10 { table.removeValue(for: JobID(id - 8)) }
    }
    #expect(table.count == 1 + 8)
    #expect(table[JobID(1)] == 1)
    #expect(table.overflowCount == 1, "the straggler left the window")
    #expect(table.windowSpan <= JobTable<Int>.minimumSpan)
    #expect(table.removeValue(for: JobID(1)) == 1)
    #expect(table[JobID(1)] == nil)
  }

  @Test func anIDFarPastTheWindowGoesToTheOverflowAndStillRemoves() {
    var table = JobTable<Int>()
    for id in 1...10 as ClosedRange<Int64> { table[JobID(id)] = Int(id) }
    table[JobID(1_000_000)] = 7
    #expect(table.overflowCount == 1)
    #expect(table.windowSpan == 10, "no gap of a million empty positions")
    for id in 1...10 as ClosedRange<Int64> { table.removeValue(for: JobID(id)) }
    #expect(table[JobID(1_000_000)] == 7)
    // The window is empty: the next ID starts it again, beyond the one in the overflow.
    table[JobID(1_000_001)] = 8
    #expect(table.overflowCount == 1)
    #expect(table.count == 2)
    #expect(table.removeValue(for: JobID(1_000_000)) == 7)
    #expect(table.keys == [JobID(1_000_001)])
  }

  /// A window holding a straggler (a dead job) and spanning few positions kept every later ID
  /// more than `smallGap` past its end in the overflow for as long as the straggler stayed: a
  /// queue whose store also served a busier queue lost the window for good. (Failed before the
  /// fix.)
  @Test func newIDsFarPastAWindowOfStragglersTakeTheWindowOver() {
    var table = JobTable<Int>()
    table[JobID(1)] = 1  // a dead job, kept
    // Another queue took IDs 2...100; this queue's next jobs start at 101.
    for id in 101...10_100 as ClosedRange<Int64> { table[JobID(id)] = Int(id) }
    #expect(table.count == 10_001)
    #expect(table.overflowCount <= 3, "the new IDs sit in the window, not in the overflow")
    #expect(table[JobID(1)] == 1)
    for id in 101...10_100 as ClosedRange<Int64> { #expect(table[JobID(id)] == Int(id)) }
  }
}
