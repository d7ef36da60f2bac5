import Conveyor
import Foundation

extension QueueEngineConformance {
  /// Schedules fired and handled by running queues, on every store, on the system clock.
  static let scheduleChecks: [JobStoreCheck] = [
    check("a declared schedule's slots are added by the running queues and handled, each once") { store in
      let runs = Runs()
      func queue(_ worker: String) throws -> JobQueue<Named> {
        try JobQueue<Named>(configuration: configuration(pollInterval: .milliseconds(200)), store: store) {
          item, _ in
          runs.append(item.name)
          return .handled
        }
      }
      // Two queues of one identifier, as two processes would run: both fire, each slot once.
      let first = try queue("a")
      let second = try queue("b")
      let timing = try ScheduleTiming(every: .seconds(1))
      let summary = try await first.declareSchedules([
        try first.schedule("tick", timing, item: Named(name: "t"))
      ])
      try expect(summary.created == ["tick"], "stored: \(summary)")
      try await eventually("three slots handled", timeout: .seconds(60)) { runs.all.count >= 3 }
      await first.shutdown()
      await second.shutdown()
      let history = try await store.jobs(queue: "engine", status: nil, after: nil, limit: 1_000)
      let slots = history.map(\.runAt)
      try expect(Set(slots).count == slots.count, "no slot added twice: \(slots)")
      try expect(
        slots.allSatisfy { $0.timeIntervalSince1970.rounded(.down) == $0.timeIntervalSince1970 },
        "each job runs at its whole-second slot: \(slots)")
      let stored = try await first.schedules()
      try expect(stored.first?.lastSlot == slots.max(), "the last slot fired is stored: \(stored)")
    }
  ]
}
