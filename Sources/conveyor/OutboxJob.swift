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

  var deduplicationKey: String? { key }

  /// A one-line description for listings; never includes bodies or header values.
  var summary: String {
    switch kind {
    case .http(let request): "http \(request.method) \(Self.withoutSecrets(request.url))"
    case .exec(let command): "exec " + command.arguments.map(Self.quoted).joined(separator: " ")
    }
  }

  /// The summary of a stored job, decoding only the method and URL or the arguments: a body of
  /// any size is skipped, never turned into `Data`.
  static func summary(of payload: Data) throws -> String {
    struct Wrapped<Value: Decodable>: Decodable {
      var value: Value
      enum CodingKeys: String, CodingKey { case value = "_0" }
    }
    struct Request: Decodable {
      var method: String
      var url: URL
    }
    struct Command: Decodable { var arguments: [String] }
    struct Kind: Decodable {
      var http: Wrapped<Request>?
      var exec: Wrapped<Command>?
    }
    struct Stored: Decodable { var kind: Kind }
    let kind = try JSONDecoder().decode(Stored.self, from: payload).kind
    if let request = kind.http?.value {
      return "http \(request.method) \(withoutSecrets(request.url))"
    }
    if let command = kind.exec?.value {
      return "exec " + command.arguments.map(quoted).joined(separator: " ")
    }
    throw DecodingError.dataCorrupted(.init(codingPath: [], debugDescription: "neither http nor exec"))
  }

  func handle(_ context: JobContext, delivery: HTTPDelivery) async -> JobResult {
    switch kind {
    case .http(let request): await delivery.deliver(request, context: context)
    case .exec(let command): await command.run()
    }
  }

  /// The URL without user info and query, which may hold credentials.
  private static func withoutSecrets(_ url: URL) -> String {
    guard var components = URLComponents(url: url, resolvingAgainstBaseURL: false) else { return "(URL)" }
    components.user = nil
    components.password = nil
    let hadQuery = components.query != nil
    components.query = nil
    return (components.string ?? "(URL)") + (hadQuery ? "?…" : "")
  }

  private static func quoted(_ word: String) -> String {
    guard word.contains(where: { $0 == " " || $0 == "\"" || $0 == "'" || $0 == "\\" }) else { return word }
    return "\""
      + word.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"") + "\""
  }
}
