import Conveyor
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import ConveyorNetworking

#if canImport(FoundationNetworking)
  import FoundationNetworking
#endif

/// Deterministic bytes: 0, 1, …, 250, 0, 1, … (built by blocks: a per-byte loop takes seconds in
/// debug builds and would hold a cooperative thread that long).
func pattern(_ count: Int) -> Data {
  let block = Data((0..<251).map { UInt8($0) })
  var data = Data(capacity: count)
  while data.count < count { data.append(block.prefix(count - data.count)) }
  return data
}

@Suite("Download operations", .timeLimit(.minutes(10)))
struct NetworkDownloadTests {
  @Test func downloadMovesTheFileAndReportsProgress() async throws {
    let body = pattern(1_000_000)
    let server = try TestHTTPServer(always: Reply(body: body, chunkSize: 100_000, pause: .milliseconds(5)))
    defer { server.stop() }
    let folder = try TemporaryFolder()
    let destination = folder.file("download.bin")
    let operation = NetworkDownloadOperation(
      request: URLRequest(url: server.url("/file")), destination: destination)
    let progress = Log<(Int64, Int64?)>()
    operation.progressHandler = { written, expected in progress.append((written, expected)) }

    let file = try await within { try await operation.run() }

    #expect(file == destination)
    #expect(try Data(contentsOf: destination) == body)
    let reports = progress.all
    #expect(reports.count >= 2)
    #expect(reports.last?.0 == 1_000_000)
    #expect(reports.allSatisfy { $0.1 == 1_000_000 })
    #expect(zip(reports, reports.dropFirst()).allSatisfy { $0.0 <= $1.0 })
  }

  @Test func evaluationGetsTheTemporaryFileWhichIsGoneAfterwards() async throws {
    let server = try TestHTTPServer(always: .ok("temporary"))
    defer { server.stop() }
    let seen = Log<URL>()
    let operation = NetworkDownloadOperation<String>(request: URLRequest(url: server.url("/t"))) {
      location, _ in
      seen.append(location)
      return try String(contentsOf: location, encoding: .utf8)
    }
    #expect(try await within { try await operation.run() } == "temporary")
    let location = try #require(seen.all.first)
    #expect(!FileManager.default.fileExists(atPath: location.path))
  }

  @Test func failedEvaluationDeletesTheTemporaryFile() async throws {
    struct Nope: Error {}
    let server = try TestHTTPServer(always: .ok("x"))
    defer { server.stop() }
    let seen = Log<URL>()
    let operation = NetworkDownloadOperation<Int>(request: URLRequest(url: server.url("/t"))) { location, _ in
      seen.append(location)
      throw Nope()
    }
    let error = try networkError(try await failure(of: operation))
    guard case .evaluation(let underlying) = error else { throw ServerError("got \(error)") }
    #expect(underlying.error is Nope)
    let location = try #require(seen.all.first)
    #expect(!FileManager.default.fileExists(atPath: location.path))
  }

  @Test func existingDestinationIsNotOverwrittenUnlessAsked() async throws {
    let server = try TestHTTPServer(always: .ok("new"))
    defer { server.stop() }
    let folder = try TemporaryFolder()
    let destination = folder.file("f.txt")
    try Data("old".utf8).write(to: destination)

    let careful = NetworkDownloadOperation(
      request: URLRequest(url: server.url("/f")), destination: destination)
    let error = try networkError(try await failure(of: careful))
    guard case .evaluation(let underlying) = error else { throw ServerError("got \(error)") }
    #expect(underlying.error as? FileOperationError == .destinationExists(path: destination.path))
    #expect(try Data(contentsOf: destination) == Data("old".utf8))

    let overwriting = NetworkDownloadOperation(
      request: URLRequest(url: server.url("/f")), destination: destination, overwrite: true)
    _ = try await within { try await overwriting.run() }
    #expect(try Data(contentsOf: destination) == Data("new".utf8))
  }

  @Test func downloadOfAnErrorStatusKeepsAnExcerptFromTheFile() async throws {
    let server = try TestHTTPServer(
      always: .status(403, "forbidden: " + String(repeating: "z", count: 10_000)))
    defer { server.stop() }
    let folder = try TemporaryFolder()
    let operation = NetworkDownloadOperation(
      request: URLRequest(url: server.url("/private")), destination: folder.file("never"))
    operation.bodyExcerptLimit = 100
    let error = try networkError(try await failure(of: operation))
    guard case .httpStatus(let status) = error else { throw ServerError("got \(error)") }
    #expect(status.statusCode == 403)
    #expect(status.bodyExcerpt.count == 100)
    #expect(status.bodyText.hasPrefix("forbidden: zzz"))
    #expect(status.bodyIsTruncated)
    #expect(!FileManager.default.fileExists(atPath: folder.file("never").path))
  }

