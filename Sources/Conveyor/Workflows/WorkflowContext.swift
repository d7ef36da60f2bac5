import Foundation
import Synchronization

/// What a workflow's code uses to take durable steps and sleeps: given to
/// ``Workflow/run(_:context:)`` each time the run starts or resumes.
///
/// Call its methods one at a time, never from inside a step (fan-out is not supported yet). When
/// the run must stop for now (a sleep that has not ended, a step waiting for its next attempt, a
/// lost claim) a method throws an error the workflow's code should let through: if the code
/// catches it anyway, every later call throws it again and the run stops all the same.
public final class WorkflowContext: Sendable {
  /// The run's ID: its job's ID in the store.
  public let run: JobID
  /// The workflow's name.
  public let workflow: String
  /// Which claim of the run's job this is (its claim token, ``JobContext/claimToken``: 1 the
  /// first time a worker takes it): each start, resumption after a sleep or retry, takeover after
  /// a crash and claim given back by a shutdown counts one, so it grows with every claim. With
  /// ``run`` and a step's name, it tells one attempt of the step from another (all the steps of one
  /// claim share it).
  public let resumption: Int64
  /// The job attempt of this claim (``JobContext/attempts``), which the crash count uses.
  let attempt: Int

  let claim: ClaimReference
  let store: any JobStore
  let queueName: String
  let clock: any JobClock
  private let state: Mutex<State>

  struct State: Sendable {
    var run: WorkflowRun
    var position = 0
    /// Claims since the latest checkpoint that ended without one: charged as failed attempts to
    /// the next step that runs (the one they were running).
    var crashes: Int
    /// The entry under way.
    var busy: String?
    /// Why the run stops for now, once it must.
    var suspension: Suspension?
    /// Why the run stops for good, once it must.
    var failure: WorkflowError?
  }

  /// Why a run stops before its code returns.
  enum Suspension: Sendable, Equatable {
    /// It waits this long, recording no error (a sleep).
    case sleep(Duration)
    /// It waits this long, recording why (a step's failed attempt).
    case retry(after: Duration, reason: String)
    /// It is given back at once, its attempt returned (a history that could not be saved).
    case giveBack(reason: String)
    /// The claim is no longer the job's: another worker has it, or it was cancelled or removed.
    case lost
  }

  init(run: WorkflowRun, job: JobContext, store: any JobStore, clock: any JobClock) {
    self.run = job.id
    self.workflow = run.workflow
    self.resumption = job.claimToken
    self.attempt = job.attempts
    self.claim = job.claim
    self.store = store
    self.queueName = job.queue
    self.clock = clock
    state = Mutex(State(run: run, crashes: Self.crashes(attempts: job.attempts, run: run)))
  }

  /// How many claims of the run since its latest checkpoint ended without one (their worker
  /// crashed, was killed, or lost its lease), from the job's attempt count: every claim counts an
  /// attempt, a claim given back (a shutdown, a store error) returns it, and the latest checkpoint
  /// noted the count and whether a claim was to follow on purpose (a sleep, a retry). A dead run
  /// re-queued starts its count again from zero: its death noted zero (and, should that write
  /// have failed, the claims since the re-queue are its attempts).
  static func crashes(attempts: Int, run: WorkflowRun) -> Int {
    let planned = run.suspended ? 1 : 0
    guard attempts >= run.checkpointAttempt else { return max(0, attempts - 1) }
    return max(0, attempts - run.checkpointAttempt - planned)
  }

