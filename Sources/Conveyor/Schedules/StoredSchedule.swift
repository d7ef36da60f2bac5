import Foundation

/// A periodic job as the code or an operator declares it: a name, when it fires, and the job each
/// slot adds.
///
/// ```swift
/// let digest = try ScheduleDefinition(
///   name: "daily-digest",
///   timing: ScheduleTiming(cron: "0 8 * * *", timeZone: "Europe/Berlin", catchUp: .latest),
///   payload: JSONEncoder().encode(SendDigest()))
/// ```
///
/// A ``JobQueue`` makes these from items with
/// ``JobQueue/declareSchedules(_:)``; stores keep them (see ``StoredSchedule``).
public struct ScheduleDefinition: Sendable, Hashable {
  /// The schedule's name, unique within its queue: 1–128 characters of `A-Z a-z 0-9 . _ -`.
  public let name: String
  /// When slots come and what happens to missed ones.
  public let timing: ScheduleTiming
  /// The encoded item each slot's job carries.
  public let payload: Data
  /// The priority of each slot's job.
  public let priority: Int
  /// The time limit of each slot's job in whole milliseconds; nil: the queue's.
  public let timeLimit: Duration?
  /// The deduplication key of each slot's job (see ``NewJob/deduplicationKey``), or nil. With
  /// ``DeduplicationScope/waitingOrRunning`` a slot whose job would overlap the previous one's,
  /// still waiting or running, adds nothing: the schedule never runs twice at once.
  public let deduplicationKey: String?
  /// Which jobs of ``deduplicationKey`` stop a slot's job (a period is kept in whole
  /// milliseconds). Ignored without a key.
  public let deduplicationScope: DeduplicationScope
  /// What a slot's job does with the waiting job of its key. Ignored without a key.
  public let onConflict: DeduplicationConflict

  /// Describes a schedule.
  ///
  /// - Throws: ``ScheduleError/invalidName(_:)`` for a name that is empty, longer than 128
  ///   characters or has a character outside `A-Z a-z 0-9 . _ -`;
  ///   ``ScheduleError/invalidTimeLimit(_:)`` for a time limit outside 1 ms to 7 days;
  ///   ``ScheduleError/invalidDeduplication(_:)`` for a scope's period out of range.
  public init(
    name: String, timing: ScheduleTiming, payload: Data, priority: Int = 0, timeLimit: Duration? = nil,
    deduplicationKey: String? = nil, deduplicationScope: DeduplicationScope = .waiting,
    onConflict: DeduplicationConflict = .useExisting
  ) throws(ScheduleError) {
    do {
      try JobQueueConfiguration.validate(identifier: name)
    } catch {
      throw .invalidName(
        "\(CronExpression.quoted(name)) is not a schedule name: use 1–128 characters of A-Z a-z 0-9 . _ -")
    }
    if let timeLimit, let problem = JobQueueConfiguration.problem(timeLimit: timeLimit, name: "timeLimit") {
      throw .invalidTimeLimit(problem)
    }
    self.name = name
    self.timing = timing
    self.payload = payload
    self.priority = priority
    // Kept in whole milliseconds, as the stores keep it, so a definition read back is equal.
    self.timeLimit = timeLimit.map { .milliseconds(max(1, JobStoreTime.milliseconds($0))) }
    if let problem = deduplicationScope.problem { throw .invalidDeduplication(problem) }
    self.deduplicationKey = deduplicationKey
    if case .completedWithin(let period) = deduplicationScope {
      self.deduplicationScope = .completedWithin(.milliseconds(JobStoreTime.milliseconds(period)))
    } else {
      self.deduplicationScope = deduplicationScope
    }
    self.onConflict = onConflict
  }

  /// The job of `slot`: this schedule's payload, priority, time limit and deduplication, run at
  /// the slot plus its jitter.
  public func job(forSlot slot: Date) -> NewJob {
    NewJob(
      payload: payload, priority: priority, runTime: .at(timing.runDate(ofSlot: slot, name: name)),
      deduplicationKey: deduplicationKey,
      deduplicationScope: deduplicationKey == nil ? .waiting : deduplicationScope,
      onConflict: onConflict, timeLimit: timeLimit)
  }

  /// ``deduplicationScope`` as stored: `waiting`, `waitingOrRunning` or `completedWithin <ms>`.
  public var storedDeduplicationScope: String {
    switch deduplicationScope {
    case .waiting: "waiting"
    case .waitingOrRunning: "waitingOrRunning"
    case .completedWithin(let period): "completedWithin \(JobStoreTime.milliseconds(period))"
    }
  }

  /// ``onConflict`` as stored: `useExisting` or `replace`.
  public var storedOnConflict: String { onConflict == .replace ? "replace" : "useExisting" }

