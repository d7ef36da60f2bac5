import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import Conveyor

// Review 6, probes of promise 1 (the queue engine): per-worker decoders, the lock-free `emit`
// with its atomic subscriber count, and the worker's claim taking its next job under the same
// lock. No test asserts on elapsed time; waits are generous bounds.

private struct R6Item: Queueable, Hashable {
  var number: Int
  var when: Date = Date(timeIntervalSince1970: 1_234_567.891)
  var blob: Data = Data([0, 1, 2, 255])
  var ratio: Double = 0.1
  var note: String? = nil
  var nested: [String: [Int]] = ["a": [1, 2]]
}

private func r6Config(
  _ name: String, concurrency: Int, prefetch: Int = 0, poll: Duration = .milliseconds(50),
  log: (@Sendable (LogRecord) -> Void)? = nil
) -> JobQueueConfiguration {
  JobQueueConfiguration(
    identifier: name, retryPolicy: .fixed(.seconds(600)), concurrency: concurrency, prefetch: prefetch,
    leaseDuration: .seconds(120), pollInterval: poll, log: log)
}

/// A shared flag and number.
private final class R6Box: Sendable {
  private let flag = Atomic<Bool>(false)
  private let number = Atomic<Int>(0)
  var isSet: Bool { flag.load(ordering: .acquiring) }
  func set(_ value: Bool) { flag.store(value, ordering: .releasing) }
  var count: Int { number.load(ordering: .acquiring) }
  func add() { number.add(1, ordering: .acquiringAndReleasing) }
}

/// Counts per key, thread-safe.
private final class R6Tally: Sendable {
  private let counts = Mutex<[Int: Int]>([:])
  func add(_ key: Int) { counts.withLock { $0[key, default: 0] += 1 } }
  var all: [Int: Int] { counts.withLock { $0 } }
}

@Suite("Review6: queue engine", .timeLimit(.minutes(2)))
struct Review6EngineTests {
  // MARK: Exactly once, with events

  /// Every job handled once, with one `.started` and one `.succeeded` for a subscriber that
  /// subscribed before the jobs were added, at several concurrency and prefetch settings.
  @Test(arguments: [(1, 0), (4, 0), (4, 3), (8, 8), (3, 1)])
  func everyJobOnceWithItsEvents(concurrency: Int, prefetch: Int) async throws {
    for round in 0..<3 {
      let handled = R6Tally()
      let store = InMemoryJobStore()
      let queue = try JobQueue<R6Item>(
        configuration: r6Config("r6-once-\(round)", concurrency: concurrency, prefetch: prefetch),
        store: store
      ) { item, _ in
        handled.add(item.number)
        if item.number % 7 == 0 { await Task.yield() }
        return .handled
      }
      let recorder = EventRecorder(queue.events)
      let total = 400
      var ids: [JobID] = []
      for chunk in stride(from: 0, to: total, by: 50) {
        ids += try await queue.add(contentsOf: (chunk..<chunk + 50).map { R6Item(number: $0) }).map(\.id)
      }
      try await recorder.wait(for: "all succeeded") { events in
        events.filter { if case .succeeded = $0 { true } else { false } }.count >= total
      }
      await queue.waitUntilFinished()
      await queue.shutdown()
      let events = recorder.events
      var started: [JobID: Int] = [:]
      var succeeded: [JobID: Int] = [:]
      for event in events {
        switch event {
        case .started(let id, _): started[id, default: 0] += 1
        case .succeeded(let id): succeeded[id, default: 0] += 1
        default: break
        }
      }
      #expect(handled.all.count == total, "round \(round): \(handled.all.count) of \(total) handled")
      #expect(handled.all.values.allSatisfy { $0 == 1 }, "round \(round): a job ran twice")
      #expect(Set(started.keys) == Set(ids), "round \(round): \(started.count) started events")
      #expect(started.values.allSatisfy { $0 == 1 })
      #expect(Set(succeeded.keys) == Set(ids), "round \(round): \(succeeded.count) succeeded events")
      #expect(succeeded.values.allSatisfy { $0 == 1 })
      #expect(try await queue.count() == JobCounts())
    }
  }

