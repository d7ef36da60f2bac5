import Conveyor
import Foundation

// Stored schedules: one row each in the `schedules` table (schema version 8). What a save, a
// pause or a firing makes of a row is decided by `ScheduleBook` and `StoredSchedule`, the same
// for every store; here they are read and written, each call in one `BEGIN IMMEDIATE`
// transaction, so a slot fired by one process is seen as fired by every other.

extension SQLiteJobStore {
  /// Stores schedules; see `JobStore.saveSchedules(_:queue:origin:clock:)`. A stored schedule
  /// this build cannot read back (a newer release's) is left as it is.
  public func saveSchedules(
    _ schedules: [ScheduleDefinition], queue: String, origin: ScheduleOrigin, clock: any JobClock
  ) async throws -> ScheduleSaveSummary {
    try await connection.perform { db in
      try db.transaction(immediate: true) {
        let rows = try Self.readNamedSchedules(db, SQL.schedulesOfQueue, [.text(queue)])
        let existing = rows.compactMap { try? $0.row.get() }
        let unreadable = Set(rows.filter { (try? $0.row.get()) == nil }.map(\.name))
        let now = JobStoreTime.normalizedDown(clock.now())
        var (writes, jobs, summary) = try ScheduleBook.save(
          schedules, queue: queue, origin: origin, existing: existing, unreadable: unreadable, now: now)
        if !jobs.isEmpty {
          summary.added = try Self.insert(jobs, queue: queue, now: millis(now), db: db).filter(\.inserted)
            .map(\.id)
        }
        for write in writes { try Self.write(write, db: db) }
        return summary
      }
    }
  }

  /// The stored schedules; see `JobStore.schedules(queue:)`.
  ///
  /// - Throws: `ScheduleError` naming a schedule the store cannot read back (written by a newer
  ///   release, say).
  public func schedules(queue: String?) async throws -> [StoredSchedule] {
    try await connection.perform { db in
      let rows =
        try queue.map { try Self.readSchedules(db, SQL.schedulesOfQueue, .text($0)) }
        ?? Self.readSchedules(db, SQL.allSchedules)
      return try rows.map { try $0.get() }
    }
  }

  /// Pauses or resumes a schedule; see `JobStore.changeSchedulePause(_:name:queue:clock:)`.
  public func changeSchedulePause(_ paused: Bool, name: String, queue: String, clock: any JobClock)
    async throws -> [JobID]?
  {
    try await connection.perform { db in
      try db.transaction(immediate: true) {
        guard let row = try Self.readSchedules(db, SQL.scheduleNamed, .text(queue), .text(name)).first else {
          return nil
        }
        let now = JobStoreTime.normalizedDown(clock.now())
        let (jobs, after) = try row.get().pausing(paused, now: now)
        var added: [JobID] = []
        if !jobs.isEmpty {
          added = try Self.insert(jobs, queue: queue, now: millis(now), db: db).filter(\.inserted).map(\.id)
        }
        try Self.write(after, db: db)
        return added
      }
    }
  }

  /// Deletes a schedule; see `JobStore.removeSchedule(name:queue:)`.
  public func removeSchedule(name: String, queue: String) async throws -> Bool {
    try await connection.perform { db in try db.run(SQL.deleteSchedule, .text(queue), .text(name)) > 0 }
  }

  /// Fires due schedules; see `JobStore.fireDueSchedules(queue:clock:)`. One transaction for
  /// every due schedule of the queue: the jobs of their slots and their rows advanced.
  public func fireDueSchedules(queue: String, clock: any JobClock) async throws -> ScheduleFiring {
    try await connection.perform { db in
      try db.transaction(immediate: true) {
        // Never past the clock: a slot is not fired before its time (see `normalizedDown`).
        let now = JobStoreTime.normalizedDown(clock.now())
        var added: [JobID] = []
        for (name, row) in try Self.readNamedSchedules(
          db, SQL.dueSchedules, [.text(queue), .integer(millis(now))])
        {
          guard case .success(let schedule) = row else {
            try db.run(
              SQL.postponeSchedule,
              .integer(millis(JobStoreTime.date(now, adding: ScheduleBook.unreadablePostponement))),
              .text(queue), .text(name),
              .integer(millis(now) - JobStoreTime.milliseconds(ScheduleTiming.grace)))
            continue
          }
          let (jobs, after) = schedule.firing(now: now)
          if !jobs.isEmpty {
            added += try Self.insert(jobs, queue: queue, now: millis(now), db: db).filter(\.inserted).map(
              \.id)
          }
          func optional(_ value: Date?) -> SQLiteValue { value.map { .integer(millis($0)) } ?? .null }
          try db.run(
            SQL.advanceSchedule, optional(after.lastSlot), optional(after.nextDue), .text(queue), .text(name))
        }
        let next = try db.scalar(SQL.nextScheduleDue, .text(queue))
        return ScheduleFiring(added: added, nextDue: next.map(date))
      }
    }
  }

