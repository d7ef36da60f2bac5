import Conveyor
import Foundation
import Synchronization

#if canImport(FoundationNetworking)
  import FoundationNetworking
#endif

/// Sends ``HTTPRequest`` jobs and tells the queue what to do with each.
///
/// | outcome | result |
/// |---|---|
/// | accepted status (default 2xx) | `.handled` |
/// | 408, 425, 429, 5xx with `Retry-After` (seconds or HTTP date) | `.retry(after:reason:)`, capped at ``maximumRetryAfter`` |
/// | the same without `Retry-After`; transport errors, timeouts, invalid or empty responses | `.retry(reason:)`: the queue's retry policy |
/// | any other status (4xx, unfollowed 3xx) | `.discard(reason:)` with the status and a body excerpt: the job is dead |
/// | ``prepare`` threw | `.retry(reason:)` |
/// | a malformed or unsupported URL, or a server demanding authentication | `.discard(reason:)` |
/// | a request ``HTTPRequest/validate()`` refuses (nothing is sent) | `.discard(reason:)` |
///
/// Each attempt carries an `Idempotency-Key` header derived from the job (the same on every
/// retry, see ``idempotencyKey(for:)``), so a receiver can drop a request it already processed:
/// the queue delivers at least once. Redirects (301, 302, 303, 307, 308) are followed by
/// `URLSession`; the final response decides (as `URLSession` does, a 301, 302 or 303 turns a
/// `POST` into a `GET`). A redirect to another origin drops `Authorization`, `Cookie` and
/// `Proxy-Authorization`, whether the item or ``prepare`` set them (see ``NetworkSession``). Reasons recorded
/// as the job's last error name the method, the URL without its query, the status and the start
/// of the response body; never the request's headers or body. Only the first
/// ``reasonBodyLimit`` bytes of a response body are kept; the rest is received and dropped. An
/// item's ``HTTPRequest/timeout`` is a deadline for the whole attempt, however slowly the
/// server keeps sending.
///
/// ```swift
/// let outbox = try JobQueue(
///   configuration: .init(identifier: "outbox", maxAttempts: 8),
///   store: try SQLiteJobStore(path: "outbox.sqlite"),
///   delivery: HTTPDelivery())
/// ```
public struct HTTPDelivery: Sendable {
  /// The session requests go out on.
  public var session: NetworkSession
  /// Statuses that mean delivered. Default `200..<300`.
  public var acceptedStatusCodes: Set<Int>
  /// Statuses retried (the rest of the unaccepted ones are dead). Default 408, 425, 429 and 5xx.
  public var retryableStatusCodes: Set<Int>
  /// The longest `Retry-After` honoured; longer ones are shortened to it. Default one day.
  public var maximumRetryAfter: Duration
  /// The header carrying the idempotency key; nil sends none. Default `Idempotency-Key`.
  public var idempotencyKeyHeader: String?
  /// How many bytes of an unaccepted response's body go into the recorded reason. Default 512.
  public var reasonBodyLimit: Int
  /// The current date, for `Retry-After` given as an HTTP date. Default `Date()`.
  public var now: @Sendable () -> Date
  /// Adjusts each attempt's request just before it is sent, e.g. to add a fresh access token, so
  /// that secrets are not stored in the job (items are stored as plain JSON). A throw retries the
  /// job by policy with the error as the reason. Default nil.
  ///
  /// ```swift
  /// delivery.prepare = { request in
  ///   request.setValue("Bearer \(try tokens.current())", forHTTPHeaderField: "Authorization")
  /// }
  /// ```
  public var prepare: (@Sendable (inout URLRequest) throws -> Void)?

  /// Creates a delivery handler with the defaults above.
  ///
  /// - Parameter session: The session; ``NetworkSession/shared`` by default.
  public init(session: NetworkSession = .shared) {
    self.session = session
    self.acceptedStatusCodes = Set(200..<300)
    self.retryableStatusCodes = NetworkError.transientStatusCodes
    self.maximumRetryAfter = .seconds(86_400)
    self.idempotencyKeyHeader = "Idempotency-Key"
    self.reasonBodyLimit = 512
    self.now = { Date() }
    self.prepare = nil
  }

  /// The key sent in ``idempotencyKeyHeader``: `"<queue>-<job id>-<created at, ms since 1970>"`.
  /// Stable across retries and re-queues of the same job; different for every job.
  public static func idempotencyKey(for context: JobContext) -> String {
    let milliseconds = Int64((context.createdAt.timeIntervalSince1970 * 1000).rounded())
    return "\(context.queue)-\(context.id)-\(milliseconds)"
  }

  /// The request sent for a job: the item's request plus the idempotency key, unless the item
  /// has a header of that name already.
  public func urlRequest(for request: HTTPRequest, context: JobContext) -> URLRequest {
    var urlRequest = request.urlRequest
    if let name = idempotencyKeyHeader, urlRequest.value(forHTTPHeaderField: name) == nil {
      urlRequest.setValue(Self.idempotencyKey(for: context), forHTTPHeaderField: name)
    }
    return urlRequest
  }

