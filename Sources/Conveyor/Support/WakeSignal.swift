import Foundation
import Synchronization

/// Wakes one waiting task: a signal sent while nobody waits is kept for the next wait.
///
/// A wait may also end at a deadline of a ``JobClock``: one timer task is kept armed for the
/// earliest deadline asked for, so a loop that waits often for the same deadline does not start a
/// task per wait. Spurious wake-ups are possible; callers re-check their condition.
final class WakeSignal: Sendable {
  private struct State {
    var signaled = false
    var waiter: CheckedContinuation<Void, Never>?
    var timerDeadline: Date?
    var timer: Task<Void, Never>?
  }

  private let state = Mutex(State())
  private let clock: any JobClock

  init(clock: any JobClock) { self.clock = clock }

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

  /// Waits for a signal, the deadline, or the task's cancellation.
  func wait(until deadline: Date?) async {
    if let deadline { arm(deadline) }
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

  /// Stops the timer; for shutdown.
  func disarm() {
    let timer = state.withLock { state -> Task<Void, Never>? in
      defer {
        state.timer = nil
        state.timerDeadline = nil
      }
      return state.timer
    }
    timer?.cancel()
  }

  private func arm(_ deadline: Date) {
    let old = state.withLock { state -> Task<Void, Never>?? in
      if let armed = state.timerDeadline, armed <= deadline { return .none }
      let previous = state.timer
      state.timerDeadline = deadline
      let clock = self.clock
      state.timer = Task { [weak self] in
        do {
          try await clock.sleep(until: deadline)
        } catch {
          return
        }
        self?.timerFired(deadline)
      }
      return .some(previous)
    }
    if case .some(let previous) = old { previous?.cancel() }
  }

  private func timerFired(_ deadline: Date) {
    state.withLock { state in
      if state.timerDeadline == deadline {
        state.timerDeadline = nil
        state.timer = nil
      }
    }
    signal()
  }
}
