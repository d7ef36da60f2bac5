import CSQLite
import Conveyor
import Foundation
import Synchronization

/// A value bound to a statement parameter.
enum SQLiteValue {
  case integer(Int64)
  case real(Double)
  case text(String)
  case blob(Data)
  case null
}

/// One open sqlite3 handle and its prepared statements.
///
/// Not thread-safe and not `Sendable`: exactly one owner uses it at a time (``SerializedConnection``
/// confines it to one dedicated thread). Statements are prepared once per SQL text and reused;
/// `deinit` finalises them, then closes the handle.
final class Connection {
  /// The sqlite3 handle; immutable for the connection's life; not to be used after ``close()``.
  let handle: OpaquePointer
  private var statements: [ExactText: Statement] = [:]
  /// The statements used most recently, looked up before `statements`: the hot calls pass the
  /// same string constants each time, which compare equal at once (same storage), where the
  /// dictionary hashed the whole text (a few hundred bytes) on every statement of every call.
  private var recent: [(sql: ExactText, statement: Statement)] = []
  /// Queue names this connection has recorded in the `queues` table (rows there are never
  /// deleted), so an enqueue records its queue once per connection, not once per call. Compared
  /// byte for byte, as SQLite compares them: two canonically equivalent names (a precomposed and a
  /// decomposed "é") are two queues, each recorded.
  var notedQueues: Set<ExactText> = []
  /// Whether ``close()`` ran.
  private(set) var isClosed = false
  /// While set, every statement on this connection stops with `SQLITE_INTERRUPT`, including one
  /// that starts after it was set (which `sqlite3_interrupt` alone misses when it arrives between
  /// statements). Read by a progress handler every 1,000 virtual-machine instructions; safe to
  /// set from any thread.
  let interruption = InterruptFlag()
  /// How long a statement waits for another connection's lock, in milliseconds (SQLite's busy
  /// timeout), when waiting is allowed.
  private(set) var lockWait: Int32 = 0
  /// Whether statements currently wait up to ``lockWait`` (false: `SQLITE_BUSY` at once).
  private var waitsForLocks = true
  /// Called after a commit leaves the WAL file at or past ``walCheckpointPages`` pages (see
  /// ``checkpointElsewhere(atPages:_:)``), on the committing thread.
  private var walFull: (() -> Void)?
  /// The WAL size, in pages, at which ``walFull`` is called.
  private var walCheckpointPages: Int32 = 0

  /// Opens (and creates when `create` is true) the database file at `path`.
  init(path: String, create: Bool) throws {
    let flags =
      SQLITE_OPEN_READWRITE | (create ? SQLITE_OPEN_CREATE : 0) | SQLITE_OPEN_NOMUTEX
      | SQLITE_OPEN_EXRESCODE
    handle = try Self.open(path, flags: flags, describing: path)
    // The flag lives as long as the connection, and the handle closes in `close()`/`deinit`.
    sqlite3_progress_handler(
      handle, 1_000,
      { flag in Unmanaged<InterruptFlag>.fromOpaque(flag!).takeUnretainedValue().isSet ? 1 : 0 },
      Unmanaged.passUnretained(interruption).toOpaque())
  }

  /// Opens `path` read-only as an immutable file: SQLite takes no lock and reads, creates or
  /// changes no journal, WAL or shared-memory file, so whatever the file is, it stays untouched.
  /// For looking at a file before deciding to open it for writing.
  init(inspecting path: String) throws {
    var allowed = CharacterSet.urlPathAllowed
    allowed.remove(charactersIn: "?#%")
    let escaped = path.addingPercentEncoding(withAllowedCharacters: allowed) ?? path
    let flags = SQLITE_OPEN_READONLY | SQLITE_OPEN_URI | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_EXRESCODE
    handle = try Self.open("file:\(escaped)?immutable=1", flags: flags, describing: path)
  }

  /// Opens `path` read-only, reading through its WAL file (SQLite may use the shared-memory file
  /// beside it): for reading a database another process may be writing, without writing to it.
  init(readingOnly path: String) throws {
    let flags = SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_EXRESCODE
    handle = try Self.open(path, flags: flags, describing: path)
  }

  /// Opens a handle with extended result codes, or throws with SQLite's message.
  private static func open(_ filename: String, flags: Int32, describing path: String) throws -> OpaquePointer
  {
    var db: OpaquePointer?
    let rc = sqlite3_open_v2(filename, &db, flags, nil)
    guard let db else { throw SQLiteError(code: .init(rawValue: rc), message: "cannot open \(path)") }
    guard rc == SQLITE_OK else {
      let error = SQLiteError(code: .init(rawValue: rc), message: String(cString: sqlite3_errmsg(db)))
      sqlite3_close_v2(db)
      throw error
    }
    sqlite3_extended_result_codes(db, 1)
    return db
  }

