import Conveyor
import ConveyorTestSupport
import Foundation
import Testing

@testable import ConveyorNetworking

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// Runs a file operation and returns its error, or nil on success.
func fileError<Success>(_ operation: SyncOperation<Success, FileOperationError>) async -> FileOperationError?
{
  do {
    _ = try await operation.run()
    return nil
  } catch {
    switch error {
    case .failed(let failure): return failure
    case .cancelled: return .other(path: "", message: "cancelled")
    }
  }
}

@Suite("File operations")
struct FileOperationTests {
  let folder: TemporaryFolder

  init() throws { folder = try TemporaryFolder() }

  func text(_ name: String) throws -> String { try String(contentsOf: folder.file(name), encoding: .utf8) }
  func put(_ name: String, _ text: String) throws { try Data(text.utf8).write(to: folder.file(name)) }
  func exists(_ name: String) -> Bool { FileManager.default.fileExists(atPath: folder.file(name).path) }

  @Test func copyCopiesAndReturnsTheDestination() async throws {
    try put("a", "alpha")
    let result = try await FileOperation.copy(from: folder.file("a"), to: folder.file("b")).run()
    #expect(result == folder.file("b"))
    #expect(try text("a") == "alpha")
    #expect(try text("b") == "alpha")
  }

  @Test func copyRefusesAnExistingDestinationUnlessOverwriting() async throws {
    try put("a", "new")
    try put("b", "old")
    #expect(
      await fileError(FileOperation.copy(from: folder.file("a"), to: folder.file("b")))
        == .destinationExists(path: folder.file("b").path))
    #expect(try text("b") == "old")
    try await FileOperation.copy(from: folder.file("a"), to: folder.file("b"), overwrite: true).run()
    #expect(try text("b") == "new")
    let leftovers = try FileManager.default.contentsOfDirectory(atPath: folder.url.path).filter {
      $0.hasSuffix(".tmp")
    }
    #expect(leftovers.isEmpty)
  }

  @Test func copyOfAMissingSourceFails() async throws {
    #expect(
      await fileError(FileOperation.copy(from: folder.file("nope"), to: folder.file("b")))
        == .sourceMissing(path: folder.file("nope").path))
  }

  @Test func moveMovesAndOverwritesOnlyWhenAsked() async throws {
    try put("a", "one")
    try await FileOperation.move(from: folder.file("a"), to: folder.file("b")).run()
    #expect(!exists("a"))
    #expect(try text("b") == "one")

    try put("c", "two")
    #expect(
      await fileError(FileOperation.move(from: folder.file("c"), to: folder.file("b")))
        == .destinationExists(path: folder.file("b").path))
    try await FileOperation.move(from: folder.file("c"), to: folder.file("b"), overwrite: true).run()
    #expect(try text("b") == "two")
    #expect(!exists("c"))
  }

  /// `rename` fails with EXDEV between file systems; an overwriting move then copies and removes.
  @Test(.enabled(if: onAnotherFileSystem("/dev/shm"), "needs /dev/shm on another file system"))
  func anOverwritingMoveAcrossFileSystemsCopiesThenRemoves() async throws {
    let other = try TemporaryFolder(prefix: "conveyor-move-test", in: URL(fileURLWithPath: "/dev/shm"))
    let source = other.file("x")
    try Data("across".utf8).write(to: source)
    try put("y", "old")
    try await FileOperation.move(from: source, to: folder.file("y"), overwrite: true).run()
    #expect(try text("y") == "across")
    #expect(!FileManager.default.fileExists(atPath: source.path))
  }

  @Test func moveOfAMissingSourceFails() async throws {
    #expect(
      await fileError(FileOperation.move(from: folder.file("nope"), to: folder.file("b"), overwrite: true))
        == .sourceMissing(path: folder.file("nope").path))
  }

  @Test func writeIsAtomicAndHonoursOverwrite() async throws {
    try await FileOperation.write(Data("first".utf8), to: folder.file("w")).run()
    #expect(try text("w") == "first")
    try await FileOperation.write(Data("second".utf8), to: folder.file("w")).run()
    #expect(try text("w") == "second")
    #expect(
      await fileError(FileOperation.write(Data("third".utf8), to: folder.file("w"), overwrite: false))
        == .destinationExists(path: folder.file("w").path))
    #expect(try text("w") == "second")
    try await FileOperation.write(Data("fresh".utf8), to: folder.file("n"), overwrite: false).run()
    #expect(try text("n") == "fresh")
    let names = try FileManager.default.contentsOfDirectory(atPath: folder.url.path).sorted()
    #expect(names == ["n", "w"])
  }

  @Test func writeCreatesFoldersWhenAsked() async throws {
    let nested = folder.url.appendingPathComponent("x/y/z.txt")
    let error = await fileError(FileOperation.write(Data("z".utf8), to: nested))
    #expect(error != nil)
    try await FileOperation.write(Data("z".utf8), to: nested, createDirectories: true).run()
    #expect(try String(contentsOf: nested, encoding: .utf8) == "z")
  }

  @Test func removeRemovesAndReportsMissing() async throws {
    try put("r", "bye")
    try await FileOperation.remove(folder.file("r")).run()
    #expect(!exists("r"))
    #expect(
      await fileError(FileOperation.remove(folder.file("r"))) == .sourceMissing(path: folder.file("r").path))
    try await FileOperation.remove(folder.file("r"), ignoreMissing: true).run()
  }

  @Test func errorsAreClassified() {
    #expect(
      FileOperations.posixError(EACCES, path: "/p", source: nil)
        == .permissionDenied(
          path: "/p", message: String(cString: strerror(EACCES))))
    #expect(FileOperations.posixError(ENOENT, path: "/d", source: "/s") == .sourceMissing(path: "/s"))
    #expect(FileOperations.posixError(EEXIST, path: "/d", source: "/s") == .destinationExists(path: "/d"))
    let cocoa = CocoaError(.fileWriteNoPermission)
    guard case .permissionDenied(let path, _) = FileOperations.map(cocoa, path: "/x", source: nil) else {
      Issue.record("not classified as permission denied")
      return
    }
    #expect(path == "/x")
    #expect(FileOperationError.sourceMissing(path: "/a").description == "no such file: /a")
  }

  @Test func permissionDeniedForAReadOnlyFolder() async throws {
    guard geteuid() != 0 else { return }  // root ignores permissions
    let locked = folder.url.appendingPathComponent("locked")
    try FileManager.default.createDirectory(at: locked, withIntermediateDirectories: false)
    try FileManager.default.setAttributes([.posixPermissions: 0o500], ofItemAtPath: locked.path)
    defer {
      do {
        try FileManager.default.setAttributes([.posixPermissions: 0o700], ofItemAtPath: locked.path)
      } catch {
        Issue.record("could not unlock \(locked.path): \(error)")
      }
    }
    let error = await fileError(FileOperation.write(Data("x".utf8), to: locked.appendingPathComponent("f")))
    guard case .permissionDenied = error else {
      Issue.record("got \(String(describing: error))")
      return
    }
  }
}

/// Whether `path` exists on a different file system (device) from the temporary directory.
func onAnotherFileSystem(_ path: String) -> Bool {
  var there = stat()
  var here = stat()
  guard stat(path, &there) == 0, stat(FileManager.default.temporaryDirectory.path, &here) == 0 else {
    return false
  }
  return there.st_dev != here.st_dev
}
