import Foundation
import Testing

@testable import conveyor

/// `add exec|http --ordering-key`: jobs of one key run one at a time in the order added, the later
/// ones held meanwhile (`status`, `list`, `show`); keys that break the rules are refused and
/// stored nowhere; keys are printed escaped; schedules refuse the option. Each test on its own
/// SQLite file, through real processes.
@Suite struct OrderingKeyTests {
  /// A command that appends `start NAME` to `log`, sleeps, then appends `end NAME`.
  private func logging(_ name: String, to log: String, sleep: String = "0.4") -> [String] {
    ["sh", "-c", "echo \"start $1\" >> \"$2\"; sleep \(sleep); echo \"end $1\" >> \"$2\"", "sh", name, log]
  }

  private func logLines(_ log: String) -> [String] {
    (try? String(contentsOfFile: log, encoding: .utf8))?.split(separator: "\n").map(String.init) ?? []
  }

  /// Two jobs of key K (the later one of higher priority) and one of key L, worked by four
  /// workers at once: the two of K run one after the other, in the order added; before the work
  /// the second of K is held, and `status`, `list` and `show` say so.
  @Test func jobsOfOneKeyRunOneAtATimeInTheOrderAdded() async throws {
    let sandbox = try Sandbox()
    let log = sandbox.path("runs.log")
    let first = try await sandbox.add(["exec", "--ordering-key", "K", "--"] + logging("A", to: log))
    let secondAdded = try await sandbox.run(
      ["add", "exec", "--ordering-key", "K", "--priority", "5", "--"] + logging("B", to: log))
    #expect(secondAdded.status == 0, "\(secondAdded)")
    let second = try #require(Int(secondAdded.stdout.trimmingCharacters(in: .whitespacesAndNewlines)))
    #expect(secondAdded.stderr.contains("job \(second) is held by ordering key \"K\""), "\(secondAdded)")
    let other = try await sandbox.add(["exec", "--ordering-key", "L", "--"] + logging("C", to: log))

    #expect(try await sandbox.counts() == counts(ready: 2, held: 1))
    let status = try await sandbox.succeed(["status"]).lines
    #expect(
      status.contains("held      1 (waiting behind an earlier job of their ordering key)"), "\(status)")
    let shown = try await sandbox.succeed(["show", String(second)]).lines
    #expect(
      shown.contains { $0.hasPrefix("status    pending (held by ordering key \"K\"") }, "\(shown)")
    #expect(shown.contains("ordering key K"))
    let shownJSON = try await sandbox.succeed(["show", "--json", String(second)]).object()
    #expect(shownJSON["held"] as? Bool == true && shownJSON["orderingKey"] as? String == "K")
    let firstJSON = try await sandbox.succeed(["show", "--json", String(first)]).object()
    #expect(firstJSON["held"] as? Bool == false && firstJSON["orderingKey"] as? String == "K")
    let table = try await sandbox.succeed(["list"]).lines
    let secondRow = try #require(table.firstIndex { $0.hasPrefix("\(second) ") })
    #expect(table[secondRow].contains(" held "), "\(table)")
    #expect(table[secondRow + 1].contains("held by ordering key \"K\""), "\(table)")
    #expect(table.contains { $0.hasSuffix("ordering key \"L\"") }, "\(table)")
    #expect(try await sandbox.listed(["--status", "held"]).map { $0["id"] as? Int } == [second])
    #expect(try await sandbox.listed(["--status", "ready"]).map { $0["id"] as? Int } == [first, other])

    let work = try await sandbox.run(["work", "--until-empty", "--concurrency", "4"], timeout: .seconds(30))
    #expect(work.status == 0, "\(work)")
    #expect(try await sandbox.allCounts() == allCounts(completed: 3))
    let lines = logLines(log)
    #expect(Set(lines) == ["start A", "end A", "start B", "end B", "start C", "end C"], "\(lines)")
    let ofK = lines.filter { $0.hasSuffix(" A") || $0.hasSuffix(" B") }
    #expect(ofK == ["start A", "end A", "start B", "end B"], "K's jobs in order, never at once: \(lines)")
  }

  /// Two jobs of key K: the head appends "head" to the log only once the flag file exists (it
  /// fails until then), the tail appends "tail". Returns the head's ID, the log and the flag.
  private func headAndTail(in sandbox: Sandbox) async throws -> (head: Int, log: String, flag: String) {
    let log = sandbox.path("runs.log")
    let flag = sandbox.path("ok")
    let head = try await sandbox.add([
      "exec", "--ordering-key", "K", "--", "sh", "-c", "test -e \"$1\" && echo head >> \"$2\"", "sh", flag,
      log,
    ])
    _ = try await sandbox.add([
      "exec", "--ordering-key", "K", "--", "sh", "-c", "echo tail >> \"$1\"", "sh", log,
    ])
    return (head, log, flag)
  }

  /// A dead job holds the later jobs of its key: `work --until-empty` stops and says so, and they
  /// run once it is re-queued with `retry`.
  @Test func aDeadJobHoldsItsKeyUntilItIsRetried() async throws {
    let sandbox = try Sandbox()
    let (head, log, flag) = try await headAndTail(in: sandbox)
    let failed = try await sandbox.run(["work", "--until-empty", "--max-attempts", "1"])
    #expect(failed.status == 1, "\(failed)")
    #expect(
      failed.stderr.contains("1 job(s) left held behind an earlier job of their ordering key"), "\(failed)")
    #expect(failed.stderr.contains("re-queued (conveyor retry)"), "\(failed)")
    #expect(try await sandbox.counts() == counts(held: 1, dead: 1))
    #expect(
      try await sandbox.succeed(["status"]).lines.contains { $0.hasPrefix("note      a dead job holds") })
    #expect(logLines(log).isEmpty)

    #expect(FileManager.default.createFile(atPath: flag, contents: nil))
    try await sandbox.succeed(["retry", String(head)])
    try await sandbox.succeed(["work", "--until-empty"])
    #expect(logLines(log) == ["head", "tail"])
    #expect(try await sandbox.allCounts() == allCounts(completed: 2))
  }

  /// With `work --dead-releases-key`, a dead job leaves its key: the later jobs of the key run,
  /// and re-queued, the dead one runs on its own (its key cleared).
  @Test func aDeadJobReleasesItsKeyWhenTheWorkerIsToldTo() async throws {
    let sandbox = try Sandbox()
    let (head, log, flag) = try await headAndTail(in: sandbox)
    let worked = try await sandbox.run([
      "work", "--until-empty", "--max-attempts", "1", "--dead-releases-key",
    ])
    #expect(worked.status == 1, "a job died: \(worked)")
    #expect(!worked.stderr.contains("held behind"), "\(worked)")
    #expect(logLines(log) == ["tail"], "the later job ran")
    #expect(try await sandbox.allCounts() == allCounts(dead: 1, completed: 1))
    #expect(try await sandbox.succeed(["help", "work"]).stdout.contains("--dead-releases-key"))

    #expect(FileManager.default.createFile(atPath: flag, contents: nil))
    try await sandbox.succeed(["retry", String(head)])
    try await sandbox.succeed(["work", "--until-empty"])
    #expect(logLines(log) == ["tail", "head"])
    #expect(try await sandbox.allCounts() == allCounts(completed: 2))
  }

  /// A dead job that released its key holds nothing: `status` does not say it holds a key when
  /// another key's job is held behind a ready head.
  @Test func statusBlamesNoDeadJobThatReleasedItsKey() async throws {
    let sandbox = try Sandbox()
    _ = try await sandbox.add(["exec", "--ordering-key", "K", "--", "false"])
    let worked = try await sandbox.run([
      "work", "--until-empty", "--max-attempts", "1", "--dead-releases-key",
    ])
    #expect(worked.status == 1, "\(worked)")
    _ = try await sandbox.add(["exec", "--ordering-key", "L", "--", "true"])
    _ = try await sandbox.add(["exec", "--ordering-key", "L", "--", "true"])
    #expect(try await sandbox.counts() == counts(ready: 1, held: 1, dead: 1))
    let status = try await sandbox.succeed(["status"]).lines
    #expect(!status.contains { $0.hasPrefix("note      a dead job holds") }, "\(status)")
  }

  /// A dead job that kept its key but has nothing behind it holds nothing: `status` does not
  /// blame it for a job of another key held behind a ready head.
  @Test func statusBlamesNoDeadJobWithNothingBehindIt() async throws {
    let sandbox = try Sandbox()
    _ = try await sandbox.add(["exec", "--ordering-key", "K", "--", "false"])
    let worked = try await sandbox.run(["work", "--until-empty", "--max-attempts", "1"])
    #expect(worked.status == 1, "\(worked)")
    _ = try await sandbox.add(["exec", "--ordering-key", "L", "--", "true"])
    _ = try await sandbox.add(["exec", "--ordering-key", "L", "--", "true"])
    #expect(try await sandbox.counts() == counts(ready: 1, held: 1, dead: 1))
    var status = try await sandbox.succeed(["status"]).lines
    #expect(!status.contains { $0.hasPrefix("note      a dead job holds") }, "\(status)")
    // A job of K now waits behind the dead one: the note is right.
    _ = try await sandbox.add(["exec", "--ordering-key", "K", "--", "true"])
    status = try await sandbox.succeed(["status"]).lines
    #expect(status.contains { $0.hasPrefix("note      a dead job holds") }, "\(status)")
  }

  /// Keys that break the rules exit 2 with what to pass, for both kinds of job, and store
  /// nothing: empty, and more than 512 UTF-8 bytes (counted in bytes, not characters). (A NUL
  /// cannot be passed in an argument.) 512 bytes is taken.
  @Test func badKeysAreRefusedAndStoreNothing() async throws {
    let sandbox = try Sandbox()
    let cases: [(String, String)] = [
      ("", "--ordering-key cannot be empty"),
      (String(repeating: "a", count: 513), "at most 512 UTF-8 bytes, this one has 513"),
      (String(repeating: "é", count: 257), "at most 512 UTF-8 bytes, this one has 514"),
    ]
    for (key, message) in cases {
      for job in [
        ["exec", "--ordering-key", key, "--", "true"],
        ["http", "--ordering-key", key, "GET", "http://127.0.0.1:9/"],
      ] {
        let refused = try await sandbox.run(["add"] + job)
        #expect(refused.status == 2, "\(job.prefix(1)) \(key.utf8.count) bytes: \(refused)")
        #expect(refused.stderr.contains(message), "\(refused)")
        #expect(refused.stdout.isEmpty)
      }
    }
    #expect(try await sandbox.allCounts() == allCounts())
    #expect(try await sandbox.listed().isEmpty)
    let longest = String(repeating: "a", count: 512)
    let id = try await sandbox.add(["exec", "--ordering-key", longest, "--", "true"])
    let shown = try await sandbox.succeed(["show", "--json", String(id)]).object()
    #expect(shown["orderingKey"] as? String == longest)
  }

  /// A key with CR, LF, an ANSI escape and a C1 control is taken as given, and printed escaped
  /// wherever it is shown: `add`'s held note, `list`, `show`; JSON holds it exactly.
  @Test func aKeyWithControlCharactersIsStoredAsGivenAndPrintedEscaped() async throws {
    let sandbox = try Sandbox()
    let key = "a\r\nb\u{1B}[31mc\u{9B}2J"
    let escaped = #"a\r\nb\u{1B}[31mc\u{9B}2J"#
    _ = try await sandbox.add(["exec", "--ordering-key", key, "--", "true"])
    let second = try await sandbox.run(["add", "exec", "--ordering-key", key, "--", "true"])
    #expect(second.status == 0, "\(second)")
    let id = try #require(Int(second.stdout.trimmingCharacters(in: .whitespacesAndNewlines)))
    #expect(second.stderr.contains("held by ordering key \"\(escaped)\""), "\(second)")
    let list = try await sandbox.succeed(["list"])
    let show = try await sandbox.succeed(["show", String(id)])
    for outcome in [second, list, show] {
      let text = outcome.stdout + outcome.stderr
      #expect(!text.contains("\u{1B}") && !text.contains("\r") && !text.contains("\u{9B}"), "\(outcome)")
    }
    #expect(list.stdout.contains("held by ordering key \"\(escaped)\""), "\(list)")
    #expect(show.stdout.contains("ordering key \(escaped)\n"), "\(show)")
    #expect(show.stdout.contains("(held by ordering key \"\(escaped)\""), "\(show)")
    let listed = try await sandbox.listed()
    #expect(listed.map { $0["orderingKey"] as? String } == [key, key])
    #expect(listed.map { $0["held"] as? Bool } == [false, true])
  }

  /// A schedule has no ordering key for its slots' jobs: `--ordering-key` among the schedule's
  /// options or the job's is refused with exit 2 and nothing is stored; a job's argument after
  /// `--` is only an argument.
  @Test func scheduleAddRefusesAnOrderingKey() async throws {
    let sandbox = try Sandbox()
    for words in [
      ["tick", "--every", "1h", "--ordering-key", "K", "exec", "--", "true"],
      ["tick", "--every", "1h", "exec", "--ordering-key=K", "--", "true"],
      ["tick", "--every", "1h", "http", "GET", "https://example.com/", "--ordering-key", "K"],
    ] {
      let refused = try await sandbox.run(["schedule", "add"] + words)
      #expect(refused.status == 2, "\(words): \(refused)")
      #expect(refused.stderr.contains("schedules cannot carry an ordering key yet"), "\(refused)")
    }
    #expect(try await sandbox.succeed(["schedules", "--json"]).stdout.isEmpty)
    try await sandbox.succeed([
      "schedule", "add", "tick", "--every", "1h", "exec", "--", "echo", "--ordering-key",
    ])
    try await sandbox.succeed([
      "schedule", "add", "keyed", "--every", "1h", "--key", "--ordering-key", "exec", "--", "true",
    ])
  }

  /// The outbox job carries its ordering key in its payload; a payload stored before the field
  /// existed decodes without one, and a long key never pushes the summary out of the first bytes.
  @Test func theOutboxJobCarriesItsKeyAndOldPayloadsDecode() throws {
    let old = Data(#"{"kind":{"exec":{"_0":{"arguments":["true"]}}}}"#.utf8)
    let decoded = try JSONDecoder().decode(OutboxJob.self, from: old)
    #expect(decoded.orderingKey == nil && decoded.key == nil && decoded.summary == "exec true")
    let job = OutboxJob(
      kind: .exec(ShellCommand(arguments: ["echo", "hi"])), key: nil,
      orderingKey: String(repeating: "k", count: 512))
    let payload = try CLI.storedPayload(job)
    #expect(try JSONDecoder().decode(OutboxJob.self, from: payload) == job)
    #expect(OutboxJob.summary(ofStart: payload.prefix(100), payloadSize: payload.count) == "exec echo hi")
  }
}
