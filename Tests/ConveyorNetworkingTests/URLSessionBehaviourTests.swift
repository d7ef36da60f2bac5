import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

#if canImport(FoundationNetworking)
  import FoundationNetworking
#endif

/// What plain `URLSession` does on this platform, for the parts ConveyorNetworking relies on or
/// works around. See the DocC catalog's "Linux notes".
@Suite("URLSession on this platform", .timeLimit(.minutes(10)))
struct URLSessionBehaviourTests {
  @Test func completionHandlerDownloadGivesAFileThatExistsDuringTheHandler() async throws {
    let server = try TestHTTPServer(always: .ok("downloaded"))
    defer { server.stop() }
    let seen = Log<String>()
    try await within {
      await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
        URLSession.shared.downloadTask(with: server.url("/f")) { location, response, error in
          if let location {
            do {
              seen.append(try String(contentsOf: location, encoding: .utf8))
            } catch {
              seen.append("unreadable: \(error)")
            }
            // Apple deletes the file after this handler; corelibs leaves it. Tidy up either way.
            if FileManager.default.fileExists(atPath: location.path) {
              do { try FileManager.default.removeItem(at: location) } catch { seen.append("\(error)") }
            }
          }
          seen.append(
            "status \((response as? HTTPURLResponse)?.statusCode ?? 0), error \(error == nil ? "none" : "some")"
          )
          done.resume()
        }.resume()
      }
    }
    #expect(seen.all == ["downloaded", "status 200, error none"])
  }

  @Test func sessionDelegateSeesDownloadProgress() async throws {
    final class Delegate: NSObject, URLSessionDownloadDelegate, Sendable {
      let written = Log<Int64>()
      let finished = Log<Bool>()
      func urlSession(
        _ session: URLSession, downloadTask: URLSessionDownloadTask, didWriteData bytesWritten: Int64,
        totalBytesWritten: Int64, totalBytesExpectedToWrite: Int64
      ) { written.append(totalBytesWritten) }
      func urlSession(
        _ session: URLSession, downloadTask: URLSessionDownloadTask, didFinishDownloadingTo location: URL
      ) { finished.append(FileManager.default.fileExists(atPath: location.path)) }
    }
    let server = try TestHTTPServer(
      always: Reply(body: pattern(200_000), chunkSize: 50_000, pause: .milliseconds(5)))
    defer { server.stop() }
    let delegate = Delegate()
    let session = URLSession(configuration: .default, delegate: delegate, delegateQueue: nil)
    defer { session.invalidateAndCancel() }
    session.downloadTask(with: server.url("/big")).resume()
    try await eventually("download finished") { delegate.finished.count == 1 }
    #expect(delegate.finished.all == [true])
    #expect(delegate.written.all.last == 200_000)
  }
}
