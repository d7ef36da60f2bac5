import CSQLite
import Conveyor
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import ConveyorSQLite

/// Reading a database file's schema version without writing to it: what
/// `conveyor migrate status` shows for SQLite.
@Suite("SQLite schema status")
struct SchemaStatusTests {
  /// The names and bytes of every file in `folder`.
  func contents(of folder: TemporaryFolder) throws -> [String: Data] {
    let names = try FileManager.default.contentsOfDirectory(atPath: folder.url.path)
    return try Dictionary(
      uniqueKeysWithValues: names.map { ($0, try Data(contentsOf: folder.url.appendingPathComponent($0))) })
  }

  @Test func aMissingFileIsVersionZeroAndStaysMissing() throws {
    let folder = try TemporaryFolder()
    let path = folder.path("none.sqlite")
    let status = try SQLiteJobStore.schemaStatus(path: path)
    #expect(!status.exists && status.databaseVersion == 0)
    #expect(status.pending == Array(1...Int(SQLiteJobStore.schemaVersion)))
    #expect(try contents(of: folder).isEmpty, "nothing was created")
  }

  @Test func anEmptyFileIsVersionZeroAndIsLeftAsItWas() throws {
    let folder = try TemporaryFolder()
    let path = folder.path("empty.sqlite")
    #expect(FileManager.default.createFile(atPath: path, contents: Data()))
    let status = try SQLiteJobStore.schemaStatus(path: path)
    #expect(status.exists && status.databaseVersion == 0 && !status.pending.isEmpty)
    #expect(try contents(of: folder) == ["empty.sqlite": Data()])
  }

  @Test func anOldFileShowsItsVersionUntouchedAndACurrentOneIsUpToDate() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("v1.sqlite")
    try MigrationTests().execute(path, MigrationTests.version1)
    let before = try contents(of: folder)
    let old = try SQLiteJobStore.schemaStatus(path: path)
    #expect(
      old.exists && old.databaseVersion == 1 && old.pending == Array(2...Int(SQLiteJobStore.schemaVersion)))
    #expect(try contents(of: folder) == before, "the file was read, not written")
    let store = try SQLiteJobStore(path: path)
    await store.close()
    let current = try SQLiteJobStore.schemaStatus(path: path)
    #expect(current.databaseVersion == Int(SQLiteJobStore.schemaVersion) && current.pending.isEmpty)
  }

  /// A store that is open keeps its changes in the WAL file: the status reads through it.
  @Test func theStatusReadsThroughTheWALOfAnOpenStore() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("open.sqlite")
    let store = try SQLiteJobStore(path: path)
    _ = try await store.enqueue([NewJob(payload: Data("{}".utf8))], queue: "q", clock: SystemJobClock())
    let status = try SQLiteJobStore.schemaStatus(path: path)
    #expect(status.databaseVersion == Int(SQLiteJobStore.schemaVersion))
    #expect(try await store.counts(queue: "q", clock: SystemJobClock()).ready == 1)
    await store.close()
  }

  @Test func filesThatAreNotConveyorDatabasesAreRefusedAndLeftUntouched() throws {
    let folder = try TemporaryFolder()
    let text = folder.path("notes.txt")
    try Data(String(repeating: "not a database\n", count: 100).utf8).write(to: URL(fileURLWithPath: text))
    let foreign = folder.path("other.sqlite")
    try MigrationTests().execute(
      foreign, "CREATE TABLE t (x); PRAGMA application_id = 7; PRAGMA user_version = 9;")
    let before = try contents(of: folder)
    #expect {
      _ = try SQLiteJobStore.schemaStatus(path: text)
    } throws: { ($0 as? SQLiteJobStoreError)?.code == .notADatabase }
    #expect {
      _ = try SQLiteJobStore.schemaStatus(path: foreign)
    } throws: { ($0 as? SQLiteJobStoreError)?.code == .foreignDatabase }
    #expect(throws: SQLiteJobStoreError.self) { _ = try SQLiteJobStore.schemaStatus(path: folder.url.path) }
    #expect(throws: SQLiteJobStoreError.self) { _ = try SQLiteJobStore.schemaStatus(path: "/dev/zero") }
    #expect(try contents(of: folder) == before)
  }

  /// A Conveyor file at a version no build wrote (0 with tables, or below 0) cannot be migrated:
  /// the status refuses it as opening it does, instead of listing migrations that opening would
  /// not apply.
  @Test func aConveyorFileAtAVersionNoBuildWroteIsRefusedAsOpeningRefusesIt() async throws {
    for version in [0, -3] {
      let folder = try TemporaryFolder()
      let path = folder.path("odd.sqlite")
      try MigrationTests().execute(
        path,
        "CREATE TABLE t (x); PRAGMA application_id = \(SQLiteJobStore.applicationID); PRAGMA user_version = \(version);"
      )
      #expect {
        _ = try SQLiteJobStore(path: path)
      } throws: { ($0 as? SQLiteJobStoreError)?.code == .unsupportedSchema }
      do {
        let status = try SQLiteJobStore.schemaStatus(path: path)
        let shown = "version \(status.databaseVersion), pending \(status.pending)"
        Issue.record("user_version \(version): the status read \(shown) of a file opening refuses")
      } catch {
        #expect((error as? SQLiteJobStoreError)?.code == .unsupportedSchema, "\(error)")
      }
    }
  }

  /// A damaged Conveyor file is refused with the error opening it gives
  /// (``SQLiteJobStoreError/Code/corrupt``), and left untouched.
  @Test func aDamagedFileIsRefusedAsOpeningRefusesIt() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("damaged.sqlite")
    let store = try SQLiteJobStore(path: path)
    await store.close()
    // The first page's b-tree, after the 100-byte file header: garbage.
    let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: path))
    try handle.seek(toOffset: 100)
    try handle.write(contentsOf: Data(repeating: 0xFF, count: 400))
    try handle.close()
    let before = try contents(of: folder)
    #expect {
      _ = try SQLiteJobStore(path: path)
    } throws: { ($0 as? SQLiteJobStoreError)?.code == .corrupt }
    do {
      let status = try SQLiteJobStore.schemaStatus(path: path)
      Issue.record("the status read version \(status.databaseVersion) of a damaged file")
    } catch {
      #expect((error as? SQLiteJobStoreError)?.code == .corrupt, "\(error)")
    }
    #expect(try contents(of: folder) == before)
  }

  @Test func aNewerFileIsReportedNewer() throws {
    let folder = try TemporaryFolder()
    let path = folder.path("newer.sqlite")
    let newer = SQLiteJobStore.schemaVersion + 1
    try MigrationTests().execute(
      path,
      "CREATE TABLE t (x); PRAGMA application_id = \(SQLiteJobStore.applicationID); PRAGMA user_version = \(newer);"
    )
    let status = try SQLiteJobStore.schemaStatus(path: path)
    #expect(status.databaseVersion == Int(newer) && status.isNewerThanBuild && status.pending.isEmpty)
  }
}
