import Conveyor
import Foundation
import Synchronization

extension QueueEngineConformance {
  /// An output a handler returns.
  struct Receipt: Codable, Hashable {
    var number: String
  }

  /// An output that does not encode as JSON.
  struct Unencodable: Encodable {
    func encode(to encoder: any Encoder) throws {
      throw EncodingError.invalidValue(
        self, .init(codingPath: [], debugDescription: "this output refuses to encode"))
    }
  }

  /// The history through a queue, on every store: what a handled, retried, dead or cancelled job
  /// keeps, outputs, and pruning by the queue's retention.
  static let historyChecks: [JobStoreCheck] = [
    check("a handled job keeps its output, its run time and its attempts' errors") { store in
      var configuration = configuration()
      configuration.retryPolicy = .fixed(.zero)
      configuration.autoStart = false
      let queue = try JobQueue<Named>(configuration: configuration, store: store) { item, context in
        if context.attempts == 1 { throw ConformanceFailure(description: "first attempt of \(item.name)") }
        return .handled(output: Receipt(number: "r-\(item.name)"))
      }
      let id = try await queue.add(Named(name: "a")).id
      queue.start()
      await queue.waitUntilFinished()
      await queue.shutdown()
      let record = try await queue.job(id)
      try expect(record?.status == .completed, "completed: \(String(describing: record))")
      try expect(record?.attempts == 2, "two attempts: \(String(describing: record?.attempts))")
      try expect(
        record?.errors == ["first attempt of a"],
        "the failed attempt's error: \(String(describing: record?.errors))")
      try expect(record?.finishedAt != nil && record?.runDuration != nil, "finished, with a run time")
      let receipt = try record.flatMap { try queue.output(of: $0, as: Receipt.self) }
      try expect(receipt == Receipt(number: "r-a"), "the output: \(String(describing: receipt))")
      // Another queue's job is not this queue's.
      let other = try JobQueue<Named>(configuration: Self.configuration("elsewhere"), store: store) { _, _ in
        .handled
      }
      try expect(try await other.job(id) == nil, "job(_:) finds only the queue's own jobs")
      await other.shutdown()
    },
    check("an output too large or that does not encode is not stored; the job completes and it is logged") {
      store in
      var configuration = configuration()
      configuration.autoStart = false
      let logs = Mutex<[LogRecord]>([])
      configuration.log = { record in logs.withLock { $0.append(record) } }
      let queue = try JobQueue<Named>(configuration: configuration, store: store) { item, _ in
        switch item.name {
        case "large": .handled(output: String(repeating: "x", count: JobHistory.maximumOutputBytes))
        case "fits": .handled(output: String(repeating: "y", count: JobHistory.maximumOutputBytes - 2))
        default: .handled(output: Unencodable())
        }
      }
      let large = try await queue.add(Named(name: "large")).id
      let fits = try await queue.add(Named(name: "fits")).id
      let refuses = try await queue.add(Named(name: "refuses")).id
      queue.start()
      await queue.waitUntilFinished()
      await queue.shutdown()
      for id in [large, refuses] {
        let record = try await store.job(id)
        try expect(
          record?.status == .completed && record?.output == nil,
          "completed, no output: \(String(describing: record))")
      }
      let kept = try await store.job(fits)
      try expect(
        kept?.output?.count == JobHistory.maximumOutputBytes,
        "an output of the limit is kept: \(kept?.output?.count ?? -1)")
      let errors = logs.withLock { $0 }.filter {
        $0.level == .error && $0.message == "job's output not stored"
      }
      try expect(errors.count == 2, "each refused output is logged: \(errors)")
      try expect(
        errors.contains { $0.metadata["reason"]?.contains("more than the 65536 a job may keep") == true },
        "the reason names the limit: \(errors)")
      try expect(
        errors.contains { $0.metadata["reason"]?.contains("does not encode") == true },
        "the reason says it does not encode: \(errors)")
    },
    check("retention none deletes completed and dead jobs when they finish; pruneHistory keeps the rest") {
      store in
      var configuration = configuration()
      configuration.autoStart = false
      configuration.maxAttempts = 1
      configuration.retention = JobRetention(completed: .none, cancelled: .forever, dead: .none)
      let queue = try JobQueue<Named>(configuration: configuration, store: store) { item, _ in
        item.name == "dies" ? .discard(reason: "no") : .handled
      }
      let done = try await queue.add(Named(name: "done")).id
      let dies = try await queue.add(Named(name: "dies")).id
      let cancelled = try await queue.add(Named(name: "cancelled")).id
      try expect(try await queue.cancel(cancelled) == .cancelledWaiting, "cancelled")
      queue.start()
      await queue.waitUntilFinished()
      await queue.shutdown()
      try expect(try await store.job(done) == nil, "a completed job is not kept")
      try expect(try await store.job(dies) == nil, "a dead job is not kept")
      try expect(try await queue.pruneHistory() == 0, "cancelled jobs are kept forever")
      try expect(try await store.job(cancelled)?.status == .cancelled, "the cancelled job is kept")
      try expect(try await queue.purge(.cancelled) == 1, "purge deletes it by hand")
    },
    check("a started queue prunes finished jobs older than their retention, and nothing else") { store in
      var configuration = configuration()
      configuration.autoStart = false
      configuration.retention = JobRetention(
        completed: .for(.milliseconds(300)), cancelled: .forever, dead: .days(30), interval: .seconds(1))
      let runs = Runs()
      let queue = try JobQueue<Named>(configuration: configuration, store: store) { item, _ in
        runs.append(item.name)
        return .handled
      }
      let done = try await queue.add(Named(name: "done")).id
      let waiting = try await queue.add(Named(name: "later"), delay: .seconds(3_600)).id
      let cancelled = try await queue.add(Named(name: "cancelled")).id
      _ = try await queue.cancel(cancelled)
      queue.start()
      try await waitFor("the job to run") { runs.all == ["done"] }
      // The first pass runs a second after the start; the completed job is older than 300 ms by
      // then (on a loaded machine it may be gone before this looks).
      try await waitFor("the pruner to delete the completed job") { try await store.job(done) == nil }
      await queue.shutdown()
      try expect(try await store.job(waiting)?.status == .pending, "a waiting job is never pruned")
      try expect(try await store.job(cancelled)?.status == .cancelled, "cancelled jobs are kept forever")
    },
    check("retention and purge refuse values that mean nothing, saying what to give") { store in
      for bad in [
        JobRetention(completed: .for(.zero)), JobRetention(cancelled: .for(.seconds(-1))),
        JobRetention(dead: .for(.seconds(Int64.max))), JobRetention(interval: .milliseconds(10)),
      ] {
        var configuration = configuration()
        configuration.retention = bad
        do {
          _ = try JobQueue<Named>(configuration: configuration, store: store) { _, _ in .handled }
          throw ConformanceFailure(description: "accepted \(bad)")
        } catch let error as JobQueueError {
          try expect("\(error)".contains("retention"), "the error names the setting: \(error)")
        }
      }
      var configuration = configuration()
      configuration.autoStart = false
      let queue = try JobQueue<Named>(configuration: configuration, store: store) { _, _ in .handled }
      for status in [JobStatus.pending, .running] {
        do {
          _ = try await queue.purge(status)
          throw ConformanceFailure(description: "purged \(status)")
        } catch let error as JobQueueError {
          try expect("\(error)".contains("finished jobs"), "says what purge deletes: \(error)")
        }
      }
      do {
        _ = try await queue.purge(.completed, olderThan: .seconds(-1))
        throw ConformanceFailure(description: "a negative age was accepted")
      } catch is JobQueueError {}
      await queue.shutdown()
    },
  ]
}
