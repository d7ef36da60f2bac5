import Foundation
import Synchronization

/// What one queue did in one minute, as its workers report it to the store: the source of the
/// dashboard's throughput and latency charts.
///
/// Workers count in memory and add their counts to the store every few seconds and when they
/// shut down (``JobStore/recordActivity(_:)``), so no job pays for an extra store call. A worker
/// that crashes loses the counts of its last few seconds: the charts are a picture of the
/// traffic, not an audit. Counts from many workers of the same queue add up in the store.
public struct QueueActivity: Sendable, Hashable, Codable {
  /// The queue.
  public var queue: String
  /// The start of the minute (whole minutes since 1970, by the clock of the worker that counted).
  public var minute: Date
  /// Jobs handled (deleted) in the minute.
  public var succeeded: Int64
  /// Handler runs that ended in a retry (a thrown error or `.retry`).
  public var retried: Int64
  /// Jobs that died (attempts exhausted, discarded, undecodable).
  public var died: Int64
  /// First starts measured: jobs whose handler started for the first time in the minute.
  public var started: Int64
  /// The sum over ``started`` of each wait from enqueue (or a later run date) to start, in
  /// milliseconds.
  public var waitMillisecondsTotal: Int64
  /// The longest of those waits, in milliseconds.
  public var waitMillisecondsMax: Int64
  /// Handlers reported stuck in the minute: past their time limit and its grace, ignoring
  /// cancellation, each holding a worker slot until it returns (``JobQueueEvent/stuck(_:after:)``).
  public var stuck: Int64

  /// Creates a minute's activity.
  public init(
    queue: String, minute: Date, succeeded: Int64 = 0, retried: Int64 = 0, died: Int64 = 0,
    started: Int64 = 0, waitMillisecondsTotal: Int64 = 0, waitMillisecondsMax: Int64 = 0, stuck: Int64 = 0
  ) {
    self.queue = queue
    self.minute = QueueActivity.minute(containing: minute)
    self.succeeded = succeeded
    self.retried = retried
    self.died = died
    self.started = started
    self.waitMillisecondsTotal = waitMillisecondsTotal
    self.waitMillisecondsMax = waitMillisecondsMax
    self.stuck = stuck
  }

  /// Decodes a minute; ``stuck`` is 0 when absent (a minute encoded before it was counted).
  public init(from decoder: any Decoder) throws {
    let container = try decoder.container(keyedBy: CodingKeys.self)
    self.init(
      queue: try container.decode(String.self, forKey: .queue),
      minute: try container.decode(Date.self, forKey: .minute),
      succeeded: try container.decode(Int64.self, forKey: .succeeded),
      retried: try container.decode(Int64.self, forKey: .retried),
      died: try container.decode(Int64.self, forKey: .died),
      started: try container.decode(Int64.self, forKey: .started),
      waitMillisecondsTotal: try container.decode(Int64.self, forKey: .waitMillisecondsTotal),
      waitMillisecondsMax: try container.decode(Int64.self, forKey: .waitMillisecondsMax),
      stuck: try container.decodeIfPresent(Int64.self, forKey: .stuck) ?? 0)
  }

  /// Jobs that finished a run in the minute: succeeded, retried or died.
  public var finished: Int64 { succeeded &+ retried &+ died }

  /// The mean wait from enqueue to start, in milliseconds, or nil when nothing started.
  public var meanWaitMilliseconds: Double? {
    started > 0 ? Double(waitMillisecondsTotal) / Double(started) : nil
  }

  /// Adds another count of the same queue and minute: sums, and the larger maximum.
  public mutating func add(_ other: QueueActivity) {
    succeeded &+= other.succeeded
    retried &+= other.retried
    died &+= other.died
    started &+= other.started
    waitMillisecondsTotal &+= other.waitMillisecondsTotal
    waitMillisecondsMax = max(waitMillisecondsMax, other.waitMillisecondsMax)
    stuck &+= other.stuck
  }

  /// Whether nothing was counted.
  public var isEmpty: Bool { finished == 0 && started == 0 && stuck == 0 }

