import Conveyor
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

// The examples of the "Durable queues" guide (Sources/Conveyor/Conveyor.docc/DurableQueues.md),
// of the "Schedules" guide (Schedules.md), of the "Ordering keys" guide (OrderingKeys.md) and of the module's landing page (Conveyor.md), verbatim between the markers, so they compile
// and run. Types the examples declare are at file scope here.

private struct Thumbnail: Queueable {
  var photoID: Int
  var deduplicationKey: String? { "photo-\(photoID)" }  // one waiting job per photo
}

private struct Reminder: Queueable { var text: String }

// DurableQueues.md, "Deduplication scopes and debouncing": the types.
private struct SyncAccount: Queueable {
  var accountID: String
  var deduplicationKey: String? { "sync-\(accountID)" }
  var deduplicationScope: DeduplicationScope { .completedWithin(.seconds(3_600)) }  // at most one per hour
}

private struct SaveDraft: Queueable {
  var documentID: String
  var text: String
  var deduplicationKey: String? { documentID }
  var onConflict: DeduplicationConflict { .replace }  // each save replaces the waiting one
}

private struct Email: Queueable { var to: String }

// OrderingKeys.md: the type.
private struct OrderEvent: Queueable {
  var orderID: String
  var action: String
  var orderingKey: String? { orderID }  // one order's events in turn
}

// ConcurrencyLimits.md: the type, and an export that notes how many run as it starts.
private struct Export: Queueable {
  var table: String
  static let running = Mutex((now: 0, seen: [Int]()))
  func run() async throws {
    Self.running.withLock {
      $0.now += 1
      $0.seen.append($0.now)
    }
    try await Task.sleep(for: .milliseconds(5))
    Self.running.withLock { $0.now -= 1 }
  }
}

// ConcurrencyLimits.md, fair shares: the type.
private struct Report: Queueable {
  var tenant: String
  var fairnessKey: String? { tenant }
}

// Schedules.md: the type.
private struct SendDigest: Queueable {
  var edition: String
}

