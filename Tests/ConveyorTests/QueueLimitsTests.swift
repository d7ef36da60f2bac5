import Conveyor
import Testing

/// `QueueLimits` as a value: the limit a key gets.
@Suite struct QueueLimitsTests {
  /// A key's override binds the key with its exact bytes, as the stores compare keys: the
  /// decomposed spelling of a key with an override gets the limit per key, though Swift calls the
  /// two strings equal.
  @Test func aKeysOverrideBindsOnlyItsExactBytes() {
    let composed = "caf\u{E9}"
    let decomposed = "cafe\u{301}"
    #expect(composed == decomposed)
    let limits = QueueLimits(keyConcurrency: 2, keyConcurrencyOverrides: [composed: 5])
    #expect(limits.concurrency(forKey: composed) == 5)
    #expect(limits.concurrency(forKey: decomposed) == 2)
    #expect(limits.concurrency(forKey: "other") == 2)
    let overridesOnly = QueueLimits(keyConcurrencyOverrides: [decomposed: 1])
    #expect(overridesOnly.concurrency(forKey: decomposed) == 1)
    #expect(overridesOnly.concurrency(forKey: composed) == nil)
    #expect(QueueLimits().concurrency(forKey: composed) == nil)
  }
}
