import Conveyor
import Foundation
import Synchronization

/// A handler could not be run as a worker would run it.
public struct HandlerRunError: Error, CustomStringConvertible, Sendable {
  /// What went wrong and what to do.
  public var description: String

  /// Creates the error.
  public init(_ description: String) { self.description = description }
}

/// Runs a queue's handler once on `item`, as a worker would, and returns what it decided: no store,
/// no queue, no clock.
///
/// The item goes through the same JSON encoding and decoding as a stored job, so a property that
/// does not survive the trip shows here as it would in production. The handler sees a context for
/// job 1 of queue "tests", created now, on attempt `attempt` with `lastError`.
///
/// ```swift
/// let result = try await runHandler(deliver, on: SendEmail(to: "ada@example.com"), attempt: 3)
/// #expect(result == .discard(reason: "mailbox unknown"))
/// ```
///
/// - Parameters:
///   - handler: the handler, as given to `JobQueue`.
///   - item: the job's item.
///   - attempt: which attempt this is: 1 the first time (the default).
///   - lastError: the error the previous attempt recorded.
/// - Returns: the handler's `JobResult`.
/// - Throws: what the handler throws (a queue would retry the job by its policy, recording the
///   error), or ``HandlerRunError`` when `attempt` is below 1 or the item does not survive JSON.
public func runHandler<Item: Queueable>(
  _ handler: JobQueue<Item>.Handler, on item: Item, attempt: Int = 1, lastError: String? = nil
) async throws -> JobResult {
  try await runHandler(handler, on: item, context: testContext(attempt: attempt, lastError: lastError))
}

/// Runs a queue's handler once on `item` with the given context, as a worker would (see
/// ``runHandler(_:on:attempt:lastError:)``).
///
/// - Parameters:
///   - handler: the handler, as given to `JobQueue`.
///   - item: the job's item; it goes through JSON as a stored job does.
///   - context: what the handler is told about the job (`attempts` must be at least 1).
/// - Returns: the handler's `JobResult`.
/// - Throws: what the handler throws, or ``HandlerRunError``.
public func runHandler<Item: Queueable>(
  _ handler: JobQueue<Item>.Handler, on item: Item, context: JobContext
) async throws -> JobResult {
  try checkAttempt(context.attempts)
  return try await handler(try roundTrip(item), context)
}

/// Runs a delegate's `queue(_:handle:attempts:completion:)` once on `item`, as a worker would,
/// and returns the result it passed to `completion`.
///
/// The delegate is given a queue that is never started, on an in-memory store, so it can read the
/// queue's identifier ("tests") but no job runs. The item goes through JSON as a stored job does.
///
/// - Parameters:
///   - delegate: the delegate; its `isReadyForJobs` must be true, as a worker requires.
///   - item: the job's item.
///   - attempt: which attempt this is: 1 the first time (the default).
///   - timeout: the longest real time to wait for `completion` to be called.
/// - Returns: the result the delegate passed to `completion` (the first, as a queue keeps).
/// - Throws: ``HandlerRunError`` when the delegate is not ready for jobs, does not call
///   `completion` within `timeout`, `attempt` is below 1, or the item does not survive JSON.
public func runHandler<Delegate: JobQueueDelegate>(
  _ delegate: Delegate, on item: Delegate.Item, attempt: Int = 1, timeout: Duration = .seconds(60)
) async throws -> JobResult {
  try checkAttempt(attempt)
  let decoded = try roundTrip(item)
  guard delegate.isReadyForJobs else {
    throw HandlerRunError(
      "expected the delegate to take the job, but its isReadyForJobs is false: a queue hands the job "
        + "back without calling it")
  }
  let queue = try JobQueue<Delegate.Item>(
    configuration: .init(identifier: testContext(attempt: attempt, lastError: nil).queue, autoStart: false),
    store: InMemoryJobStore(), delegate: delegate)
  let completion = CompletionSlot()
  let timer = Task {
    // A timer that usually loses its race: a Dispatch timer, freed when cancelled (a cancelled
    // `Task.sleep` stays scheduled until its deadline on Linux).
    do {
      try await DispatchSleep.sleep(for: timeout)
      completion.fulfil(.timedOut)
    } catch {
      // Cancelled: the delegate completed (or the caller gave up); nothing to report.
    }
  }
  defer { timer.cancel() }
  // The delegate's call runs on its own: one that suspends and never returns does not hold the
  // wait, which ends at `completion`, the timeout, or the caller's cancellation.
  let call = Task {
    await delegate.queue(queue, handle: decoded, attempts: attempt) { completion.fulfil(.result($0)) }
  }
  defer { call.cancel() }
  let outcome = await withTaskCancellationHandler {
    await completion.value
  } onCancel: {
    completion.fulfil(.cancelled)
  }
  switch outcome {
  case .result(let result): return result
  case .cancelled: throw CancellationError()
  case .timedOut:
    throw HandlerRunError(
      "expected the delegate to call completion, but it did not within \(timeout) of real time")
  }
}

/// How a wait for a delegate's completion ended.
private enum CompletionOutcome: Sendable {
  case result(JobResult)
  case timedOut
  case cancelled
}

private func testContext(attempt: Int, lastError: String?) -> JobContext {
  JobContext(id: JobID(1), queue: "tests", attempts: attempt, createdAt: Date(), lastError: lastError)
}

private func checkAttempt(_ attempt: Int) throws {
  guard attempt >= 1 else {
    throw HandlerRunError("attempt must be at least 1 (1 is the first attempt), not \(attempt)")
  }
}

/// The item as a worker sees it: encoded to JSON and decoded again.
private func roundTrip<Item: Queueable>(_ item: Item) throws -> Item {
  let payload: Data
  do {
    payload = try JSONEncoder().encode(item)
  } catch {
    throw HandlerRunError(
      "the item of type \(Item.self) does not encode as JSON, so it cannot be queued: \(error)")
  }
  do {
    return try JSONDecoder().decode(Item.self, from: payload)
  } catch {
    throw HandlerRunError(
      "the item of type \(Item.self) does not decode from its own JSON (\(String(decoding: payload, as: UTF8.self))), "
        + "so a worker could not run it: \(error)")
  }
}

/// The first outcome of a wait for a completion, awaited once.
private final class CompletionSlot: Sendable {
  private struct State {
    var outcome: CompletionOutcome?
    var waiter: CheckedContinuation<CompletionOutcome, Never>?
  }

  private let state = Mutex(State())

  /// Keeps the first outcome and resumes the waiter; later calls are ignored.
  func fulfil(_ outcome: CompletionOutcome) {
    let waiter = state.withLock { state -> CheckedContinuation<CompletionOutcome, Never>? in
      guard state.outcome == nil else { return nil }
      state.outcome = outcome
      defer { state.waiter = nil }
      return state.waiter
    }
    waiter?.resume(returning: outcome)
  }

  /// The first outcome, once there is one.
  var value: CompletionOutcome {
    get async {
      await withCheckedContinuation { (continuation: CheckedContinuation<CompletionOutcome, Never>) in
        let ready = state.withLock { state -> CompletionOutcome? in
          if let outcome = state.outcome { return outcome }
          state.waiter = continuation
          return nil
        }
        if let ready { continuation.resume(returning: ready) }
      }
    }
  }
}
