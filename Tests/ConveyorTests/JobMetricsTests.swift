import Conveyor
import Foundation
import Synchronization
import Testing

/// A factory that keeps every figure, by label and dimensions.
final class RecordingMetrics: JobMetricsFactory {
  /// Figures by "label{dimensions}": counter sums, last gauge values, timer samples.
  let counters = Mutex<[String: Int64]>([:])
  let gauges = Mutex<[String: Double]>([:])
  let timers = Mutex<[String: [Int64]]>([:])

  struct Instrument: JobMetricsCounter, JobMetricsGauge, JobMetricsTimer {
    let key: String
    let owner: RecordingMetrics
    func increment(by amount: Int64) { owner.counters.withLock { $0[key, default: 0] += amount } }
    func record(_ value: Double) { owner.gauges.withLock { $0[key] = value } }
    func recordNanoseconds(_ duration: Int64) {
      owner.timers.withLock { $0[key, default: []].append(duration) }
    }
  }

  static func key(_ label: String, _ dimensions: [(String, String)]) -> String {
    label + "{" + dimensions.map { "\($0.0)=\($0.1)" }.joined(separator: ",") + "}"
  }

  func makeCounter(label: String, dimensions: [(String, String)]) -> any JobMetricsCounter {
    Instrument(key: Self.key(label, dimensions), owner: self)
  }
  func makeGauge(label: String, dimensions: [(String, String)]) -> any JobMetricsGauge {
    Instrument(key: Self.key(label, dimensions), owner: self)
  }
  func makeTimer(label: String, dimensions: [(String, String)]) -> any JobMetricsTimer {
    Instrument(key: Self.key(label, dimensions), owner: self)
  }
}

@Suite(.timeLimit(.minutes(10))) struct JobMetricsTests {
  struct Work: Queueable {
    var fail: Bool
  }

  @Test func eventsBecomeCountersAndTimersAndDepthIsSampled() async throws {
    let queue = try JobQueue<Work>(
      configuration: JobQueueConfiguration(identifier: "metered", maxAttempts: 2, autoStart: false),
      store: InMemoryJobStore()
    ) { item, _ in item.fail ? .retry(after: .zero) : .handled }
    let metrics = RecordingMetrics()
    let reporting = Task { await queue.reportMetrics(to: metrics, depthInterval: .milliseconds(10)) }
    // The depth is sampled before anything runs.
    while metrics.gauges.withLock({ $0["conveyor_queue_depth{queue=metered,state=ready}"] }) == nil {
      try await Task.sleep(for: .milliseconds(5))
    }
    try await queue.add(Work(fail: false))
    try await queue.add(Work(fail: true))
    // Wait until the reporter saw the two enqueues, so both count toward latency.
    while metrics.counters.withLock({ $0["conveyor_jobs_enqueued{queue=metered}"] }) != 2 {
      try await Task.sleep(for: .milliseconds(5))
    }
    queue.start()
    await queue.waitUntilFinished()
    await queue.shutdown()
    await reporting.value  // ends with the queue

    let counters = metrics.counters.withLock { $0 }
    #expect(counters["conveyor_jobs_enqueued{queue=metered}"] == 2)
    #expect(counters["conveyor_jobs_started{queue=metered}"] == 3)
    #expect(counters["conveyor_jobs_succeeded{queue=metered}"] == 1)
    #expect(counters["conveyor_jobs_retried{queue=metered}"] == 1)
    #expect(counters["conveyor_jobs_died{queue=metered}"] == 1)
    let timers = metrics.timers.withLock { $0 }
    #expect(timers["conveyor_job_run_duration{queue=metered}"]?.count == 3)
    #expect(timers["conveyor_job_enqueue_to_start{queue=metered}"]?.count == 2)
    #expect(timers.values.joined().allSatisfy { $0 >= 0 })
  }

  struct Ordered: Queueable {
    var key: String
    var orderingKey: String? { key }
  }

  /// Jobs held behind an earlier job of their ordering key are waiting jobs: the depth gauges
  /// must count them (a `held` state, as the dashboard's `/metrics` has), or the queue's depth
  /// drops by every held job the moment an ordering key is given.
  @Test func theDepthCountsJobsHeldBehindAnEarlierJobOfTheirOrderingKey() async throws {
    let queue = try JobQueue<Ordered>(
      configuration: JobQueueConfiguration(identifier: "ordered-depth", autoStart: false),
      store: InMemoryJobStore()
    ) { _, _ in .handled }
    for _ in 0..<3 { try await queue.add(Ordered(key: "K")) }
    #expect(try await queue.count() == JobCounts(ready: 1, held: 2))
    let metrics = RecordingMetrics()
    let reporting = Task { await queue.reportMetrics(to: metrics, depthInterval: .milliseconds(10)) }
    defer { reporting.cancel() }
    while metrics.gauges.withLock({ $0["conveyor_queue_depth{queue=ordered-depth,state=ready}"] }) == nil {
      try await Task.sleep(for: .milliseconds(5))
    }
    let depth = metrics.gauges.withLock { gauges in
      gauges.filter { $0.key.hasPrefix("conveyor_queue_depth{") }
    }
    #expect(depth["conveyor_queue_depth{queue=ordered-depth,state=held}"] == 2, "\(depth)")
    #expect(depth.values.reduce(0, +) == 3, "every waiting job in some state: \(depth)")
  }

  @Test func theNoOpFactoryAcceptsEverything() {
    let metrics = NoOpJobMetrics()
    metrics.makeCounter(label: "c", dimensions: []).increment(by: 1)
    metrics.makeGauge(label: "g", dimensions: []).record(1)
    metrics.makeTimer(label: "t", dimensions: []).recordNanoseconds(1)
  }
}
