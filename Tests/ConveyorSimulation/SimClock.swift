import Conveyor
import Foundation
import Synchronization

/// The simulation's clock: no time passes unless the simulation advances it, and every sleep ends
/// in the order of its deadline (then of its start), so a history replays exactly.
///
/// It keeps two readings, as a computer does: the wall clock (``now()``), which ``step(by:)`` moves
/// back or forward as an administrator or NTP would, and the uptime, which only ``advance(to:)``
/// moves.
final class SimClock: JobClock {
  private enum Deadline {
    case wall(Date)
    case uptime(Duration)
  }

  private struct Sleeper {
    var deadline: Deadline
    var continuation: CheckedContinuation<Void, any Error>
  }

  private struct State {
    var uptime: Duration = .zero
    var wallOffset: TimeInterval = 0
    var sleepers: [UInt64: Sleeper] = [:]
    var nextToken: UInt64 = 0

    var now: Date { SimClock.epoch.addingTimeInterval(uptime.inSeconds + wallOffset) }

    /// The uptime at which `deadline` comes, as the clocks stand.
    func uptime(of deadline: Deadline) -> Duration {
      switch deadline {
      case .uptime(let instant): return instant
      case .wall(let date):
        let left = date.timeIntervalSince(now)
        return uptime + .microseconds(Int64((max(left, 0) * 1e6).rounded(.up)))
      }
    }

    func isDue(_ deadline: Deadline) -> Bool {
      switch deadline {
      case .uptime(let instant): instant <= uptime
      case .wall(let date): date <= now
      }
    }

    /// The sleepers due now, removed, in the order of their deadlines, then of their start.
    mutating func takeDue() -> [CheckedContinuation<Void, any Error>] {
      let due = sleepers.filter { isDue($0.value.deadline) }
        .sorted { a, b in
          let (x, y) = (uptime(of: a.value.deadline), uptime(of: b.value.deadline))
          return x != y ? x < y : a.key < b.key
        }
      for (token, _) in due { sleepers[token] = nil }
      return due.map(\.value.continuation)
    }
  }

  /// The wall clock's reading at uptime zero: 2026-01-01 00:00:00 UTC.
  static let epoch = Date(timeIntervalSince1970: 1_767_225_600)

  private let state = Mutex(State())

  init() {}

  func now() -> Date { state.withLock { $0.now } }

  func uptime() -> Duration { state.withLock { $0.uptime } }

  /// How many sleeps wait.
  var sleeping: Int { state.withLock { $0.sleepers.count } }

  /// The uptime at which the next sleep ends, if any sleeps.
  var nextDeadline: Duration? {
    state.withLock { state in state.sleepers.values.map { state.uptime(of: $0.deadline) }.min() }
  }

  /// Moves the uptime (and the wall clock with it) to `instant` and ends the sleeps that are due.
  func advance(to instant: Duration) {
    let due = state.withLock { state -> [CheckedContinuation<Void, any Error>] in
      guard instant > state.uptime else { return [] }
      state.uptime = instant
      return state.takeDue()
    }
    for continuation in due { continuation.resume() }
  }

  /// Steps the wall clock by `seconds` (negative: back); the uptime does not move.
  func step(by seconds: TimeInterval) {
    let due = state.withLock { state -> [CheckedContinuation<Void, any Error>] in
      state.wallOffset += seconds
      return state.takeDue()
    }
    for continuation in due { continuation.resume() }
  }

  func sleep(until deadline: Date) async throws {
    try await sleep(.wall(deadline), cancellable: true)
  }

  func sleep(untilUptime deadline: Duration) async throws {
    try await sleep(.uptime(deadline), cancellable: true)
  }

  /// Waits `duration` of uptime whatever happens to the task: a store call's time on its way.
  func pass(_ duration: Duration) async {
    let deadline = uptime() + duration
    try? await sleep(.uptime(deadline), cancellable: false)
  }

  private func sleep(_ deadline: Deadline, cancellable: Bool) async throws {
    let token = state.withLock { state -> UInt64 in
      state.nextToken += 1
      return state.nextToken
    }
    let wait = {
      try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
        let outcome = self.state.withLock { state -> Result<Void, any Error>? in
          if cancellable && Task.isCancelled { return .failure(CancellationError()) }
          if state.isDue(deadline) { return .success(()) }
          state.sleepers[token] = Sleeper(deadline: deadline, continuation: continuation)
          return nil
        }
        if let outcome { continuation.resume(with: outcome) }
      }
    }
    guard cancellable else { return try await wait() }
    try await withTaskCancellationHandler {
      try await wait()
    } onCancel: {
      let sleeper = state.withLock { $0.sleepers.removeValue(forKey: token) }
      sleeper?.continuation.resume(throwing: CancellationError())
    }
  }
}
