import Conveyor
import Foundation
import Synchronization

/// A condition that did not come true in time.
public struct TimedOut: Error, CustomStringConvertible {
  /// What was awaited.
  public var description: String

  /// Creates the error.
  public init(description: String) { self.description = description }
}

/// Polls `condition` every few milliseconds until it holds, or throws after `timeout` (real time).
public func eventually(
  _ what: String, timeout: Duration = .seconds(90), _ condition: @Sendable () async throws -> Bool
) async throws {
  let deadline = ContinuousClock.now + timeout
  while ContinuousClock.now < deadline {
    if try await condition() { return }
    try await Task.sleep(for: .milliseconds(2))
  }
  throw TimedOut(description: "timed out waiting for: \(what)")
}

/// Polls `condition` until it holds or `timeout` passes; returns whether it held, for `#expect`.
public func eventually(timeout: Duration = .seconds(90), _ condition: @Sendable () -> Bool) async -> Bool {
  (try? await eventually("the condition", timeout: timeout, condition)) != nil
}

/// How many tasks sleep on `clock` once the loops a test drives have all fallen asleep: the most
/// sleeps seen over `samples` looks 20 ms apart. A test that advances the clock waits for as many
/// (see ``waitUntilAsleep(_:on:timeout:)``) before each step, so that a loop the last step woke
/// is not overtaken by the next.
public func mostAsleep(on clock: ManualJobClock, samples: Int = 25) async throws -> Int {
  var most = 0
  for _ in 0..<samples {
    most = max(most, clock.sleeping)
    try await Task.sleep(for: .milliseconds(20))
  }
  return most
}

/// Waits until at least `count` tasks sleep on `clock` (see ``mostAsleep(on:samples:)``).
public func waitUntilAsleep(_ count: Int, on clock: ManualJobClock, timeout: Duration = .seconds(90))
  async throws
{
  try await eventually("\(count) sleeps on the clock", timeout: timeout) { clock.sleeping >= count }
}

/// A thread-safe counter.
public final class Counter: Sendable {
  private let state = Mutex(0)

  /// Creates a counter at zero.
  public init() {}

  /// Adds one and returns the new value.
  @discardableResult
  public func increment() -> Int {
    state.withLock {
      $0 += 1
      return $0
    }
  }

  /// The current value.
  public var value: Int { state.withLock { $0 } }
}

/// Records a queue's events as they happen, for tests to wait on.
public final class EventRecorder: Sendable {
  private let recorded = Log<JobQueueEvent>()
  private let task: Task<Void, Never>

  /// Starts recording `events`.
  public init(_ events: AsyncStream<JobQueueEvent>) {
    let recorded = self.recorded
    task = Task {
      for await event in events { recorded.append(event) }
    }
  }

  deinit { task.cancel() }

  /// Every event so far.
  public var events: [JobQueueEvent] { recorded.all }

  /// Waits until the events satisfy `condition`.
  public func wait(
    for what: String, timeout: Duration = .seconds(90),
    _ condition: @escaping @Sendable ([JobQueueEvent]) -> Bool
  ) async throws {
    try await eventually(what, timeout: timeout) { condition(self.events) }
  }

  /// How many events match.
  public func count(where predicate: (JobQueueEvent) -> Bool) -> Int {
    events.filter(predicate).count
  }
}

/// A thread-safe list, for handlers to record what they saw.
public final class Log<Element: Sendable>: Sendable {
  private let items = Mutex<[Element]>([])

  /// Creates an empty log.
  public init() {}

  /// Appends an element.
  public func append(_ element: Element) { items.withLock { $0.append(element) } }

  /// Everything appended so far.
  public var all: [Element] { items.withLock { $0 } }

  /// How many elements.
  public var count: Int { items.withLock { $0.count } }
}

/// A gate handlers wait on until a test opens it.
public final class Gate: Sendable {
  private let state = Mutex<(open: Bool, waiters: [CheckedContinuation<Void, Never>])>((false, []))

  /// Creates a closed gate.
  public init() {}

  /// Suspends until the gate is open.
  public func wait() async {
    await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
      let open = state.withLock { state -> Bool in
        if state.open { return true }
        state.waiters.append(continuation)
        return false
      }
      if open { continuation.resume() }
    }
  }

  /// Opens the gate for every waiter, now and later.
  public func open() {
    let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
      state.open = true
      defer { state.waiters = [] }
      return state.waiters
    }
    for waiter in waiters { waiter.resume() }
  }
}

/// At most `width` holders at once, the others waiting in turn, without holding a thread: for
/// work a test runs to completion that loads the machine (a child process), so tests running side
/// by side on a small machine do not starve each other's timers.
public final class AsyncLimit: Sendable {
  private let state: Mutex<(free: Int, waiters: [CheckedContinuation<Void, Never>])>

  /// A limit of `width` holders.
  public init(width: Int) { state = Mutex((max(1, width), [])) }

  /// Runs `body` once a place is free, and frees it after.
  public func run<T>(_ body: () async throws -> T) async rethrows -> T {
    await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
      let admitted = state.withLock { state -> Bool in
        guard state.free > 0 else {
          state.waiters.append(continuation)
          return false
        }
        state.free -= 1
        return true
      }
      if admitted { continuation.resume() }
    }
    defer {
      // The place passes to the first waiter, or back to the pool.
      let next = state.withLock { state -> CheckedContinuation<Void, Never>? in
        if state.waiters.isEmpty {
          state.free += 1
          return nil
        }
        return state.waiters.removeFirst()
      }
      next?.resume()
    }
    return try await body()
  }
}
