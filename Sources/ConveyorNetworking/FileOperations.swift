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
  /// A `permissions` value outside `0...0o7777`; nothing was written.
  case invalidPermissions(Int)

  /// One line saying what happened and to which path.
  public var description: String {
    switch self {
    case .sourceMissing(let path): "no such file: \(path)"
    case .destinationExists(let path): "destination already exists: \(path)"
    case .permissionDenied(let path, let message): "permission denied for \(path): \(message)"
    case .other(let path, let message): "file operation failed for \(path): \(message)"
    case .invalidPermissions(let value):
      "invalid permissions \(String(value, radix: 8)) (octal): pass a mode from 0 to 0o7777, such as 0o644"
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
  ///   - overwrite: Replace whatever is at `destination`, a file or a folder with contents (the
  ///     copy is made next to it and renamed over it, so readers never see half a copy).
  ///     Default false: fail with ``FileOperationError/destinationExists(path:)``, checked
  ///     atomically when the finished copy is renamed into place.
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
  /// On one file system the move is a single rename. Without `overwrite` that rename refuses
  /// an existing destination atomically (`renameat2(RENAME_NOREPLACE)` on Linux,
  /// `renamex_np(RENAME_EXCL)` on Apple platforms), so of two moves racing to one destination
  /// exactly one wins and the other fails with ``FileOperationError/destinationExists(path:)``.
  /// Across file systems the item is copied beside the destination, renamed into place, and the
  /// source removed.
  ///
  /// - Parameters:
  ///   - source: What to move.
  ///   - destination: Where; its folder must exist.
  ///   - overwrite: Replace whatever is at `destination`, a file or a folder with contents.
  ///     A file or an empty folder is replaced by one rename; a non-empty folder is exchanged
  ///     atomically where the system can and then removed. Default false.
  public static func move(
    from source: URL, to destination: URL, overwrite: Bool = false
  ) -> SyncOperation<URL, FileOperationError> {
    SyncOperation { () throws(FileOperationError) -> URL in
      try FileOperations.move(from: source, to: destination, overwrite: overwrite)
      return destination
    }
  }

  /// Writes `data` atomically, so the file is either the old one or the whole new one, even
  /// after a crash. Returns `destination`.
  ///
  /// The bytes go to a new temporary file next to the file being replaced, which gets its mode
  /// (and its owner, when the process may set it), are flushed to disk with `fsync`, and the
  /// temporary file is renamed over the old one. A new file is private to its owner (0600)
  /// unless `permissions` says otherwise.
  ///
  /// Symlinks are written through: when `destination` is a symlink (to a file, or dangling),
  /// the file it points to is replaced and the link stays as it is, as `>` in a shell does. With
  /// `overwrite: false` a symlink counts as an existing destination.
  ///
  /// ```swift
  /// let save = FileOperation.write(token, to: folder.appendingPathComponent("token"))  // 0600
  /// let page = FileOperation.write(html, to: site.appendingPathComponent("index.html"), permissions: 0o644)
  /// ```
  ///
  /// - Parameters:
  ///   - data: The bytes.
  ///   - destination: The file.
  ///   - overwrite: Replace an existing file. Default true; false fails with
  ///     ``FileOperationError/destinationExists(path:)`` (checked atomically).
  ///   - createDirectories: Create missing parent folders first. Default false.
  ///   - permissions: The file's mode, such as `0o644`. Default nil: the replaced file's mode,
  ///     or 0600 for a new file.
  public static func write(
    _ data: Data, to destination: URL, overwrite: Bool = true, createDirectories: Bool = false,
    permissions: Int? = nil
  ) -> SyncOperation<URL, FileOperationError> {
    SyncOperation { () throws(FileOperationError) -> URL in
      try FileOperations.write(
        data, to: destination, overwrite: overwrite, createDirectories: createDirectories,
        permissions: permissions)
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
///
/// Every path that creates or replaces an item first builds it under a hidden sibling name
/// (`.<name>.<uuid>.tmp`, same folder, so same file system) and then renames it into place:
/// readers see the old item or the whole new one, never half of it.
enum FileOperations {
  static func copy(from source: URL, to destination: URL, overwrite: Bool) throws(FileOperationError) {
    try requireSource(source)
    let temporary = sibling(of: destination)
    try attempt(path: destination.path, source: source.path) {
      try FileManager.default.copyItem(at: source, to: temporary)
    }
    do throws(FileOperationError) {
      if overwrite {
        try replace(destination, with: temporary)
      } else {
        try renameExclusively(temporary, to: destination)
      }
    } catch {
      removeLeftover(temporary)
      throw error
    }
  }

  static func move(from source: URL, to destination: URL, overwrite: Bool) throws(FileOperationError) {
    try requireSource(source)
    let code =
      overwrite
      ? renameStatus(source, to: destination)
      : AtomicRename.withoutReplacing(source.path, destination.path)
    switch code {
    case 0:
      return
    case EXDEV:  // another file system: copy (atomically), then remove the source
      try copy(from: source, to: destination, overwrite: overwrite)
      try remove(source, ignoreMissing: true)
    case ENOTEMPTY, EEXIST, EISDIR, ENOTDIR:
      guard overwrite else { throw posixError(code, path: destination.path, source: source.path) }
      // A folder onto a non-empty folder, or a file and a folder onto each other: rename(2)
      // refuses. Stage the source beside the destination, then swap it in.
      let staged = sibling(of: destination)
      try rename(source, to: staged)
      do throws(FileOperationError) {
        try replace(destination, with: staged)
      } catch {
        _ = renameStatus(staged, to: source)  // put it back; the replace error is what matters
        throw error
      }
    case let code:
      throw posixError(code, path: destination.path, source: source.path)
    }
  }

  static func write(
    _ data: Data, to destination: URL, overwrite: Bool, createDirectories: Bool, permissions: Int?
  ) throws(FileOperationError) {
    let folder = destination.deletingLastPathComponent()
    if createDirectories {
      try attempt(path: folder.path, source: nil) {
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
      }
    }
    // Overwriting writes through symlinks, as `>` in a shell does: the link stays a link and its
    // target is replaced. A no-overwrite write finds the link in place and refuses it.
    let target = overwrite ? try resolvingSymlinks(destination) : destination
    var existing = stat()
    let replacing = overwrite && lstat(target.path, &existing) == 0
    if let permissions, !(0...0o7777).contains(permissions) {
      throw .invalidPermissions(permissions)
    }
    let mode = mode_t(permissions ?? (replacing ? Int(existing.st_mode & 0o7777) : 0o600))
    let temporary = sibling(of: target)
    try writeNewFile(
      data, at: temporary.path, mode: mode, owner: replacing ? (existing.st_uid, existing.st_gid) : nil,
      reportedAs: destination.path)
    let code =
      overwrite
      ? renameStatus(temporary, to: target) : AtomicRename.withoutReplacing(temporary.path, target.path)
    if code != 0 {
      removeLeftover(temporary)
      throw posixError(code, path: destination.path, source: nil)
    }
    syncFolder(target.deletingLastPathComponent())
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

  /// A new name in `destination`'s folder. Short and not derived from the destination's name, so
  /// that a destination name up to the file system's limit (255 bytes) still has a sibling.
  private static func sibling(of destination: URL) -> URL {
    let random = String(UInt64.random(in: 0...UInt64.max), radix: 16)
    return destination.deletingLastPathComponent().appendingPathComponent(".conveyor-\(random).tmp")
  }

  private static func rename(_ source: URL, to destination: URL) throws(FileOperationError) {
    let code = renameStatus(source, to: destination)
    if code != 0 { throw posixError(code, path: destination.path, source: source.path) }
  }

  /// Renames `item` to `destination` unless something is there; EEXIST becomes
  /// ``FileOperationError/destinationExists(path:)``.
  private static func renameExclusively(_ item: URL, to destination: URL) throws(FileOperationError) {
    let code = AtomicRename.withoutReplacing(item.path, destination.path)
    if code != 0 { throw posixError(code, path: destination.path, source: nil) }
  }

  /// Puts `item` (a hidden sibling of `destination`) in place of whatever `destination` is.
  ///
  /// A plain rename replaces a file or an empty folder. When it refuses (a non-empty folder, a
  /// file against a folder) the two are exchanged atomically where the system can
  /// (`renameat2(RENAME_EXCHANGE)`, `renamex_np(RENAME_SWAP)`), else the old one is renamed
  /// aside first (a moment with nothing at `destination`) and put back if the second rename
  /// fails. Either way the old item ends under a hidden name and is then removed.
  private static func replace(_ destination: URL, with item: URL) throws(FileOperationError) {
    let code = renameStatus(item, to: destination)
    switch code {
    case 0:
      return
    case ENOTEMPTY, EEXIST, EISDIR, ENOTDIR:
      break
    default:
      throw posixError(code, path: destination.path, source: nil)
    }
    if AtomicRename.exchange(item.path, destination.path) == 0 {
      removeLeftover(item)  // now the old item
      return
    }
    let aside = sibling(of: destination)
    try rename(destination, to: aside)
    let moved = renameStatus(item, to: destination)
    if moved != 0 {
      _ = renameStatus(aside, to: destination)  // restore; the rename error is what matters
      throw posixError(moved, path: destination.path, source: nil)
    }
    removeLeftover(aside)
  }

  /// Follows `url` while it is a symlink; the last path is the file to replace (it may not exist
  /// yet, for a dangling link). More than 40 links fails with ELOOP, as the kernel does.
  private static func resolvingSymlinks(_ url: URL) throws(FileOperationError) -> URL {
    var current = url
    for _ in 0..<40 {
      var status = stat()
      guard lstat(current.path, &status) == 0, status.st_mode & S_IFMT == S_IFLNK else { return current }
      let target: String
      do {
        target = try FileManager.default.destinationOfSymbolicLink(atPath: current.path)
      } catch {
        throw map(error, path: url.path, source: nil)
      }
      current =
        target.hasPrefix("/")
        ? URL(fileURLWithPath: target)
        : current.deletingLastPathComponent().appendingPathComponent(target)
    }
    throw posixError(ELOOP, path: url.path, source: nil)
  }

  /// Creates `path` (which must not exist) with exactly `mode`, writes `data`, fsyncs and
  /// closes it; removes it on any failure. `owner`, when given, is set too if the process may.
  private static func writeNewFile(
    _ data: Data, at path: String, mode: mode_t, owner: (uid_t, gid_t)?, reportedAs reported: String
  ) throws(FileOperationError) {
    let descriptor = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode)
    guard descriptor >= 0 else { throw posixError(errno, path: reported, source: nil) }
    var failure: Int32 = 0
    if let owner, owner != (geteuid(), getegid()) {
      // Keeping another user's or group's ownership needs privileges; without them the file
      // becomes ours, with the old mode, as editors that write a new file and rename do. Before
      // the mode: on Linux chown clears the set-user-ID and set-group-ID bits.
      _ = fchown(descriptor, owner.0, owner.1)
    }
    // open(2) applies the umask; the mode asked for (or the replaced file's) is what counts.
    if fchmod(descriptor, mode) != 0 { failure = errno }
    if failure == 0 {
      failure = data.withUnsafeBytes { buffer -> Int32 in
        var offset = 0
        while offset < buffer.count {
          let written = systemWrite(descriptor, buffer.baseAddress! + offset, buffer.count - offset)
          if written < 0 {
            if errno == EINTR { continue }
            return errno
          }
          offset += written
        }
        return 0
      }
    }
    if failure == 0, fsync(descriptor) != 0 { failure = errno }
    if close(descriptor) != 0, failure == 0 { failure = errno }
    if failure != 0 {
      unlink(path)
      throw posixError(failure, path: reported, source: nil)
    }
  }

  /// fsyncs a folder so a rename into it survives a crash; best effort (some file systems
  /// refuse to sync folders, and the rename itself already happened).
  private static func syncFolder(_ folder: URL) {
    let descriptor = open(folder.path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
    guard descriptor >= 0 else { return }
    _ = fsync(descriptor)
    close(descriptor)
  }

  private static func systemWrite(_ descriptor: Int32, _ bytes: UnsafeRawPointer, _ count: Int) -> Int {
    #if canImport(Darwin)
      Darwin.write(descriptor, bytes, count)
    #elseif canImport(Glibc)
      Glibc.write(descriptor, bytes, count)
    #else
      Musl.write(descriptor, bytes, count)
    #endif
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

/// Renames that plain `rename(2)` cannot do atomically.
enum AtomicRename {
  /// Renames `source` to `destination` only if nothing is at `destination`, in one step, so of
  /// two racing renames to one name exactly one wins and the other gets EEXIST. Returns 0 or
  /// the `errno`.
  ///
  /// Linux: `renameat2(RENAME_NOREPLACE)`. Where the file system or kernel lacks it (EINVAL,
  /// ENOSYS), `link` then `unlink`, which is just as exclusive. Where neither works (a folder,
  /// which cannot be hard-linked, on such a file system), a check then a rename: not atomic,
  /// the only way left. Apple platforms: `renamex_np(RENAME_EXCL)`.
  static func withoutReplacing(_ source: String, _ destination: String) -> Int32 {
    #if canImport(Darwin)
      if renamex_np(source, destination, UInt32(RENAME_EXCL)) == 0 { return 0 }
      let code = errno
      if code != ENOTSUP && code != EINVAL { return code }
    #else
      if let renameat2 = LinuxRename.renameat2 {
        if renameat2(AT_FDCWD, source, AT_FDCWD, destination, LinuxRename.noReplace) == 0 { return 0 }
        let code = errno
        if code != EINVAL && code != ENOSYS { return code }
      }
    #endif
    return linkThenUnlink(source, destination)
  }

  /// Swaps two existing items atomically; 0, or the `errno` (ENOSYS, EINVAL, ENOTSUP where the
  /// system or file system cannot, and the caller falls back).
  static func exchange(_ first: String, _ second: String) -> Int32 {
    #if canImport(Darwin)
      return renamex_np(first, second, UInt32(RENAME_SWAP)) == 0 ? 0 : errno
    #else
      guard let renameat2 = LinuxRename.renameat2 else { return ENOSYS }
      return renameat2(AT_FDCWD, first, AT_FDCWD, second, LinuxRename.exchange) == 0 ? 0 : errno
    #endif
  }

  /// The fallback of ``withoutReplacing(_:_:)``: `link` fails with EEXIST if the name is taken.
  static func linkThenUnlink(_ source: String, _ destination: String) -> Int32 {
    if link(source, destination) == 0 {
      if unlink(source) == 0 { return 0 }
      let code = errno
      unlink(destination)  // undo: the source stays where it was
      return code
    }
    let code = errno
    guard code == EPERM || code == ENOTSUP || code == EOPNOTSUPP || code == EXDEV else { return code }
    // EXDEV: let the caller copy. EPERM/ENOTSUP: a folder, or no hard links here.
    if code == EXDEV { return EXDEV }
    var status = stat()
    if lstat(destination, &status) == 0 { return EEXIST }
    return rename(source, destination) == 0 ? 0 : errno
  }
}

#if !canImport(Darwin)
  /// `renameat2`, looked up at run time: Swift's Glibc module does not declare it (it needs
  /// `_GNU_SOURCE`), and `syscall` is variadic, so Swift cannot call it. glibc has it since
  /// 2.28; elsewhere the lookup fails and callers fall back.
  enum LinuxRename {
    typealias Function =
      @convention(c) (
        Int32, UnsafePointer<CChar>, Int32, UnsafePointer<CChar>, UInt32
      ) -> Int32

    /// `RENAME_NOREPLACE` from `<linux/fs.h>`.
    static let noReplace: UInt32 = 1 << 0
    /// `RENAME_EXCHANGE` from `<linux/fs.h>`.
    static let exchange: UInt32 = 1 << 1

    static let renameat2: Function? = {
      guard let handle = dlopen(nil, RTLD_NOW), let symbol = dlsym(handle, "renameat2") else { return nil }
      return unsafeBitCast(symbol, to: Function.self)
    }()
  }
#endif
