import Conveyor
import Foundation

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#elseif canImport(Darwin)
  import Darwin
#endif

/// Why a file operation failed. Paths are included; file contents never are.
public enum FileOperationError: Error, Hashable, CustomStringConvertible {
  /// The file to copy, move or remove does not exist.
  case sourceMissing(path: String)
  /// The destination exists and the operation was told not to overwrite it.
  case destinationExists(path: String)
  /// The system refused access to `path`.
  case permissionDenied(path: String, message: String)
  /// Anything else, with the path involved and the system's message.
  case other(path: String, message: String)

  /// One line saying what happened and to which path.
  public var description: String {
    switch self {
    case .sourceMissing(let path): "no such file: \(path)"
    case .destinationExists(let path): "destination already exists: \(path)"
    case .permissionDenied(let path, let message): "permission denied for \(path): \(message)"
    case .other(let path, let message): "file operation failed for \(path): \(message)"
    }
  }
}

/// File operations (copy, move, atomic write, remove) as typed `SyncOperation`s, so they run on
/// an `OperationQueue`, depend on network operations, and report a ``FileOperationError``.
///
/// ```swift
/// let write = FileOperation.write(Data("hello".utf8), to: folder.appendingPathComponent("a.txt"))
/// let copy = FileOperation.copy(
///   from: folder.appendingPathComponent("a.txt"), to: folder.appendingPathComponent("b.txt"))
/// copy.addDependency(write)
/// queue.addOperations([write, copy], waitUntilFinished: false)
/// let copied = try await copy.value
/// ```
public enum FileOperation {
  /// Copies a file (or folder) to `destination`, which it returns.
  ///
  /// - Parameters:
  ///   - source: What to copy.
  ///   - destination: Where; its folder must exist.
  ///   - overwrite: Replace an existing destination (the copy is made next to it and renamed
  ///     over it, so readers never see half a file). Default false: fail with
  ///     ``FileOperationError/destinationExists(path:)``.
  public static func copy(
    from source: URL, to destination: URL, overwrite: Bool = false
  ) -> SyncOperation<URL, FileOperationError> {
    SyncOperation { () throws(FileOperationError) -> URL in
      try FileOperations.copy(from: source, to: destination, overwrite: overwrite)
      return destination
    }
  }

  /// Moves a file (or folder) to `destination`, which it returns.
  ///
  /// - Parameters:
  ///   - source: What to move.
  ///   - destination: Where; its folder must exist.
  ///   - overwrite: Replace an existing destination with an atomic rename. Default false.
  public static func move(
    from source: URL, to destination: URL, overwrite: Bool = false
  ) -> SyncOperation<URL, FileOperationError> {
    SyncOperation { () throws(FileOperationError) -> URL in
      try FileOperations.move(from: source, to: destination, overwrite: overwrite)
      return destination
    }
  }

  /// Writes `data` atomically (to a temporary file next to `destination`, then renamed), so the
  /// file is either the old one or the whole new one. Returns `destination`.
  ///
  /// - Parameters:
  ///   - data: The bytes.
  ///   - destination: The file.
  ///   - overwrite: Replace an existing file. Default true; false fails with
  ///     ``FileOperationError/destinationExists(path:)`` (checked atomically).
  ///   - createDirectories: Create missing parent folders first. Default false.
  public static func write(
    _ data: Data, to destination: URL, overwrite: Bool = true, createDirectories: Bool = false
  ) -> SyncOperation<URL, FileOperationError> {
    SyncOperation { () throws(FileOperationError) -> URL in
      try FileOperations.write(
        data, to: destination, overwrite: overwrite, createDirectories: createDirectories)
      return destination
    }
  }

  /// Removes a file or folder (with its contents).
  ///
  /// - Parameters:
  ///   - url: What to remove.
  ///   - ignoreMissing: Succeed when nothing is there. Default false: fail with
  ///     ``FileOperationError/sourceMissing(path:)``.
  public static func remove(_ url: URL, ignoreMissing: Bool = false) -> SyncOperation<
    Void, FileOperationError
  > {
    SyncOperation { () throws(FileOperationError) in
      try FileOperations.remove(url, ignoreMissing: ignoreMissing)
    }
  }
}

/// The blocking implementations behind ``FileOperation``.
enum FileOperations {
  static func copy(from source: URL, to destination: URL, overwrite: Bool) throws(FileOperationError) {
    try requireSource(source)
    if !overwrite {
      try requireAbsent(destination)
      try attempt(path: destination.path, source: source.path) {
        try FileManager.default.copyItem(at: source, to: destination)
      }
      return
    }
    let temporary = sibling(of: destination)
    try attempt(path: destination.path, source: source.path) {
      try FileManager.default.copyItem(at: source, to: temporary)
    }
    do throws(FileOperationError) {
      try rename(temporary, to: destination)
    } catch {
      removeLeftover(temporary)
      throw error
    }
  }

