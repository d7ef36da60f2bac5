import Conveyor
import Foundation

extension JobStoreConformance {
  /// A schedule named `name` every `seconds`, carrying `text`.
  static func every(
    _ seconds: Int64, _ name: String = "s", text: String = "tick", catchUp: ScheduleTiming.CatchUp = .skip,
    priority: Int = 0, timeLimit: Duration? = nil
  ) throws -> ScheduleDefinition {
    try ScheduleDefinition(
      name: name, timing: try ScheduleTiming(every: .seconds(seconds), catchUp: catchUp),
      payload: Data(text.utf8), priority: priority, timeLimit: timeLimit)
  }

  /// The run dates of the queue's jobs, as seconds after `t0`, in ID order.
  static func runSeconds(_ store: any JobStore, _ queue: String = "q") async throws -> [Double] {
    try await store.jobs(queue: queue, status: nil, after: nil, limit: 1_000).map {
      $0.runAt.timeIntervalSince(t0)
    }
  }

  /// The stored schedule `name` of queue "q".
  static func stored(_ store: any JobStore, _ name: String = "s") async throws -> StoredSchedule {
    guard let found = try await store.schedules(queue: "q").first(where: { $0.name == name }) else {
      throw ConformanceFailure(description: "no stored schedule \(name)")
    }
    return found
  }

