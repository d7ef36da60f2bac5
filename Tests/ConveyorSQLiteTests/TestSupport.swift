import Conveyor
import ConveyorTestSupport
import Dispatch
import Foundation
import Synchronization
import Testing

@testable import ConveyorSQLite

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// A store on a new file in its own temporary folder.
func makeStore(
  _ folder: TemporaryFolder, name: String = "jobs.sqlite", options: SQLiteJobStore.Options = .init()
) throws -> SQLiteJobStore {
  try SQLiteJobStore(path: folder.path(name), options: options)
}

/// Holds the store's connection with a block on its thread until the returned gate is signalled;
/// returns once the connection is held, so calls made from then on wait for it.
func holdConnection(of store: SQLiteJobStore) async throws -> DispatchSemaphore {
  let gate = DispatchSemaphore(value: 0)
  let held = Atomic<Bool>(false)
  store.connection.submit { _ in
    held.store(true, ordering: .releasing)
    gate.wait()
  }
  try await eventually("the connection is held") { held.load(ordering: .acquiring) }
  return gate
}

/// Creates, from a connection of its own, a trigger on the jobs table of the file at `path` that
/// silently skips (`RAISE(IGNORE)`) every job whose payload is `skip`, as an application may do to
/// drop jobs it does not want.
func installSkipTrigger(at path: String) throws {
  try Connection(path: path, create: false).execute(
    """
    CREATE TRIGGER skip BEFORE INSERT ON jobs WHEN NEW.payload = CAST('skip' AS BLOB)
    BEGIN SELECT RAISE(IGNORE); END
    """)
}

/// Runs `body` with the store's connection on the store's thread, after the blocks submitted
/// before, and returns its answer (nil once the store is closed). The caller suspends meanwhile.
func onStoreThread<T: Sendable>(_ store: SQLiteJobStore, _ body: @escaping @Sendable (Connection) -> T) async
  -> T?
{
  await withCheckedContinuation { continuation in
    store.connection.submit { db in continuation.resume(returning: db.map(body)) }
  }
}

/// A fixed, millisecond-aligned clock origin.
let epoch = Date(timeIntervalSince1970: 1_700_000_000)

func payload(_ text: String) -> Data { Data(text.utf8) }

func lease(_ owner: String = "w1", for duration: Duration = .seconds(60)) -> Lease {
  Lease(owner: owner, duration: duration)
}

/// SHA-free fingerprint of a file: its bytes (the files in these tests are small).
func fileBytes(_ path: String) throws -> Data {
  try Data(contentsOf: URL(fileURLWithPath: path))
}

func posixPermissions(_ path: String) throws -> Int {
  let attributes = try FileManager.default.attributesOfItem(atPath: path)
  return (attributes[.posixPermissions] as? NSNumber)?.intValue ?? -1
}

/// Locates the `conveyor-test-worker` executable built next to the test bundle.
func testWorkerURL() throws -> URL {
  var candidates: [URL] = []
  if let override = ProcessInfo.processInfo.environment["CONVEYOR_TEST_WORKER"] {
    candidates.append(URL(fileURLWithPath: override))
  }
  // The test runner (an .xctest executable on Linux, a bundle on Apple) lives in the build folder.
  var runner = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath()
  for _ in 0..<4 {
    runner.deleteLastPathComponent()
    candidates.append(runner.appendingPathComponent("conveyor-test-worker"))
  }
  candidates.append(
    Bundle.main.bundleURL.deletingLastPathComponent().appendingPathComponent("conveyor-test-worker"))
  // Fall back to the package's default debug build folder.
  let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent()
  candidates.append(packageRoot.appendingPathComponent(".build/debug/conveyor-test-worker"))
  for candidate in candidates where FileManager.default.isExecutableFile(atPath: candidate.path) {
    return candidate
  }
  throw TestFailure(
    "conveyor-test-worker not found (looked in \(candidates.map(\.path))); "
      + "run `swift build --product conveyor-test-worker` or set CONVEYOR_TEST_WORKER")
}

struct TestFailure: Error, CustomStringConvertible {
  var description: String
  init(_ description: String) { self.description = description }
}

/// A started worker process.
final class WorkerProcess: @unchecked Sendable {
  // Safe: `process` is configured before `run()` and afterwards only read; Foundation's Process
  // is thread-safe for `processIdentifier`, `terminationStatus` and `waitUntilExit`.
  let process = Process()
  let output: String
  let progress: String

  /// Runs the worker's `command` (`work`, or `prune`) on `database`'s queue "jobs".
  init(
    database: String, folder: TemporaryFolder, name: String, command: String = "work", extra: [String] = []
  ) throws {
    output = folder.path("\(name).handled")
    progress = folder.path("\(name).progress")
    process.executableURL = try testWorkerURL()
    process.arguments =
      [command, "--database", database, "--queue", "jobs", "--output", output, "--progress", progress] + extra
    try process.run()
  }

  /// Waits for the process to exit without blocking the cooperative pool; returns its status.
  ///
  /// Looks with `waitpid(pid, WNOHANG)` too: under load swift-corelibs-foundation was seen to
  /// miss a child's exit (a zombie, and `waitUntilExit` never returning).
  func exitStatus() async -> Int32 {
    while process.isRunning {
      var raw: Int32 = 0
      if waitpid(process.processIdentifier, &raw, WNOHANG) == process.processIdentifier {
        let signal = raw & 0x7F
        return signal == 0 ? (raw >> 8) & 0xFF : 128 + signal
      }
      try? await Task.sleep(for: .milliseconds(10))
    }
    return process.terminationStatus
  }

  func kill() { _ = sendSIGKILL(process.processIdentifier) }
}

private func sendSIGKILL(_ pid: Int32) -> Int32 { kill(pid, SIGKILL) }

