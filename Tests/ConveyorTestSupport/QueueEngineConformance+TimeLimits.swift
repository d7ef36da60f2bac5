import Conveyor
import Foundation

extension QueueEngineConformance {
  /// Time limits, on every store: the queue's and a job's own, a handler that honours
  /// cancellation and one that ignores it.
  static let timeLimitChecks: [JobStoreCheck] = [
    check("a handler past its time limit is cancelled, and its attempt is recorded as timed out and retried")
    { store in
      var configuration = configuration()
      configuration.retryPolicy = .fixed(.zero)
      configuration.timeLimit = .milliseconds(500)
      configuration.autoStart = false
      let runs = Runs()
      let queue = try JobQueue<Named>(configuration: configuration, store: store) { item, context in
        runs.append("\(item.name)\(context.attempts)")
        guard context.attempts == 1 else { return .handled }
        do {
          try await Task.sleep(for: .seconds(600))
        } catch {
          runs.append("cancelled")
        }
        // Too late: the attempt was recorded as timed out when the limit passed.
        return .handled
      }
      let recorder = EventRecorder(queue.events)
      try await queue.add(Named(name: "x"))
      queue.start()
      await queue.waitUntilFinished()
      await queue.shutdown()
      try expect(
        Array(runs.all.prefix(3)) == ["x1", "cancelled", "x2"], "cancelled, then run again: \(runs.all)")
      let errors = recorder.events.compactMap { event -> String? in
        guard case .retryScheduled(_, _, let error) = event else { return nil }
        return error
      }
      try expect(errors.first == "timed out after 0.5 s", "the attempt's error: \(errors)")
      let counts = try await store.counts(queue: "engine", clock: SystemJobClock())
      try expect(counts.total == 0, "done: \(counts)")
    },
    check(
      "a handler that ignores cancellation is reported stuck, keeps its slot, and its late outcome is dropped"
    ) { store in
      var configuration = configuration()
      configuration.maxAttempts = 1
      configuration.timeLimit = .milliseconds(300)
      configuration.timeLimitGrace = .milliseconds(300)
      configuration.autoStart = false
      let release = Gate()
      let runs = Runs()
      let queue = try JobQueue<Named>(configuration: configuration, store: store) { item, _ in
        runs.append(item.name)
        if item.name == "stuck" { await release.wait() }  // ignores cancellation
        return .handled
      }
      let recorder = EventRecorder(queue.events)
      let stuck = try await queue.add(Named(name: "stuck")).id
      // A limit of its own, so a loaded machine cannot make this one time out too.
      try await queue.add(Named(name: "next"), timeLimit: .seconds(600))
      queue.start()
      // The attempt is recorded when the limit passes; on a slow store its record may come after
      // the stuck report: wait for both.
      try await recorder.wait(for: "the stuck event and the recorded death") { events in
        events.contains { if case .stuck(stuck, _) = $0 { true } else { false } }
          && events.contains { if case .died(stuck, _) = $0 { true } else { false } }
      }
      try expect(runs.all == ["stuck"], "the stuck handler keeps the only slot: \(runs.all)")
      let dead = try await store.job(stuck)
      try expect(
        dead?.status == .dead && dead?.lastError == "gave up after 1 attempt(s): timed out after 0.3 s",
        "recorded as timed out at the limit: \(String(describing: dead))")
      release.open()
      await queue.waitUntilFinished()
      await queue.shutdown()
      try expect(runs.all == ["stuck", "next"], "the next job ran once the slot freed: \(runs.all)")
      let after = try await store.job(stuck)
      try expect(
        after?.status == .dead, "what it returned late was not recorded: \(String(describing: after))")
      let counts = try await store.counts(queue: "engine", clock: SystemJobClock())
      try expect(
        counts == JobCounts(dead: 1, completed: 1), "the timed-out job is dead, the next done: \(counts)")
      // A store that keeps activity counts the stuck handler (what `conveyor status` shows).
      if store.recordsActivity {
        let minutes = try await store.activity(since: Date().addingTimeInterval(-3_600), limit: 100)
        let stuckCount = minutes.filter { $0.queue == "engine" }.reduce(Int64(0)) { $0 + $1.stuck }
        try expect(stuckCount == 1, "one stuck handler in the activity: \(minutes)")
      }
    },
    check("a job's own time limit overrides the queue's, shorter or longer") { store in
      var configuration = configuration()
      configuration.maxAttempts = 1
      configuration.timeLimit = .milliseconds(200)
      configuration.autoStart = false
      let runs = Runs()
      let queue = try JobQueue<Named>(configuration: configuration, store: store) { item, _ in
        switch item.name {
        case "short":
          // Waits until cancelled.
          do { try await Task.sleep(for: .seconds(600)) } catch { runs.append("short cancelled") }
        default:
          // Runs past the queue's limit, within its own.
          try await Task.sleep(for: .seconds(1))
          runs.append("long done")
        }
        return .handled
      }
      let short = try await queue.add(Named(name: "short"), timeLimit: .milliseconds(300)).id
      let long = try await queue.add(Named(name: "long"), timeLimit: .seconds(120)).id
      try expect(
        try await store.job(short)?.timeLimit == .milliseconds(300), "stored with the job")
      queue.start()
      await queue.waitUntilFinished()
      await queue.shutdown()
      let dead = try await store.job(short)
      try expect(
        dead?.status == .dead && dead?.lastError?.hasSuffix("timed out after 0.3 s") == true,
        "the short one timed out at its own limit: \(String(describing: dead))")
      try expect(try await store.job(long)?.status == .completed, "the long one ran to the end and is done")
      try expect(runs.all.contains("long done") && runs.all.contains("short cancelled"), "\(runs.all)")
    },
  ]
}
