import Conveyor
import Foundation

// Stored schedules: one row each in the `schedules` table (schema version 8). What a save, a
// pause or a firing makes of a row is decided by `ScheduleBook` and `StoredSchedule`, the same
// for every store; here they are read and written under row locks:
// - a firing locks the due rows (`FOR UPDATE SKIP LOCKED`: a row another process is firing is
//   its to fire), inserts the slots' jobs and advances the rows in one transaction, so each slot's
//   job is added once however many processes fire at once;
// - a save takes the queue's schedule lock and locks the queue's rows before it reads them, so
//   it never writes back a row older than one a firing committed.
// With `Clock.database` the slots are judged by the server's clock, as leases are.

extension PostgresJobStore {
  /// Stores schedules; see `JobStore.saveSchedules(_:queue:origin:clock:)`. A stored schedule
  /// this build cannot read back (a newer release's) is left as it is.
  public func saveSchedules(
    _ schedules: [ScheduleDefinition], queue: String, origin: ScheduleOrigin, clock: any JobClock
  ) async throws -> ScheduleSaveSummary {
    let sql = self.sql
    let useServerClock = options.clock == .database
    return try await connection.perform(idempotent: true) { db in
      try db.transaction {
        try db.execute(sql.lockSchedulesOfQueue, [.text(queue)])
        let now = try Self.scheduleNow(db, clock: clock, server: useServerClock)
        let rows = Self.readSchedules(try db.execute(sql.schedulesOfQueueLocked, [.text(queue)]))
        let existing = rows.compactMap { try? $0.row.get() }
        let unreadable = Set(rows.filter { (try? $0.row.get()) == nil }.map(\.name))
        var (writes, jobs, summary) = try ScheduleBook.save(
          schedules, queue: queue, origin: origin, existing: existing, unreadable: unreadable, now: now)
        if !jobs.isEmpty {
          summary.added = try Self.insert(
            EnqueueCall(jobs: jobs, queue: queue, now: .timestamp(now)), sql: sql, db: db
          )
          .filter(\.inserted).map(\.id)
        }
        for write in writes { try Self.write(write, sql: sql, db: db) }
        return summary
      }
    }
  }

  /// The stored schedules; see `JobStore.schedules(queue:)`. With `Clock.database` the dates
  /// are the server's.
  ///
  /// - Throws: `ScheduleError` naming a schedule the store cannot read back (written by a newer
  ///   release, say).
  public func schedules(queue: String?) async throws -> [StoredSchedule] {
    let sql = self.sql
    return try await connection.perform(idempotent: true) { db in
      let rows =
        try queue.map { try db.execute(sql.schedulesOfQueue, [.text($0)]) } ?? db.execute(sql.allSchedules)
      return try Self.readSchedules(rows).map { try $0.row.get() }
    }
  }

  /// Pauses or resumes a schedule; see `JobStore.changeSchedulePause(_:name:queue:clock:)`.
  public func changeSchedulePause(_ paused: Bool, name: String, queue: String, clock: any JobClock)
    async throws -> [JobID]?
  {
    let sql = self.sql
    let useServerClock = options.clock == .database
    return try await connection.perform(idempotent: true) { db in
      try db.transaction {
        let rows = try db.execute(sql.scheduleNamedLocked, [.text(queue), .text(name)])
        guard let found = Self.readSchedules(rows).first else { return nil }
        let now = try Self.scheduleNow(db, clock: clock, server: useServerClock)
        let (jobs, after) = try found.row.get().pausing(paused, now: now)
        var added: [JobID] = []
        if !jobs.isEmpty {
          added = try Self.insert(
            EnqueueCall(jobs: jobs, queue: queue, now: .timestamp(now)), sql: sql, db: db
          )
          .filter(\.inserted).map(\.id)
        }
        try Self.write(after, sql: sql, db: db)
        return added
      }
    }
  }

  /// Deletes a schedule; see `JobStore.removeSchedule(name:queue:)`.
  public func removeSchedule(name: String, queue: String) async throws -> Bool {
    let sql = self.sql
    return try await connection.perform(idempotent: true) { db in
      try db.execute(sql.deleteSchedule, [.text(queue), .text(name)]).changed > 0
    }
  }