  /// The start of the minute holding `date`, in whole milliseconds since 1970.
  public static func minute(containing date: Date) -> Date {
    let milliseconds = JobStoreTime.milliseconds(date)
    let minute = milliseconds - ((milliseconds % 60_000) + 60_000) % 60_000
    return JobStoreTime.date(milliseconds: minute)
  }

  /// How long stores keep activity: a day. Older minutes are deleted when newer ones are recorded
  /// (see ``retentionCutoff(recording:now:)``).
  public static let retention: Duration = .seconds(86_400)

  /// The minute before which a store that records `activity` deletes stored minutes: a
  /// ``retention`` before the latest minute recorded, read by the clock the workers keyed their
  /// minutes with, or before `now` (the store's wall clock) when that is earlier. A worker whose
  /// clock is behind (a test clock, another host) does not delete its own minutes as soon as it
  /// records them, and one whose clock is ahead does not delete other workers' minutes early.
  public static func retentionCutoff(recording activity: [QueueActivity], now: Date = Date()) -> Date {
    let latest = activity.map(\.minute).max() ?? now
    let (seconds, attoseconds) = retention.components
    return min(latest, now).addingTimeInterval(-(Double(seconds) + Double(attoseconds) / 1e18))
  }
}

/// The counts a queue has not yet given to its store, by minute. One lock; never a store call.
final class ActivityTally: Sendable {
  private let minutes = Mutex<[Date: QueueActivity]>([:])

  /// The most minutes kept while the store refuses them (a day's worth): older ones are dropped.
  static let capacity = 1_440

  /// Counts a first start that waited `wait` milliseconds.
  func started(queue: String, at now: Date, waitMilliseconds wait: Int64) {
    let wait = max(0, wait)
    update(queue: queue, at: now) {
      $0.started &+= 1
      $0.waitMillisecondsTotal &+= wait
      $0.waitMillisecondsMax = max($0.waitMillisecondsMax, wait)
    }
  }

  /// Counts an outcome the store accepted.
  func finished(queue: String, at now: Date, _ event: JobQueueEvent) {
    switch event {
    case .succeeded: update(queue: queue, at: now) { $0.succeeded &+= 1 }
    case .retryScheduled: update(queue: queue, at: now) { $0.retried &+= 1 }
    case .died: update(queue: queue, at: now) { $0.died &+= 1 }
    default: break
    }
  }

  /// Counts a handler reported stuck.
  func stuck(queue: String, at now: Date) {
    update(queue: queue, at: now) { $0.stuck &+= 1 }
  }

  private func update(queue: String, at now: Date, _ change: (inout QueueActivity) -> Void) {
    let minute = QueueActivity.minute(containing: now)
    minutes.withLock { minutes in
      change(&minutes[minute, default: QueueActivity(queue: queue, minute: minute)])
    }
  }

  /// Takes everything counted so far, oldest minute first.
  func take() -> [QueueActivity] {
    minutes.withLock { minutes in
      defer { minutes = [:] }
      return minutes.values.sorted { $0.minute < $1.minute }
    }
  }

  /// Puts back counts the store refused, to be given again with the next ones.
  func restore(_ activity: [QueueActivity]) {
    minutes.withLock { minutes in
      for item in activity { minutes[item.minute, default: item.emptyCopy].add(item) }
      if minutes.count > Self.capacity {
        for key in minutes.keys.sorted().prefix(minutes.count - Self.capacity) { minutes[key] = nil }
      }
    }
  }
}

extension QueueActivity {
  fileprivate var emptyCopy: QueueActivity { QueueActivity(queue: queue, minute: minute) }
}

extension JobQueue {
  /// Counts a handler's start: a first start records its wait from enqueue (or its later run
  /// date) to now.
  ///
  /// A first start is a job's first attempt with no error recorded yet. A shutdown that cuts a
  /// handler short gives the attempt back but records "interrupted by shutdown", so the job's
  /// next run is not counted again (with a wait that would include the first run). A job claimed
  /// ahead (`claimsAhead`, `prefetch`) and handed back before its handler started records no
  /// error, so its real first run is counted. A job given back because the queue's delegate was
  /// gone records why, so its later first run is not counted: an undercount of a rare case rather
  /// than a double count.
  func countStart(of record: JobRecord) {
    guard store.recordsActivity, record.attempts == 1, record.lastError == nil else { return }
    let now = clock.now()
    let since = max(record.createdAt, record.runAt)
    let wait = Int64((now.timeIntervalSince(since) * 1000).rounded())
    activityTally.started(queue: identifier, at: now, waitMilliseconds: wait)
  }

