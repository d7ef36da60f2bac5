import Conveyor
import Foundation

/// A job found by `JobStore.expectJob(of:in:status:count:where:)`: its decoded item and
/// its record (ID, status, attempts, run date, last error).
public struct FoundJob<Item: Queueable>: Sendable {
  /// The job's payload, decoded as a worker would decode it.
  public var item: Item
  /// The job as the store holds it.
  public var record: JobRecord

  /// Creates a found job.
  public init(item: Item, record: JobRecord) {
    self.item = item
    self.record = record
  }
}

/// An expectation about a store's jobs that did not hold.
///
/// Its ``description`` says what was expected and lists what was found (at most
/// ``listedJobLimit`` jobs), so a test framework that prints a thrown error (Swift Testing,
/// XCTest) shows the whole story.
public struct JobExpectationError: Error, CustomStringConvertible, Sendable {
  /// What was expected, in words.
  public var expected: String
  /// The queue's jobs that were looked at (at most ``listedJobLimit``).
  public var found: [JobRecord]
  /// How many jobs the queue held (of the status looked at).
  public var total: Int
  /// How many of them decoded as the expected type and matched the condition.
  public var matching: Int
  /// Jobs whose payload did not decode as the expected type, with the decoder's error (at most
  /// ``listedJobLimit``).
  public var undecodable: [String]

  /// How many jobs an error lists at most.
  public static let listedJobLimit = 10

  /// Creates the error.
  public init(expected: String, found: [JobRecord], total: Int, matching: Int, undecodable: [String] = []) {
    self.expected = expected
    self.found = found
    self.total = total
    self.matching = matching
    self.undecodable = undecodable
  }

  /// What was expected, and the jobs found.
  public var description: String {
    var text = "expected \(expected), but found \(matching) matching job(s) among \(total)"
    if found.isEmpty { return text + " (the queue holds no such job; handled jobs are deleted)" }
    // No clock here to tell ready from scheduled jobs: pending ones show their run date.
    text += ":\n" + found.map { "  " + JobListing.describe($0, now: nil) }.joined(separator: "\n")
    if total > found.count { text += "\n  … and \(total - found.count) more" }
    if !undecodable.isEmpty {
      text +=
        "\nNot decodable as the expected type:\n" + undecodable.map { "  " + $0 }.joined(separator: "\n")
    }
    return text
  }
}

extension JobStore {
  /// Checks that `queue` holds jobs of `type` matching `predicate`, and returns them (decoded) with
  /// their records, in ID order.
  ///
  /// ```swift
  /// let sent = try await store.expectJob(of: SendEmail.self, in: "emails") { $0.to == "ada@example.com" }
  /// #expect(sent[0].record.attempts == 0)
  /// ```
  ///
  /// Handled jobs are deleted, so only waiting, running and dead jobs can be found. Jobs whose
  /// payload does not decode as `Item` never match (they are listed in the error).
  ///
  /// - Parameters:
  ///   - type: the item type the jobs decode as.
  ///   - queue: the queue's identifier.
  ///   - status: only jobs with this status; nil (the default) for any job that is not history:
  ///     pending, running or dead (pass `.completed` or `.cancelled` to search the history).
  ///   - count: exactly this many must match (0 or more); nil (the default) means at least one.
  ///   - predicate: which items match; every item by default. An error it throws is rethrown.
  /// - Returns: the matching jobs, at least one (or exactly `count`).
  /// - Throws: ``JobExpectationError`` listing the queue's jobs when too few or too many match;
  ///   the store's errors.
  @discardableResult
  public func expectJob<Item: Queueable>(
    of type: Item.Type, in queue: String, status: JobStatus? = nil, count: Int? = nil,
    where predicate: (Item) throws -> Bool = { _ in true }
  ) async throws -> [FoundJob<Item>] {
    let search = try await findJobs(of: type, in: queue, status: status, where: predicate)
    let holds = count.map { search.matching.count == $0 } ?? !search.matching.isEmpty
    guard holds else {
      // A negative count never holds; the message says why.
      let amount =
        count.map { $0 < 0 ? "exactly \($0) (a count must be 0 or more)" : "exactly \($0)" } ?? "at least one"
      throw search.failure(expected: "\(amount) \(describe(type, queue, status)) matching the condition")
    }
    return search.matching
  }

