import Foundation

/// When a periodic job fires, and what a schedule does with the slots it missed while nothing
/// ran: the timing part of a schedule, a pure value every process computes the same way.
///
/// ```swift
/// let digest = try ScheduleTiming(cron: "0 8 * * MON-FRI", timeZone: "Europe/Berlin", catchUp: .latest)
/// let sync = try ScheduleTiming(every: .seconds(300))  // :00, :05, :10… UTC
/// ```
///
/// A *slot* is one instant at which the schedule fires: a fire time of its cron expression on its
/// time zone's wall clock, or a whole multiple of its interval since 1970-01-01 UTC (so every
/// process, and every restart, agrees on the slots). A slot's job runs at the slot plus the
/// schedule's jitter for that slot, a fraction of ``jitter`` drawn from the schedule's name and
/// the slot alone, so it too is the same in every process.
public struct ScheduleTiming: Sendable, Hashable {
  /// How the slots are spaced.
  public enum Spacing: Sendable, Hashable {
    /// The fire times of a cron expression on the time zone's wall clock.
    case cron(CronExpression)
    /// Every whole multiple of this interval since 1970-01-01 UTC (1 second to 366 days).
    case every(Duration)
  }

  /// What to do with slots that passed while no process fired them (all workers down, the
  /// workers stopped): a slot is *missed* once it is older than ``ScheduleTiming/grace``. Slots
  /// that pass while a schedule is paused are skipped, not missed (see ``StoredSchedule/paused``).
  public enum CatchUp: Sendable, Hashable {
    /// Fire none of the missed slots; the schedule goes on from the next one.
    case skip
    /// Fire the latest missed slot once, and none before it.
    case latest
    /// Fire every missed slot, oldest first, but at most this many (the latest ones; 1 to
    /// 1,000).
    case all(atMost: Int)
  }

  /// How the slots are spaced.
  public let spacing: Spacing
  /// The zone whose wall clock a cron expression reads (interval schedules ignore it).
  public let timeZone: TimeZone
  /// The zone's name as given ("UTC" stays "UTC", where Foundation on Linux names that zone
  /// "GMT"): what the stores keep and listings show.
  public let timeZoneName: String
  /// What happens to missed slots. Default ``CatchUp/skip``.
  public let catchUp: CatchUp
  /// The most a slot's job is delayed after its slot, to spread schedules that share a slot.
  /// Default zero; at most the smallest gap the schedule may have between two slots would be
  /// sensible, and at most 1 hour is taken. Kept in whole milliseconds.
  public let jitter: Duration

  /// How late a slot may be fired and still count as on time, not missed: 1 minute. A process
  /// checks due schedules at least every poll interval, so a slot is normally fired within one.
  public static let grace = Duration.seconds(60)
  /// The longest ``jitter``.
  public static let longestJitter = Duration.seconds(3_600)
  /// The longest interval.
  public static let longestInterval = Duration.seconds(366 * 86_400)
  /// The most slots ``CatchUp/all(atMost:)`` fires at once.
  public static let mostCaughtUp = 1_000

  /// The zone of an IANA name; the stores read a stored timing's zone back through it.
  ///
  /// - Throws: ``ScheduleError/invalidTimeZone(_:)`` for a name this system does not know, an
  ///   offset, or an abbreviation, saying which name to give.
  static func zone(named timeZone: String) throws(ScheduleError) -> TimeZone {
    // Foundation takes a name with a NUL in it as the name before the NUL once that zone is
    // loaded: only the characters of IANA names reach it.
    let allowed = timeZone.utf8.allSatisfy { byte in
      (65...90).contains(byte) || (97...122).contains(byte) || (48...57).contains(byte)
        || "/_-+".utf8.contains(byte)
    }
    guard (1...64).contains(timeZone.utf8.count), allowed, let zone = TimeZone(identifier: timeZone) else {
      throw .invalidTimeZone(
        "\(CronExpression.quoted(timeZone)) is not a time zone this system knows; give an IANA name such as "
          + "\"Europe/Berlin\" or \"UTC\"")
    }
    // Foundation also takes offsets ("UTC+5", read as +05:00 where POSIX reads -05:00) and
    // abbreviations ("PST", whose meaning differs between systems): only zone names are taken.
    if timeZone.hasPrefix("UTC") || timeZone.hasPrefix("GMT"), timeZone.count > 3 {
      throw .invalidTimeZone(
        "\(CronExpression.quoted(timeZone)) is an offset, not a zone name; give an IANA name such as "
          + "\"Etc/GMT-5\" (five hours ahead of UTC) or the zone of a place")
    }
    if !["UTC", "GMT"].contains(timeZone), let named = TimeZone.abbreviationDictionary[timeZone],
      !TimeZone.knownTimeZoneIdentifiers.contains(timeZone)
    {
      throw .invalidTimeZone(
        "\(CronExpression.quoted(timeZone)) is an abbreviation, not a zone name; give an IANA name such as "
          + "\"\(named)\"")
    }
    return zone
  }

