import Foundation
import Synchronization

/// A task executor backed by one dedicated thread: tasks that prefer it run there, never on
/// Swift's cooperative pool.
///
/// The queue's lease keeper prefers it, so heartbeats go out on time even when handlers keep
/// every thread of the cooperative pool busy with CPU-bound work.
final class ThreadExecutor: TaskExecutor {
  /// The executor shared by every queue's lease keeper in the process. Its thread only sends
  /// heartbeats (the store's own thread or lock does the work), so one is enough.
  static let leases = ThreadExecutor(name: "Conveyor.leases")

  private let jobs = Mutex<[UnownedJob]>([])
  private let available = DispatchSemaphore(value: 0)

  init(name: String) {
    let thread = Thread { [self] in run() }
    thread.name = name
    thread.start()
  }

  func enqueue(_ job: consuming ExecutorJob) {
    let job = UnownedJob(job)
    jobs.withLock { $0.append(job) }
    available.signal()
  }

  private func run() {
    while true {
      available.wait()
      let job = jobs.withLock { $0.isEmpty ? nil : $0.removeFirst() }
      job?.runSynchronously(on: asUnownedTaskExecutor())
    }
  }
}
