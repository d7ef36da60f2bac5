/// A min-heap: `peek` and `pop` give the smallest element by `<`.
///
/// The order comes from `Comparable` rather than a stored closure, so the comparisons are
/// specialised and inlined in the hot claim path.
///
/// Elements pushed in order (each no smaller than the last one pushed in order) go to a sorted
/// run instead of the binary heap, so a queue's usual traffic (jobs added oldest first, claimed
/// oldest first) pushes and pops in O(1). Anything pushed out of order goes to the heap; the
/// smallest element is the smaller of the run's first and the heap's top.
package struct Heap<Element: Comparable & Sendable>: Sendable {
  /// The binary heap of elements pushed out of order.
  private var storage: [Element] = []
  /// Elements pushed in order, sorted; the live ones start at `runStart`.
  private var run: [Element] = []
  private var runStart = 0

  package init() {}

  /// How many elements the heap holds.
  package var count: Int { storage.count + run.count - runStart }

  /// Every element, in no particular order.
  package var elements: [Element] { storage + run[runStart...] }

  package var peek: Element? {
    guard runStart < run.count else { return storage.first }
    guard let top = storage.first, top < run[runStart] else { return run[runStart] }
    return top
  }

  package mutating func push(_ element: Element) {
    if runStart == run.count || !(element < run[run.count - 1]) {
      run.append(element)
      return
    }
    storage.append(element)
    var child = storage.count - 1
    while child > 0 {
      let parent = (child - 1) / 2
      guard storage[child] < storage[parent] else { break }
      storage.swapAt(child, parent)
      child = parent
    }
  }

  @discardableResult
  package mutating func pop() -> Element? {
    if runStart < run.count, storage.first.map({ !($0 < run[runStart]) }) ?? true {
      return popRun()
    }
    return popHeap()
  }

  private mutating func popRun() -> Element {
    let first = run[runStart]
    runStart += 1
    if runStart == run.count {
      run.removeAll(keepingCapacity: true)
      runStart = 0
    } else if runStart >= 1024 && runStart * 2 >= run.count {
      // Drop the popped prefix once it is half the run: amortised O(1) per pop.
      run.removeFirst(runStart)
      runStart = 0
    }
    return first
  }

  private mutating func popHeap() -> Element? {
    guard !storage.isEmpty else { return nil }
    storage.swapAt(0, storage.count - 1)
    let top = storage.removeLast()
    var parent = 0
    while true {
      let left = 2 * parent + 1
      let right = left + 1
      var best = parent
      if left < storage.count && storage[left] < storage[best] { best = left }
      if right < storage.count && storage[right] < storage[best] { best = right }
      if best == parent { break }
      storage.swapAt(parent, best)
      parent = best
    }
    return top
  }
}
