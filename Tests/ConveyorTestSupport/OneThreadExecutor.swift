import Dispatch
import Foundation
import Synchronization

/// Runs jobs one at a time, in order, on a thread of its own: not one of the cooperative pool's,
/// so a job that blocks its thread (a test clock held shut, say) holds no thread of the pool.
///
/// For tests: the thread runs for as long as the process does.
public final class OneThreadExecutor: TaskExecutor {
  private let jobs = Mutex<[UnownedJob]>([])
  private let ready = DispatchSemaphore(value: 0)

  /// Starts the thread.
  public init() {
    let thread = Thread { [self] in
      while true {
        ready.wait()
        guard let job = jobs.withLock({ $0.isEmpty ? nil : $0.removeFirst() }) else { continue }
        job.runSynchronously(on: asUnownedTaskExecutor())
      }
    }
    thread.name = "OneThreadExecutor"
    thread.start()
  }

  /// Queues `job` behind the jobs already queued.
  public func enqueue(_ job: consuming ExecutorJob) {
    let job = UnownedJob(job)
    jobs.withLock { $0.append(job) }
    ready.signal()
  }
}
