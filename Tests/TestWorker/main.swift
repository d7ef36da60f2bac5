// A worker process for the SQLite multi-process and crash tests.
//
//   conveyor-test-worker work --database PATH --queue NAME --output FILE
//                             [--progress FILE] [--batch N] [--lease-ms MS] [--handle-ms MS]
//
// Handles jobs until the queue holds no pending or running job. For every job it appends
// "<id>\n" to --progress (if given) when the handler starts, then sleeps --handle-ms, then appends
// "<id>\n" to --output. Each append is one write(2), so it survives SIGKILL of this process.
import Conveyor
import ConveyorSQLite
import Foundation

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

struct Arguments {
  var command = ""
  var database = ""
  var queue = "jobs"
  var output = ""
  var progress: String?
  var batch = 10
  var leaseMilliseconds = 30_000
  var handleMilliseconds = 0

  init(_ arguments: [String]) throws {
    var iterator = arguments.makeIterator()
    command = iterator.next() ?? ""
    while let flag = iterator.next() {
      guard let value = iterator.next() else { throw Failure("missing value for \(flag)") }
      switch flag {
      case "--database": database = value
      case "--queue": queue = value
      case "--output": output = value
      case "--progress": progress = value
      case "--batch": batch = Int(value) ?? batch
      case "--lease-ms": leaseMilliseconds = Int(value) ?? leaseMilliseconds
      case "--handle-ms": handleMilliseconds = Int(value) ?? handleMilliseconds
      default: throw Failure("unknown option \(flag)")
      }
    }
    guard command == "work", !database.isEmpty, !output.isEmpty else {
      throw Failure("usage: conveyor-test-worker work --database PATH --output FILE [options]")
    }
  }
}

struct Failure: Error, CustomStringConvertible {
  var description: String
  init(_ description: String) { self.description = description }
}

/// Appends lines to a file with one unbuffered write per line.
final class LineFile {
  let descriptor: Int32

  init(path: String) throws {
    descriptor = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o644)
    guard descriptor >= 0 else { throw Failure("cannot open \(path): \(String(cString: strerror(errno)))") }
  }

  deinit { close(descriptor) }

  func append(_ line: String) throws {
    let bytes = Array((line + "\n").utf8)
    let written = bytes.withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) }
    guard written == bytes.count else { throw Failure("write failed: \(String(cString: strerror(errno)))") }
  }
}

func work(_ arguments: Arguments) async throws {
  let store = try await SQLiteJobStore.open(path: arguments.database)
  let output = try LineFile(path: arguments.output)
  let progress = try arguments.progress.map { try LineFile(path: $0) }
  let owner = "test-worker-\(getpid())-\(UUID().uuidString)"
  let leaseDuration = Double(arguments.leaseMilliseconds) / 1000
  var settlements: [JobSettlement] = []
  while true {
    let now = Date()
    let batch = try await store.settleAndClaim(
      settlements, queue: arguments.queue, limit: arguments.batch,
      lease: Lease(owner: owner, expiresAt: now.addingTimeInterval(leaseDuration)), now: now)
    settlements = []
    if batch.claimed.isEmpty {
      if try await store.rescueExpiredLeases(queue: arguments.queue, now: Date()) > 0 { continue }
      if try await store.counts(queue: arguments.queue, now: Date()).unfinished == 0 { return }
      try await Task.sleep(for: .milliseconds(20))
      continue
    }
    for job in batch.claimed {
      try progress?.append(job.id.description)
      if arguments.handleMilliseconds > 0 {
        try await Task.sleep(for: .milliseconds(arguments.handleMilliseconds))
      }
      try output.append(job.id.description)
      settlements.append(JobSettlement(id: job.id, owner: owner, action: .complete))
    }
  }
}

do {
  try await work(Arguments(Array(CommandLine.arguments.dropFirst())))
} catch {
  FileHandle.standardError.write(Data("conveyor-test-worker: \(error)\n".utf8))
  exit(1)
}
