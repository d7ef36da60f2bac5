import Foundation
import Testing

@testable import conveyor

/// `add exec|http --fairness-key`: a worker takes the jobs of each key in turn, whichever key
/// added its backlog first; `show` names the key; keys that break the rules, and a fairness key
/// with an ordering key, are refused and stored nowhere. Each test on its own SQLite file,
/// through real processes.
@Suite struct FairnessKeyTests {
  /// A command that appends `NAME` to `log`.
  private func logging(_ name: String, to log: String) -> [String] {
    ["sh", "-c", "echo \"$1\" >> \"$2\"", "sh", name, log]
  }

  /// Tenant A adds five jobs, then tenant B two and tenant C one: one worker runs A, B, C, A, B,
  /// A, A, A, not A's backlog first; `show` prints the key and `--json` gives it.
  @Test func oneWorkerTakesEachKeysJobsInTurn() async throws {
    let sandbox = try Sandbox()
    let log = sandbox.path("runs.log")
    var ids: [Int] = []
    for index in 1...5 {
      ids.append(
        try await sandbox.add(["exec", "--fairness-key", "A", "--"] + logging("a\(index)", to: log)))
    }
    for index in 1...2 {
      ids.append(
        try await sandbox.add(["exec", "--fairness-key", "B", "--"] + logging("b\(index)", to: log)))
    }
    ids.append(try await sandbox.add(["exec", "--fairness-key", "C", "--"] + logging("c1", to: log)))
    let shown = try await sandbox.succeed(["show", String(ids[5])]).lines
    #expect(shown.contains("fairness key B"), "\(shown)")
    let json = try await sandbox.succeed(["show", "--json", String(ids[5])]).object()
    #expect(json["fairnessKey"] as? String == "B", "\(json)")

    let work = try await sandbox.run(["work", "--until-empty", "--concurrency", "1"], timeout: .seconds(60))
    #expect(work.status == 0, "\(work)")
    let lines = (try String(contentsOfFile: log, encoding: .utf8)).split(separator: "\n").map(String.init)
    #expect(lines == ["a1", "b1", "c1", "a2", "b2", "a3", "a4", "a5"], "in turn: \(lines)")
  }

  /// An empty key, a key with NUL's escape, an over-long key, and a fairness key beside an
  /// ordering key: exit 2 with what to do, nothing stored.
  @Test func badFairnessKeysAreRefusedAndNothingIsStored() async throws {
    let sandbox = try Sandbox()
    let long = String(repeating: "k", count: 513)
    let cases: [([String], String)] = [
      (["add", "exec", "--fairness-key", "", "--", "true"], "--fairness-key cannot be empty"),
      (["add", "exec", "--fairness-key", long, "--", "true"], "at most 512 UTF-8 bytes"),
      (
        ["add", "http", "--fairness-key", "A", "--ordering-key", "o", "GET", "http://127.0.0.1:9/"],
        "cannot go together"
      ),
    ]
    for (arguments, message) in cases {
      let result = try await sandbox.run(arguments)
      #expect(result.status == 2, "\(arguments): \(result)")
      #expect(result.stderr.contains(message), "\(arguments): \(result.stderr)")
    }
    #expect(try await sandbox.allCounts() == allCounts(), "nothing stored")
  }
}
