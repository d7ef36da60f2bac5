import CSQLite
import Conveyor
import ConveyorTestSupport
import Foundation
import Testing

@testable import ConveyorSQLite

@Suite("SQLiteJobStore opening")
struct OpeningTests {
  /// Opening `path` fails with `code` and leaves the file byte-for-byte as it was.
  func expectRefused(_ path: String, _ code: SQLiteJobStoreError.Code) throws {
    let before = try fileBytes(path)
    let error = #expect(throws: SQLiteJobStoreError.self) { try SQLiteJobStore(path: path) }
    #expect(error?.code == code)
    #expect(error?.description.contains(path) == true)
    #expect(error?.message.contains("untouched") == true)
    #expect(try fileBytes(path) == before)
    #expect(!FileManager.default.fileExists(atPath: path + "-wal"))
  }

  /// Creates a plain SQLite file with `sql`, using the C API directly.
  func makeSQLiteFile(_ path: String, _ sql: String) throws {
    var db: OpaquePointer?
    guard sqlite3_open(path, &db) == SQLITE_OK else { throw TestFailure("open failed") }
    defer { sqlite3_close(db) }
    guard sqlite3_exec(db, sql, nil, nil, nil) == SQLITE_OK else {
      throw TestFailure(String(cString: sqlite3_errmsg(db)))
    }
  }