  /// A cron schedule on the wall clock of the zone named `timeZone` (an IANA name such as
  /// "Europe/Berlin"; default "UTC").
  ///
  /// - Throws: ``ScheduleError`` for a bad expression, an unknown zone, a catch-up bound or a
  ///   jitter out of range.
  public init(cron: String, timeZone: String = "UTC", catchUp: CatchUp = .skip, jitter: Duration = .zero)
    throws(ScheduleError)
  {
    let zone = try Self.zone(named: timeZone)
    try self.init(
      spacing: .cron(try CronExpression(cron)), timeZone: zone, named: timeZone, catchUp: catchUp,
      jitter: jitter)
  }

  /// A schedule that fires every `interval`, at its whole multiples since 1970-01-01 UTC.
  ///
  /// - Throws: ``ScheduleError/invalidInterval(_:)`` outside 1 second to 366 days, or not whole
  ///   seconds; ``ScheduleError/invalidCatchUp(_:)``, ``ScheduleError/invalidJitter(_:)``.
  public init(every interval: Duration, catchUp: CatchUp = .skip, jitter: Duration = .zero)
    throws(ScheduleError)
  {
    try self.init(
      spacing: .every(interval), timeZone: TimeZone(identifier: "UTC")!, named: "UTC", catchUp: catchUp,
      jitter: jitter)
  }

  /// A schedule from its parts, checked as the other initializers check them (a cron
  /// expression's zone must be one an IANA name gives, not one made from an offset). An
  /// interval's zone is UTC whatever `timeZone` says (its slots do not depend on one).
  public init(spacing: Spacing, timeZone: TimeZone, catchUp: CatchUp = .skip, jitter: Duration = .zero)
    throws(ScheduleError)
  {
    if case .every = spacing {
      try self.init(
        spacing: spacing, timeZone: TimeZone(identifier: "UTC")!, named: "UTC", catchUp: catchUp,
        jitter: jitter)
    } else {
      // Checked as a name is: a zone made from an offset (`TimeZone(secondsFromGMT:)`, named
      // "GMT+0500") could not be read back.
      _ = try Self.zone(named: timeZone.identifier)
      try self.init(
        spacing: spacing, timeZone: timeZone, named: timeZone.identifier, catchUp: catchUp, jitter: jitter)
    }
  }

  private init(spacing: Spacing, timeZone: TimeZone, named name: String, catchUp: CatchUp, jitter: Duration)
    throws(ScheduleError)
  {
    if case .every(let interval) = spacing {
      guard interval >= .seconds(1), interval <= Self.longestInterval, interval.components.attoseconds == 0
      else {
        throw .invalidInterval(
          "an interval of \(interval) is not whole seconds from 1 second to 366 days; use a cron expression "
            + "for calendar periods such as months")
      }
    }
    if case .all(let bound) = catchUp, !(1...Self.mostCaughtUp).contains(bound) {
      throw .invalidCatchUp("catch up .all(atMost: \(bound)) must fire 1 to \(Self.mostCaughtUp) slots")
    }
    guard jitter >= .zero, jitter <= Self.longestJitter else {
      throw .invalidJitter("a jitter of \(jitter) must be from zero to 1 hour")
    }
    self.spacing = spacing
    self.timeZone = timeZone
    self.timeZoneName = name
    self.catchUp = catchUp
    // Kept in whole milliseconds, as the stores keep it.
    self.jitter = .milliseconds(JobStoreTime.milliseconds(jitter))
  }

