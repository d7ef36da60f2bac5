import Foundation

/// Waits for `operation` to become finished, up to a generous bound; returns whether it did.
func finishes(_ operation: Operation, within seconds: Double = 20) async -> Bool {
  let deadline = Date().addingTimeInterval(seconds)
  while Date() < deadline {
    if operation.isFinished { return true }
    try? await Task.sleep(for: .milliseconds(5))
  }
  return operation.isFinished
}
