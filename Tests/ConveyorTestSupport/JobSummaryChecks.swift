import Conveyor
import Foundation

/// Checks of ``JobStore/jobSummaries(queue:status:after:limit:payloadPrefix:errorPrefix:)`` and
/// ``JobStore/jobSummary(_:payloadPrefix:errorPrefix:)``: the pages and records of
/// ``JobStore/jobs(queue:status:after:limit:)`` and ``JobStore/job(_:)``, each payload cut to its
/// first bytes (its whole size kept) and each last error to its first Unicode scalars. Every
/// store's tests run them on a fresh store.
public enum JobSummaryChecks {
  static func expect(_ condition: Bool, _ message: @autoclosure () -> String, line: UInt = #line) throws {
    if !condition { throw ConformanceFailure(description: "line \(line): \(message())") }
  }

  /// A last error of 120,000 Unicode scalars of one to four bytes, combining marks among them.
  static let longError = String(repeating: "aé😀\u{301}", count: 30_000)

  /// Payloads of many sizes, in every status, beside another queue's jobs; errors short and long.
  public static func pagesMatchTheListing(_ store: any JobStore) async throws {
    let clock = FixedJobClock(Date(timeIntervalSince1970: 1_700_000_000))
    let sizes = [0, 1, 5, 99, 100, 101, 4096, 70_000, 300_000]
    var random = SeededRandom(seed: 5)
    var payloads: [Data] = []
    for size in sizes {
      payloads.append(Data((0..<size).map { _ in UInt8.random(in: 0...255, using: &random) }))
    }
    let jobs = payloads.map { NewJob(payload: $0, runAt: clock.now()) }
    _ = try await store.enqueue([NewJob(payload: Data("other".utf8))], queue: "other", clock: clock)
    _ = try await store.enqueue(jobs, queue: "s", clock: clock)
    _ = try await store.enqueue(
      [NewJob(payload: Data("later".utf8), runTime: .after(.seconds(3600)))], queue: "s", clock: clock)
    // One runs, two are dead: one with a short error, one with a long one.
    let lease = Lease(owner: "w1", duration: .seconds(60))
    let claimed = try await store.settleAndClaim([], queue: "s", limit: 3, lease: lease, clock: clock).claimed
    try expect(claimed.count == 3, "three claimed: \(claimed.count)")
    _ = try await store.settleAndClaim(
      [
        JobSettlement(claim: claimed[0].claim, action: .kill(error: "died")),
        JobSettlement(claim: claimed[1].claim, action: .kill(error: longError)),
      ], queue: "s", limit: 0,
      lease: lease,
      clock: clock)
    // Two complete with an output, one is cancelled: the history's pages, in the order they finished.
    let more = try await store.settleAndClaim([], queue: "s", limit: 2, lease: lease, clock: clock).claimed
    _ = try await store.settleAndClaim(
      more.map { JobSettlement(claim: $0.claim, action: .complete, output: Data("{\"n\":1}".utf8)) },
      queue: "s",
      limit: 0, lease: lease, clock: FixedJobClock(clock.now().addingTimeInterval(1)))
    let waiting = try await store.jobs(queue: "s", status: .pending, after: nil, limit: 1)
    _ = try await store.cancel(waiting.map(\.id), queue: "s", clock: clock)
    for status in [nil, JobStatus.pending, .running, .dead, .completed, .cancelled] {
      for limit in [1, 3, 100] {
        for (prefix, errorPrefix) in [(0, 0), (1, 3), (100, 100_001), (70_001, Int.max)] {
          var after: JobID?
          var pages = 0
          while true {
            let records = try await store.jobs(queue: "s", status: status, after: after, limit: limit)
            let summaries = try await store.jobSummaries(
              queue: "s", status: status, after: after, limit: limit, payloadPrefix: prefix,
              errorPrefix: errorPrefix)
            try expect(
              summaries.map(\.id) == records.map(\.id),
              "the same page (status \(String(describing: status)), limit \(limit), after \(String(describing: after))): "
                + "\(summaries.map(\.id)) vs \(records.map(\.id))")
            for (summary, record) in zip(summaries, records) {
              try expectSummary(summary, of: record, prefix: prefix, errorPrefix: errorPrefix)
            }
            pages += 1
            guard records.count == limit, let last = records.last, pages < 100 else { break }
            after = last.id
          }
        }
      }
    }
    // One job by ID; a missing one is nil; a negative prefix reads nothing.
    for record in try await store.jobs(queue: "s", status: nil, after: nil, limit: 100) {
      let summary = try await store.jobSummary(record.id, payloadPrefix: 100)
      try expect(summary != nil, "job \(record.id) found")
      if let summary { try expectSummary(summary, of: record, prefix: 100, errorPrefix: .max) }
      let cut = try await store.jobSummary(record.id, payloadPrefix: 7, errorPrefix: 201)
      if let cut { try expectSummary(cut, of: record, prefix: 7, errorPrefix: 201) }
      let none = try await store.jobSummary(record.id, payloadPrefix: -5, errorPrefix: -5)
      try expect(
        none?.record.payload.isEmpty == true && none?.payloadSize == record.payload.count, "prefix -5")
      try expect(none?.record.lastError == record.lastError.map { _ in "" }, "error prefix -5")
    }
    let dead = try await store.jobSummaries(
      queue: "s", status: .dead, after: nil, limit: 10, payloadPrefix: 0, errorPrefix: 4)
    try expect(
      Set(dead.compactMap(\.record.lastError)) == ["died", "aé😀\u{301}"],
      "errors cut by Unicode scalars: \(dead.map(\.record.lastError))")
    try expect(
      try await store.jobSummary(JobID(999_999_999), payloadPrefix: 10) == nil, "a missing job is nil")
    try expect(
      try await store.jobSummaries(queue: "s", status: nil, after: nil, limit: 0, payloadPrefix: 10).isEmpty,
      "a limit of 0 reads nothing")
  }

  static func expectSummary(_ summary: JobSummary, of record: JobRecord, prefix: Int, errorPrefix: Int) throws
  {
    var cut = record
    cut.payload = Data(record.payload.prefix(max(0, prefix)))
    cut.lastError = record.lastError.map { JobSummary.errorPrefix($0, errorPrefix) }
    // A summary holds no list of errors and no output.
    cut.errors = []
    cut.output = nil
    try expect(
      summary.record == cut,
      "job \(record.id): the record with its payload's first \(prefix) bytes, its error's first "
        + "\(errorPrefix) scalars")
    try expect(summary.payloadSize == record.payload.count, "job \(record.id): the whole size")
    try expect(
      summary.isPayloadComplete == (record.payload.count <= prefix), "job \(record.id): complete or not")
  }
}
