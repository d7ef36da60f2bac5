import Conveyor
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import ConveyorPostgres

/// A cancel announces the running jobs it cancelled (`NOTIFY` on the schema's cancel channel, in
/// the cancel's own statement), and a queue that runs one of them, in any process, cancels its
/// handler on the notice instead of at its next periodic check of its claims.
struct CancelNoticeTests {
  struct Item: Queueable { var name: String }

  /// Two stores on one new schema of the shared server: two processes, as far as either can tell.
  func twoStores() async throws -> (PostgresJobStore, PostgresJobStore) {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("cancel_notice")
    return (
      try await openNamedStore(server, .init(schema: schema)),
      try await openNamedStore(server, .init(schema: schema))
    )
  }

  // Failed before the change (timed out waiting for the handler's cancellation): with no check
  // of the claims for ten minutes and heartbeats every 200 s, the worker had no way to learn of
  // the cancel within the test's minute.
  @Test func aRunningHandlerIsCancelledOnTheNoticeOfACancelInAnotherProcess() async throws {
    let (worker, canceller) = try await twoStores()
    var configuration = JobQueueConfiguration(
      identifier: "q", retryPolicy: .fixed(.zero), leaseDuration: .seconds(600))
    // Only the notice can reach the handler within the test's wait.
    configuration.claimCheckInterval = .seconds(600)
    let runs = Mutex<[String]>([])
    let queue = try JobQueue<Item>(configuration: configuration, store: worker) { item, context in
      runs.withLock { $0.append("\(item.name)\(context.attempts)") }
      do {
        try await Task.sleep(for: .seconds(600))
      } catch {
        runs.withLock { $0.append("cancelled") }
        throw error
      }
      return .handled
    }
    let id = try await queue.add(Item(name: "x")).id
    try await eventually("the handler to start", timeout: .seconds(60)) { runs.withLock { $0 } == ["x1"] }
    #expect(try await canceller.cancel([id], queue: "q", clock: SystemJobClock()) == [.cancelledRunning])
    try await eventually("the handler to be cancelled", timeout: .seconds(60)) {
      runs.withLock { $0.contains("cancelled") }
    }
    await queue.waitUntilFinished()
    await queue.shutdown()
    #expect(runs.withLock { $0 } == ["x1", "cancelled"], "not retried")
    #expect(try await worker.job(id)?.status == .cancelled)
    #expect(
      await eventually(timeout: .seconds(30)) { worker.listener?.subscriberCount == 0 },
      "a queue that stopped no longer subscribes")
    await worker.close()
    await canceller.close()
  }

  // Failed before the change: no notice ever came (the store announced nothing).
  @Test func aNoticeNamesTheRunningJobsACancelCancelledPerQueueAndNoWaitingOne() async throws {
    let (worker, canceller) = try await twoStores()
    let a = Notices(worker.cancellations(queue: "a"))
    let b = Notices(worker.cancellations(queue: "b"))
    try await a.listening()
    try await b.listening()
    let running = try await claim(2, in: "a", from: worker)
    let waiting = try await worker.enqueue([textJob()], queue: "a", clock: SystemJobClock())[0].id
    let other = try await claim(1, in: "b", from: worker)
    // A waiting job's cancel announces nothing: the next notice of "a" is the one below.
    #expect(try await canceller.cancel([waiting], queue: "a", clock: SystemJobClock()) == [.cancelledWaiting])
    let results = try await canceller.cancel(running + other, queue: nil, clock: SystemJobClock())
    #expect(results == [.cancelledRunning, .cancelledRunning, .cancelledRunning])
    try await eventually("the notices", timeout: .seconds(30)) { a.named.count == 1 && b.named.count == 1 }
    #expect(a.named == [Set(running)])
    #expect(b.named == [Set(other)])
    await worker.close()
    #expect(await a.ended(), "closing the store ends the announcements")
    #expect(await b.ended(), "closing the store ends the announcements")
    await canceller.close()
  }

  // Failed before the change: no notice came for the committed cancel either. With the NOTIFY
  // sent outside the cancel's transaction, the first notice would name the job whose cancel was
  // rolled back (notifications arrive in commit order).
  @Test func aCancelRolledBackAnnouncesNothing() async throws {
    let server = try await PostgresServer.shared()
    let (worker, canceller) = try await twoStores()
    let notices = Notices(worker.cancellations(queue: "a"))
    try await notices.listening()
    let running = try await claim(2, in: "a", from: worker)
    // The store's own cancel statement, in a transaction rolled back.
    let admin = try AdminConnection(server.url)
    // (Its fourth parameter: false cancels the jobs that are not held.)
    _ = try admin.query("PREPARE cancel_jobs(int8[], text, timestamptz, bool) AS \(worker.sql.cancel)")
    _ = try admin.query("BEGIN")
    let rows = try admin.query(
      "EXECUTE cancel_jobs(ARRAY[\(running[0].rawValue)]::int8[], 'a', NULL, false)")
    #expect(rows.first?[1] == "running", "the statement cancelled the running job before the rollback")
    _ = try admin.query("ROLLBACK")
    #expect(try await worker.job(running[0])?.status == .running)
    #expect(
      try await canceller.cancel([running[1]], queue: "a", clock: SystemJobClock()) == [.cancelledRunning])
    try await eventually("the committed cancel's notice", timeout: .seconds(30)) { !notices.named.isEmpty }
    #expect(notices.named == [[running[1]]], "the rolled-back cancel was never announced")
    await worker.close()
    await canceller.close()
  }

  // Failed before the fallback to "* queue": the cancel failed with PostgreSQL's "payload string
  // too long", its jobs left running.
  @Test func aCancelOfTooManyRunningJobsToNameAnnouncesItsQueueAndStillCommits() async throws {
    let (worker, canceller) = try await twoStores()
    let notices = Notices(worker.cancellations(queue: "a"))
    try await notices.listening()
    // 2,500 IDs from 1 take more than 8,000 bytes in decimal with their commas.
    let many = try await claim(2_500, in: "a", from: worker)
    let last = try await claim(1, in: "a", from: worker)
    let results = try await canceller.cancel(many, queue: "a", clock: SystemJobClock())
    #expect(results.allSatisfy { $0 == .cancelledRunning } && results.count == many.count)
    #expect(try await canceller.cancel(last, queue: "a", clock: SystemJobClock()) == [.cancelledRunning])
    try await eventually("both notices", timeout: .seconds(30)) { notices.afterListening.count == 2 }
    #expect(notices.afterListening == [nil, Set(last)], "the first names no job: check every claim")
    await worker.close()
    await canceller.close()
  }

  // Failed before the payload was split by Unicode scalars: a space followed by a combining mark
  // (a queue name that starts with one) is one `Character`, not " ", so the split fell on a later
  // space, the notice went to another queue ("b", told to check every claim) and never to the
  // queue whose job was cancelled.
  @Test func aQueueNameStartingWithACombiningMarkIsToldOfItsOwnCancels() async throws {
    let (worker, canceller) = try await twoStores()
    let name = "\u{301}a b"
    let own = Notices(worker.cancellations(queue: name))
    let other = Notices(worker.cancellations(queue: "b"))
    try await own.listening()
    try await other.listening()
    let running = try await claim(1, in: name, from: worker)
    #expect(try await canceller.cancel(running, queue: name, clock: SystemJobClock()) == [.cancelledRunning])
    // A later cancel in "b" orders the notices: once it is in, the first one has been handed out.
    let marker = try await claim(1, in: "b", from: worker)
    #expect(try await canceller.cancel(marker, queue: "b", clock: SystemJobClock()) == [.cancelledRunning])
    try await eventually("the notice of the cancel in b", timeout: .seconds(30)) {
      other.named.contains(Set(marker))
    }
    #expect(own.afterListening == [Set(running)], "the queue's own notice names its job")
    #expect(other.afterListening == [Set(marker)], "another queue hears only of its own cancels")
    await worker.close()
    await canceller.close()
  }

  @Test func payloadsAreReadAsTheCancelWritesThem() {
    func read(_ payload: String) -> (String?, Set<Int64>?) {
      let (queue, notice) = CancelPayload.parse(payload)
      return (queue, notice.jobs.map { Set($0.map(\.rawValue)) })
    }
    #expect(read("12,15 mail") == ("mail", [12, 15]))
    #expect(read("7 a queue with spaces") == ("a queue with spaces", [7]))
    #expect(read("7 \u{301}mail") == ("\u{301}mail", [7]), "a name that starts with a combining mark")
    #expect(read("* mail") == ("mail", nil))
    #expect(read("*") == (nil, nil))
    // What it cannot read concerns every claim: a check costs a read, a lost notice a cancel.
    #expect(read("1,x mail") == ("mail", nil))
    #expect(read("garbage") == (nil, nil))
  }

  /// Claims `count` new jobs of `queue` (in batches), and returns their IDs.
  func claim(_ count: Int, in queue: String, from store: PostgresJobStore) async throws -> [JobID] {
    _ = try await store.enqueue((0..<count).map { _ in textJob() }, queue: queue, clock: SystemJobClock())
    var claimed: [JobID] = []
    while claimed.count < count {
      let batch = try await store.settleAndClaim(
        [], queue: queue, limit: count - claimed.count, lease: Lease(owner: "test", duration: .seconds(600)),
        clock: SystemJobClock())
      #expect(!batch.claimed.isEmpty, "claims the jobs just added")
      if batch.claimed.isEmpty { break }
      claimed += batch.claimed.map(\.id)
    }
    return claimed
  }
}

