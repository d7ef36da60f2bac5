import Conveyor
import ConveyorNetworking
import Foundation

/// One job of the command-line outbox: an HTTP request or a shell command.
struct OutboxJob: Queueable, Hashable {
  enum Kind: Codable, Sendable, Hashable {
    case exec(ShellCommand)
  }

  var kind: Kind
  /// Set with `--key`: while a job with this key waits, adding another returns the waiting one.
  var key: String?

  var deduplicationKey: String? { key }

  /// A one-line description for listings; never includes bodies or header values.
  var summary: String {
    switch kind {
    case .exec(let command): "exec " + command.arguments.map(Self.quoted).joined(separator: " ")
    }
  }

  func handle(_ context: JobContext) async -> JobResult {
    switch kind {
    case .exec(let command): await command.run()
    }
  }

  private static func quoted(_ word: String) -> String {
    word.contains(where: { $0 == " " || $0 == "\"" || $0 == "'" }) ? "'\(word)'" : word
  }
}
