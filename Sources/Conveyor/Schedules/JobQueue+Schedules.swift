import Foundation

// Schedules through a queue: items on a timing, stored in the queue's store and fired by every
// started queue of the same identifier (see `JobQueue+Loop`).

extension JobQueue {
  /// A schedule that adds `item` to this queue at every slot of `timing`, with the item's
  /// deduplication key, scope and conflict choice: an item whose scope is
  /// ``DeduplicationScope/waitingOrRunning`` is never run twice at once, a slot that comes while
  /// the previous slot's job waits or runs adding nothing.
  ///
  /// ```swift
  /// let digest = try queue.schedule(
  ///   "daily-digest", try ScheduleTiming(cron: "0 8 * * *", timeZone: "Europe/Berlin"), item: SendDigest())
  /// try await queue.declareSchedules([digest])
  /// ```
  ///
  /// - Throws: ``ScheduleError/invalidName(_:)``, ``ScheduleError/invalidTimeLimit(_:)``;
  ///   ``ScheduleError/invalidDeduplication(_:)`` for a scope the queue cannot keep (see
  ///   ``JobQueue/add(_:priority:delay:timeLimit:)``); ``ScheduleError/unsupported(_:)`` for an
  ///   item with an ordering key (a schedule cannot carry one yet);
  ///   ``JobQueueError/encodingFailed(_:)`` when the item does not encode.
  public func schedule(
    _ name: String, _ timing: ScheduleTiming, item: Item, priority: Int = 0, timeLimit: Duration? = nil
  ) throws -> ScheduleDefinition {
    let payload: Data
    do {
      payload = try encoder.encode(item)
    } catch {
      throw JobQueueError.encodingFailed(String(describing: error))
    }
    let key = item.deduplicationKey
    let scope = key == nil ? DeduplicationScope.waiting : item.deduplicationScope
    if let problem = problem(scope) { throw ScheduleError.invalidDeduplication(problem) }
    // A schedule stores no ordering key: its jobs would run out of the order the item asks for.
    if item.orderingKey != nil {
      throw ScheduleError.unsupported(
        "a schedule cannot carry an ordering key yet (the item's orderingKey is \"\(item.orderingKey!)\"); "
          + "schedule an item without one, and have its handler add the ordered jobs")
    }
    // Nor a limit key: its jobs would run outside the key's limit.
    if let limitKey = item.limitKey {
      throw ScheduleError.unsupported(
        "a schedule cannot carry a limit key yet (the item's limitKey is \"\(LimitKey.printable(limitKey))\"); "
          + "schedule an item without one, and have its handler add the limited jobs")
    }
    // Nor a fairness key: its jobs would take no turn.
    if let fairnessKey = item.fairnessKey {
      throw ScheduleError.unsupported(
        "a schedule cannot carry a fairness key yet (the item's fairnessKey is \"\(LimitKey.printable(fairnessKey))\"); "
          + "schedule an item without one, and have its handler add the jobs with their keys")
    }
    return try ScheduleDefinition(
      name: name, timing: timing, payload: payload, priority: priority, timeLimit: timeLimit,
      deduplicationKey: key, deduplicationScope: scope, onConflict: item.onConflict)
  }

  /// Stores the schedules this code declares, in one transaction: new ones are added, changed
  /// ones updated (their slots already due fire first, with the old definition; the new one
  /// takes effect from the next slot; no slot fires twice), and declared schedules of this queue
  /// that `schedules` leaves out become inactive: kept and listed, never fired, until a
  /// declaration names them again. Schedules added with ``addSchedule(_:)`` are left alone, even
  /// one of a declared name (see ``ScheduleSaveSummary/heldByAdded``). Call it once at start, with every schedule; when several
  /// releases run side by side, the last to start decides.
  ///
  /// Every started queue of this identifier, in any process sharing the store, fires the due
  /// slots; each slot's job is added once.
  ///
  /// - Throws: ``ScheduleError/invalidName(_:)`` when two schedules share a name;
  ///   ``ScheduleError/unsupported(_:)`` for a store that keeps no schedules.
  @discardableResult
  public func declareSchedules(_ schedules: [ScheduleDefinition]) async throws -> ScheduleSaveSummary {
    try await save(schedules, origin: .declared)
  }

  /// Stores one schedule, or updates the one of its name, until ``removeSchedule(_:)``: for
  /// schedules made at run time, by a person or a program. A schedule of the same name that code
  /// declared becomes an added one.
  @discardableResult
  public func addSchedule(_ schedule: ScheduleDefinition) async throws -> ScheduleSaveSummary {
    try await save([schedule], origin: .added)
  }

  private func save(_ schedules: [ScheduleDefinition], origin: ScheduleOrigin) async throws
    -> ScheduleSaveSummary
  {
    let summary = try await store.saveSchedules(schedules, queue: identifier, origin: origin, clock: clock)
    announce(added: summary.added)
    return summary
  }

  /// This queue's stored schedules, by name.
  public func schedules() async throws -> [StoredSchedule] {
    try await store.schedules(queue: identifier)
  }

  /// Pauses a schedule: the slots already due fire first (in the same transaction), then no slot
  /// fires until ``resumeSchedule(_:)``, and the slots that come meanwhile are skipped. False when
  /// there is no schedule of that name.
  @discardableResult
  public func pauseSchedule(_ name: String) async throws -> Bool {
    guard let added = try await store.changeSchedulePause(true, name: name, queue: identifier, clock: clock)
    else {
      return false
    }
    announce(added: added)
    return true
  }

  /// Resumes a paused schedule from its next slot. False when there is no schedule of that name.
  @discardableResult
  public func resumeSchedule(_ name: String) async throws -> Bool {
    let found = try await store.changeSchedulePause(false, name: name, queue: identifier, clock: clock)
    wake.signal()
    return found != nil
  }

  /// Deletes a schedule; the jobs it added stay. False when there is no schedule of that name.
  @discardableResult
  public func removeSchedule(_ name: String) async throws -> Bool {
    try await store.removeSchedule(name: name, queue: identifier)
  }
}
