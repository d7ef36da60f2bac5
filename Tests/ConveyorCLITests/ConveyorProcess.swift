import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// A failure of the test harness itself (no binary, a process that did not exit in time, …).
struct HarnessError: Error, CustomStringConvertible {
  var description: String
}

/// The built `conveyor` executable these tests run.
enum ConveyorBinary {
  /// The executable: `$CONVEYOR_TEST_BINARY` when set (another build, e.g. one from before a fix,
  /// to see a test fail), else the one found next to the test bundle in the build folder.
  static let url: URL? =
    ProcessInfo.processInfo.environment["CONVEYOR_TEST_BINARY"].map { URL(fileURLWithPath: $0) } ?? locate()

  /// `url`, or an error saying to build it.
  static func required() throws -> URL {
    guard let url else {
      throw HarnessError(description: "cannot find the built conveyor executable; run swift build first")
    }
    return url
  }

  /// Looks for `conveyor` in the folders the test runner may live in: the folder of the running
  /// executable (Linux: the `.xctest` runner sits in the build folder), the folder holding the
  /// loaded `.xctest` bundle (Apple platforms), and the package's `.build/debug` found from this
  /// source file.
  private static func locate() -> URL? {
    var folders: [URL] = []
    if let first = CommandLine.arguments.first {
      folders.append(URL(fileURLWithPath: first).resolvingSymlinksInPath().deletingLastPathComponent())
    }
    folders.append(Bundle.main.bundleURL)
    folders.append(Bundle.main.bundleURL.deletingLastPathComponent())
    for bundle in Bundle.allBundles where bundle.bundleURL.pathExtension == "xctest" {
      folders.append(bundle.bundleURL.deletingLastPathComponent())
    }
    let packageRoot = URL(fileURLWithPath: #filePath)
      .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    folders.append(packageRoot.appendingPathComponent(".build/debug"))
    for folder in folders {
      let candidate = folder.appendingPathComponent("conveyor")
      if FileManager.default.isExecutableFile(atPath: candidate.path) { return candidate }
    }
    return nil
  }
}

/// What a finished `conveyor` process left behind.
struct Outcome: CustomStringConvertible {
  /// The exit status, or 128 + the signal number if a signal ended the process.
  var status: Int32
  var stdout: String
  var stderr: String

  var description: String { "exit status \(status)\n--- stdout:\n\(stdout)\n--- stderr:\n\(stderr)" }

  /// Standard output split into non-empty lines.
  var lines: [String] { stdout.split(separator: "\n").map(String.init) }

  /// Standard output as one JSON object.
  func object() throws -> [String: Any] {
    try jsonObject(stdout)
  }

  /// Standard output as JSON lines, one object each.
  func objects() throws -> [[String: Any]] {
    try lines.map(jsonObject)
  }
}

/// Parses one JSON object, failing with the text when it is not one.
func jsonObject(_ text: String) throws -> [String: Any] {
  guard let object = try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any] else {
    throw HarnessError(description: "not a JSON object: \(text)")
  }
  return object
}

/// A started `conveyor` process whose output goes to files, so it can be read while it runs.
///
/// Its exit is also looked for with `waitpid(pid, WNOHANG)`: under load, swift-corelibs-foundation
/// was seen to miss a child's exit (the child stayed a zombie, `isRunning` stayed true and
/// `waitUntilExit` never returned), which hung the whole test run.
final class RunningConveyor {
  let process: Process
  private let stdoutFile: URL
  private let stderrFile: URL
  /// The wait status, when this harness reaped the process itself.
  private let reaped = Mutex<Int32?>(nil)

  /// Whether the process has exited, by Foundation's account or by `waitpid`.
  var hasExited: Bool {
    if !process.isRunning { return true }
    return reaped.withLock { status in
      if status != nil { return true }
      var raw: Int32 = 0
      guard waitpid(process.processIdentifier, &raw, WNOHANG) == process.processIdentifier else {
        return false
      }
      status = raw
      return true
    }
  }

  /// Kills the process and waits (at most 10 s) until it is gone.
  func terminate() async {
    kill(process.processIdentifier, SIGKILL)
    let deadline = ContinuousClock.now + .seconds(10)
    while !hasExited && ContinuousClock.now < deadline { try? await Task.sleep(for: .milliseconds(10)) }
  }

  /// The exit status as a shell reports it (128 + the signal for a killed process).
  private var status: Int32 {
    if let raw = reaped.withLock({ $0 }) {
      let signal = raw & 0x7F
      return signal == 0 ? (raw >> 8) & 0xFF : 128 + signal
    }
    let signalled = process.terminationReason == .uncaughtSignal
    return signalled ? 128 + process.terminationStatus : process.terminationStatus
  }

