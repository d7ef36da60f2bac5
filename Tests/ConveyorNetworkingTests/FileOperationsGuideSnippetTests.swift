import Conveyor
import ConveyorNetworking
import ConveyorTestSupport
import Foundation
import Testing

// The file operations example of the "Network and file operations" guide
// (Sources/ConveyorNetworking/ConveyorNetworking.docc/NetworkAndFileOperations.md), verbatim
// between the markers, so it compiles and runs. (The guide's network example and the "HTTP
// outbox" guide's example run in ReadmeHTTPOutboxTests.swift.)

// NetworkAndFileOperations.md example 2 begins
/// Saves a report atomically, then publishes it under a name no other report has taken.
private func publishReport(_ report: Data, in folder: URL) async throws -> URL {
  let draft = try await FileOperation.write(
    report, to: folder.appendingPathComponent("report.draft"), permissions: 0o644
  ).run()
  // Fails with .destinationExists when a report is there already; the draft then stays.
  return try await FileOperation.move(from: draft, to: folder.appendingPathComponent("report.txt")).run()
}
// NetworkAndFileOperations.md example 2 ends

@Suite("Guide snippets: file operations", .timeLimit(.minutes(10)))
struct FileOperationsGuideSnippetTests {
  @Test func aReportIsPublishedOnceAndNeverOverwritten() async throws {
    let folder = try TemporaryFolder()
    let published = try await publishReport(Data("first".utf8), in: folder.url)
    #expect(published == folder.file("report.txt"))
    #expect(try Data(contentsOf: published) == Data("first".utf8))
    let mode = try FileManager.default.attributesOfItem(atPath: published.path)[.posixPermissions] as? Int
    #expect(mode == 0o644)

    let refused = await #expect(throws: OperationError<FileOperationError>.self) {
      try await publishReport(Data("second".utf8), in: folder.url)
    }
    guard case .failed(.destinationExists)? = refused else {
      Issue.record("expected .destinationExists, got \(String(describing: refused))")
      return
    }
    #expect(try Data(contentsOf: published) == Data("first".utf8), "the published report is kept")
    #expect(try Data(contentsOf: folder.file("report.draft")) == Data("second".utf8), "the draft stays")
  }
}