  static func move(from source: URL, to destination: URL, overwrite: Bool) throws(FileOperationError) {
    try requireSource(source)
    if !overwrite {
      try requireAbsent(destination)
      try attempt(path: destination.path, source: source.path) {
        try FileManager.default.moveItem(at: source, to: destination)
      }
      return
    }
    switch renameStatus(source, to: destination) {
    case 0:
      return
    case EXDEV:  // another file system: copy (atomically), then remove the source
      try copy(from: source, to: destination, overwrite: true)
      try remove(source, ignoreMissing: true)
    case let code:
      throw posixError(code, path: destination.path, source: source.path)
    }
  }

  static func write(
    _ data: Data, to destination: URL, overwrite: Bool, createDirectories: Bool
  ) throws(FileOperationError) {
    let folder = destination.deletingLastPathComponent()
    if createDirectories {
      try attempt(path: folder.path, source: nil) {
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
      }
    }
    if overwrite {
      try attempt(path: destination.path, source: nil) { try data.write(to: destination, options: .atomic) }
      return
    }
    // Write next to the destination, then hard-link it into place: link(2) fails if the
    // destination exists, so no other writer's file is ever replaced.
    let temporary = sibling(of: destination)
    try attempt(path: destination.path, source: nil) { try data.write(to: temporary) }
    defer { removeLeftover(temporary) }
    if link(temporary.path, destination.path) != 0 {
      throw posixError(errno, path: destination.path, source: nil)
    }
  }

  static func remove(_ url: URL, ignoreMissing: Bool) throws(FileOperationError) {
    guard exists(url) else {
      if ignoreMissing { return }
      throw .sourceMissing(path: url.path)
    }
    try attempt(path: url.path, source: url.path) { try FileManager.default.removeItem(at: url) }
  }

  // MARK: Helpers

  private static func exists(_ url: URL) -> Bool {
    var status = stat()
    return lstat(url.path, &status) == 0
  }

  private static func requireSource(_ source: URL) throws(FileOperationError) {
    if !exists(source) { throw .sourceMissing(path: source.path) }
  }

  private static func requireAbsent(_ destination: URL) throws(FileOperationError) {
    if exists(destination) { throw .destinationExists(path: destination.path) }
  }

  private static func sibling(of destination: URL) -> URL {
    destination.deletingLastPathComponent()
      .appendingPathComponent(".\(destination.lastPathComponent).\(UUID().uuidString).tmp")
  }

  private static func rename(_ source: URL, to destination: URL) throws(FileOperationError) {
    let code = renameStatus(source, to: destination)
    if code != 0 { throw posixError(code, path: destination.path, source: source.path) }
  }

  /// Renames with libc's `rename`; returns 0 or the `errno` it failed with.
  private static func renameStatus(_ source: URL, to destination: URL) -> Int32 {
    #if canImport(Darwin)
      let result = Darwin.rename(source.path, destination.path)
    #elseif canImport(Glibc)
      let result = Glibc.rename(source.path, destination.path)
    #else
      let result = Musl.rename(source.path, destination.path)
    #endif
    return result == 0 ? 0 : errno
  }

  /// Removes a temporary file of ours that is no longer needed.
  private static func removeLeftover(_ url: URL) {
    guard exists(url) else { return }
    do {
      try FileManager.default.removeItem(at: url)
    } catch {
      // The operation's own error (or success) is what the caller needs; a stray temporary
      // file named `.<name>.<uuid>.tmp` is harmless and visibly ours.
    }
  }

  private static func attempt(
    path: String, source: String?, _ body: () throws -> Void
  ) throws(FileOperationError) {
    do {
      try body()
    } catch {
      throw map(error, path: path, source: source)
    }
  }

  /// Classifies an error from `FileManager` or `Data.write`.
  static func map(_ error: any Error, path: String, source: String?) -> FileOperationError {
    let nsError = error as NSError
    if let posix = nsError.userInfo[NSUnderlyingErrorKey] as? NSError, posix.domain == NSPOSIXErrorDomain {
      return posixError(Int32(posix.code), path: path, source: source)
    }
    if nsError.domain == NSPOSIXErrorDomain {
      return posixError(Int32(nsError.code), path: path, source: source)
    }
    if nsError.domain == NSCocoaErrorDomain {
      switch CocoaError.Code(rawValue: nsError.code) {
      case .fileNoSuchFile, .fileReadNoSuchFile:
        return .sourceMissing(path: source ?? path)
      case .fileWriteFileExists:
        return .destinationExists(path: path)
      case .fileReadNoPermission, .fileWriteNoPermission:
        return .permissionDenied(path: path, message: nsError.localizedDescription)
      default:
        break
      }
    }
    return .other(path: path, message: nsError.localizedDescription)
  }

  static func posixError(_ code: Int32, path: String, source: String?) -> FileOperationError {
    let message = String(cString: strerror(code))
    switch code {
    case ENOENT: return .sourceMissing(path: source ?? path)
    case EEXIST: return .destinationExists(path: path)
    case EACCES, EPERM, EROFS: return .permissionDenied(path: path, message: message)
    default: return .other(path: path, message: message)
    }
  }
}
