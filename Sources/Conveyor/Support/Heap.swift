/// A binary min-heap: `peek` and `pop` give the smallest element by `<`.
///
/// The order comes from `Comparable` rather than a stored closure, so the comparisons are
/// specialised and inlined in the hot claim path.
struct Heap<Element: Comparable & Sendable>: Sendable {
  private var storage: [Element] = []

  init() {}

  var peek: Element? { storage.first }

  mutating func push(_ element: Element) {
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
  mutating func pop() -> Element? {
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
