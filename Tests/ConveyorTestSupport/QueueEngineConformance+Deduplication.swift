import Conveyor
import Foundation
import Synchronization

extension QueueEngineConformance {
  /// An item that declares its deduplication key, scope and conflict choice.
  struct Scoped: Queueable, Hashable {
    var name: String
    var key: String
    var scope: Scope = .waiting
    var replaces = false

    /// ``DeduplicationScope`` as the item's stored form.
    enum Scope: Codable, Hashable {
      case waiting, waitingOrRunning
      case completedWithin(seconds: Int64)
    }

    var deduplicationKey: String? { key }
    var deduplicationScope: DeduplicationScope {
      switch scope {
      case .waiting: .waiting
      case .waitingOrRunning: .waitingOrRunning
      case .completedWithin(let seconds): .completedWithin(.seconds(seconds))
      }
    }
    var onConflict: DeduplicationConflict { replaces ? .replace : .useExisting }
  }

  /// Deduplication scopes and replacing through a queue, on every store.
  static let deduplicationChecks: [JobStoreCheck] = [
    check("a debounced item runs once, with the newest payload, at the newest delay") { store in
      var configuration = configuration()
      configuration.autoStart = false
      let runs = Mutex<[String]>([])
      let queue = try JobQueue<Scoped>(configuration: configuration, store: store) { item, _ in
        runs.withLock { $0.append(item.name) }
        return .handled
      }
      var ids: Set<JobID> = []
      for index in 0..<5 {
        let result = try await queue.add(
          Scoped(name: "save \(index)", key: "doc-1", replaces: true),
          delay: index < 4 ? .seconds(3_600) : .zero)
        try expect(result.outcome == (index == 0 ? .inserted : .replaced), "add \(index): \(result)")
        ids.insert(result.id)
      }
      try expect(ids.count == 1, "one job: \(ids)")
      queue.start()
      await queue.waitUntilFinished()
      await queue.shutdown()
      try expect(runs.withLock { $0 } == ["save 4"], "ran once, the newest: \(runs.withLock { $0 })")
    },
    check("the item's scope counts a running job and a completed one") { store in
      var configuration = configuration()
      configuration.autoStart = false
      let started = Mutex(false)
      let release = Mutex(false)
      let queue = try JobQueue<Scoped>(configuration: configuration, store: store) { item, _ in
        if item.name == "slow" {
          started.withLock { $0 = true }
          while !release.withLock({ $0 }) { try await Task.sleep(for: .milliseconds(5)) }
        }
        return .handled
      }
      let slow = try await queue.add(Scoped(name: "slow", key: "one", scope: .waitingOrRunning)).id
      queue.start()
      while !started.withLock({ $0 }) { try await Task.sleep(for: .milliseconds(5)) }
      let during = try await queue.add(Scoped(name: "again", key: "one", scope: .waitingOrRunning))
      try expect(during.outcome == .existing && during.id == slow, "the running job: \(during)")
      release.withLock { $0 = true }
      await queue.waitUntilFinished()
      let hourly = Scoped(name: "hourly", key: "one", scope: .completedWithin(seconds: 3_600))
      let afterwards = try await queue.add(hourly)
      try expect(
        afterwards.outcome == .existing && afterwards.id == slow, "completed within the hour: \(afterwards)")
      let after = try await queue.add(Scoped(name: "after", key: "one", scope: .waitingOrRunning))
      try expect(after.outcome == .inserted, "waitingOrRunning leaves the completed one out: \(after)")
      await queue.shutdown()
    },
    check("a scope the queue's retention cannot keep is refused, and nothing is stored") { store in
      for (retention, seconds, expected) in [
        (JobRetention(completed: .none), Int64(60), "retention.completed is .none"),
        (
          JobRetention(completed: .for(.seconds(600))), Int64(3_600),
          "outlives the queue's retention.completed"
        ),
        (JobRetention.default, Int64(0), "out of range"),
        (JobRetention.forever, Int64.max / 1_000, "out of range"),
      ] {
        var configuration = configuration()
        configuration.autoStart = false
        configuration.retention = retention
        let queue = try JobQueue<Scoped>(configuration: configuration, store: store) { _, _ in .handled }
        do {
          try await queue.add(Scoped(name: "x", key: "k", scope: .completedWithin(seconds: seconds)))
          throw ConformanceFailure(description: "\(seconds) s with \(retention) was taken")
        } catch JobQueueError.invalidDeduplication(let message) {
          try expect(message.contains(expected), "\(message)")
        }
        await queue.shutdown()
      }
      let counts = try await store.counts(queue: configuration().identifier, clock: SystemJobClock())
      try expect(counts.unfinished == 0 && counts.finished == 0, "nothing stored: \(counts)")
      // A period the retention keeps is taken.
      let queue = try JobQueue<Scoped>(configuration: configuration(), store: store) { _, _ in .handled }
      let taken = try await queue.add(Scoped(name: "x", key: "k", scope: .completedWithin(seconds: 3_600)))
      try expect(taken.outcome == .inserted, "a day's retention keeps an hour: \(taken)")
      await queue.shutdown()
    },
  ]
}
