import Conveyor
import Foundation

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// Where a database file's Conveyor schema stands against this build: what
/// `conveyor migrate status` shows.
public struct SQLiteSchemaStatus: Sendable, Hashable {
  /// The database file's path, as given.
  public var path: String
  /// Whether the file exists (a store opened at the path creates it).
  public var exists: Bool
  /// The version the file is at; 0 when it is missing or empty (no schema yet).
  public var databaseVersion: Int
  /// The version this build writes and reads (``SQLiteJobStore/schemaVersion``).
  public var buildVersion: Int

  /// The versions opening a store would apply, in order; empty when the file is up to date, or
  /// newer than this build.
  public var pending: [Int] {
    databaseVersion < buildVersion ? Array((databaseVersion + 1)...buildVersion) : []
  }

  /// Whether the file is at a version newer than this build knows: this build refuses to open it
  /// and leaves it untouched.
  public var isNewerThanBuild: Bool { databaseVersion > buildVersion }
}

extension SQLiteJobStore {
  /// Reads the schema version of the database file at `path` without writing anything: no file,
  /// journal or lock is created, and a missing file stays missing. Opening a store at the path
  /// migrates it (``init(path:options:)``).
  ///
  /// - Throws: ``SQLiteJobStoreError`` for a path that is not a regular file, or a file that is
  ///   not a Conveyor database (another application's, damaged), as opening it would; the file is
  ///   left untouched.
  public static func schemaStatus(path: String) throws -> SQLiteSchemaStatus {
    try PathCheck.refuseSpecialFiles(path)
    var info = stat()
    guard stat(path, &info) == 0, info.st_size > 0 else {
      return SQLiteSchemaStatus(
        path: path, exists: stat(path, &info) == 0, databaseVersion: 0, buildVersion: Int(schemaVersion))
    }
    // With a WAL file beside it, the schema may be in the WAL: read through it (read-only).
    // Without, read the file as immutable: no lock, no journal, no shared-memory file.
    var wal = stat()
    let hasWAL = stat(path + "-wal", &wal) == 0 && wal.st_size > 0
    let db =
      hasWAL
      ? try Connection(readingOnly: PathCheck.sqliteFilename(path))
      : try Connection(inspecting: PathCheck.sqliteFilename(path))
    defer { db.close() }
    var header: (applicationID: Int64, version: Int64, objects: Int64) = (0, 0, 0)
    do {
      try db.query(SQL.inspect) { header = ($0.int64(0), $0.int64(1), $0.int64(2)) }
    } catch let error as SQLiteError where error.code == .notADatabase {
      throw SQLiteJobStoreError(
        code: .notADatabase, path: path,
        message: "this file is not an SQLite database; pass the path of a Conveyor database")
    }
    if header == (0, 0, 0) {
      return SQLiteSchemaStatus(
        path: path, exists: true, databaseVersion: 0, buildVersion: Int(schemaVersion))
    }
    guard header.applicationID == Int64(applicationID) else {
      throw SQLiteJobStoreError(
        code: .foreignDatabase, path: path,
        message: "this is another application's SQLite database (application_id \(header.applicationID), "
          + "\(header.objects) schema objects), not a Conveyor database")
    }
    return SQLiteSchemaStatus(
      path: path, exists: true, databaseVersion: Int(clamping: header.version),
      buildVersion: Int(schemaVersion))
  }
}