  /// A scope and a conflict choice from their stored forms (see ``storedDeduplicationScope``).
  ///
  /// - Throws: ``ScheduleError/invalidDeduplication(_:)`` when one does not parse.
  public static func deduplication(storedScope scope: String, onConflict: String) throws(ScheduleError)
    -> (DeduplicationScope, DeduplicationConflict)
  {
    let conflict: DeduplicationConflict
    switch onConflict {
    case "useExisting": conflict = .useExisting
    case "replace": conflict = .replace
    default: throw .invalidDeduplication("stored conflict choice \(CronExpression.quoted(onConflict))")
    }
    switch scope {
    case "waiting": return (.waiting, conflict)
    case "waitingOrRunning": return (.waitingOrRunning, conflict)
    case _ where scope.hasPrefix("completedWithin "):
      guard let milliseconds = Int64(scope.dropFirst(16)) else { break }
      return (.completedWithin(.milliseconds(milliseconds)), conflict)
    default: break
    }
    throw .invalidDeduplication("stored scope \(CronExpression.quoted(scope))")
  }
}

/// Where a stored schedule came from, which decides what removes it (see
/// ``JobStore/saveSchedules(_:queue:origin:clock:)``).
public enum ScheduleOrigin: String, Sendable, Hashable, Codable {
  /// Declared by code at start (``JobQueue/declareSchedules(_:)``): the code's latest list is the
  /// whole truth, so a declared schedule missing from it becomes inactive (kept, shown, never
  /// fired) until a later declaration names it again.
  case declared
  /// Added by a person or a program one at a time (``JobQueue/addSchedule(_:)``, `conveyor
  /// schedule add`): kept until removed.
  case added
}

/// A schedule as a store keeps it: the definition and where it stands.
public struct StoredSchedule: Sendable, Hashable {
  /// The queue its jobs go to.
  public var queue: String
  /// What it is.
  public var definition: ScheduleDefinition
  /// Where it came from.
  public var origin: ScheduleOrigin
  /// False for a declared schedule that the code's latest declaration left out: kept, never fired.
  public var active: Bool
  /// Paused by an operator: never fired until resumed, and the slots that pass meanwhile are
  /// skipped whatever the catch-up policy. Kept when code declares the schedule again.
  public var paused: Bool
  /// When it was first stored: a schedule that never fired counts its slots from here.
  public var createdAt: Date
  /// The latest slot fired or passed over (skipped, or missed and not caught up), or nil.
  public var lastSlot: Date?
  /// When a process should next fire it (nil: no slot comes before year 9999). A process whose
  /// clock passes this fires every due slot in one transaction.
  public var nextDue: Date?

  /// Describes a stored schedule.
  public init(
    queue: String, definition: ScheduleDefinition, origin: ScheduleOrigin, active: Bool = true,
    paused: Bool = false, createdAt: Date, lastSlot: Date? = nil, nextDue: Date?
  ) {
    self.queue = queue
    self.definition = definition
    self.origin = origin
    self.active = active
    self.paused = paused
    self.createdAt = createdAt
    self.lastSlot = lastSlot
    self.nextDue = nextDue
  }

  /// The schedule's name.
  public var name: String { definition.name }

  /// Whether processes fire it: active and not paused.
  public var fires: Bool { active && !paused }

  /// A new schedule stored at `now`: its first slot is the first after `now`.
  public static func new(
    _ definition: ScheduleDefinition, queue: String, origin: ScheduleOrigin, now: Date
  ) -> StoredSchedule {
    StoredSchedule(
      queue: queue, definition: definition, origin: origin, createdAt: now,
      nextDue: definition.timing.nextSlot(after: now))
  }

  /// What firing at `now` does: the jobs of the due slots (oldest first, by the catch-up policy;
  /// see ``ScheduleTiming/due(lastSlot:since:now:)``) and the schedule after it, its last slot the
  /// latest at or before `now`, fired or not, so a slot is considered once.
  public func firing(now: Date) -> (jobs: [NewJob], after: StoredSchedule) {
    var after = self
    guard fires else {
      after.nextDue = nil
      return ([], after)
    }
    let timing = definition.timing
    let from = lastSlot ?? createdAt
    let (fire, next) = timing.due(lastSlot: lastSlot, since: createdAt, now: now)
    if let latest = timing.latestSlots(after: from, through: now, count: 1).first { after.lastSlot = latest }
    after.nextDue = next
    return (fire.map(definition.job(forSlot:)), after)
  }

