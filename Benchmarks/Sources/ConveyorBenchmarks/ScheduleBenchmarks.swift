import Conveyor
import ConveyorSQLite
import Foundation

/// The next fire time of 10,000 schedules, against Foundation's `Calendar.nextDate(after:matching:)`
/// finding the same daily time (the section `schedules`).
func runScheduleBenchmarks() async throws {
  section("Schedules: next fire time of 10,000 schedules (best of 5, interleaved)")
  let count = 10_000
  let berlin = TimeZone(identifier: "Europe/Berlin")!
  var calendar = Calendar(identifier: .gregorian)
  calendar.timeZone = berlin
  // Starts spread over a year, so the answers cross both changes of offset.
  let starts = (0..<count).map { Date(timeIntervalSince1970: 1_767_225_600 + Double($0) * 3_153.6) }
  let daily = try CronExpression("0 8 * * *")
  let matching = DateComponents(hour: 8, minute: 0)
  // Both must give the same answers for the comparison to mean anything.
  for start in starts.prefix(2_000)
  where daily.nextFire(after: start, in: berlin)
    != calendar.nextDate(after: start, matching: matching, matchingPolicy: .nextTime)
  {
    throw BenchmarkFailure("CronExpression and Calendar.nextDate disagree after \(start)")
  }
  var sink = 0.0
  /// Seconds for Foundation to find the next 08:00 after every start: the baseline of each row.
  func foundationDaily() async -> Double {
    await seconds {
      for start in starts {
        sink +=
          calendar.nextDate(after: start, matching: matching, matchingPolicy: .nextTime)?
          .timeIntervalSince1970 ?? 0
      }
    }
  }
  /// Seconds for `expression(i)` to find the next fire time after the `i`th start, for every start.
  func cron(_ expression: (Int) -> CronExpression) async -> Double {
    await seconds {
      for (index, start) in starts.enumerated() {
        sink += expression(index).nextFire(after: start, in: berlin)?.timeIntervalSince1970 ?? 0
      }
    }
  }
  let (alone, foundation) = try await interleaved(repeats: 5) {
    await cron { _ in daily }
  } baseline: {
    await foundationDaily()
  }
  Comparison(
    name: "CronExpression 0 8 * * *, Europe/Berlin", count: count, seconds: alone,
    baselineName: "Calendar.nextDate, the same", baselineSeconds: foundation, goal: nil
  ).print()
  // A mix of what schedules use: every few minutes, weekdays, monthly, a time a change of offset
  // skips, both day fields restricted.
  let mix = try [
    "*/5 * * * *", "0 8 * * MON-FRI", "0 0 1 * *", "30 2 * * *", "0 0 13 * FRI", "15 14 1 1,7 *",
  ]
  .map { try CronExpression($0) }
  let (mixed, foundationAgain) = try await interleaved(repeats: 5) {
    await cron { mix[$0 % mix.count] }
  } baseline: {
    await foundationDaily()
  }
  Comparison(
    name: "CronExpression, a mix of six, Europe/Berlin", count: count, seconds: mixed,
    baselineName: "Calendar.nextDate, 08:00 daily", baselineSeconds: foundationAgain, goal: nil
  ).print()
  if sink == 42 { print("") }  // keeps the results alive
  try await runScheduleStoreBenchmarks()
}

/// What schedules cost a worker on an SQLite file: the idle loop's look at the store
/// (`nextWake`, which also reads the next due schedule) with 100 schedules stored against none,
/// and firing a due slot against adding the same job.
func runScheduleStoreBenchmarks() async throws {
  section("Schedules on SQLite: an idle worker's look at the store, and firing (best of 5, interleaved)")
  let folder = FileManager.default.temporaryDirectory.appendingPathComponent("conveyor-schedules-\(UUID())")
  try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
  defer { try? FileManager.default.removeItem(at: folder) }
  let plain = try SQLiteJobStore(path: folder.appendingPathComponent("plain.sqlite").path)
  let scheduled = try SQLiteJobStore(path: folder.appendingPathComponent("scheduled.sqlite").path)
  let clock = SystemJobClock()
  let daily = try ScheduleTiming(cron: "@daily")
  let hundred = try (0..<100).map {
    try ScheduleDefinition(name: "s\($0)", timing: daily, payload: Data("{}".utf8))
  }
  _ = try await scheduled.saveSchedules(hundred, queue: "q", origin: .declared, clock: clock)
  let looks = 20_000
  func look(_ store: SQLiteJobStore) async throws -> Double {
    try await seconds {
      for _ in 0..<looks { _ = try await store.nextWake(queue: "q", clock: clock) }
    }
  }
  let (withSchedules, without) = try await interleaved(repeats: 5) {
    try await look(scheduled)
  } baseline: {
    try await look(plain)
  }
  Comparison(
    name: "nextWake, 100 schedules stored", count: looks, seconds: withSchedules,
    baselineName: "nextWake, no schedule", baselineSeconds: without, goal: nil
  ).print()
  // Firing: one schedule every second, a clock that moves a second per call, so each call fires
  // one slot (its job and the row in one transaction), against adding one job per call.
  let slots = 2_000
  let tick = try ScheduleDefinition(
    name: "tick", timing: try ScheduleTiming(every: .seconds(1)), payload: Data("{}".utf8))
  var round = 0
  let (firing, adding) = try await interleaved(repeats: 5) {
    round += 1
    let store = try SQLiteJobStore(path: folder.appendingPathComponent("fire-\(round).sqlite").path)
    let manual = ManualJobClock()
    _ = try await store.saveSchedules([tick], queue: "q", origin: .added, clock: manual)
    return try await seconds {
      for _ in 0..<slots {
        manual.advance(by: .seconds(1))
        guard try await store.fireDueSchedules(queue: "q", clock: manual).added.count == 1 else {
          throw BenchmarkFailure("a slot did not add one job")
        }
      }
    }
  } baseline: {
    round += 1
    let store = try SQLiteJobStore(path: folder.appendingPathComponent("add-\(round).sqlite").path)
    return try await seconds {
      for _ in 0..<slots {
        _ = try await store.enqueue([NewJob(payload: Data("{}".utf8))], queue: "q", clock: clock)
      }
    }
  }
  Comparison(
    name: "fireDueSchedules, one slot per call", count: slots, seconds: firing,
    baselineName: "enqueue, one job per call", baselineSeconds: adding, goal: nil
  ).print()
}