  @Test func cancelInTheMiddleOfADownloadStopsItAndRunsNoHandler() async throws {
    // 8 MB in 64 KB pieces every 2 s: about 4 minutes if nobody stops it. (With pieces every
    // 200 ms, a test process starved beside three compilers, at load average 16-19, saw the whole
    // download end before it could cancel.)
    let server = try TestHTTPServer(
      always: Reply(body: pattern(8_000_000), chunkSize: 65_536, pause: .seconds(2)))
    defer { server.stop() }
    let folder = try TemporaryFolder()
    let destination = folder.file("partial.bin")
    let operation = NetworkDownloadOperation(
      request: URLRequest(url: server.url("/slow")), destination: destination, session: NetworkSession())
    let progress = Log<Int64>()
    let afterCancel = Atomic<Bool>(false)
    operation.progressHandler = { written, _ in
      if afterCancel.load(ordering: .acquiring) { Issue.record("progress after cancel") }
      progress.append(written)
    }
    operation.successHandler = { _ in Issue.record("success handler ran") }
    operation.failureHandler = { _ in Issue.record("failure handler ran") }

    operation.start()
    try await eventually("some bytes arrived") { progress.count > 0 }
    afterCancel.store(true, ordering: .releasing)
    let cancelledAt = ContinuousClock.now
    operation.cancel()

    #expect(try await failure(of: operation) == .cancelled)
    // Generous for a loaded machine (13.2 s, then 28.9 s, measured beside the other suites), far
    // short of the four minutes an uncancelled download takes; the `.cancelled` result above is
    // the proof it stopped.
    #expect(ContinuousClock.now - cancelledAt < .seconds(90), "well before the download would end")
    #expect(operation.isFinished)
    #expect(operation.result == nil)
    try await Task.sleep(for: .milliseconds(300))
    #expect(!FileManager.default.fileExists(atPath: destination.path))
    #expect((progress.all.last ?? 0) < 8_000_000)
  }

  @Test func cancellingTheAwaitingTaskCancelsTheDownload() async throws {
    // About 4 minutes if nobody stops it: far longer than the wait below.
    let server = try TestHTTPServer(
      always: Reply(body: pattern(8_000_000), chunkSize: 65_536, pause: .seconds(2)))
    defer { server.stop() }
    let folder = try TemporaryFolder()
    let operation = NetworkDownloadOperation(
      request: URLRequest(url: server.url("/slow")), destination: folder.file("x.bin"),
      session: NetworkSession())
    let started = Atomic<Bool>(false)
    operation.progressHandler = { _, _ in started.store(true, ordering: .releasing) }
    let task = Task { try await operation.run() }
    try await eventually("download started") { started.load(ordering: .acquiring) }
    task.cancel()
    let outcome = try await within(.seconds(10)) { await task.result }
    guard case .failure(let error) = outcome else { throw ServerError("the download finished") }
    #expect(error as? OperationError<NetworkError> == .cancelled)
    #expect(operation.isCancelled)
  }

  @Test func progressWithoutContentLengthHasNoExpectedTotal() async throws {
    // No Content-Length: the body ends when the connection closes.
    let body = pattern(300_000)
    let server = try TestHTTPServer { _, _ in
      var raw = Data("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n".utf8)
      raw.append(body)
      return Reply(raw: raw)
    }
    defer { server.stop() }
    let folder = try TemporaryFolder()
    let operation = NetworkDownloadOperation(
      request: URLRequest(url: server.url("/stream")), destination: folder.file("s.bin"))
    let expectations = Log<Int64?>()
    operation.progressHandler = { _, expected in expectations.append(expected) }
    let file = try await within { try await operation.run() }
    #expect(try Data(contentsOf: file) == body)
    #expect(expectations.count > 0)
    #expect(expectations.all.allSatisfy { $0 == nil })
  }
}

/// Files directly in the temporary folder whose content starts with `marker`: what a download
/// of a body starting with `marker` left behind (Foundation's `<UUID>.tmp`, or ours,
/// `conveyor-download-<UUID>.part`). Other tests' downloads have other markers, so tests running
/// in parallel do not disturb it.
///
/// Only regular files with those endings are opened: the folder is shared (thousands of entries
/// on a developer's machine, where opening each held the test's thread for seconds), and a FIFO
/// there would block an open for reading forever.
func temporaryFiles(startingWith marker: Data) -> [String] {
  let folder = FileManager.default.temporaryDirectory
  let names: [String]
  do {
    names = try FileManager.default.contentsOfDirectory(atPath: folder.path)
  } catch {
    return ["(unreadable temporary folder: \(error))"]
  }
  return names.filter { name in
    guard name.hasSuffix(".tmp") || name.hasSuffix(".part") else { return false }
    let path = folder.appendingPathComponent(name).path
    var information = stat()
    guard lstat(path, &information) == 0, information.st_mode & S_IFMT == S_IFREG else { return false }
    let descriptor = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC)
    guard descriptor >= 0 else { return false }
    let handle = FileHandle(fileDescriptor: descriptor, closeOnDealloc: true)
    return (try? handle.read(upToCount: marker.count)) == marker
  }
}

