import Foundation

/// A cron expression: the minutes, hours, days of the month, months and days of the week at which
/// a schedule fires, in a time zone.
///
/// ```swift
/// let digest = try CronExpression("0 8 * * MON-FRI")     // 08:00 on weekdays
/// let berlin = TimeZone(identifier: "Europe/Berlin")!
/// let next = digest.nextFire(after: Date(), in: berlin)  // the next 08:00 in Berlin, as a Date
/// ```
///
/// Five fields separated by spaces or tabs: minute (0–59), hour (0–23), day of the month (1–31),
/// month (1–12 or `JAN`–`DEC`) and day of the week (0–7 or `SUN`–`SAT`; 0 and 7 are Sunday).
/// Each field is `*`, or a list of items separated by commas, each a number or name, a range
/// `a-b`, or a step `*/n`, `a-b/n` or `a/n` (from `a` to the field's end). Names are in any case.
/// `@yearly` (`@annually`), `@monthly`, `@weekly`, `@daily` (`@midnight`) and `@hourly` stand for
/// `0 0 1 1 *`, `0 0 1 * *`, `0 0 * * 0`, `0 0 * * *` and `0 * * * *`.
///
/// As in every cron, when both the day of the month and the day of the week are restricted (not
/// `*`), a day matches when either does: `0 0 1 * MON` fires on the 1st and on every Monday.
///
/// **Time zones.** Fields are read on the zone's wall clock. A wall time that a change of offset
/// skips (02:30 on the night a zone moves from 02:00 to 03:00) fires once, at the first instant
/// after the gap (03:00); every slot in the gap fires at that one instant. A wall time that
/// occurs twice (02:30 on the night the clock goes from 03:00 back to 02:00) fires once, at its
/// first occurrence; the repeated hour's second pass fires nothing.
///
/// An expression is checked when it is made: a field out of range, a step of 0 or wider than
/// its field, an empty field, a character cron does not know, more than 1,024 bytes, or an
/// expression that can never fire (`0 0 30 2 *`: February has no 30th) throws
/// ``ScheduleError/invalidExpression(_:)`` saying what to change. Finding the next fire time reads
/// at most a few thousand calendar fields, whatever the expression.
public struct CronExpression: Sendable, Hashable, CustomStringConvertible {
  /// The text the expression was made from.
  public let text: String
  let minutes: UInt64
  let hours: UInt64
  let days: UInt64
  let months: UInt64
  let weekdays: UInt64
  /// The day-of-month field was `*` (or a step over all of it).
  let everyDay: Bool
  /// The day-of-week field was `*` (or a step over all of it).
  let everyWeekday: Bool

  /// The longest expression taken, in UTF-8 bytes.
  public static let maximumLength = 1_024

  /// Parses `text`.
  ///
  /// - Throws: ``ScheduleError/invalidExpression(_:)`` naming the field and what is allowed.
  public init(_ text: String) throws(ScheduleError) {
    self.text = text
    guard text.utf8.count <= Self.maximumLength else {
      throw .invalidExpression(
        "a cron expression of \(text.utf8.count) bytes is longer than \(Self.maximumLength); write it shorter"
      )
    }
    var body = text.trimmingCharacters(in: .whitespaces)
    if body.hasPrefix("@") {
      guard let expanded = Self.macros[body.lowercased()] else {
        throw .invalidExpression(
          "unknown \(Self.quoted(body)); use @yearly, @annually, @monthly, @weekly, @daily, @midnight or "
            + "@hourly, or five fields")
      }
      body = expanded
    }
    let fields = body.split(whereSeparator: { $0 == " " || $0 == "\t" }).map(String.init)
    guard fields.count == 5 else {
      throw .invalidExpression(
        "\(Self.quoted(text)) has \(fields.count) field(s); a cron expression has five: minute hour "
          + "day-of-month month day-of-week, such as \"0 8 * * MON-FRI\"")
    }
    var parsed: [(bits: UInt64, every: Bool)] = []
    for (field, spec) in zip(fields, Field.all) { parsed.append(try spec.parse(field)) }
    minutes = parsed[0].bits
    hours = parsed[1].bits
    days = parsed[2].bits
    months = parsed[3].bits
    // Day 7 is Sunday, as 0 is.
    weekdays = parsed[4].bits & 0x7F | (parsed[4].bits >> 7 & 1)
    everyDay = parsed[2].every
    everyWeekday = parsed[4].every
    if let reason = neverFires { throw .invalidExpression("\(Self.quoted(text)) never fires: \(reason)") }
  }

  /// The text it was made from.
  public var description: String { text }

