import Conveyor
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
}
