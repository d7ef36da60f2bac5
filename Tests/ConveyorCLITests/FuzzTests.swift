import Foundation
import Testing

/// Random command lines: the tool never traps, exits 0, 1, 2 or 3, never echoes a control
/// character, and leaves a database every later command can open.
@Suite struct FuzzTests {
  static let words = [
    "add", "http", "exec", "status", "list", "retry", "remove", "purge", "pause", "resume", "help", "--help",
    "-h",
    "-H", "--header", "--data", "--key", "--delay", "--priority", "--timeout", "--cwd", "--", "-d", "-q",
    "--status", "--limit", "-n", "--json", "--all", "--until-empty", "GET", "POST", "ready", "dead", "1", "0",
    "-1", "1e308", "http://127.0.0.1:1/x", "HTTP://127.0.0.1:1/y", "X-A: 1", "true",
  ]

  static func randomWord(_ random: inout SplitMix64) -> String {
    if Int.random(in: 0..<3, using: &random) > 0 { return words.randomElement(using: &random)! }
    let alphabet = Array("\r\n\t \u{1B}[2J:=-/é€😀\u{7F}\u{9B}aZ0".unicodeScalars)
    var scalars = String.UnicodeScalarView()
    for _ in 0..<Int.random(in: 0...12, using: &random) {
      scalars.append(
        Int.random(in: 0..<2, using: &random) == 0
          ? alphabet.randomElement(using: &random)!
          : Unicode.Scalar(UInt8.random(in: 1...0x7F, using: &random)))
    }
    return String(scalars)
  }

  @Test func randomCommandLinesNeverTrap() async throws {
    let sandbox = try Sandbox()
    var random = SplitMix64(seed: 8)
    var added = 0
    for _ in 0..<150 {
      var arguments = (0..<Int.random(in: 1...7, using: &random)).map { _ in Self.randomWord(&random) }
      if Int.random(in: 0..<2, using: &random) == 0 { arguments.insert(contentsOf: ["add", "http"], at: 0) }
      let outcome = try await sandbox.run(arguments)
      #expect((0...3).contains(outcome.status), "conveyor \(arguments.debugDescription): \(outcome)")
      for text in [outcome.stdout, outcome.stderr] {
        #expect(
          !text.unicodeScalars.contains { $0 == "\u{1B}" || $0 == "\u{9B}" || $0 == "\r" }, "\(arguments)")
      }
      if arguments.first == "add", outcome.status == 0 { added += 1 }
    }
    let status = try await sandbox.run(["status", "--json"])
    #expect(status.status == 0, "\(status)")
    let pending = try await sandbox.listed(["--status", "pending", "--limit", "1000"])
    #expect(pending.count <= added)
  }
}
