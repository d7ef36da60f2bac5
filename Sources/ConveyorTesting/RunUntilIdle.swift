import Conveyor
import Foundation

/// What `JobQueue.runUntilIdle(maxAdvances:until:timeout:)` did before the queue was
/// idle.
public struct IdleRun: Sendable, Hashable {
  /// How many times the clock was moved forward to the next run date (a retry's backoff, a delayed
  /// job).
  public var clockAdvances: Int
  /// How far the clock moved in all.
  public var timeAdvanced: Duration
  /// The queue's jobs at the end: none ready, scheduled or running; ``dead`` ones stay.
  public var counts: JobCounts

  /// Creates a summary.
  public init(clockAdvances: Int, timeAdvanced: Duration, counts: JobCounts) {
    self.clockAdvances = clockAdvances
    self.timeAdvanced = timeAdvanced
    self.counts = counts
  }

  /// The dead jobs left in the queue (attempts exhausted, discarded, or undecodable).
  public var dead: Int { counts.dead }
}

/// Why `JobQueue.runUntilIdle(maxAdvances:until:timeout:)` stopped before the queue was
/// idle, and which jobs were left.
///
/// Its ``description`` says what was expected and what was found, so a test framework that prints
/// a thrown error (Swift Testing, XCTest) shows the whole story.
public struct QueueNotIdleError: Error, CustomStringConvertible, Sendable {
  /// Why the run stopped.
  public enum Reason: Sendable, Hashable {
    /// The clock was moved `maxAdvances` times and jobs were still scheduled.
    case advanceLimitReached(Int)
    /// The next run date lies after the horizon the caller gave; the clock was not moved past it.
    case horizonReached(Date)
    /// Ready or running jobs did not finish within the real-time timeout: a handler still runs
    /// (or never returns), a job is held by another worker's lease, or a handler retries without
    /// delay again and again.
    case timedOut(Duration)
    /// The queue is paused (its stored flag, set by any worker), so ready jobs are not claimed.
    case paused
    /// The queue is not started (`JobQueueConfiguration.autoStart` false and no
    /// `start()`, or shut down).
    case stopped
    /// The queue's clock is not a `ManualJobClock`.
    case clockNotManual
  }

  /// Why the run stopped.
  public var reason: Reason
  /// The queue's jobs by status when it stopped.
  public var counts: JobCounts
  /// The jobs left (at most ``listedJobLimit``), running ones first, then waiting, then dead.
  public var remaining: [JobRecord]
  /// The clock's date when the run stopped.
  public var now: Date
  /// The queue's identifier.
  public var queue: String

  /// How many remaining jobs an error lists at most.
  public static let listedJobLimit = 10

  /// Creates the error.
  public init(reason: Reason, queue: String, counts: JobCounts, remaining: [JobRecord], now: Date) {
    self.reason = reason
    self.queue = queue
    self.counts = counts
    self.remaining = remaining
    self.now = now
  }

  /// What was expected, what stopped the run, and the jobs left.
  public var description: String {
    var text = "expected queue \"\(queue)\" to become idle, but "
    switch reason {
    case .advanceLimitReached(let limit):
      text += "jobs were still scheduled after \(limit) clock advance(s) (maxAdvances)"
    case .horizonReached(let horizon):
      text += "the next run date lies after the horizon \(JobListing.format(horizon))"
    case .timedOut(let timeout):
      text +=
        "ready or running jobs did not finish within \(timeout) of real time (a handler still running, "
        + "a job held by another worker, or a job retried without delay again and again)"
    case .paused:
      text += "the queue is paused: call resume() first"
    case .stopped:
      text += "the queue is not started: call start() first"
    case .clockNotManual:
      text += "its clock is not a ManualJobClock: set configuration.clock = ManualJobClock()"
    }
    text += ". Clock: \(JobListing.format(now)). Found \(JobListing.describe(counts))"
    if !remaining.isEmpty {
      text += ":\n" + remaining.map { "  " + JobListing.describe($0, now: now) }.joined(separator: "\n")
      if counts.total > remaining.count { text += "\n  … and \(counts.total - remaining.count) more" }
    }
    return text
  }
}

