import Conveyor
import ConveyorNetworking
import ConveyorSQLite
import Foundation
import Synchronization

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// `conveyor work`: runs the outbox queue, reports progress, stops gracefully on SIGINT, SIGTERM or SIGHUP.
final class Worker: Sendable {
  struct Options: Sendable {
    enum Output: Sendable { case live, lines, json }
    var concurrency = 1
    var maxAttempts = 10
    var leaseDuration: Duration = .seconds(60)
    var retryPolicy: RetryPolicy = .exponential(initial: .seconds(1), maximum: .seconds(300))
    /// Stop once no job is waiting or running; scheduled jobs are waited for.
    var untilEmpty = false
    /// Stop once no job is ready (or the queue is paused) and none is running; scheduled jobs
    /// stay for a later run.
    var untilIdle = false
    var output = Output.lines
    var gracePeriod: Duration = .seconds(30)
    /// How long finished jobs are kept (`--keep-completed`, `--keep-cancelled`, `--keep-dead`).
    var retention = JobRetention.default
    /// What a dead job of an ordering key does to its key (`--dead-releases-key`).
    var deadHeadPolicy = DeadHeadPolicy.holdsKey
  }

  /// Outcomes counted during one `run`.
  struct Tally: Sendable {
    var succeeded = 0
    var retried = 0
    var died = 0
  }

  let queue: JobQueue<OutboxJob>
  let options: Options
  let store: any JobStore
  /// Set by a second signal: the run ends with exit code 130 however it ends.
  private let forced = Atomic<Bool>(false)

  init(store: any JobStore, queue name: String, options: Options) throws {
    self.options = options
    self.store = store
    var configuration = JobQueueConfiguration(
      identifier: name, retryPolicy: options.retryPolicy, maxAttempts: options.maxAttempts,
      concurrency: options.concurrency, autoStart: false, leaseDuration: options.leaseDuration,
      retention: options.retention)
    configuration.deadHeadPolicy = options.deadHeadPolicy
    // Storage trouble (the worker retries it with backoff) and lost leases go to standard error;
    // a job's own outcome is already reported by the event lines.
    configuration.log = { record in
      guard record.level >= .warning, record.metadata["reason"] == nil, record.message != "job discarded"
      else { return }
      let fields = record.metadata.filter { $0.key != "queue" }.sorted { $0.key < $1.key }
        .map { "\($0.key)=\($0.value)" }.joined(separator: " ")
      printError(
        "conveyor: \(record.level): \(shown(record.message))"
          + (fields.isEmpty ? "" : " (\(shown(fields)))"))
    }
    let delivery = HTTPDelivery()
    queue = try JobQueue<OutboxJob>(configuration: configuration, store: store) { job, context in
      await job.handle(context, delivery: delivery)
    }
  }

  /// Works until stopped by SIGINT, SIGTERM or SIGHUP (or, with `untilEmpty`, until no pending or running
  /// job is left); returns the exit code.
  func run(signals: SignalWatcher = SignalWatcher()) async -> Int32 {
    // Subscribed before the queue starts, so no event is missed; the queue's last event is its
    // stop, after every job's outcome, so the tally is complete when `report` returns.
    let events = queue.events
    signals.handle { [self, queue, options] count in
      if count == 1 {
        printError("conveyor: stopping; running jobs get \(options.gracePeriod) to finish (again to force)")
        Task { await queue.shutdown(gracePeriod: options.gracePeriod) }
      } else {
        // Forced: cancel the running commands now (their jobs are given back without using an
        // attempt), then exit. If giving them back takes too long (a stuck store), exit anyway:
        // the jobs then run again after their lease.
        printError("conveyor: stopping now")
        forced.store(true, ordering: .releasing)
        // On a thread of its own: on Linux dispatch's global queue runs on the cooperative
        // pool's threads, which the stuck store this guards against may be holding.
        Thread.detachNewThread {
          Thread.sleep(forTimeInterval: 3)
          ChildProcess.killAll()
          exit(130)
        }
        Task {
          await queue.shutdown(gracePeriod: .zero)
          ChildProcess.killAll()
          exit(130)
        }
      }
    }
    await announceWhatIsAwaited()
    queue.start()
    let idleWatch = options.untilIdle ? Task { await stopWhenIdle() } : nil
    let tally = await report(events)
    idleWatch?.cancel()
    signals.cancel()
    // A forced stop whose queue stopped before its own `exit(130)` ran must still say it was
    // forced (it returned 0, seen once in three test runs).
    if forced.load(ordering: .acquiring) {
      ChildProcess.killAll()
      return 130
    }
    if options.output == .live { output("") }
    if options.output != .json {
      output("done: \(tally.succeeded) delivered, \(tally.retried) retries scheduled, \(tally.died) dead")
    }
    let stopsByItself = options.untilEmpty || options.untilIdle
    if stopsByItself { await reportHeld() }
    return stopsByItself && tally.died > 0 ? ExitCode.failure.rawValue : ExitCode.success.rawValue
  }

