import Foundation
import Synchronization

/// Runs `async` work for the synchronous drop-in calls and blocks the caller until it is done.
///
/// The work runs on one dedicated thread (a task executor), never on Swift's cooperative pool,
/// so a caller blocked here (the main thread, a dispatch queue, even a pool thread) cannot starve
/// the work it waits for. The store's own thread or queue does the database work.
final class BlockingBridge: TaskExecutor {
  static let shared = BlockingBridge()

  private let jobs = Mutex<[UnownedJob]>([])
  private let available = DispatchSemaphore(value: 0)

  private init() {
    let thread = Thread { [self] in run() }
    thread.name = "ConveyorBismuth.bridge"
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

  /// Runs `work` on the bridge's thread and blocks the calling thread until it returns.
  ///
  /// Must not be called from the bridge's own thread (nothing here does: delegates run on their
  /// own isolation, never on it).
  static func wait<Value: Sendable>(for work: @escaping @Sendable () async throws -> Value) throws -> Value {
    let outcome = Mutex<Result<Value, any Error>?>(nil)
    let done = DispatchSemaphore(value: 0)
    Task(executorPreference: shared) {
      let result: Result<Value, any Error>
      do { result = .success(try await work()) } catch { result = .failure(error) }
      outcome.withLock { $0 = result }
      done.signal()
    }
    done.wait()
    return try outcome.withLock { $0! }.get()
  }
}
