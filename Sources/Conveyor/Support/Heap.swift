/// A binary min-heap ordered by a comparison closure.
struct Heap<Element: Sendable>: Sendable {
  private var storage: [Element] = []
  private let areInIncreasingOrder: @Sendable (Element, Element) -> Bool

  init(by areInIncreasingOrder: @escaping @Sendable (Element, Element) -> Bool) {
    self.areInIncreasingOrder = areInIncreasingOrder
  }

  var count: Int { storage.count }
  var isEmpty: Bool { storage.isEmpty }
  var peek: Element? { storage.first }

  mutating func push(_ element: Element) {
    storage.append(element)
    var child = storage.count - 1
    while child > 0 {
      let parent = (child - 1) / 2
      guard areInIncreasingOrder(storage[child], storage[parent]) else { break }
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
      if left < storage.count && areInIncreasingOrder(storage[left], storage[best]) { best = left }
      if right < storage.count && areInIncreasingOrder(storage[right], storage[best]) { best = right }
      if best == parent { break }
      storage.swapAt(parent, best)
      parent = best
    }
    return top
  }
}