  /// With `--until-empty`, says on standard error what the worker will wait for when no job is
  /// ready: a paused queue, or jobs scheduled for later. A storage error is left to the queue,
  /// which reports it.
  private func announceWhatIsAwaited() async {
    guard options.untilEmpty else { return }
    let name = queue.configuration.identifier
    do {
      let counts = try await queue.count()
      if try await store.isPaused(queue: name), counts.ready + counts.scheduled > 0 {
        printError(
          "conveyor: queue \(name) is paused; --until-empty waits until 'conveyor resume' "
            + "(use --until-idle to stop when no job can run)")
      } else if counts.ready == 0, counts.scheduled > 0 {
        let wake = try await store.nextWake(queue: name, clock: queue.configuration.clock)
        let next = wake.nextRun.map { " (the next at \(timestamp($0)))" } ?? ""
        printError(
          "conveyor: waiting for \(counts.scheduled) scheduled job(s)\(next); "
            + "--until-idle would stop when no job is ready")
      }
    } catch {}
  }

  /// After stopping by itself: says on standard error how many jobs are left held behind an
  /// earlier job of their ordering key (a dead one holds them until an operator acts).
  private func reportHeld() async {
    guard let counts = try? await queue.count(), counts.held > 0 else { return }
    var deadHolds = false
    if counts.dead > 0 {
      deadHolds =
        (try? await CLI.aDeadJobHoldsAHeldJob(store, queue: queue.configuration.identifier)) != false
    }
    printError(
      "conveyor: \(counts.held) job(s) left held behind an earlier job of their ordering key"
        + (deadHolds
          ? "; a dead job holds its key's later jobs until it is re-queued (conveyor retry), removed or purged"
          : ""))
  }

  /// With `--until-idle`: shuts the queue down once no job is running and none can be claimed
  /// (none is ready, or the queue is paused). Checks the store's counts every quarter second, as
  /// a job scheduled for later sends no event.
  private func stopWhenIdle() async {
    let name = queue.configuration.identifier
    while !Task.isCancelled {
      do {
        let counts = try await queue.count()
        let paused = try await store.isPaused(queue: name)
        if counts.running == 0, counts.ready == 0 || paused {
          if paused && counts.ready > 0 { printError("conveyor: queue \(name) is paused; stopping") }
          await queue.shutdown(gracePeriod: options.gracePeriod)
          return
        }
        try await Task.sleep(for: .milliseconds(250))
      } catch {
        if Task.isCancelled { return }
        // A storage error: the queue reports it; look again a little later.
        do { try await Task.sleep(for: .seconds(1)) } catch { return }
      }
    }
  }

  /// Prints and counts events until the queue stops; with `untilEmpty`, stops the queue when it
  /// reports that it is finished.
  private func report(_ events: AsyncStream<JobQueueEvent>) async -> Tally {
    var tally = Tally()
    for await event in events {
      switch event {
      case .succeeded: tally.succeeded += 1
      case .retryScheduled: tally.retried += 1
      case .died: tally.died += 1
      default: break
      }
      switch options.output {
      case .json:
        do { try printJSON(EventLine(event)) } catch {
          printError("conveyor: could not encode an event: \(error)")
        }
      case .lines:
        if let line = Self.describe(event) { output(line) }
      case .live:
        if case .died = event, let line = Self.describe(event) { output("\r\u{1B}[K" + line) }
        let text =
          "\r\u{1B}[K[\(queue.configuration.identifier)] \(tally.succeeded) delivered, \(tally.retried) retries, \(tally.died) dead"
        FileHandle.standardOutput.write(Data(text.utf8))
      }
      switch event {
      case .finished where options.untilEmpty:
        Task { [queue, options] in await queue.shutdown(gracePeriod: options.gracePeriod) }
      case .stateChanged(.stopped):
        return tally
      default: break
      }
    }
    return tally
  }