  /// Why no day of the year ever matches, or nil: a day of the month restricted alone to days no
  /// chosen month has.
  private var neverFires: String? {
    guard !everyDay, everyWeekday else { return nil }
    for month in 1...12 where months >> month & 1 == 1 {
      let longest = month == 2 ? 29 : Self.daysIn(year: 2000, month: month)
      if days & ((1 << (longest + 1)) - 2) != 0 { return nil }
    }
    return "no chosen month has the chosen days of the month"
  }

  /// The first instant after `date` at which the expression fires on `timeZone`'s wall clock (see
  /// the type's discussion for skipped and repeated wall times); nil when none comes before year
  /// 9999. Fire times are whole minutes of the wall clock.
  public func nextFire(after date: Date, in timeZone: TimeZone) -> Date? {
    // Before year 1, the search starts at year 1.
    let seconds = max(date.timeIntervalSince1970, Self.earliestSecond)
    guard seconds.isFinite, seconds < Self.latestSecond else { return nil }
    let after = Int64(seconds.rounded(.down))
    // The wall clock's minute after `date`: every candidate is after it.
    let offset = Int64(timeZone.secondsFromGMT(for: Date(timeIntervalSince1970: TimeInterval(after))))
    var wall = Self.floorMinute(after + offset) + 60
    // Candidates whose instant is not after `date` come only from a repeated hour (their first
    // occurrence is before `date`): at most one such hour of minutes, so this loop is bounded.
    for _ in 0..<(2 * 60 * 24) {
      guard let candidate = nextWall(atOrAfter: wall) else { return nil }
      let instant = Self.instant(ofWall: candidate, in: timeZone)
      if instant > after { return Date(timeIntervalSince1970: TimeInterval(instant)) }
      wall = candidate + 60
    }
    return nil
  }

  // MARK: The wall clock

  /// The first wall time (seconds since 1970 as if the zone were UTC) at or after `start`, a
  /// whole minute, that the fields match; nil past year 9999. Each step moves to the next month,
  /// day, hour or minute that can match, so it takes at most a few thousand steps.
  func nextWall(atOrAfter start: Int64) -> Int64? {
    var (year, month, day) = Self.civil(days: Self.floorDiv(start, 86_400))
    let secondsOfDay = start - Self.floorDiv(start, 86_400) * 86_400
    var hour = Int(secondsOfDay / 3_600)
    var minute = Int(secondsOfDay % 3_600 / 60)
    let lastYear = min(9_999, year + 30)
    while year <= lastYear {
      guard let nextMonth = Self.next(months, atOrAfter: month, upTo: 12) else {
        year += 1
        (month, day, hour, minute) = (1, 1, 0, 0)
        continue
      }
      if nextMonth != month { (month, day, hour, minute) = (nextMonth, 1, 0, 0) }
      let length = Self.daysIn(year: year, month: month)
      guard let nextDay = nextMatchingDay(year: year, month: month, atOrAfter: day, length: length) else {
        (day, hour, minute) = (1, 0, 0)
        if month == 12 { (year, month) = (year + 1, 1) } else { month += 1 }
        continue
      }
      if nextDay != day { (day, hour, minute) = (nextDay, 0, 0) }
      guard let nextHour = Self.next(hours, atOrAfter: hour, upTo: 23) else {
        (hour, minute) = (0, 0)
        day += 1
        if day > length {
          day = 1
          if month == 12 { (year, month) = (year + 1, 1) } else { month += 1 }
        }
        continue
      }
      if nextHour != hour { (hour, minute) = (nextHour, 0) }
      guard let nextMinute = Self.next(minutes, atOrAfter: minute, upTo: 59) else {
        minute = 0
        hour += 1
        if hour > 23 {
          hour = 0
          day += 1
          if day > length {
            day = 1
            if month == 12 { (year, month) = (year + 1, 1) } else { month += 1 }
          }
        }
        continue
      }
      let dayNumber = Self.days(year: year, month: month, day: day)
      return dayNumber * 86_400 + Int64(nextHour * 3_600 + nextMinute * 60)
    }
    return nil
  }

  /// The first day of the month from `day` on that matches, by cron's rule for the two day
  /// fields.
  private func nextMatchingDay(year: Int, month: Int, atOrAfter day: Int, length: Int) -> Int? {
    guard day <= length else { return nil }
    let firstWeekday = Self.weekday(days: Self.days(year: year, month: month, day: day))
    for candidate in day...length {
      let weekday = (firstWeekday + candidate - day) % 7
      let byDay = days >> candidate & 1 == 1
      let byWeekday = weekdays >> weekday & 1 == 1
      let matches =
        everyDay && everyWeekday
        ? true : everyDay ? byWeekday : everyWeekday ? byDay : (byDay || byWeekday)
      if matches { return candidate }
    }
    return nil
  }