  /// The schedule paused, or resumed, at `now`. A pause first fires the slots already due (the
  /// jobs returned, to add in the same transaction), so it skips only the slots that come while
  /// it lasts; a resumed schedule skips those and fires from the next slot.
  public func pausing(_ paused: Bool, now: Date) -> (jobs: [NewJob], after: StoredSchedule) {
    guard paused != self.paused else { return ([], self) }
    if paused {
      var (jobs, after) = firing(now: now)
      if !active { jobs = [] }
      after.paused = true
      after.nextDue = nil
      return (jobs, after)
    }
    var after = self
    after.paused = false
    after.skipPassedSlots(now: now)
    return ([], after)
  }

  /// Marks every slot at or before `now` as passed and sets the next due time after `now`.
  mutating func skipPassedSlots(now: Date) {
    let timing = definition.timing
    if let latest = timing.latestSlots(after: lastSlot ?? createdAt, through: now, count: 1).first {
      lastSlot = latest
    }
    nextDue = fires ? timing.nextSlot(after: max(lastSlot ?? now, now)) : nil
  }

  /// The schedule stored again with `definition` from `origin` at `now`, and the jobs to add in
  /// the same transaction. A firing schedule first fires, with its old definition, the slots
  /// already due; the new definition applies from the next slot, and no slot fires twice. A new
  /// timing's own slots older than ``ScheduleTiming/grace`` were never the schedule's and never
  /// fire; its on-time ones do. An inactive schedule declared again becomes active and skips the
  /// slots that passed while it was inactive; a paused one stays paused.
  public func redeclared(_ definition: ScheduleDefinition, origin: ScheduleOrigin, now: Date)
    -> (jobs: [NewJob], after: StoredSchedule)
  {
    var jobs: [NewJob] = []
    var after = self
    if fires { (jobs, after) = firing(now: now) }
    after.definition = definition
    after.origin = origin
    if !active {
      after.active = true
      after.skipPassedSlots(now: now)
    } else if fires {
      let timing = definition.timing
      if timing != self.definition.timing {
        let graceStart = now.addingTimeInterval(-ScheduleTiming.grace.seconds)
        if let latest = timing.latestSlots(after: after.lastSlot ?? createdAt, through: graceStart, count: 1)
          .first
        {
          after.lastSlot = latest
        }
      }
      // Due now when the timing has an on-time slot since the last one, else at its next slot.
      let (fire, next) = timing.due(lastSlot: after.lastSlot, since: createdAt, now: now)
      after.nextDue = fire.isEmpty ? next : now
    }
    return (jobs, after)
  }

  /// The schedule left out of the code's declaration at `now`: inactive, never fired, once the
  /// slots already due have fired (the jobs returned, to add in the same transaction), as a
  /// pause does.
  public func retired(now: Date) -> (jobs: [NewJob], after: StoredSchedule) {
    var (jobs, after) = firing(now: now)
    if !fires { (jobs, after) = ([], self) }
    after.active = false
    after.nextDue = nil
    return (jobs, after)
  }
}

/// What ``JobStore/fireDueSchedules(queue:clock:)`` did.
public struct ScheduleFiring: Sendable, Hashable {
  /// The jobs the due slots added, oldest slot first.
  public var added: [JobID]
  /// The earliest ``StoredSchedule/nextDue`` of the queue's schedules afterwards, or nil.
  public var nextDue: Date?

  /// Describes a firing.
  public init(added: [JobID], nextDue: Date?) {
    self.added = added
    self.nextDue = nextDue
  }
}

/// What ``JobStore/saveSchedules(_:queue:origin:clock:)`` did, by schedule name.
public struct ScheduleSaveSummary: Sendable, Hashable {
  /// Schedules stored for the first time.
  public var created: [String] = []
  /// Schedules whose definition, origin or activity changed.
  public var updated: [String] = []
  /// Schedules stored exactly as given already.
  public var unchanged: [String] = []
  /// Declared schedules the declaration left out, now inactive.
  public var retired: [String] = []
  /// Names the declaration gave that a schedule added at run time already holds: that schedule
  /// is left as it is, and the declared one is not stored (remove the added one to declare it).
  public var heldByAdded: [String] = []
  /// Names whose stored schedule this build cannot read back (one a newer release wrote): left
  /// as they are.
  public var unreadable: [String] = []
  /// The jobs the save added: slots already due of schedules it changed or retired, fired with
  /// their old definitions.
  public var added: [JobID] = []

  /// An empty summary.
  public init() {}
}

/// The bookkeeping every store shares for schedules: the stores read and write rows, these
/// decide what the rows become.
public enum ScheduleBook {
  /// How long a store puts off a schedule it cannot read back (a row a newer release wrote)
  /// when it comes due: the process neither fires it nor spins on it, and processes of the newer
  /// release, which can read it, fire it meanwhile, within the grace.
  public static let unreadablePostponement = Duration.seconds(30)

