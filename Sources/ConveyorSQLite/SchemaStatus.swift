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
  /// folder, journal, WAL or shared-memory file is created, and no lock is left behind. A missing
  /// file stays missing. An open store's WAL is read through. Opening a store at the path
  /// migrates it (``init(path:options:)``).
  ///
  /// - Throws: ``SQLiteJobStoreError`` as opening the file would, leaving it untouched: for a path
  ///   that is not a regular file, a missing file that no store could create (its folder is
  ///   missing, its symbolic links loop), a file that is not an SQLite database, is damaged, is
  ///   another application's, or is a Conveyor file at a version no build wrote.
  public static func schemaStatus(path: String) throws -> SQLiteSchemaStatus {
    try PathCheck.refuseSpecialFiles(path)
    var info = stat()
    guard stat(path, &info) == 0 else {
      let target = try creatableTarget(missing: path, statError: errno)
      let folder = PathCheck.folder(of: target)
      guard stat(folder, &info) == 0, info.st_mode & S_IFMT == S_IFDIR else {
        throw SQLiteJobStoreError(
          code: .cannotCreate, path: path,
          message: "no database can be created here: the folder \(folder) does not exist (or is not a "
            + "folder); create it, or pass another path")
      }
      return SQLiteSchemaStatus(
        path: path, exists: false, databaseVersion: 0, buildVersion: Int(schemaVersion))
    }
    let file = PathCheck.sqliteFilename(path)
    // With a WAL file and its shared-memory file beside it (a store has the file open, or
    // crashed), the schema may be in the WAL: read through it, read-only. Otherwise read the file
    // as immutable: no lock, no journal, no shared-memory file. (SQLite would create a missing
    // shared-memory file even for a read-only connection: a copy made with its WAL but not that
    // file is read without its WAL, so a migration left in that WAL is not seen: the version
    // shown is then at most one version behind what opening finds, never ahead.)
    let beside = PathCheck.followLinks(path).end
    var companion = stat()
    let readsWAL =
      stat(beside + "-wal", &companion) == 0 && companion.st_size > 0
      && stat(beside + "-shm", &companion) == 0
    // A file another connection is writing in rollback-journal mode is looked at again, as
    // opening does, until it is still (5 s at most).
    if !readsWAL {
      do {
        try refuseForeignFile(path, within: .seconds(5))
      } catch let error as SQLiteJobStoreError where error.code == .newerSchema {
        // Reported below, not refused.
      }
    }
    let db = readsWAL ? try Connection(readingOnly: file) : try Connection(inspecting: file)
    defer { db.close() }
    // Another process may hold the lock a moment (a store checkpointing as it closes): wait for
    // it as a store's calls do.
    if readsWAL { db.setLockWait(milliseconds: Int32(JobStoreTime.milliseconds(Options().busyTimeout))) }
    // The checks opening makes, and their errors; a newer version is reported, not refused.
    do {
      _ = try inspect(db, path: path)
    } catch let error as SQLiteJobStoreError where error.code == .newerSchema {
    }
    var version: Int64 = 0
    try db.query("SELECT user_version FROM pragma_user_version") { version = $0.int64(0) }
    return SQLiteSchemaStatus(
      path: path, exists: true, databaseVersion: Int(clamping: version), buildVersion: Int(schemaVersion))
  }
}