  /// `t0` is 1,700,000,000 s since 1970, a multiple of 100 (and of 20, 50): slots of intervals
  /// dividing it fall on whole offsets from it.
  static let scheduleChecks: [JobStoreCheck] = [
    check("a slot is not fired a fraction of a millisecond before its time") { store in
      _ = try await store.saveSchedules([try every(100)], queue: "q", origin: .declared, clock: now(1))
      // 0.4 ms before the slot: dates are kept to the millisecond, and rounding took this for it.
      let early = try await store.fireDueSchedules(queue: "q", clock: now(99.9996))
      try expect(early.added.isEmpty, "fired 0.4 ms early: \(early)")
      let due = try await store.fireDueSchedules(queue: "q", clock: now(100))
      try expect(due.added.count == 1, "fired at its slot: \(due)")
      let created = try await store.jobs(queue: "q", status: nil, after: nil, limit: 10).map(\.createdAt)
      try expect(created == [at(100)], "dated at its slot: \(created)")
    },
    check("a pause a fraction of a millisecond before a slot does not fire it early") { store in
      _ = try await store.saveSchedules([try every(100)], queue: "q", origin: .declared, clock: now(1))
      let added = try await store.changeSchedulePause(true, name: "s", queue: "q", clock: now(99.9996))
      try expect(added == [], "the pause fired the slot at 100 0.4 ms early: \(String(describing: added))")
    },
    check("a resume a fraction of a millisecond before a slot does not skip it") { store in
      _ = try await store.saveSchedules([try every(100)], queue: "q", origin: .declared, clock: now(1))
      _ = try await store.changeSchedulePause(true, name: "s", queue: "q", clock: now(50))
      _ = try await store.changeSchedulePause(false, name: "s", queue: "q", clock: now(99.9996))
      let resumed = try await stored(store)
      let fired = try await store.fireDueSchedules(queue: "q", clock: now(100.0004))
      try expect(
        fired.added.count == 1,
        "slot 100, still to come at the resume, is skipped: \(fired); stored \(resumed)")
    },
    check("a schedule saved a fraction of a millisecond before a slot fires that slot") { store in
      _ = try await store.saveSchedules([try every(100)], queue: "q", origin: .declared, clock: now(99.9996))
      let saved = try await stored(store)
      let fired = try await store.fireDueSchedules(queue: "q", clock: now(100.0004))
      try expect(fired.added.count == 1, "slot 100, after the save, never fires: \(fired); stored \(saved)")
    },
    check("a saved schedule round-trips and is due at its first slot after now") { store in
      let berlin = try ScheduleDefinition(
        name: "digest",
        timing: try ScheduleTiming(
          cron: "0 8 * * MON-FRI", timeZone: "Europe/Berlin", catchUp: .all(atMost: 7),
          jitter: .milliseconds(1_500)),
        payload: Data([0, 1, 255]), priority: -3, timeLimit: .seconds(90), deduplicationKey: "digest é",
        deduplicationScope: .completedWithin(.milliseconds(600_500)), onConflict: .replace)
      let sync = try every(100, "sync", catchUp: .latest)
      let summary = try await store.saveSchedules(
        [berlin, sync], queue: "q", origin: .declared, clock: now(1))
      try expect(Set(summary.created) == ["digest", "sync"], "both created: \(summary)")
      let listed = try await store.schedules(queue: "q")
      try expect(listed.map(\.name) == ["digest", "sync"], "listed by name: \(listed.map(\.name))")
      try expect(
        listed[0].definition == berlin && listed[1].definition == sync, "definitions round-trip: \(listed)")
      try expect(
        listed.allSatisfy { $0.origin == .declared && $0.active && !$0.paused && $0.lastSlot == nil },
        "declared, active, never fired: \(listed)")
      try expect(listed[1].createdAt == at(1) && listed[1].nextDue == at(100), "sync due at its first slot")
      try expect(
        listed[0].nextDue == berlin.timing.nextSlot(after: at(1)),
        "digest due at its first slot: \(listed[0])")
      let hint = try await store.nextWake(queue: "q", clock: now(1))
      try expect(hint.nextScheduleDue == at(100), "the hint names the earliest due schedule: \(hint)")
      try expect(hint.isFinished, "schedules do not keep a queue unfinished")
      try expect(try await store.schedules(queue: "r").isEmpty, "another queue has none")
      try expect(try await store.schedules(queue: nil).count == 2, "every queue's")
      // A zone keeps the name it was given ("UTC" is "GMT" to Foundation on Linux).
      let utc = try ScheduleDefinition(
        name: "utc", timing: try ScheduleTiming(cron: "@hourly"), payload: Data())
      _ = try await store.saveSchedules([utc], queue: "z", origin: .added, clock: now(1))
      let zoned = try await store.schedules(queue: "z")
      try expect(
        zoned.map(\.definition.timing.timeZoneName) == ["UTC"] && zoned.first?.definition == utc,
        "UTC round-trips: \(zoned)")
      try expect(listed[0].definition.timing.timeZoneName == "Europe/Berlin", "Berlin round-trips")
      let again = try await store.saveSchedules([berlin, sync], queue: "q", origin: .declared, clock: now(2))
      try expect(Set(again.unchanged) == ["digest", "sync"] && again.created.isEmpty, "unchanged: \(again)")
    },
    check("firing a due slot adds its job once, however often it is called") { store in
      _ = try await store.saveSchedules(
        [try every(100, priority: 4, timeLimit: .seconds(30))], queue: "q", origin: .added, clock: now(0))
      let early = try await store.fireDueSchedules(queue: "q", clock: now(99))
      try expect(early.added.isEmpty && early.nextDue == at(100), "nothing before the slot: \(early)")
      let fired = try await store.fireDueSchedules(queue: "q", clock: now(100))
      let id = try expectOne(fired.added)
      try expect(fired.nextDue == at(200), "next due at the next slot: \(fired)")
      let record = try await store.job(id)
      try expect(
        record?.runAt == at(100) && record.map(text) == "tick" && record?.priority == 4
          && record?.timeLimit == .seconds(30), "the slot's job: \(String(describing: record))")
      let twice = try await store.fireDueSchedules(queue: "q", clock: now(100))
      try expect(twice.added.isEmpty, "the slot fired already: \(twice)")
      let schedule = try await stored(store)
      try expect(schedule.lastSlot == at(100) && schedule.nextDue == at(200), "advanced: \(schedule)")
      try expect(
        try await store.fireDueSchedules(queue: "r", clock: now(200)).added.isEmpty, "only its queue")
      _ = try await store.fireDueSchedules(queue: "q", clock: now(230))
      let seconds = try await runSeconds(store)
      try expect(seconds == [100, 200], "one job per slot: \(seconds)")
    },
    check("a slot whose job would overlap the previous one's, still running, adds nothing") { store in
      let single = try ScheduleDefinition(
        name: "s", timing: try ScheduleTiming(every: .seconds(100)), payload: Data("tick".utf8),
        deduplicationKey: "only-one", deduplicationScope: .waitingOrRunning)
      _ = try await store.saveSchedules([single], queue: "q", origin: .added, clock: now(0))
      let first = try expectOne(try await store.fireDueSchedules(queue: "q", clock: now(100)).added)
      let running = try expectOne(try await claim(store, now: 101).claimed)
      try expect(running.id == first && running.deduplicationKey == "only-one", "the slot's job: \(running)")
      let during = try await store.fireDueSchedules(queue: "q", clock: now(200))
      try expect(during.added.isEmpty && during.nextDue == at(300), "merged with the running job: \(during)")
      try expect(try await stored(store).lastSlot == at(200), "the slot was considered")
      _ = try await claim(store, limit: 0, settling: [settle(running, .complete)], now: 250)
      let after = try await store.fireDueSchedules(queue: "q", clock: now(300))
      try expect(after.added.count == 1, "the next slot after it finished: \(after)")
    },
    check("many callers firing at once add each slot's job once") { store in
      _ = try await store.saveSchedules([try every(100)], queue: "q", origin: .added, clock: now(0))
      for slot in 1...5 {
        let seconds = Double(slot * 100)
        let added = try await withThrowingTaskGroup(of: Int.self) { group in
          for _ in 0..<8 {
            group.addTask { try await store.fireDueSchedules(queue: "q", clock: now(seconds)).added.count }
          }
          return try await group.reduce(0, +)
        }
        try expect(added == 1, "slot \(slot): \(added) jobs added")
      }
      try expect(try await runSeconds(store) == [100, 200, 300, 400, 500], "each slot once")
    },
    check("after downtime each catch-up policy fires exactly its slots") { store in
      // Slots at 100, 200, … ; firing first at 1,070: 1,000 (70 s old) is missed, the grace is 60 s.
      let policies: [(String, ScheduleTiming.CatchUp, [Double])] = [
        ("skip", .skip, []), ("latest", .latest, [1_000]), ("all3", .all(atMost: 3), [800, 900, 1_000]),
        ("all50", .all(atMost: 50), [100, 200, 300, 400, 500, 600, 700, 800, 900, 1_000]),
      ]
      for (name, policy, _) in policies {
        _ = try await store.saveSchedules(
          [try every(100, name, text: name, catchUp: policy)], queue: "q", origin: .added, clock: now(0))
      }
      let fired = try await store.fireDueSchedules(queue: "q", clock: now(1_070))
      let jobs = try await store.jobs(queue: "q", status: nil, after: nil, limit: 100)
      for (name, _, expected) in policies {
        let seconds = jobs.filter { text($0) == name }.map { $0.runAt.timeIntervalSince(t0) }
        try expect(seconds == expected, "\(name) fired \(seconds), not \(expected)")
      }
      try expect(
        fired.added.count == 14 && fired.nextDue == at(1_100), "fourteen jobs, due at 1,100: \(fired)")
      // On time again: every policy fires the next slot, once.
      let next = try await store.fireDueSchedules(queue: "q", clock: now(1_100))
      try expect(next.added.count == 4, "one each at 1,100: \(next)")
      // A slot within the grace is on time whatever the policy.
      let late = try await store.fireDueSchedules(queue: "q", clock: now(1_259))
      try expect(late.added.count == 4, "1,200 (59 s old) is on time for all four: \(late)")
    },
    check("a paused schedule fires nothing and skips the slots that pass while paused") { store in
      _ = try await store.saveSchedules(
        [try every(100, catchUp: .all(atMost: 100))], queue: "q", origin: .added, clock: now(0))
      try expect(try await store.setSchedulePaused(true, name: "s", queue: "q", clock: now(50)), "found")
      try expect(
        !(try await store.setSchedulePaused(true, name: "nope", queue: "q", clock: now(50))), "unknown")
      try expect(try await stored(store).paused, "paused")
      try expect(
        try await store.nextWake(queue: "q", clock: now(50)).nextScheduleDue == nil,
        "a paused schedule is not due")
      try expect(try await store.fireDueSchedules(queue: "q", clock: now(500)).added.isEmpty, "nothing fired")
      try expect(try await store.setSchedulePaused(false, name: "s", queue: "q", clock: now(510)), "resumed")
      let resumed = try await stored(store)
      try expect(!resumed.paused && resumed.nextDue == at(600), "due at the next slot: \(resumed)")
      _ = try await store.fireDueSchedules(queue: "q", clock: now(600))
      let seconds = try await runSeconds(store)
      try expect(seconds == [600], "the paused slots were skipped: \(seconds)")
    },
    check("a declaration retires the declared schedules it leaves out and keeps added ones") { store in
      _ = try await store.saveSchedules(
        [try every(100, "a"), try every(100, "b")], queue: "q", origin: .declared, clock: now(0))
      _ = try await store.saveSchedules([try every(100, "c")], queue: "q", origin: .added, clock: now(0))
      let summary = try await store.saveSchedules(
        [try every(100, "a")], queue: "q", origin: .declared, clock: now(50))
      try expect(summary.retired == ["b"] && summary.unchanged == ["a"], "b retired: \(summary)")
      let b = try await stored(store, "b")
      try expect(!b.active && b.nextDue == nil, "kept, inactive: \(b)")
      try expect(try await stored(store, "c").active, "an added schedule is left alone")
      let fired = try await store.fireDueSchedules(queue: "q", clock: now(100))
      try expect(fired.added.count == 2, "a and c fire, b does not: \(fired)")
      let back = try await store.saveSchedules(
        [try every(100, "a"), try every(100, "b")], queue: "q", origin: .declared, clock: now(350))
      try expect(back.updated == ["b"], "b declared again: \(back)")
      let active = try await stored(store, "b")
      try expect(active.active && active.nextDue == at(400), "active from its next slot: \(active)")
      _ = try await store.fireDueSchedules(queue: "q", clock: now(400))
      let bJobs = try await store.jobs(queue: "q", status: nil, after: nil, limit: 100).filter {
        text($0) == "tick" && $0.runAt == at(400)
      }
      try expect(bJobs.count == 3, "a, b and c fire at 400: \(bJobs.count)")
    },
    check("a changed schedule keeps its last slot: no slot fires twice or is skipped") { store in
      _ = try await store.saveSchedules(
        [try every(100, text: "old")], queue: "q", origin: .declared, clock: now(0))
      _ = try await store.fireDueSchedules(queue: "q", clock: now(100))
      let changed = try await store.saveSchedules(
        [try every(100, text: "new")], queue: "q", origin: .declared, clock: now(110))
      try expect(changed.updated == ["s"], "updated: \(changed)")
      try expect(
        try await store.fireDueSchedules(queue: "q", clock: now(110)).added.isEmpty, "100 fired already")
      _ = try await store.fireDueSchedules(queue: "q", clock: now(200))
      let jobs = try await store.jobs(queue: "q", status: nil, after: nil, limit: 10)
      try expect(jobs.map(text) == ["old", "new"], "the next slot has the new payload: \(jobs.map(text))")
      // A new spacing whose slot between the last one and now is on time fires at once.
      _ = try await store.saveSchedules(
        [try every(50, text: "fast")], queue: "q", origin: .declared, clock: now(260))
      let fast = try await stored(store)
      try expect(fast.nextDue == at(260), "due now: \(fast)")
      let fired = try await store.fireDueSchedules(queue: "q", clock: now(260))
      try expect(try expectOne(fired.added) > JobID(0), "the slot at 250 fired")
      let seconds = try await runSeconds(store)
      try expect(seconds == [100, 200, 250], "one job per slot: \(seconds)")
    },
    check("a pause skips only the slots that pass while paused, not one due before it") { store in
      // The slot at 100 comes due and is on time until 160; an operator pauses at 110, before any
      // process fired it, and resumes at 120. The slot passed before the pause, so it is not one
      // the pause skips: it is still on time and fires.
      _ = try await store.saveSchedules([try every(100)], queue: "q", origin: .added, clock: now(0))
      try expect(try await store.setSchedulePaused(true, name: "s", queue: "q", clock: now(110)), "paused")
      try expect(try await store.setSchedulePaused(false, name: "s", queue: "q", clock: now(120)), "resumed")
      _ = try await store.fireDueSchedules(queue: "q", clock: now(120))
      _ = try await store.fireDueSchedules(queue: "q", clock: now(200))
      let seconds = try await runSeconds(store)
      try expect(seconds == [100, 200], "the slot due before the pause was skipped: \(seconds)")
    },
    check("a changed spacing does not fire slots older than the grace before it was declared") { store in
      // Every 100 s, fired on time at 100 and 200; at 290 the code declares every 10 s. No process
      // was down: the slots 210 and 220 of the new spacing were never slots of the schedule, so no
      // catch-up policy has missed slots to fire (the new timing applies from the next slot).
      _ = try await store.saveSchedules(
        [try every(100, catchUp: .all(atMost: 100))], queue: "q", origin: .declared, clock: now(0))
      _ = try await store.fireDueSchedules(queue: "q", clock: now(100))
      _ = try await store.fireDueSchedules(queue: "q", clock: now(200))
      _ = try await store.saveSchedules(
        [try every(10, catchUp: .all(atMost: 100))], queue: "q", origin: .declared, clock: now(290))
      _ = try await store.fireDueSchedules(queue: "q", clock: now(290))
      let seconds = try await runSeconds(store)
      let beforeDeclaration = seconds.filter { $0 > 200 && $0 < 230 }
      try expect(
        beforeDeclaration.isEmpty,
        "slots of the new spacing from before the declaration were fired: \(beforeDeclaration) (all: \(seconds))"
      )
    },
    check("a slot that came due before a change of spacing still fires") { store in
      // Every 100 s, fired at 100. The slot at 200 comes due; at 205, before any process fired it
      // (a release being replaced around the slot), the code declares every 400 s (slots at 400,
      // 800…). The slot at 200 was the schedule's, on time, and not fired: changing the schedule
      // must not skip it.
      _ = try await store.saveSchedules([try every(100)], queue: "q", origin: .declared, clock: now(0))
      _ = try await store.fireDueSchedules(queue: "q", clock: now(100))
      _ = try await store.saveSchedules([try every(400)], queue: "q", origin: .declared, clock: now(205))
      _ = try await store.fireDueSchedules(queue: "q", clock: now(205))
      _ = try await store.fireDueSchedules(queue: "q", clock: now(400))
      let seconds = try await runSeconds(store)
      try expect(seconds == [100, 200, 400], "the slot at 200 was skipped: \(seconds)")
    },
    check("a declaration leaves an added schedule of the same name alone") { store in
      // An operator added "nightly" (conveyor schedule add); a later release declares a schedule
      // of the same name. Declarations leave added schedules alone: the operator's schedule keeps
      // its job, stays added, and is not retired by a declaration that leaves the name out.
      _ = try await store.saveSchedules(
        [try every(100, "nightly", text: "operator")], queue: "q", origin: .added, clock: now(0))
      _ = try await store.saveSchedules(
        [try every(100, "nightly", text: "code")], queue: "q", origin: .declared, clock: now(10))
      let after = try await stored(store, "nightly")
      try expect(
        after.origin == .added && after.definition.payload == Data("operator".utf8),
        "the declaration took over the added schedule: origin \(after.origin), payload "
          + "\(String(decoding: after.definition.payload, as: UTF8.self))")
      _ = try await store.saveSchedules([], queue: "q", origin: .declared, clock: now(20))
      let later = try await stored(store, "nightly")
      try expect(later.active, "the added schedule was retired by a declaration without it: \(later)")
    },
    check("an interval schedule made from its parts round-trips and is unchanged when declared again") {
      store in
      // `init(spacing:timeZone:)` is public and takes any zone; an interval ignores it.
      guard let berlin = TimeZone(identifier: "Europe/Berlin") else {
        throw ConformanceFailure(description: "no Europe/Berlin on this system")
      }
      let timing = try ScheduleTiming(spacing: .every(.seconds(100)), timeZone: berlin)
      let sync = try ScheduleDefinition(name: "sync", timing: timing, payload: Data("sync".utf8))
      _ = try await store.saveSchedules([sync], queue: "q", origin: .declared, clock: now(0))
      let listed = try await stored(store, "sync")
      try expect(listed.definition == sync, "read back as declared: \(listed.definition) vs \(sync)")
      let again = try await store.saveSchedules([sync], queue: "q", origin: .declared, clock: now(10))
      try expect(again.unchanged == ["sync"], "declared again as it was: \(again)")
    },
    check("a removed schedule is gone and its jobs stay") { store in
      _ = try await store.saveSchedules([try every(100)], queue: "q", origin: .added, clock: now(0))
      _ = try await store.fireDueSchedules(queue: "q", clock: now(100))
      try expect(try await store.removeSchedule(name: "s", queue: "q"), "removed")
      try expect(!(try await store.removeSchedule(name: "s", queue: "q")), "only once")
      try expect(try await store.schedules(queue: "q").isEmpty, "gone")
      try expect(try await store.fireDueSchedules(queue: "q", clock: now(200)).added.isEmpty, "never fires")
      try expect(try await runSeconds(store) == [100], "its job stays")
    },
    check("two schedules with one name in a save are refused and nothing is stored") { store in
      do {
        _ = try await store.saveSchedules(
          [try every(100), try every(200)], queue: "q", origin: .added, clock: now(0))
        throw ConformanceFailure(description: "a duplicate name was stored")
      } catch let error as ScheduleError {
        guard case .invalidName = error else { throw error }
      }
      try expect(try await store.schedules(queue: "q").isEmpty, "nothing stored")
    },
    check("a cron schedule made from its parts with an offset zone is refused or read back as saved") {
      store in
      // `init(spacing:timeZone:)` is public and takes any `TimeZone`; one made from an offset is
      // named "GMT+0500", which `init(cron:timeZone:)`, the stores' reading path, refuses.
      guard let plusFive = TimeZone(secondsFromGMT: 5 * 3_600) else {
        throw ConformanceFailure(description: "no +05:00 zone on this system")
      }
      let timing: ScheduleTiming
      do {
        timing = try ScheduleTiming(spacing: .cron(try CronExpression("@hourly")), timeZone: plusFive)
      } catch {
        return  // refused when made: nothing unreadable can be stored
      }
      let hourly = try ScheduleDefinition(name: "s", timing: timing, payload: Data("tick".utf8))
      _ = try await store.saveSchedules([hourly], queue: "q", origin: .declared, clock: now(0))
      let listed: [StoredSchedule]
      do {
        listed = try await store.schedules(queue: "q")
      } catch {
        throw ConformanceFailure(description: "a schedule the store took cannot be listed: \(error)")
      }
      try expect(listed.map(\.definition) == [hourly], "read back as saved: \(listed)")
      guard let slot = timing.nextSlot(after: at(0)) else {
        throw ConformanceFailure(description: "an hourly timing without a next slot")
      }
      _ = try await store.fireDueSchedules(queue: "q", clock: FixedJobClock(slot))
      let seconds = try await runSeconds(store)
      try expect(seconds == [slot.timeIntervalSince(t0)], "its next slot fired: \(seconds)")
    },
    check("a retirement skips only the slots that pass while inactive, not one due before it") { store in
      // The slot at 100 comes due and is on time until 160; at 110, before any process fired it, a
      // release that leaves the schedule out starts, and at 120 one that declares it again (a
      // rollback). The slot passed before the schedule became inactive, as a slot due before a
      // pause, which a pause fires: it is not one the inactivity skips.
      _ = try await store.saveSchedules([try every(100)], queue: "q", origin: .declared, clock: now(0))
      _ = try await store.saveSchedules([], queue: "q", origin: .declared, clock: now(110))
      _ = try await store.saveSchedules([try every(100)], queue: "q", origin: .declared, clock: now(120))
      _ = try await store.fireDueSchedules(queue: "q", clock: now(120))
      _ = try await store.fireDueSchedules(queue: "q", clock: now(200))
      let seconds = try await runSeconds(store)
      try expect(seconds == [100, 200], "the slot due before the retirement was lost: \(seconds)")
    },
    check("a slot due when a schedule's item changes gets the old item") { store in
      _ = try await store.saveSchedules(
        [try every(100, text: "old")], queue: "q", origin: .declared, clock: now(0))
      _ = try await store.saveSchedules(
        [try every(100, text: "new")], queue: "q", origin: .declared, clock: now(110))
      _ = try await store.fireDueSchedules(queue: "q", clock: now(110))
      _ = try await store.fireDueSchedules(queue: "q", clock: now(200))
      let jobs = try await store.jobs(queue: "q", status: nil, after: nil, limit: 10)
      try expect(
        jobs.map(text) == ["old", "new"] && jobs.map { $0.runAt } == [at(100), at(200)],
        "slot 100 old, 200 new: \(jobs.map(text)) \(jobs.map { $0.runAt.timeIntervalSince(t0) })")
    },
    check("pausing, resuming and pausing again at once fires each due slot once") { store in
      _ = try await store.saveSchedules(
        [try every(100, catchUp: .all(atMost: 100))], queue: "q", origin: .added, clock: now(0))
      for (paused, second) in [
        (true, 110.0), (false, 111), (true, 112), (false, 113), (true, 250), (false, 260),
      ] {
        _ = try await store.setSchedulePaused(paused, name: "s", queue: "q", clock: now(second))
      }
      _ = try await store.fireDueSchedules(queue: "q", clock: now(300))
      let seconds = try await runSeconds(store)
      try expect(seconds == [100, 200, 300], "each slot once, 200 by the pause at 250: \(seconds)")
    },
    check("an inactive schedule paused, declared again and resumed fires from its next slot") { store in
      _ = try await store.saveSchedules([try every(100)], queue: "q", origin: .declared, clock: now(0))
      _ = try await store.saveSchedules([], queue: "q", origin: .declared, clock: now(50))
      try expect(try await store.setSchedulePaused(true, name: "s", queue: "q", clock: now(60)), "paused")
      try expect(try await runSeconds(store).isEmpty, "an inactive schedule's pause fires nothing")
      _ = try await store.saveSchedules([try every(100)], queue: "q", origin: .declared, clock: now(150))
      let declared = try await stored(store)
      try expect(declared.active && declared.paused && declared.nextDue == nil, "active, paused: \(declared)")
      try expect(try await store.fireDueSchedules(queue: "q", clock: now(200)).added.isEmpty, "paused")
      _ = try await store.setSchedulePaused(false, name: "s", queue: "q", clock: now(210))
      _ = try await store.fireDueSchedules(queue: "q", clock: now(300))
      try expect(try await runSeconds(store) == [300], "from the slot after the resume")
    },
    check("a never-fired schedule paused after downtime fires what its catch-up policy fires") { store in
      _ = try await store.saveSchedules(
        [
          try every(100, "l", text: "l", catchUp: .latest),
          try every(100, "a", text: "a", catchUp: .all(atMost: 2)),
        ],
        queue: "q", origin: .added, clock: now(0))
      _ = try await store.setSchedulePaused(true, name: "l", queue: "q", clock: now(1_070))
      _ = try await store.setSchedulePaused(true, name: "a", queue: "q", clock: now(1_070))
      _ = try await store.setSchedulePaused(false, name: "l", queue: "q", clock: now(1_500))
      _ = try await store.setSchedulePaused(false, name: "a", queue: "q", clock: now(1_500))
      _ = try await store.fireDueSchedules(queue: "q", clock: now(1_600))
      let jobs = try await store.jobs(queue: "q", status: nil, after: nil, limit: 100)
      let l = jobs.filter { text($0) == "l" }.map { $0.runAt.timeIntervalSince(t0) }
      let a = jobs.filter { text($0) == "a" }.map { $0.runAt.timeIntervalSince(t0) }
      try expect(l == [1_000, 1_600] && a == [900, 1_000, 1_600], "latest \(l), all(2) \(a)")
    },
    check("a paused schedule given a new spacing skips the new slots of its pause when resumed") { store in
      _ = try await store.saveSchedules([try every(100)], queue: "q", origin: .declared, clock: now(0))
      _ = try await store.fireDueSchedules(queue: "q", clock: now(100))
      _ = try await store.setSchedulePaused(true, name: "s", queue: "q", clock: now(150))
      _ = try await store.saveSchedules([try every(50)], queue: "q", origin: .declared, clock: now(170))
      try expect(try await stored(store).nextDue == nil, "still paused")
      _ = try await store.setSchedulePaused(false, name: "s", queue: "q", clock: now(210))
      let resumed = try await stored(store)
      try expect(resumed.nextDue == at(250), "due at the new spacing's next slot: \(resumed)")
      _ = try await store.fireDueSchedules(queue: "q", clock: now(210))
      _ = try await store.fireDueSchedules(queue: "q", clock: now(250))
      try expect(try await runSeconds(store) == [100, 250], "200 came while paused")
    },
    check("spacings changed back and forth within a minute fire no slot twice") { store in
      _ = try await store.saveSchedules(
        [try every(100, catchUp: .all(atMost: 1_000))], queue: "q", origin: .declared, clock: now(0))
      _ = try await store.fireDueSchedules(queue: "q", clock: now(100))
      var second = 130.0
      for spacing: Int64 in [7, 100, 3, 100, 7, 1] {
        _ = try await store.saveSchedules(
          [try every(spacing, catchUp: .all(atMost: 1_000))], queue: "q", origin: .declared,
          clock: now(second))
        second += 4
      }
      _ = try await store.fireDueSchedules(queue: "q", clock: now(second))
      _ = try await store.fireDueSchedules(queue: "q", clock: now(200))
      let seconds = try await runSeconds(store)
      try expect(Set(seconds).count == seconds.count, "a slot fired twice: \(seconds)")
      try expect(seconds.allSatisfy { $0 == 100 || ($0 > 100 && $0 <= 200) }, "in range: \(seconds)")
    },
    check("a declaration held by an added schedule takes the name once the added one is removed") { store in
      _ = try await store.saveSchedules(
        [try every(100, "n", text: "operator")], queue: "q", origin: .added, clock: now(0))
      let held = try await store.saveSchedules(
        [try every(100, "n", text: "code")], queue: "q", origin: .declared, clock: now(10))
      try expect(held.heldByAdded == ["n"] && held.created.isEmpty && held.updated.isEmpty, "held: \(held)")
      try expect(try await store.removeSchedule(name: "n", queue: "q"), "removed")
      let taken = try await store.saveSchedules(
        [try every(100, "n", text: "code")], queue: "q", origin: .declared, clock: now(20))
      try expect(taken.created == ["n"] && taken.heldByAdded.isEmpty, "created: \(taken)")
      let after = try await stored(store, "n")
      try expect(after.origin == .declared && after.definition.payload == Data("code".utf8), "\(after)")
      _ = try await store.fireDueSchedules(queue: "q", clock: now(100))
      try expect(
        try await store.jobs(queue: "q", status: nil, after: nil, limit: 10).map(text) == ["code"], "")
    },
    check("a schedule that never runs twice at once keeps its key across a change of item") { store in
      func single(_ text: String) throws -> ScheduleDefinition {
        try ScheduleDefinition(
          name: "s", timing: try ScheduleTiming(every: .seconds(100)), payload: Data(text.utf8),
          deduplicationKey: "only-one", deduplicationScope: .waitingOrRunning)
      }
      _ = try await store.saveSchedules([try single("old")], queue: "q", origin: .declared, clock: now(0))
      _ = try await store.fireDueSchedules(queue: "q", clock: now(100))
      let running = try expectOne(try await claim(store, now: 101).claimed)
      _ = try await store.saveSchedules([try single("new")], queue: "q", origin: .declared, clock: now(150))
      let during = try await store.fireDueSchedules(queue: "q", clock: now(200))
      try expect(during.added.isEmpty, "a second job while the first runs: \(during)")
      _ = try await claim(store, limit: 0, settling: [settle(running, .complete)], now: 250)
      let next = try await store.fireDueSchedules(queue: "q", clock: now(300))
      try expect(next.added.count == 1, "the next slot after it finished: \(next)")
    },
    check("a schedule's deduplication key with a NUL in it round-trips, as a job's does") { store in
      // Jobs keep any key (PostgreSQL as bytes); a schedule's jobs carry the schedule's key.
      let keyed = try ScheduleDefinition(
        name: "s", timing: try ScheduleTiming(every: .seconds(100)), payload: Data("tick".utf8),
        deduplicationKey: "tenant\u{0}7", deduplicationScope: .waitingOrRunning)
      _ = try await store.saveSchedules([keyed], queue: "q", origin: .declared, clock: now(0))
      try expect(try await stored(store).definition == keyed, "read back as saved")
      let id = try expectOne(try await store.fireDueSchedules(queue: "q", clock: now(100)).added)
      try expect(try await store.job(id)?.deduplicationKey == "tenant\u{0}7", "the job carries the key")
    },
    check("a cron schedule moved to another zone on the night the clocks go back fires 02:30 once") { store in
      // 2023-10-29: Berlin and Paris go from 03:00 CEST back to 02:00 CET at 01:00 UTC, so 02:30 is
      // 00:30 UTC, then again 01:30 UTC. The schedule fires the first; at 01:10 UTC a release
      // moves it to Paris (same rules): the second 02:30 is not a new slot.
      func utc(_ day: Int, _ hour: Int, _ minute: Int) -> Date {
        let seconds: Int = (day - 28) * 86_400 + hour * 3_600 + minute * 60
        return Date(timeIntervalSince1970: 1_698_451_200 + Double(seconds))
      }
      func night(_ zone: String) throws -> ScheduleDefinition {
        try ScheduleDefinition(
          name: "s", timing: try ScheduleTiming(cron: "30 2 * * *", timeZone: zone), payload: Data(zone.utf8))
      }
      _ = try await store.saveSchedules(
        [try night("Europe/Berlin")], queue: "q", origin: .declared, clock: FixedJobClock(utc(28, 12, 0)))
      _ = try await store.fireDueSchedules(queue: "q", clock: FixedJobClock(utc(29, 0, 30)))
      _ = try await store.saveSchedules(
        [try night("Europe/Paris")], queue: "q", origin: .declared, clock: FixedJobClock(utc(29, 1, 10)))
      for minute in [10, 30, 31] {
        _ = try await store.fireDueSchedules(queue: "q", clock: FixedJobClock(utc(29, 1, minute)))
      }
      _ = try await store.fireDueSchedules(queue: "q", clock: FixedJobClock(utc(30, 1, 30)))
      let jobs = try await store.jobs(queue: "q", status: nil, after: nil, limit: 10)
      let runs: [Date] = jobs.map(\.runAt)
      let items: [String] = jobs.map(text)
      let expected: [Date] = [utc(29, 0, 30), utc(30, 1, 30)]
      try expect(
        runs == expected && items == ["Europe/Berlin", "Europe/Paris"], "02:30 once a night: \(runs) \(items)"
      )
    },
    check("a refused declaration adds no job of a due slot and changes no schedule") { store in
      _ = try await store.saveSchedules(
        [try every(100, "a", text: "old"), try every(100, "b")], queue: "q", origin: .declared, clock: now(0))
      do {
        // "a" changes while its slot at 100 is due (its old item would fire), then a name repeats.
        _ = try await store.saveSchedules(
          [try every(100, "a", text: "new"), try every(100, "c"), try every(200, "c")], queue: "q",
          origin: .declared, clock: now(110))
        throw ConformanceFailure(description: "a duplicate name was stored")
      } catch let error as ScheduleError {
        guard case .invalidName = error else { throw error }
      }
      try expect(try await runSeconds(store).isEmpty, "no job of the refused declaration")
      let listed = try await store.schedules(queue: "q")
      try expect(
        listed.map(\.name) == ["a", "b"] && listed.allSatisfy { $0.active && $0.lastSlot == nil },
        "unchanged: \(listed)")
      _ = try await store.fireDueSchedules(queue: "q", clock: now(110))
      try expect(
        try await store.jobs(queue: "q", status: nil, after: nil, limit: 10).map(text) == ["old", "tick"], "")
    },
  ]
}
