import Conveyor
import ConveyorTestSupport
import Foundation
import Testing

/// A queue's loop firing stored schedules, driven by a manual clock: slots across changes of
/// offset fire once each at the documented instant, and an idle queue with schedules calls its
/// store no more often than one without.
@Suite("Schedules fired by a queue")
struct ScheduleFiringTests {
  struct Tick: Queueable, Hashable {
    var name: String
  }

  /// A cron schedule across a change of offset, and the UTC instants of its slots over three
  /// days (computed independently with Python's `zoneinfo`, minute by minute).
  struct DaylightCase: Sendable, CustomStringConvertible {
    var description: String
    var zone: String
    var cron: String
    var start: String
    var expected: [String]
  }

  static let daylightCases = [
    DaylightCase(
      description: "Berlin spring: 02:30 is skipped and fires once at 03:00", zone: "Europe/Berlin",
      cron: "30 2 * * *", start: "2027-03-27T00:00:00Z",
      expected: ["2027-03-27T01:30:00Z", "2027-03-28T01:00:00Z", "2027-03-29T00:30:00Z"]),
    DaylightCase(
      description: "Berlin autumn: 02:30 occurs twice and fires once, at the first", zone: "Europe/Berlin",
      cron: "30 2 * * *", start: "2027-10-30T00:00:00Z",
      expected: ["2027-10-30T00:30:00Z", "2027-10-31T00:30:00Z", "2027-11-01T01:30:00Z"]),
    DaylightCase(
      description: "New York spring: 02:30 is skipped and fires once at 03:00", zone: "America/New_York",
      cron: "30 2 * * *", start: "2027-03-13T00:00:00Z",
      expected: ["2027-03-13T07:30:00Z", "2027-03-14T07:00:00Z", "2027-03-15T06:30:00Z"]),
    DaylightCase(
      description: "New York autumn: 01:30 occurs twice and fires once, at the first",
      zone: "America/New_York", cron: "30 1 * * *", start: "2027-11-06T00:00:00Z",
      expected: ["2027-11-06T05:30:00Z", "2027-11-07T05:30:00Z", "2027-11-08T06:30:00Z"]),
  ]

  static func date(_ text: String) -> Date {
    ISO8601DateFormatter().date(from: text) ?? .distantPast
  }

  /// A queue on `store` whose clock is `clock`, paused so the jobs its schedules add stay
  /// waiting where the test reads them.
  static func pausedQueue(_ store: any JobStore, clock: ManualJobClock) async throws -> JobQueue<Tick> {
    var configuration = JobQueueConfiguration(identifier: "ticks", pollInterval: .seconds(1))
    configuration.clock = clock
    configuration.autoStart = false
    let queue = try JobQueue<Tick>(configuration: configuration, store: store) { _, _ in .handled }
    try await queue.pause()
    return queue
  }

  /// The manual clock is stepped 30 minutes at a time over three days, each step once the
  /// queue's loop sleeps again: every slot falls on a step, so each is fired on time, once.
  @Test(arguments: daylightCases)
  func slotsAcrossAChangeOfOffsetFireOnceAtTheDocumentedInstant(_ daylight: DaylightCase) async throws {
    let clock = ManualJobClock(start: Self.date(daylight.start))
    let store = InMemoryJobStore()
    let queue = try await Self.pausedQueue(store, clock: clock)
    let timing = try ScheduleTiming(cron: daylight.cron, timeZone: daylight.zone)
    try await queue.declareSchedules([try queue.schedule("nightly", timing, item: Tick(name: "n"))])
    queue.start()
    let asleep = try await mostAsleep(on: clock)
    for _ in 0..<(3 * 48) {
      clock.advance(by: .seconds(1_800))
      try await waitUntilAsleep(asleep, on: clock)
    }
    await queue.shutdown()
    let jobs = try await store.jobs(queue: "ticks", status: nil, after: nil, limit: 100)
    let formatter = ISO8601DateFormatter()
    #expect(jobs.map { formatter.string(from: $0.runAt) } == daylight.expected)
  }