  /// Runs `body` once for the run: the first time the code reaches this step its result is
  /// stored (as JSON, at most ``JobHistory/maximumOutputBytes``) before the call returns; when
  /// the run resumes, the call returns the stored result without running `body` again.
  ///
  /// A failed attempt is retried by `policy` while the run waits (holding no worker); after the
  /// last the call throws ``WorkflowStepFailure``, now and on every resumption. A worker that
  /// crashes while `body` runs leaves no result, so `body` runs again on the next worker (it runs
  /// at least once, and exactly once as far as the workflow sees): make it idempotent, or pass
  /// ``resumption`` to the system it calls.
  ///
  /// - Parameters:
  ///   - name: The step's name, checked against the history when the run resumes: keep names
  ///     stable across deploys.
  ///   - policy: Attempts, retry delays and time limit.
  ///   - body: The step's work.
  /// - Returns: The step's result, from `body` or from the history.
  @discardableResult
  public func step<Result: Codable & Sendable>(
    _ name: String, policy: WorkflowStepPolicy = .standard,
    _ body: @escaping @Sendable () async throws -> Result
  ) async throws -> Result {
    let entry = try begin(.step, name)
    defer { end() }
    switch entry {
    case .stored(let event):
      guard let data = event.result else {
        throw WorkflowStepFailure(step: name, attempts: event.failedAttempts, message: event.error ?? "")
      }
      do {
        return try JSONDecoder().decode(Result.self, from: data)
      } catch {
        throw stop(.undecodableResult(run: run, step: name, message: String(describing: error)))
      }
    case .due(let position, let failed, let crashes, let lastError):
      let attempts = max(1, policy.maxAttempts)
      if failed >= attempts {
        throw try await fail(
          name, at: position, attempts: failed,
          "the worker stopped (crashed, was killed or lost its lease) during \(crashes) of its \(failed) "
            + "attempt(s)" + (lastError.map { "; the last error: \($0)" } ?? ""))
      }
      let started = clock.now()
      record(position) { $0.startedAt = started }
      switch await Self.attempt(body, limit: policy.timeLimit) {
      case .success(let value):
        let data: Data
        do { data = try JSONEncoder().encode(value) } catch {
          throw try await fail(
            name, at: position, attempts: failed + 1, "its result does not encode as JSON: \(error)")
        }
        guard data.count <= JobHistory.maximumOutputBytes else {
          throw try await fail(
            name, at: position, attempts: failed + 1,
            "its result takes \(data.count) bytes as JSON, more than the \(JobHistory.maximumOutputBytes) a step "
              + "may keep; store large results elsewhere and return their location")
        }
        try await finish(position, result: data, error: nil, failedAttempts: failed)
        return value
      case .failure(let error):
        // A shutdown or a cancelled run: not the step's failure; nothing is recorded.
        if Task.isCancelled { throw error }
        let message = JobHistory.bounded(String(describing: error))
        let failedNow = failed + 1
        if failedNow >= attempts { throw try await fail(name, at: position, attempts: failedNow, message) }
        record(position) {
          $0.failedAttempts = failedNow
          $0.error = message
        }
        try await save(suspending: true)
        throw suspend(
          .retry(
            after: policy.retryPolicy.delay(afterAttempt: failedNow),
            reason: "step \"\(name)\" attempt \(failedNow) of \(attempts) failed: \(message)"))
      }
    }
  }

  /// Waits `duration` without holding a worker: the run is stored with its wake date and resumes
  /// on any worker once it has passed. The wake date is computed once, by the queue's clock, and
  /// kept in the history, so a resumed run does not sleep again.
  ///
  /// - Parameters:
  ///   - duration: How long to wait; zero or less does not wait.
  ///   - name: The sleep's name in the history.
  public func sleep(for duration: Duration, name: String = "sleep") async throws {
    try await sleep(name) { now in JobStoreTime.date(now, adding: max(.zero, duration)) }
  }

  /// Waits until `date` without holding a worker (see ``sleep(for:name:)``); a date past does not wait.
  public func sleep(until date: Date, name: String = "sleep") async throws {
    guard date.timeIntervalSince1970.isFinite else {
      throw JobQueueError.invalidSchedule("a workflow's sleep needs a finite date")
    }
    try await sleep(name) { _ in date }
  }