extension JobQueue {
  /// Runs the queue on its `ManualJobClock` until no job is ready, scheduled or running: handles
  /// every ready job, then moves the clock to the next run date (a retry's backoff, a delayed or
  /// scheduled job) and goes on.
  ///
  /// ```swift
  /// let clock = ManualJobClock()
  /// let queue = try JobQueue<SendEmail>(
  ///   configuration: .init(identifier: "emails", clock: clock), store: InMemoryJobStore(), handler: send)
  /// try await queue.add(SendEmail(to: "ada@example.com"))
  /// let run = try await queue.runUntilIdle()  // two retries: the clock moved 30 s
  /// ```
  ///
  /// The queue's own engine does the work: this only waits (in real time, a few milliseconds at
  /// a time) until the store holds no ready or running job of the queue, asks the store for the
  /// next run date, and advances the clock to it. Jobs that another `JobQueue` instance or
  /// process adds to the same store count too. Dead jobs stay, and do not stop the run.
  ///
  /// The store must date jobs by the queue's clock: the in-memory store and `SQLiteJobStore` do;
  /// a `PostgresJobStore` does with its `clock` option set to `.caller` (by default the database
  /// server's clock dates them, and a manual clock cannot move it).
  ///
  /// - Parameters:
  ///   - maxAdvances: the most times the clock is moved (a negative number counts as zero); more
  ///     scheduled work throws ``QueueNotIdleError/Reason/advanceLimitReached(_:)`` (a handler
  ///     that always retries).
  ///   - horizon: the clock is never moved past this date; a later run date throws
  ///     ``QueueNotIdleError/Reason/horizonReached(_:)`` and leaves the clock where it was.
  ///   - timeout: the longest real time to wait for the ready and running jobs to finish between
  ///     two advances; past it, throws ``QueueNotIdleError/Reason/timedOut(_:)`` listing them (a
  ///     job held by another worker's lease is not taken from it: the clock is never moved while
  ///     a job runs).
  /// - Returns: how often and how far the clock moved, and the counts at the end.
  /// - Throws: ``QueueNotIdleError`` when the queue is not idle at the end, is paused or stopped,
  ///   or its clock is not a `ManualJobClock`; the store's errors.
  @discardableResult
  public func runUntilIdle(
    maxAdvances: Int = 1_000, until horizon: Date? = nil, timeout: Duration = .seconds(60)
  ) async throws -> IdleRun {
    guard let clock = configuration.clock as? ManualJobClock else {
      throw try await notIdle(.clockNotManual, clock: configuration.clock)
    }
    let maxAdvances = max(0, maxAdvances)
    let startUptime = clock.uptime()
    var advances = 0
    // Since when the store's answers have disagreed (nothing ready or running, yet a job due or
    // running): looked at again every few milliseconds, never spun on, and bounded by `timeout`.
    var disagreeingSince: ContinuousClock.Instant?
    func lookAgain() async throws {
      let since = disagreeingSince ?? .now
      disagreeingSince = since
      if ContinuousClock.now - since >= timeout { throw try await notIdle(.timedOut(timeout), clock: clock) }
      try await Task.sleep(for: .milliseconds(2))
    }
    while true {
      try await drainReadyJobs(clock: clock, timeout: timeout)
      let hint = try await store.nextWake(queue: configuration.identifier, clock: clock)
      guard let nextRun = hint.nextRun else {
        // Nothing waiting; `drainReadyJobs` saw nothing running either.
        if hint.nextLeaseExpiry != nil {  // a job was claimed meanwhile (another worker)
          try await lookAgain()
          continue
        }
        let counts = try await count()
        return IdleRun(clockAdvances: advances, timeAdvanced: clock.uptime() - startUptime, counts: counts)
      }
      let now = clock.now()
      if nextRun <= now {  // became ready meanwhile
        try await lookAgain()
        continue
      }
      disagreeingSince = nil
      if let horizon, nextRun > horizon { throw try await notIdle(.horizonReached(horizon), clock: clock) }
      guard advances < maxAdvances else {
        throw try await notIdle(.advanceLimitReached(maxAdvances), clock: clock)
      }
      // Whole milliseconds, rounded up: stores keep run dates in milliseconds.
      let milliseconds = max(1, (nextRun.timeIntervalSince(now) * 1000).rounded(.up))
      clock.advance(by: .milliseconds(Int64(min(milliseconds, 1e15))))
      advances += 1
    }
  }

