/// An error opening, locating or using a closed ``SQLiteJobStore`` database, saying what to do.
///
/// When opening fails with this error the file is left exactly as it was: Conveyor never
/// rewrites, migrates down or wipes a file it does not recognise.
public struct SQLiteJobStoreError: Error, Sendable, Hashable, CustomStringConvertible {
  /// What kind of failure; new codes may be added without breaking the API.
  public struct Code: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    /// The code's name.
    public var rawValue: String

    /// Wraps a code name.
    public init(rawValue: String) { self.rawValue = rawValue }

    /// The code's name.
    public var description: String { rawValue }

    /// The file is an SQLite database belonging to another application.
    public static let foreignDatabase = Code(rawValue: "foreignDatabase")
    /// The file was written by a newer version of Conveyor with a schema this version does not know.
    public static let newerSchema = Code(rawValue: "newerSchema")
    /// The file is a Conveyor database with a schema version this version cannot open.
    public static let unsupportedSchema = Code(rawValue: "unsupportedSchema")
    /// The file is not an SQLite database at all.
    public static let notADatabase = Code(rawValue: "notADatabase")
    /// The file is an SQLite database that is damaged.
    public static let corrupt = Code(rawValue: "corrupt")
    /// A database name is empty, too long or has characters outside `[A-Za-z0-9._-]`.
    public static let invalidName = Code(rawValue: "invalidName")
    /// The database folder or file could not be created.
    public static let cannotCreate = Code(rawValue: "cannotCreate")
    /// The store was closed with ``SQLiteJobStore/close()``.
    public static let closed = Code(rawValue: "closed")
  }

  /// What kind of failure.
  public var code: Code
  /// The database file (or name) concerned.
  public var path: String
  /// What went wrong and what to do.
  public var message: String

  /// Creates an error.
  public init(code: Code, path: String, message: String) {
    self.code = code
    self.path = path
    self.message = message
  }

  /// The message, naming the file.
  public var description: String { "\(path): \(message)" }
}