  /// Finalises the statements and closes the handle; later calls to ``close()`` do nothing.
  ///
  /// In WAL mode the last connection to a database checkpoints the WAL file into the database
  /// and deletes it as it closes (unless checkpoint-on-close was turned off).
  func close() {
    guard !isClosed else { return }
    isClosed = true
    // Statements must be finalised before the handle closes; close_v2 defers if one leaked.
    statements.removeAll()
    recent.removeAll()
    sqlite3_close_v2(handle)
  }

  deinit { close() }

  /// Sets how long statements wait for another connection's lock, and lets them wait.
  func setLockWait(milliseconds: Int32) {
    lockWait = milliseconds
    waitsForLocks = true
    sqlite3_busy_timeout(handle, milliseconds)
  }

  /// Lets statements wait up to ``lockWait`` for another connection's lock (`true`), or makes
  /// them fail with `SQLITE_BUSY` at once (`false`), for a caller that must not block its thread.
  func waitForLocks(_ wait: Bool) {
    guard wait != waitsForLocks else { return }
    waitsForLocks = wait
    sqlite3_busy_timeout(handle, wait ? lockWait : 0)
  }

  /// Turns off SQLite's automatic checkpoint, which runs inside the `COMMIT` that makes the WAL
  /// file reach `pages` pages, on the committing thread, and writes and syncs the database file
  /// there. Instead, `walFull` is called after such a commit (on the committing thread, as SQLite's
  /// WAL hook, so it must not use the connection): it should arrange for ``checkpoint()`` to run
  /// where waiting is harmless.
  ///
  /// Replaces SQLite's automatic checkpoint (`sqlite3_wal_hook` is how SQLite runs it). Other
  /// connections to the file keep their own setting.
  func checkpointElsewhere(atPages pages: Int32, _ walFull: @escaping () -> Void) {
    self.walFull = walFull
    walCheckpointPages = pages
    // The hook's context is this connection, which outlives its handle (closed in `close()`).
    sqlite3_wal_hook(
      handle,
      { context, _, _, pages in
        Unmanaged<Connection>.fromOpaque(context!).takeUnretainedValue().walCommitted(pages: pages)
        return SQLITE_OK
      }, Unmanaged.passUnretained(self).toOpaque())
  }

  /// Called by SQLite after each commit in WAL mode with the WAL file's size in pages.
  private func walCommitted(pages: Int32) {
    if pages >= walCheckpointPages, let walFull { walFull() }
  }

  /// Copies what it can of the WAL file into the database file without waiting for any other
  /// connection (`SQLITE_CHECKPOINT_PASSIVE`), so the next writer can start the WAL file over;
  /// a checkpoint another connection is running meanwhile is no error.
  func checkpoint() {
    // PASSIVE never calls the busy handler; SQLITE_BUSY (another checkpoint runs) and other
    // failures leave the WAL to the next checkpoint, this connection's or another's.
    sqlite3_wal_checkpoint_v2(handle, nil, SQLITE_CHECKPOINT_PASSIVE, nil, nil)
  }

  /// The connection's `PRAGMA synchronous` level: 0 OFF, 1 NORMAL, 2 FULL, 3 EXTRA.
  func synchronousLevel() throws -> Int64 { try scalar("PRAGMA synchronous") ?? 2 }

  /// The number of statements currently prepared and cached (for leak checks in tests).
  var cachedStatementCount: Int { statements.count }

  /// Whether `sql` was prepared and is cached (for tests).
  func isCached(_ sql: String) -> Bool { statements[ExactText(sql)] != nil }

  /// Returns the cached prepared statement for `sql`, preparing it on first use.
  func statement(_ sql: String) throws -> Statement {
    let text = ExactText(sql)
    for entry in recent where entry.sql == text { return entry.statement }
    let statement: Statement
    if let cached = statements[text] {
      statement = cached
    } else {
      statement = try Statement(connection: self, sql: sql)
      statements[text] = statement
    }
    // The newest replaces the oldest: a hot loop's handful of statements stay.
    if recent.count == Self.recentStatements { recent.removeFirst() }
    recent.append((text, statement))
    return statement
  }

  /// How many statements ``statement(_:)`` looks up without hashing.
  static let recentStatements = 12

  /// Runs `sql` (one or several statements, no parameters) without caching it.
  func execute(_ sql: String) throws {
    let rc = sqlite3_exec(handle, sql, nil, nil, nil)
    guard rc == SQLITE_OK else { throw error(rc, sql: sql) }
  }