  /// Counts an outcome the store accepted.
  func countOutcome(_ event: JobQueueEvent) {
    guard store.recordsActivity else { return }
    activityTally.finished(queue: identifier, at: clock.now(), event)
  }

  /// Gives the counts to the store every `activityFlushInterval` (5 s) until cancelled.
  /// Cancelling it ends its wait, not a store call on its way: the task ends when that call has
  /// returned (see ``flushActivity()``).
  func flushActivityPeriodically() -> Task<Void, Never>? {
    guard store.recordsActivity else { return nil }
    let interval = configuration.activityFlushInterval
    let runtime = configuration.runtime
    return Task(executorPreference: runtime.executor) { [weak self] in
      while !Task.isCancelled {
        do { try await runtime.sleep(interval) } catch { return }
        guard let self else { return }
        await self.flushActivity()
      }
    }
  }

  /// Hands the counts over when the queue stops: waits for the periodic flush's call on its way
  /// (its counts are back in the tally if the store refused them), then gives the store
  /// everything left, all within `activityHandoverLimit` (5 s) in real time.
  ///
  /// The hand-over runs in a task of its own, so a loop cancelled at the end of the grace period
  /// does not cancel it. The bound holds whatever the store does: a store that cannot be reached
  /// (a PostgreSQL server that is down) or that does not end its call when cancelled (an SQLite
  /// connection waiting for another process's lock, a third-party store) does not hold the
  /// shutdown. The hand-over is then left to finish on its own: its counts reach the store if the
  /// call succeeds later while the process lives, and are lost otherwise.
  func handOverActivity(after periodic: Task<Void, Never>?) async {
    guard store.recordsActivity else { return }
    periodic?.cancel()
    let runtime = configuration.runtime
    let handover = Task(executorPreference: runtime.executor) {
      await periodic?.value
      await self.flushActivity()
    }
    let limit = configuration.activityHandoverLimit
    let finished = await Self.wait(for: handover, atMost: limit, runtime: runtime)
    if !finished {
      log(.warning, "the store did not take the activity counts within \(limit); leaving them behind")
    }
  }

  /// Waits for `task` to end, or `limit` to pass in real time, whichever comes first, without
  /// cancelling `task`. Returns whether `task` ended. Both waits are tasks of their own (on
  /// `runtime`'s executor, the limit timed by its clock), so the bound holds in a cancelled task
  /// too.
  static func wait(for task: Task<Void, Never>, atMost limit: Duration, runtime: QueueRuntime) async -> Bool {
    let waiter = Mutex<CheckedContinuation<Bool, Never>?>(nil)
    let finish: @Sendable (Bool) -> Void = { ended in
      waiter.withLock { waiting in
        waiting?.resume(returning: ended)
        waiting = nil
      }
    }
    return await withCheckedContinuation { continuation in
      waiter.withLock { $0 = continuation }
      let timer = Task(executorPreference: runtime.executor) {
        // In production `DispatchSleep`: freed at once when cancelled, unlike `Task.sleep`.
        try? await runtime.sleep(limit)
        finish(false)
      }
      Task(executorPreference: runtime.executor) {
        await task.value
        finish(true)  // before the timer's cancellation, which ends its sleep with finish(false)
        timer.cancel()
      }
    }
  }

  /// Gives the counts to the store; on failure they are kept for the next time. The store call is
  /// a task of its own: cancelling the caller does not cut it short (its counts would otherwise be
  /// put back where nothing flushes them).
  func flushActivity() async {
    let pending = activityTally.take()
    guard !pending.isEmpty else { return }
    let store = self.store
    let call = Task(executorPreference: configuration.runtime.executor) {
      try await store.recordActivity(pending)
    }
    do {
      try await call.value
    } catch {
      activityTally.restore(pending)
      log(.warning, "could not record activity counts; keeping them for the next try: \(error)")
    }
  }
}
