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

  /// A sleep's place in one of the two heaps: its deadline on that heap's clock, then its token
  /// (the order sleeps started in).
  private struct Entry<Key: Comparable & Sendable>: Comparable, Sendable {
    var key: Key
    var token: UInt64
    static func < (a: Entry, b: Entry) -> Bool { a.key != b.key ? a.key < b.key : a.token < b.token }
  }

  private struct State {
    var uptime: Duration = .zero
    var wallOffset: TimeInterval = 0
    /// The sleeps that wait, by token; a heap entry whose token is gone (a cancelled sleep) is
    /// skipped when it comes up.
    var sleepers: [UInt64: CheckedContinuation<Void, any Error>] = [:]
    /// Sleeps until an uptime, and sleeps until a wall-clock date: a step of the wall clock moves
    /// every date alike, so each heap keeps its order.
    var byUptime = Heap<Entry<Duration>>()
    var byWall = Heap<Entry<Date>>()
    var nextToken: UInt64 = 0

    var now: Date { SimClock.epoch.addingTimeInterval(uptime.inSeconds + wallOffset) }

    /// The uptime at which `date` comes, as the clocks stand.
    func uptime(of date: Date) -> Duration {
      let left = date.timeIntervalSince(now)
      return uptime + .microseconds(Int64((max(left, 0) * 1e6).rounded(.up)))
    }

    func isDue(_ deadline: Deadline) -> Bool {
      switch deadline {
      case .uptime(let instant): instant <= uptime
      case .wall(let date): date <= now
      }
    }

    mutating func add(
      _ deadline: Deadline, token: UInt64, _ continuation: CheckedContinuation<Void, any Error>
    ) {
      sleepers[token] = continuation
      switch deadline {
      case .uptime(let instant): byUptime.push(Entry(key: instant, token: token))
      case .wall(let date): byWall.push(Entry(key: date, token: token))
      }
    }

    /// Drops the heaps' entries of cancelled sleeps from their tops.
    mutating func dropCancelled() {
      while let top = byUptime.peek, sleepers[top.token] == nil { byUptime.pop() }
      while let top = byWall.peek, sleepers[top.token] == nil { byWall.pop() }
    }

    /// The uptime at which the next sleep ends, if any sleeps.
    mutating func nextDeadline() -> Duration? {
      dropCancelled()
      switch (byUptime.peek, byWall.peek) {
      case (nil, nil): return nil
      case (let u?, nil): return u.key
      case (nil, let w?): return uptime(of: w.key)
      case (let u?, let w?): return min(u.key, uptime(of: w.key))
      }
    }

    /// The sleepers due now, removed, in the order of their deadlines, then of their start.
    mutating func takeDue() -> [CheckedContinuation<Void, any Error>] {
      var due: [(at: Duration, token: UInt64)] = []
      dropCancelled()
      while let top = byUptime.peek, top.key <= uptime {
        byUptime.pop()
        if sleepers[top.token] != nil { due.append((top.key, top.token)) }
      }
      let now = self.now
      while let top = byWall.peek, top.key <= now {
        byWall.pop()
        if sleepers[top.token] != nil { due.append((uptime(of: top.key), top.token)) }
      }
      due.sort { $0.at != $1.at ? $0.at < $1.at : $0.token < $1.token }
      return due.compactMap { sleepers.removeValue(forKey: $0.token) }
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
    state.withLock { $0.nextDeadline() }
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
          state.add(deadline, token: token, continuation)
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
      sleeper?.resume(throwing: CancellationError())
    }
  }
}
