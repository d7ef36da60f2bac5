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
      switch Paths.kind(workingDirectory) {
      case .folder: break
      case .file:
        return .discard(reason: "the working directory \(workingDirectory) is a file, not a folder")
      case .other:
        return .discard(
          reason: "the working directory \(workingDirectory) is not a folder (a device, a FIFO or a socket)")
      case .missing(let code) where code == ENOENT:
        return .discard(reason: "the working directory \(workingDirectory) does not exist")
      case .missing(let code):
        return .discard(
          reason:
            "the working directory \(workingDirectory) cannot be reached: \(String(cString: strerror(code)))"
        )
      }
    }
    guard let executable = Self.resolve(program, in: workingDirectory) else {
      return .discard(reason: "command not found: \(program) (not in PATH, or not an executable file)")
    }
    // Named by plain strings, never Foundation's path calls on TMPDIR (see `Paths`).
    let output = Paths.joined(Paths.temporaryFolder(), "conveyor-exec-\(UUID().uuidString)")
    let descriptor = open(output, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
    guard descriptor >= 0 else {
      return .retry(
        reason:
          "could not create a temporary file for the command's output: \(String(cString: strerror(errno)))")
    }
    defer { unlink(output) }
    let child: ChildProcess
    do {
      // The child has its own copies of the descriptor; ours is only needed to start it.
      defer { close(descriptor) }
      child = try ChildProcess(
        executable: executable, arguments: arguments, directory: workingDirectory, output: descriptor)
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
  private static func tail(of file: String) -> String {
    let data: Data
    do {
      guard let handle = FileHandle(forReadingAtPath: file) else { return "" }
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
  /// that directory would), a bare name is looked up in `PATH`; only an executable regular file
  /// is returned, as an absolute path.
  static func resolve(_ program: String, in directory: String?) -> String? {
    guard !program.isEmpty, !program.utf8.contains(0) else { return nil }
    let current = Paths.currentFolder()
    if program.contains("/") {
      guard let base = program.hasPrefix("/") ? "/" : directory ?? current else { return nil }
      let file = Paths.absolute(program, from: base)
      return Paths.isExecutableFile(file) ? file : nil
    }
    let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/local/bin:/usr/bin:/bin"
    for folder in path.split(separator: ":") where !folder.isEmpty {
      let candidate = Paths.joined(String(folder), program)
      guard let base = candidate.hasPrefix("/") ? "/" : current else { continue }
      let file = Paths.absolute(candidate, from: base)
      if Paths.isExecutableFile(file) { return file }
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
