import Conveyor
import ConveyorNetworking
import Foundation

/// One job of the command-line outbox: an HTTP request or a shell command.
struct OutboxJob: Queueable, Hashable {
  enum Kind: Codable, Sendable, Hashable {
    case http(HTTPRequest)
    case exec(ShellCommand)
  }

  var kind: Kind
  /// Set with `--key`: while a job with this key waits, adding another returns the waiting one.
  var key: String?
  /// Set with `--ordering-key`: jobs of the queue with the same ordering key run one at a time, in
  /// the order they were added. Absent from payloads stored before it existed (decoded as nil).
  var orderingKey: String? = nil
  /// Set with `--limit-key` (for `add http`, the URL's host by default): at most the queue's limit
  /// per key of jobs with this key run at once. Absent from payloads stored before it existed.
  var limitKey: String? = nil
  /// Set with `--fairness-key`: the job takes turns with the queue's other keys (fair shares).
  /// Absent from payloads stored before it existed.
  var fairnessKey: String? = nil

  /// `add http`'s limit key when `--limit-key` names none: the URL's host, lowercased (nil for a
  /// command, or a host no limit key can be).
  var defaultLimitKey: String? {
    guard case .http(let request) = kind, let host = request.url.host?.lowercased(),
      LimitKey.problem(host) == nil
    else { return nil }
    return host
  }

  var deduplicationKey: String? { key }

  /// A one-line description for listings; never includes bodies or header values.
  var summary: String {
    switch kind {
    case .http(let request): "http \(request.method) \(Self.withoutSecrets(request.url))"
    case .exec(let command): "exec " + command.arguments.map(Self.quoted).joined(separator: " ")
    }
  }

  /// The summary of a stored job from the start of its payload (``PayloadPrefix``), or nil when
  /// that is not an outbox job; `payloadSize` is the whole payload's size. A body of any size is
  /// never read, and a summary cut short ends with "…".
  static func summary(ofStart prefix: Data, payloadSize: Int) -> String? {
    PayloadPrefix(prefix).summary(complete: prefix.count >= payloadSize)
  }

  /// The summary of a stored job listed as a ``JobSummary``.
  static func summary(of listed: JobSummary) -> String? {
    summary(ofStart: listed.record.payload, payloadSize: listed.payloadSize)
  }

  /// The most bytes of one payload a listing reads when the start it read first does not hold
  /// the summary (a job stored by an older build, its key or its body before its URL): read for
  /// that job alone, so that a listing's memory stays bounded whatever the job. A payload whose
  /// summary lies further is listed as such, never read whole (one with a 48 MB body took `list`
  /// to 160 MB).
  static let summaryReadLimit = 1 << 20

  /// The summary of `listed`, read further from `store` (up to ``summaryReadLimit`` bytes) when
  /// the start listed does not hold it; nil when the payload, read whole, is not an outbox job.
  static func summary(of listed: JobSummary, in store: any JobStore) async throws -> String? {
    var listed = listed
    if !listed.isPayloadComplete, !PayloadPrefix(listed.record.payload).holdsWholeSummary,
      listed.record.payload.count < summaryReadLimit,
      let wider = try await store.jobSummary(listed.id, payloadPrefix: summaryReadLimit, errorPrefix: 0)
    {
      listed = wider
    }
    return summary(of: listed)
      ?? (listed.isPayloadComplete
        ? nil
        : "(a job whose first \(listed.record.payload.count) bytes of payload do not say what it is)")
  }

  func handle(_ context: JobContext, delivery: HTTPDelivery) async -> JobResult {
    switch kind {
    case .http(let request): await delivery.deliver(request, context: context)
    case .exec(let command): await command.run()
    }
  }

  /// The URL without user info and query, which may hold credentials.
  static func withoutSecrets(_ url: URL) -> String {
    guard var components = URLComponents(url: url, resolvingAgainstBaseURL: false) else { return "(URL)" }
    components.user = nil
    components.password = nil
    let hadQuery = components.query != nil
    components.query = nil
    return (components.string ?? "(URL)") + (hadQuery ? "?…" : "")
  }

  static func quoted(_ word: String) -> String {
    guard word.contains(where: { $0 == " " || $0 == "\"" || $0 == "'" || $0 == "\\" }) else { return word }
    return "\""
      + word.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"") + "\""
  }
}