@Suite("Guide snippets: durable queues", .timeLimit(.minutes(10)))
struct QueueGuideSnippetTests {
  @Test func aQueueWithPrioritiesRetriesAndDeduplication() async throws {
    // DurableQueues.md example 1 begins
    var configuration = JobQueueConfiguration(identifier: "thumbnails")
    configuration.concurrency = 4
    configuration.retryPolicy = .exponential(initial: .seconds(1), maximum: .seconds(300))
    configuration.maxAttempts = 8

    let thumbnails = try JobQueue<Thumbnail>(configuration: configuration, store: InMemoryJobStore()) {
      thumbnail, context in
      print("photo \(thumbnail.photoID), attempt \(context.attempts)")
      return .handled  // or .retry, .retry(after:), .discard(reason:); a thrown error retries
    }
    let first = try await thumbnails.add(Thumbnail(photoID: 7), priority: 10)
    let again = try await thumbnails.add(Thumbnail(photoID: 7))
    // again.id == first.id and again.inserted == false, unless the job had already started
    await thumbnails.waitUntilFinished()
    await thumbnails.shutdown()
    // DurableQueues.md example 1 ends
    #expect(first.inserted)
    if !again.inserted { #expect(again.id == first.id) }
    #expect(try await thumbnails.count().total == 0)
  }

  @Test func declaredSchedulesAreStoredAndFire() async throws {
    let store = InMemoryJobStore()
    // Schedules.md example begins
    let digests = try JobQueue<SendDigest>(configuration: .init(identifier: "digests"), store: store) {
      item, _ in
      // send the digest...
      return .handled
    }
    let morning = try ScheduleTiming(cron: "0 8 * * MON-FRI", timeZone: "Europe/Berlin", catchUp: .latest)
    let hourly = try ScheduleTiming(every: .seconds(3_600), catchUp: .all(atMost: 24))
    try await digests.declareSchedules([
      try digests.schedule("weekday-digest", morning, item: SendDigest(edition: "morning")),
      try digests.schedule("hourly-digest", hourly, item: SendDigest(edition: "hourly"), priority: -1),
    ])
    // Schedules.md example ends
    let stored = try await digests.schedules()
    #expect(stored.map(\.name) == ["hourly-digest", "weekday-digest"])
    #expect(stored.allSatisfy { $0.fires && $0.nextDue != nil && $0.origin == .declared })
    let again = try await digests.declareSchedules([
      try digests.schedule("hourly-digest", hourly, item: SendDigest(edition: "hourly"), priority: -1)
    ])
    #expect(again.unchanged == ["hourly-digest"] && again.retired == ["weekday-digest"])
    await digests.shutdown()
  }

  @Test func scopedAndDebouncedItems() async throws {
    let store = InMemoryJobStore()
    let drafts = try JobQueue<SaveDraft>(
      configuration: .init(identifier: "drafts", autoStart: false), store: store
    ) { _, _ in .handled }
    // DurableQueues.md deduplication example begins
    let saved = try await drafts.add(SaveDraft(documentID: "d1", text: "Hello"), delay: .seconds(5))
    // saved.outcome is .inserted the first time, then .replaced while that job waits
    // DurableQueues.md deduplication example ends
    let again = try await drafts.add(SaveDraft(documentID: "d1", text: "Hello, world"), delay: .seconds(5))
    #expect(saved.outcome == .inserted && again.outcome == .replaced && again.id == saved.id)
    let syncs = try JobQueue<SyncAccount>(
      configuration: .init(identifier: "syncs", autoStart: false), store: store
    ) { _, _ in .handled }
    let first = try await syncs.add(SyncAccount(accountID: "a"))
    syncs.start()
    await syncs.waitUntilFinished()
    let within = try await syncs.add(SyncAccount(accountID: "a"))
    #expect(within.outcome == .existing && within.id == first.id, "completed within the hour")
    await syncs.shutdown()
    await drafts.shutdown()
  }

  @Test func aMonitorTaskReportsDeadJobsAndEndsAtShutdown() async throws {
    let thumbnails = try JobQueue<Thumbnail>(
      configuration: .init(identifier: "thumbnails"), store: InMemoryJobStore()
    ) { thumbnail, _ in .discard(reason: "no photo \(thumbnail.photoID)") }
    // DurableQueues.md example 2 begins
    let events = thumbnails.events  // the subscription starts here
    let monitor = Task {
      for await event in events {
        if case .died(let id, let reason) = event { print("job \(id) died: \(reason)") }
        if case .stateChanged(.stopped) = event { break }  // the stream itself does not end
      }
    }
    // DurableQueues.md example 2 ends
    try await thumbnails.add(Thumbnail(photoID: 8))
    try await eventually("the job died", timeout: .seconds(240)) { try await thumbnails.count().dead == 1 }
    await thumbnails.shutdown()
    await monitor.value  // ends: it saw the queue stop
  }

  @Test func aManualClockMakesARetryTakeNoTime() async throws {
    // DurableQueues.md example 3 begins
    let clock = ManualJobClock()
    let reminders = try JobQueue<Reminder>(
      configuration: .init(identifier: "reminders", clock: clock), store: InMemoryJobStore()
    ) { _, context in
      context.attempts == 1 ? .retry : .handled  // the first attempt asks for the 15 s retry
    }
    try await reminders.add(Reminder(text: "call Ada"))
    while try await reminders.count() != JobCounts(scheduled: 1) {  // until the retry is scheduled
      try await Task.sleep(for: .milliseconds(1))
    }
    clock.advance(by: .seconds(15))  // the retry is due now, without waiting 15 s
    await reminders.waitUntilFinished()
    await reminders.shutdown()
    // DurableQueues.md example 3 ends
    #expect(try await reminders.count().total == 0)
  }

  @Test func orderEventsRunInTurnPerOrder() async throws {
    let store = InMemoryJobStore()
    let handled = Log<String>()
    // OrderingKeys.md example begins
    let events = try JobQueue<OrderEvent>(configuration: .init(identifier: "order-events"), store: store) {
      event, _ in
      // call the partner's API for the event...
      handled.append("\(event.orderID) \(event.action)")
      return .handled
    }
    try await events.add(OrderEvent(orderID: "A-17", action: "create"))
    try await events.add(OrderEvent(orderID: "A-17", action: "cancel"))  // held until "create" finished
    try await events.add(OrderEvent(orderID: "B-4", action: "create"))  // runs beside A-17's jobs
    // OrderingKeys.md example ends
    await events.waitUntilFinished()
    await events.shutdown()
    let order = handled.all
    #expect(order.count == 3)
    #expect(order.firstIndex(of: "A-17 create")! < order.firstIndex(of: "A-17 cancel")!, "\(order)")
  }

  @Test func exportsRunAtMostTwoAtOnceAcrossProcesses() async throws {
    let store = InMemoryJobStore()
    // ConcurrencyLimits.md example begins
    let exports = try JobQueue<Export>(
      configuration: .init(identifier: "exports", concurrency: 8), store: store
    ) { export, _ in
      try await export.run()  // at most 2 exports run at once, in every process sharing the store
      return .handled
    }
    try await exports.setLimits(QueueLimits(concurrency: 2))
    // ConcurrencyLimits.md example ends
    for table in ["orders", "invoices", "customers", "payments", "refunds"] {
      try await exports.add(Export(table: table))
    }
    await exports.waitUntilFinished()
    await exports.shutdown()
    let seen = Export.running.withLock { $0.seen }
    #expect(seen.count == 5 && seen.allSatisfy { $0 <= 2 }, "exports at once as each started: \(seen)")
  }

  @Test func fairSharesTakeEachTenantsReportsInTurn() async throws {
    let ran = Mutex([String]())
    let reports = try JobQueue<Report>(
      configuration: .init(identifier: "reports", concurrency: 1, autoStart: false), store: InMemoryJobStore()
    ) { report, _ in
      ran.withLock { $0.append(report.tenant) }
      return .handled
    }
    for _ in 1...3 { try await reports.add(Report(tenant: "acme")) }
    // ConcurrencyLimits.md fair shares example begins
    try await reports.add(Report(tenant: "acme"))
    // ConcurrencyLimits.md fair shares example ends
    try await reports.add(Report(tenant: "globex"))
    reports.start()
    await reports.waitUntilFinished()
    await reports.shutdown()
    let order = ran.withLock { $0 }
    #expect(order == ["acme", "globex", "acme", "acme", "acme"], "globex's report second: \(order)")
  }

  @Test func theLandingPageExample() async throws {
    // Conveyor.md example begins
    let queue = try JobQueue<Email>(
      configuration: .init(identifier: "emails", maxAttempts: 5), store: InMemoryJobStore()
    ) { email, context in
      print("sending to \(email.to), attempt \(context.attempts)")
      return .handled
    }
    try await queue.add(Email(to: "ada@example.com"))
    // Conveyor.md example ends
    await queue.waitUntilFinished()
    await queue.shutdown()
  }
}