  /// The hint the loop reads on every idle turn carries the next due schedule, so a queue whose
  /// schedule is not due makes exactly the store calls of a queue without one.
  /// A schedule stores no ordering key, so an item with one is refused rather than fired out of
  /// order; nothing is stored.
  @Test func anItemWithAnOrderingKeyIsRefusedAsASchedulesItem() async throws {
    struct Ordered: Queueable { var orderingKey: String? { "order-1" } }
    let store = InMemoryJobStore()
    let queue = try JobQueue<Ordered>(
      configuration: .init(identifier: "ordered", autoStart: false), store: store
    ) {
      _, _ in .handled
    }
    #expect {
      _ = try queue.schedule("tick", try ScheduleTiming(every: .seconds(60)), item: Ordered())
    } throws: { error in
      guard case ScheduleError.unsupported(let message) = error else { return false }
      return message.contains("ordering key")
    }
    #expect(try await store.schedules(queue: nil).isEmpty)
  }

  @Test func anIdleQueueWithASchedulePollsTheStoreAsOftenAsOneWithout() async throws {
    func calls(withSchedule: Bool) async throws -> [String: Int] {
      let clock = ManualJobClock()
      let store = InstrumentedJobStore(InMemoryJobStore())
      let queue = try await Self.pausedQueue(store, clock: clock)
      if withSchedule {
        let daily = try ScheduleTiming(cron: "@daily")
        try await queue.declareSchedules([try queue.schedule("daily", daily, item: Tick(name: "d"))])
      }
      queue.start()
      let asleep = try await mostAsleep(on: clock)
      store.resetCalls()
      for _ in 0..<60 {
        clock.advance(by: .seconds(1))
        try await waitUntilAsleep(asleep, on: clock)
      }
      // The loop's calls: the history pruner is a task of its own, whose first turn may or may
      // not fall within the minute on a loaded machine (seen in a fresh-clone CI run).
      let counted = store.calls.filter { $0.key != "prune" }
      await queue.shutdown()
      return counted
    }
    let plain = try await calls(withSchedule: false)
    let scheduled = try await calls(withSchedule: true)
    #expect(scheduled == plain, "with a schedule due tomorrow: \(scheduled); without: \(plain)")
    #expect(plain["nextWake", default: 0] >= 60, "the loop looked at the store each second: \(plain)")
  }

  /// After downtime, a queue that starts fires the missed slots its catch-up policy names, once.
  @Test func aQueueStartingAfterDowntimeCatchesUpByItsPolicy() async throws {
    let clock = ManualJobClock()
    let store = InMemoryJobStore()
    let first = try await Self.pausedQueue(store, clock: clock)
    let every = try ScheduleTiming(every: .seconds(60), catchUp: .all(atMost: 3))
    try await first.declareSchedules([try first.schedule("minutely", every, item: Tick(name: "m"))])
    // No queue runs for ten minutes: ten slots pass.
    clock.advance(by: .seconds(600))
    let second = try await Self.pausedQueue(store, clock: clock)
    second.start()
    let caughtUp = await eventually(timeout: .seconds(30)) {
      store.peekAll(queue: "ticks").count == 3
    }
    await second.shutdown()
    #expect(caughtUp)
    let start = ManualJobClock().now()
    let seconds = store.peekAll(queue: "ticks").map { $0.runAt.timeIntervalSince(start) }.sorted()
    #expect(seconds == [480, 540, 600], "the latest three slots: \(seconds)")
  }

  /// A pause and a declaration fire the slots already due (see `StoredSchedule.pausing` and
  /// `redeclared`): those jobs are committed by this queue, so they are reported as enqueued, as
  /// the jobs its loop fires are (the metrics count enqueued jobs from these events).
  @Test func theJobsAPauseOrADeclarationFiresAreReportedAsEnqueued() async throws {
    let clock = ManualJobClock(start: Date(timeIntervalSince1970: 1_700_000_000))
    let store = InMemoryJobStore()
    let queue = try await Self.pausedQueue(store, clock: clock)
    let every = try ScheduleTiming(every: .seconds(100))
    try await queue.declareSchedules([
      try queue.schedule("p", every, item: Tick(name: "p")),
      try queue.schedule("d", every, item: Tick(name: "d")),
    ])
    let events = queue.events
    clock.advance(by: .seconds(110))  // the slot at 100 is due for both
    try await queue.pauseSchedule("p")
    try await queue.declareSchedules([
      try queue.schedule("p", every, item: Tick(name: "p")),
      try queue.schedule("d", every, item: Tick(name: "d2")),
    ])
    let marker = try await queue.add(Tick(name: "marker")).id
    var reported: [JobID] = []
    for await event in events {
      guard case .enqueued(let id) = event else { continue }
      if id == marker { break }
      reported.append(id)
    }
    let fired = try await store.jobs(queue: "ticks", status: nil, after: nil, limit: 10).map(\.id).filter {
      $0 != marker
    }
    #expect(fired.count == 2, "the pause and the declaration each fired the slot at 100: \(fired)")
    #expect(reported == fired, "reported \(reported) of \(fired)")
  }
}
