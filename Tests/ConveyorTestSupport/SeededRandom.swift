/// A deterministic random number generator (SplitMix64): the same seed gives the same numbers on
/// every platform, so a seeded test's failure (a fuzz test, a simulated history) replays.
public struct SeededRandom: RandomNumberGenerator, Sendable {
  private var state: UInt64

  /// Starts from `seed`.
  public init(seed: UInt64) { state = seed }

  /// The next 64 random bits.
  public mutating func next() -> UInt64 {
    state &+= 0x9E37_79B9_7F4A_7C15
    var value = state
    value = (value ^ (value >> 30)) &* 0xBF58_476D_1CE4_E5B9
    value = (value ^ (value >> 27)) &* 0x94D0_49BB_1331_11EB
    return value ^ (value >> 31)
  }

  /// A number in `0..<bound` (`bound` > 0).
  public mutating func below(_ bound: Int) -> Int { Int(next() % UInt64(bound)) }

  /// True `percent` times in a hundred.
  public mutating func chance(percent: Int) -> Bool { below(100) < percent }

  /// True with probability `probability` (0 to 1).
  public mutating func chance(probability: Double) -> Bool {
    Double(next() >> 11) / Double(1 << 53) < probability
  }

  /// A duration between `low` and `high`, to the microsecond.
  public mutating func duration(_ low: Duration, _ high: Duration) -> Duration {
    let span = (high - low) / .microseconds(1)
    guard span > 0 else { return low }
    return low + .microseconds(Int64(next() % UInt64(span)))
  }

  /// One of `items` (not empty).
  public mutating func pick<C: Collection>(_ items: C) -> C.Element where C.Index == Int {
    items[items.startIndex + below(items.count)]
  }
}
