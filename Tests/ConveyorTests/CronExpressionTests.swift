import ConveyorTestSupport
import Foundation
import Testing

@testable import Conveyor

/// Cron expressions: the grammar, the next fire time on a zone's wall clock (changes of offset
/// included), and hostile input.
@Suite("Cron expressions")
struct CronExpressionTests {
  static let utc = TimeZone(identifier: "UTC")!
  static let berlin = TimeZone(identifier: "Europe/Berlin")!
  static let newYork = TimeZone(identifier: "America/New_York")!

  /// A UTC date from its fields.
  static func date(
    _ year: Int, _ month: Int, _ day: Int, _ hour: Int = 0, _ minute: Int = 0, _ second: Int = 0
  )
    -> Date
  {
    let days = CronExpression.days(year: year, month: month, day: day)
    return Date(
      timeIntervalSince1970: TimeInterval(days * 86_400 + Int64(hour * 3_600 + minute * 60 + second)))
  }

  /// The next `count` fire times after `start`.
  static func fires(_ text: String, after start: Date, in zone: TimeZone = utc, count: Int) throws -> [Date] {
    let expression = try CronExpression(text)
    var result: [Date] = []
    var after = start
    for _ in 0..<count {
      guard let next = expression.nextFire(after: after, in: zone) else { break }
      result.append(next)
      after = next
    }
    return result
  }

