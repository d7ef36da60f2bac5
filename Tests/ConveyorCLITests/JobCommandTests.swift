import Foundation
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// `add`, `status`, `list`, `work`, `retry`, `remove`, `purge`, `pause` and `resume` on exec jobs,
/// each test on its own database file.
@Suite struct JobCommandTests {
  @Test func addPrintsIncreasingJobIDsThatStatusCounts() async throws {
    let sandbox = try Sandbox()
    let first = try await sandbox.add(["exec", "--", "echo", "one"])
    let second = try await sandbox.add(["exec", "--", "echo", "two"])
    let later = try await sandbox.add(["exec", "--delay", "600", "--", "echo", "later"])
    #expect(first < second && second < later)

    let text = try await sandbox.succeed(["status"]).lines
    #expect(text.contains("queue     outbox"))
    #expect(text.contains("ready     2"))
    #expect(text.contains("scheduled 1"))
    #expect(text.contains("dead      0"))

    let status = try await sandbox.succeed(["status", "--json"]).object()
    #expect(status["paused"] as? Bool == false)
    #expect(status["queue"] as? String == "outbox")
    #expect((status["database"] as? String)?.hasSuffix("/jobs.sqlite") == true)
    #expect(try await sandbox.counts() == counts(ready: 2, scheduled: 1))
  }

  @Test func addWithTheKeyOfAWaitingJobReturnsThatJob() async throws {
    let sandbox = try Sandbox()
    let first = try await sandbox.add(["exec", "--key", "nightly", "--", "echo", "one"])
    let again = try await sandbox.add(["exec", "--key", "nightly", "--", "echo", "two"])
    #expect(again == first)
    #expect(try await sandbox.counts() == counts(ready: 1))
  }

  /// `--replace` is a debounce: the waiting job of the key takes the newest command and delay,
  /// and runs once.
  @Test func addWithReplaceGivesTheWaitingJobOfTheKeyTheNewCommand() async throws {
    let sandbox = try Sandbox()
    let first = try await sandbox.add([
      "exec", "--key", "k", "--replace", "--delay", "600", "--", "echo", "one",
    ])
    let replaced = try await sandbox.run(["add", "exec", "--key", "k", "--replace", "--", "echo", "two"])
    #expect(replaced.status == 0 && replaced.stdout == "\(first)\n", "\(replaced)")
    #expect(replaced.stderr.contains("job \(first) with the same --key was waiting; it now has this job's"))
    #expect(try await sandbox.counts() == counts(ready: 1), "one job, ready at once")
    let shown = try await sandbox.succeed(["show", String(first)]).stdout
    #expect(shown.contains("echo two") && !shown.contains("echo one"), "\(shown)")
  }

