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
  /// The queue's jobs at the end: none ready, scheduled or running; ``dead`` ones stay. The
  /// history is left out: `completed` and `cancelled` are 0 (list them with
  /// `jobs(in: .completed)`), so a run that handled every job ends with `JobCounts()`.
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
    /// Jobs are ready but no handler takes them: the queue's delegate was released, or its
    /// `isReadyForJobs` is false.
    case noHandler
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
    case .noHandler:
      text +=
        "no handler takes jobs: the queue's delegate is released, or its isReadyForJobs is false "
        + "(keep a reference to the delegate, and make it ready)"
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
  /// `counts` without the history (completed and cancelled as 0).
  static func withoutHistory(_ counts: JobCounts) -> JobCounts {
    var counts = counts
    counts.completed = 0
    counts.cancelled = 0
    return counts
  }

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
  ///     a job of this queue runs; a job of another queue on the same clock is not waited for).
  /// - Returns: how often and how far the clock moved, and the counts at the end.
  /// - Throws: ``QueueNotIdleError`` when the queue is not idle at the end, is paused or stopped,
  ///   has no handler taking jobs, or its clock is not a `ManualJobClock`; the store's errors.
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
        return IdleRun(
          clockAdvances: advances, timeAdvanced: clock.uptime() - startUptime,
          counts: Self.withoutHistory(counts))
      }
      // Stores keep run dates, and read the clock, in whole milliseconds rounded to the nearest:
      // the job is due once the clock's reading, so rounded, reaches its run date. Moving by the
      // difference in those milliseconds keeps the clock's own fraction of a millisecond.
      let now = clock.now()
      let wait = JobStoreTime.milliseconds(nextRun) - JobStoreTime.milliseconds(now)
      if wait <= 0 {  // became ready meanwhile
        try await lookAgain()
        continue
      }
      disagreeingSince = nil
      let target = now.addingTimeInterval(TimeInterval(wait) / 1000)
      if let horizon, target > horizon { throw try await notIdle(.horizonReached(horizon), clock: clock) }
      guard advances < maxAdvances else {
        throw try await notIdle(.advanceLimitReached(maxAdvances), clock: clock)
      }
      // A paused queue would run nothing at the new time: refused before the clock moves.
      if try await store.isPaused(queue: configuration.identifier) {
        throw try await notIdle(.paused, clock: clock)
      }
      clock.advance(by: .milliseconds(wait))
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
      if counts.ready > 0 && counts.running == 0 && !isHandlerAvailable {
        throw try await notIdle(.noHandler, clock: clock)
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
      reason: reason, queue: configuration.identifier, counts: Self.withoutHistory(try await count()),
      remaining: remaining,
      now: clock.now())
  }
}

/// How jobs are described in the helpers' errors.
enum JobListing {
  /// The longest payload excerpt shown.
  static let payloadExcerpt = 200

  /// `date` to the millisecond a store keeps (rounded to the nearest, as stores round), in UTC:
  /// `2024-01-01T00:00:15.123Z`. (Formatting the `Date` itself cut `…15.123` to `…15.122`.)
  static func format(_ date: Date) -> String {
    let milliseconds = JobStoreTime.milliseconds(date)
    let (seconds, fraction) = milliseconds.quotientAndRemainder(dividingBy: 1000)
    let (wholeSeconds, thousandths) = fraction < 0 ? (seconds - 1, fraction + 1000) : (seconds, fraction)
    let whole = Date(timeIntervalSince1970: TimeInterval(wholeSeconds))
    let text = whole.formatted(
      .iso8601.year().month().day().time(includingFractionalSeconds: false).timeZone(separator: .omitted))
    let digits = String(thousandths)
    return text.dropLast() + "." + String(repeating: "0", count: 3 - digits.count) + digits + "Z"
  }

  static func describe(_ counts: JobCounts) -> String {
    "\(counts.ready) ready, \(counts.scheduled) scheduled, "
      + (counts.held > 0 ? "\(counts.held) held, " : "") + "\(counts.running) running, \(counts.dead) dead"
  }

  /// A job in one line; `now` (the queue's clock) tells ready from scheduled jobs, nil says
  /// "pending" and the run date.
  static func describe(_ record: JobRecord, now: Date?) -> String {
    var text = "job \(record.id) "
    switch record.status {
    case .pending where record.isHeld:
      text += "held by ordering key \"\(excerpt(record.orderingKey ?? ""))\""
    case .pending:
      guard let now else {
        text += "pending, run at \(format(record.runAt))"
        break
      }
      // Ready as the store tells it: by whole milliseconds.
      let ready = JobStoreTime.milliseconds(record.runAt) <= JobStoreTime.milliseconds(now)
      text += ready ? "ready" : "scheduled for \(format(record.runAt))"
    case .running:
      text += "running"
      if let owner = record.leaseOwner { text += ", lease held by \(owner)" }
      if let expiry = record.leaseExpiresAt { text += " until \(format(expiry))" }
    case .dead: text += "dead"
    case .completed: text += "completed"
    case .cancelled: text += "cancelled"
    }
    text += ", \(record.attempts) attempt(s)"
    if let error = record.lastError { text += ", last error: \(excerpt(error))" }
    text += ", payload: \(excerpt(String(decoding: record.payload, as: UTF8.self)))"
    return text
  }

  /// At most ``payloadExcerpt`` Unicode scalars of `text` (a character can hold any number of
  /// them), on one line: line breaks and other control characters are written as escapes, so a
  /// stored error cannot make a line that reads as another job's.
  static func excerpt(_ text: String) -> String {
    var result = ""
    var scalars = 0
    for scalar in text.unicodeScalars {
      guard scalars < payloadExcerpt else { return result + "…" }
      scalars += 1
      switch scalar {
      case "\n": result += "\\n"
      case "\r": result += "\\r"
      case "\t": result += "\\t"
      case _
      where scalar.properties.generalCategory == .control || scalar == "\u{2028}" || scalar == "\u{2029}"
        || scalar == "\u{85}":
        result += "\\u{" + String(scalar.value, radix: 16) + "}"
      default: result.unicodeScalars.append(scalar)
      }
    }
    return result
  }
}