  static func describe(_ event: JobQueueEvent) -> String? {
    switch event {
    case .started(let id, let attempt): "job \(id): attempt \(attempt) started"
    case .succeeded(let id): "job \(id): done"
    case .retryScheduled(let id, let date, let error):
      "job \(id): retry at \(timestamp(date))" + (error.map { " (\(printable($0)))" } ?? "")
    case .died(let id, let reason): "job \(id): dead: \(printable(reason))"
    case .stuck(let id, let after):
      "job \(id): stuck: still running \(JobStoreTime.secondsText(after)) after it started, "
        + "past its time limit; it holds a worker slot"
    case .finished: "queue empty"
    case .enqueued, .stateChanged: nil
    }
  }
}

/// One `work --json` line.
struct EventLine: Encodable {
  var event: String
  var job: Int64?
  var attempt: Int?
  var at: String?
  var error: String?
  var state: String?

  init(_ event: JobQueueEvent) {
    switch event {
    case .enqueued(let id):
      self.event = "enqueued"
      job = id.rawValue
    case .started(let id, let attempt):
      self.event = "started"
      job = id.rawValue
      self.attempt = attempt
    case .succeeded(let id):
      self.event = "succeeded"
      job = id.rawValue
    case .retryScheduled(let id, let date, let error):
      self.event = "retry_scheduled"
      job = id.rawValue
      at = timestamp(date)
      self.error = error
    case .died(let id, let reason):
      self.event = "died"
      job = id.rawValue
      error = reason
    case .stuck(let id, _):
      self.event = "stuck"
      job = id.rawValue
    case .finished: self.event = "finished"
    case .stateChanged(let state):
      self.event = "state"
      self.state = state.rawValue
    }
  }
}

/// Calls its handler with a running count for each SIGINT, SIGTERM or SIGHUP, instead of dying.
///
/// SIGHUP counts as a stop request because it usually means the terminal running `work` closed:
/// running commands still get their grace period instead of being cut off with their jobs held.
///
/// One watcher spans a whole `work`: the wait for the database, then the queue. The handler can be
/// replaced (``handle(with:)``); a signal that arrives while no handler is set is kept and given
/// to the next one, so none is lost between the two.
final class SignalWatcher {
  private let sources: [any DispatchSourceSignal]
  private struct State {
    var count = 0
    var delivered = 0
    var handler: (@Sendable (Int) -> Void)?
  }
  /// The count and handler, shared with the signal sources' handlers.
  private final class Shared: Sendable {
    let state = Mutex(State())
  }
  private let shared = Shared()

  init(_ handler: (@Sendable (Int) -> Void)? = nil) {
    let shared = self.shared
    shared.state.withLock { $0.handler = handler }
    let queue = DispatchQueue(label: "conveyor.signals")
    sources = [SIGINT, SIGTERM, SIGHUP].map { number in
      signal(number, SIG_IGN)
      let source = DispatchSource.makeSignalSource(signal: number, queue: queue)
      source.setEventHandler {
        let (handler, count) = shared.state.withLock { state -> ((@Sendable (Int) -> Void)?, Int) in
          state.count += 1
          guard let handler = state.handler else { return (nil, state.count) }
          state.delivered = state.count
          return (handler, state.count)
        }
        handler?(count)
      }
      source.resume()
      return source
    }
  }

  /// Sets the handler (nil: keep signals for the next one); a signal kept meanwhile is given to it
  /// at once, with the count so far.
  func handle(with handler: (@Sendable (Int) -> Void)?) {
    let kept = shared.state.withLock { state -> Int? in
      state.handler = handler
      guard handler != nil, state.count > state.delivered else { return nil }
      state.delivered = state.count
      return state.count
    }
    if let kept, let handler { handler(kept) }
  }

  func cancel() {
    for source in sources { source.cancel() }
  }
}