/// Collects a subscription's notices on a task of its own.
final class Notices: Sendable {
  private let received = Mutex<[Set<JobID>?]>([])
  private let finished = Flag()
  private let task = Mutex<Task<Void, Never>?>(nil)

  init(_ stream: AsyncStream<CancellationNotice>?) {
    let reader = Task { [weak self] in
      guard let stream else {
        self?.finished.set()
        return
      }
      for await notice in stream { self?.received.withLock { $0.append(notice.jobs) } }
      self?.finished.set()
    }
    task.withLock { $0 = reader }
  }

  deinit { task.withLock { $0?.cancel() } }

  /// Waits for the first notice, the one every `LISTEN` gives (it names no job): the listener
  /// hears every cancel committed from now on.
  func listening() async throws {
    try await eventually("the listener's LISTEN", timeout: .seconds(30)) {
      self.received.withLock { !$0.isEmpty }
    }
    #expect(received.withLock { $0[0] } == nil)
  }

  /// The notices after the first (`LISTEN`'s).
  var afterListening: [Set<JobID>?] { received.withLock { Array($0.dropFirst()) } }
  /// The notices that name jobs.
  var named: [Set<JobID>] { received.withLock { $0.compactMap { $0 } } }

  /// Whether the subscription ends within 10 s.
  func ended() async -> Bool { await becomes(finished, within: 10) }
}
