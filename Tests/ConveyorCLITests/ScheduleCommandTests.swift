import Foundation
import Testing

/// `schedule add|remove|pause|resume` and `schedules`, each test on its own SQLite file; and a
/// `work` process firing a stored schedule.
@Suite struct ScheduleCommandTests {
  /// The schedules `schedules --json` lists, by name.
  private func schedules(_ sandbox: Sandbox, sourceLocation: SourceLocation = #_sourceLocation) async throws
    -> [String: [String: Any]]
  {
    let listed = try await sandbox.succeed(["schedules", "--json"], sourceLocation: sourceLocation).objects()
    return Dictionary(
      listed.map { ($0["name"] as? String ?? "", $0) }, uniquingKeysWith: { first, _ in first })
  }

  @Test func addListPauseResumeAndRemoveRoundTrip() async throws {
    let sandbox = try Sandbox()
    let added = try await sandbox.succeed([
      "schedule", "add", "digest", "--cron", "0 8 * * MON-FRI", "--time-zone", "Europe/Berlin", "--catch-up",
      "all", "--jitter", "30s", "--priority", "3", "--time-limit", "1h", "http", "POST",
      "https://example.com/digest", "-H", "Authorization: Bearer secret", "--data", "{}",
    ])
    #expect(added.lines.first == "schedule digest created in queue outbox: cron 0 8 * * MON-FRI", "\(added)")
    // The next fire time, in Berlin and in UTC: 08:00 there is 07:00 or 06:00 UTC.
    let next = try #require(added.lines.last)
    #expect(next.hasPrefix("next fire ") && next.contains("T08:00:00+0") && next.contains(" Europe/Berlin ("))
    #expect(next.contains(":00:00Z UTC)"), "\(next)")
    try await sandbox.succeed([
      "schedule", "add", "tick", "--every", "15m", "exec", "--", "echo", "hello world",
    ])
    try await sandbox.succeed([
      "schedule", "add", "single", "--every", "1h", "--key", "backup", "--unique", "running", "exec", "--",
      "true",
    ])

    var listed = try await schedules(sandbox)
    #expect(listed.keys.sorted() == ["digest", "single", "tick"])
    let single = try #require(listed["single"])
    #expect(single["key"] as? String == "backup" && single["unique"] as? String == "running", "\(single)")
    #expect(single["replace"] as? Bool == false)
    let digest = try #require(listed["digest"])
    #expect(digest["spacing"] as? String == "cron 0 8 * * MON-FRI")
    #expect(digest["timeZone"] as? String == "Europe/Berlin")
    #expect(digest["catchUp"] as? String == "all:100", "all alone is all:100")
    #expect(digest["jitterMilliseconds"] as? Int == 30_000)
    #expect(digest["priority"] as? Int == 3)
    #expect(digest["timeLimitMilliseconds"] as? Int == 3_600_000)
    #expect(digest["state"] as? String == "active" && digest["origin"] as? String == "added")
    #expect(digest["job"] as? String == "http POST https://example.com/digest", "no header value shown")
    #expect((digest["nextFireLocal"] as? String)?.contains("T08:00:00+0") == true)
    let tick = try #require(listed["tick"])
    #expect(tick["spacing"] as? String == "every 900s" && tick["everySeconds"] as? Int == 900)
    #expect(tick["timeZone"] as? String == "UTC" && tick["catchUp"] as? String == "skip")
    #expect(tick["job"] as? String == #"exec echo "hello world""#)
    #expect(tick["lastSlot"] == nil)
    let tickNext = try #require(tick["nextFire"] as? String)
    #expect(
      tickNext.hasSuffix(":00Z") && [":00:", ":15:", ":30:", ":45:"].contains { tickNext.contains($0) })

    let table = try await sandbox.succeed(["schedules"]).lines
    #expect(table.first?.hasPrefix("NAME") == true)
    let tickRow = try #require(table.first { $0.hasPrefix("tick ") })
    #expect(tickRow.contains(" active ") && tickRow.contains(tickNext) && tickRow.hasSuffix("every 900s"))
    #expect(table.contains(#"        job: exec echo "hello world""#))

    let paused = try await sandbox.succeed(["schedule", "pause", "tick"])
    #expect(paused.stdout.hasPrefix("schedule tick paused"))
    listed = try await schedules(sandbox)
    #expect(listed["tick"]?["state"] as? String == "paused")
    #expect(listed["tick"]?["nextFire"] == nil, "a paused schedule has no next fire")
    #expect(
      try #require(try await sandbox.succeed(["schedules"]).lines.first { $0.hasPrefix("tick ") }).contains(
        " — "))
    // Adding it again updates it and keeps it paused.
    let again = try await sandbox.succeed(["schedule", "add", "tick", "--every", "1h", "exec", "--", "true"])
    #expect(
      again.lines == [
        "schedule tick updated in queue outbox: every 3600s",
        "it is paused: no slot fires until 'conveyor schedule resume tick'",
      ])
    let resumed = try await sandbox.succeed(["schedule", "resume", "tick"])
    #expect(
      resumed.stdout.hasPrefix("schedule tick resumed; next fire ") && resumed.stdout.contains(":00:00Z UTC"))
    #expect(try await schedules(sandbox)["tick"]?["state"] as? String == "active")

    let removed = try await sandbox.succeed(["schedule", "remove", "tick"])
    #expect(removed.stdout.hasPrefix("schedule tick removed from queue outbox"))
    #expect(try await schedules(sandbox).keys.sorted() == ["digest", "single"])
    for verb in ["remove", "pause", "resume"] {
      let absent = try await sandbox.run(["schedule", verb, "tick"])
      #expect(
        absent.status == 1 && absent.stderr.contains("no schedule tick in queue outbox"), "\(verb): \(absent)"
      )
    }
    // Schedules belong to their queue.
    let elsewhere = try await sandbox.run(["--queue", "other", "schedule", "pause", "digest"])
    #expect(elsewhere.status == 1 && elsewhere.stderr.contains("no schedule digest in queue other"))
    #expect(try await sandbox.succeed(["--queue", "other", "schedules", "--json"]).stdout.isEmpty)
    #expect(try await sandbox.counts() == counts(), "storing schedules adds no job")
  }

  /// Each refused command line exits 2 with the reason, and stores nothing.
  @Test func badSchedulesAreRefusedAndStoreNothing() async throws {
    let sandbox = try Sandbox()
    let job = ["exec", "--", "true"]
    let refusals: [([String], String)] = [
      (["--cron", "* * * * *", "--every", "1m"], "give --cron or --every, not both"),
      ([], "give --cron EXPR or --every DURATION"),
      (["--cron", "*/0 * * * *"], "invalid cron expression: the minute step \"0\""),
      (["--cron", "0 8 * * *", "--time-zone", "Mars/Olympus"], "invalid time zone: \"Mars/Olympus\""),
      (["--every", "1m", "--catch-up", "all:0"], "N from 1 to 1000"),
      (["--every", "1m", "--catch-up", "all:1001"], "N from 1 to 1000"),
      (["--every", "1m", "--catch-up", "sometimes"], "--catch-up must be skip, latest, all or all:N"),
      (["--every", "0"], "invalid interval"),
      (["--every", "1.5s"], "--every must be a whole number with a unit"),
      (["--every", "1m", "--jitter", "2h"], "invalid jitter"),
      (["--every", "1m", "--time-zone", "UTC"], "--time-zone applies to --cron"),
      (["--every", "1m", "--time-limit", "8d"], "invalid time limit"),
      (["--every", "1m", "--unique", "running"], "--unique and --replace need a --key"),
      (["--every", "1m", "--key", "k", "--unique", "sometimes"], "--unique must be waiting, running"),
    ]
    for (options, message) in refusals {
      let outcome = try await sandbox.run(["schedule", "add", "nightly"] + options + job)
      #expect(outcome.status == 2 && outcome.stderr.contains(message), "\(options): \(outcome)")
      #expect(outcome.stdout.isEmpty, "\(options)")
    }
    let spaced = try await sandbox.run(["schedule", "add", "a b", "--every", "1m"] + job)
    #expect(spaced.status == 2 && spaced.stderr.contains("invalid schedule name: \"a b\""), "\(spaced)")
    let jobRefusals: [([String], String)] = [
      (["--every", "1m"], "missing the job"),
      (["--every", "1m", "ftp", "x"], "unknown job kind \"ftp\""),
      (["--every", "1m", "exec", "--key", "k", "--", "true"], "--key is an option of the schedule"),
      (["--every", "1m", "exec", "--delay", "5", "--", "true"], "--delay is an option of conveyor add"),
      (["exec", "--every", "1m", "--", "true"], "--every is an option of the schedule"),
      (["--every", "1m", "exec"], "put the command after --"),
      (["--every", "1m", "http", "GET", "ftp://example.com"], "is not an http:// or https:// URL"),
    ]
    for (words, message) in jobRefusals {
      let outcome = try await sandbox.run(["schedule", "add", "nightly"] + words)
      #expect(outcome.status == 2 && outcome.stderr.contains(message), "\(words): \(outcome)")
    }
    let badName = try await sandbox.run(["schedule", "pause", "a b"])
    #expect(badName.status == 2 && badName.stderr.contains("invalid schedule name"), "\(badName)")
    let noVerb = try await sandbox.run(["schedule"])
    #expect(
      noVerb.status == 2 && noVerb.stderr.contains("missing schedule command (add, remove, pause or resume)"))
    #expect(try await sandbox.succeed(["schedules", "--json"]).stdout.isEmpty, "nothing was stored")
  }

  /// A cron expression may hold tabs between its fields: every listing shows them escaped.
  @Test func aCronExpressionIsShownEscaped() async throws {
    let sandbox = try Sandbox()
    let added = try await sandbox.succeed([
      "schedule", "add", "tabbed", "--cron", "0\t8 * * *", "exec", "--", "true",
    ])
    #expect(added.lines.first == #"schedule tabbed created in queue outbox: cron 0\t8 * * *"#, "\(added)")
    let table = try await sandbox.succeed(["schedules"])
    #expect(!table.stdout.contains("\t"))
    #expect(table.lines.contains { $0.hasPrefix("tabbed ") && $0.hasSuffix(#"cron 0\t8 * * *"#) }, "\(table)")
    let listed = try #require(try await schedules(sandbox)["tabbed"])
    #expect(listed["cron"] as? String == "0\t8 * * *")
  }

  /// A worker fires a stored schedule: its command runs at each slot.
  @Test func aWorkerRunsTheJobsOfAStoredSchedule() async throws {
    let sandbox = try Sandbox()
    let file = sandbox.path("ticks")
    try await sandbox.succeed([
      "schedule", "add", "tick", "--every", "1s", "exec", "--", "/bin/sh", "-c", "echo x >> \"$0\"", file,
    ])
    let worker = try sandbox.start(["work"])
    func lines() -> Int {
      (FileManager.default.contents(atPath: file).map { String(decoding: $0, as: UTF8.self) } ?? "")
        .split(separator: "\n").count
    }
    try await worker.waitUntil("two slots' commands", timeout: .seconds(20)) { lines() >= 2 }
    await worker.terminate()
    let tick = try #require(try await schedules(sandbox)["tick"])
    #expect(tick["lastSlot"] is String, "the slots fired are recorded")
  }
}
