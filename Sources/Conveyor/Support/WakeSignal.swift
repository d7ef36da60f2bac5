import Foundation
import Synchronization

/// Wakes one waiting task: a signal sent while nobody waits is kept for the next wait.
///
/// A wait may also end after a timeout, measured by the clock's monotonic
/// ``JobClock/sleep(for:)``, so a step of the wall clock neither shortens nor stretches it.
/// Spurious wake-ups are possible; callers re-check their condition.
final class WakeSignal: Sendable {
  private struct State {
    var signaled = false
    var waiter: CheckedContinuation<Void, Never>?
  }

  private let state = Mutex(State())
  private let clock: any JobClock
  /// The executor the timeout's task prefers (nil: the global one).
  private let executor: (any TaskExecutor)?

  init(clock: any JobClock, executor: (any TaskExecutor)? = nil) {
    self.clock = clock
    self.executor = executor
  }

  /// Wakes the waiter, or the next one to wait.
  func signal() {
    let waiter = state.withLock { state -> CheckedContinuation<Void, Never>? in
      if let waiter = state.waiter {
        state.waiter = nil
        return waiter
      }
      state.signaled = true
      return nil
    }
    waiter?.resume()
  }

  /// Waits for a signal, `timeout`, or the task's cancellation.
  func wait(for timeout: Duration) async {
    // Read now, not in the timer task: the clock may move before that task runs.
    await wait(untilUptime: clock.uptime() + timeout)
  }

  /// Waits for a signal, the clock's ``JobClock/uptime()`` reaching `deadline`, or the task's
  /// cancellation.
  func wait(untilUptime deadline: Duration) async {
    let clock = self.clock
    let timer = Task(executorPreference: executor) { [weak self] in
      do { try await clock.sleep(untilUptime: deadline) } catch { return }
      self?.signal()
    }
    defer { timer.cancel() }
    await withTaskCancellationHandler {
      await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
        let resumeNow = state.withLock { state -> Bool in
          if state.signaled || Task.isCancelled {
            state.signaled = false
            return true
          }
          state.waiter = continuation
          return false
        }
        if resumeNow { continuation.resume() }
      }
    } onCancel: {
      signal()
    }
  }
}
