import Conveyor
import Foundation
import Testing

@testable import ConveyorSQLite

/// `limits` and `limits set`: a queue's stored concurrency limit, set and shown through real
/// processes on a real SQLite file (and a PostgreSQL server when one is installed); values that
/// cannot be stored are refused with exit 2 and change nothing; `status` and the dashboard show
/// the limit, and why nothing more is claimed when it is reached.
@Suite struct LimitsCommandTests {
  /// The stored concurrency `limits --json` reports: nil for none (`null`, which must be there).
  private func storedConcurrency(
    _ sandbox: Sandbox, _ global: [String] = [], sourceLocation: SourceLocation = #_sourceLocation
  ) async throws -> Int? {
    let shown = try await sandbox.succeed(global + ["limits", "--json"], sourceLocation: sourceLocation)
      .object()
    #expect(shown.keys.contains("concurrency"), "\(shown)", sourceLocation: sourceLocation)
    return shown["concurrency"] as? Int
  }

  /// Claims `count` ready jobs of `queue` in the sandbox's file through the library, as a worker
  /// of another process would: they are running until their lease lapses.
  private func claim(_ count: Int, queue: String = "outbox", in sandbox: Sandbox) async throws -> Int {
    let store = try SQLiteJobStore(path: sandbox.database)
    let lease = Lease(owner: "limits-test", duration: .seconds(600))
    let batch = try await store.settleAndClaim(
      [], queue: queue, limit: count, lease: lease, clock: SystemJobClock())
    await store.close()
    return batch.claimed.count
  }

  @Test func setShowAndRemoveRoundTrip() async throws {
    let sandbox = try Sandbox()
    #expect(try await sandbox.succeed(["limits"]).lines == ["queue outbox: no limits (0 running)"])
    let none = try await sandbox.succeed(["limits", "--json"]).object()
    #expect(none["concurrency"] is NSNull, "null, not left out: \(none)")
    #expect(none["queue"] as? String == "outbox" && none["running"] as? Int == 0)

    let set = try await sandbox.succeed(["limits", "set", "--concurrency", "3"])
    #expect(set.lines == ["queue outbox: concurrency 3 (0 running)"], "prints what was stored: \(set)")
    #expect(try await sandbox.succeed(["limits"]).lines == ["queue outbox: concurrency 3 (0 running)"])
    #expect(try await storedConcurrency(sandbox) == 3)
    // Per queue: another queue has none, and its own is kept apart.
    #expect(try await storedConcurrency(sandbox, ["--queue", "mail"]) == nil)
    let mail = try await sandbox.succeed([
      "--queue", "mail", "limits", "set", "--concurrency=1000000", "--json",
    ])
    .object()
    #expect(mail["queue"] as? String == "mail" && mail["concurrency"] as? Int == 1_000_000, "\(mail)")
    #expect(try await storedConcurrency(sandbox) == 3)

    let removed = try await sandbox.succeed(["limits", "set", "--concurrency", "none"])
    #expect(removed.lines == ["queue outbox: no limits (0 running)"], "\(removed)")
    #expect(try await storedConcurrency(sandbox) == nil)
    #expect(try await storedConcurrency(sandbox, ["--queue", "mail"]) == 1_000_000)
    // "+1" is a whole number as well.
    try await sandbox.succeed(["limits", "set", "--concurrency", "+1"])
    #expect(try await storedConcurrency(sandbox) == 1)

    let help = try await sandbox.succeed(["help", "limits"]).stdout
    #expect(help.contains("Usage: conveyor limits [options]") && help.contains("--concurrency N"), "\(help)")
    #expect(try await sandbox.succeed(["--help"]).stdout.contains("\n  limits set "))
  }

