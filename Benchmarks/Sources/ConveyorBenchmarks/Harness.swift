import ConveyorPostgres
import Foundation

/// Times `body` once and returns seconds elapsed (monotonic clock).
func seconds(_ body: () async throws -> Void) async rethrows -> Double {
  let clock = ContinuousClock()
  let start = clock.now
  try await body()
  let elapsed = clock.now - start
  return Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
}

/// Runs `body` `repeats` times and returns the best (shortest) time; the first run warms up too.
func best(repeats: Int = 3, _ body: () async throws -> Void) async rethrows -> Double {
  var result = Double.infinity
  for _ in 0..<repeats { result = min(result, try await seconds(body)) }
  return result
}

/// One line of the report: a measured rate, its baseline's rate, the ratio and the goal.
struct Comparison {
  var name: String
  var count: Int
  var seconds: Double
  var baselineName: String
  var baselineSeconds: Double
  /// The lowest acceptable ratio (throughput / baseline throughput), if the issue set one.
  var goal: Double?

  var rate: Double { Double(count) / seconds }
  var baselineRate: Double { Double(count) / baselineSeconds }
  var ratio: Double { baselineSeconds / seconds }

  func print() {
    let goalText =
      goal.map { String(format: " (goal >= %.2fx: %@)", $0, ratio >= $0 ? "met" : "MISSED") } ?? ""
    Swift.print(
      String(
        format: "%-48@ %10.0f/s  vs %-34@ %10.0f/s  ratio %.2fx%@",
        name as NSString, rate, baselineName as NSString, baselineRate, ratio, goalText))
  }
}

/// Prints a section heading.
func section(_ title: String) {
  print("\n== \(title) ==")
}

/// Seconds since `start` (monotonic clock).
func seconds(since start: ContinuousClock.Instant) -> Double {
  let elapsed = ContinuousClock.now - start
  return Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
}

/// Times `subject` and `baseline` alternately, so a busy neighbour slows both alike; returns the
/// best time of each.
func interleaved(
  repeats: Int = 5, _ subject: () async throws -> Double, baseline: () async throws -> Double
) async throws -> (subject: Double, baseline: Double) {
  var best = (subject: Double.infinity, baseline: Double.infinity)
  for _ in 0..<repeats {
    best.baseline = min(best.baseline, try await baseline())
    best.subject = min(best.subject, try await subject())
  }
  return best
}

/// A temporary folder of SQLite files for one section, deleted with the value.
final class BenchmarkFolder {
  let url: URL
  private var next = 0

  /// Creates `conveyor-NAME-UUID` in the temporary folder.
  init(_ name: String) throws {
    url = FileManager.default.temporaryDirectory.appendingPathComponent("conveyor-\(name)-\(UUID())")
    try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
  }

  deinit { try? FileManager.default.removeItem(at: url) }

  /// The path of a new database file in the folder.
  func newPath() -> String {
    next += 1
    return url.appendingPathComponent("\(next).sqlite").path
  }
}

/// PostgreSQL stores of one section, each on a schema of its own (`NAME_PID_N`).
final class BenchmarkSchemas {
  private let name: String
  private var next = 0

  init(_ name: String) { self.name = name }

  /// A store on a new schema of the server at `url`.
  func newStore(_ url: String) async throws -> PostgresJobStore {
    next += 1
    let schema = "\(name)_\(ProcessInfo.processInfo.processIdentifier)_\(next)"
    return try await PostgresJobStore.open(url: url, options: .init(schema: schema))
  }
}
