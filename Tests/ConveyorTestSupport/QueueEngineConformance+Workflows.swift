import Conveyor
import Foundation
import Synchronization

extension QueueEngineConformance {
  /// Counts how many times each step body ran, across every queue of a check.
  final class StepRuns: Sendable {
    private let counts = Mutex<[String: Int]>([:])
    func ran(_ step: String) { counts.withLock { $0[step, default: 0] += 1 } }
    func count(_ step: String) -> Int { counts.withLock { $0[step, default: 0] } }
    var all: [String: Int] { counts.withLock { $0 } }
  }

  /// Three steps around a sleep: `double`, a sleep of `nap`, `add` (which fails `failures` times
  /// first), `describe`.
  struct Arithmetic: Workflow {
    var name = "arithmetic"
    var runs: StepRuns
    var nap: Duration = .milliseconds(150)
    var failures = 0
    var policy = WorkflowStepPolicy(maxAttempts: 3, retryPolicy: .fixed(.milliseconds(20)))

    func run(_ input: Int, context: WorkflowContext) async throws -> String {
      let doubled = try await context.step("double") {
        runs.ran("double")
        return input * 2
      }
      try await context.sleep(for: nap)
      let added = try await context.step("add", policy: policy) {
        runs.ran("add")
        if runs.count("add") <= failures { throw StepError(text: "add failed") }
        return doubled + 1
      }
      return try await context.step("describe") {
        runs.ran("describe")
        return "\(input) -> \(added)"
      }
    }
  }

  struct StepError: Error, CustomStringConvertible {
    var text: String
    var description: String { text }
  }

  /// A workflow made of a closure, for the checks that need odd code.
  struct Scripted: Workflow {
    var name: String
    var body: @Sendable (Int, WorkflowContext) async throws -> Int
    func run(_ input: Int, context: WorkflowContext) async throws -> Int { try await body(input, context) }
  }

  static func workflowConfiguration(lease: Duration = .seconds(60)) -> JobQueueConfiguration {
    var configuration = configuration("engine", lease: lease)
    configuration.maxAttempts = nil
    return configuration
  }

