import Foundation

/// A fresh temporary folder per test, removed (best effort) when the value is released.
public final class TemporaryFolder: Sendable {
  /// The folder.
  public let url: URL

  /// Creates `<base>/<prefix>-<UUID>`; `base` is the temporary directory by default.
  public init(prefix: String = "conveyor-tests", in base: URL = FileManager.default.temporaryDirectory) throws
  {
    url = base.appendingPathComponent("\(prefix)-\(UUID().uuidString)", isDirectory: true)
    try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
  }

  deinit {
    // A leftover temporary folder is harmless; removal failing must not fail the test.
    _ = try? FileManager.default.removeItem(at: url)
  }

  /// The path of `name` in the folder.
  public func path(_ name: String) -> String { url.appendingPathComponent(name).path }

  /// The URL of `name` in the folder.
  public func file(_ name: String) -> URL { url.appendingPathComponent(name) }
}