  private func sleep(_ name: String, wake: (Date) -> Date) async throws {
    let entry = try begin(.sleep, name)
    defer { end() }
    let now = clock.now()
    switch entry {
    case .stored(let event):
      guard let wakeAt = event.finishedAt, wakeAt > now else { return }
      // Woken early (the store's clock ahead of this one): noted, so that the claim after this
      // one is not taken for a crash.
      try await save(suspending: true)
      throw suspend(.sleep(Self.delay(from: now, to: wakeAt)))
    case .due(let position, _, _, _):
      let wakeAt = wake(now)
      record(position) {
        $0.finished = true
        $0.finishedAt = wakeAt
      }
      // A sleep already over is saved with the next checkpoint.
      guard wakeAt > now else { return }
      try await save(suspending: true)
      throw suspend(.sleep(Self.delay(from: now, to: wakeAt)))
    }
  }

  static func delay(from now: Date, to date: Date) -> Duration {
    let seconds = min(date.timeIntervalSince(now), JobStoreTime.longestDelay.seconds)
    return .milliseconds(Int64(max(0, seconds * 1000).rounded(.up)))
  }

  // MARK: The run's state

  enum Entry {
    /// A finished entry of the history.
    case stored(WorkflowEvent)
    /// An entry to run (or finish) at this position, after this many failed attempts, of which
    /// `crashes` were interrupted (the others failed with errors, the last `lastError`).
    case due(Int, failed: Int, crashes: Int, lastError: String?)
  }

  /// Takes the next position of the history for a step or sleep.
  private func begin(_ kind: WorkflowEvent.Kind, _ name: String) throws -> Entry {
    // A cancelled run (or a shutdown) starts nothing more, whatever its code caught.
    if Task.isCancelled { throw CancellationError() }
    return try state.withLock { state in
      if let failure = state.failure { throw failure }
      if state.suspension != nil { throw WorkflowSuspended() }
      let label = WorkflowEvent(kind: kind, name: name).label
      guard !name.isEmpty, name.utf8.count <= WorkflowQueue.maximumNameBytes else {
        let error = WorkflowError.invalidName(
          "a \(kind.rawValue) name takes \(name.utf8.count) bytes (\"\(name.prefix(40))…\"); use 1 to "
            + "\(WorkflowQueue.maximumNameBytes)")
        state.failure = error
        throw error
      }
      if let busy = state.busy {
        let error = WorkflowError.overlappingSteps(run: run, step: label, running: busy)
        state.failure = error
        throw error
      }
      let position = state.position
      if position < state.run.history.count {
        let event = state.run.history[position]
        guard event.kind == kind, event.name == name else {
          let error = WorkflowError.historyMismatch(
            run: run, position: position, stored: event.label, requested: label)
          state.failure = error
          throw error
        }
        state.busy = label
        state.position += 1
        if event.finished { return .stored(event) }
        defer { state.crashes = 0 }
        return .due(
          position, failed: event.failedAttempts + state.crashes, crashes: state.crashes,
          lastError: event.error)
      }
      state.run.history.append(WorkflowEvent(kind: kind, name: name))
      state.busy = label
      state.position += 1
      guard kind == .step else { return .due(position, failed: 0, crashes: 0, lastError: nil) }
      defer { state.crashes = 0 }
      return .due(position, failed: state.crashes, crashes: state.crashes, lastError: nil)
    }
  }

  private func end() {
    state.withLock { $0.busy = nil }
  }

  private func record(_ position: Int, _ change: (inout WorkflowEvent) -> Void) {
    state.withLock { change(&$0.run.history[position]) }
  }

  /// Records a step finished, with its result or for good with an error, and saves the history.
  private func finish(_ position: Int, result: Data?, error: String?, failedAttempts: Int) async throws {
    let now = clock.now()
    record(position) {
      $0.finished = true
      $0.result = result
      $0.error = error
      $0.failedAttempts = failedAttempts
      $0.finishedAt = now
    }
    try await save(suspending: false)
  }

  /// Records step `name` failed for good after `attempts` with `message`, saves the history, and
  /// returns the error the step throws.
  private func fail(_ name: String, at position: Int, attempts: Int, _ message: String) async throws
    -> WorkflowStepFailure
  {
    let message = JobHistory.bounded(message)
    try await finish(position, result: nil, error: message, failedAttempts: attempts)
    return WorkflowStepFailure(step: name, attempts: attempts, message: message)
  }