  /// Waits until the store holds no ready and no running job of this queue.
  private func drainReadyJobs(clock: ManualJobClock, timeout: Duration) async throws {
    let deadline = ContinuousClock.now + timeout
    // A finish waiter makes the queue's loop look at the store at once, also for jobs added
    // elsewhere that its poll (measured on the manual clock) would not see until the clock moves.
    let nudge = Task { await self.waitUntilFinished() }
    defer { nudge.cancel() }
    while true {
      if state == .stopped { throw try await notIdle(.stopped, clock: clock) }
      let counts = try await count()
      if counts.ready == 0 && counts.running == 0 { return }
      if counts.ready > 0, try await store.isPaused(queue: configuration.identifier) {
        throw try await notIdle(.paused, clock: clock)
      }
      if ContinuousClock.now >= deadline { throw try await notIdle(.timedOut(timeout), clock: clock) }
      try await Task.sleep(for: .milliseconds(2))
    }
  }

  private func notIdle(_ reason: QueueNotIdleError.Reason, clock: any JobClock) async throws
    -> QueueNotIdleError
  {
    let limit = QueueNotIdleError.listedJobLimit
    var remaining: [JobRecord] = []
    for status in [JobStatus.running, .pending, .dead] where remaining.count < limit {
      remaining += try await jobs(in: status, limit: limit - remaining.count)
    }
    return QueueNotIdleError(
      reason: reason, queue: configuration.identifier, counts: try await count(), remaining: remaining,
      now: clock.now())
  }
}

/// How jobs are described in the helpers' errors.
enum JobListing {
  /// The longest payload excerpt shown.
  static let payloadExcerpt = 200

  static func format(_ date: Date) -> String {
    date.formatted(
      .iso8601.year().month().day().time(includingFractionalSeconds: true).timeZone(separator: .omitted))
  }

  static func describe(_ counts: JobCounts) -> String {
    "\(counts.ready) ready, \(counts.scheduled) scheduled, \(counts.running) running, \(counts.dead) dead"
  }

  /// A job in one line; `now` (the queue's clock) tells ready from scheduled jobs, nil says
  /// "pending" and the run date.
  static func describe(_ record: JobRecord, now: Date?) -> String {
    var text = "job \(record.id) "
    switch record.status {
    case .pending:
      guard let now else {
        text += "pending, run at \(format(record.runAt))"
        break
      }
      text += record.runAt <= now ? "ready" : "scheduled for \(format(record.runAt))"
    case .running:
      text += "running"
      if let owner = record.leaseOwner { text += ", lease held by \(owner)" }
      if let expiry = record.leaseExpiresAt { text += " until \(format(expiry))" }
    case .dead: text += "dead"
    }
    text += ", \(record.attempts) attempt(s)"
    if let error = record.lastError { text += ", last error: \(excerpt(error))" }
    text += ", payload: \(excerpt(String(decoding: record.payload, as: UTF8.self)))"
    return text
  }

  static func excerpt(_ text: String) -> String {
    text.count <= payloadExcerpt ? text : text.prefix(payloadExcerpt) + "…"
  }
}
