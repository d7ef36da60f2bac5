import Conveyor
import Foundation
import Synchronization

/// A shell command stored as a job: run without a shell, by argument vector.
struct ShellCommand: Codable, Sendable, Hashable {
  /// The program and its arguments; the program is looked up in `PATH` unless it has a `/`.
  var arguments: [String]
  /// Where to run it; nil for the worker's current directory.
  var workingDirectory: String?
  /// Seconds after which the command is terminated and retried; nil for no limit.
  var timeout: Double?

  /// Runs the command; exit status 0 is handled, 126/127 and a missing program are dead (retrying
  /// cannot help), anything else, a signal or the timeout is retried by policy.
  func run() async -> JobResult {
    guard let program = arguments.first else { return .discard(reason: "empty command") }
    guard let executable = Self.resolve(program) else {
      return .discard(reason: "command not found: \(program) (not in PATH, or not executable)")
    }
    let output: URL
    do {
      output = FileManager.default.temporaryDirectory.appendingPathComponent(
        "conveyor-exec-\(UUID().uuidString)")
      guard FileManager.default.createFile(atPath: output.path, contents: nil) else {
        return .retry(reason: "could not create a temporary file for the command's output")
      }
    }
    defer { removeQuietly(output) }
    let process = Process()
    process.executableURL = executable
    process.arguments = Array(arguments.dropFirst())
    if let workingDirectory { process.currentDirectoryURL = URL(fileURLWithPath: workingDirectory) }
    do {
      let handle = try FileHandle(forWritingTo: output)
      // Our copy of the descriptor; the child has its own. A failed close cannot lose data here.
      defer { do { try handle.close() } catch {} }
      process.standardOutput = handle
      process.standardError = handle
      process.standardInput = FileHandle.nullDevice
      let status = try await Self.runToExit(process, timeout: timeout)
      let excerpt = Self.tail(of: output)
      switch status {
      case .exited(0): return .handled
      case .exited(let code) where code == 126 || code == 127:
        return .discard(reason: "exit status \(code)" + excerpt)
      case .exited(let code): return .retry(reason: "exit status \(code)" + excerpt)
      case .signalled(let signal): return .retry(reason: "terminated by signal \(signal)" + excerpt)
      case .timedOut: return .retry(reason: "timed out after \(timeout ?? 0) s" + excerpt)
      }
    } catch {
      return .retry(reason: "could not start \(program): \(error)")
    }
  }

  enum Status: Equatable {
    case exited(Int32)
    case signalled(Int32)
    case timedOut
  }

  private static func runToExit(_ process: Process, timeout: Double?) async throws -> Status {
    let timedOut = TimeoutFlag()
    try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
      process.terminationHandler = { _ in continuation.resume() }
      do {
        try process.run()
      } catch {
        process.terminationHandler = nil
        continuation.resume(throwing: error)
        return
      }
      if let timeout {
        DispatchQueue.global().asyncAfter(deadline: .now() + timeout) {
          if process.isRunning {
            timedOut.set()
            process.terminate()
          }
        }
      }
    }
    if timedOut.isSet { return .timedOut }
    switch process.terminationReason {
    case .exit: return .exited(process.terminationStatus)
    case .uncaughtSignal: return .signalled(process.terminationStatus)
    @unknown default: return .exited(process.terminationStatus)
    }
  }

  /// The last lines of the command's output, for the job's recorded error.
  private static func tail(of file: URL) -> String {
    guard let data = FileManager.default.contents(atPath: file.path), !data.isEmpty else { return "" }
    let text = String(decoding: data.suffix(400), as: UTF8.self).trimmingCharacters(
      in: .whitespacesAndNewlines)
    return text.isEmpty ? "" : "; output: \(text)"
  }

  static func resolve(_ program: String) -> URL? {
    let manager = FileManager.default
    if program.contains("/") {
      return manager.isExecutableFile(atPath: program) ? URL(fileURLWithPath: program) : nil
    }
    let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/local/bin:/usr/bin:/bin"
    for folder in path.split(separator: ":") where !folder.isEmpty {
      let candidate = "\(folder)/\(program)"
      if manager.isExecutableFile(atPath: candidate) { return URL(fileURLWithPath: candidate) }
    }
    return nil
  }
}

/// Removes a temporary file; a failure only leaves a file in the temporary folder.
func removeQuietly(_ url: URL) {
  do { try FileManager.default.removeItem(at: url) } catch {}
}

/// Set once from a timer, read after the process exits.
final class TimeoutFlag: Sendable {
  private let value = Mutex(false)
  func set() { value.withLock { $0 = true } }
  var isSet: Bool { value.withLock { $0 } }
}