  /// Fires due schedules; see `JobStore.fireDueSchedules(queue:clock:)`. One transaction for
  /// the due schedules of the queue that no other transaction is firing. With `Clock.database`
  /// the returned due date is moved onto `clock`, as `nextWake(queue:clock:)`'s are.
  public func fireDueSchedules(queue: String, clock: any JobClock) async throws -> ScheduleFiring {
    let sql = self.sql
    let useServerClock = options.clock == .database
    // Run again after a lost connection: a firing that committed advanced its rows, so the run
    // again finds them not due and adds nothing twice.
    let (firing, serverNow) = try await connection.perform(idempotent: true) { db in
      try db.transaction {
        let now = try Self.scheduleNow(db, clock: clock, server: useServerClock)
        var added: [JobID] = []
        for found in Self.readSchedules(try db.execute(sql.dueSchedules, [.text(queue), .timestamp(now)])) {
          guard case .success(let schedule) = found.row else {
            try db.execute(
              sql.postponeSchedule,
              [
                .text(queue), .text(found.name),
                .timestamp(JobStoreTime.date(now, adding: ScheduleBook.unreadablePostponement)),
                .timestamp(now.addingTimeInterval(-Double(ScheduleTiming.grace.components.seconds))),
              ])
            continue
          }
          let (jobs, after) = schedule.firing(now: now)
          if !jobs.isEmpty {
            let call = EnqueueCall(jobs: jobs, queue: queue, now: .timestamp(now))
            added += try Self.insert(call, sql: sql, db: db).filter(\.inserted).map(\.id)
          }
          try db.execute(
            sql.advanceSchedule,
            [.text(queue), .text(found.name), .timestamp(after.lastSlot), .timestamp(after.nextDue)])
        }
        let next = try db.execute(sql.nextScheduleDue, [.text(queue)]).date(0, 0)
        return (ScheduleFiring(added: added, nextDue: next), now)
      }
    }
    guard useServerClock else { return firing }
    let offset = clock.now().timeIntervalSince(serverNow)
    return ScheduleFiring(added: firing.added, nextDue: firing.nextDue?.addingTimeInterval(offset))
  }

  /// The time schedules are judged by: the server's (`Clock.database`) or the caller's, to the
  /// millisecond.
  private static func scheduleNow(_ db: Connection, clock: any JobClock, server: Bool) throws -> Date {
    // Never past the clock: a slot is not fired before its time (see `normalizedDown`).
    guard server else { return JobStoreTime.normalizedDown(clock.now()) }
    guard let now = try db.execute(SQL.serverNow).date(0, 0) else {
      throw PostgresError(code: .protocolViolation, message: "the server did not say what time it is")
    }
    return now
  }

  /// The rows of a query of `SQL.scheduleColumns`, by name, each read back or the reason it
  /// cannot be.
  private static func readSchedules(_ rows: QueryResult) -> [(
    name: String, row: Result<StoredSchedule, ScheduleError>
  )] {
    (0..<rows.count).map { index in
      let queue = rows.text(index, 0) ?? ""
      let name = rows.text(index, 1) ?? ""
      return (
        name,
        Result { () throws(ScheduleError) in
          let timing = try ScheduleTiming(
            storedSpacing: rows.text(index, 2) ?? "", timeZone: rows.text(index, 3) ?? "",
            catchUp: rows.text(index, 4) ?? "", jitterMilliseconds: rows.int64(index, 5))
          let (scope, conflict) = try ScheduleDefinition.deduplication(
            storedScope: rows.text(index, 16) ?? "", onConflict: rows.text(index, 17) ?? "")
          let definition = try ScheduleDefinition(
            name: name, timing: timing, payload: rows.data(index, 6),
            priority: Int(clamping: rows.int64(index, 7)),
            timeLimit: rows.isNull(index, 8)
              ? nil : JobStoreTime.timeLimit(milliseconds: rows.int64(index, 8)),
            deduplicationKey: rows.isNull(index, 15)
              ? nil : String(decoding: rows.data(index, 15), as: UTF8.self), deduplicationScope: scope,
            onConflict: conflict)
          guard let origin = ScheduleOrigin(rawValue: rows.text(index, 9) ?? "") else {
            throw .unsupported("schedule \(name) of queue \(queue) has an origin this build does not know")
          }
          guard let createdAt = rows.date(index, 12) else {
            throw .unsupported("schedule \(name) of queue \(queue) has no creation date")
          }
          return StoredSchedule(
            queue: queue, definition: definition, origin: origin, active: rows.bool(index, 10),
            paused: rows.bool(index, 11), createdAt: createdAt, lastSlot: rows.date(index, 13),
            nextDue: rows.date(index, 14))
        }
      )
    }
  }

  /// Inserts or replaces a schedule's row.
  private static func write(_ schedule: StoredSchedule, sql: SQL, db: Connection) throws {
    let definition = schedule.definition
    let timing = definition.timing
    try db.execute(
      sql.saveSchedule,
      [
        .text(schedule.queue), .text(schedule.name), .text(timing.storedSpacing), .text(timing.timeZoneName),
        .text(timing.storedCatchUp), .int64(JobStoreTime.milliseconds(timing.jitter)),
        .bytea(definition.payload),
        .int64(Int64(definition.priority)),
        definition.timeLimit.map { .int64(JobStoreTime.milliseconds($0)) }
          ?? .null(oid: PostgresValue.int8OID),
        .text(schedule.origin.rawValue), .bool(schedule.active), .bool(schedule.paused),
        .timestamp(schedule.createdAt), .timestamp(schedule.lastSlot), .timestamp(schedule.nextDue),
        definition.deduplicationKey.map { .bytea(Data($0.utf8)) } ?? .null(oid: PostgresValue.byteaOID),
        .text(definition.storedDeduplicationScope), .text(definition.storedOnConflict),
      ])
  }
}
