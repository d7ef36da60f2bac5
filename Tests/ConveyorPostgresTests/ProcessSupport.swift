import Conveyor
import ConveyorPostgres
import Foundation

#if canImport(Glibc)
  import Glibc
#endif

/// The item the worker's `JobQueue<TestJob>` decodes.
struct TestJob: Codable {
  var number: Int
}

/// Locates the `conveyor-postgres-test-worker` executable built next to the test bundle.
func workerExecutable() throws -> String {
  var candidates: [String] = []
  if let override = ProcessInfo.processInfo.environment["CONVEYOR_POSTGRES_TEST_WORKER"] {
    candidates.append(override)
  }
  var runner = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath()
  for _ in 0..<4 {
    runner.deleteLastPathComponent()
    candidates.append(runner.appendingPathComponent("conveyor-postgres-test-worker").path)
  }
  let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent()
  candidates.append(root.appendingPathComponent(".build/debug/conveyor-postgres-test-worker").path)
  guard let found = candidates.first(where: { FileManager.default.isExecutableFile(atPath: $0) }) else {
    throw HarnessError("conveyor-postgres-test-worker not found in \(candidates)")
  }
  return found
}

/// A started worker process (posix_spawn), its output files and its exit.
final class WorkerProcess: Sendable {
  let pid: pid_t
  let output: String
  let progress: String
  let log: String

  init(url: String, schema: String, folder: String, name: String, extra: [String] = []) throws {
    output = folder + "/\(name).handled"
    progress = folder + "/\(name).progress"
    log = folder + "/\(name).log"
    let executable = try workerExecutable()
    let arguments =
      [
        "--database", url, "--schema", schema, "--queue", "jobs", "--output", output,
        "--progress", progress,
      ] + extra
    pid = try PostgresServer.spawn(executable, arguments, output: log)
  }

  /// Waits for the process to exit (off the cooperative pool); its exit status, or 128 + signal.
  func exitStatus() async -> Int32 {
    let pid = self.pid
    // On a thread of its own: a dispatch thread is one of the cooperative pool's on Linux, and
    // the wait lasts as long as the process.
    let status = try? await onOwnThread(name: "test-waitpid") { () -> Int32 in
      var status: Int32 = 0
      while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
      return status
    }
    guard let status else { return -1 }
    let signal = status & 0x7f
    return signal == 0 ? (status >> 8) & 0xff : 128 + signal
  }

  func kill() { _ = sendSignal(pid, SIGKILL) }

  var logText: String { (try? String(contentsOfFile: log, encoding: .utf8)) ?? "" }
}

private func sendSignal(_ pid: pid_t, _ signal: Int32) -> Int32 { kill(pid, signal) }

/// The IDs listed one per line in `path` (missing file: none).
func readIDs(_ path: String) throws -> [Int64] {
  guard FileManager.default.fileExists(atPath: path) else { return [] }
  return try String(contentsOfFile: path, encoding: .utf8).split(separator: "\n").compactMap { Int64($0) }
}

/// Waits until `path` lists at least `count` IDs (a minute at most).
func waitForLines(_ path: String, count: Int) async throws {
  let deadline = ContinuousClock.now + .seconds(60)
  while try readIDs(path).count < count {
    guard ContinuousClock.now < deadline else { throw HarnessError("no progress in \(path)") }
    try await Task.sleep(for: .milliseconds(5))
  }
}

/// A new temporary folder, deleted by `remove()`.
func makeFolder() throws -> String {
  var template = Array((NSTemporaryDirectory() + "/conveyor-pgtest-XXXXXX").utf8CString)
  guard let made = mkdtemp(&template) else { throw HarnessError("mkdtemp failed") }
  return String(cString: made)
}

/// Enqueues `count` test jobs in batches of 500; returns their IDs.
func enqueue(_ count: Int, into store: PostgresJobStore, queue: String = "jobs") async throws -> Set<Int64> {
  var ids = Set<Int64>()
  for start in stride(from: 0, to: count, by: 500) {
    let jobs = try (start..<min(start + 500, count)).map {
      NewJob(payload: try JSONEncoder().encode(TestJob(number: $0)))
    }
    ids.formUnion(try await store.enqueue(jobs, queue: queue, clock: SystemJobClock()).map(\.id.rawValue))
  }
  return ids
}

/// The server's URL with an `application_name`, so a test can find its own connections.
func url(_ server: PostgresServer, application: String) -> String {
  server.url + "?application_name=\(application)"
}
