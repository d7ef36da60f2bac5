import Synchronization

/// SCRATCH: counts of faults and engine paths reached, across histories.
public enum SimCoverage {
  static let counts = Mutex<[String: Int]>([:])
  static func add(_ key: String, _ n: Int = 1) { counts.withLock { $0[key, default: 0] += n } }
  public static func snapshot() -> [String: Int] { counts.withLock { $0 } }
}
