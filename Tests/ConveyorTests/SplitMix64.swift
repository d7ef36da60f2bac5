/// SplitMix64: a small, fast random generator that gives the same numbers on every platform, so
/// a failure of a seeded test (`HeapTests`, `PayloadDecoderTests`) replays.
struct SplitMix64: RandomNumberGenerator {
  var state: UInt64
  mutating func next() -> UInt64 {
    state &+= 0x9E37_79B9_7F4A_7C15
    var z = state
    z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
    z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
    return z ^ (z >> 31)
  }
  mutating func below(_ bound: Int) -> Int { Int(next() % UInt64(bound)) }
  mutating func chance(_ percent: Int) -> Bool { below(100) < percent }
  mutating func pick<C: Collection>(_ items: C) -> C.Element where C.Index == Int {
    items[items.startIndex + below(items.count)]
  }
}