  init(
    executable: URL, arguments: [String], environment: [String: String], folder: URL,
    directory: URL? = nil, standardOutput: FileHandle? = nil
  ) throws {
    let name = UUID().uuidString
    stdoutFile = folder.appendingPathComponent("\(name).stdout")
    stderrFile = folder.appendingPathComponent("\(name).stderr")
    guard FileManager.default.createFile(atPath: stdoutFile.path, contents: nil),
      FileManager.default.createFile(atPath: stderrFile.path, contents: nil)
    else { throw HarnessError(description: "cannot create output files in \(folder.path)") }
    process = Process()
    process.executableURL = executable
    process.arguments = arguments
    process.environment = environment
    process.currentDirectoryURL = directory
    process.standardInput = FileHandle.nullDevice
    let output = try FileHandle(forWritingTo: stdoutFile)
    let errors = try FileHandle(forWritingTo: stderrFile)
    // The child has its own copies once started; ours would only pile up in the test process.
    defer {
      for handle in [output, errors] {
        do { try handle.close() } catch { print("could not close an output file: \(error)") }
      }
    }
    process.standardOutput = standardOutput ?? output
    process.standardError = errors
    try process.run()
  }

  var stdout: String { Self.read(stdoutFile) }
  var stderr: String { Self.read(stderrFile) }

  private static func read(_ file: URL) -> String {
    String(decoding: FileManager.default.contents(atPath: file.path) ?? Data(), as: UTF8.self)
  }

  /// Sends a signal to the process (not to its children).
  func signal(_ number: Int32) {
    kill(process.processIdentifier, number)
  }

  /// Waits until `condition` holds; fails (and kills the process) if that takes longer than
  /// `timeout` or the process exits first.
  func waitUntil(_ what: String, timeout: Duration = .seconds(15), _ condition: () -> Bool) async throws {
    let deadline = ContinuousClock.now + timeout
    while !condition() {
      if hasExited || ContinuousClock.now >= deadline {
        let exited = hasExited
        kill(process.processIdentifier, SIGKILL)
        throw HarnessError(
          description: "\(exited ? "exited" : "timed out") waiting for \(what)\n--- stdout:\n\(stdout)\n"
            + "--- stderr:\n\(stderr)")
      }
      try await Task.sleep(for: .milliseconds(20))
    }
  }

  /// Waits until a complete line of standard output satisfies `predicate`, and returns it; fails
  /// as `waitUntil` does.
  @discardableResult
  func waitForLine(
    _ what: String, timeout: Duration = .seconds(15), where predicate: (String) -> Bool
  ) async throws -> String {
    var found: String?
    try await waitUntil(what, timeout: timeout) {
      let text = stdout
      var lines = text.split(separator: "\n").map(String.init)
      // The last line may still be half written.
      if !text.hasSuffix("\n"), !lines.isEmpty { lines.removeLast() }
      found = lines.first(where: predicate)
      return found != nil
    }
    return found ?? ""
  }

  /// Waits for the process to exit; kills it and fails if that takes longer than `timeout`.
  func waitForExit(timeout: Duration = .seconds(20)) async throws -> Outcome {
    let deadline = ContinuousClock.now + timeout
    while !hasExited {
      if ContinuousClock.now >= deadline {
        await terminate()
        throw HarnessError(
          description: "conveyor \(process.arguments ?? []) did not exit within \(timeout); killed it\n"
            + "--- stdout:\n\(stdout)\n--- stderr:\n\(stderr)")
      }
      try await Task.sleep(for: .milliseconds(10))
    }
    return Outcome(status: status, stdout: stdout, stderr: stderr)
  }
}

/// A test's own temporary folder and database file; removed, and its processes killed, when
/// the test is done.
final class Sandbox {
  let folder: URL
  /// The database every `run`/`start` passes with `--database`.
  let database: String
  private var started: [RunningConveyor] = []

