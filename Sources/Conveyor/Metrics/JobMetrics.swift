import Foundation
import Synchronization

/// Makes the instruments a queue reports to: shaped like swift-metrics (`Counter`, `Gauge`,
/// `Timer`, each made from a label and dimensions), so a one-file adapter bridges it.
///
/// Conveyor depends on nothing outside the toolchain, so it cannot use swift-metrics itself. A
/// swift-metrics user bridges it like this (the <doc:ReportingMetrics> guide has the whole file):
///
/// ```swift
/// struct SwiftMetricsFactory: JobMetricsFactory {
///   func makeCounter(label: String, dimensions: [(String, String)]) -> any JobMetricsCounter {
///     Counter(label: label, dimensions: dimensions)
///   }
///   // makeGauge → Gauge, makeTimer → Metrics.Timer
/// }
/// ```
public protocol JobMetricsFactory: Sendable {
  /// A counter that only goes up.
  func makeCounter(label: String, dimensions: [(String, String)]) -> any JobMetricsCounter
  /// A gauge: the last value recorded.
  func makeGauge(label: String, dimensions: [(String, String)]) -> any JobMetricsGauge
  /// A timer: durations in nanoseconds.
  func makeTimer(label: String, dimensions: [(String, String)]) -> any JobMetricsTimer
}

/// A counter (swift-metrics' `Counter`).
public protocol JobMetricsCounter: Sendable {
  /// Adds `amount`.
  func increment(by amount: Int64)
}

/// A gauge (swift-metrics' `Gauge`).
public protocol JobMetricsGauge: Sendable {
  /// Records the current value.
  func record(_ value: Double)
}

/// A timer (swift-metrics' `Timer`).
public protocol JobMetricsTimer: Sendable {
  /// Records one duration.
  func recordNanoseconds(_ duration: Int64)
}

/// Reports nothing: the default.
public struct NoOpJobMetrics: JobMetricsFactory, JobMetricsCounter, JobMetricsGauge, JobMetricsTimer {
  /// Creates the no-op factory.
  public init() {}
  /// Itself.
  public func makeCounter(label: String, dimensions: [(String, String)]) -> any JobMetricsCounter { self }
  /// Itself.
  public func makeGauge(label: String, dimensions: [(String, String)]) -> any JobMetricsGauge { self }
  /// Itself.
  public func makeTimer(label: String, dimensions: [(String, String)]) -> any JobMetricsTimer { self }
  /// Nothing.
  public func increment(by amount: Int64) {}
  /// Nothing.
  public func record(_ value: Double) {}
  /// Nothing.
  public func recordNanoseconds(_ duration: Int64) {}
}

