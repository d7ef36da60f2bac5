import CSQLite

/// An error reported by SQLite: its result code, its message and the SQL that failed.
///
/// The SQL is the statement text only; bound values (job payloads, keys) are never included,
/// so the error can be logged safely.
///
/// ```swift
/// do { _ = try await store.counts(queue: "jobs", now: .now) }
/// catch let error as SQLiteError where error.code == .busy { /* another process holds the lock */ }
/// ```
public struct SQLiteError: Error, Sendable, Hashable, CustomStringConvertible {
  /// An SQLite result code (primary or extended), as a value that can grow without breaking the API.
  public struct Code: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    /// The C result code (for example `SQLITE_BUSY` is 5).
    public var rawValue: Int32

    /// Wraps a C result code.
    public init(rawValue: Int32) { self.rawValue = rawValue }

    /// The primary result code (the low 8 bits of an extended code).
    public var primary: Code { Code(rawValue: rawValue & 0xFF) }

    /// SQLite's English name for the code, such as "database is locked".
    public var description: String { String(cString: sqlite3_errstr(rawValue)) }

    /// Generic error (`SQLITE_ERROR`).
    public static let error = Code(rawValue: SQLITE_ERROR)
    /// An operation was aborted by `sqlite3_interrupt` (`SQLITE_INTERRUPT`).
    public static let interrupt = Code(rawValue: SQLITE_INTERRUPT)
    /// The database file is locked by another connection (`SQLITE_BUSY`).
    public static let busy = Code(rawValue: SQLITE_BUSY)
    /// A table is locked (`SQLITE_LOCKED`).
    public static let locked = Code(rawValue: SQLITE_LOCKED)
    /// Out of memory (`SQLITE_NOMEM`).
    public static let noMemory = Code(rawValue: SQLITE_NOMEM)
    /// Attempt to write a read-only database (`SQLITE_READONLY`).
    public static let readOnly = Code(rawValue: SQLITE_READONLY)
    /// A disk I/O error (`SQLITE_IOERR`).
    public static let ioError = Code(rawValue: SQLITE_IOERR)
    /// The database disk image is malformed (`SQLITE_CORRUPT`).
    public static let corrupt = Code(rawValue: SQLITE_CORRUPT)
    /// The disk is full (`SQLITE_FULL`).
    public static let full = Code(rawValue: SQLITE_FULL)
    /// The database file could not be opened (`SQLITE_CANTOPEN`).
    public static let cannotOpen = Code(rawValue: SQLITE_CANTOPEN)
    /// A constraint was violated (`SQLITE_CONSTRAINT`).
    public static let constraint = Code(rawValue: SQLITE_CONSTRAINT)
    /// Access permission denied (`SQLITE_PERM`).
    public static let permission = Code(rawValue: SQLITE_PERM)
    /// The file is not a database (`SQLITE_NOTADB`).
    public static let notADatabase = Code(rawValue: SQLITE_NOTADB)

    /// Matches an error code against a code, comparing primary codes when the pattern is primary.
    ///
    /// `case .busy:` matches `SQLITE_BUSY` and every extended busy code such as `SQLITE_BUSY_SNAPSHOT`.
    public static func ~= (pattern: Code, value: Code) -> Bool {
      pattern.rawValue == pattern.primary.rawValue
        ? pattern.rawValue == value.primary.rawValue : pattern.rawValue == value.rawValue
    }
  }

  /// The result code (extended when SQLite reported one).
  public var code: Code
  /// SQLite's message for the failure.
  public var message: String
  /// The SQL statement that failed, without bound values; nil when the failure was not a statement.
  public var sql: String?

  /// Creates an error.
  public init(code: Code, message: String, sql: String? = nil) {
    self.code = code
    self.message = message
    self.sql = sql
  }

  /// What went wrong and, for the common codes, what to do about it.
  public var description: String {
    var text = "SQLite error \(code.rawValue) (\(code)): \(message)"
    if let sql { text += " — while executing `\(sql)`" }
    if let advice { text += ". \(advice)" }
    return text
  }

  /// A hint for the codes a person can act on.
  var advice: String? {
    switch code {
    case .busy, .locked:
      return "Another connection held the database lock for longer than the busy timeout; "
        + "raise SQLiteJobStore.Options.busyTimeout or find the process holding the lock"
    case .corrupt, .notADatabase:
      return "The database file is damaged or is not a database; restore it from a backup "
        + "or move it aside so a new one is created"
    case .full:
      return "The disk is full; free space and retry"
    case .readOnly, .permission, .cannotOpen:
      return "Check that the file and its folder exist and are readable and writable by this user"
    case .ioError:
      return "The operating system reported an I/O error; check the disk and the file system"
    default:
      return nil
    }
  }
}