  /// Runs a cached statement with `values` to completion; returns the rows it changed.
  @discardableResult
  func run(_ sql: String, _ values: SQLiteValue...) throws -> Int {
    let statement = try statement(sql)
    defer { statement.reset() }  // also after a value SQLite refused: no copy stays bound
    try statement.bind(values)
    while try statement.step() {}
    return Int(sqlite3_changes(handle))
  }

  /// Runs a cached query with `values`, calling `row` for each result row.
  func query(_ sql: String, _ values: SQLiteValue..., row: (Statement) throws -> Void) throws {
    try query(sql, values, row: row)
  }

  /// Runs a cached query with the values of an array (see ``query(_:_:row:)``).
  func query(_ sql: String, _ values: [SQLiteValue], row: (Statement) throws -> Void) throws {
    let statement = try statement(sql)
    defer { statement.reset() }  // also after a value SQLite refused: no copy stays bound
    try statement.bind(values)
    while try statement.step() { try row(statement) }
  }

  /// Runs a cached query and returns its first row's first column as an integer (nil for no row or NULL).
  func scalar(_ sql: String, _ values: SQLiteValue...) throws -> Int64? {
    let statement = try statement(sql)
    defer { statement.reset() }  // also after a value SQLite refused: no copy stays bound
    try statement.bind(values)
    guard try statement.step(), !statement.isNull(0) else { return nil }
    return statement.int64(0)
  }

  /// Runs a cached query and returns its first row's first column as text (nil for no row or NULL).
  func scalarText(_ sql: String, _ values: SQLiteValue...) throws -> String? {
    let statement = try statement(sql)
    defer { statement.reset() }  // also after a value SQLite refused: no copy stays bound
    try statement.bind(values)
    guard try statement.step(), !statement.isNull(0) else { return nil }
    return statement.text(0)
  }

  /// The rowid of the most recent successful insert.
  var lastInsertRowID: Int64 { sqlite3_last_insert_rowid(handle) }

  /// Whether no transaction is open.
  var isAutocommit: Bool { sqlite3_get_autocommit(handle) != 0 }

  /// Runs `body` in a transaction (`BEGIN IMMEDIATE` when `immediate`, else deferred), committing
  /// when it returns and rolling back when it throws.
  func transaction<T>(immediate: Bool, _ body: () throws -> T) throws -> T {
    try begin(immediate ? "BEGIN IMMEDIATE" : "BEGIN DEFERRED")
    do {
      let result = try body()
      // From here a cancellation can no longer interrupt: the outcome of `COMMIT` is the truth.
      guard interruption.beginCommit() else {
        throw SQLiteError(code: .interrupt, message: "interrupted before committing", sql: "COMMIT")
      }
      defer { interruption.endCommit() }
      try run("COMMIT")
      return result
    } catch {
      rollbackIfNeeded()
      throw error
    }
  }

  /// Rolls back the open transaction, if any.
  ///
  /// Called while another error is already being thrown, so its result code adds nothing. A
  /// rollback that fails (interrupted by the same cancellation, say) leaves the transaction open:
  /// ``begin(_:)`` rolls it back before the next one, or every later call would fail.
  func rollbackIfNeeded() {
    if !isAutocommit { sqlite3_exec(handle, "ROLLBACK", nil, nil, nil) }
  }

  /// Begins a transaction (`statement`: a `BEGIN …`), first rolling back one an earlier failure
  /// left open: nothing ever nests transactions on a connection, so one open here is a remnant.
  func begin(_ statement: String) throws {
    if !isAutocommit { try run("ROLLBACK") }
    try run(statement)
  }

  /// Builds an error from a result code and the connection's current message.
  func error(_ rc: Int32, sql: String?) -> SQLiteError {
    SQLiteError(code: .init(rawValue: rc), message: String(cString: sqlite3_errmsg(handle)), sql: sql)
  }
}

/// A prepared statement owned by one ``Connection``; `deinit` finalises it.
final class Statement {
  let handle: OpaquePointer
  let sql: String
  private let database: OpaquePointer

  init(connection: Connection, sql: String) throws {
    var statement: OpaquePointer?
    let rc = sqlite3_prepare_v3(
      connection.handle, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &statement, nil)
    guard rc == SQLITE_OK, let statement else { throw connection.error(rc, sql: sql) }
    handle = statement
    database = connection.handle
    self.sql = sql
  }

  deinit { sqlite3_finalize(handle) }

  /// Binds `values` to parameters 1…n.
  func bind(_ values: [SQLiteValue]) throws {
    for (offset, value) in values.enumerated() { try bind(value, at: Int32(offset + 1)) }
  }