  /// `--unique running`: a running job of the key stops a new one; `--unique 1h` also a job
  /// completed within the hour.
  @Test func addWithUniqueCountsRunningAndCompletedJobsOfTheKey() async throws {
    let sandbox = try Sandbox()
    let first = try await sandbox.add(["exec", "--key", "k", "--unique", "1h", "--", "true"])
    try await sandbox.succeed(["work", "--until-empty"])
    #expect(try await sandbox.allCounts() == allCounts(completed: 1))
    let within = try await sandbox.run(["add", "exec", "--key", "k", "--unique", "1h", "--", "true"])
    #expect(within.status == 0 && within.stdout == "\(first)\n", "\(within)")
    #expect(
      within.stderr.contains("not stored: job \(first) with the same --key is waiting, running or completed"))
    // The default scope leaves the completed job out.
    let plain = try await sandbox.add(["exec", "--key", "k", "--", "true"])
    #expect(plain != first)
    for bad in [["--unique", "soon"], ["--unique", "0"], ["--unique", "-1h"]] {
      let refused = try await sandbox.run(["add", "exec", "--key", "k"] + bad + ["--", "true"])
      #expect(refused.status == 2 && refused.stderr.contains("--unique must be"), "\(bad): \(refused)")
    }
    let longer = try await sandbox.run(["add", "exec", "--key", "w", "--unique", "7d", "--", "true"])
    #expect(longer.status == 0 && longer.stderr.contains("run them with --keep-completed"), "\(longer)")
    let keyless = try await sandbox.run(["add", "exec", "--replace", "--", "true"])
    #expect(keyless.status == 2 && keyless.stderr.contains("need a --key"), "\(keyless)")
  }

  @Test func theDatabaseComesFromTheEnvironmentWithoutDatabase() async throws {
    let sandbox = try Sandbox()
    let fromVariable = sandbox.path("from-variable.sqlite")
    let variable = ["CONVEYOR_DATABASE": fromVariable]
    let added = try await sandbox.run(
      ["add", "exec", "--", "true"], withDatabase: false, extraEnvironment: variable)
    #expect(added.status == 0, "\(added)")
    let status = try await sandbox.run(["status", "--json"], withDatabase: false, extraEnvironment: variable)
    #expect(try status.object()["database"] as? String == fromVariable)
    #expect(try await sandbox.counts() == counts(), "--database wins over CONVEYOR_DATABASE")

    // Neither: the default file in the data folder ($XDG_DATA_HOME, the sandbox's in these tests).
    let fallback = try await sandbox.run(["status", "--json"], withDatabase: false)
    #expect(try fallback.object()["database"] as? String == sandbox.path("xdg-data/conveyor/conveyor.sqlite"))
  }

  @Test func queuesAreSeparate() async throws {
    let sandbox = try Sandbox()
    try await sandbox.add(["exec", "--", "echo", "one"])
    try await sandbox.succeed(["--queue", "other", "add", "exec", "--", "echo", "two"])
    try await sandbox.succeed(["--queue", "other", "add", "exec", "--", "echo", "three"])
    #expect(try await sandbox.counts() == counts(ready: 1))
    let other = try await sandbox.succeed(["--queue", "other", "status", "--json"]).object()
    #expect(other["queue"] as? String == "other")
    #expect(other["counts"] as? [String: Int] == allCounts(ready: 2))
  }

  @Test func listShowsJobsFiltersByStatusAndLimits() async throws {
    let sandbox = try Sandbox()
    // One dead job (its only attempt fails), then two pending ones.
    let failing = try await sandbox.add(["exec", "--", "sh", "-c", "echo 'disk full' >&2; exit 3"])
    let work = try await sandbox.run(["work", "--until-empty", "--max-attempts", "1"])
    #expect(work.status == 1, "\(work)")
    let echo = try await sandbox.add(["exec", "--", "echo", "hello world"])
    let third = try await sandbox.add(["exec", "--", "true"])

    let table = try await sandbox.succeed(["list"]).lines
    #expect(table.first?.hasPrefix("ID") == true)
    let failingRow = try #require(table.first { $0.hasPrefix("\(failing) ") })
    #expect(failingRow.contains("dead"))
    #expect(failingRow.contains(#"exec sh -c "echo 'disk full' >&2; exit 3""#))
    #expect(
      table.contains { $0.contains("last error: ") && $0.hasSuffix("exit status 3; output: disk full") })
    #expect(table.contains { $0.hasPrefix("\(echo) ") && $0.contains(#"exec echo "hello world""#) })

    let all = try await sandbox.listed()
    #expect(all.map { $0["id"] as? Int } == [failing, echo, third])
    #expect(all.map { $0["status"] as? String } == ["dead", "pending", "pending"])
    #expect(all.map { $0["attempts"] as? Int } == [1, 0, 0])
    #expect((all[0]["lastError"] as? String)?.contains("exit status 3") == true)
    #expect(all[2]["job"] as? String == "exec true")

    let dead = try await sandbox.listed(["--status", "dead"])
    #expect(dead.map { $0["id"] as? Int } == [failing])
    let pending = try await sandbox.listed(["--status", "pending"])
    #expect(pending.map { $0["id"] as? Int } == [echo, third])
    let limited = try await sandbox.listed(["--limit", "2"])
    #expect(limited.map { $0["id"] as? Int } == [failing, echo])
    let limitedTable = try await sandbox.succeed(["list", "--status", "pending", "--limit", "1"]).lines
    #expect(limitedTable.count == 2)  // the header and one job
  }

  @Test func workUntilEmptyRunsEveryCommand() async throws {
    let sandbox = try Sandbox()
    let first = sandbox.path("first.txt")
    let second = sandbox.path("second.txt")
    try await sandbox.add(["exec", "--", "sh", "-c", "echo ran > '\(first)'"])
    try await sandbox.add(["exec", "--cwd", sandbox.folder.path, "--", "touch", "second.txt"])

    let work = try await sandbox.run(["work", "--until-empty"])
    #expect(work.status == 0, "\(work)")
    #expect(work.lines.last == "done: 2 delivered, 0 retries scheduled, 0 dead")
    #expect(FileManager.default.contents(atPath: first) == Data("ran\n".utf8))
    #expect(FileManager.default.fileExists(atPath: second))
    #expect(try await sandbox.counts() == counts())
  }

  @Test func workUntilEmptyOnAnEmptyQueueReturnsAtOnce() async throws {
    let sandbox = try Sandbox()
    let work = try await sandbox.run(["work", "--until-empty"], timeout: .seconds(10))
    #expect(work.status == 0, "\(work)")
    #expect(work.lines.last == "done: 0 delivered, 0 retries scheduled, 0 dead")
  }

  @Test func aFailingCommandIsRetriedThenDeadAndWorkExitsOne() async throws {
    let sandbox = try Sandbox()
    let marker = sandbox.path("attempts.txt")
    let id = try await sandbox.add(["exec", "--", "sh", "-c", "echo x >> '\(marker)'; echo boom >&2; exit 3"])

    let work = try await sandbox.run(["work", "--until-empty", "--max-attempts", "2", "--json"])
    #expect(work.status == 1, "\(work)")
    let events = try work.objects()
    let started = events.filter { $0["event"] as? String == "started" }
    #expect(started.map { $0["attempt"] as? Int } == [1, 2])
    #expect(started.allSatisfy { $0["job"] as? Int == id })
    #expect(events.filter { $0["event"] as? String == "retry_scheduled" }.count == 1)
    let died = try #require(events.first { $0["event"] as? String == "died" })
    #expect(died["job"] as? Int == id)
    #expect((died["error"] as? String)?.contains("exit status 3; output: boom") == true)
    #expect(FileManager.default.contents(atPath: marker) == Data("x\nx\n".utf8))

    let dead = try await sandbox.listed(["--status", "dead"])
    #expect(dead.count == 1)
    #expect(dead.first?["attempts"] as? Int == 2)
    #expect(try await sandbox.counts() == counts(dead: 1))
  }

  @Test func retryRemoveAndPurge() async throws {
    let sandbox = try Sandbox()
    var ids: [Int] = []
    for _ in 0..<3 { ids.append(try await sandbox.add(["exec", "--", "false"])) }
    let kill = ["work", "--until-empty", "--max-attempts", "1"]
    #expect(try await sandbox.run(kill).status == 1)
    #expect(try await sandbox.counts() == counts(dead: 3))

    #expect(try await sandbox.succeed(["retry", String(ids[0])]).stdout == "re-queued 1 dead job(s)\n")
    #expect(try await sandbox.counts() == counts(ready: 1, dead: 2))
    // Like `remove`, an ID that could not be acted on makes the exit status 1.
    let notDead = try await sandbox.run(["retry", String(ids[0]), String(ids[1])])
    #expect(notDead.status == 1, "\(notDead)")
    #expect(notDead.stdout == "re-queued 1 dead job(s)\n")
    #expect(notDead.stderr.contains("1 of the IDs were not re-queued: not found, not dead"))
    #expect(try await sandbox.succeed(["retry", "--all"]).stdout == "re-queued 1 dead job(s)\n")
    #expect(try await sandbox.counts() == counts(ready: 3))
    let retried = try await sandbox.listed()
    #expect(retried.map { $0["status"] as? String } == ["pending", "pending", "pending"])

    #expect(try await sandbox.run(kill).status == 1)
    #expect(try await sandbox.succeed(["remove", String(ids[0])]).stdout == "removed 1 job(s)\n")
    #expect(try await sandbox.listed().map { $0["id"] as? Int } == [ids[1], ids[2]])
    let missing = try await sandbox.run(["remove", String(ids[0])])
    #expect(missing.status == 1, "\(missing)")
    #expect(missing.stdout == "removed 0 job(s)\n")
    #expect(missing.stderr.contains("1 of the IDs were not found"))
    let repeated = try await sandbox.run(["remove", String(ids[1]), String(ids[1])])
    #expect(repeated.status == 0, "an ID named twice is removed once: \(repeated)")
    #expect(repeated.stdout == "removed 1 job(s)\n")
    #expect(try await sandbox.listed().map { $0["id"] as? Int } == [ids[2]])

    let pending = try await sandbox.add(["exec", "--", "true"])
    #expect(try await sandbox.succeed(["purge"]).stdout == "deleted 1 dead job(s)\n")
    #expect(try await sandbox.listed().map { $0["id"] as? Int } == [pending])
    try await sandbox.add(["exec", "--delay", "600", "--", "true"])
    #expect(try await sandbox.succeed(["purge", "--all"]).stdout == "deleted 2 job(s)\n")
    #expect(try await sandbox.counts() == counts())
  }

  @Test func pauseStopsEveryWorkerUntilResume() async throws {
    let sandbox = try Sandbox()
    let marker = sandbox.path("ran.txt")
    #expect(try await sandbox.succeed(["pause"]).stdout == "queue outbox paused\n")
    try await sandbox.add(["exec", "--", "touch", marker])
    #expect(try await sandbox.succeed(["status"]).lines.contains("queue     outbox (paused)"))
    #expect(try await sandbox.succeed(["status", "--json"]).object()["paused"] as? Bool == true)

    let worker = try sandbox.start(["work", "--until-empty", "--json"])
    try await worker.waitForLine("the paused state") { $0.contains(#""state":"paused""#) }
    try await Task.sleep(for: .milliseconds(500))
    #expect(!FileManager.default.fileExists(atPath: marker))
    #expect(try await sandbox.counts() == counts(ready: 1))
    worker.signal(SIGTERM)
    let stopped = try await worker.waitForExit(timeout: .seconds(10))
    #expect(stopped.status == 0, "\(stopped)")
    #expect(!FileManager.default.fileExists(atPath: marker))

    #expect(try await sandbox.succeed(["resume"]).stdout == "queue outbox resumed\n")
    #expect(try await sandbox.succeed(["status", "--json"]).object()["paused"] as? Bool == false)
    let work = try await sandbox.run(["work", "--until-empty"])
    #expect(work.status == 0, "\(work)")
    #expect(FileManager.default.fileExists(atPath: marker))
  }

  @Test func aCommandPastItsTimeoutIsStopped() async throws {
    let sandbox = try Sandbox()
    let marker = sandbox.path("finished.txt")
    try await sandbox.add(["exec", "--timeout", "0.5", "--", "sh", "-c", "sleep 60; touch '\(marker)'"])
    // `run` kills the worker and throws after 20 s of running: the command, left alone, would
    // sleep a minute. (A bound on the wall time here also counted the wait for a place to run.)
    let work = try await sandbox.run(["work", "--until-empty", "--max-attempts", "1", "--json"])
    #expect(work.status == 1, "\(work)")
    let died = try #require(try work.objects().first { $0["event"] as? String == "died" })
    #expect((died["error"] as? String)?.contains("timed out after 0.5 s") == true)
    #expect(!FileManager.default.fileExists(atPath: marker))
  }

  #if os(Linux)
    @Test func commandsGetOnlyStandardDescriptorsAndNoBlockedSignals() async throws {
      let sandbox = try Sandbox()
      let status = sandbox.path("status.txt")
      let descriptors = sandbox.path("descriptors.txt")
      try await sandbox.add(["exec", "--", "sh", "-c", "exec cat /proc/self/status > '\(status)'"])
      try await sandbox.add(["exec", "--", "sh", "-c", "exec ls /proc/self/fd > '\(descriptors)'"])
      #expect(try await sandbox.run(["work", "--until-empty"]).status == 0)
      func lines(_ path: String) -> [String] {
        String(decoding: FileManager.default.contents(atPath: path) ?? Data(), as: UTF8.self)
          .split(separator: "\n").map(String.init)
      }
      // Standard input, output and error, and the folder ls reads.
      #expect(lines(descriptors) == ["0", "1", "2", "3"], "inherited descriptors")
      #expect(lines(status).contains("SigBlk:\t0000000000000000"), "\(lines(status))")
      // Bit n - 1 stands for signal n; glibc keeps its internal signals 32 and 33 as it likes.
      let ignored = try #require(lines(status).first { $0.hasPrefix("SigIgn:") })
      let mask = try #require(
        UInt64(ignored.dropFirst("SigIgn:".count).trimmingCharacters(in: .whitespaces), radix: 16))
      #expect(mask & 0x7FFF_FFFF == 0, "ignored signals: \(ignored)")
    }
  #endif

  @Test func aRelativeProgramPathIsFoundInTheWorkingDirectory() async throws {
    let sandbox = try Sandbox()
    let script = sandbox.path("tools/hello.sh")
    try FileManager.default.createDirectory(
      atPath: sandbox.path("tools"), withIntermediateDirectories: true)
    try Data("#!/bin/sh\necho \"hello from $(pwd)\" > out.txt\n".utf8).write(to: URL(fileURLWithPath: script))
    try FileManager.default.setAttributes([.posixPermissions: 0o755], ofItemAtPath: script)
    try await sandbox.add(["exec", "--cwd", sandbox.path("tools"), "--", "./hello.sh"])
    let work = try await sandbox.run(["work", "--until-empty"])
    #expect(work.status == 0, "\(work)")
    let written = FileManager.default.contents(atPath: sandbox.path("tools/out.txt")) ?? Data()
    #expect(String(decoding: written, as: UTF8.self).hasPrefix("hello from "))
  }

  @Test func aMissingWorkingDirectoryIsNamedInTheError() async throws {
    let sandbox = try Sandbox()
    let missing = sandbox.path("not-made-yet")
    try await sandbox.add(["exec", "--cwd", missing, "--", "true"])
    let work = try await sandbox.run(["work", "--until-empty", "--max-attempts", "1"])
    #expect(work.status == 1, "\(work)")
    let dead = try await sandbox.listed(["--status", "dead"])
    #expect(
      (dead.first?["lastError"] as? String)?.contains("the working directory \(missing) does not exist")
        == true)
  }

  @Test func aMissingProgramIsDeadAtOnce() async throws {
    let sandbox = try Sandbox()
    try await sandbox.add(["exec", "--", "conveyor-test-no-such-program"])
    let work = try await sandbox.run(["work", "--until-empty"])
    #expect(work.status == 1, "\(work)")
    let dead = try await sandbox.listed(["--status", "dead"])
    #expect(dead.first?["attempts"] as? Int == 1)
    #expect(
      (dead.first?["lastError"] as? String)?.contains("command not found: conveyor-test-no-such-program")
        == true)
  }
}