  init() throws {
    folder = FileManager.default.temporaryDirectory
      .appendingPathComponent("conveyor-cli-tests-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
    database = folder.appendingPathComponent("jobs.sqlite").path
  }

  deinit {
    let stragglers = started.filter { !$0.hasExited }
    for running in stragglers { kill(running.process.processIdentifier, SIGKILL) }
    // Waiting for them (up to 5 s each) and removing the folder happen off the thread that
    // released the sandbox: that is a thread of the cooperative pool, and holding it stalled
    // every other test's tasks (a cancellation test measured 5 s for a call that ends at once).
    // Not on a dispatch thread either: on Linux those are the pool's.
    nonisolated(unsafe) let waiting = stragglers
    let folder = self.folder
    Thread.detachNewThread {
      // Reaped without blocking when it is gone; a straggler is left to the system.
      for running in waiting {
        for _ in 0..<500 where !running.hasExited { usleep(10_000) }
      }
      do {
        try FileManager.default.removeItem(at: folder)
      } catch {
        // Only leaves a folder in the temporary directory.
        print("could not remove \(folder.path): \(error)")
      }
    }
  }

  /// A path inside the sandbox folder.
  func path(_ name: String) -> String { folder.appendingPathComponent(name).path }

  /// The environment for `conveyor`: no `CONVEYOR_DATABASE`, a data folder inside the sandbox so
  /// a missing `--database` never touches the real default database, and no proxy between the
  /// tool and the loopback server.
  private var environment: [String: String] {
    var environment = ProcessInfo.processInfo.environment
    environment["CONVEYOR_DATABASE"] = nil
    for name in environment.keys where name.lowercased().hasSuffix("_proxy") { environment[name] = nil }
    environment["XDG_DATA_HOME"] = path("xdg-data")
    return environment
  }

  /// Starts `conveyor --database <database> arguments…` (or without `--database` when
  /// `withDatabase` is false), with `extraEnvironment` added to the environment.
  func start(
    _ arguments: [String], withDatabase: Bool = true, extraEnvironment: [String: String] = [:],
    directory: URL? = nil, standardOutput: FileHandle? = nil
  ) throws -> RunningConveyor {
    let running = try RunningConveyor(
      executable: try ConveyorBinary.required(),
      arguments: (withDatabase ? ["--database", database] : []) + arguments,
      environment: environment.merging(extraEnvironment) { $1 }, folder: folder, directory: directory,
      standardOutput: standardOutput)
    started.append(running)
    return running
  }

  #if os(Linux)
    /// Runs `conveyor --database <database> arguments…` on a pseudo-terminal, through util-linux
    /// `script`, which passes the exit status on (`-e`).
    func runOnTerminal(_ arguments: [String], timeout: Duration = .seconds(20)) async throws -> Outcome {
      let words = [try ConveyorBinary.required().path, "--database", database] + arguments
      let command = words.map { "'" + $0.replacingOccurrences(of: "'", with: "'\\''") + "'" }
      let running = try RunningConveyor(
        executable: URL(fileURLWithPath: "/usr/bin/script"),
        arguments: ["-qec", command.joined(separator: " "), "/dev/null"], environment: environment,
        folder: folder)
      started.append(running)
      return try await running.waitForExit(timeout: timeout)
    }
  #endif

  /// How many `run`s of the whole test process have a `conveyor` running at once: on a machine of
  /// two cores, a dozen of them beside the other suites left the test process's own threads a
  /// fraction of a core, and tests elsewhere waited many seconds for a task to resume.
  static let runs = AsyncLimit(width: 2)

  /// Runs `conveyor` to completion (killing it after `timeout`; the wait for a place among the
  /// ``runs`` does not count).
  func run(
    _ arguments: [String], withDatabase: Bool = true, extraEnvironment: [String: String] = [:],
    timeout: Duration = .seconds(20), directory: URL? = nil, standardOutput: FileHandle? = nil
  ) async throws -> Outcome {
    try await Self.runs.run {
      try await start(
        arguments, withDatabase: withDatabase, extraEnvironment: extraEnvironment, directory: directory,
        standardOutput: standardOutput
      )
      .waitForExit(timeout: timeout)
    }
  }

  /// Runs a command that must succeed, and returns its outcome.
  @discardableResult
  func succeed(
    _ arguments: [String], directory: URL? = nil, sourceLocation: SourceLocation = #_sourceLocation
  ) async throws -> Outcome {
    let outcome = try await run(arguments, directory: directory)
    #expect(outcome.status == 0, "conveyor \(arguments): \(outcome)", sourceLocation: sourceLocation)
    return outcome
  }

  /// `conveyor add …`; returns the printed job ID.
  @discardableResult
  func add(_ arguments: [String], sourceLocation: SourceLocation = #_sourceLocation) async throws -> Int {
    let outcome = try await succeed(["add"] + arguments, sourceLocation: sourceLocation)
    let text = outcome.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    guard let id = Int(text), id > 0 else {
      throw HarnessError(description: "add did not print a job ID: \(outcome)")
    }
    return id
  }

  /// The counts `status --json` reports of jobs that are not history: waiting, running, dead.
  func counts(sourceLocation: SourceLocation = #_sourceLocation) async throws -> [String: Int] {
    try await allCounts(sourceLocation: sourceLocation).filter {
      $0.key != "completed" && $0.key != "cancelled"
    }
  }

  /// Every count `status --json` reports, the history's included.
  func allCounts(sourceLocation: SourceLocation = #_sourceLocation) async throws -> [String: Int] {
    let status = try await succeed(["status", "--json"], sourceLocation: sourceLocation).object()
    guard let counts = status["counts"] as? [String: Int] else {
      throw HarnessError(description: "status --json has no counts: \(status)")
    }
    return counts
  }

  /// The jobs `list --json` prints, with extra options.
  func listed(_ options: [String] = [], sourceLocation: SourceLocation = #_sourceLocation) async throws
    -> [[String: Any]]
  {
    try await succeed(["list", "--json"] + options, sourceLocation: sourceLocation).objects()
  }
}

/// Counts with every status zero but those given (without the history: see `allCounts`).
func counts(ready: Int = 0, scheduled: Int = 0, held: Int = 0, running: Int = 0, dead: Int = 0) -> [String:
  Int]
{
  ["ready": ready, "scheduled": scheduled, "held": held, "running": running, "dead": dead]
}

/// Every count `status --json` reports, the history's included, zero but those given.
func allCounts(
  ready: Int = 0, scheduled: Int = 0, held: Int = 0, running: Int = 0, dead: Int = 0, completed: Int = 0,
  cancelled: Int = 0
) -> [String: Int] {
  counts(ready: ready, scheduled: scheduled, held: held, running: running, dead: dead).merging(
    ["completed": completed, "cancelled": cancelled]
  ) { a, _ in a }
}
