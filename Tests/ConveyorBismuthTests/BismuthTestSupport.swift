import ConveyorBismuth
import Foundation
import Testing

/// An item with nothing but a name, compared by it.
struct NamedItem: BismuthQueueable {
  var name: String
}

/// Records what the queue handed it; answers with `answer` unless the test keeps the completion.
@MainActor
final class RecordingDelegate: BismuthQueueDelegate {
  var seen: [(name: String, attempts: Int)] = []
  var finished = 0
  var keepCompletion = false
  var kept: [@Sendable (Bismuth.HandleResult) -> Void] = []
  var answer: Bismuth.HandleResult = .handled
  var onHandle: ((Bismuth.Queue<NamedItem>, NamedItem) -> Void)?

  init(keepCompletion: Bool = false, answer: Bismuth.HandleResult = .handled) {
    self.keepCompletion = keepCompletion
    self.answer = answer
  }

  func queue<T>(
    _ queue: Bismuth.Queue<T>, handle item: T, attempts: Int,
    completion: @escaping @Sendable (Bismuth.HandleResult) -> Void
  ) where T: BismuthQueueable {
    MainActor.assertIsolated()
    let item = item as! NamedItem
    seen.append((item.name, attempts))
    onHandle?(queue as! Bismuth.Queue<NamedItem>, item)
    if keepCompletion { kept.append(completion) } else { completion(answer) }
  }

  func queueFinished<T>(_ queue: Bismuth.Queue<T>) where T: BismuthQueueable {
    finished += 1
  }
}

/// A configuration named `identifier` on a new database file of its own.
func temporaryConfig(
  _ identifier: String, retryTime: TimeInterval? = nil, autoStart: Bool = true
) throws -> Bismuth.Config {
  var config = Bismuth.Config(identifier: identifier)
  config.databaseURL = try temporaryDatabase()
  if let retryTime { config.retryTime = retryTime }
  config.autoStart = autoStart
  return config
}

/// Polls `condition` on the main actor until it holds or `seconds` passed (a generous bound: a
/// real hang blows through it). Returns whether it held. 90 s, as in the other targets: beside
/// the other suites on two cores, a main-actor callback that makes synchronous calls took over
/// 30 s to finish in a full run (24 s in the same test before).
@MainActor
func eventually(within seconds: Double = 90, _ condition: () -> Bool) async -> Bool {
  let deadline = Date().addingTimeInterval(seconds)
  while Date() < deadline {
    if condition() { return true }
    try? await Task.sleep(for: .milliseconds(20))
  }
  return condition()
}
