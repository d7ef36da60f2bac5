import Foundation

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// Paths a user gave (`--cwd`, a program, `TMPDIR`), handled with plain string and system calls.
///
/// Foundation's path calls are not used on them: in swift-corelibs-foundation some trap on odd
/// input (`NSString.deletingLastPathComponent` on a one-character relative path).
enum Paths {
  /// `name` inside `folder` (the current folder for `""`), with one `/` between them.
  static func joined(_ folder: String, _ name: String) -> String {
    if folder.isEmpty { return name }
    return folder.hasSuffix("/") ? folder + name : folder + "/" + name
  }

  /// The current folder, or nil when it cannot be read (removed, or no permission).
  static func currentFolder() -> String? {
    guard let raw = getcwd(nil, 0) else { return nil }
    defer { free(raw) }
    return String(cString: raw)
  }

  /// `path` made absolute from `current`, with `.`, `..` and repeated `/` resolved by its text
  /// alone (as `URL.standardized` does): `sub/../x` from `/home/a` is `/home/a/x`.
  static func absolute(_ path: String, from current: String) -> String {
    let full = path.hasPrefix("/") ? path : joined(current, path)
    var parts: [Substring] = []
    for part in full.split(separator: "/", omittingEmptySubsequences: true) {
      switch part {
      case ".": continue
      case "..": _ = parts.popLast()
      default: parts.append(part)
      }
    }
    return "/" + parts.joined(separator: "/")
  }

  /// What is at `path`, following symbolic links.
  enum Kind: Equatable {
    case folder
    case file
    /// Something else: a device, a FIFO, a socket.
    case other
    /// Nothing: `errno` said why (`ENOENT`, `EACCES`, `ENOTDIR`, …).
    case missing(errno: Int32)
  }

  static func kind(_ path: String) -> Kind {
    guard !path.utf8.contains(0) else { return .missing(errno: EINVAL) }
    var info = stat()
    guard stat(path, &info) == 0 else { return .missing(errno: errno) }
    switch info.st_mode & S_IFMT {
    case S_IFDIR: return .folder
    case S_IFREG: return .file
    default: return .other
    }
  }

  /// Whether `path` is a regular file this process may execute.
  static func isExecutableFile(_ path: String) -> Bool {
    kind(path) == .file && access(path, X_OK) == 0
  }

  /// The folder for temporary files: `TMPDIR` when it is an absolute path to a folder, else `/tmp`.
  static func temporaryFolder() -> String {
    if let folder = ProcessInfo.processInfo.environment["TMPDIR"], folder.hasPrefix("/"),
      kind(folder) == .folder
    {
      return folder
    }
    return "/tmp"
  }
}