/// A body that starts with a marker no other test uses.
func markedBody(_ count: Int) -> (marker: Data, body: Data) {
  let marker = withUnsafeBytes(of: UUID().uuid) { Data($0) }
  return (marker, marker + pattern(count))
}

@Suite("Download temporary files", .timeLimit(.minutes(10)))
struct DownloadTemporaryFileTests {
  @Test func successLeavesOnlyTheDestination() async throws {
    let (marker, body) = markedBody(200_000)
    let server = try TestHTTPServer(always: Reply(body: body, chunkSize: 50_000))
    defer { server.stop() }
    let folder = try TemporaryFolder()
    let operation = NetworkDownloadOperation(
      request: URLRequest(url: server.url("/f")), destination: folder.file("f.bin"))
    _ = try await within { try await operation.run() }
    #expect(try Data(contentsOf: folder.file("f.bin")) == body)
    #expect(try FileManager.default.contentsOfDirectory(atPath: folder.url.path) == ["f.bin"])
    #expect(temporaryFiles(startingWith: marker).isEmpty)
  }

  @Test func anErrorStatusLeavesNothing() async throws {
    let (marker, body) = markedBody(10_000)
    let server = try TestHTTPServer(always: Reply(status: 404, body: body))
    defer { server.stop() }
    let folder = try TemporaryFolder()
    let operation = NetworkDownloadOperation(
      request: URLRequest(url: server.url("/f")), destination: folder.file("f.bin"))
    let error = try networkError(try await failure(of: operation))
    guard case .httpStatus(let status) = error else { throw ServerError("got \(error)") }
    #expect(status.bodyExcerpt.prefix(marker.count) == marker)
    #expect(temporaryFiles(startingWith: marker).isEmpty)
    #expect(try FileManager.default.contentsOfDirectory(atPath: folder.url.path).isEmpty)
  }

  @Test func aThrowingEvaluationLeavesNothing() async throws {
    struct Nope: Error {}
    let (marker, body) = markedBody(10_000)
    let server = try TestHTTPServer(always: Reply(body: body))
    defer { server.stop() }
    let operation = NetworkDownloadOperation<Int>(request: URLRequest(url: server.url("/t"))) { _, _ in
      throw Nope()
    }
    _ = try await failure(of: operation)
    #expect(temporaryFiles(startingWith: marker).isEmpty)
  }

  /// The server promises more bytes than it sends, then closes: the transfer fails.
  @Test func aTruncatedTransferLeavesNothing() async throws {
    let (marker, body) = markedBody(100_000)
    let server = try TestHTTPServer { _, _ in
      var raw = Data("HTTP/1.1 200 OK\r\nContent-Length: \(body.count * 2)\r\nConnection: close\r\n\r\n".utf8)
      raw.append(body)
      return Reply(raw: raw)
    }
    defer { server.stop() }
    let folder = try TemporaryFolder()
    let operation = NetworkDownloadOperation(
      request: URLRequest(url: server.url("/cut")), destination: folder.file("cut.bin"))
    let error = try networkError(try await failure(of: operation))
    guard case .transport = error else { throw ServerError("got \(error)") }
    #expect(temporaryFiles(startingWith: marker).isEmpty)
    #expect(try FileManager.default.contentsOfDirectory(atPath: folder.url.path).isEmpty)
  }

  /// Cancelling finishes the operation at once; the task ends a moment later and its partial
  /// file goes with it.
  @Test func cancellationLeavesNothing() async throws {
    // Half the body, then nothing for 10 minutes: the download cannot end before it is
    // cancelled, however slow the machine (30 s was not: a test process starved beside three
    // compilers saw it end first).
    let (marker, body) = markedBody(200_000)
    let server = try TestHTTPServer(always: Reply(body: body, chunkSize: 100_016, pause: .seconds(600)))
    defer { server.stop() }
    let folder = try TemporaryFolder()
    let session = NetworkSession()
    let operation = NetworkDownloadOperation(
      request: URLRequest(url: server.url("/slow")), destination: folder.file("x.bin"), session: session)
    let written = Atomic<Int64>(0)
    operation.progressHandler = { bytes, _ in written.store(bytes, ordering: .releasing) }
    operation.start()
    try await eventually("some bytes were written") { written.load(ordering: .acquiring) > 0 }
    operation.cancel()
    #expect(try await failure(of: operation) == .cancelled)
    try await eventually("the partial file is removed") { temporaryFiles(startingWith: marker).isEmpty }
    #expect(try FileManager.default.contentsOfDirectory(atPath: folder.url.path).isEmpty)
  }
}
