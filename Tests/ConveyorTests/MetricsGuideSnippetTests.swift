import Conveyor
import Foundation
import Synchronization
import Testing

// The swift-metrics bridge of the "Metrics" guide (Sources/Conveyor/Conveyor.docc/
// ReportingMetrics.md), verbatim between the markers apart from its `import Metrics`: swift-metrics
// cannot be fetched here, so `Counter`, `Gauge` and `Metrics.Timer` below are stand-ins with
// swift-metrics' initialisers and the methods the bridge calls. They record what they are given,
// so the test also checks what the queue reports through the bridge.

private enum SwiftMetricsStandIns {
  /// Every value recorded, by label and dimensions.
  static let recorded = Mutex<[String: [Double]]>([:])

  static func record(_ label: String, _ dimensions: [(String, String)], _ value: Double) {
    let key = ([label] + dimensions.map { "\($0.0)=\($0.1)" }).joined(separator: " ")
    recorded.withLock { $0[key, default: []].append(value) }
  }

  static func values(_ key: String) -> [Double] { recorded.withLock { $0[key] ?? [] } }

  final class Counter: Sendable {
    let label: String
    let dimensions: [(String, String)]
    init(label: String, dimensions: [(String, String)] = []) {
      self.label = label
      self.dimensions = dimensions
    }
    func increment(by amount: Int64) { SwiftMetricsStandIns.record(label, dimensions, Double(amount)) }
  }

  final class Gauge: Sendable {
    let label: String
    let dimensions: [(String, String)]
    init(label: String, dimensions: [(String, String)] = []) {
      self.label = label
      self.dimensions = dimensions
    }
    func record(_ value: Double) { SwiftMetricsStandIns.record(label, dimensions, value) }
  }

  enum Metrics {
    final class Timer: Sendable {
      let label: String
      let dimensions: [(String, String)]
      init(label: String, dimensions: [(String, String)] = []) {
        self.label = label
        self.dimensions = dimensions
      }
      func recordNanoseconds(_ duration: Int64) {
        SwiftMetricsStandIns.record(label, dimensions, Double(duration))
      }
    }
  }

  // ReportingMetrics.md example 1 begins (after its imports)
  /// Conveyor's metrics hook, bridged to swift-metrics.
  struct SwiftMetricsFactory: JobMetricsFactory {
    func makeCounter(label: String, dimensions: [(String, String)]) -> any JobMetricsCounter {
      CounterBridge(counter: Counter(label: label, dimensions: dimensions))
    }
    func makeGauge(label: String, dimensions: [(String, String)]) -> any JobMetricsGauge {
      GaugeBridge(gauge: Gauge(label: label, dimensions: dimensions))
    }
    func makeTimer(label: String, dimensions: [(String, String)]) -> any JobMetricsTimer {
      TimerBridge(timer: Metrics.Timer(label: label, dimensions: dimensions))
    }
  }

  struct CounterBridge: JobMetricsCounter {
    let counter: Counter
    func increment(by amount: Int64) { counter.increment(by: amount) }
  }

  struct GaugeBridge: JobMetricsGauge {
    let gauge: Gauge
    func record(_ value: Double) { gauge.record(value) }
  }

  struct TimerBridge: JobMetricsTimer {
    let timer: Metrics.Timer
    func recordNanoseconds(_ duration: Int64) { timer.recordNanoseconds(duration) }
  }
  // ReportingMetrics.md example 1 ends

  struct Ping: Queueable { var number: Int }

  static func reportedQueue() async throws {
    let queue = try JobQueue<Ping>(
      configuration: .init(identifier: "metrics-guide"), store: InMemoryJobStore()
    ) { _, _ in .handled }
    // ReportingMetrics.md example 2 begins
    Task { await queue.reportMetrics(to: SwiftMetricsFactory()) }
    // ReportingMetrics.md example 2 ends
    // The reporter subscribes from its own task: wait until it reports the depth, then add.
    while values("conveyor_queue_depth queue=metrics-guide state=ready").isEmpty {
      try await Task.sleep(for: .milliseconds(2))
    }
    for number in 1...3 { try await queue.add(Ping(number: number)) }
    await queue.waitUntilFinished()
    while values("conveyor_jobs_succeeded queue=metrics-guide").count < 3 {
      try await Task.sleep(for: .milliseconds(2))
    }
    await queue.shutdown()
  }
}

@Suite("Guide snippets: metrics", .timeLimit(.minutes(10)))
struct MetricsGuideSnippetTests {
  @Test func theSwiftMetricsBridgeReportsAQueue() async throws {
    try await SwiftMetricsStandIns.reportedQueue()
    #expect(SwiftMetricsStandIns.values("conveyor_jobs_enqueued queue=metrics-guide") == [1, 1, 1])
    #expect(SwiftMetricsStandIns.values("conveyor_jobs_succeeded queue=metrics-guide") == [1, 1, 1])
    #expect(SwiftMetricsStandIns.values("conveyor_job_run_duration queue=metrics-guide").count == 3)
  }
}