  /// The rows a query of `SQL.scheduleColumns` returns, each read back or the reason it cannot be.
  private static func readSchedules(_ db: Connection, _ sql: String, _ values: SQLiteValue...) throws
    -> [Result<StoredSchedule, ScheduleError>]
  {
    try readNamedSchedules(db, sql, values).map(\.row)
  }

  /// The rows a query of `SQL.scheduleColumns` returns, by name, each read back or the reason
  /// it cannot be.
  private static func readNamedSchedules(_ db: Connection, _ sql: String, _ values: [SQLiteValue]) throws
    -> [(name: String, row: Result<StoredSchedule, ScheduleError>)]
  {
    var rows: [(name: String, row: Result<StoredSchedule, ScheduleError>)] = []
    try db.query(sql, values) { row in
      let queue = row.text(0) ?? ""
      let name = row.text(1) ?? ""
      rows.append(
        (
          name,
          Result { () throws(ScheduleError) in
            let timing = try ScheduleTiming(
              storedSpacing: row.text(2) ?? "", timeZone: row.text(3) ?? "", catchUp: row.text(4) ?? "",
              jitterMilliseconds: row.int64(5))
            let (scope, conflict) = try ScheduleDefinition.deduplication(
              storedScope: row.text(16) ?? "", onConflict: row.text(17) ?? "")
            let definition = try ScheduleDefinition(
              name: name, timing: timing, payload: row.data(6), priority: row.int(7),
              timeLimit: row.isNull(8) ? nil : JobStoreTime.timeLimit(milliseconds: row.int64(8)),
              deduplicationKey: row.text(15), deduplicationScope: scope, onConflict: conflict)
            guard let origin = ScheduleOrigin(rawValue: row.text(9) ?? "") else {
              throw .unsupported("schedule \(name) of queue \(queue) has an origin this build does not know")
            }
            return StoredSchedule(
              queue: queue, definition: definition, origin: origin, active: row.int64(10) != 0,
              paused: row.int64(11) != 0, createdAt: date(row.int64(12)),
              lastSlot: row.isNull(13) ? nil : date(row.int64(13)),
              nextDue: row.isNull(14) ? nil : date(row.int64(14)))
          }
        ))
    }
    return rows
  }

  /// Inserts or replaces a schedule's row.
  private static func write(_ schedule: StoredSchedule, db: Connection) throws {
    let definition = schedule.definition
    let timing = definition.timing
    func optional(_ value: Date?) -> SQLiteValue { value.map { .integer(millis($0)) } ?? .null }
    _ = try db.run(
      SQL.saveSchedule, .text(schedule.queue), .text(schedule.name), .text(timing.storedSpacing),
      .text(timing.timeZoneName), .text(timing.storedCatchUp),
      .integer(JobStoreTime.milliseconds(timing.jitter)),
      .blob(definition.payload), .integer(Int64(definition.priority)),
      definition.timeLimit.map { .integer(JobStoreTime.milliseconds($0)) } ?? .null,
      .text(schedule.origin.rawValue),
      .integer(schedule.active ? 1 : 0), .integer(schedule.paused ? 1 : 0),
      .integer(millis(schedule.createdAt)),
      optional(schedule.lastSlot), optional(schedule.nextDue),
      definition.deduplicationKey.map { .text($0) } ?? .null,
      .text(definition.storedDeduplicationScope), .text(definition.storedOnConflict))
  }
}
