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
  /// The path is longer than SQLite takes (504 bytes once made absolute with symbolic links
  /// resolved), or the file's name leaves no room for the `-journal`, `-wal` and `-shm` names
  /// SQLite makes from it within the file system's limit on a name (255 bytes).
  public static let pathTooLong = SQLiteJobStoreError.Code(rawValue: "pathTooLong")
  /// The path is a symbolic link that cannot be followed to a file to create: a chain of links
  /// too long (or a loop), or one the system would refuse to follow (another user's link in a
  /// sticky, world-writable folder such as `/tmp`).
  public static let unusableLink = SQLiteJobStoreError.Code(rawValue: "unusableLink")
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
  /// that cannot name a database file, with code ``SQLiteJobStoreError/Code/pathTooLong`` for one
  /// too long for SQLite (``refuseTooLong(_:)``), and with code
  /// ``SQLiteJobStoreError/Code/notARegularFile`` unless `path` and its companion files (beside
  /// the file its symbolic links lead to, where SQLite makes them) are regular files or missing.
  static func refuseSpecialFiles(_ path: String) throws {
    try refuseUnusable(path)
    try refuseTooLong(path)
    // SQLite keeps its files beside the file the path leads to, symbolic links followed.
    let beside = followLinks(path).end
    for candidate in [path, beside + "-wal", beside + "-shm", beside + "-journal"] {
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

  // MARK: length

  /// The longest path SQLite's Unix VFS opens, made absolute with every symbolic link resolved:
  /// its buffer holds 512 bytes, and it refuses a database whose path with "-journal" added
  /// would not fit ("unable to open database file", whatever the folder).
  static let longestFullPath = 504
  /// The most bytes SQLite adds to a database's name for the files beside it: "-journal"
  /// ("-wal" and "-shm" are shorter).
  static let longestSuffix = 8

  /// Throws ``SQLiteJobStoreError`` with code ``SQLiteJobStoreError/Code/pathTooLong`` when SQLite
  /// could not open the database `path` leads to, or not make the files it keeps beside it,
  /// because a path or a name is too long: checked before anything is created, so that no file
  /// is left behind (a 253-byte name got its database created, then failed on `-wal`).
  ///
  /// A path whose folder cannot be resolved (missing, not searchable) is left to the opening,
  /// which says so.
  static func refuseTooLong(_ path: String) throws {
    let target = followLinks(path).end
    let name = self.name(of: target)
    let nameLimit = longestName(in: folder(of: target))
    if name.utf8.count + longestSuffix > nameLimit {
      throw SQLiteJobStoreError(
        code: .pathTooLong, path: path,
        message:
          "the file name \(target == path ? "" : "the link leads to ")is \(name.utf8.count) bytes: too long, "
          + "as SQLite names the files it keeps beside the database by adding up to \(longestSuffix) bytes "
          + "(-journal, -wal, -shm) and this file system takes names of at most \(nameLimit) bytes; "
          + "give the database a name of at most \(nameLimit - longestSuffix) bytes")
    }
    switch fullPath(target) {
    case .resolved(let full) where full.utf8.count > longestFullPath:
      throw tooLong(path, bytes: full.utf8.count)
    case .tooLong:
      throw tooLong(path, bytes: nil)
    case .resolved, .unknown:
      return
    }
  }

  private static func tooLong(_ path: String, bytes: Int?) -> SQLiteJobStoreError {
    SQLiteJobStoreError(
      code: .pathTooLong, path: path,
      message:
        "the path is too long for SQLite: \(bytes.map { "\($0) bytes" } ?? "longer than the system takes") "
        + "once made absolute with symbolic links resolved, where SQLite takes at most \(longestFullPath); "
        + "put the database in a folder with a shorter path, or give it a shorter name")
  }

  /// The path SQLite opens for `path`: absolute, with `.`, `..` and every symbolic link of its
  /// folder resolved (SQLite's Unix VFS resolves them too).
  enum FullPath: Equatable {
    case resolved(String)
    /// The system says the path is too long to resolve (`ENAMETOOLONG`).
    case tooLong
    /// The folder cannot be resolved: missing, or not searchable.
    case unknown
  }

  /// The path SQLite would open for `path`, whose final part is not a symbolic link (see
  /// ``followLinks(_:)``).
  static func fullPath(_ path: String) -> FullPath {
    let name = self.name(of: path)
    guard name != ".", name != ".." else { return .unknown }
    let folder = self.folder(of: path)
    guard let resolved = realpath(folder.isEmpty ? "." : folder, nil) else {
      return errno == ENAMETOOLONG ? .tooLong : .unknown
    }
    defer { free(resolved) }
    return .resolved(joined(String(cString: resolved), name))
  }

  /// The longest name the file system holding `folder` takes (255 where it cannot tell).
  static func longestName(in folder: String) -> Int {
    let limit = pathconf(folder.isEmpty ? "." : folder, Int32(_PC_NAME_MAX))
    return limit > 0 ? Int(limit) : 255
  }

  /// The last part of `path`: everything after its last `/`. Plain bytes: never traps.
  static func name(of path: String) -> String {
    guard let last = path.utf8.lastIndex(of: slash) else { return path }
    return String(decoding: path.utf8[path.utf8.index(after: last)...], as: UTF8.self)
  }

  // MARK: symbolic links

  /// Where following the symbolic links at the end of a path leads.
  struct LinkChain {
    /// The path the last link names, or the path itself when it is no link: what SQLite opens.
    var end: String
    /// The links followed, in order (empty when the path is no link).
    var links: [String] = []
    /// Why the chain cannot be followed to a file to create, if it cannot.
    var refusal: String?
  }

  /// The most links followed, as the system follows at most 40 (`ELOOP`).
  static let mostLinks = 40

  /// Follows the symbolic links at the end of `path` (a link to a link, …) to the path the last
  /// one names, which may not exist yet. A relative link is read from its own folder. A link that
  /// cannot be read ends the chain where it is (the opening then says why).
  ///
  /// The chain also says when it cannot be followed to a file to create: when it is longer than
  /// the system follows, or when one of its links is one the system refuses to follow (Linux's
  /// `fs.protected_symlinks`: a link in a sticky, world-writable folder such as `/tmp`, owned
  /// neither by this user nor by the folder's owner). SQLite's own opening would fail on those.
  static func followLinks(_ path: String) -> LinkChain {
    var chain = LinkChain(end: path)
    while true {
      var info = stat()
      guard lstat(chain.end, &info) == 0, info.st_mode & S_IFMT == S_IFLNK else { return chain }
      guard chain.links.count < mostLinks else {
        chain.refusal = "more than \(mostLinks) symbolic links lead on from it (or they loop)"
        return chain
      }
      if chain.refusal == nil, !mayFollow(chain.end, info) {
        chain.refusal =
          "the symbolic link \(chain.end) is another user's, in a folder anyone may write to "
          + "(sticky, as /tmp is): the system refuses to follow it"
      }
      var buffer = [UInt8](repeating: 0, count: Int(PATH_MAX) + 1)
      let count = buffer.withUnsafeMutableBufferPointer { bytes in
        bytes.withMemoryRebound(to: CChar.self) { readlink(chain.end, $0.baseAddress!, $0.count - 1) }
      }
      guard count > 0, let target = String(validating: buffer[..<count], as: UTF8.self) else { return chain }
      chain.links.append(chain.end)
      chain.end = target.utf8.first == slash ? target : joined(folder(of: chain.end), target)
    }
  }

  /// Whether the system follows the link `link` (whose `lstat` is `info`) for this process.
  private static func mayFollow(_ link: String, _ info: stat) -> Bool {
    #if os(Linux)
      var folderInfo = stat()
      let folder = self.folder(of: link)
      guard stat(folder.isEmpty ? "." : folder, &folderInfo) == 0 else { return true }
      let openToAll = folderInfo.st_mode & S_ISVTX != 0 && folderInfo.st_mode & S_IWOTH != 0
      return !openToAll || info.st_uid == geteuid() || info.st_uid == folderInfo.st_uid
    #else
      return true
    #endif
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