  /// Binds `value` to parameter `index` (from 1).
  func bind(_ value: SQLiteValue, at index: Int32) throws {
    let rc: Int32
    switch value {
    case .integer(let number):
      rc = sqlite3_bind_int64(handle, index, number)
    case .real(let number):
      rc = sqlite3_bind_double(handle, index, number)
    case .text(var text):
      // With its byte length, so a NUL inside is kept (a C string would end there), and as a
      // 64-bit length: SQLite answers SQLITE_TOOBIG for what it cannot store, never a trap.
      if text.isEmpty {
        rc = sqlite3_bind_text(handle, index, "", 0, conveyor_sqlite_transient())
      } else {
        rc = text.withUTF8 { bytes in
          bytes.withMemoryRebound(to: CChar.self) {
            sqlite3_bind_text64(
              handle, index, $0.baseAddress, UInt64($0.count), conveyor_sqlite_transient(),
              UInt8(SQLITE_UTF8))
          }
        }
      }
    case .blob(let data):
      if data.isEmpty {
        rc = sqlite3_bind_zeroblob(handle, index, 0)
      } else {
        rc = data.withUnsafeBytes {
          sqlite3_bind_blob64(handle, index, $0.baseAddress, UInt64($0.count), conveyor_sqlite_transient())
        }
      }
    case .null:
      rc = sqlite3_bind_null(handle, index)
    }
    guard rc == SQLITE_OK else { throw error(rc) }
  }

  /// Advances to the next row: true when a row is available, false when done.
  func step() throws -> Bool {
    switch sqlite3_step(handle) {
    case SQLITE_ROW: return true
    case SQLITE_DONE: return false
    case let rc: throw error(rc)
    }
  }

  /// Resets the statement for reuse and clears its bindings.
  ///
  /// `sqlite3_reset` repeats the result of the last step, which ``step()`` already threw.
  func reset() {
    sqlite3_reset(handle)
    sqlite3_clear_bindings(handle)
  }

  func isNull(_ column: Int32) -> Bool { sqlite3_column_type(handle, column) == SQLITE_NULL }
  func int64(_ column: Int32) -> Int64 { sqlite3_column_int64(handle, column) }
  func int(_ column: Int32) -> Int { Int(sqlite3_column_int64(handle, column)) }
  func double(_ column: Int32) -> Double { sqlite3_column_double(handle, column) }

  func text(_ column: Int32) -> String? {
    guard let pointer = sqlite3_column_text(handle, column) else { return nil }
    // By its byte length (asked for after the text, as SQLite requires): a NUL inside is kept.
    let count = Int(sqlite3_column_bytes(handle, column))
    return String(decoding: UnsafeBufferPointer(start: pointer, count: count), as: UTF8.self)
  }

  func data(_ column: Int32) -> Data {
    let count = Int(sqlite3_column_bytes(handle, column))
    guard count > 0, let pointer = sqlite3_column_blob(handle, column) else { return Data() }
    return Data(bytes: pointer, count: count)
  }

  private func error(_ rc: Int32) -> SQLiteError {
    SQLiteError(code: .init(rawValue: rc), message: String(cString: sqlite3_errmsg(database)), sql: sql)
  }
}

/// Whether a cancelled call's statements must stop: read by the connection's progress handler
/// (every 1,000 virtual-machine instructions), set from any thread.
///
/// Once a transaction's `COMMIT` has begun, the flag cannot be set: SQLite can run the progress
/// handler after a `COMMIT` has committed and then report `SQLITE_INTERRUPT`, which would tell a
/// cancelled caller that nothing was committed when it was. A cancellation that comes first makes
/// the transaction roll back instead of committing.
final class InterruptFlag: Sendable {
  private static let clear = 0
  private static let interrupted = 1
  private static let committing = 2
  private let value = Atomic<Int>(InterruptFlag.clear)

  /// Whether the flag is set.
  var isSet: Bool { value.load(ordering: .acquiring) == Self.interrupted }

  /// Sets the flag, unless a `COMMIT` has begun; returns whether it is set (so whether to call
  /// `sqlite3_interrupt` too).
  @discardableResult
  func set() -> Bool {
    let (exchanged, original) = value.compareExchange(
      expected: Self.clear, desired: Self.interrupted, ordering: .acquiringAndReleasing)
    return exchanged || original == Self.interrupted
  }

  /// Clears the flag.
  func clear() { value.store(Self.clear, ordering: .releasing) }

  /// Marks the start of a `COMMIT`; false when a cancellation came first (then roll back).
  func beginCommit() -> Bool {
    value.compareExchange(expected: Self.clear, desired: Self.committing, ordering: .acquiringAndReleasing)
      .exchanged
  }

  /// Marks the end of a `COMMIT`, whatever its outcome.
  func endCommit() {
    _ = value.compareExchange(
      expected: Self.committing, desired: Self.clear, ordering: .acquiringAndReleasing)
  }
}