  /// The instant (seconds since 1970) the wall time `wall` names on `zone`: the first of two when
  /// it occurs twice, the end of the gap when a change of offset skips it. Assumes at most one
  /// change of offset within a day of it, as every zone's rules have.
  static func instant(ofWall wall: Int64, in zone: TimeZone) -> Int64 {
    func offset(_ instant: Int64) -> Int64 {
      Int64(zone.secondsFromGMT(for: Date(timeIntervalSince1970: TimeInterval(instant))))
    }
    let before = offset(wall - 86_400)
    let after = offset(wall + 86_400)
    let early = wall - max(before, after)
    let late = wall - min(before, after)
    let valid = [early, late].filter { $0 + offset($0) == wall }
    if let first = valid.min() { return first }
    // Skipped: the change of offset lies between the two readings; the gap ends at it.
    var low = min(early, late)
    var high = max(early, late)
    let startOffset = offset(low)
    while high - low > 1 {
      let middle = low + (high - low) / 2
      if offset(middle) == startOffset { low = middle } else { high = middle }
    }
    return high
  }

  // MARK: Fields

  /// One field's range and names.
  struct Field: Sendable {
    var name: String
    var range: ClosedRange<Int>
    var names: [String: Int] = [:]

    static let all = [
      Field(name: "minute", range: 0...59),
      Field(name: "hour", range: 0...23),
      Field(name: "day of the month", range: 1...31),
      Field(
        name: "month", range: 1...12,
        names: Dictionary(
          uniqueKeysWithValues: [
            "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
          ]
          .enumerated().map { ($1, $0 + 1) })),
      Field(
        name: "day of the week", range: 0...7,
        names: Dictionary(
          uniqueKeysWithValues: ["sun", "mon", "tue", "wed", "thu", "fri", "sat"].enumerated().map {
            ($1, $0)
          })),
    ]

    /// The values `text` names, as bits, and whether it covers the whole field.
    func parse(_ text: String) throws(ScheduleError) -> (bits: UInt64, every: Bool) {
      if text == "*" { return (Self.bits(range, step: 1), true) }
      var bits: UInt64 = 0
      let items = text.split(separator: ",", omittingEmptySubsequences: false)
      for item in items {
        guard !item.isEmpty else {
          throw .invalidExpression("the \(name) field \(CronExpression.quoted(text)) has an empty item")
        }
        bits |= try parseItem(String(item))
      }
      // `*/1` (or `0-59`) covers the field as `*` does, for the rule of the two day fields.
      return (bits, text.hasPrefix("*") && bits == Self.bits(range, step: 1))
    }

    private func parseItem(_ item: String) throws(ScheduleError) -> UInt64 {
      let parts = item.split(separator: "/", omittingEmptySubsequences: false)
      guard parts.count <= 2 else {
        throw .invalidExpression("the \(name) field's \(CronExpression.quoted(item)) has more than one /")
      }
      let span: ClosedRange<Int>
      let base = String(parts[0])
      if base == "*" {
        span = range
      } else if let dash = base.firstIndex(of: "-") {
        let low = try value(String(base[..<dash]))
        let high = try value(String(base[base.index(after: dash)...]))
        guard low <= high else {
          throw .invalidExpression(
            "the \(name) range \(CronExpression.quoted(base)) runs backwards; write the smaller value first")
        }
        span = low...high
      } else {
        let single = try value(base)
        span = parts.count == 2 ? single...range.upperBound : single...single
      }
      var step = 1
      if parts.count == 2 {
        let text = String(parts[1])
        guard let parsed = CronExpression.number(text), parsed >= 1, parsed <= range.count else {
          throw .invalidExpression(
            "the \(name) step \(CronExpression.quoted(text)) must be a whole number from 1 to \(range.count)")
        }
        step = parsed
      }
      return Self.bits(span, step: step)
    }

    private func value(_ text: String) throws(ScheduleError) -> Int {
      if let number = CronExpression.number(text), range.contains(number) { return number }
      if let named = names[text.lowercased()] { return named }
      let allowed =
        names.isEmpty
        ? "\(range.lowerBound) to \(range.upperBound)"
        : "\(range.lowerBound) to \(range.upperBound) or a name such as \(names.min { $0.value < $1.value }!.key.uppercased())"
      throw .invalidExpression("the \(name) \(CronExpression.quoted(text)) is not \(allowed)")
    }

    static func bits(_ span: ClosedRange<Int>, step: Int) -> UInt64 {
      var bits: UInt64 = 0
      for value in stride(from: span.lowerBound, through: span.upperBound, by: step) { bits |= 1 << value }
      return bits
    }
  }

  static let macros = [
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *", "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *",
  ]

  /// A whole number of one to four ASCII digits (nothing longer can be in range), or nil.
  static func number(_ text: String) -> Int? {
    guard (1...4).contains(text.utf8.count), text.utf8.allSatisfy({ (48...57).contains($0) }) else {
      return nil
    }
    return Int(text)
  }

