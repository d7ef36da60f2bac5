import Foundation

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

extension SQLiteJobStoreError.Code {
  /// The path names something other than a regular file: a device, a FIFO, a socket, a folder.
  public static let notARegularFile = SQLiteJobStoreError.Code(rawValue: "notARegularFile")
}

/// Refuses a database path that names anything but a regular file (following symbolic links)
/// or nothing at all, before SQLite opens it.
///
/// SQLite opens whatever the path names. A block device reads as size 0, so it looked like a new,
/// empty database and got a schema written onto it; a FIFO blocks or fails with an I/O error
/// after SQLite created a `-journal` file beside it. The `-wal`, `-shm` and `-journal` files
/// SQLite would open beside the database are checked the same way.
enum PathCheck {
  /// Throws ``SQLiteJobStoreError`` with code ``SQLiteJobStoreError/Code/notARegularFile``
  /// unless `path` and its companion files are regular files or missing.
  static func refuseSpecialFiles(_ path: String) throws {
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
}