  @Test func newFileGetsSchemaAndPrivatePermissions() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("new.sqlite")
    let store = try SQLiteJobStore(
      path: path, options: .init(synchronous: .full, busyTimeout: .milliseconds(250)))
    _ = try await store.enqueue([NewJob(payload: payload("a"), runAt: epoch)], queue: "jobs", now: epoch)
    #expect(try posixPermissions(path) & 0o777 == 0o600)
    #expect(try posixPermissions(path + "-wal") & 0o077 == 0)
    // Reopening an existing Conveyor file keeps its jobs.
    let again = try await SQLiteJobStore.open(path: path)
    #expect(try await again.counts(queue: "jobs", now: epoch).ready == 1)
  }

  @Test func emptyExistingFileGetsSchema() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("empty.sqlite")
    #expect(FileManager.default.createFile(atPath: path, contents: Data()))
    let store = try SQLiteJobStore(path: path)
    #expect(try await store.counts(queue: "jobs", now: epoch).total == 0)
  }

  @Test func notADatabaseIsRefusedAndUntouched() throws {
    let folder = try TemporaryFolder()
    let path = folder.path("notes.txt")
    try Data(String(repeating: "These are my notes, not a database.\n", count: 200).utf8)
      .write(to: URL(fileURLWithPath: path))
    try expectRefused(path, .notADatabase)
  }

  @Test func foreignDatabaseIsRefusedAndUntouched() throws {
    let folder = try TemporaryFolder()
    let path = folder.path("other.sqlite")
    try makeSQLiteFile(path, "CREATE TABLE contacts(name TEXT); INSERT INTO contacts VALUES ('Ada');")
    try expectRefused(path, .foreignDatabase)
    let withApplicationID = folder.path("other-app.sqlite")
    try makeSQLiteFile(withApplicationID, "PRAGMA application_id = 42;")
    try expectRefused(withApplicationID, .foreignDatabase)
  }

  /// Another application crashed with its changes only in its WAL file: opening it must neither
  /// checkpoint that WAL into the database nor delete it.
  @Test(arguments: ["only in the WAL", "partly checkpointed"])
  func foreignDatabaseWithAPendingWALIsRefusedAndUntouched(_ shape: String) throws {
    let folder = try TemporaryFolder()
    let original = folder.path("app.sqlite")
    let copy = folder.path("crashed.sqlite")
    var db: OpaquePointer?
    guard sqlite3_open(original, &db) == SQLITE_OK else { throw TestFailure("open failed") }
    defer { sqlite3_close(db) }
    let setup =
      shape == "only in the WAL"
      ? "PRAGMA journal_mode=WAL; PRAGMA wal_autocheckpoint=0; CREATE TABLE notes(x); INSERT INTO notes VALUES(1);"
      : "CREATE TABLE notes(x); PRAGMA journal_mode=WAL; PRAGMA wal_autocheckpoint=0; INSERT INTO notes VALUES(2);"
    guard sqlite3_exec(db, setup, nil, nil, nil) == SQLITE_OK else {
      throw TestFailure(String(cString: sqlite3_errmsg(db)))
    }
    // The state a crash leaves: the database file and its WAL, copied while the app has it open.
    try FileManager.default.copyItem(atPath: original, toPath: copy)
    try FileManager.default.copyItem(atPath: original + "-wal", toPath: copy + "-wal")
    let before = (try fileBytes(copy), try fileBytes(copy + "-wal"))
    #expect(!before.1.isEmpty, "the WAL holds the app's changes")
    let error = #expect(throws: SQLiteJobStoreError.self) { try SQLiteJobStore(path: copy) }
    #expect(error?.code == .foreignDatabase)
    #expect(try fileBytes(copy) == before.0, "the database file is unchanged")
    #expect(try fileBytes(copy + "-wal") == before.1, "the WAL file is unchanged and still there")
  }

  @Test func newerSchemaIsRefusedAndUntouched() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("future.sqlite")
    try await SQLiteJobStore.open(path: path).close()
    try makeSQLiteFile(path, "PRAGMA user_version = \(SQLiteJobStore.schemaVersion + 1);")
    try expectRefused(path, .newerSchema)
  }

  @Test func corruptDatabaseIsRefusedAndUntouched() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("corrupt.sqlite")
    let store = try await SQLiteJobStore.open(path: path)
    _ = try await store.enqueue([NewJob(payload: payload("a"), runAt: epoch)], queue: "jobs", now: epoch)
    await store.close()
    #expect(!FileManager.default.fileExists(atPath: path + "-wal"), "closing checkpoints the log")
    // Overwrite the schema table's page header on page 1 (after the 100-byte file header).
    var bytes = try fileBytes(path)
    for offset in 100..<140 { bytes[offset] = 0xEE }
    try bytes.write(to: URL(fileURLWithPath: path))
    try expectRefused(path, .corrupt)
  }

  @Test func errorsNameTheSQLButNotTheValues() async throws {
    let folder = try TemporaryFolder()
    let store = try makeStore(folder)
    let secret = "secret-payload-\(UUID())"
    _ = try await store.enqueue([NewJob(payload: payload(secret), runAt: epoch)], queue: "jobs", now: epoch)
    // A second connection holds the write lock, so this store's write times out.
    var db: OpaquePointer?
    #expect(sqlite3_open(folder.path("jobs.sqlite"), &db) == SQLITE_OK)
    defer { sqlite3_close(db) }
    #expect(sqlite3_exec(db, "BEGIN IMMEDIATE", nil, nil, nil) == SQLITE_OK)
    let quick = try SQLiteJobStore(
      path: folder.path("jobs.sqlite"), options: .init(busyTimeout: .milliseconds(50)))
    let error = await #expect(throws: SQLiteError.self) {
      try await quick.enqueue([NewJob(payload: payload(secret), runAt: epoch)], queue: "jobs", now: epoch)
    }
    #expect(error?.code == .busy)
    #expect(error.map { SQLiteError.Code.busy ~= $0.code } == true)
    #expect(error?.sql == "BEGIN IMMEDIATE")
    #expect(error?.description.contains("busy timeout") == true)
    #expect(error?.description.contains(secret) == false)
    sqlite3_exec(db, "ROLLBACK", nil, nil, nil)
  }

  @Test func aMissingFolderIsAClearErrorNamingThePath() throws {
    let folder = try TemporaryFolder()
    let path = folder.path("missing/jobs.sqlite")
    let error = #expect(throws: SQLiteJobStoreError.self) { try SQLiteJobStore(path: path) }
    #expect(error?.code == .cannotCreate)
    #expect(error?.description.hasPrefix("\(path): cannot create the database file (") == true)
    #expect(error?.message.contains("check that its folder exists") == true)
    #expect(try FileManager.default.contentsOfDirectory(atPath: folder.path(".")).isEmpty)
  }

  /// A deleted database's WAL file left beside its path (`rm jobs.sqlite` after a crash) must not
  /// be replayed into the new database: its jobs would come back, or the file would be damaged.
  @Test func aLeftoverWALOfADeletedDatabaseIsNotReplayedIntoANewOne() async throws {
    let folder = try TemporaryFolder()
    let old = folder.path("old.sqlite")
    let store = try await SQLiteJobStore.open(path: old)
    _ = try await store.enqueue(
      (0..<5).map { NewJob(payload: payload("\($0)"), runAt: epoch) }, queue: "jobs", now: epoch)
    let path = folder.path("jobs.sqlite")
    try FileManager.default.copyItem(atPath: old + "-wal", toPath: path + "-wal")
    let fresh = try await SQLiteJobStore.open(path: path)
    #expect(try await fresh.counts(queue: "jobs", now: epoch).total == 0, "none of the old jobs")
    _ = try await fresh.enqueue([NewJob(payload: payload("new"), runAt: epoch)], queue: "jobs", now: epoch)
    #expect(try await fresh.counts(queue: "jobs", now: epoch).ready == 1)
  }

  /// The same for another application's hot rollback journal left beside a new path: rolling it
  /// back into a new Conveyor database would write that application's pages into it.
  @Test func aLeftoverJournalIsNotRolledBackIntoANewDatabase() async throws {
    let folder = try TemporaryFolder()
    let other = folder.path("other.sqlite")
    var db: OpaquePointer?
    guard sqlite3_open(other, &db) == SQLITE_OK else { throw TestFailure("open failed") }
    defer { sqlite3_close(db) }
    // A transaction bigger than a two-page cache spills to the file: the journal is hot.
    let setup = """
      PRAGMA cache_size = 2; CREATE TABLE notes(x); BEGIN;
      WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000)
      INSERT INTO notes SELECT randomblob(200) FROM n;
      """
    guard sqlite3_exec(db, setup, nil, nil, nil) == SQLITE_OK else {
      throw TestFailure(String(cString: sqlite3_errmsg(db)))
    }
    let path = folder.path("jobs.sqlite")
    try FileManager.default.copyItem(atPath: other + "-journal", toPath: path + "-journal")
    let fresh = try await SQLiteJobStore.open(path: path)
    _ = try await fresh.enqueue([NewJob(payload: payload("new"), runAt: epoch)], queue: "jobs", now: epoch)
    #expect(try await fresh.counts(queue: "jobs", now: epoch).ready == 1)
  }

  /// Another process installing the schema into a pre-made empty file, in a transaction big
  /// enough to spill pages into the file before it commits: the lock-free first look sees a
  /// half-written file. That reading must not decide ("damaged", "another application's"); the
  /// open waits for the writer and finds a Conveyor database. (CI once failed on this race with
  /// "database disk image is malformed".)
  @Test func aFileHalfWrittenByAnotherOpenIsNotRefused() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("racing.sqlite")
    #expect(FileManager.default.createFile(atPath: path, contents: Data()))
    var db: OpaquePointer?
    guard sqlite3_open(path, &db) == SQLITE_OK else { throw TestFailure("open failed") }
    defer { sqlite3_close(db) }
    // The schema, and a filler table that is dropped again, in one transaction bigger than a
    // two-page cache: pages spill into the file while the transaction is open.
    let begin = """
      PRAGMA cache_size = 2; BEGIN IMMEDIATE; \(SQL.schema)
      CREATE TABLE filler(x);
      WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000)
      INSERT INTO filler SELECT randomblob(200) FROM n;
      DROP TABLE filler;
      """
    guard sqlite3_exec(db, begin, nil, nil, nil) == SQLITE_OK else {
      throw TestFailure(String(cString: sqlite3_errmsg(db)))
    }
    var size = stat()
    #expect(stat(path, &size) == 0 && size.st_size > 0, "the open transaction spilled into the file")
    let opening = Task {
      try await SQLiteJobStore.open(path: path, options: .init(busyTimeout: .seconds(20)))
    }
    try await Task.sleep(for: .milliseconds(300))
    guard sqlite3_exec(db, "COMMIT", nil, nil, nil) == SQLITE_OK else {
      throw TestFailure(String(cString: sqlite3_errmsg(db)))
    }
    let store = try await opening.value
    _ = try await store.enqueue([NewJob(payload: payload("a"), runAt: epoch)], queue: "jobs", now: epoch)
    #expect(try await store.counts(queue: "jobs", now: epoch).ready == 1)
  }

  /// `open(path:options:)` promises not to block the caller's thread. Waiting for another
  /// connection's lock, it must not hold a thread of the cooperative pool either: on Linux,
  /// `DispatchQueue.global()` (where it waited before) runs on the very threads of the pool, so
  /// opens waiting there kept every task of the process from running. Here more opens wait than
  /// the pool has threads, and the lock is released by the test's task once it wakes from a
  /// sleep: before the fix it woke only when the opens gave up, so they failed as busy. The opens
  /// wait up to 20 s: with the whole suite running beside it, the test's task once woke from its
  /// 0.3 s sleep more than 3 s late, though no open held its thread.
  @Test func opensWaitingForALockDoNotHoldThePoolsThreads() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("locked.sqlite")
    try await SQLiteJobStore.open(path: path).close()
    let locked = DispatchSemaphore(value: 0)
    let release = DispatchSemaphore(value: 0)
    let holder = Thread {
      var db: OpaquePointer?
      guard sqlite3_open(path, &db) == SQLITE_OK else { return }
      defer { sqlite3_close(db) }
      // A WAL database lets readers in beside a writer: only exclusive locking mode keeps
      // another connection from reading its schema.
      sqlite3_exec(db, "PRAGMA locking_mode = EXCLUSIVE; BEGIN EXCLUSIVE; DELETE FROM jobs", nil, nil, nil)
      locked.signal()
      release.wait()
      sqlite3_exec(db, "COMMIT", nil, nil, nil)
    }
    holder.start()
    await withCheckedContinuation { continuation in
      Thread {
        locked.wait()
        continuation.resume()
      }.start()
    }
    let openers = (0..<2 * ProcessInfo.processInfo.activeProcessorCount + 4).map { _ in
      Task { try await SQLiteJobStore.open(path: path, options: .init(busyTimeout: .seconds(20))) }
    }
    try await Task.sleep(for: .milliseconds(300))  // the opens are waiting for the lock
    release.signal()
    for opener in openers {
      let store = try await opener.value
      _ = try await store.enqueue([NewJob(payload: payload("a"), runAt: epoch)], queue: "jobs", now: epoch)
      await store.close()
    }
  }

  @Test func longFileNamesWork() async throws {
    let folder = try TemporaryFolder()
    // 240 bytes: with "-journal" or "-wal" added, still within the usual 255-byte limit.
    let path = folder.path(String(repeating: "n", count: 233) + ".sqlite")
    let store = try await SQLiteJobStore.open(path: path)
    _ = try await store.enqueue([NewJob(payload: payload("a"), runAt: epoch)], queue: "jobs", now: epoch)
    #expect(try await store.counts(queue: "jobs", now: epoch).ready == 1)
  }

  /// SQLite's Unix VFS opens a path of at most 504 bytes once made absolute with its symbolic
  /// links resolved, and names the files beside a database with up to 8 bytes more than its name
  /// ("-journal"). A path or a name past either limit is refused before anything is made, saying
  /// it is too long (a 253-byte name was created, then failed on its "-wal" file and was left
  /// behind; a long path failed with "unable to open database file"); one just within both opens.
  @Test func pathsAndNamesTooLongForSQLiteAreRefusedBeforeAnythingIsMade() async throws {
    let folder = try TemporaryFolder()
    let base = folder.url.resolvingSymlinksInPath().path
    // `deep/jobs.sqlite` is exactly 504 bytes.
    let filler = 504 - base.utf8.count - "/".utf8.count - 200 - "/".utf8.count - "/jobs.sqlite".utf8.count
    try #require((1...255).contains(filler), "a temporary folder of \(base.utf8.count) bytes")
    let deep = base + "/" + String(repeating: "d", count: 200) + "/" + String(repeating: "e", count: filler)
    try FileManager.default.createDirectory(atPath: deep, withIntermediateDirectories: true)
    let fits = deep + "/jobs.sqlite"
    #expect(fits.utf8.count == 504)
    let store = try await SQLiteJobStore.open(path: fits)
    _ = try await store.enqueue([NewJob(payload: payload("a"), runAt: epoch)], queue: "jobs", now: epoch)
    await store.close()
    // One byte more, given as it is or through a short symbolic link to the folder.
    try FileManager.default.createSymbolicLink(atPath: folder.path("short"), withDestinationPath: deep)
    let name = String(repeating: "n", count: 247)
    let fitsByName = folder.path(name)
    for path in [deep + "/jobs.sqlit3x", folder.path("short/jobs.sqlit3x"), fitsByName + "x"] {
      let before = try FileManager.default.contentsOfDirectory(atPath: deep)
      let error = #expect(throws: SQLiteJobStoreError.self) { try SQLiteJobStore(path: path) }
      #expect(error?.code == .pathTooLong, "\(path.utf8.count) bytes")
      #expect(error?.message.contains("too long") == true)
      #expect(try FileManager.default.contentsOfDirectory(atPath: deep) == before)
      #expect(!FileManager.default.fileExists(atPath: path))
    }
    let byName = try await SQLiteJobStore.open(path: fitsByName)
    _ = try await byName.enqueue([NewJob(payload: payload("a"), runAt: epoch)], queue: "jobs", now: epoch)
    #expect(try await byName.counts(queue: "jobs", now: epoch).ready == 1)
  }

  /// A symbolic link to a database file not made yet (made to a data volume before the first
  /// run): the database is made where the link leads (mode 0600) and opened through the link; a
  /// relative link and a chain of links are followed as the system follows them. It failed with
  /// "unable to open database file".
  @Test func aSymbolicLinkToANewDatabaseFileGetsTheDatabaseWhereItLeads() async throws {
    let folder = try TemporaryFolder()
    try FileManager.default.createDirectory(atPath: folder.path("volume"), withIntermediateDirectories: false)
    try FileManager.default.createSymbolicLink(
      atPath: folder.path("link.sqlite"), withDestinationPath: "volume/jobs.sqlite")
    try FileManager.default.createSymbolicLink(
      atPath: folder.path("chain.sqlite"), withDestinationPath: folder.path("link.sqlite"))
    let store = try await SQLiteJobStore.open(path: folder.path("chain.sqlite"))
    _ = try await store.enqueue([NewJob(payload: payload("a"), runAt: epoch)], queue: "jobs", now: epoch)
    await store.close()
    let target = folder.path("volume/jobs.sqlite")
    #expect(try posixPermissions(target) & 0o777 == 0o600)
    #expect(
      try FileManager.default.destinationOfSymbolicLink(atPath: folder.path("link.sqlite"))
        == "volume/jobs.sqlite")
    let again = try await SQLiteJobStore.open(path: target)
    #expect(try await again.counts(queue: "jobs", now: epoch).ready == 1)
    // SQLite keeps its files beside the database, where the link leads.
    #expect(FileManager.default.fileExists(atPath: target + "-wal"))
    await again.close()
    let leftovers = try FileManager.default.contentsOfDirectory(atPath: folder.path("volume"))
    #expect(leftovers == ["jobs.sqlite"], "\(leftovers)")
  }

  /// Links that cannot lead to a new database: a loop, a folder that does not exist where the link
  /// leads, a folder where SQLite would make the "-wal" file. Each is refused with an error that
  /// says so, and nothing is made.
  @Test func aSymbolicLinkThatCannotLeadToANewDatabaseIsRefusedSayingWhy() throws {
    let folder = try TemporaryFolder()
    try FileManager.default.createSymbolicLink(atPath: folder.path("a"), withDestinationPath: "b")
    try FileManager.default.createSymbolicLink(atPath: folder.path("b"), withDestinationPath: "a")
    let loop = #expect(throws: SQLiteJobStoreError.self) { try SQLiteJobStore(path: folder.path("a")) }
    #expect(loop?.code == .unusableLink)
    #expect(loop?.message.contains("symbolic links that loop") == true)
    try FileManager.default.createSymbolicLink(
      atPath: folder.path("nowhere.sqlite"), withDestinationPath: folder.path("missing/jobs.sqlite"))
    let nowhere = #expect(throws: SQLiteJobStoreError.self) {
      try SQLiteJobStore(path: folder.path("nowhere.sqlite"))
    }
    #expect(nowhere?.code == .cannotCreate)
    #expect(
      nowhere?.message.contains("where the symbolic link leads: \(folder.path("missing/jobs.sqlite"))")
        == true)
    try FileManager.default.createDirectory(
      atPath: folder.path("t.sqlite-wal"), withIntermediateDirectories: false)
    try FileManager.default.createSymbolicLink(
      atPath: folder.path("l.sqlite"), withDestinationPath: "t.sqlite")
    let wal = #expect(throws: SQLiteJobStoreError.self) { try SQLiteJobStore(path: folder.path("l.sqlite")) }
    #expect(wal?.code == .notARegularFile)
    #expect(
      Set(try FileManager.default.contentsOfDirectory(atPath: folder.path(".")))
        == ["a", "b", "nowhere.sqlite", "t.sqlite-wal", "l.sqlite"])
  }

  /// Another user's link in a sticky folder anyone may write to (as /tmp): Linux refuses to follow
  /// it (`fs.protected_symlinks`), so no database is made where it leads, and the error says why.
  @Test(.enabled(if: geteuid() == 0, "needs root to give a link to another user"))
  func anotherUsersLinkInAStickyFolderIsNotFollowedToMakeADatabase() throws {
    #if os(Linux)
      let folder = try TemporaryFolder()
      let sticky = folder.path("shared")
      try FileManager.default.createDirectory(atPath: sticky, withIntermediateDirectories: false)
      #expect(chmod(sticky, 0o1777) == 0)
      let link = sticky + "/jobs.sqlite"
      try FileManager.default.createSymbolicLink(
        atPath: link, withDestinationPath: folder.path("victim.sqlite"))
      #expect(lchown(link, 65_534, 65_534) == 0)
      let error = #expect(throws: SQLiteJobStoreError.self) { try SQLiteJobStore(path: link) }
      #expect(error?.code == .unusableLink)
      #expect(error?.message.contains("another user's") == true)
      #expect(!FileManager.default.fileExists(atPath: folder.path("victim.sqlite")))
    #endif
  }

  @Test func aPathThroughAFileIsAClearError() throws {
    let folder = try TemporaryFolder()
    let file = folder.path("plain.txt")
    #expect(FileManager.default.createFile(atPath: file, contents: Data("x".utf8)))
    let path = file + "/jobs.sqlite"
    let error = #expect(throws: SQLiteJobStoreError.self) { try SQLiteJobStore(path: path) }
    #expect(error?.code == .cannotCreate)
    #expect(error?.description.hasPrefix("\(path): cannot examine the database file (") == true)
  }

  /// Paths that cannot name a database file are refused before anything is opened or created.
  @Test(arguments: ["", "\0", "jobs\0.sqlite", "/tmp/\0/jobs.sqlite", "folder/", "/", "a//"])
  func pathsThatCannotNameAFileAreRefused(_ path: String) throws {
    let error = #expect(throws: SQLiteJobStoreError.self) { try SQLiteJobStore(path: path) }
    #expect(error?.code == .invalidPath || error?.code == .notARegularFile, "\(path.debugDescription)")
    #expect(error?.message.contains("pass the path of a database file") == true)
  }

  /// The folder part of a path, by plain bytes: Foundation's `deletingLastPathComponent` trapped
  /// on a one-character relative path ("q", "-"), which killed any process opening one.
  @Test func theFolderOfAnyPathIsFoundWithoutTrapping() {
    let cases: [(String, String)] = [
      ("q", ""), ("-", ""), ("é", ""), ("jobs.sqlite", ""), ("/q", "/"), ("//q", "/"), ("a/b", "a"),
      ("a//b", "a"), ("/a/b/c", "/a/b"), ("a/", "a"), ("./q", "."), ("../q", ".."), ("é/ü", "é"),
      ("a\u{301}/b", "a\u{301}"), ("/", "/"), ("", ""),
    ]
    for (path, folder) in cases {
      #expect(PathCheck.folder(of: path) == folder, "\(path.debugDescription)")
    }
    var random = SeededRandom(seed: 4)
    let pieces = ["/", ".", "..", "q", "é", "\u{301}", "\0", "😀", "-", " "]
    for _ in 0..<5000 {
      let path = (0..<Int.random(in: 0...8, using: &random)).map { _ in pieces.randomElement(using: &random)!
      }
      .joined()
      let folder = PathCheck.folder(of: path)
      #expect(path.utf8.starts(with: folder.utf8), "\(path.debugDescription)")
      // (By bytes: "/" followed by a combining accent is one Character, not "/".)
      #expect(folder.isEmpty == !path.utf8.contains(UInt8(ascii: "/")), "\(path.debugDescription)")
    }
  }

  /// Names SQLite would read as something else than the file: `:memory:` (a database in memory)
  /// and `file:` URIs (Debian's SQLite takes them by default). SQLite is given `./` before them.
  @Test func sqliteIsGivenNamesItReadsAsFiles() {
    #expect(PathCheck.sqliteFilename(":memory:") == "./:memory:")
    #expect(PathCheck.sqliteFilename("file:jobs?mode=memory") == "./file:jobs?mode=memory")
    #expect(PathCheck.sqliteFilename("jobs.sqlite") == "./jobs.sqlite")
    #expect(PathCheck.sqliteFilename("/tmp/:memory:") == "/tmp/:memory:")
  }

  /// Hostile names in a real folder: each opens a database file of that name, or is refused with
  /// a clear error; none traps, and a store opened again finds its job.
  @Test func hostileFileNamesOpenAFileOrAreRefused() async throws {
    let folder = try TemporaryFolder()
    var names = [
      ":memory:", "file:x?mode=memory", "-", "q", "é", "😀", "a b", "x-wal",
      String(repeating: "n", count: 255),
      String(repeating: "n", count: 256), "..", ".", "sub/q",
    ]
    var random = SeededRandom(seed: 9)
    let alphabet = Array("-:?=&%#é😀 .q".unicodeScalars)
    for _ in 0..<30 {
      var scalars = String.UnicodeScalarView()
      for _ in 0..<Int.random(in: 1...8, using: &random) {
        scalars.append(alphabet.randomElement(using: &random)!)
      }
      names.append(String(scalars))
    }
    for name in names {
      let path = folder.path(name)
      do {
        let store = try SQLiteJobStore(path: path)
        _ = try await store.enqueue([NewJob(payload: payload("a"), runAt: epoch)], queue: "jobs", now: epoch)
        await store.close()
        #expect(FileManager.default.fileExists(atPath: path), "\(name.debugDescription) is a file")
        let again = try SQLiteJobStore(path: path)
        #expect(try await again.counts(queue: "jobs", now: epoch).ready >= 1, "\(name.debugDescription)")
        await again.close()
      } catch let error as SQLiteJobStoreError {
        #expect(!error.message.isEmpty, "\(name.debugDescription)")
      } catch let error as SQLiteError {
        #expect(!error.message.isEmpty, "\(name.debugDescription)")
      }
    }
  }

  @Test func defaultLocationRefusesARelativeHome() throws {
    #if !canImport(Darwin)
      for home in ["q", "-", "relative/home"] {
        let error = #expect(throws: SQLiteJobStoreError.self) {
          try SQLiteJobStore.defaultDatabaseURL(name: "outbox", environment: ["HOME": home])
        }
        #expect(error?.code == .cannotCreate)
        #expect(error?.message.contains("HOME is not an absolute path") == true)
      }
    #endif
  }

  @Test func defaultLocationFollowsXDGAndValidatesNames() throws {
    let folder = try TemporaryFolder()
    #if !canImport(Darwin)
      // The environment is passed in, not set: tests in parallel threads read the real one.
      let url = try SQLiteJobStore.defaultDatabaseURL(
        name: "outbox", environment: ["XDG_DATA_HOME": folder.path("data"), "HOME": "/nonexistent"])
      #expect(url.path == folder.path("data/conveyor/outbox.sqlite"))
      #expect(try posixPermissions(folder.path("data/conveyor")) & 0o777 == 0o700)
      #expect(!url.path.contains("cache"))
      let fallback = try SQLiteJobStore.defaultDatabaseURL(
        name: "outbox", environment: ["XDG_DATA_HOME": "relative/ignored", "HOME": folder.path("home")])
      #expect(fallback.path == folder.path("home/.local/share/conveyor/outbox.sqlite"))
    #endif
    for bad in ["", "a/b", "..", ".", "naïve", "with space", String(repeating: "x", count: 129)] {
      let error = #expect(throws: SQLiteJobStoreError.self) {
        try SQLiteJobStore.defaultDatabaseURL(name: bad)
      }
      #expect(error?.code == .invalidName)
    }
    #expect(throws: Never.self) {
      try SQLiteJobStore.defaultDatabaseURL(name: String(repeating: "x", count: 128))
    }
  }
}

