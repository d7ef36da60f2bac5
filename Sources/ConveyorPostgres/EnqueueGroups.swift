import Conveyor
import Synchronization

/// The adds of one store waiting to be committed together (group commit).
///
/// The store's connection runs one call at a time. An add made while no other is under way leads:
/// it runs at once. Adds that arrive meanwhile wait here; when the lead ends, they are committed
/// as one group, in one transaction, and the adds that arrived during that group form the next
/// one, until none waits. So many callers adding one job each share commits (one flush of the
/// server's log per group), where each used to wait for the commits of all the others in turn.
final class EnqueueGroups: Sendable {
  /// An add waiting for its group, and where its outcome goes.
  final class Ticket: Sendable {
    let call: PostgresJobStore.EnqueueCall
    let promise = CallbackPromise<[EnqueueResult]>()
    init(_ call: PostgresJobStore.EnqueueCall) { self.call = call }
  }

  /// What an add does: run at once (nothing under way), or wait for its group.
  enum Arrival {
    case lead
    case follow(Ticket)
  }

  /// The most calls in one group, and the most payload and key bytes: the rest wait for the next.
  static let groupLimit = 64
  static let groupByteLimit = 8 << 20

  private struct State {
    /// An add or a group is under way.
    var busy = false
    var waiting: [Ticket] = []
    var groups = 0
  }

  private let state = Mutex(State())

  /// An add arrives: it leads when nothing is under way (and is then under way), else it waits.
  func arrive(_ call: PostgresJobStore.EnqueueCall) -> Arrival {
    state.withLock { state in
      guard state.busy else {
        state.busy = true
        return .lead
      }
      let ticket = Ticket(call)
      state.waiting.append(ticket)
      return .follow(ticket)
    }
  }

  /// The add or group under way ended: the next group to commit (under way from now), or none
  /// (nothing is under way any more).
  func leadEnded() -> [Ticket] {
    state.withLock { state in
      var group: [Ticket] = []
      var bytes = 0
      for ticket in state.waiting {
        let size = ticket.call.bytes
        guard group.count < Self.groupLimit, group.isEmpty || bytes + size <= Self.groupByteLimit else {
          break
        }
        group.append(ticket)
        bytes += size
      }
      state.waiting.removeFirst(group.count)
      state.busy = !group.isEmpty
      if !group.isEmpty { state.groups += 1 }
      return group
    }
  }

  /// How many adds wait for their group (for tests).
  var waitingCount: Int { state.withLock { $0.waiting.count } }

  /// How many groups were started (for tests).
  var groupsCommitted: Int { state.withLock { $0.groups } }

  /// Takes a waiting add out of its group before the group starts; false when it already started
  /// (the add is then committed with it).
  func withdraw(_ ticket: Ticket) -> Bool {
    state.withLock { state in
      guard let index = state.waiting.firstIndex(where: { $0 === ticket }) else { return false }
      state.waiting.remove(at: index)
      return true
    }
  }
}