extension JobQueue {
  /// Reports this queue's events and depth to `factory` until the queue shuts down (its state
  /// becomes ``JobQueueState/stopped``) or the calling task is cancelled.
  ///
  /// Instruments, each with the dimension `queue`:
  /// - counters `conveyor_jobs_enqueued`, `_started`, `_succeeded`, `_retried`, `_died`, and
  ///   `_stuck` (handlers still running ``JobQueueConfiguration/timeLimitGrace`` past their time
  ///   limit, ``JobQueueEvent/stuck(_:after:)``);
  /// - gauges `conveyor_queue_depth` (dimension `state`: ready, scheduled, held, running, dead), sampled
  ///   from ``count()`` every `depthInterval` (each sample counts the store's indexes: keep the
  ///   interval in seconds, not milliseconds, at millions of jobs);
  /// - timers `conveyor_job_run_duration` (from a handler's start to its outcome) and
  ///   `conveyor_job_enqueue_to_start` (from `add` to the first start, for jobs added through this
  ///   queue instance; a job added by another process has no enqueue event here);
  /// - the gauge `conveyor_queue_oldest_ready_age_seconds`, sampled with the depth: how long the
  ///   oldest ready job has waited since its run date (``JobStore/oldestReadyRunDate(queue:clock:)``:
  ///   one index seek per priority level in the SQLite and PostgreSQL stores), 0 when none is ready
  ///   or the store cannot tell (the in-memory store).
  ///
  /// Times are taken when this reporter sees the events, which the queue delivers as they happen;
  /// a busy reporter adds its own delay.
  ///
  /// ```swift
  /// Task { await queue.reportMetrics(to: SwiftMetricsFactory()) }
  /// ```
  /// - Parameters:
  ///   - factory: Where the figures go.
  ///   - depthInterval: How often to sample the depth gauges; nil for never.
  public func reportMetrics(to factory: any JobMetricsFactory, depthInterval: Duration? = .seconds(10)) async
  {
    let queueDimension = [("queue", configuration.identifier)]
    func counter(_ name: String) -> any JobMetricsCounter {
      factory.makeCounter(label: "conveyor_jobs_\(name)", dimensions: queueDimension)
    }
    let enqueued = counter("enqueued")
    let started = counter("started")
    let succeeded = counter("succeeded")
    let retried = counter("retried")
    let died = counter("died")
    let stuck = counter("stuck")
    let runDuration = factory.makeTimer(label: "conveyor_job_run_duration", dimensions: queueDimension)
    let latency = factory.makeTimer(label: "conveyor_job_enqueue_to_start", dimensions: queueDimension)
    let events = self.events
    let sampler = depthInterval.map { interval in
      Task { [weak self] in
        let gauges = ["ready", "scheduled", "held", "running", "dead"].map { state in
          factory.makeGauge(label: "conveyor_queue_depth", dimensions: queueDimension + [("state", state)])
        }
        let oldestReady = factory.makeGauge(
          label: "conveyor_queue_oldest_ready_age_seconds", dimensions: queueDimension)
        while !Task.isCancelled {
          guard let self else { return }
          // A failed sample is skipped: the queue logs storage errors itself.
          if let counts = try? await self.count() {
            let values = [counts.ready, counts.scheduled, counts.held, counts.running, counts.dead]
            for (gauge, value) in zip(gauges, values) {
              gauge.record(Double(value))
            }
          }
          if let oldest = try? await self.store.oldestReadyRunDate(queue: self.identifier, clock: self.clock)
          {
            oldestReady.record(max(0, self.clock.now().timeIntervalSince(oldest)))
          } else {
            oldestReady.record(0)
          }
          try? await Task.sleep(for: interval)
        }
      }
    }
    defer { sampler?.cancel() }
    var enqueuedAt: [JobID: ContinuousClock.Instant] = [:]
    var startedAt: [JobID: ContinuousClock.Instant] = [:]
    func finished(_ id: JobID) {
      if let start = startedAt.removeValue(forKey: id) {
        runDuration.recordNanoseconds(nanoseconds(since: start))
      }
    }
    for await event in events {
      switch event {
      case .enqueued(let id):
        enqueued.increment(by: 1)
        enqueuedAt[id] = .now
      case .started(let id, _):
        started.increment(by: 1)
        startedAt[id] = .now
        if let added = enqueuedAt.removeValue(forKey: id) {
          latency.recordNanoseconds(nanoseconds(since: added))
        }
      case .succeeded(let id):
        succeeded.increment(by: 1)
        finished(id)
      case .retryScheduled(let id, _, _):
        retried.increment(by: 1)
        finished(id)
      case .died(let id, _):
        died.increment(by: 1)
        finished(id)
        enqueuedAt[id] = nil
      case .stuck:
        stuck.increment(by: 1)
      case .stateChanged(.stopped):
        return
      case .finished, .stateChanged:
        break
      }
    }
  }
}

private func nanoseconds(since start: ContinuousClock.Instant) -> Int64 {
  let elapsed = start.duration(to: .now).components
  return elapsed.seconds * 1_000_000_000 + elapsed.attoseconds / 1_000_000_000
}