@Suite("SQLiteJobStore closing")
struct ClosingTests {
  @Test func closeFoldsTheLogIntoTheFileAndLaterCallsSaySo() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("closing.sqlite")
    let store = try await SQLiteJobStore.open(path: path)
    _ = try await store.enqueue([NewJob(payload: payload("kept"), runAt: epoch)], queue: "jobs", now: epoch)
    #expect(FileManager.default.fileExists(atPath: path + "-wal"))
    await store.close()
    #expect(!FileManager.default.fileExists(atPath: path + "-wal"), "the WAL is folded into the file")
    #expect(!FileManager.default.fileExists(atPath: path + "-shm"))
    let error = await #expect(throws: SQLiteJobStoreError.self) {
      try await store.counts(queue: "jobs", now: epoch)
    }
    #expect(error?.code == .closed)
    #expect(error?.description == "\(path): this store was closed; open the database again to use it")
    await store.close()  // again: nothing happens
    // The single file holds everything: a copy of it alone opens with the job in it.
    let copy = folder.path("copy.sqlite")
    try FileManager.default.copyItem(atPath: path, toPath: copy)
    let reopened = try await SQLiteJobStore.open(path: copy)
    #expect(try await reopened.counts(queue: "jobs", now: epoch).ready == 1)
  }

  /// Calls racing with `close()` either complete or fail with `.closed`: none is cut off halfway,
  /// and every one that reported success is in the file.
  @Test func callsRacingWithCloseCompleteOrSayClosed() async throws {
    let folder = try TemporaryFolder()
    let path = folder.path("busy.sqlite")
    let store = try await SQLiteJobStore.open(path: path)
    let writes = (0..<20).map { index in
      Task {
        try await store.enqueue(
          [NewJob(payload: payload("\(index)"), runAt: epoch)], queue: "jobs", now: epoch)
      }
    }
    await store.close()
    var committed = 0
    for write in writes {
      do {
        _ = try await write.value
        committed += 1
      } catch let error as SQLiteJobStoreError {
        #expect(error.code == .closed)
      }
    }
    let reopened = try await SQLiteJobStore.open(path: path)
    #expect(try await reopened.counts(queue: "jobs", now: epoch).ready == committed)
  }
}