  // MARK: Store errors during a worker's claim

  /// Store errors on many worker claims: no job lost, none run twice (leases are long, so a run
  /// twice would be the engine's), and the outcomes are recorded in the end.
  @Test(arguments: [1, 2, 4])
  func storeErrorsDuringWorkerClaimsLoseNothing(concurrency: Int) async throws {
    let store = InstrumentedJobStore()
    let handled = R6Tally()
    let queue = try JobQueue<R6Item>(
      configuration: r6Config("r6-errors", concurrency: concurrency, prefetch: 2, poll: .milliseconds(20)),
      store: store
    ) { item, _ in
      handled.add(item.number)
      // Every third job makes the next settle-and-claim fail (often a worker's own).
      if item.number % 3 == 0 { store.fail("settleAndClaim", times: 1) }
      return .handled
    }
    let recorder = EventRecorder(queue.events)
    let total = 300
    _ = try await queue.add(contentsOf: (0..<total).map { R6Item(number: $0) })
    try await eventually("every job handled", timeout: .seconds(60)) { handled.all.count >= total }
    try await eventually("nothing left in the store", timeout: .seconds(60)) {
      try await store.base.counts(queue: "r6-errors", clock: SystemJobClock()) == JobCounts()
    }
    await queue.shutdown()
    #expect(handled.all.count == total)
    let twice = handled.all.filter { $0.value != 1 }
    #expect(twice.isEmpty, "ran more than once: \(twice)")
    let succeeded = recorder.count { if case .succeeded = $0 { true } else { false } }
    #expect(succeeded == total, "\(succeeded) succeeded events")
    #expect((store.calls["settleAndClaim"] ?? 0) > 0)
  }

  /// A store error while a worker claims, with claimed jobs buffered by another claim: the
  /// worker picks up the buffered job (no job stays claimed and unstarted).
  @Test func aFailedClaimStillRunsBufferedJobs() async throws {
    let store = InstrumentedJobStore()
    let handled = R6Tally()
    let queue = try JobQueue<R6Item>(
      configuration: r6Config("r6-buffer", concurrency: 1, prefetch: 8, poll: .seconds(30)), store: store
    ) { item, _ in
      handled.add(item.number)
      store.fail("settleAndClaim", times: 1)
      return .handled
    }
    _ = try await queue.add(contentsOf: (0..<40).map { R6Item(number: $0) })
    try await eventually("every job handled", timeout: .seconds(60)) { handled.all.count >= 40 }
    await queue.waitUntilFinished()
    await queue.shutdown()
    #expect(handled.all.values.allSatisfy { $0 == 1 })
    #expect(try await store.base.counts(queue: "r6-buffer", clock: SystemJobClock()) == JobCounts())
  }

  // MARK: Subscriptions

