import Foundation
import Synchronization

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#elseif canImport(Darwin)
  import Darwin
#endif

/// A dedicated thread that runs submitted blocks one at a time, in order.
///
/// After its last block it polls for new work for a short while (yielding the processor between
/// polls) before it sleeps, so a caller that submits its next call soon after the previous one
/// returned does not pay for waking a sleeping thread; on virtual machines that wake-up cost more
/// than the SQLite work of a small transaction.
package final class StoreThread: Sendable {
  private struct State {
    /// Submitted blocks; a taken block's slot is emptied at once, so a finished call (and the
    /// payloads it captured) is freed even while newer calls keep the list from running dry.
    var blocks: [(@Sendable () -> Void)?] = []
    var next = 0
    var sleeping = false
    var stopped = false
  }

  private let state = Mutex(State())
  private let wake = DispatchSemaphore(value: 0)
  /// How many times the idle thread yields and looks again before it sleeps.
  private let spins: Int

  /// Starts the thread.
  package init(name: String, spins: Int = 200) {
    self.spins = spins
    let thread = Thread { [self] in run() }
    thread.name = name
    thread.start()
  }

  /// Runs `block` on the thread after every block submitted before it.
  package func submit(_ block: @escaping @Sendable () -> Void) {
    let wakeUp = state.withLock { state -> Bool in
      state.blocks.append(block)
      guard state.sleeping else { return false }
      state.sleeping = false
      return true
    }
    if wakeUp { wake.signal() }
  }

  /// Lets the thread finish the blocks already submitted, then end.
  package func stop() {
    let wakeUp = state.withLock { state -> Bool in
      state.stopped = true
      guard state.sleeping else { return false }
      state.sleeping = false
      return true
    }
    if wakeUp { wake.signal() }
  }

  private func run() {
    var idle = 0
    while true {
      enum Step {
        case run(@Sendable () -> Void)
        case stop
        case poll
        case sleep
      }
      let step = state.withLock { state -> Step in
        if state.next < state.blocks.count, let block = state.blocks[state.next] {
          state.blocks[state.next] = nil
          state.next += 1
          if state.next == state.blocks.count {
            state.blocks.removeAll(keepingCapacity: true)
            state.next = 0
          } else if state.next >= 1_024 && state.next * 2 >= state.blocks.count {
            // A list that never runs dry is compacted, so its empty slots do not pile up.
            state.blocks.removeFirst(state.next)
            state.next = 0
          }
          return .run(block)
        }
        if state.stopped { return .stop }
        if idle < spins { return .poll }
        state.sleeping = true
        return .sleep
      }
      switch step {
      case .run(let block):
        block()
        idle = 0
      case .stop:
        return
      case .poll:
        idle += 1
        sched_yield()
      case .sleep:
        wake.wait()
        idle = 0
      }
    }
  }
}