@Suite("SQLiteJobStore opening races")
struct OpeningRaceTests {
  /// Each round races four opens of one new file. One open installs the schema while the others
  /// inspect the file; an inspection that read the header and the schema in separate snapshots
  /// once took a half-seen new database for another application's (CI, 2026-11-29).
  @Test func concurrentOpensOfANewFileInstallTheSchemaOnce() async throws {
    let folder = try TemporaryFolder()
    for round in 0..<40 {
      let path = folder.path("race-\(round).sqlite")
      let stores = try await withThrowingTaskGroup(of: SQLiteJobStore.self) { group in
        for _ in 0..<4 { group.addTask { try await SQLiteJobStore.open(path: path) } }
        return try await group.reduce(into: []) { $0.append($1) }
      }
      #expect(stores.count == 4)
      _ = try await stores[0].enqueue(
        [NewJob(payload: payload("a"), runAt: epoch)], queue: "jobs", now: epoch)
      for store in stores { #expect(try await store.counts(queue: "jobs", now: epoch).ready == 1) }
    }
    let leftovers = try FileManager.default.contentsOfDirectory(atPath: folder.path("."))
      .filter { $0.contains("conveyor-new") }
    #expect(leftovers == [], "the files a new database is built in are removed")
  }

  /// An empty file made beforehand (by `touch`, say) gets its schema from whichever open takes
  /// the write lock first; the others wait for it, including for the switch to WAL mode, which
  /// SQLite refuses at once while another connection holds a lock.
  @Test func concurrentOpensOfAnEmptyFileInstallTheSchemaOnce() async throws {
    let folder = try TemporaryFolder()
    for round in 0..<40 {
      let path = folder.path("empty-\(round).sqlite")
      #expect(FileManager.default.createFile(atPath: path, contents: Data()))
      let stores = try await withThrowingTaskGroup(of: SQLiteJobStore.self) { group in
        for _ in 0..<4 { group.addTask { try await SQLiteJobStore.open(path: path) } }
        return try await group.reduce(into: []) { $0.append($1) }
      }
      _ = try await stores[0].enqueue(
        [NewJob(payload: payload("a"), runAt: epoch)], queue: "jobs", now: epoch)
      for store in stores { #expect(try await store.counts(queue: "jobs", now: epoch).ready == 1) }
    }
  }
}