  /// Sends one attempt and says what the queue should do with the job.
  ///
  /// - Parameters:
  ///   - request: The job's item.
  ///   - context: The job's context (for the idempotency key and attempt number).
  /// - Returns: `.handled`, `.retry…` or `.discard(reason:)` as in the table above.
  public func deliver(_ request: HTTPRequest, context: JobContext) async -> JobResult {
    do {
      try request.validate()
    } catch {
      let method = HTTPRequest.isToken(request.method) ? request.method : HTTPRequest.quoted(request.method)
      return .discard(reason: "\(method) \(request.url.redactedForLogs): invalid request: \(error)")
    }
    // Only the excerpt of the body is kept (one byte more tells that it was cut).
    let operation = NetworkDataOperation<Void>(
      request: urlRequest(for: request, context: context), session: session,
      bodyLimit: reasonBodyLimit + 1
    ) { _, _ in () }
    operation.acceptedStatusCodes = acceptedStatusCodes
    operation.bodyExcerptLimit = reasonBodyLimit
    operation.prepare = prepare
    // URLSession's timeout only measures silence: a server sending a byte now and then would
    // hold the job forever. The item's timeout is a deadline for the whole request.
    let timedOut = DeadlineFlag()
    let deadline = request.timeout.map { timeout in
      Task {
        do {
          // Freed when the request ends first (a cancelled `Task.sleep` stays scheduled).
          try await DispatchSleep.sleep(for: .milliseconds(Int64((timeout * 1000).rounded(.up))))
        } catch {
          return  // the request ended first
        }
        timedOut.set()
        operation.cancel()
      }
    }
    defer { deadline?.cancel() }
    do {
      try await operation.run()
      return .handled
    } catch {
      switch error {
      case .cancelled where timedOut.isSet:
        return .retry(
          reason:
            "\(request.method) \(request.url.redactedForLogs): timed out after \(request.timeout ?? 0) s")
      case .cancelled: return .retry(reason: "\(request.method) \(request.url.redactedForLogs): cancelled")
      case .failed(let error): return result(for: error, request: request)
      }
    }
  }

  /// The handler to give a `JobQueue<HTTPRequest>`.
  public var handler: JobQueue<HTTPRequest>.Handler {
    let delivery = self
    return { request, context in await delivery.deliver(request, context: context) }
  }

  /// Maps a failed attempt to what the queue should do.
  func result(for error: NetworkError, request: HTTPRequest) -> JobResult {
    let what = "\(request.method) \(request.url.redactedForLogs)"
    switch error {
    case .httpStatus(let status):
      let reason =
        "\(what): HTTP \(status.statusCode)" + (status.bodyExcerpt.isEmpty ? "" : ": \(status.bodyText)")
      guard retryableStatusCodes.contains(status.statusCode) else { return .discard(reason: reason) }
      if let header = status.header("Retry-After"), let delay = Self.retryAfter(header, now: now()) {
        return .retry(after: min(delay, maximumRetryAfter), reason: reason)
      }
      return .retry(reason: reason)
    case .transport(let transport) where !error.isTransient:
      return .discard(reason: "\(what): \(transport.message)")
    default:
      return .retry(reason: "\(what): \(error)")
    }
  }

  /// Parses a `Retry-After` value: delay seconds (`120`) or an HTTP date
  /// (`Wed, 21 Oct 2015 07:28:00 GMT`, and the obsolete RFC 850 and asctime forms). A date in the
  /// past gives zero; anything else nil.
  ///
  /// - Parameters:
  ///   - value: The header value.
  ///   - now: The current date, for HTTP dates.
  /// - Returns: The delay, or nil if `value` is neither form.
  public static func retryAfter(_ value: String, now: Date) -> Duration? {
    let trimmed = value.trimmingCharacters(in: .whitespaces)
    if !trimmed.isEmpty, trimmed.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) {
      return .seconds(Int64(trimmed) ?? .max)  // too many digits: capped by the caller
    }
    // asctime pads the day with a space ("Nov  6"); one space between fields suits every format.
    let collapsed = trimmed.split(separator: " ", omittingEmptySubsequences: true).joined(separator: " ")
    let formatter = DateFormatter()
    formatter.locale = Locale(identifier: "en_US_POSIX")
    formatter.timeZone = TimeZone(identifier: "GMT")
    for format in [
      "EEE, dd MMM yyyy HH:mm:ss zzz", "EEEE, dd-MMM-yy HH:mm:ss zzz", "EEE MMM d HH:mm:ss yyyy",
    ] {
      formatter.dateFormat = format
      if let date = formatter.date(from: collapsed) {
        let seconds = max(0, date.timeIntervalSince(now))
        return .milliseconds(Int64((seconds * 1000).rounded(.up)))
      }
    }
    return nil
  }
}

extension JobQueue where Item == HTTPRequest {
  /// Creates an outbox queue whose ``HTTPRequest`` jobs `delivery` sends.
  ///
  /// - Parameters:
  ///   - configuration: The queue's settings; `concurrency` 1 sends in FIFO order.
  ///   - store: Where jobs live, e.g. `SQLiteJobStore`.
  ///   - delivery: How requests are sent and results classified.
  /// - Throws: `JobQueueError` when the configuration is invalid.
  public convenience init(
    configuration: JobQueueConfiguration, store: any JobStore, delivery: HTTPDelivery
  ) throws(JobQueueError) {
    try self.init(configuration: configuration, store: store, handler: delivery.handler)
  }
}

/// Set when an attempt's deadline passed and the attempt was cancelled for it.
private final class DeadlineFlag: Sendable {
  private let value = Atomic(false)
  var isSet: Bool { value.load(ordering: .acquiring) }
  func set() { value.store(true, ordering: .releasing) }
}