  @Test func aRateIsSetShownAndKeptBesideTheConcurrency() async throws {
    let sandbox = try Sandbox()
    let set = try await sandbox.succeed(["limits", "set", "--rate", "10/s", "--burst", "3"])
    #expect(
      set.lines == ["queue outbox: no concurrency limit (0 running), rate 10/s (bursts of 3)"], "\(set)")
    // A limit not named keeps its stored value.
    let both = try await sandbox.succeed(["limits", "set", "--concurrency", "2"])
    #expect(both.lines == ["queue outbox: concurrency 2 (0 running), rate 10/s (bursts of 3)"], "\(both)")
    let burst = try await sandbox.succeed(["limits", "set", "--burst", "1"])
    #expect(burst.lines == ["queue outbox: concurrency 2 (0 running), rate 10/s"], "\(burst)")
    let slower = try await sandbox.succeed(["limits", "set", "--rate=30/min", "--json"]).object()
    let rate = try #require(slower["rate"] as? [String: Any], "\(slower)")
    #expect(rate["perSecond"] as? Double == 0.5 && rate["burst"] as? Int == 1, "\(slower)")
    #expect(
      try await sandbox.succeed(["limits"]).lines == ["queue outbox: concurrency 2 (0 running), rate 30/min"])
    for (text, shown) in [
      ("2.5/h", "2.5/h"), ("0.5/s", "30/min"), ("1000000/s", "1000000/s"), ("3/s", "3/s"),
    ] {
      let outcome = try await sandbox.succeed(["limits", "set", "--rate", text])
      #expect(
        outcome.lines == ["queue outbox: concurrency 2 (0 running), rate \(shown)"], "\(text): \(outcome)")
    }
    let lines = try await sandbox.succeed(["status"]).lines
    #expect(lines.contains("rate      at most 3/s starting, across every worker"), "\(lines)")
    let status = try await sandbox.succeed(["status", "--json"]).object()
    let limits = try #require(status["limits"] as? [String: Any], "\(status)")
    #expect((limits["rate"] as? [String: Any])?["perSecond"] as? Double == 3, "\(status)")

    let removed = try await sandbox.succeed(["limits", "set", "--rate", "none", "--json"]).object()
    #expect(
      removed["rate"] is NSNull && removed["concurrency"] as? Int == 2, "null, not left out: \(removed)")
    let help = try await sandbox.succeed(["help", "limits"]).stdout
    #expect(help.contains("--rate N/s") && help.contains("--burst B"), "\(help)")
  }

  @Test func ratesThatCannotBeStoredExitTwoAndKeepTheStoredLimits() async throws {
    let sandbox = try Sandbox()
    try await sandbox.succeed(["limits", "set", "--concurrency", "3", "--rate", "5/s", "--burst", "2"])
    let stored = try await sandbox.succeed(["limits", "--json"]).stdout
    let refused = [
      "0/s", "-1/s", "abc", "5", "5/sec", "5 /s", "/s", "1e3/s", "0x10/s", "３/s", "NaN/s", "inf/s", "1./s",
      ".5/s", "2000000/s", "0.5/d", "1/h/s", String(repeating: "9", count: 400) + "/s", "5/S", "",
      "0.00001/s", "+3/s",
    ]
    for value in refused {
      let outcome = try await sandbox.run(["limits", "set", "--rate", value])
      #expect(outcome.status == 2, "\(value): \(outcome)")
      #expect(
        outcome.stderr.contains("--rate must be a number of starts per second, minute or hour")
          && outcome.stderr.contains("the stored limits were not changed"), "\(value): \(outcome)")
      #expect(outcome.stdout.isEmpty, "\(value): \(outcome)")
    }
    for value in ["0", "-2", "1000001", "1.5", "x", ""] {
      let outcome = try await sandbox.run(["limits", "set", "--burst", value])
      #expect(
        outcome.status == 2 && outcome.stderr.contains("--burst must be a whole number"),
        "\(value): \(outcome)")
    }
    // A concurrency refused alongside a good rate stores neither.
    let mixed = try await sandbox.run(["limits", "set", "--concurrency", "0", "--rate", "9/s"])
    #expect(mixed.status == 2, "\(mixed)")
    let noneAndBurst = try await sandbox.run(["limits", "set", "--rate", "none", "--burst", "4"])
    #expect(
      noneAndBurst.status == 2 && noneAndBurst.stderr.contains("--burst goes with a rate"), "\(noneAndBurst)")
    #expect(
      try await sandbox.succeed(["limits", "--json"]).stdout == stored, "every refusal left the limits")
    try await sandbox.succeed(["limits", "set", "--rate", "none"])
    let burstAlone = try await sandbox.run(["limits", "set", "--burst", "4"])
    #expect(burstAlone.status == 2 && burstAlone.stderr.contains("--burst needs a rate"), "\(burstAlone)")
  }

  /// `status` and `limits` say when the rate is what keeps ready jobs waiting, and for how long.
  @Test func statusSaysWhenTheRateKeepsReadyJobsWaiting() async throws {
    let sandbox = try Sandbox()
    for _ in 0..<3 { try await sandbox.add(["exec", "--", "true"]) }
    try await sandbox.succeed(["limits", "set", "--rate", "1/h"])
    var status = try await sandbox.succeed(["status", "--json"]).object()
    #expect(
      status["rateReached"] as? Bool == false && status["nextStartIn"] == nil, "a start is there: \(status)")
    // Another process takes the hour's one start.
    #expect(try await claim(1, in: sandbox) == 1)
    let lines = try await sandbox.succeed(["status"]).lines
    let waiting = lines.first {
      $0.hasPrefix("waiting   rate limit of 1/h reached: 2 ready jobs wait for the next start, in ")
    }
    #expect(waiting?.contains(" min ") == true, "\(lines)")
    status = try await sandbox.succeed(["status", "--json"]).object()
    #expect(status["rateReached"] as? Bool == true, "\(status)")
    let wait = status["nextStartIn"] as? Double ?? 0
    #expect(wait > 3_000 && wait <= 3_600, "about an hour: \(status)")
    let shown = try await sandbox.succeed(["limits"]).lines
    #expect(shown.contains { $0.hasPrefix("rate limit of 1/h reached: 2 ready jobs wait") }, "\(shown)")
    try await sandbox.succeed(["limits", "set", "--rate", "none"])
    status = try await sandbox.succeed(["status", "--json"]).object()
    #expect(status["rateReached"] == nil && status["nextStartIn"] == nil, "no rate, no word of it: \(status)")
  }

  /// What no `RateLimit` can be is refused by the file itself (a hand edit, another tool): the
  /// rate's columns check their range, and a worker still runs the queue.
  @Test func theFileRefusesARateOutOfRange() async throws {
    let sandbox = try Sandbox()
    try await sandbox.succeed(["limits", "set", "--rate", "10/s", "--burst", "2"])
    try await sandbox.add(["exec", "--", "true"])
    let store = try SQLiteJobStore(path: sandbox.database)
    for change in ["rate = 0", "rate = -1", "rate = 2000000", "burst = 0", "burst = 1000001"] {
      await #expect(throws: (any Error).self, "\(change)") {
        try await store.connection.perform { db in
          try db.execute("UPDATE queues SET \(change) WHERE name = 'outbox'")
        }
      }
    }
    await store.close()
    #expect(
      try await sandbox.succeed(["limits"]).lines == [
        "queue outbox: no concurrency limit (0 running), rate 10/s (bursts of 2)"
      ])
    let work = try await sandbox.run(["work", "--until-empty"], timeout: .seconds(60))
    #expect(work.status == 0, "\(work)")
  }

  /// A worker process obeys a rate set by another: at 4 a second, one at a time, the sixth of
  /// six commands cannot start before 1.25 s after the rate was stored (the bucket fills when it
  /// is stored, and a command starts after its claim), and `--until-empty` still ends.
  @Test func aWorkerObeysTheStoredRate() async throws {
    let sandbox = try Sandbox()
    let log = sandbox.path("starts.log")
    for _ in 0..<6 {
      try await sandbox.add(["exec", "--", "sh", "-c", "date +%s%N >> \"$1\"", "sh", log])
    }
    try await sandbox.succeed(["limits", "set", "--rate", "4/s"])
    let stored = Date()
    let worked = try await sandbox.run(
      ["work", "--concurrency", "4", "--until-empty"], timeout: .seconds(60))
    #expect(worked.status == 0, "\(worked)")
    let starts = try String(contentsOfFile: log, encoding: .utf8).split(separator: "\n")
      .compactMap { Double($0) }.map { $0 / 1e9 - stored.timeIntervalSince1970 }.sorted()
    #expect(starts.count == 6, "\(starts)")
    for (index, start) in starts.enumerated() {
      #expect(
        start >= Double(index) * 0.25 - 0.01,
        "start \(index + 1) at \(start) s, before the rate allows: \(starts)")
    }
  }

  @Test func valuesThatCannotBeStoredExitTwoAndKeepTheStoredLimit() async throws {
    let sandbox = try Sandbox()
    try await sandbox.succeed(["limits", "set", "--concurrency", "3"])
    let refused = [
      "0", "-1", "abc", "99999999999999999999", "1000001", "", "NaN", "3.5", " 3", "3 ", "1e3", "0x10", "３",
      "None", "-0",
    ]
    for value in refused {
      for words in [["limits", "set", "--concurrency", value], ["limits", "set", "--concurrency=\(value)"]] {
        let outcome = try await sandbox.run(words)
        #expect(outcome.status == 2, "\(words): \(outcome)")
        #expect(
          outcome.stderr.contains(
            "--concurrency must be a whole number from 1 to 1000000, or none to remove the limit")
            && outcome.stderr.contains("the stored limits were not changed"), "\(words): \(outcome)")
        #expect(outcome.stdout.isEmpty, "\(words): \(outcome)")
      }
    }
    let zero = try await sandbox.run(["limits", "set", "--concurrency", "0"])
    #expect(zero.stderr.contains("pause the queue (conveyor pause)"), "says what stops claims: \(zero)")
    // Usage mistakes: no limit, no value, an unknown verb or option.
    let mistakes: [([String], String)] = [
      (["limits", "set"], "conveyor: limits set needs a limit: --concurrency N (1 to 1000000)"),
      (["limits", "set", "3"], "needs a limit"),
      (["limits", "set", "--concurrency"], "--concurrency needs a value"),
      (["limits", "frob"], "unknown limits command \"frob\": use conveyor limits"),
      (["limits", "--concurrency", "3"], "unknown option \"--concurrency\" for conveyor limits"),
      (["limits", "set", "--concurrency", "4", "extra"], "unexpected argument \"extra\""),
      (["limits", "set", "--concurrency", "4", "--queue", "x"], "--queue goes before the command"),
    ]
    for (words, message) in mistakes {
      let outcome = try await sandbox.run(words)
      #expect(outcome.status == 2 && outcome.stderr.contains(message), "\(words): \(outcome)")
      #expect(outcome.stderr.contains("Run 'conveyor help' for usage."), "\(words): \(outcome)")
    }
    #expect(try await storedConcurrency(sandbox) == 3, "every refusal left the stored limit")
  }

  @Test func statusShowsTheLimitAndWhyNothingMoreIsClaimed() async throws {
    let sandbox = try Sandbox()
    for _ in 0..<4 { try await sandbox.add(["exec", "--", "true"]) }
    var lines = try await sandbox.succeed(["status"]).lines
    #expect(!lines.contains { $0.hasPrefix("limit ") || $0.contains("concurrency limit") }, "\(lines)")
    var status = try await sandbox.succeed(["status", "--json"]).object()
    #expect(status["limits"] == nil && status["limitReached"] == nil, "none without a limit: \(status)")

    try await sandbox.succeed(["limits", "set", "--concurrency", "2"])
    lines = try await sandbox.succeed(["status"]).lines
    #expect(lines.contains("limit     at most 2 running at once"), "\(lines)")
    #expect(!lines.contains { $0.contains("reached") }, "nothing runs yet: \(lines)")

    // Two running (claimed by "another process"), two ready: the limit is what holds them.
    #expect(try await claim(2, in: sandbox) == 2)
    lines = try await sandbox.succeed(["status"]).lines
    #expect(lines.contains("running   2") && lines.contains("ready     2"), "\(lines)")
    #expect(
      lines.contains("waiting   concurrency limit of 2 reached: 2 ready jobs wait for a place"), "\(lines)")
    status = try await sandbox.succeed(["status", "--json"]).object()
    #expect((status["limits"] as? [String: Any])?["concurrency"] as? Int == 2, "\(status)")
    #expect(status["limitReached"] as? Bool == true, "\(status)")
    #expect(
      try await sandbox.succeed(["limits"]).lines == [
        "queue outbox: concurrency 2 (2 running)",
        "concurrency limit of 2 reached: 2 ready jobs wait for a place",
      ])

    // Lowered below the number running: nothing stops, and it says so.
    let lowered = try await sandbox.succeed(["limits", "set", "--concurrency", "1"]).lines
    #expect(
      lowered == [
        "queue outbox: concurrency 1 (2 running)",
        "concurrency limit of 1 reached: 2 ready jobs wait for a place",
        "2 running is more than the limit: none is stopped, and no job is claimed until fewer than 1 run",
      ], "\(lowered)")
    // Raised above them: room again, no reason given.
    try await sandbox.succeed(["limits", "set", "--concurrency", "5"])
    lines = try await sandbox.succeed(["status"]).lines
    #expect(lines.contains("limit     at most 5 running at once"), "\(lines)")
    #expect(!lines.contains { $0.contains("reached") }, "\(lines)")
    status = try await sandbox.succeed(["status", "--json"]).object()
    #expect(status["limitReached"] as? Bool == false, "\(status)")
    // Removed: status no longer names one.
    try await sandbox.succeed(["limits", "set", "--concurrency", "none"])
    lines = try await sandbox.succeed(["status"]).lines
    #expect(!lines.contains { $0.hasPrefix("limit ") }, "\(lines)")
  }

  /// A worker process obeys a limit set by another: with a limit of 1, `work --concurrency 4`
  /// never runs two of the queue's commands at once.
  /// `limits set --key-concurrency` and `--key K --concurrency`: stored, merged with the other
  /// limits, shown, removed; bad values and keys exit 2 and change nothing.
  @Test func limitsPerKeyAreSetShownAndRemoved() async throws {
    let sandbox = try Sandbox()
    try await sandbox.succeed(["limits", "set", "--concurrency", "5"])
    let set = try await sandbox.succeed(["limits", "set", "--key-concurrency", "2"])
    #expect(
      set.lines == [
        "queue outbox: concurrency 5 (0 running)", "limit per key: 2 running at once for each --limit-key",
      ],
      "\(set)")
    try await sandbox.succeed(["limits", "set", "--key", "api.example.com", "--concurrency", "7"])
    let shown = try await sandbox.succeed(["limits", "--json"]).object()
    #expect(shown["concurrency"] as? Int == 5 && shown["keyConcurrency"] as? Int == 2, "\(shown)")
    #expect((shown["keyConcurrencyOverrides"] as? [String: Int]) == ["api.example.com": 7], "\(shown)")
    let lines = try await sandbox.succeed(["limits"]).lines
    #expect(lines.contains("key api.example.com: 7 running at once"), "\(lines)")
    let stored = try await sandbox.succeed(["limits", "--json"]).stdout
    for arguments in [
      ["--key-concurrency", "0"], ["--key-concurrency", "-1"], ["--key-concurrency", "x"],
      ["--key", "", "--concurrency", "1"], ["--key", "k", "--burst", "3"], ["--key", "k"],
      ["--key", String(repeating: "k", count: 513), "--concurrency", "1"],
    ] {
      let outcome = try await sandbox.run(["limits", "set"] + arguments)
      #expect(outcome.status == 2 && outcome.stdout.isEmpty, "\(arguments): \(outcome)")
      #expect(outcome.stderr.contains("the stored limits were not changed"), "\(arguments): \(outcome)")
    }
    #expect(
      try await sandbox.succeed(["limits", "--json"]).stdout == stored, "every refusal kept the limits")
    try await sandbox.succeed(["limits", "set", "--key", "api.example.com", "--concurrency", "none"])
    try await sandbox.succeed(["limits", "set", "--key-concurrency", "none"])
    let removed = try await sandbox.succeed(["limits", "--json"]).object()
    #expect(removed["keyConcurrency"] is NSNull, "\(removed)")
    #expect((removed["keyConcurrencyOverrides"] as? [String: Int]) == [:], "\(removed)")
    #expect(removed["concurrency"] as? Int == 5, "the queue's own limit is kept: \(removed)")
  }

  /// Rates per key through the command line: the rate per key and a key's own rate, with their
  /// bursts, stored, shown (text and JSON) and removed; bad values exit 2 and change nothing.
  @Test func ratesPerKeyAreSetShownAndRemoved() async throws {
    let sandbox = try Sandbox()
    let set = try await sandbox.succeed(["limits", "set", "--key-rate", "10/s", "--key-burst", "3"])
    #expect(
      set.lines == [
        "queue outbox: no concurrency limit (0 running)",
        "rate per key: at most 10/s (bursts of 3) starting for each --limit-key",
      ], "\(set)")
    let own = try await sandbox.succeed(["limits", "set", "--key", "api.example.com", "--rate", "30/min"])
    #expect(own.lines.contains("key api.example.com: at most 30/min starting"), "\(own)")
    try await sandbox.succeed([
      "limits", "set", "--key", "api.example.com", "--concurrency", "2", "--burst", "4",
    ])
    let both = try await sandbox.succeed(["limits"]).lines
    #expect(
      both.contains("key api.example.com: 2 running at once, at most 30/min (bursts of 4) starting"),
      "\(both)")
    let json = try await sandbox.succeed(["limits", "--json"]).object()
    #expect(
      (json["keyRate"] as? [String: Any])?["perSecond"] as? Double == 10
        && (json["keyRate"] as? [String: Any])?["burst"] as? Int == 3, "\(json)")
    let overrides = json["keyRateOverrides"] as? [String: [String: Any]]
    #expect(overrides?["api.example.com"]?["perSecond"] as? Double == 0.5, "\(json)")
    #expect(overrides?["api.example.com"]?["burst"] as? Int == 4, "\(json)")
    let status = try await sandbox.succeed(["status"]).lines
    #expect(
      status.contains("key rate  at most 10/s (bursts of 3) starting for each --limit-key"), "\(status)")
    #expect(
      status.contains("key       \"api.example.com\": 0 running of 2, at most 30/min (bursts of 4) starting"),
      "\(status)")
    // At 1/h with bursts of 4, claims take the key's 4 starts two at a time (its limit of 2 holds
    // the rest meanwhile), then the rate holds the other two, and `status` says which holds them.
    try await sandbox.succeed(["limits", "set", "--key", "api.example.com", "--rate", "1/h", "--burst", "4"])
    for _ in 0..<6 { try await sandbox.add(["exec", "--limit-key", "api.example.com", "--", "true"]) }
    #expect(try await claim(10, in: sandbox) == 2, "two of the key's limit")
    let running = try SQLiteJobStore(path: sandbox.database)
    for job in try await running.jobs(queue: "outbox", status: .running, after: nil, limit: 10) {
      _ = try await running.settleAndClaim(
        [JobSettlement(claim: job.claim, action: .complete)], queue: "outbox", limit: 0,
        lease: Lease(owner: "limits-test", duration: .seconds(600)), clock: SystemJobClock())
    }
    await running.close()
    #expect(try await claim(10, in: sandbox) == 2, "the burst's other two")
    let held = try await sandbox.succeed(["status"]).lines
    #expect(
      held.contains { $0.hasPrefix("waiting   limit of key \"api.example.com\" reached (2 running, ") },
      "\(held)")
    let ended = try SQLiteJobStore(path: sandbox.database)
    for job in try await ended.jobs(queue: "outbox", status: .running, after: nil, limit: 10) {
      _ = try await ended.settleAndClaim(
        [JobSettlement(claim: job.claim, action: .complete)], queue: "outbox", limit: 0,
        lease: Lease(owner: "limits-test", duration: .seconds(600)), clock: SystemJobClock())
    }
    await ended.close()
    #expect(try await claim(10, in: sandbox) == 0, "the bucket is empty")
    let rated = try await sandbox.succeed(["status"]).lines
    #expect(
      rated.contains("waiting   rate of \"api.example.com\" (at most 1/h (bursts of 4) starting, 2 held)"),
      "\(rated)")
    let stored = try await sandbox.succeed(["limits", "--json"]).stdout
    for arguments in [
      ["--key-rate", "0/s"], ["--key-rate", "NaN/s"], ["--key-rate", "10"], ["--key-burst", "0"],
      ["--key-rate", "none", "--key-burst", "2"], ["--key", "other", "--burst", "2"],
      ["--key", String(repeating: "k", count: 513), "--rate", "1/s"], ["--key", "k", "--rate", "-1/s"],
    ] {
      let outcome = try await sandbox.run(["limits", "set"] + arguments)
      #expect(outcome.status == 2 && outcome.stdout.isEmpty, "\(arguments): \(outcome)")
      #expect(outcome.stderr.contains("the stored limits were not changed"), "\(arguments): \(outcome)")
    }
    #expect(
      try await sandbox.succeed(["limits", "--json"]).stdout == stored, "every refusal kept the limits")
    try await sandbox.succeed(["limits", "set", "--key", "api.example.com", "--rate", "none"])
    try await sandbox.succeed(["limits", "set", "--key-rate", "none"])
    let removed = try await sandbox.succeed(["limits", "--json"]).object()
    #expect(removed["keyRate"] is NSNull, "\(removed)")
    #expect((removed["keyRateOverrides"] as? [String: Any])?.isEmpty == true, "\(removed)")
    #expect(
      (removed["keyConcurrencyOverrides"] as? [String: Int]) == ["api.example.com": 2], "kept: \(removed)")
  }

  /// With more keys holding jobs than `status` reads (1,000), its waiting line says how many more
  /// it could not count, as the key lines do, instead of a count short by the keys past them.
  @Test func statusCountsTheKeysHoldingJobsPastTheFirstThousand() async throws {
    let sandbox = try Sandbox()
    try await sandbox.succeed(["limits", "set", "--key-concurrency", "1"])
    let store = try SQLiteJobStore(path: sandbox.database)
    let keys = (0..<1_002).map { "k\($0)" }
    let jobs = keys.flatMap { key in
      (0..<2).map { _ in NewJob(payload: Data("{}".utf8), limitKey: key) }
    }
    _ = try await store.enqueue(jobs, queue: "outbox", clock: SystemJobClock())
    await store.close()
    #expect(try await claim(3_000, in: sandbox) == 1_002, "one job of each key")
    let lines = try await sandbox.succeed(["status"]).lines
    let waiting = lines.first { $0.hasPrefix("waiting   limit of key") } ?? ""
    #expect(lines.contains { $0.contains("and more than 995 more keys") }, "\(lines.suffix(12))")
    #expect(
      waiting.hasSuffix("; and 997 more keys") || waiting.contains("more than 995"),
      "1,002 keys hold jobs, 5 named: \(waiting)")
  }

  /// `--key K` with another spelling of a key that has limits of its own (a decomposed "é" for a
  /// precomposed one: the same text, other bytes, so another key to the stores) is refused with
  /// exit 2, and neither key's limits change: `QueueLimits` can hold limits for only one of them.
  @Test func aKeyOfAnotherSpellingThanAKeyWithItsOwnLimitsIsRefused() async throws {
    let sandbox = try Sandbox()
    let composed = "caf\u{E9}"
    let decomposed = "cafe\u{301}"
    try await sandbox.succeed(["limits", "set", "--key", composed, "--rate", "1/s", "--concurrency", "2"])
    let stored = try await sandbox.succeed(["limits", "--json"]).stdout
    for arguments in [
      ["--rate", "none"], ["--rate", "5/s"], ["--concurrency", "7"], ["--concurrency", "none"],
    ] {
      let outcome = try await sandbox.run(["limits", "set", "--key", decomposed] + arguments)
      #expect(outcome.status == 2 && outcome.stderr.contains("another spelling"), "\(arguments): \(outcome)")
      #expect(outcome.stderr.contains("the stored limits were not changed"), "\(arguments): \(outcome)")
    }
    #expect(
      try await sandbox.succeed(["limits", "--json"]).stdout == stored, "the composed key's limits kept")
    let store = try SQLiteJobStore(path: sandbox.database)
    let limits = try await store.limits(queue: "outbox")
    await store.close()
    #expect(limits.keyRateOverrides.keys.map { Array($0.utf8) } == [Array(composed.utf8)], "\(limits)")
    #expect(limits.keyConcurrencyOverrides.keys.map { Array($0.utf8) } == [Array(composed.utf8)], "\(limits)")
  }

  /// `status` lists every key with a limit: how many of its jobs run of its limit and how many it
  /// holds, the keys holding jobs first, then those with a limit of their own and no job; `--json`
  /// lists them all. Keys without a limit are not listed.
  @Test func statusListsEveryKeyWithALimit() async throws {
    let sandbox = try Sandbox()
    try await sandbox.succeed(["limits", "set", "--key-concurrency", "1"])
    try await sandbox.succeed(["limits", "set", "--key", "wide.example", "--concurrency", "3"])
    try await sandbox.succeed(["limits", "set", "--key", "idle.example", "--concurrency", "4"])
    for key in ["a.example", "a.example", "a.example", "wide.example", "b.example"] {
      try await sandbox.add(["exec", "--limit-key", key, "--", "true"])
    }
    #expect(try await claim(10, in: sandbox) == 3, "one of a.example, wide.example and b.example")
    let lines = try await sandbox.succeed(["status"]).lines
    let keys = lines.filter { $0.hasPrefix("key       ") }
    #expect(
      keys == [
        "key       \"a.example\": 1 running of 1, 2 held", "key       \"b.example\": 1 running of 1",
        "key       \"wide.example\": 1 running of 3", "key       \"idle.example\": 0 running of 4",
      ], "\(lines)")
    #expect(lines.contains("waiting   limit of key \"a.example\" reached (1 running, 2 held)"), "\(lines)")
    let json = try await sandbox.succeed(["status", "--json"]).object()
    let listed = (json["keys"] as? [[String: Any]])?.map {
      "\($0["key"] ?? "") \($0["running"] ?? "")/\($0["limit"] ?? "") \($0["held"] ?? "")"
    }
    #expect(
      listed == ["a.example 1/1 2", "b.example 1/1 0", "wide.example 1/3 0", "idle.example 0/4 0"], "\(json)")
    #expect(json["keysComplete"] as? Bool == true, "\(json)")
    #expect((json["heldByKeyLimit"] as? [[String: Any]])?.count == 1, "\(json)")
    // With only keys of their own limited, a key without one is not listed.
    try await sandbox.succeed(["limits", "set", "--key-concurrency", "none"])
    let overridesOnly = try await sandbox.succeed(["status"]).lines.filter { $0.hasPrefix("key       ") }
    #expect(
      overridesOnly == [
        "key       \"wide.example\": 1 running of 3", "key       \"idle.example\": 0 running of 4",
      ],
      "\(overridesOnly)")
  }

  /// `add http` gives a job its URL's host as its limit key unless `--limit-key` names another;
  /// `add exec` has none unless given; a bad key exits 2 and stores nothing.
  @Test func addGivesJobsTheirLimitKey() async throws {
    let sandbox = try Sandbox()
    let http = try await sandbox.add(["http", "POST", "https://API.Example.com:8443/v1/orders"])
    let named = try await sandbox.add(["http", "GET", "https://api.example.com/", "--limit-key", "tenant-7"])
    let command = try await sandbox.add(["exec", "--", "true"])
    let keyed = try await sandbox.add(["exec", "--limit-key", "db", "--", "true"])
    let store = try SQLiteJobStore(path: sandbox.database)
    #expect(try await store.job(JobID(Int64(http)))?.limitKey == "api.example.com")
    #expect(try await store.job(JobID(Int64(named)))?.limitKey == "tenant-7")
    #expect(try await store.job(JobID(Int64(command)))?.limitKey == nil)
    #expect(try await store.job(JobID(Int64(keyed)))?.limitKey == "db")
    await store.close()
    for key in ["", "a\u{1}b" + String(repeating: "x", count: 600)] {
      let outcome = try await sandbox.run(["add", "exec", "--limit-key", key, "--", "true"])
      #expect(outcome.status == 2 && outcome.stderr.contains("--limit-key"), "\(outcome)")
    }
    let counts = try await sandbox.succeed(["status", "--json"]).object()
    #expect((counts["counts"] as? [String: Any])?["ready"] as? Int == 4, "nothing more stored: \(counts)")
  }

  /// Four jobs of one limit key and a free one, two workers of four slots each, a limit of one per
  /// key: the key's jobs run one at a time across both processes while the free job runs beside
  /// them; `status` meanwhile says which key holds jobs.
  @Test func workersObeyTheLimitPerKeyAndStatusSaysWhichKeyHoldsJobs() async throws {
    let sandbox = try Sandbox()
    let log = sandbox.path("runs.log")
    try await sandbox.succeed(["limits", "set", "--key-concurrency", "1"])
    for name in ["a", "b", "c", "d"] {
      try await sandbox.add([
        "exec", "--limit-key", "slow.example", "--", "sh", "-c",
        "echo \"start $1\" >> \"$2\"; sleep 0.4; echo \"end $1\" >> \"$2\"", "sh", name, log,
      ])
    }
    try await sandbox.add(["exec", "--", "sh", "-c", "echo \"free\" >> \"$1\"", "sh", log])
    let first = try sandbox.start(["work", "--concurrency", "4"])
    let second = try sandbox.start(["work", "--concurrency", "4"])
    var sawHeld = false
    for _ in 0..<200 {
      let status = try await sandbox.succeed(["status"]).lines
      if status.contains(where: { $0.contains("limit of key \"slow.example\" reached (1 running,") }) {
        sawHeld = true
      }
      let done = (try? String(contentsOfFile: log, encoding: .utf8))?.split(separator: "\n").count ?? 0
      if done == 9 { break }
      try await Task.sleep(for: .milliseconds(50))
    }
    await first.terminate()
    await second.terminate()
    let lines = try String(contentsOfFile: log, encoding: .utf8).split(separator: "\n").filter {
      $0 != "free"
    }
    #expect(lines.count == 8, "\(lines)")
    for pair in stride(from: 0, to: lines.count - 1, by: 2) {
      #expect(
        lines[pair].hasPrefix("start ") && lines[pair + 1] == "end " + lines[pair].dropFirst("start ".count),
        "one at a time: \(lines)")
    }
    #expect(sawHeld, "status never named the key that holds jobs")
  }

  @Test func aWorkerObeysTheStoredLimit() async throws {
    let sandbox = try Sandbox()
    let log = sandbox.path("runs.log")
    for name in ["a", "b", "c"] {
      try await sandbox.add([
        "exec", "--", "sh", "-c", "echo \"start $1\" >> \"$2\"; sleep 0.3; echo \"end $1\" >> \"$2\"", "sh",
        name,
        log,
      ])
    }
    try await sandbox.succeed(["limits", "set", "--concurrency", "1"])
    let worked = try await sandbox.run(
      ["work", "--concurrency", "4", "--until-empty"], timeout: .seconds(60))
    #expect(worked.status == 0, "\(worked)")
    let lines = try String(contentsOfFile: log, encoding: .utf8).split(separator: "\n")
    #expect(lines.count == 6, "\(lines)")
    // One at a time: every start is followed by its own end.
    for pair in stride(from: 0, to: lines.count - 1, by: 2) {
      #expect(
        lines[pair].hasPrefix("start ") && lines[pair + 1] == "end " + lines[pair].dropFirst("start ".count),
        "\(lines)")
    }
  }

  @Test func theDashboardShowsTheLimit() async throws {
    let sandbox = try Sandbox()
    try await sandbox.add(["exec", "--", "true"])
    for _ in 0..<3 { _ = try await sandbox.succeed(["--queue", "mail", "add", "exec", "--", "true"]) }
    try await sandbox.succeed(["--queue", "mail", "limits", "set", "--concurrency", "1"])
    #expect(try await claim(1, queue: "mail", in: sandbox) == 1)
    let dashboard = try await DashboardProcess.start(sandbox)
    defer { kill(dashboard.running.process.processIdentifier, SIGKILL) }

    let api = try jsonObject(try await dashboard.get("/api/queues").body)
    let queues = try #require(api["queues"] as? [[String: Any]])
    let mail = try #require(queues.first { $0["name"] as? String == "mail" })
    let outbox = try #require(queues.first { $0["name"] as? String == "outbox" })
    #expect(mail["concurrency"] as? Int == 1, "\(mail)")
    #expect(outbox["concurrency"] is NSNull, "null, not left out: \(outbox)")

    let page = try await dashboard.get("/").body
    #expect(page.contains(#">Limit</th>"#), "a Limit column")
    let row = try #require(page.components(separatedBy: #"<tr data-queue="mail""#).dropFirst().first)
    #expect(
      row.contains(#"data-field="concurrency" title="At most 1 running at once, across every worker">1</td>"#)
    )
    let jobs = try await dashboard.get("/jobs?queue=mail").body
    #expect(
      jobs.contains(
        "Concurrency limit: at most 1 running at once, across every worker. Limit reached: 2 ready jobs "
          + "wait for a place."), "\(jobs)")

    let metrics = try await dashboard.get("/metrics").body
    #expect(metrics.contains("# TYPE conveyor_queue_concurrency_limit gauge\n"), "\(metrics)")
    #expect(metrics.contains("conveyor_queue_concurrency_limit{queue=\"mail\"} 1\n"), "\(metrics)")
    #expect(!metrics.contains("conveyor_queue_concurrency_limit{queue=\"outbox\"}"), "no limit, no sample")

    // A limit stored before any job of its queue is listed with the others.
    try await sandbox.succeed(["--queue", "reports", "limits", "set", "--concurrency", "5"])
    let listed = try jsonObject(try await dashboard.get("/api/queues").body)["queues"] as? [[String: Any]]
    let reports = try #require(listed?.first { $0["name"] as? String == "reports" }, "\(listed ?? [])")
    #expect(reports["concurrency"] as? Int == 5 && reports["ready"] as? Int == 0, "\(reports)")
  }

  @Test(.enabled(if: LocalPostgres.binaries != nil, "the PostgreSQL server is not installed"))
  func setShowAndStatusOnPostgreSQL() async throws {
    let sandbox = try Sandbox()
    let server = try await LocalPostgres.start(in: sandbox)
    defer { server.stop() }
    let database = ["--database", server.url]
    func run(_ words: [String]) async throws -> Outcome {
      try await sandbox.run(database + words, withDatabase: false)
    }
    var outcome = try await run(["limits"])
    #expect(outcome.status == 0 && outcome.lines == ["queue outbox: no limits (0 running)"], "\(outcome)")
    outcome = try await run(["limits", "set", "--concurrency", "4"])
    #expect(outcome.status == 0 && outcome.lines == ["queue outbox: concurrency 4 (0 running)"], "\(outcome)")
    outcome = try await run(["limits", "set", "--concurrency", "1000001"])
    #expect(outcome.status == 2 && outcome.stderr.contains("from 1 to 1000000"), "\(outcome)")
    outcome = try await run(["limits", "--json"])
    #expect(outcome.status == 0, "\(outcome)")
    #expect(try outcome.object()["concurrency"] as? Int == 4, "\(outcome)")
    outcome = try await run(["status"])
    #expect(
      outcome.status == 0 && outcome.lines.contains("limit     at most 4 running at once"), "\(outcome)")
    outcome = try await run(["limits", "set", "--concurrency", "none"])
    #expect(outcome.status == 0 && outcome.lines == ["queue outbox: no limits (0 running)"], "\(outcome)")
  }
}