/// The IDs listed one per line in `path` (missing file: none).
func readIDs(_ path: String) throws -> [Int64] {
  guard FileManager.default.fileExists(atPath: path) else { return [] }
  return try String(contentsOfFile: path, encoding: .utf8).split(separator: "\n").compactMap { Int64($0) }
}

/// A clock whose first reading blocks its thread until ``open()``; with `cancels`, that reading
/// then cancels the task reading it. The store reads the clock inside an add's transaction, so
/// that add holds the connection meanwhile (and a cancellation arrives mid-transaction). Read it
/// from a task on a `OneThreadExecutor`: two tests blocking a pool thread each would leave the
/// pool of a 2-core machine none to open the clock with.
final class GateClock: JobClock {
  private let gate = DispatchSemaphore(value: 0)
  private let state = Atomic<Int>(0)
  private let cancels: Bool
  init(cancels: Bool = false) { self.cancels = cancels }
  /// Whether the first reading began.
  var entered: Bool { state.load(ordering: .acquiring) > 0 }
  func open() { gate.signal() }
  func now() -> Date {
    if state.add(1, ordering: .acquiringAndReleasing).oldValue == 0 {
      gate.wait()
      if cancels { withUnsafeCurrentTask { $0?.cancel() } }
    }
    return epoch
  }
  func sleep(until deadline: Date) async throws { try await Task.sleep(for: .milliseconds(1)) }
}

/// A flag shared between tasks and threads.
final class Flag: Sendable {
  private let storage = Atomic<Bool>(false)
  var value: Bool { storage.load(ordering: .acquiring) }
  func set() { storage.store(true, ordering: .releasing) }
}

/// The outcome of `body`, thrown errors included.
func outcome<T>(of body: () async throws -> T) async -> Result<T, any Error> {
  do { return .success(try await body()) } catch { return .failure(error) }
}

/// The integer `sql` answers, as a second connection to the file at `path` sees it.
func scalar(_ sql: String, path: String) throws -> Int64 {
  let other = try Connection(path: path, create: false)
  // A new reader can meet the store's write at a moment SQLite answers "locked": it waits, as any
  // reader of a shared file should.
  other.setLockWait(milliseconds: 10_000)
  return try other.scalar(sql) ?? -1
}

/// Whether the job with `id` is committed, as a second connection to the file at `path` sees it.
func isCommitted(_ id: JobID, path: String) throws -> Bool {
  try scalar("SELECT count(*) FROM jobs WHERE id = \(id.rawValue)", path: path) == 1
}

/// Everything `store` holds of `queue`'s activity, summed over every minute recorded.
func activityTotal(_ store: SQLiteJobStore, queue: String) async throws -> QueueActivity {
  let minutes = try await store.activity(since: Date(timeIntervalSince1970: 0), limit: 1_000)
  return minutes.filter { $0.queue == queue }
    .reduce(into: QueueActivity(queue: queue, minute: Date())) { $0.add($1) }
}

/// Holds the store's connection, starts one task per call (in order, each waiting for the group
/// before the next starts), releases the connection, and returns each call's outcome: the calls
/// are committed as one group on the store's thread.
func enqueueGrouped(
  _ store: SQLiteJobStore, _ calls: [(queue: String, jobs: [NewJob])]
) async throws -> [Result<[EnqueueResult], any Error>] {
  let gate = try await holdConnection(of: store)
  var adders: [Task<[EnqueueResult], any Error>] = []
  for (index, call) in calls.enumerated() {
    adders.append(Task { try await store.enqueue(call.jobs, queue: call.queue, now: epoch) })
    try await eventually("call \(index) waits for the group") { store.groups.waitingCount == index + 1 }
  }
  gate.signal()
  var results: [Result<[EnqueueResult], any Error>] = []
  for adder in adders { results.append(await adder.result) }
  return results
}

/// ``enqueueGrouped(_:_:)`` of calls to the queue "jobs", each of jobs with the given payload text
/// and key, to run at `epoch`.
func enqueueGrouped(
  _ store: SQLiteJobStore, _ calls: [[(payload: String, key: String?)]]
) async throws -> [Result<[EnqueueResult], any Error>] {
  try await enqueueGrouped(
    store,
    calls.map { call in
      (
        queue: "jobs",
        jobs: call.map { NewJob(payload: payload($0.payload), runAt: epoch, deduplicationKey: $0.key) }
      )
    })
}

/// The payloads of every job in the file at `path`, in ID order, as another connection sees them
/// (it waits up to 10 s for a lock).
func storedPayloads(_ path: String) throws -> [String] {
  let other = try Connection(path: path, create: false)
  other.setLockWait(milliseconds: 10_000)
  var stored: [String] = []
  try other.query("SELECT payload FROM jobs ORDER BY id") {
    stored.append(String(decoding: $0.data(0), as: UTF8.self))
  }
  return stored
}

/// A value shared between tasks and threads.
final class Shared<Value: Sendable>: Sendable {
  private let storage: Mutex<Value>
  init(_ value: Value) { storage = Mutex(value) }
  func update<T>(_ body: (inout Value) -> T) -> T { storage.withLock { body(&$0) } }
}

/// A count shared between tasks and threads.
final class Tally: Sendable {
  private let value = Atomic<Int>(0)
  var count: Int { value.load(ordering: .acquiring) }
  func add() { value.add(1, ordering: .acquiringAndReleasing) }
}

/// The Unicode scalars of `text` in hex, dot-separated ("nil" for none): text compared by bytes,
/// shown so that equivalent spellings differ.
func scalarsInHex(_ text: String?) -> String {
  text.map { $0.unicodeScalars.map { String($0.value, radix: 16) }.joined(separator: ".") } ?? "nil"
}
