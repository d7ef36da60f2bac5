/// Values by job ID, for the in-memory store: built for IDs that arrive in increasing order, as a
/// store hands them out, and leave roughly in that order.
///
/// Recent IDs sit in a window: an array indexed by `id - base`, so looking a job up hashes
/// nothing and neighbouring jobs share cache lines. A `Dictionary` keyed by ID did both badly: a
/// SipHash per lookup, insert and delete (and more for the entries a delete shifts), and a cache
/// miss per job once the backlog outgrew the cache.
///
/// Everything else sits in an overflow dictionary: an ID behind the window, one far beyond its end,
/// and the jobs that outlive thousands of newer ones (dead jobs, jobs scheduled far ahead). Those
/// leave the window when it gets sparse: the window never spans more than twice its live entries
/// (or ``minimumSpan`` positions), so the memory it holds stays in proportion to the jobs it holds,
/// and every operation is O(1) amortised. When more new IDs went to the overflow for falling far
/// past the window than it holds, its values move there too and the window starts again at the
/// newest ID. The array is never shrunk, as a `Dictionary` never is.
struct JobTable<Value: Sendable>: Sendable {
  /// A window of up to this many positions is never thinned, however few of them are live.
  static var minimumSpan: Int { 4096 }
  /// A new ID at most this far past the window's end joins it (the positions between stay
  /// empty); one farther goes to the overflow, unless the window stays at least half full.
  static var smallGap: Int64 { 16 }

  /// `window[i]` holds the value of ID `base + i`; positions before `head` are unused.
  private var window: [Value?] = []
  private var base: Int64 = 0
  private var head = 0
  /// Live values in the window.
  private var windowCount = 0
  private var overflow: [JobID: Value] = [:]
  /// New IDs that went to the overflow for falling too far past the window since it last
  /// started: once they outnumber its live values, the window gives way to them.
  private var farInserts = 0

  init() {}

  /// How many values the table holds.
  var count: Int { windowCount + overflow.count }

  var isEmpty: Bool { count == 0 }

  /// The positions the window spans, live or empty.
  var windowSpan: Int { window.count - head }

  /// How many values sit in the overflow dictionary (for tests: the rest are in the window).
  var overflowCount: Int { overflow.count }

  /// The window position of `id`, if the window spans it.
  private func position(of id: JobID) -> Int? {
    // The window holds only IDs of ``windowIDs``; an ID far outside them may wrap here, but
    // only `base + offset` itself maps to an offset the window spans.
    let offset = id.rawValue &- base
    guard offset >= Int64(head), offset < Int64(window.count) else { return nil }
    return Int(offset)
  }

  /// The value for `id`; setting nil removes it.
  subscript(id: JobID) -> Value? {
    get {
      if let position = position(of: id), let value = window[position] { return value }
      return overflow.isEmpty ? nil : overflow[id]
    }
    set {
      if let newValue {
        if update(id, { $0 = newValue }) == nil { insert(newValue, for: id) }
      } else {
        removeValue(for: id)
      }
    }
  }

  /// Runs `body` on the value of `id` in place; nil (and `body` not run) when there is none.
  mutating func update<R>(_ id: JobID, _ body: (inout Value) -> R) -> R? {
    if let position = position(of: id), window[position] != nil { return body(&window[position]!) }
    guard !overflow.isEmpty, let index = overflow.index(forKey: id) else { return nil }
    return body(&overflow.values[index])
  }

  /// Removes the value of `id`; returns it (nil: there was none).
  @discardableResult
  mutating func removeValue(for id: JobID) -> Value? {
    guard let position = position(of: id), let value = window[position] else {
      return overflow.isEmpty ? nil : overflow.removeValue(forKey: id)
    }
    window[position] = nil
    windowCount -= 1
    trimFront()
    thin()
    return value
  }

  /// Every ID, in no particular order.
  var keys: [JobID] {
    var keys = Array(overflow.keys)
    keys.reserveCapacity(count)
    for position in head..<window.count where window[position] != nil {
      keys.append(JobID(base + Int64(position)))
    }
    return keys
  }

  /// Every value, in no particular order.
  var values: [Value] {
    var values = Array(overflow.values)
    values.reserveCapacity(count)
    for position in head..<window.count { if let value = window[position] { values.append(value) } }
    return values
  }

  /// The IDs the window may hold: far from both ends of `Int64`, so that its arithmetic cannot
  /// overflow. A store hands out IDs from 1 upwards; any other ID is a key like any other, kept in
  /// the overflow.
  static var windowIDs: ClosedRange<Int64> { (Int64.min / 2)...(Int64.max / 2) }

  /// Adds a value for an ID the table does not hold.
  private mutating func insert(_ value: Value, for id: JobID) {
    guard Self.windowIDs.contains(id.rawValue) else {
      overflow[id] = value
      return
    }
    // An empty window starts again at this ID.
    if windowCount == 0 { restartWindow(at: id) }
    if let position = position(of: id) {
      window[position] = value
      windowCount += 1
      return
    }
    let end = base + Int64(window.count)
    let gap = id.rawValue - end
    // Behind the window: in the overflow.
    guard id.rawValue >= end else {
      overflow[id] = value
      return
    }
    // Too far past it to keep the window at least half full: in the overflow, until as many new
    // IDs came so as the window holds (stragglers, such as dead jobs, while the queue's new jobs
    // follow IDs another queue took). Then its values move to the overflow and it starts again
    // here: a cost in proportion to the inserts that led to it.
    if gap > Self.smallGap && gap >= 2 * Int64(windowCount + 1) - Int64(windowSpan) {
      farInserts += 1
      guard farInserts > windowCount else {
        overflow[id] = value
        return
      }
      for position in head..<window.count {
        if let value = window[position] { overflow[JobID(base + Int64(position))] = value }
      }
      windowCount = 0
      restartWindow(at: id)
      window.append(value)
      windowCount = 1
      return
    }
    window.append(contentsOf: repeatElement(nil, count: Int(gap)))
    window.append(value)
    windowCount += 1
    thin()
  }

  /// Empties the window (its live values must be elsewhere) and starts it at `id`.
  private mutating func restartWindow(at id: JobID) {
    window.removeAll(keepingCapacity: true)
    base = id.rawValue
    head = 0
    farInserts = 0
  }

  /// Moves `head` past empty positions, and drops the unused prefix once it is half the array.
  private mutating func trimFront() {
    while head < window.count && window[head] == nil { head += 1 }
    if head == window.count {
      window.removeAll(keepingCapacity: true)
      head = 0
    } else if head >= 1024 && head * 2 >= window.count {
      window.removeFirst(head)
      base += Int64(head)
      head = 0
    }
  }

  /// Keeps the window at least half full (beyond ``minimumSpan``): the older half of a sparse
  /// window moves its live values to the overflow.
  private mutating func thin() {
    while windowSpan > Self.minimumSpan && windowSpan > 2 * windowCount {
      let cut = head + windowSpan / 2
      for position in head..<cut {
        guard let value = window[position] else { continue }
        overflow[JobID(base + Int64(position))] = value
        window[position] = nil
        windowCount -= 1
      }
      head = cut
      trimFront()
    }
  }
}