  /// Writes the run's state under the claim; a failed write stops the run for now.
  private func save(suspending: Bool) async throws {
    try await save(checkpointAttempt: nil, suspending: suspending)
  }

  /// Notes, as the run dies, that a re-queue starts its attempts again from zero (so the claim
  /// after it is not taken for a crash); a failed write is left to the fallback of
  /// ``crashes(attempts:run:)``.
  func saveBeforeDeath() async {
    try? await save(checkpointAttempt: 0, suspending: true)
  }

  /// `checkpointAttempt` nil: this claim's attempt, less the crashes no step took yet (a sleep
  /// saved before the step they interrupted runs again), so that the next claim still counts them.
  private func save(checkpointAttempt: Int?, suspending: Bool) async throws {
    let payload = try state.withLock { state -> Data in
      state.run.checkpointAttempt = checkpointAttempt ?? (attempt - state.crashes)
      state.run.suspended = suspending
      return try JSONEncoder().encode(state.run)
    }
    let saved: Bool
    do {
      saved = try await store.checkpoint(claim, payload: payload, queue: queueName)
    } catch {
      if Task.isCancelled { throw error }
      throw suspend(
        .giveBack(reason: "could not save the run's history (\(error)); it resumes from the last step saved"))
    }
    if !saved { throw suspend(.lost) }
  }

  /// Marks the run as stopping for now; returns the error that unwinds its code.
  private func suspend(_ suspension: Suspension) -> WorkflowSuspended {
    state.withLock { state in
      if state.suspension == nil { state.suspension = suspension }
    }
    return WorkflowSuspended()
  }

  /// Marks the run as stopping for good; returns the error.
  private func stop(_ error: WorkflowError) -> WorkflowError {
    state.withLock { state in
      if state.failure == nil { state.failure = error }
    }
    return error
  }

  /// Why the run stops for now, if it must.
  var suspension: Suspension? { state.withLock { $0.suspension } }
  /// Why the run stops for good, if it must.
  var failure: WorkflowError? { state.withLock { $0.failure } }

  // MARK: Attempts

  private enum Race<Value: Sendable>: Sendable {
    case body(Swift.Result<Value, any Error>)
    case timer(expired: Bool)
  }

  /// Runs one attempt, cancelled when `limit` passes (and then waited for).
  static func attempt<Value: Sendable>(
    _ body: @escaping @Sendable () async throws -> Value, limit: Duration?
  ) async -> Swift.Result<Value, any Error> {
    guard let limit else {
      do { return .success(try await body()) } catch { return .failure(error) }
    }
    return await withTaskGroup(of: Race<Value>.self) { group in
      group.addTask {
        do { return .body(.success(try await body())) } catch { return .body(.failure(error)) }
      }
      group.addTask {
        do {
          try await Task.sleep(for: limit)
          return .timer(expired: true)
        } catch {
          return .timer(expired: false)
        }
      }
      var expired = false
      while let next = await group.next() {
        switch next {
        case .body(let result):
          group.cancelAll()
          return expired ? .failure(StepTimedOut(limit: limit)) : result
        case .timer(let didExpire):
          if didExpire {
            expired = true
            group.cancelAll()
          }
        }
      }
      return .failure(StepTimedOut(limit: limit))
    }
  }
}

/// Unwinds a workflow's code when its run stops for now (a sleep, a step's retry, a lost claim).
struct WorkflowSuspended: Error, CustomStringConvertible {
  var description: String {
    "the workflow run stops here for now (it sleeps, waits for a step's retry, or lost its claim); "
      + "let this error through"
  }
}

/// A step attempt ran past its policy's time limit.
struct StepTimedOut: Error, CustomStringConvertible {
  var limit: Duration
  var description: String { "timed out after \(JobStoreTime.secondsText(limit))" }
}