  /// The first slot after `date`; nil when none comes before year 9999.
  public func nextSlot(after date: Date) -> Date? {
    switch spacing {
    case .cron(let expression): return expression.nextFire(after: date, in: timeZone)
    case .every(let interval):
      let step = interval.components.seconds
      let seconds = date.timeIntervalSince1970
      guard seconds.isFinite, seconds < CronExpression.latestSecond else { return nil }
      let at = Int64(max(seconds, CronExpression.earliestSecond).rounded(.down))
      let next = (CronExpression.floorDiv(at, step) + 1) * step
      return TimeInterval(next) < CronExpression.latestSecond
        ? Date(timeIntervalSince1970: TimeInterval(next)) : nil
    }
  }

  /// What a process firing the schedule at `now` does, the last slot fired being `lastSlot` (nil:
  /// none yet, and the schedule counts from `since`, when it was stored): the slots to fire now,
  /// oldest first, and the next slot after `now`, when it is due again.
  ///
  /// Slots within ``grace`` of `now` are on time and always fire (at most ``mostCaughtUp``);
  /// older ones are missed, and the catch-up policy decides: ``CatchUp/skip`` fires none of them,
  /// ``CatchUp/latest`` the latest one when no slot is on time, ``CatchUp/all(atMost:)`` the
  /// latest ones up to its bound, on-time slots included. Bounded whatever the downtime: it walks
  /// at most a few thousand slots.
  public func due(lastSlot: Date?, since: Date, now: Date) -> (fire: [Date], next: Date?) {
    let from = lastSlot ?? since
    let next = nextSlot(after: max(from, now))
    guard from < now else { return ([], next) }
    let onTimeFrom = now.addingTimeInterval(-Self.grace.seconds)
    let onTime = latestSlots(
      after: max(from, onTimeFrom.addingTimeInterval(-0.001)), through: now, count: Self.mostCaughtUp)
    switch catchUp {
    case .skip:
      return (onTime, next)
    case .latest:
      return (onTime.isEmpty ? latestSlots(after: from, through: now, count: 1) : onTime, next)
    case .all(let bound):
      return (latestSlots(after: from, through: now, count: max(bound, onTime.count)), next)
    }
  }

  /// The latest `count` slots after `from` and at or before `now`, oldest first. An interval's
  /// are computed; a cron expression's are walked forward from a point before `now` that moves
  /// back (a day, then twice as far each time, never before `from`) until it holds `count` slots,
  /// so the walk covers at most about twice the slots it keeps, or a day's.
  func latestSlots(after from: Date, through now: Date, count: Int) -> [Date] {
    guard count > 0, from < now else { return [] }
    if case .every(let interval) = spacing {
      let step = interval.components.seconds
      guard let first = nextSlot(after: from), first <= now else { return [] }
      let at = Int64(now.timeIntervalSince1970.rounded(.down))
      let latest = CronExpression.floorDiv(at, step) * step
      let firstSecond = Int64(first.timeIntervalSince1970)
      let available = (latest - firstSecond) / step + 1
      let taken = min(Int64(count), available)
      return (0..<taken).map { Date(timeIntervalSince1970: TimeInterval(latest - (taken - 1 - $0) * step)) }
    }
    var window: TimeInterval = 86_400
    while true {
      let start = max(from, now.addingTimeInterval(-window))
      var found: [Date] = []
      var cursor = start
      while let following = nextSlot(after: cursor), following <= now {
        found.append(following)
        cursor = following
      }
      if found.count >= count || start <= from { return Array(found.suffix(count)) }
      window *= 2
    }
  }

  /// When the job of `slot` runs: the slot plus a share of ``jitter`` drawn from `name` and the
  /// slot, the same in every process.
  public func runDate(ofSlot slot: Date, name: String) -> Date {
    guard jitter > .zero else { return slot }
    // FNV-1a over the name and the slot's second: stable across processes and builds.
    var hash: UInt64 = 0xcbf2_9ce4_8422_2325
    for byte in name.utf8 {
      hash = (hash ^ UInt64(byte)) &* 0x0000_0100_0000_01B3
    }
    var second = UInt64(bitPattern: Int64(slot.timeIntervalSince1970.rounded(.down)))
    for _ in 0..<8 {
      hash = (hash ^ (second & 0xFF)) &* 0x0000_0100_0000_01B3
      second >>= 8
    }
    let millis = UInt64(JobStoreTime.milliseconds(jitter))
    return slot.addingTimeInterval(Double(hash % (millis + 1)) / 1_000)
  }
}