  /// `text` in quotes, with control characters shown as escapes and cut to 40 characters.
  static func quoted(_ text: String) -> String {
    var shown = ""
    for scalar in text.unicodeScalars.prefix(40) {
      shown +=
        scalar.value < 0x20 || scalar.value == 0x7F
        ? "\\u{\(String(scalar.value, radix: 16))}" : String(scalar)
    }
    return "\"\(shown)\(text.unicodeScalars.count > 40 ? "…" : "")\""
  }

  /// The first value from `start` to `upTo` whose bit is set.
  static func next(_ bits: UInt64, atOrAfter start: Int, upTo last: Int) -> Int? {
    guard start <= last else { return nil }
    let masked = (bits >> start) << start
    guard masked != 0 else { return nil }
    let found = masked.trailingZeroBitCount
    return found <= last ? found : nil
  }

  // MARK: Civil dates (proleptic Gregorian, days since 1970-01-01)

  /// 1 January of year 10,000 in seconds since 1970: later instants have no next fire.
  static let latestSecond: TimeInterval = 253_402_300_800
  /// 1 January of year 1 in seconds since 1970.
  static let earliestSecond: TimeInterval = -62_135_596_800

  static func floorDiv(_ a: Int64, _ b: Int64) -> Int64 { a >= 0 ? a / b : -((-a + b - 1) / b) }

  static func floorMinute(_ seconds: Int64) -> Int64 { floorDiv(seconds, 60) * 60 }

  /// Days since 1970-01-01 of a date (Howard Hinnant's `days_from_civil`).
  static func days(year: Int, month: Int, day: Int) -> Int64 {
    let y = Int64(month <= 2 ? year - 1 : year)
    let era = floorDiv(y, 400)
    let yearOfEra = y - era * 400
    let m = Int64(month)
    let dayOfYear = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + Int64(day) - 1
    let dayOfEra = yearOfEra * 365 + yearOfEra / 4 - yearOfEra / 100 + dayOfYear
    return era * 146_097 + dayOfEra - 719_468
  }

  /// The date of a day since 1970-01-01 (`civil_from_days`).
  static func civil(days: Int64) -> (year: Int, month: Int, day: Int) {
    let z = days + 719_468
    let era = floorDiv(z, 146_097)
    let dayOfEra = z - era * 146_097
    let yearOfEra = (dayOfEra - dayOfEra / 1_460 + dayOfEra / 36_524 - dayOfEra / 146_096) / 365
    let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
    let mp = (5 * dayOfYear + 2) / 153
    let day = dayOfYear - (153 * mp + 2) / 5 + 1
    let month = mp < 10 ? mp + 3 : mp - 9
    let year = yearOfEra + era * 400 + (month <= 2 ? 1 : 0)
    return (Int(year), Int(month), Int(day))
  }

  /// 0 for Sunday to 6 for Saturday.
  static func weekday(days: Int64) -> Int { Int((days % 7 + 11) % 7) }

  static func daysIn(year: Int, month: Int) -> Int {
    switch month {
    case 2: year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) ? 29 : 28
    case 4, 6, 9, 11: 30
    default: 31
    }
  }
}

/// Why a schedule cannot be made or kept.
public enum ScheduleError: Error, Sendable, Hashable, CustomStringConvertible {
  /// A cron expression that cannot be parsed or never fires; the text says what to change.
  case invalidExpression(String)
  /// A time zone this system does not know.
  case invalidTimeZone(String)
  /// An interval that is not whole seconds from 1 second to 366 days.
  case invalidInterval(String)
  /// A catch-up bound out of range.
  case invalidCatchUp(String)
  /// A jitter out of range.
  case invalidJitter(String)
  /// A schedule name that is not 1–128 characters of `A-Z a-z 0-9 . _ -`, or used twice.
  case invalidName(String)
  /// A time limit for the schedule's jobs out of range.
  case invalidTimeLimit(String)
  /// A deduplication scope for the schedule's jobs out of range, or one the queue cannot keep.
  case invalidDeduplication(String)
  /// The store does not keep schedules, or the schedule asks for what schedules cannot do yet (an
  /// item with an ordering key).
  case unsupported(String)

  /// Says what is wrong and what to do.
  public var description: String {
    switch self {
    case .invalidExpression(let message): "invalid cron expression: \(message)"
    case .invalidTimeZone(let message): "invalid time zone: \(message)"
    case .invalidInterval(let message): "invalid interval: \(message)"
    case .invalidCatchUp(let message): "invalid catch-up: \(message)"
    case .invalidJitter(let message): "invalid jitter: \(message)"
    case .invalidName(let message): "invalid schedule name: \(message)"
    case .invalidTimeLimit(let message): "invalid time limit: \(message)"
    case .invalidDeduplication(let message): "invalid deduplication: \(message)"
    case .unsupported(let message): "unsupported: \(message)"
    }
  }
}
