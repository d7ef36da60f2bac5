import Conveyor
import Foundation

/// Schedules stored as if made long ago, whose first firing, by a worker process started now,
/// must follow each catch-up policy exactly: for tests with real processes on real stores.
///
/// Every schedule is stored ``downtime`` before now and carries its name as its payload. The
/// minutely ones have a slot on time (within the minute's grace) whenever they are fired; the
/// hourly ones have one only in the first minute after the hour, and ``problems(in:firedBetween:and:created:)``
/// judges them by when the firing may have happened.
public enum CatchUpProbe {
  /// How long before now the schedules are stored: ten minutely and two hourly slots missed.
  public static let downtime: TimeInterval = 2 * 3_600 + 600.5

  /// The schedules, by name: `m-skip`, `m-all3`, `m-all200` (every minute since they were
  /// stored), `h-skip`, `h-latest`.
  public static func definitions() throws -> [ScheduleDefinition] {
    let minutely: [(String, ScheduleTiming.CatchUp)] = [
      ("m-skip", .skip), ("m-all3", .all(atMost: 3)), ("m-all200", .all(atMost: 200)),
    ]
    let hourly: [(String, ScheduleTiming.CatchUp)] = [("h-skip", .skip), ("h-latest", .latest)]
    return try minutely.map { name, policy in
      try ScheduleDefinition(
        name: name, timing: try ScheduleTiming(every: .seconds(60), catchUp: policy), payload: Data(name.utf8)
      )
    }
      + hourly.map { name, policy in
        try ScheduleDefinition(
          name: name, timing: try ScheduleTiming(every: .seconds(3_600), catchUp: policy),
          payload: Data(name.utf8))
      }
  }

  /// A clock reading `downtime` before now, to store the schedules with.
  public static func storedClock() -> any JobClock { FixedJobClock(Date().addingTimeInterval(-downtime)) }

  /// The names whose jobs the first firing must have added, each with its run dates, when it
  /// happened between `start` and `end` and the schedules were stored at `created`; nil when the
  /// hourly ones cannot be judged (the window straddles the end of an hour's first minute).
  static func expected(firedBetween start: Date, and end: Date, created: Date) -> [String: [Int64]]? {
    func slots(every step: Int64, at date: Date) -> Int64 {
      Int64(date.timeIntervalSince1970.rounded(.down)) / step * step
    }
    let created = created.timeIntervalSince1970
    let minute = slots(every: 60, at: start)
    guard minute == slots(every: 60, at: end) else { return nil }
    let hour = slots(every: 3_600, at: start)
    let onTimeAtStart = start.timeIntervalSince1970 - Double(hour) <= 60
    let onTimeAtEnd = end.timeIntervalSince1970 - Double(hour) <= 60
    guard hour == slots(every: 3_600, at: end), onTimeAtStart == onTimeAtEnd else { return nil }
    let allMinutes = stride(from: minute, to: Int64(created), by: -60).reversed().map { $0 }
    return [
      "m-skip": [minute], "m-all3": [minute - 120, minute - 60, minute], "m-all200": allMinutes,
      "h-skip": onTimeAtStart ? [hour] : [], "h-latest": [hour],
    ]
  }

  /// What is wrong with `jobs` (every job of the queue) after a first firing between `start` and
  /// `end`; empty when each policy fired exactly its slots. Throws when the window cannot be
  /// judged (see ``expected(firedBetween:and:)``), so the caller tries again.
  public static func problems(in jobs: [JobRecord], firedBetween start: Date, and end: Date, created: Date)
    throws -> [String]
  {
    guard let expected = expected(firedBetween: start, and: end, created: created) else {
      throw CatchUpProbeUndecided()
    }
    var problems: [String] = []
    for (name, slots) in expected.sorted(by: { $0.key < $1.key }) {
      let fired = jobs.filter { String(decoding: $0.payload, as: UTF8.self) == name }
        .map { Int64($0.runAt.timeIntervalSince1970.rounded(.down)) }.sorted()
      if fired != slots { problems.append("\(name) fired \(fired), expected \(slots)") }
    }
    return problems
  }
}

extension CatchUpProbe {
  /// Runs `attempt` (store the schedules with ``storedClock()`` in a fresh store, pause its
  /// queue `queue` so the jobs stay, start a worker process, and return when it stops) until its
  /// firing can be judged, at most three times; what is wrong, or empty.
  public static func check(
    _ store: @escaping () async throws -> (any JobStore, stop: () async -> Void),
    startWorker: (any JobStore) async throws -> (() async -> Void), queue: String = "jobs"
  ) async throws -> [String] {
    for _ in 0..<3 {
      let (jobStore, close) = try await store()
      _ = try await jobStore.saveSchedules(
        try definitions(), queue: queue, origin: .added, clock: storedClock())
      // Counted from when they were stored, not from now: on a loaded machine a minute may turn
      // between the two.
      guard let created = try await jobStore.schedules(queue: queue).first?.createdAt else {
        return ["the schedules were not stored"]
      }
      try await jobStore.setPaused(true, queue: queue)  // the jobs stay where the check reads them
      let start = Date()
      let stopWorker = try await startWorker(jobStore)
      try await eventually("the first firing") {
        try await !jobStore.jobs(queue: queue, status: nil, after: nil, limit: 1).isEmpty
      }
      let end = Date()
      await stopWorker()
      let jobs = try await jobStore.jobs(queue: queue, status: nil, after: nil, limit: 1_000)
      await close()
      do {
        return try problems(in: jobs, firedBetween: start, and: end, created: created)
      } catch is CatchUpProbeUndecided {
        continue
      }
    }
    return ["three firings straddled a minute"]
  }
}

/// The firing window straddled a boundary the expectations depend on: run the probe again.
public struct CatchUpProbeUndecided: Error {}
