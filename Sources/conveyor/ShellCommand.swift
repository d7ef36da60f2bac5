import Conveyor
import Foundation
import Synchronization

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// A shell command stored as a job: run without a shell, by argument vector.
struct ShellCommand: Codable, Sendable, Hashable {
  /// The program and its arguments; the program is looked up in `PATH` unless it has a `/`.
  var arguments: [String]
  /// Where to run it; nil for the worker's current directory.
  var workingDirectory: String?
  /// Seconds after which the command is terminated and retried; nil for no limit.
  var timeout: Double?

  /// Runs the command; exit status 0 is handled, 126/127 and a missing program are dead (retrying
  /// cannot help), anything else, a signal or the timeout is retried by policy. A cancelled task
  /// (the worker's shutdown grace period ran out) terminates the command and retries the job.
  func run() async -> JobResult {
    guard let program = arguments.first else { return .discard(reason: "empty command") }
    if let workingDirectory {
      var isDirectory: ObjCBool = false
      guard FileManager.default.fileExists(atPath: workingDirectory, isDirectory: &isDirectory),
        isDirectory.boolValue
      else {
        return .discard(
          reason: "the working directory \(workingDirectory) does not exist (or is not a folder)")
      }
    }
    guard let executable = Self.resolve(program, in: workingDirectory) else {
      return .discard(reason: "command not found: \(program) (not in PATH, or not executable)")
    }
    let output = FileManager.default.temporaryDirectory.appendingPathComponent(
      "conveyor-exec-\(UUID().uuidString)")
    guard
      FileManager.default.createFile(
        atPath: output.path, contents: nil, attributes: [.posixPermissions: 0o600])
    else {
      return .retry(reason: "could not create a temporary file for the command's output")
    }
    defer { removeQuietly(output) }
    let descriptor = open(output.path, O_WRONLY | O_CLOEXEC)
    guard descriptor >= 0 else {
      return .retry(reason: "could not open the command's output file: \(String(cString: strerror(errno)))")
    }
    let child: ChildProcess
    do {
      // The child has its own copies of the descriptor; ours is only needed to start it.
      defer { close(descriptor) }
      child = try ChildProcess(
        executable: executable.path, arguments: arguments, directory: workingDirectory, output: descriptor)
    } catch {
      return .retry(reason: "could not start \(program): \(error)")
    }
    if let timeout { child.stop(after: timeout) }
    let status = await withTaskCancellationHandler {
      await child.waitForExit()
    } onCancel: {
      child.stop(after: 0)
    }
    let excerpt = Self.tail(of: output)
    if Task.isCancelled { return .retry(reason: "stopped by the worker's shutdown" + excerpt) }
    if child.wasStopped { return .retry(reason: "timed out after \(timeout ?? 0) s" + excerpt) }
    switch status {
    case .exited(0): return .handled
    case .exited(let code) where code == 126 || code == 127:
      return .discard(reason: "exit status \(code)" + excerpt)
    case .exited(let code): return .retry(reason: "exit status \(code)" + excerpt)
    case .signalled(let signal): return .retry(reason: "terminated by signal \(signal)" + excerpt)
    case .unknown(let error):
      return .retry(reason: "lost track of the command: \(String(cString: strerror(error)))" + excerpt)
    }
  }

  /// The last 400 bytes of the command's output, for the job's recorded error: only they are
  /// read, however much the command wrote.
  private static func tail(of file: URL) -> String {
    let data: Data
    do {
      let handle = try FileHandle(forReadingFrom: file)
      defer { closeQuietly(handle) }
      let end = try handle.seekToEnd()
      try handle.seek(toOffset: end > 400 ? end - 400 : 0)
      data = try handle.readToEnd() ?? Data()
    } catch {
      return ""
    }
    let text = String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
    return text.isEmpty ? "" : "; output: \(text)"
  }

  /// The program's file: a path with a `/` is taken relative to `directory` (as a shell run in
  /// that directory would), a bare name is looked up in `PATH`.
  static func resolve(_ program: String, in directory: String?) -> URL? {
    let manager = FileManager.default
    if program.contains("/") {
      let base = directory.map { URL(fileURLWithPath: $0, isDirectory: true) }
      let file = URL(fileURLWithPath: program, relativeTo: program.hasPrefix("/") ? nil : base)
        .standardizedFileURL
      return manager.isExecutableFile(atPath: file.path) ? file : nil
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

/// Closes a file opened for reading; a failure to close it loses nothing written.
func closeQuietly(_ handle: FileHandle) {
  do { try handle.close() } catch {}
}