  /// Subscriptions come and go on other tasks while jobs run. Each round subscribes, then adds
  /// a job: that subscription must see the job's `.started` and `.succeeded`. Afterwards the
  /// atomic count equals the dictionary's.
  @Test func churningSubscriptionsStillGetTheirJobsEvents() async throws {
    let store = InMemoryJobStore()
    let queue = try JobQueue<R6Item>(
      configuration: r6Config("r6-churn", concurrency: 4), store: store
    ) { _, _ in .handled }
    let stop = R6Box()
    let churners = (0..<4).map { _ in
      Task.detached {
        while !stop.isSet {
          let stream = queue.events
          let reader = Task { for await _ in stream {} }
          await Task.yield()
          reader.cancel()
          _ = await reader.value
        }
      }
    }
    for round in 0..<150 {
      let stream = queue.events
      let id = try await queue.add(R6Item(number: round)).id
      var sawStart = false
      var sawSuccess = false
      let reader = Task { () -> (Bool, Bool) in
        for await event in stream {
          switch event {
          case .started(id, _): sawStart = true
          case .succeeded(id): sawSuccess = true
          default: break
          }
          if sawStart && sawSuccess { break }
        }
        return (sawStart, sawSuccess)
      }
      let timeout = Task {
        try await Task.sleep(for: .seconds(20))
        reader.cancel()
      }
      let (start, success) = await reader.value
      timeout.cancel()
      #expect(start, "round \(round): no .started for job \(id)")
      #expect(success, "round \(round): no .succeeded for job \(id)")
      if !(start && success) { break }
    }
    stop.set(true)
    for churner in churners { await churner.value }
    // Every churned subscription terminated: none counted.
    let consistent = await eventually(timeout: .seconds(10)) {
      let inDictionary = queue.core.withLock { $0.subscribers.count }
      return queue.subscriberCount.load(ordering: .acquiring) == inDictionary && inDictionary == 0
    }
    #expect(
      consistent,
      "count \(queue.subscriberCount.load(ordering: .acquiring)), dictionary \(queue.core.withLock { $0.subscribers.count })"
    )
    await queue.shutdown()
  }

  /// A terminated subscription stops being counted; a live one keeps receiving `.started`.
  @Test func aTerminatedSubscriptionIsNotCounted() async throws {
    let store = InMemoryJobStore()
    let queue = try JobQueue<R6Item>(configuration: r6Config("r6-term", concurrency: 2), store: store) {
      _, _ in
      .handled
    }
    do {
      let stream = queue.events
      let reader = Task { for await _ in stream {} }
      #expect(queue.subscriberCount.load(ordering: .acquiring) == 1)
      reader.cancel()
      _ = await reader.value
    }
    #expect(await eventually(timeout: .seconds(10)) { queue.subscriberCount.load(ordering: .acquiring) == 0 })
    // A stream never read, dropped: terminated too.
    do { _ = queue.events }
    #expect(await eventually(timeout: .seconds(10)) { queue.subscriberCount.load(ordering: .acquiring) == 0 })
    let recorder = EventRecorder(queue.events)
    let id = try await queue.add(R6Item(number: 1)).id
    try await recorder.wait(for: "started and succeeded") { events in
      events.contains(.started(id, attempt: 1)) && events.contains(.succeeded(id))
    }
    await queue.shutdown()
  }

  // MARK: Decoding

  /// Workers' decoders decode as the queue's does (dates, data, doubles, optionals, nested), and
  /// undecodable payloads become dead jobs with a clear reason, with several workers at once.
  @Test func workerDecodersMatchTheQueuesAndBadPayloadsDie() async throws {
    let store = InMemoryJobStore()
    let seen = Log<R6Item>()
    let queue = try JobQueue<R6Item>(
      configuration: r6Config("r6-decode", concurrency: 4, prefetch: 2), store: store
    ) { item, _ in
      seen.append(item)
      return .handled
    }
    let recorder = EventRecorder(queue.events)
    var expected: [R6Item] = []
    var bad: [JobID] = []
    for number in 0..<200 {
      if number % 10 == 3 {
        bad += try await store.enqueue(
          [NewJob(payload: Data("{\"number\": \"not a number \(number)\"}".utf8))], queue: "r6-decode",
          clock: SystemJobClock()
        ).map(\.id)
      } else {
        let item = R6Item(
          number: number, when: Date(timeIntervalSince1970: Double(number) * 1_000.123_456_789),
          blob: Data((0..<UInt8(number % 50)).map { $0 }), ratio: Double(number) / 3,
          note: number.isMultiple(of: 2) ? nil : "n\(number)\u{1F600}",
          nested: ["k\(number)": [number, -number]])
        expected.append(item)
        _ = try await queue.add(item)
      }
    }
    try await recorder.wait(for: "all done") { events in
      events.filter {
        switch $0 {
        case .succeeded, .died: true
        default: false
        }
      }.count >= 200
    }
    await queue.shutdown()
    // What the queue's shared decoder makes of each payload.
    let reference = try await store.jobs(queue: "r6-decode", status: nil, after: nil, limit: .max)
    #expect(Set(seen.all) == Set(expected), "decoded items differ")
    #expect(seen.count == expected.count)
    #expect(Set(reference.map(\.id)) == Set(bad), "only the undecodable jobs remain")
    for record in reference {
      #expect(record.status == .dead)
      #expect(record.lastError?.contains("undecodable payload") == true, "\(record.lastError ?? "nil")")
      #expect(throws: (any Error).self) { try queue.item(of: record) }
    }
    let died = recorder.events.compactMap { event -> JobID? in
      if case .died(let id, let reason) = event, reason.contains("undecodable") { return id }
      return nil
    }
    #expect(Set(died) == Set(bad))
  }

  // MARK: Shutdown and pause mid-flight

  /// Shutdown while workers claim with prefetch: claimed jobs that never started are given back
  /// without using an attempt; after a restart every job runs exactly once in all.
  @Test(arguments: [1, 3])
  func shutdownMidFlightThenRestartRunsEveryJobOnce(concurrency: Int) async throws {
    for round in 0..<3 {
      let store = InMemoryJobStore()
      let handled = R6Tally()
      let name = "r6-shutdown-\(round)"
      let config = r6Config(name, concurrency: concurrency, prefetch: 4)
      let handler: JobQueue<R6Item>.Handler = { item, _ in
        handled.add(item.number)
        try? await Task.sleep(for: .milliseconds(1))
        return .handled
      }
      let queue = try JobQueue<R6Item>(configuration: config, store: store, handler: handler)
      let total = 200
      _ = try await queue.add(contentsOf: (0..<total).map { R6Item(number: $0) })
      try await eventually("some handled") { handled.all.count >= 20 + round * 20 }
      await queue.shutdown(gracePeriod: .seconds(30))
      let counts = try await store.counts(queue: name, now: Date())
      #expect(counts.running == 0, "round \(round): \(counts.running) jobs left running after shutdown")
      let waiting = try await store.jobs(queue: name, status: .pending, after: nil, limit: .max)
      #expect(waiting.allSatisfy { $0.attempts == 0 }, "round \(round): a released job used up an attempt")
      #expect(
        handled.all.count + waiting.count == total,
        "round \(round): handled \(handled.all.count) + waiting \(waiting.count)")
      let again = try JobQueue<R6Item>(configuration: config, store: store, handler: handler)
      await again.waitUntilFinished()
      await again.shutdown()
      #expect(handled.all.count == total)
      #expect(handled.all.values.allSatisfy { $0 == 1 }, "round \(round): a job ran twice")
    }
  }

  /// After `pause()` returns, a queue whose workers take their next job themselves starts no new
  /// handler from its buffer; `resume()` finishes the rest, each once.
  @Test func pauseStopsWorkersTakingBufferedJobs() async throws {
    let store = InMemoryJobStore()
    let handled = R6Tally()
    let paused = R6Box()
    let startedWhilePaused = R6Box()
    let queue = try JobQueue<R6Item>(
      configuration: r6Config("r6-pause", concurrency: 2, prefetch: 6), store: store
    ) { item, _ in
      if paused.isSet { startedWhilePaused.add() }
      handled.add(item.number)
      try? await Task.sleep(for: .milliseconds(2))
      return .handled
    }
    _ = try await queue.add(contentsOf: (0..<200).map { R6Item(number: $0) })
    try await eventually("some handled") { handled.all.count >= 30 }
    try await queue.pause()
    // Handlers already running may still be mid-start; give them a moment to get past the flag.
    try await Task.sleep(for: .milliseconds(50))
    paused.set(true)
    try await Task.sleep(for: .milliseconds(300))
    #expect(startedWhilePaused.count == 0, "handlers started while paused")
    paused.set(false)
    try await queue.resume()
    await queue.waitUntilFinished()
    await queue.shutdown()
    #expect(handled.all.count == 200)
    #expect(handled.all.values.allSatisfy { $0 == 1 })
  }
}
