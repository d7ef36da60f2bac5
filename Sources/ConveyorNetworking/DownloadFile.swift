import Foundation

#if canImport(FoundationNetworking)
  import FoundationNetworking
#endif
#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#elseif canImport(Darwin)
  import Darwin
#endif

/// The temporary file a streamed download writes its body to, owned by the download from its
/// first byte to its end, so every way a download ends removes it.
///
/// Why not a `URLSessionDownloadTask`: swift-corelibs-foundation writes its body to
/// `<tmp>/<UUID>.tmp` and never deletes it when the transfer fails, is cancelled or is cut
/// short, and does not say where it is. A worker retrying downloads would fill the disk.
///
/// Created on the first write (a task cancelled before any byte arrived leaves nothing), in the
/// temporary folder, readable by its owner only (0600). Used on the session's serial delegate
/// queue only; the value lives in the session's task table between callbacks.
struct DownloadFile: Sendable {
  /// Where the body goes.
  let url = FileManager.default.temporaryDirectory
    .appendingPathComponent("conveyor-download-\(UUID().uuidString).part")
  private var descriptor: Int32 = -1
  /// Bytes written so far.
  private(set) var written: Int64 = 0
  /// Why writing failed, if it did; the download then fails with it.
  private(set) var failure: URLError?

  /// Appends `data`; false (and ``failure`` set) when the file cannot be created or written.
  mutating func append(_ data: Data) -> Bool {
    guard failure == nil, open() else { return false }
    let code = data.withUnsafeBytes { buffer -> Int32 in
      var offset = 0
      while offset < buffer.count {
        let count = Self.write(descriptor, buffer.baseAddress! + offset, buffer.count - offset)
        if count < 0 {
          if errno == EINTR { continue }
          return errno
        }
        offset += count
      }
      return 0
    }
    if code != 0 {
      fail(code, "could not write the download to \(url.path)")
      return false
    }
    written += Int64(data.count)
    return true
  }

  /// Closes the file after a complete body (creating it empty if no byte came); false (and
  /// ``failure`` set) when that fails.
  mutating func close() -> Bool {
    guard failure == nil, open() else { return false }
    let closed = Self.close(descriptor)
    descriptor = -1
    if closed != 0 {
      fail(errno, "could not write the download to \(url.path)")
      return false
    }
    return true
  }

  /// Closes and deletes the file, whatever state it is in.
  mutating func remove() {
    if descriptor >= 0 {
      _ = Self.close(descriptor)
      descriptor = -1
    }
    unlink(url.path)
  }

  private mutating func open() -> Bool {
    if descriptor >= 0 { return true }
    descriptor = Self.openFile(url.path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
    if descriptor < 0 {
      fail(errno, "could not create \(url.path) for the download")
      return false
    }
    return true
  }

  private mutating func fail(_ code: Int32, _ what: String) {
    let reason = String(cString: strerror(code))
    failure = URLError(.cannotWriteToFile, userInfo: [NSLocalizedDescriptionKey: "\(what): \(reason)"])
  }

  private static func write(_ descriptor: Int32, _ bytes: UnsafeRawPointer, _ count: Int) -> Int {
    #if canImport(Darwin)
      Darwin.write(descriptor, bytes, count)
    #elseif canImport(Glibc)
      Glibc.write(descriptor, bytes, count)
    #else
      Musl.write(descriptor, bytes, count)
    #endif
  }

  private static func openFile(_ path: String, _ flags: Int32, _ mode: mode_t) -> Int32 {
    #if canImport(Darwin)
      Darwin.open(path, flags, mode)
    #elseif canImport(Glibc)
      Glibc.open(path, flags, mode)
    #else
      Musl.open(path, flags, mode)
    #endif
  }

  private static func close(_ descriptor: Int32) -> Int32 {
    #if canImport(Darwin)
      Darwin.close(descriptor)
    #elseif canImport(Glibc)
      Glibc.close(descriptor)
    #else
      Musl.close(descriptor)
    #endif
  }
}