  /// The rows to write when `schedules` are saved from `origin` over the `existing` schedules of
  /// `queue`, the jobs to add with them (slots already due of schedules that change; see
  /// ``StoredSchedule/redeclared(_:origin:now:)``), and what that did. With
  /// ``ScheduleOrigin/declared``, declared schedules missing from `schedules` are retired, and
  /// added schedules are left alone.
  ///
  /// Names in `unreadable` (stored rows the store cannot read back) are left alone.
  ///
  /// - Throws: ``ScheduleError/invalidName(_:)`` when two schedules share a name.
  public static func save(
    _ schedules: [ScheduleDefinition], queue: String, origin: ScheduleOrigin, existing: [StoredSchedule],
    unreadable: Set<String> = [], now: Date
  ) throws(ScheduleError) -> (writes: [StoredSchedule], jobs: [NewJob], summary: ScheduleSaveSummary) {
    var seen = Set<String>()
    for schedule in schedules where !seen.insert(schedule.name).inserted {
      throw .invalidName(
        "two schedules are named \(CronExpression.quoted(schedule.name)); give each its own name")
    }
    let byName = Dictionary(existing.map { ($0.name, $0) }, uniquingKeysWith: { first, _ in first })
    var writes: [StoredSchedule] = []
    var jobs: [NewJob] = []
    var summary = ScheduleSaveSummary()
    for definition in schedules {
      if unreadable.contains(definition.name) {
        summary.unreadable.append(definition.name)
        continue
      }
      guard let stored = byName[definition.name] else {
        writes.append(.new(definition, queue: queue, origin: origin, now: now))
        summary.created.append(definition.name)
        continue
      }
      if origin == .declared && stored.origin == .added {
        summary.heldByAdded.append(definition.name)
        continue
      }
      // A firing schedule with no due time (its timing had no slot left, or a row was written
      // without one) is stored again, which sets it.
      let lostDueTime = stored.fires && stored.nextDue == nil && definition.timing.nextSlot(after: now) != nil
      if stored.definition == definition && stored.origin == origin && stored.active && !lostDueTime {
        summary.unchanged.append(definition.name)
      } else {
        let (due, after) = stored.redeclared(definition, origin: origin, now: now)
        jobs += due
        writes.append(after)
        summary.updated.append(definition.name)
      }
    }
    if origin == .declared {
      for stored in existing where stored.origin == .declared && stored.active && !seen.contains(stored.name)
      {
        let (due, after) = stored.retired(now: now)
        jobs += due
        writes.append(after)
        summary.retired.append(stored.name)
      }
    }
    return (writes, jobs, summary)
  }
}

extension ScheduleTiming {
  /// The spacing as stored: `cron <expression>` or `every <seconds>`.
  public var storedSpacing: String {
    switch spacing {
    case .cron(let expression): "cron \(expression.text)"
    case .every(let interval): "every \(interval.components.seconds)"
    }
  }

  /// The catch-up policy as stored: `skip`, `latest` or `all <bound>`.
  public var storedCatchUp: String {
    switch catchUp {
    case .skip: "skip"
    case .latest: "latest"
    case .all(let bound): "all \(bound)"
    }
  }

  /// A timing from its stored form (see ``storedSpacing`` and ``storedCatchUp``).
  ///
  /// - Throws: ``ScheduleError`` when a part does not parse or is out of range.
  public init(storedSpacing: String, timeZone: String, catchUp: String, jitterMilliseconds: Int64)
    throws(ScheduleError)
  {
    let catchUpPolicy: CatchUp
    switch catchUp {
    case "skip": catchUpPolicy = .skip
    case "latest": catchUpPolicy = .latest
    case _ where catchUp.hasPrefix("all "):
      guard let bound = Int(catchUp.dropFirst(4)) else { throw .invalidCatchUp("stored catch-up \(catchUp)") }
      catchUpPolicy = .all(atMost: bound)
    default: throw .invalidCatchUp("stored catch-up \(CronExpression.quoted(catchUp))")
    }
    guard (0...JobStoreTime.milliseconds(Self.longestJitter)).contains(jitterMilliseconds) else {
      throw .invalidJitter("stored jitter of \(jitterMilliseconds) ms")
    }
    let jitter = Duration.milliseconds(jitterMilliseconds)
    if storedSpacing.hasPrefix("cron ") {
      try self.init(
        cron: String(storedSpacing.dropFirst(5)), timeZone: timeZone, catchUp: catchUpPolicy, jitter: jitter)
    } else if storedSpacing.hasPrefix("every "), let seconds = Int64(storedSpacing.dropFirst(6)) {
      try self.init(every: .seconds(seconds), catchUp: catchUpPolicy, jitter: jitter)
    } else {
      throw .invalidExpression(
        "stored spacing \(CronExpression.quoted(storedSpacing)) is neither cron nor every")
    }
  }
}