  @Test func fieldsListsRangesStepsAndNames() throws {
    let start = Self.date(2026, 12, 7, 10, 7)  // a Monday
    #expect(
      try Self.fires("*/15 * * * *", after: start, count: 3)
        == [Self.date(2026, 12, 7, 10, 15), Self.date(2026, 12, 7, 10, 30), Self.date(2026, 12, 7, 10, 45)])
    #expect(
      try Self.fires("5,35 9-10 * * *", after: start, count: 3)
        == [Self.date(2026, 12, 7, 10, 35), Self.date(2026, 12, 8, 9, 5), Self.date(2026, 12, 8, 9, 35)])
    #expect(
      try Self.fires("0 8 * * mon-FRI", after: Self.date(2026, 12, 11, 9), count: 2)
        == [Self.date(2026, 12, 14, 8), Self.date(2026, 12, 15, 8)], "Friday 09:00, then Monday and Tuesday")
    #expect(
      try Self.fires("0 0 1 jan,Jul *", after: start, count: 2) == [
        Self.date(2027, 1, 1), Self.date(2027, 7, 1),
      ])
    #expect(
      try Self.fires("10/20 * * * *", after: start, count: 2) == [
        Self.date(2026, 12, 7, 10, 10), Self.date(2026, 12, 7, 10, 30),
      ])
    #expect(try Self.fires("0 0 * * 7", after: start, count: 1) == [Self.date(2026, 12, 13)], "7 is Sunday")
    #expect(try Self.fires("0 0 * * 0", after: start, count: 1) == [Self.date(2026, 12, 13)], "so is 0")
    #expect(
      try Self.fires("0-10/5 12 * * *", after: start, count: 3).map {
        Calendar.utc.component(.minute, from: $0)
      } == [0, 5, 10])
  }

  @Test func macros() throws {
    let start = Self.date(2026, 12, 7, 10, 7)
    #expect(try Self.fires("@hourly", after: start, count: 1) == [Self.date(2026, 12, 7, 11)])
    #expect(try Self.fires("@daily", after: start, count: 1) == [Self.date(2026, 12, 8)])
    #expect(try Self.fires("@midnight", after: start, count: 1) == [Self.date(2026, 12, 8)])
    #expect(try Self.fires("@weekly", after: start, count: 1) == [Self.date(2026, 12, 13)])
    #expect(try Self.fires("@monthly", after: start, count: 1) == [Self.date(2027, 1, 1)])
    #expect(try Self.fires("@yearly", after: start, count: 1) == [Self.date(2027, 1, 1)])
    #expect(try Self.fires("@ANNUALLY", after: start, count: 1) == [Self.date(2027, 1, 1)])
  }

  /// Both day fields restricted: either matches (cron's rule); one of them `*`: the other decides.
  @Test func aDayMatchesEitherDayFieldWhenBothAreRestricted() throws {
    let start = Self.date(2026, 12, 1)  // a Tuesday
    #expect(
      try Self.fires("0 0 13 * FRI", after: start, count: 3)
        == [Self.date(2026, 12, 4), Self.date(2026, 12, 11), Self.date(2026, 12, 13)])
    #expect(try Self.fires("0 0 13 * *", after: start, count: 1) == [Self.date(2026, 12, 13)])
    #expect(try Self.fires("0 0 * * FRI", after: start, count: 1) == [Self.date(2026, 12, 4)])
    #expect(
      try Self.fires("0 0 */1 * FRI", after: start, count: 1) == [Self.date(2026, 12, 4)], "*/1 counts as *")
  }

  @Test func leapDaysAndCenturies() throws {
    #expect(try Self.fires("0 0 29 2 *", after: Self.date(2027, 3, 1), count: 1) == [Self.date(2028, 2, 29)])
    #expect(
      try Self.fires("0 0 29 2 *", after: Self.date(2096, 3, 1), count: 1) == [Self.date(2104, 2, 29)],
      "2100 is not a leap year")
    #expect(
      try Self.fires("0 0 31 * *", after: Self.date(2027, 1, 31, 1), count: 2) == [
        Self.date(2027, 3, 31), Self.date(2027, 5, 31),
      ])
  }

  /// Fire times come strictly after the given instant, from the next whole minute, whatever its
  /// seconds; near the end of year 9999 there is none.
  @Test func theNextFireIsStrictlyLaterAndBounded() throws {
    let every = try CronExpression("* * * * *")
    let start = Self.date(2026, 12, 7, 10, 7, 30)
    #expect(every.nextFire(after: start, in: Self.utc) == Self.date(2026, 12, 7, 10, 8))
    #expect(
      every.nextFire(after: Self.date(2026, 12, 7, 10, 8), in: Self.utc) == Self.date(2026, 12, 7, 10, 9))
    #expect(every.nextFire(after: Date(timeIntervalSince1970: .nan), in: Self.utc) == nil)
    #expect(every.nextFire(after: Date(timeIntervalSince1970: 3e11), in: Self.utc) == nil, "year 11,000")
    #expect(every.nextFire(after: Date(timeIntervalSince1970: .infinity), in: Self.utc) == nil)
    #expect(try CronExpression("0 0 1 1 *").nextFire(after: Self.date(9999, 6, 1), in: Self.utc) == nil)
    #expect(every.nextFire(after: Date(timeIntervalSince1970: -1e300), in: Self.utc) != nil)
  }

  // MARK: Changes of offset

  /// Berlin moves from 02:00 CET to 03:00 CEST on 29 March 2026 (01:00 UTC): 02:30 does not
  /// exist, and fires once at 03:00 CEST; every slot of a 15-minute schedule in the gap fires at
  /// that one instant.
  @Test func aSkippedWallTimeFiresOnceAtTheEndOfTheGapInBerlin() throws {
    #expect(
      try Self.fires("30 2 * * *", after: Self.date(2026, 3, 28, 23), in: Self.berlin, count: 2)
        == [Self.date(2026, 3, 29, 1), Self.date(2026, 3, 30, 0, 30)])
    #expect(
      try Self.fires("*/15 * * * *", after: Self.date(2026, 3, 29, 0, 45), in: Self.berlin, count: 2)
        == [Self.date(2026, 3, 29, 1), Self.date(2026, 3, 29, 1, 15)])
  }

  /// Berlin goes from 03:00 CEST back to 02:00 CET on 25 October 2026 (01:00 UTC): 02:30 occurs
  /// twice and fires at its first occurrence; an hourly schedule's repeated 02:00 fires nothing.
  @Test func aRepeatedWallTimeFiresOnceAtItsFirstOccurrenceInBerlin() throws {
    #expect(
      try Self.fires("30 2 * * *", after: Self.date(2026, 10, 24, 23), in: Self.berlin, count: 2)
        == [Self.date(2026, 10, 25, 0, 30), Self.date(2026, 10, 26, 1, 30)])
    #expect(
      try Self.fires("0 * * * *", after: Self.date(2026, 10, 24, 23, 30), in: Self.berlin, count: 3)
        == [Self.date(2026, 10, 25, 0), Self.date(2026, 10, 25, 2), Self.date(2026, 10, 25, 3)])
  }

  /// New York: 02:00 EST to 03:00 EDT on 8 March 2026 (07:00 UTC); 02:00 EDT back to 01:00 EST on
  /// 1 November 2026 (06:00 UTC).
  @Test func changesOfOffsetInNewYork() throws {
    #expect(
      try Self.fires("30 2 * * *", after: Self.date(2026, 3, 8, 5), in: Self.newYork, count: 2)
        == [Self.date(2026, 3, 8, 7), Self.date(2026, 3, 9, 6, 30)])
    #expect(
      try Self.fires("30 1 * * *", after: Self.date(2026, 11, 1, 4), in: Self.newYork, count: 2)
        == [Self.date(2026, 11, 1, 5, 30), Self.date(2026, 11, 2, 6, 30)])
    // Asked from inside the repeated hour (01:40 EST, its second pass): the next day's 01:30.
    #expect(
      try Self.fires("30 1 * * *", after: Self.date(2026, 11, 1, 6, 40), in: Self.newYork, count: 1)
        == [Self.date(2026, 11, 2, 6, 30)])
  }

  // MARK: Bad input

  @Test(arguments: [
    ("", "has 0 field(s)"), ("* * * *", "has 4 field(s)"), ("* * * * * *", "has 6 field(s)"),
    ("*/0 * * * *", "step \"0\""), ("61 * * * *", "minute \"61\""), ("* 24 * * *", "hour \"24\""),
    ("* * 0 * *", "day of the month \"0\""), ("* * * 13 *", "month \"13\""),
    ("* * * * 8", "day of the week \"8\""),
    ("5-1 * * * *", "runs backwards"), ("*/61 * * * *", "from 1 to 60"), ("1,,2 * * * *", "empty item"),
    ("1/2/3 * * * *", "more than one /"), ("\u{0} * * * *", "\"\\u{0}\""), ("@reboot", "unknown \"@reboot\""),
    ("0 0 30 2 *", "never fires"), ("0 0 31 4,6,9,11 *", "never fires"), ("* * * FOO *", "month \"FOO\""),
    ("-5 * * * *", "minute \"\""), ("99999999999999999999 * * * *", "minute \"99999999999999999999\""),
    ("1-2-3 * * * *", "minute \"2-3\""), ("*/-1 * * * *", "step \"-1\""),
  ])
  func aBadExpressionIsRefusedWithWhatToChange(text: String, expected: String) {
    do {
      _ = try CronExpression(text)
      Issue.record("\(text.debugDescription) was taken")
    } catch {
      #expect(error.description.contains(expected), "\(text.debugDescription): \(error)")
    }
  }

  @Test func aLongExpressionIsRefusedAndALongListIsCheap() throws {
    let long = Array(repeating: "0-59/1", count: 200).joined(separator: ",") + " * * * *"
    #expect(throws: ScheduleError.self) { try CronExpression(long) }
    let list = (0..<150).map { String($0 % 60) }.joined(separator: ",") + " * * * *"
    let expression = try CronExpression(list)
    #expect(
      expression.nextFire(after: Self.date(2026, 1, 1, 0, 0, 30), in: Self.utc) == Self.date(2026, 1, 1, 0, 1)
    )
    #expect(
      try CronExpression("0 0 31 1,2 *").nextFire(after: Self.date(2026, 2, 1), in: Self.utc)
        == Self.date(2027, 1, 31))
  }

  /// Random text from cron's alphabet and beyond: every string is taken or refused with a
  /// `ScheduleError`, never a trap; each one taken gives next fire times that match a plain
  /// day-by-day search written apart from the expression's own.
  @Test func randomExpressionsAreTakenOrRefusedAndTakenOnesAgreeWithASearch() throws {
    var random = SeededRandom(seed: 20_261_206)
    let junk = ["", "/", "-", ",", "*/", "x", "\u{0}", "é", "9999", "60", "@", "\t", "32", "-1"]
    let names = [["mon", "FRI", "sun", "Sat"], ["jan", "Feb", "dec", "JUL"]]
    let ranges = [0...59, 0...23, 1...31, 1...12, 0...7]
    var taken = 0
    for _ in 0..<5_000 {
      var fields: [String] = []
      for (index, range) in ranges.enumerated() {
        var items: [String] = []
        for _ in 0..<(1 + random.below(3)) {
          func value() -> String {
            if index >= 3, random.below(4) == 0 { return random.pick(names[index == 4 ? 0 : 1]) }
            return String(range.lowerBound + random.below(range.count))
          }
          var item: String
          switch random.below(5) {
          case 0: item = "*"
          case 1, 2: item = value()
          default:
            let (a, b) = (value(), value())
            item = "\(a)-\(b)"
          }
          if random.below(4) == 0 { item += "/\(1 + random.below(range.count))" }
          if random.below(25) == 0 { item = random.pick(junk) + item }
          items.append(item)
        }
        fields.append(items.joined(separator: ","))
      }
      if random.below(30) == 0 { fields.removeLast() }
      let text = fields.joined(separator: random.below(10) == 0 ? "\t" : " ")
      guard let expression = try? CronExpression(text) else { continue }
      taken += 1
      let start = Self.date(
        2020 + random.below(10), 1 + random.below(12), 1 + random.below(28), random.below(24),
        random.below(60))
      let found = expression.nextFire(after: start, in: Self.utc)
      let expected = Self.search(expression, after: start)
      #expect(
        found == expected,
        "\(text.debugDescription) after \(start): \(String(describing: found)) vs \(String(describing: expected))"
      )
    }
    #expect(taken > 100, "enough random expressions were valid to compare: \(taken)")
  }

  /// The next fire time in UTC by a plain search: day by day for up to 30 years, then hour by
  /// hour and minute by minute within the first day that matches.
  static func search(_ expression: CronExpression, after start: Date) -> Date? {
    let startMinute = CronExpression.floorDiv(Int64(start.timeIntervalSince1970), 60) + 1
    var day = CronExpression.floorDiv(startMinute * 60, 86_400)
    for _ in 0..<(366 * 30) {
      let (year, month, dayOfMonth) = CronExpression.civil(days: day)
      let weekday = CronExpression.weekday(days: day)
      let byDay = expression.days >> dayOfMonth & 1 == 1
      let byWeekday = expression.weekdays >> weekday & 1 == 1
      let dayMatches: Bool
      switch (expression.everyDay, expression.everyWeekday) {
      case (true, true): dayMatches = true
      case (true, false): dayMatches = byWeekday
      case (false, true): dayMatches = byDay
      case (false, false): dayMatches = byDay || byWeekday
      }
      if expression.months >> month & 1 == 1, dayMatches, year <= 9_999 {
        for hour in 0..<24 where expression.hours >> hour & 1 == 1 {
          for minute in 0..<60 where expression.minutes >> minute & 1 == 1 {
            let at = day * 1_440 + Int64(hour * 60 + minute)
            if at >= startMinute { return Date(timeIntervalSince1970: TimeInterval(at * 60)) }
          }
        }
      }
      day += 1
    }
    return nil
  }
}

extension Calendar {
  fileprivate static let utc: Calendar = {
    var calendar = Calendar(identifier: .gregorian)
    calendar.timeZone = TimeZone(identifier: "UTC")!
    return calendar
  }()
}
