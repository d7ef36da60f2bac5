import Foundation

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

extension SQLiteJobStoreError.Code {
  /// The path names something other than a regular file: a device, a FIFO, a socket, a folder.
  public static let notARegularFile = SQLiteJobStoreError.Code(rawValue: "notARegularFile")
  /// The path cannot name a database file: it is empty, holds a NUL character, or ends with `/`.
  public static let invalidPath = SQLiteJobStoreError.Code(rawValue: "invalidPath")
}

/// Checks and splits database paths, before SQLite opens them, with plain byte operations that
/// cannot trap whatever the path holds.
///
/// Foundation's path calls are not used on a path a user gave: in swift-corelibs-foundation
/// `NSString.deletingLastPathComponent` traps on a one-character relative path (`"q"`, `"-"`),
/// which killed `conveyor -d x status` and any application opening `SQLiteJobStore(path: "q")`.
///
/// SQLite opens whatever the path names. A block device reads as size 0, so it looked like a new,
/// empty database and got a schema written onto it; a FIFO blocks or fails with an I/O error
/// after SQLite created a `-journal` file beside it. The `-wal`, `-shm` and `-journal` files
/// SQLite would open beside the database are checked the same way. SQLite also reads some names
/// as something else than a file: `:memory:` is a database in memory (every job lost when the
/// store closes) and, where SQLite is built with `SQLITE_USE_URI` (Debian's is), `file:…` is a
/// URI whose `?mode=memory` does the same. ``sqliteFilename(_:)`` gives SQLite a name it reads as
/// the file the path names.
enum PathCheck {
  /// Throws ``SQLiteJobStoreError`` with code ``SQLiteJobStoreError/Code/invalidPath`` for a path
  /// that cannot name a database file, and with code ``SQLiteJobStoreError/Code/notARegularFile``
  /// unless `path` and its companion files are regular files or missing.
  static func refuseSpecialFiles(_ path: String) throws {
    try refuseUnusable(path)
    for candidate in [path, path + "-wal", path + "-shm", path + "-journal"] {
      var info = stat()
      guard stat(candidate, &info) == 0 else { continue }  // missing (or unreadable: SQLite says)
      let type = info.st_mode & S_IFMT
      guard type != S_IFREG else { continue }
      let what =
        switch type {
        case S_IFDIR: "a folder"
        case S_IFBLK: "a block device"
        case S_IFCHR: "a character device"
        case S_IFIFO: "a FIFO (named pipe)"
        case S_IFSOCK: "a socket"
        default: "a special file"
        }
      let subject = candidate == path ? "this" : "\(candidate)"
      throw SQLiteJobStoreError(
        code: .notARegularFile, path: path,
        message:
          "\(subject) is not a regular file but \(what), and was left untouched; "
          + "pass the path of a database file (or of one to create)")
    }
  }

  /// Throws ``SQLiteJobStoreError/Code/invalidPath`` for an empty path (SQLite would open a
  /// temporary database), a path holding NUL (the C call would see only the part before it), or
  /// a path ending with `/` (a folder's).
  static func refuseUnusable(_ path: String) throws {
    let problem: String? =
      if path.isEmpty {
        "the database path is empty"
      } else if path.utf8.contains(0) {
        "the database path holds a NUL character"
      } else if path.utf8.last == slash {
        "the database path ends with '/', so it names a folder"
      } else {
        nil
      }
    guard let problem else { return }
    throw SQLiteJobStoreError(
      code: .invalidPath, path: path,
      message: "\(problem); pass the path of a database file (or of one to create), e.g. jobs.sqlite")
  }

  /// The folder part of `path`: everything before its last `/` (`"/"` for a name at the root),
  /// or `""` for a name in the current folder. Plain bytes: never traps.
  static func folder(of path: String) -> String {
    guard let last = path.utf8.lastIndex(of: slash) else { return "" }
    var end = last
    // "a//b" is in "a"; "//b" is in "/".
    while end > path.utf8.startIndex, path.utf8[path.utf8.index(before: end)] == slash {
      end = path.utf8.index(before: end)
    }
    if end == path.utf8.startIndex { return "/" }
    return String(decoding: path.utf8[..<end], as: UTF8.self)
  }

  /// `name` inside `folder` (the current folder for `""`), with one `/` between them.
  static func joined(_ folder: String, _ name: String) -> String {
    if folder.isEmpty { return name }
    return folder.utf8.last == slash ? folder + name : folder + "/" + name
  }

  /// The name SQLite must be given to open the file `path` names: a relative path gets `./` in
  /// front, so that SQLite reads neither `:memory:` nor a `file:` URI into it.
  static func sqliteFilename(_ path: String) -> String {
    path.utf8.first == slash ? path : "./" + path
  }

  private static let slash = UInt8(ascii: "/")
}