  /// Checks that `queue` holds no job of `type` matching `predicate`.
  ///
  /// ```swift
  /// try await store.expectNoJob(of: SendEmail.self, in: "emails") { $0.to == "blocked@example.com" }
  /// ```
  ///
  /// - Parameters:
  ///   - type: the item type the jobs decode as.
  ///   - queue: the queue's identifier.
  ///   - status: only jobs with this status; nil (the default) for any job that is not history:
  ///     pending, running or dead (pass `.completed` or `.cancelled` to search the history).
  ///   - predicate: which items count; every item by default. An error it throws is rethrown.
  /// - Throws: ``JobExpectationError`` listing the queue's jobs when one matches; the store's
  ///   errors.
  public func expectNoJob<Item: Queueable>(
    of type: Item.Type, in queue: String, status: JobStatus? = nil,
    where predicate: (Item) throws -> Bool = { _ in true }
  ) async throws {
    // Only a page of matches is kept: the error says how many there are, and lists the first.
    let search = try await findJobs(
      of: type, in: queue, status: status, keepingAtMost: JobExpectationError.listedJobLimit, where: predicate
    )
    guard search.matchCount == 0 else {
      throw search.failure(expected: "no \(describe(type, queue, status)) matching the condition")
    }
  }

  private func describe<Item>(_ type: Item.Type, _ queue: String, _ status: JobStatus?) -> String {
    "job of \(type)" + (status.map { " with status \($0.rawValue)" } ?? "") + " in queue \"\(queue)\""
  }

  private func findJobs<Item: Queueable>(
    of type: Item.Type, in queue: String, status: JobStatus?, keepingAtMost keep: Int = .max,
    where predicate: (Item) throws -> Bool
  ) async throws -> JobSearch<Item> {
    let decoder = JSONDecoder()
    var search = JobSearch<Item>()
    var after: JobID?
    while true {
      let page = try await jobs(queue: queue, status: status, after: after, limit: 500)
      for record in page {
        // Without a status, the history of completed and cancelled jobs is not searched.
        if status == nil && (record.status == .completed || record.status == .cancelled) { continue }
        search.total += 1
        if search.listed.count < JobExpectationError.listedJobLimit { search.listed.append(record) }
        let item: Item
        do {
          item = try decoder.decode(Item.self, from: record.payload)
        } catch {
          // A payload of another type is not a match; the error lists it.
          if search.undecodable.count < JobExpectationError.listedJobLimit {
            search.undecodable.append("job \(record.id): \(JobListing.excerpt(String(describing: error)))")
          }
          continue
        }
        if try predicate(item) {
          search.matchCount += 1
          if search.matching.count < keep { search.matching.append(FoundJob(item: item, record: record)) }
        }
      }
      guard page.count == 500, let last = page.last else { return search }
      after = last.id
    }
  }
}

/// What a search of a queue's jobs found.
private struct JobSearch<Item: Queueable> {
  /// The matches kept (all of them, unless the search kept at most some).
  var matching: [FoundJob<Item>] = []
  /// How many jobs matched.
  var matchCount = 0
  var listed: [JobRecord] = []
  var undecodable: [String] = []
  var total = 0

  func failure(expected: String) -> JobExpectationError {
    JobExpectationError(
      expected: expected, found: listed, total: total, matching: matchCount, undecodable: undecodable)
  }
}

extension JobQueue {
  /// Checks that the queue holds jobs matching `predicate`, and returns them (decoded) with their
  /// records: `JobStore.expectJob(of:in:status:count:where:)` for this queue's store,
  /// identifier and item type.
  @discardableResult
  public func expectJob(
    status: JobStatus? = nil, count: Int? = nil, where predicate: (Item) throws -> Bool = { _ in true }
  ) async throws -> [FoundJob<Item>] {
    try await store.expectJob(
      of: Item.self, in: configuration.identifier, status: status, count: count, where: predicate)
  }

  /// Checks that the queue holds no job matching `predicate`:
  /// `JobStore.expectNoJob(of:in:status:where:)` for this queue's store, identifier and
  /// item type.
  public func expectNoJob(status: JobStatus? = nil, where predicate: (Item) throws -> Bool = { _ in true })
    async throws
  {
    try await store.expectNoJob(of: Item.self, in: configuration.identifier, status: status, where: predicate)
  }
}