/// `cancel`: a waiting job never runs; a job another process runs has its command stopped by that
/// worker, which goes on working, and is not retried. On a SQLite file and on PostgreSQL.
@Suite struct CancelCommandTests {
  @Test func cancellingAWaitingJobMeansItNeverRunsAndSaysSoForEachID() async throws {
    let sandbox = try Sandbox()
    let marker = sandbox.path("ran")
    let id = try await sandbox.add(["exec", "--", "/bin/sh", "-c", "echo ran > \(marker)"])
    let cancelled = try await sandbox.succeed(["cancel", "\(id)", "\(id + 50)"])
    #expect(cancelled.stdout.contains("job \(id): cancelled; it will not run"), "\(cancelled)")
    #expect(cancelled.stdout.contains("job \(id + 50): no such job"), "\(cancelled)")
    try await sandbox.succeed(["work", "--until-empty"])
    #expect(!FileManager.default.fileExists(atPath: marker), "the cancelled command ran")
    let again = try await sandbox.succeed(["cancel", "\(id)"])
    #expect(again.stdout.contains("job \(id): already cancelled"), "a second cancel is a no-op: \(again)")
    let shown = try await sandbox.succeed(["show", "\(id)", "--json"]).object()
    #expect(
      shown["status"] as? String == "cancelled" && shown["finishedAt"] != nil, "kept as history: \(shown)")
    let usage = try await sandbox.run(["cancel"])
    #expect(usage.status == 2 && usage.stderr.contains("name the job IDs to cancel"), "\(usage)")
    let bad = try await sandbox.run(["cancel", "12\r\nx"])
    #expect(bad.status == 2 && !bad.stderr.contains("\r"), "\(bad)")
  }

  @Test func cancellingAJobAnotherProcessRunsStopsItsCommandOnSQLite() async throws {
    let sandbox = try Sandbox()
    try await Self.cancelRunningJob(in: sandbox, database: sandbox.database)
  }

  @Test(.enabled(if: LocalPostgres.binaries != nil))
  func cancellingAJobAnotherProcessRunsStopsItsCommandOnPostgreSQL() async throws {
    let sandbox = try Sandbox()
    let server = try await LocalPostgres.start(in: sandbox)
    defer { server.stop() }
    try await Self.cancelRunningJob(in: sandbox, database: server.url)
  }

  /// Starts a worker on a job whose command records its process ID and sleeps ten minutes,
  /// cancels the job from another process, and waits for the command to be gone while the
  /// worker still runs.
  static func cancelRunningJob(in sandbox: Sandbox, database: String) async throws {
    let pidFile = sandbox.path("pid")
    let added = try await sandbox.run(
      ["--database", database, "add", "exec", "--", "/bin/sh", "-c", "echo $$ > \(pidFile); exec sleep 600"],
      withDatabase: false)
    #expect(added.status == 0, "\(added)")
    let id = added.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    // A lease of ten minutes: its heartbeats (every 200 s) cannot be what tells the worker within
    // the minute this test waits; the worker's claim checks (twice a second) must.
    let worker = try sandbox.start(
      ["--database", database, "work", "--json", "--lease", "600"], withDatabase: false)
    defer { kill(worker.process.processIdentifier, SIGKILL) }
    func commandPID() -> pid_t? {
      guard let text = try? String(contentsOfFile: pidFile, encoding: .utf8) else { return nil }
      return pid_t(text.trimmingCharacters(in: .whitespacesAndNewlines))
    }
    try await worker.waitUntil("the command to start", timeout: .seconds(60)) { commandPID() != nil }
    let pid = try #require(commandPID())
    let cancelled = try await sandbox.run(["--database", database, "cancel", id], withDatabase: false)
    #expect(
      cancelled.status == 0 && cancelled.stdout.contains("job \(id): cancelled while running"), "\(cancelled)"
    )
    try await worker.waitUntil("the worker to stop the command", timeout: .seconds(60)) { kill(pid, 0) != 0 }
    #expect(!worker.hasExited, "the worker goes on working")
    let listed = try await sandbox.run(
      ["--database", database, "list", "--status", "cancelled", "--json"], withDatabase: false)
    #expect(
      listed.status == 0 && (try? listed.objects().map { ($0["id"] as? Int).map(String.init) }) == [id],
      "the job is cancelled: \(listed)")
    kill(worker.process.processIdentifier, SIGTERM)
    let done = try await worker.waitForExit(timeout: .seconds(60))
    let events = try done.objects().compactMap { $0["event"] as? String }
    #expect(events.filter { $0 != "state" && $0 != "finished" } == ["started"], "not retried: \(done)")
  }
}
