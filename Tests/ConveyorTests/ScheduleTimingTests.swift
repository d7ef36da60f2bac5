import ConveyorTestSupport
import Foundation
import Testing

@testable import Conveyor

/// Schedule timing: slots, which ones fire after a downtime by each catch-up policy, jitter, and
/// bad settings.
@Suite("Schedule timing")
struct ScheduleTimingTests {
  static func date(
    _ year: Int, _ month: Int, _ day: Int, _ hour: Int = 0, _ minute: Int = 0, _ second: Int = 0
  )
    -> Date
  {
    CronExpressionTests.date(year, month, day, hour, minute, second)
  }

  @Test func intervalSlotsAreWholeMultiplesSince1970() throws {
    let timing = try ScheduleTiming(every: .seconds(300))
    #expect(timing.nextSlot(after: Self.date(2026, 12, 7, 10, 7, 30)) == Self.date(2026, 12, 7, 10, 10))
    #expect(timing.nextSlot(after: Self.date(2026, 12, 7, 10, 10)) == Self.date(2026, 12, 7, 10, 15))
    let due = timing.due(
      lastSlot: Self.date(2026, 12, 7, 10, 5), since: .distantPast, now: Self.date(2026, 12, 7, 10, 10, 20))
    #expect(due.fire == [Self.date(2026, 12, 7, 10, 10)] && due.next == Self.date(2026, 12, 7, 10, 15))
    let early = timing.due(
      lastSlot: Self.date(2026, 12, 7, 10, 10), since: .distantPast, now: Self.date(2026, 12, 7, 10, 12))
    #expect(early.fire.isEmpty && early.next == Self.date(2026, 12, 7, 10, 15), "nothing due yet")
    // Never fired: counted from when it was stored.
    let first = timing.due(
      lastSlot: nil, since: Self.date(2026, 12, 7, 9, 59), now: Self.date(2026, 12, 7, 10, 0, 10))
    #expect(first.fire == [Self.date(2026, 12, 7, 10)])
  }