  /// Waits until the run's status is no longer waiting or running.
  static func finished<W: Workflow>(_ queue: WorkflowQueue, _ run: JobID, _ type: W.Type, line: UInt = #line)
    async throws -> WorkflowRunStatus<W.Output>
  {
    try await waitFor("run \(run) to finish", line: line) {
      switch try await queue.status(of: run, as: type) {
      case .waiting, .running: false
      default: true
      }
    }
    return try await queue.status(of: run, as: type)
  }

  /// A worker claims `count` runs of queue `engine` and vanishes: returns once their 50 ms leases
  /// have lapsed.
  static func vanishingClaim(_ store: any JobStore, count: Int = 1, line: UInt = #line) async throws {
    let lost = try await store.settleAndClaim(
      [], queue: "engine", limit: count, lease: Lease(owner: "vanished", duration: .milliseconds(50)),
      clock: SystemJobClock())
    try expect(
      lost.claimed.count == count, "claimed by the vanished worker: \(lost.claimed.count)", line: line)
    try await Task.sleep(for: .milliseconds(120))
  }

  /// How a run ends whose one-attempt step `step` found a crash already counted against it.
  static func deadOfOneCrash(_ step: String) -> WorkflowRunStatus<Int> {
    .dead(
      "step \"\(step)\" failed after 1 attempt(s): the worker stopped (crashed, was killed or lost its lease) "
        + "during 1 of its 1 attempt(s)")
  }

  /// "strict": one step, "work", with one attempt, counted in `runs`, returning the input.
  static func strictWorkflow(_ runs: StepRuns) -> Scripted {
    Scripted(name: "strict") { input, context in
      try await context.step("work", policy: .once) {
        runs.ran("work")
        return input
      }
    }
  }

  /// A run of "strict" (one step with one attempt) is added; a queue of an older deploy, not given
  /// "strict", over `older` (failing as `inject` says) claims it once; a queue that knows "strict"
  /// then runs it: the step's one attempt must be unspent.
  static func olderClaimWithStoreError(
    _ base: any JobStore, inject: @Sendable (InstrumentedJobStore) -> Void
  ) async throws {
    let runs = StepRuns()
    let strict = strictWorkflow(runs)
    var stopped = workflowConfiguration()
    stopped.autoStart = false
    let reader = try WorkflowQueue(configuration: stopped, store: base, workflows: [strict])
    let added = try await reader.add(strict, input: 1)
    let older = InstrumentedJobStore(base)
    inject(older)
    let olderQueue = try WorkflowQueue(
      configuration: workflowConfiguration(), store: older, workflows: [Arithmetic(runs: runs)],
      unknownWorkflowDelay: .milliseconds(600))
    try await waitFor("a claim by the old deploy noted") {
      let record = try await reader.jobs.job(added.id)
      return record?.status == .pending && record?.lastError?.contains("no workflow named") == true
    }
    await olderQueue.jobs.shutdown()
    let queue = try WorkflowQueue(configuration: workflowConfiguration(), store: base, workflows: [strict])
    let status = try await finished(queue, added.id, Scripted.self)
    await queue.jobs.shutdown()
    try expect(
      status == .completed(1), "a store error of an old deploy's claim was charged as a crash: \(status)")
    try expect(runs.count("work") == 1, "once: \(runs.all)")
  }

  static let workflowChecks: [JobStoreCheck] = [
    check("workflow: each step runs once, a sleep holds no worker, and the run completes with its output") {
      store in
      let runs = StepRuns()
      let workflow = Arithmetic(runs: runs)
      let queue = try WorkflowQueue(
        configuration: workflowConfiguration(), store: store, workflows: [workflow])
      let run = try await queue.add(workflow, input: 20)
      let status = try await finished(queue, run.id, Arithmetic.self)
      await queue.jobs.shutdown()
      try expect(status == .completed("20 -> 41"), "output: \(status)")
      try expect(runs.all == ["double": 1, "add": 1, "describe": 1], "each step once: \(runs.all)")
      let stored = try await queue.run(run.id)
      try expect(
        stored?.history.map(\.label) == [
          "step \"double\"", "sleep \"sleep\"", "step \"add\"", "step \"describe\"",
        ],
        "history: \(String(describing: stored?.history.map(\.label)))")
      try expect(stored?.history.allSatisfy(\.finished) == true, "every entry finished")
      let record = try await queue.jobs.job(run.id)
      // Claimed once to the sleep, once after it: the sleep gave the worker back.
      try expect(record?.attempts == 2, "two claims: \(String(describing: record?.attempts))")
      try expect(record?.errors.isEmpty == true, "a sleep records no error: \(record?.errors ?? [])")
    },
    check("workflow: a failed step is retried by its policy while the run waits, its errors recorded") {
      store in
      let runs = StepRuns()
      let workflow = Arithmetic(runs: runs, nap: .zero, failures: 2)
      let queue = try WorkflowQueue(
        configuration: workflowConfiguration(), store: store, workflows: [workflow])
      let run = try await queue.add(workflow, input: 1)
      let status = try await finished(queue, run.id, Arithmetic.self)
      await queue.jobs.shutdown()
      try expect(status == .completed("1 -> 3"), "output: \(status)")
      try expect(
        runs.all == ["double": 1, "add": 3, "describe": 1], "add three times, others once: \(runs.all)")
      let record = try await queue.jobs.job(run.id)
      try expect(
        record?.errors == [
          "step \"add\" attempt 1 of 3 failed: add failed", "step \"add\" attempt 2 of 3 failed: add failed",
        ], "the failed attempts: \(record?.errors ?? [])")
      let add = try await queue.run(run.id)?.history.first { $0.name == "add" }
      try expect(add?.failedAttempts == 2 && add?.result != nil, "stored: \(String(describing: add))")
    },
    check("workflow: a step failing its last attempt kills the run, unless the code catches it") { store in
      let runs = StepRuns()
      let failing = Arithmetic(runs: runs, nap: .zero, failures: 10)
      let caught = Scripted(name: "caught") { input, context in
        do {
          return try await context.step("charge", policy: .once) { () -> Int in
            runs.ran("charge")
            throw StepError(text: "card declined")
          }
        } catch let failure as WorkflowStepFailure {
          // A compensation, and a sleep so that the run resumes and replays the stored failure.
          try await context.sleep(for: .milliseconds(50))
          return try await context.step("refund") {
            runs.ran("refund")
            return failure.attempts * 100 + input
          }
        }
      }
      let queue = try WorkflowQueue(
        configuration: workflowConfiguration(), store: store, workflows: [failing, caught])
      let dead = try await queue.add(failing, input: 1)
      let compensated = try await queue.add(caught, input: 7)
      let deadStatus = try await finished(queue, dead.id, Arithmetic.self)
      let caughtStatus = try await finished(queue, compensated.id, Scripted.self)
      await queue.jobs.shutdown()
      try expect(
        deadStatus == .dead("step \"add\" failed after 3 attempt(s): add failed"), "dead: \(deadStatus)")
      try expect(runs.count("add") == 3 && runs.count("describe") == 0, "no step after it: \(runs.all)")
      try expect(caughtStatus == .completed(107), "compensated: \(caughtStatus)")
      try expect(runs.count("charge") == 1 && runs.count("refund") == 1, "once each: \(runs.all)")
    },
    check(
      "workflow: code whose steps changed under a sleeping run kills it with its history kept; fixed code resumes it"
    ) { store in
      let runs = StepRuns()
      let original = Arithmetic(runs: runs, nap: .milliseconds(400))
      let first = try WorkflowQueue(
        configuration: workflowConfiguration(), store: store, workflows: [original])
      let run = try await first.add(original, input: 5)
      try await waitFor("the run to sleep") {
        try await first.run(run.id)?.history.count == 2
      }
      await first.jobs.shutdown()
      // A deploy renames the first step while the run sleeps.
      let renamed = Scripted(name: "arithmetic") { input, context in
        try await context.step("twice") {
          runs.ran("twice")
          return input * 2
        }
      }
      let deployed = try WorkflowQueue(
        configuration: workflowConfiguration(), store: store, workflows: [renamed])
      let status = try await finished(deployed, run.id, Scripted.self)
      await deployed.jobs.shutdown()
      guard case .dead(let reason) = status else {
        throw ConformanceFailure(description: "not dead: \(status)")
      }
      try expect(
        reason.contains("asked for step \"twice\" at position 1") && reason.contains("holds step \"double\""),
        "says which steps: \(reason)")
      try expect(runs.count("twice") == 0, "the renamed step never ran")
      // The old code comes back: the run resumes after its sleep, without running "double" again.
      let fixed = try WorkflowQueue(
        configuration: workflowConfiguration(), store: store, workflows: [original])
      try expect(try await fixed.jobs.requeueDead([run.id]) == 1, "re-queued")
      let resumed = try await finished(fixed, run.id, Arithmetic.self)
      await fixed.jobs.shutdown()
      try expect(resumed == .completed("5 -> 11"), "output: \(resumed)")
      try expect(runs.all == ["double": 1, "add": 1, "describe": 1], "each step once: \(runs.all)")
    },
    check("workflow: a stored result that no longer decodes kills the run, naming the step") { store in
      let runs = StepRuns()
      let original = Arithmetic(runs: runs, nap: .milliseconds(300))
      let first = try WorkflowQueue(
        configuration: workflowConfiguration(), store: store, workflows: [original])
      let run = try await first.add(original, input: 5)
      try await waitFor("the run to sleep") { try await first.run(run.id)?.history.count == 2 }
      await first.jobs.shutdown()
      let retyped = Scripted(name: "arithmetic") { _, context in
        let text = try await context.step("double") { "ten" }
        return text.count
      }
      let queue = try WorkflowQueue(
        configuration: workflowConfiguration(), store: store, workflows: [retyped])
      let status = try await finished(queue, run.id, Scripted.self)
      await queue.jobs.shutdown()
      guard case .dead(let reason) = status else {
        throw ConformanceFailure(description: "not dead: \(status)")
      }
      try expect(reason.contains("stored result of step \"double\" does not decode"), "says so: \(reason)")
    },
    check("workflow: a worker that vanished mid-step counts as a failed attempt of that step") { store in
      let runs = StepRuns()
      let step = Scripted(name: "once") { input, context in
        try await context.step("work", policy: .init(maxAttempts: 2, retryPolicy: .fixed(.zero))) {
          runs.ran("work")
          return input + Int(context.resumption)
        }
      }
      let strict = Scripted(name: "strict") { input, context in
        try await context.step("work", policy: .once) {
          runs.ran("strict")
          return input
        }
      }
      var configuration = workflowConfiguration()
      configuration.autoStart = false
      let queue = try WorkflowQueue(configuration: configuration, store: store, workflows: [step, strict])
      let forgiving = try await queue.add(step, input: 100)
      let unforgiving = try await queue.add(strict, input: 1)
      // A worker claims both runs and vanishes: its leases lapse.
      try await vanishingClaim(store, count: 2)
      queue.jobs.start()
      let first = try await finished(queue, forgiving.id, Scripted.self)
      let second = try await finished(queue, unforgiving.id, Scripted.self)
      await queue.jobs.shutdown()
      try expect(first == .completed(102), "ran as the second claim: \(first)")
      try expect(
        second
          == deadOfOneCrash("work"), "no attempt left: \(second)")
      try expect(runs.count("strict") == 0, "the step with one attempt did not run again")
    },
    check("workflow: a cancelled run's running step is cancelled and no later step runs") { store in
      let runs = StepRuns()
      let started = Gate()
      let blocking = Scripted(name: "blocking") { input, context in
        _ = try await context.step("wait") { () -> Int in
          runs.ran("wait")
          started.open()
          try await Task.sleep(for: .seconds(60))
          return 0
        }
        return try await context.step("after") {
          runs.ran("after")
          return input
        }
      }
      let queue = try WorkflowQueue(
        configuration: workflowConfiguration(), store: store, workflows: [blocking])
      let run = try await queue.add(blocking, input: 1)
      await started.wait()
      try expect(try await queue.jobs.cancel(run.id) == .cancelledRunning, "cancelled while running")
      let status = try await finished(queue, run.id, Scripted.self)
      await queue.jobs.shutdown()
      try expect(status == .cancelled, "cancelled: \(status)")
      try expect(runs.count("after") == 0, "no later step: \(runs.all)")
    },
    check("workflow: a step past its time limit is cancelled and fails its attempt") { store in
      let slow = Scripted(name: "slow") { _, context in
        try await context.step("slow", policy: .init(maxAttempts: 1, timeLimit: .milliseconds(100))) {
          () -> Int in
          try await Task.sleep(for: .seconds(60))
          return 1
        }
      }
      let queue = try WorkflowQueue(configuration: workflowConfiguration(), store: store, workflows: [slow])
      let run = try await queue.add(slow, input: 1)
      let status = try await finished(queue, run.id, Scripted.self)
      await queue.jobs.shutdown()
      try expect(
        status == .dead("step \"slow\" failed after 1 attempt(s): timed out after 0.1 s"), "\(status)")
    },
    check("workflow: a step called inside another stops the run with a clear error") { store in
      let nested = Scripted(name: "nested") { input, context in
        try await context.step("outer") {
          try await context.step("inner") { input }
        }
      }
      let queue = try WorkflowQueue(configuration: workflowConfiguration(), store: store, workflows: [nested])
      let run = try await queue.add(nested, input: 1)
      let status = try await finished(queue, run.id, Scripted.self)
      await queue.jobs.shutdown()
      guard case .dead(let reason) = status else {
        throw ConformanceFailure(description: "not dead: \(status)")
      }
      try expect(reason.contains("step \"inner\" was called while step \"outer\" was under way"), reason)
    },
    check("workflow: a run of a workflow this process does not know waits, visible, and nothing is lost") {
      store in
      let runs = StepRuns()
      let known = Arithmetic(runs: runs, nap: .zero)
      let adder = try WorkflowQueue(configuration: workflowConfiguration(), store: store, workflows: [known])
      await adder.jobs.shutdown()
      let run = try await adder.add(known, input: 3)
      let other = Arithmetic(name: "other", runs: runs)
      let queue = try WorkflowQueue(configuration: workflowConfiguration(), store: store, workflows: [other])
      try await waitFor("the run to be tried") { try await queue.jobs.job(run.id)?.attempts == 1 }
      try await waitFor("the run to wait again") { try await queue.jobs.job(run.id)?.status == .pending }
      await queue.jobs.shutdown()
      let record = try await queue.jobs.job(run.id)
      try expect(
        record?.lastError?.contains("no workflow named \"arithmetic\"") == true,
        "says so: \(String(describing: record?.lastError))")
      try expect(runs.all.isEmpty, "nothing ran: \(runs.all)")
      try expect(try await queue.run(run.id)?.workflow == "arithmetic", "the run is kept")
    },
    check("workflow: a pipeline runs as a workflow, each step's value stored") { store in
      let runs = StepRuns()
      let pipeline = Pipeline(defaultValue: 0)
        .then { value in
          runs.ran("plus")
          return value + 1
        }
        .then { value in
          runs.ran("times")
          return value * 10
        }
      let workflow = pipeline.workflow(named: "pipeline")
      let queue = try WorkflowQueue(
        configuration: workflowConfiguration(), store: store, workflows: [workflow])
      let run = try await queue.add(workflow, input: 4)
      let status = try await finished(queue, run.id, PipelineWorkflow<Int>.self)
      await queue.jobs.shutdown()
      try expect(status == .completed(50), "output: \(status)")
      let history = try await queue.run(run.id)?.history
      try expect(
        history?.map(\.label) == ["step \"step 1 of 2\"", "step \"step 2 of 2\""],
        "history: \(String(describing: history?.map(\.label)))")
      try expect(runs.all == ["plus": 1, "times": 1], "once each: \(runs.all)")
    },
    check("workflow: bad queues and runs are refused before anything is stored") { store in
      let runs = StepRuns()
      var limited = workflowConfiguration()
      limited.timeLimit = .seconds(1)
      do {
        _ = try WorkflowQueue(configuration: limited, store: store, workflows: [Arithmetic(runs: runs)])
        throw ConformanceFailure(description: "a time limit accepted")
      } catch JobQueueError.invalidConfiguration(let message) {
        try expect(message.contains("timeLimit must be nil"), message)
      }
      var counted = workflowConfiguration()
      counted.maxAttempts = 3
      do {
        _ = try WorkflowQueue(configuration: counted, store: store, workflows: [Arithmetic(runs: runs)])
        throw ConformanceFailure(description: "maxAttempts accepted")
      } catch JobQueueError.invalidConfiguration(let message) {
        try expect(message.contains("maxAttempts must be nil"), message)
      }
      do {
        _ = try WorkflowQueue(
          configuration: workflowConfiguration(), store: store,
          workflows: [Arithmetic(runs: runs), Arithmetic(runs: runs)])
        throw ConformanceFailure(description: "two workflows with one name accepted")
      } catch WorkflowError.invalidName(let message) {
        try expect(message.contains("two workflows are named \"arithmetic\""), message)
      }
      do {
        _ = try WorkflowQueue(
          configuration: workflowConfiguration(), store: store, workflows: [Arithmetic(name: "", runs: runs)])
        throw ConformanceFailure(description: "an empty name accepted")
      } catch WorkflowError.invalidName {}
      let queue = try WorkflowQueue(
        configuration: workflowConfiguration(), store: store, workflows: [Arithmetic(runs: runs)])
      await queue.jobs.shutdown()
      do {
        _ = try await queue.add(Arithmetic(name: "missing", runs: runs), input: 1)
        throw ConformanceFailure(description: "an unknown workflow accepted")
      } catch WorkflowError.unknownWorkflow(let name) {
        try expect(name == "missing", name)
      }
      try expect(try await queue.jobs.count().total == 0, "nothing stored")
    },
    check("workflow: a key keeps one run per key among waiting and running runs") { store in
      let runs = StepRuns()
      let workflow = Arithmetic(runs: runs, nap: .zero)
      let queue = try WorkflowQueue(
        configuration: workflowConfiguration(), store: store, workflows: [workflow])
      await queue.jobs.shutdown()
      let first = try await queue.add(workflow, input: 1, key: "order-1")
      let second = try await queue.add(workflow, input: 2, key: "order-1")
      try expect(first.inserted && second.outcome == .existing && second.id == first.id, "\(first) \(second)")
      try expect(try await queue.jobs.count().total == 1, "one run")
    },
    check("workflow: claims by workers that do not know the workflow are not crashes of its next step") {
      store in
      let runs = StepRuns()
      let strict = strictWorkflow(runs)
      var stopped = workflowConfiguration()
      stopped.autoStart = false
      let added = try await WorkflowQueue(configuration: stopped, store: store, workflows: [strict])
        .add(strict, input: 1)
      // Workers of an older deploy, not given "strict", claim the run three times, each waiting no time.
      let older = try WorkflowQueue(
        configuration: workflowConfiguration(), store: store, workflows: [Arithmetic(runs: runs)],
        unknownWorkflowDelay: .zero)
      try await waitFor("three claims by the old deploy") {
        try await older.jobs.job(added.id)?.attempts ?? 0 >= 3
      }
      await older.jobs.shutdown()
      let queue = try WorkflowQueue(configuration: workflowConfiguration(), store: store, workflows: [strict])
      let status = try await finished(queue, added.id, Scripted.self)
      await queue.jobs.shutdown()
      try expect(status == .completed(1), "the step ran, its one attempt unspent: \(status)")
      try expect(runs.count("work") == 1, "once: \(runs.all)")
    },
    check("workflow: an older deploy's claim whose read of the run fails is not a crash of its next step") {
      store in
      try await olderClaimWithStoreError(store) { $0.fail("job", times: 1) }
    },
    check("workflow: an older deploy's claim whose note fails to save is not a crash of its next step") {
      store in
      try await olderClaimWithStoreError(store) { $0.fail("checkpoint", times: 1) }
    },
    check("workflow: a vanished worker's claim still counts after an older deploy's worker claimed the run") {
      store in
      let runs = StepRuns()
      let strict = strictWorkflow(runs)
      var stopped = workflowConfiguration()
      stopped.autoStart = false
      let added = try await WorkflowQueue(configuration: stopped, store: store, workflows: [strict])
        .add(strict, input: 1)
      try await vanishingClaim(store)
      let older = try WorkflowQueue(
        configuration: workflowConfiguration(), store: store, workflows: [Arithmetic(runs: runs)],
        unknownWorkflowDelay: .milliseconds(600))
      try await waitFor("a claim by the old deploy, settled") {
        let record = try await older.jobs.job(added.id)
        return record?.attempts == 2 && record?.status == .pending
      }
      await older.jobs.shutdown()
      let queue = try WorkflowQueue(configuration: workflowConfiguration(), store: store, workflows: [strict])
      let status = try await finished(queue, added.id, Scripted.self)
      await queue.jobs.shutdown()
      try expect(status == deadOfOneCrash("work"), "the vanished claim was forgotten: \(status)")
      try expect(runs.count("work") == 0, "the step with its one attempt spent ran: \(runs.all)")
    },
    check("workflow: a step that failed with an error and then crashed says so, with the error") { store in
      let flaky = Scripted(name: "flaky") { _, context in
        try await context.step(
          "work", policy: .init(maxAttempts: 2, retryPolicy: .fixed(.milliseconds(1_500)))
        ) {
          () -> Int in
          throw StepError(text: "boom")
        }
      }
      let first = try WorkflowQueue(configuration: workflowConfiguration(), store: store, workflows: [flaky])
      let run = try await first.add(flaky, input: 1)
      // The retry is 1.5 s away: the queue stops well before it (a loaded machine took more than
      // 300 ms), and a worker that vanishes takes the run when it is due.
      try await waitFor("the first attempt to fail") {
        guard let record = try await first.jobs.job(run.id), record.status == .pending else { return false }
        return try await first.run(run.id)?.history.first?.failedAttempts == 1
      }
      let failedAt = ContinuousClock.now
      await first.jobs.shutdown()
      try await Task.sleep(until: failedAt + .milliseconds(1_600))
      try await vanishingClaim(store)
      let second = try WorkflowQueue(configuration: workflowConfiguration(), store: store, workflows: [flaky])
      let status = try await finished(second, run.id, Scripted.self)
      await second.jobs.shutdown()
      try expect(
        status
          == .dead(
            "step \"work\" failed after 2 attempt(s): the worker stopped (crashed, was killed or lost its lease) "
              + "during 1 of its 2 attempt(s); the last error: boom"), "\(status)")
    },
    check("workflow: a step's error is kept to the bound of a job's errors, and a name to 200 bytes") {
      store in
      let huge = Scripted(name: "huge") { _, context in
        try await context.step("boom", policy: .once) { () -> Int in
          throw StepError(text: String(repeating: "e", count: 200_000))
        }
      }
      let named = Scripted(name: "named") { input, context in
        try await context.step(String(repeating: "n", count: 201)) { input }
      }
      let queue = try WorkflowQueue(
        configuration: workflowConfiguration(), store: store, workflows: [huge, named])
      let run = try await queue.add(huge, input: 1)
      let long = try await queue.add(named, input: 1)
      _ = try await finished(queue, run.id, Scripted.self)
      let longStatus = try await finished(queue, long.id, Scripted.self)
      await queue.jobs.shutdown()
      let kept = try await queue.run(run.id)?.history.first?.error?.utf8.count ?? -1
      try expect(kept <= JobHistory.maximumErrorBytes, "the history keeps \(kept) bytes of error")
      guard case .dead(let reason) = longStatus else {
        throw ConformanceFailure(description: "\(longStatus)")
      }
      try expect(reason.contains("a step name takes 201 bytes"), reason)
    },
    check(
      "workflow: a step whose result could not be saved (a store error) runs again, not failed as a crash"
    ) {
      base in
      let store = InstrumentedJobStore(base)
      let runs = StepRuns()
      let strict = strictWorkflow(runs)
      let queue = try WorkflowQueue(configuration: workflowConfiguration(), store: store, workflows: [strict])
      store.fail("checkpoint", times: 1)
      let run = try await queue.add(strict, input: 1)
      let status = try await finished(queue, run.id, Scripted.self)
      await queue.jobs.shutdown()
      try expect(status == .completed(1), "the step succeeded; its save failed once: \(status)")
      try expect(runs.count("work") == 2, "it ran again, its result not stored the first time: \(runs.all)")
    },
    check(
      "workflow: a CancellationError the code throws of its own, the run not cancelled, ends the run dead"
    ) {
      store in
      let thrower = Scripted(name: "thrower") { input, context in
        _ = try await context.step("first") { input }
        throw CancellationError()
      }
      let queue = try WorkflowQueue(
        configuration: workflowConfiguration(), store: store, workflows: [thrower])
      let run = try await queue.add(thrower, input: 1)
      let status = try await finished(queue, run.id, Scripted.self)
      await queue.jobs.shutdown()
      try expect(status == .dead("the workflow's code threw: CancellationError()"), "dead: \(status)")
    },
    check("workflow: after a cancel, code that catches the step's error cannot start another step") { store in
      let runs = StepRuns()
      let started = Gate()
      let blocking = Scripted(name: "blocking") { input, context in
        do {
          _ = try await context.step("wait") { () -> Int in
            runs.ran("wait")
            started.open()
            try await Task.sleep(for: .seconds(60))
            return 0
          }
        } catch {
          _ = try await context.step("compensate") { () -> Int in
            runs.ran("compensate")
            return 0
          }
        }
        return input
      }
      let queue = try WorkflowQueue(
        configuration: workflowConfiguration(), store: store, workflows: [blocking])
      let run = try await queue.add(blocking, input: 1)
      await started.wait()
      try expect(try await queue.jobs.cancel(run.id) == .cancelledRunning, "cancelled while running")
      let status = try await finished(queue, run.id, Scripted.self)
      try await Task.sleep(for: .milliseconds(200))
      await queue.jobs.shutdown()
      try expect(status == .cancelled, "cancelled: \(status)")
      try expect(runs.count("compensate") == 0, "no later step after cancel: \(runs.all)")
    },
    check("workflow: after a re-queue of a dead run, a vanished worker's claim still counts against the step")
    {
      store in
      let runs = StepRuns()
      let phase = StepRuns()
      let workflow = Scripted(name: "w") { input, context in
        _ = try await context.step("first", policy: .init(maxAttempts: 3, retryPolicy: .fixed(.zero))) {
          runs.ran("first")
          if runs.count("first") <= 2 { throw StepError(text: "flaky") }
          return 1
        }
        if phase.count("fixed") == 0 { throw StepError(text: "bug") }
        return try await context.step("crashy", policy: .once) {
          runs.ran("crashy")
          return input
        }
      }
      let first = try WorkflowQueue(
        configuration: workflowConfiguration(), store: store, workflows: [workflow])
      let run = try await first.add(workflow, input: 7)
      let dead = try await finished(first, run.id, Scripted.self)
      await first.jobs.shutdown()
      try expect(dead == .dead("the workflow's code threw: bug"), "dead: \(dead)")
      phase.ran("fixed")
      var configuration = workflowConfiguration()
      configuration.autoStart = false
      let fixed = try WorkflowQueue(configuration: configuration, store: store, workflows: [workflow])
      try expect(try await fixed.jobs.requeueDead([run.id]) == 1, "re-queued")
      try await vanishingClaim(store)
      fixed.jobs.start()
      let status = try await finished(fixed, run.id, Scripted.self)
      await fixed.jobs.shutdown()
      try expect(
        status
          == deadOfOneCrash("crashy"),
        "the interrupted attempt was not counted: \(status)")
      try expect(runs.count("crashy") == 0, "the step with one attempt ran again: \(runs.all)")
    },
    check(
      "workflow: after a shutdown cut a run short, a vanished worker's claim counts against the next step"
    ) {
      store in
      let runs = StepRuns()
      let entered = Gate()
      let letGo = Gate()
      let workflow = Scripted(name: "f") { input, context in
        _ = try await context.step("slow") { () -> Int in
          runs.ran("slow")
          entered.open()
          if runs.count("slow") == 1 { await letGo.wait() }  // ignores cancellation, as much real work does
          return 1
        }
        try await context.sleep(for: .milliseconds(50))
        return try await context.step("crashy", policy: .once) {
          runs.ran("crashy")
          return input
        }
      }
      let first = try WorkflowQueue(
        configuration: workflowConfiguration(), store: store, workflows: [workflow])
      let run = try await first.add(workflow, input: 9)
      await entered.wait()
      let stopping = Task { await first.jobs.shutdown(gracePeriod: .zero) }
      try await Task.sleep(for: .milliseconds(100))
      letGo.open()
      await stopping.value
      // Whether the step's result was saved depends on the store: a store whose calls end when
      // their task is cancelled does not save it (the step runs again), the in-memory store does.
      let saved = try await first.run(run.id)?.history.map(\.label) ?? []
      try await vanishingClaim(store)
      let second = try WorkflowQueue(
        configuration: workflowConfiguration(), store: store, workflows: [workflow])
      let status = try await finished(second, run.id, Scripted.self)
      await second.jobs.shutdown()
      if saved == ["step \"slow\""] {
        try expect(
          status
            == deadOfOneCrash("crashy"), "the vanished claim was not counted: \(status)")
      } else {
        try expect(saved.isEmpty, "nothing or the step saved: \(saved)")
        try expect(status == .completed(9), "completed: \(status)")
        let slow = try await second.run(run.id)?.history.first
        try expect(
          slow?.failedAttempts == 1, "the vanished claim counted against slow: \(String(describing: slow))")
      }
    },
    check("workflow: resumption grows with every claim, a claim given back by a shutdown included") { store in
      let seen = Mutex<[Int64]>([])
      let entered = Gate()
      let workflow = Scripted(name: "g") { input, context in
        try await context.step("work") { () -> Int in
          seen.withLock { $0.append(context.resumption) }
          entered.open()
          if seen.withLock({ $0.count }) == 1 { try await Task.sleep(for: .seconds(60)) }
          return input
        }
      }
      let first = try WorkflowQueue(
        configuration: workflowConfiguration(), store: store, workflows: [workflow])
      let run = try await first.add(workflow, input: 3)
      await entered.wait()
      await first.jobs.shutdown(gracePeriod: .zero)
      let second = try WorkflowQueue(
        configuration: workflowConfiguration(), store: store, workflows: [workflow])
      let status = try await finished(second, run.id, Scripted.self)
      await second.jobs.shutdown()
      let values = seen.withLock { $0 }
      try expect(status == .completed(3), "completed: \(status)")
      try expect(values.count == 2 && values[1] > values[0], "resumption seen by each claim: \(values)")
    },
    check(
      "workflow: a shutdown is not a step failure: code that catches the step's error does not compensate"
    ) {
      store in
      let runs = StepRuns()
      let entered = Gate()
      let workflow = Scripted(name: "h") { input, context in
        do {
          _ = try await context.step("wait") { () -> Int in
            runs.ran("wait")
            entered.open()
            if runs.count("wait") == 1 { try await Task.sleep(for: .seconds(60)) }
            return 0
          }
        } catch {
          _ = try await context.step("compensate") { () -> Int in
            runs.ran("compensate")
            return 0
          }
          return -1
        }
        return input
      }
      let first = try WorkflowQueue(
        configuration: workflowConfiguration(), store: store, workflows: [workflow])
      let run = try await first.add(workflow, input: 5)
      await entered.wait()
      await first.jobs.shutdown(gracePeriod: .zero)
      let second = try WorkflowQueue(
        configuration: workflowConfiguration(), store: store, workflows: [workflow])
      let status = try await finished(second, run.id, Scripted.self)
      await second.jobs.shutdown()
      try expect(status == .completed(5), "completed: \(status)")
      try expect(runs.count("compensate") == 0, "no compensation: \(runs.all)")
    },
    check("workflow: a store that keeps no checkpoints is refused") { store in
      let older = InstrumentedJobStore(store)
      older.hideCheckpoints()
      do {
        _ = try WorkflowQueue(configuration: workflowConfiguration(), store: older, workflows: [])
        throw ConformanceFailure(description: "accepted")
      } catch JobQueueError.checkpointsUnsupported {}
    },
  ]
}