  /// Down from 08:00 to 10:12 with a slot every 5 minutes.
  @Test func eachCatchUpPolicyAfterADowntime() throws {
    let last = Self.date(2026, 12, 7, 8)
    let now = Self.date(2026, 12, 7, 10, 12)
    func fired(_ catchUp: ScheduleTiming.CatchUp, at now: Date = now) throws -> [Date] {
      try ScheduleTiming(every: .seconds(300), catchUp: catchUp).due(
        lastSlot: last, since: .distantPast, now: now
      ).fire
    }
    #expect(try fired(.skip).isEmpty, "10:10 is two minutes old: missed")
    #expect(
      try fired(.skip, at: Self.date(2026, 12, 7, 10, 10, 30)) == [Self.date(2026, 12, 7, 10, 10)], "on time")
    #expect(try fired(.latest) == [Self.date(2026, 12, 7, 10, 10)])
    #expect(
      try fired(.all(atMost: 3))
        == [Self.date(2026, 12, 7, 10), Self.date(2026, 12, 7, 10, 5), Self.date(2026, 12, 7, 10, 10)])
    #expect(try fired(.all(atMost: 1_000)).count == 26, "08:05 to 10:10")
    #expect(try fired(.all(atMost: 1_000)).first == Self.date(2026, 12, 7, 8, 5))
  }

  /// A daily 02:30 in Berlin, down from 27 to 30 March 2026: the slot of the 29th, skipped by the
  /// change to summer time, is 03:00 CEST.
  @Test func catchingUpACronScheduleAcrossAChangeOfOffset() throws {
    let timing = try ScheduleTiming(cron: "30 2 * * *", timeZone: "Europe/Berlin", catchUp: .all(atMost: 10))
    let due = timing.due(
      lastSlot: Self.date(2026, 3, 27, 1, 30), since: .distantPast, now: Self.date(2026, 3, 30, 6))
    #expect(
      due.fire == [Self.date(2026, 3, 28, 1, 30), Self.date(2026, 3, 29, 1), Self.date(2026, 3, 30, 0, 30)])
    #expect(due.next == Self.date(2026, 3, 31, 0, 30))
  }

  /// Years of downtime with a slot every second or every minute: the latest slots, found without
  /// walking the years.
  @Test func aLongDowntimeIsBounded() throws {
    let now = Self.date(2026, 12, 7, 10)
    let second = try ScheduleTiming(every: .seconds(1), catchUp: .all(atMost: 1_000))
    let fired = second.due(lastSlot: Self.date(2016, 1, 1), since: .distantPast, now: now).fire
    #expect(fired.count == 1_000 && fired.last == now && fired.first == now.addingTimeInterval(-999))
    let minute = try ScheduleTiming(cron: "* * * * *", catchUp: .all(atMost: 1_000))
    let minutes = minute.due(lastSlot: Self.date(2021, 1, 1), since: .distantPast, now: now).fire
    #expect(
      minutes.count == 1_000 && minutes.last == now && minutes.first == now.addingTimeInterval(-999 * 60))
    let yearly = try ScheduleTiming(cron: "@yearly", catchUp: .latest)
    #expect(
      yearly.due(lastSlot: Self.date(1, 1, 1), since: .distantPast, now: now).fire == [Self.date(2026, 1, 1)])
    let hourly = try ScheduleTiming(cron: "@hourly", catchUp: .all(atMost: 1_000))
    let hours = hourly.due(lastSlot: Self.date(1990, 1, 1), since: .distantPast, now: now).fire
    #expect(hours.count == 1_000 && hours.last == now)
  }

  @Test func jitterIsTheSameInEveryProcessAndWithinItsBound() throws {
    let timing = try ScheduleTiming(every: .seconds(60), jitter: .seconds(30))
    let slot = Self.date(2026, 12, 7, 10)
    let a = timing.runDate(ofSlot: slot, name: "digest")
    #expect(a == timing.runDate(ofSlot: slot, name: "digest"), "drawn from the name and slot alone")
    #expect(a >= slot && a <= slot.addingTimeInterval(30))
    let spread = Set((0..<50).map { timing.runDate(ofSlot: slot, name: "schedule-\($0)") })
    #expect(spread.count > 40, "names spread over the jitter: \(spread.count)")
    #expect(try ScheduleTiming(every: .seconds(60)).runDate(ofSlot: slot, name: "x") == slot)
  }

  @Test func badSettingsAreRefusedWithWhatToChange() throws {
    func refuses(_ expected: String, _ make: () throws -> ScheduleTiming) {
      do {
        _ = try make()
        Issue.record("taken; expected \(expected)")
      } catch let error as ScheduleError {
        #expect(error.description.contains(expected), "\(error)")
      } catch {
        Issue.record("not a ScheduleError: \(error)")
      }
    }
    refuses("1 second to 366 days") { try ScheduleTiming(every: .zero) }
    refuses("1 second to 366 days") { try ScheduleTiming(every: .milliseconds(1_500)) }
    refuses("1 second to 366 days") { try ScheduleTiming(every: .seconds(367 * 86_400)) }
    refuses("1 to 1000 slots") { try ScheduleTiming(every: .seconds(60), catchUp: .all(atMost: 0)) }
    refuses("1 to 1000 slots") { try ScheduleTiming(every: .seconds(60), catchUp: .all(atMost: 1_001)) }
    refuses("from zero to 1 hour") { try ScheduleTiming(every: .seconds(60), jitter: .seconds(-1)) }
    refuses("from zero to 1 hour") { try ScheduleTiming(every: .seconds(60), jitter: .seconds(3_601)) }
    refuses("is not a time zone") { try ScheduleTiming(cron: "@daily", timeZone: "Mars/Olympus_Mons") }
    // Foundation would take this one as Europe/Berlin once that zone is loaded.
    _ = TimeZone(identifier: "Europe/Berlin")
    refuses("is not a time zone") { try ScheduleTiming(cron: "@daily", timeZone: "Europe/Berlin\u{0}") }
    refuses("is not a time zone") { try ScheduleTiming(cron: "@daily", timeZone: "Europe/Berlin\u{0}junk") }
    refuses("is not a time zone") { try ScheduleTiming(cron: "@daily", timeZone: "") }
    refuses("is not a time zone") {
      try ScheduleTiming(cron: "@daily", timeZone: String(repeating: "A", count: 65))
    }
    #expect(try ScheduleTiming(cron: "@daily", timeZone: "Etc/GMT+5").timeZone.identifier == "Etc/GMT+5")
    refuses("has 1 field(s)") { try ScheduleTiming(cron: "soon") }
  }

  @Test(arguments: ["Etc/UTC", "US/Eastern", "America/Argentina/Buenos_Aires", "Etc/GMT+5", "GMT", "UTC"])
  func zoneNamesAreTaken(_ name: String) throws {
    let timing = try ScheduleTiming(cron: "@daily", timeZone: name)
    #expect(timing.timeZoneName == name)
  }

  @Test func aZoneMadeFromAnOffsetIsRefusedOrReadBackByItsName() throws {
    // `init(spacing:timeZone:)` names the zone by its identifier; the stores read a timing back
    // with `init(cron:timeZone:)` from that name, which must be taken again.
    let plusFive = try #require(TimeZone(secondsFromGMT: 5 * 3_600))
    guard let timing = try? ScheduleTiming(spacing: .cron(try CronExpression("@hourly")), timeZone: plusFive)
    else { return }
    let again = try ScheduleTiming(
      storedSpacing: timing.storedSpacing, timeZone: timing.timeZoneName, catchUp: timing.storedCatchUp,
      jitterMilliseconds: 0)
    #expect(again == timing)
  }
}
