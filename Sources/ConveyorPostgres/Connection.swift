import CLibPQ
import Conveyor
import Foundation

/// A value bound to a statement parameter, sent in PostgreSQL's binary format.
enum PostgresValue {
  case null(oid: UInt32)
  case int64(Int64)
  case text(String)
  case bytea(Data)
  case bool(Bool)
  case double(Double)
  /// A `timestamptz`, or NULL.
  case timestamp(Date?)
  case int64Array([Int64?])
  case int32Array([Int32])
  case doubleArray([Double])
  case textArray([String?])
  case byteaArray([Data?])
  case timestampArray([Date?])

  static let boolOID: UInt32 = 16
  static let byteaOID: UInt32 = 17
  static let int8OID: UInt32 = 20
  static let float8OID: UInt32 = 701
  static let int4OID: UInt32 = 23
  static let textOID: UInt32 = 25
  static let timestamptzOID: UInt32 = 1184

  /// Microseconds between 1970 and PostgreSQL's epoch, 2000-01-01.
  static let epochOffsetMilliseconds: Int64 = 946_684_800_000

  /// The parameter's type and binary bytes (nil for NULL).
  var encoded: (oid: UInt32, bytes: [UInt8]?) {
    switch self {
    case .null(let oid): return (oid, nil)
    case .int64(let value): return (Self.int8OID, Self.bigEndian(value))
    case .text(let value): return (Self.textOID, Array(value.utf8))
    case .bytea(let value): return (Self.byteaOID, Array(value))
    case .bool(let value): return (Self.boolOID, [value ? 1 : 0])
    case .double(let value): return (Self.float8OID, Self.bigEndian(value.bitPattern))
    case .timestamp(let date): return (Self.timestamptzOID, date.map(Self.timestampBytes))
    case .int64Array(let values):
      return (1016, Self.array(Self.int8OID, values.map { $0.map(Self.bigEndian) }))
    case .int32Array(let values): return (1007, Self.array(Self.int4OID, values.map { Self.bigEndian($0) }))
    case .doubleArray(let values):
      return (1022, Self.array(Self.float8OID, values.map { Self.bigEndian($0.bitPattern) }))
    case .textArray(let values):
      return (1009, Self.array(Self.textOID, values.map { $0.map { Array($0.utf8) } }))
    case .byteaArray(let values):
      return (1001, Self.array(Self.byteaOID, values.map { $0.map { Array($0) } }))
    case .timestampArray(let values):
      return (1185, Self.array(Self.timestamptzOID, values.map { $0.map(Self.timestampBytes) }))
    }
  }

  static func bigEndian<T: FixedWidthInteger>(_ value: T) -> [UInt8] {
    withUnsafeBytes(of: value.bigEndian) { Array($0) }
  }

  /// A date as whole milliseconds (rounded and clamped as every store keeps dates), in
  /// microseconds since 2000.
  static func timestampBytes(_ date: Date) -> [UInt8] {
    bigEndian((JobStoreTime.milliseconds(date) - epochOffsetMilliseconds) * 1000)
  }

  /// A one-dimensional array in the binary array format.
  static func array(_ elementOID: UInt32, _ elements: [[UInt8]?]) -> [UInt8] {
    var bytes: [UInt8] = []
    let hasNull = elements.contains { $0 == nil }
    bytes += bigEndian(Int32(elements.isEmpty ? 0 : 1))
    bytes += bigEndian(Int32(hasNull ? 1 : 0))
    bytes += bigEndian(elementOID)
    if !elements.isEmpty {
      // Truncated, never trapping: an oversized array is refused by `execute` (its whole
      // encoding is then over 2 GiB), so these lengths are never sent wrong.
      bytes += bigEndian(Int32(truncatingIfNeeded: elements.count))
      bytes += bigEndian(Int32(1))
    }
    for element in elements {
      if let element {
        bytes += bigEndian(Int32(truncatingIfNeeded: element.count))
        bytes += element
      } else {
        bytes += bigEndian(Int32(-1))
      }
    }
    return bytes
  }
}

/// The rows of one statement's result, in binary format; frees the result when released.
///
/// Confined to the store's thread like the connection that produced it.
final class QueryResult {
  private let handle: OpaquePointer
  /// The number of rows.
  let count: Int
  /// The number of rows the statement changed (`PQcmdTuples`).
  let changed: Int

  init(_ handle: OpaquePointer) {
    self.handle = handle
    count = Int(PQntuples(handle))
    changed = Int(String(cString: PQcmdTuples(handle))) ?? 0
  }

  deinit { PQclear(handle) }

  func isNull(_ row: Int, _ column: Int) -> Bool {
    PQgetisnull(handle, Int32(row), Int32(column)) == 1
  }

  private func bytes(_ row: Int, _ column: Int) -> UnsafeRawBufferPointer {
    let length = Int(PQgetlength(handle, Int32(row), Int32(column)))
    guard let pointer = PQgetvalue(handle, Int32(row), Int32(column)) else {
      return UnsafeRawBufferPointer(start: nil, count: 0)
    }
    return UnsafeRawBufferPointer(start: pointer, count: length)
  }

  private func integer<T: FixedWidthInteger>(_ row: Int, _ column: Int, as type: T.Type) -> T {
    let buffer = bytes(row, column)
    guard buffer.count == MemoryLayout<T>.size else { return 0 }
    var value: T = 0
    withUnsafeMutableBytes(of: &value) { $0.copyMemory(from: buffer) }
    return T(bigEndian: value)
  }

  /// An `int8` column (0 for NULL).
  func int64(_ row: Int, _ column: Int) -> Int64 {
    isNull(row, column) ? 0 : integer(row, column, as: Int64.self)
  }

  /// A `float8` column (0 for NULL).
  func double(_ row: Int, _ column: Int) -> Double {
    isNull(row, column) ? 0 : Double(bitPattern: integer(row, column, as: UInt64.self))
  }

  /// A `bool` column (false for NULL).
  func bool(_ row: Int, _ column: Int) -> Bool {
    !isNull(row, column) && bytes(row, column).first == 1
  }

  /// A `text` column, or nil for NULL.
  func text(_ row: Int, _ column: Int) -> String? {
    isNull(row, column) ? nil : String(decoding: bytes(row, column), as: UTF8.self)
  }

  /// A `bytea` column (empty for NULL).
  func data(_ row: Int, _ column: Int) -> Data {
    isNull(row, column) ? Data() : Data(bytes(row, column))
  }

  /// A `bytea` column, or nil for NULL.
  func optionalData(_ row: Int, _ column: Int) -> Data? {
    isNull(row, column) ? nil : Data(bytes(row, column))
  }

  /// A `timestamptz` column, or nil for NULL.
  func date(_ row: Int, _ column: Int) -> Date? {
    guard !isNull(row, column) else { return nil }
    let microseconds = integer(row, column, as: Int64.self)
    let milliseconds = microseconds / 1000 + (microseconds % 1000 >= 500 ? 1 : 0)
    return JobStoreTime.date(milliseconds: milliseconds + PostgresValue.epochOffsetMilliseconds)
  }
}

/// One libpq connection. Not thread-safe: the store confines it to its own thread.
final class Connection {
  let handle: OpaquePointer
  private let scrubber: Scrubber
  /// True while an explicit transaction is open (between `BEGIN` and its end).
  private(set) var inTransaction = false
  /// Set when a statement that could have committed (an autocommit statement, or `COMMIT`)
  /// failed because the connection broke: whether its change was made is unknown.
  private(set) var lostDuringCommit = false
  /// Checked before each statement: set by a cancellation that arrived between statements,
  /// which `PQcancel` cannot reach.
  var isCancelled: () -> Bool = { false }
  /// The statements prepared on this connection, by text and parameter types: their names.
  private var prepared: [PreparedKey: String] = [:]
  /// How many statements this connection has prepared: names are never reused, even after the
  /// cache is emptied, so a name never meets an older statement still on the server.
  private var preparedCount = 0
  /// For a connection through a pooler in transaction mode (PgBouncer's `pool_mode =
  /// transaction`), where each transaction may run on another server session: no statement is
  /// prepared (each is sent whole), and `transactionSettings`, a statement that sets the
  /// session's settings for the current transaction only (`set_config(…, true)`), runs at the start
  /// of every transaction, explicit or implicit, in the same round trip. Nil: a direct connection
  /// (settings are made once per session, statements prepared once).
  var transactionSettings: String?

  private struct PreparedKey: Hashable {
    /// By its bytes: see `ExactText`.
    var sql: ExactText
    var types: [UInt32]
  }

  /// Set (by libpq's notice receiver, on the thread using the connection) when the server sent a
  /// FATAL or PANIC message outside a statement: it is ending the session.
  private let sessionEnded: UnsafeMutablePointer<Int32> = {
    let flag = UnsafeMutablePointer<Int32>.allocate(capacity: 1)
    flag.initialize(to: 0)
    return flag
  }()

  /// How long a connection attempt may take when neither the caller nor the conninfo's
  /// `connect_timeout` says.
  static let defaultConnectTimeout = 30

  /// Connects; throws ``PostgresError`` with code `connectionFailed` when libpq cannot, or when
  /// the attempt outlasts `deadline` or the conninfo's `connect_timeout` (30 s without one), and
  /// `CancellationError` once `isCancelled` says so (looked at at least every 50 ms).
  ///
  /// A server that froze whole accepts the TCP connection in its kernel and never answers the
  /// startup packet: `PQconnectdb` without a `connect_timeout` waited for it forever. So one
  /// host is connected without blocking (`PQconnectStart`, `PQconnectPoll`), with the socket
  /// polled in slices. Several hosts (from the conninfo, a service file or the environment), or a
  /// `connect_timeout` libpq would refuse, go through libpq's own blocking connect, with a
  /// `connect_timeout` of 30 s unless one is set: libpq applies it to each host in turn (a frozen
  /// first host falls through to the next) and reports a bad value; cancellation and `deadline`
  /// then act only between attempts.
  init(
    conninfo: String, scrubber: Scrubber, deadline: ContinuousClock.Instant? = nil,
    isCancelled: () -> Bool = { false }
  ) throws {
    self.scrubber = scrubber
    let started = ContinuousClock.now
    // The options as libpq resolved them (the conninfo, then a service file, then the
    // environment) decide how to connect; a conninfo libpq cannot parse fails here at once.
    var pointer = PQconnectStart(conninfo)
    var plan = (blocking: false, timeout: Self.defaultConnectTimeout)
    if let attempt = pointer, PQstatus(attempt) != CONNECTION_BAD {
      let options = Self.options(attempt)
      plan = Self.plan(options)
      if plan.blocking {
        PQfinish(attempt)
        // libpq's own timeout as the options set it, else 30 s (given before the conninfo, so
        // that its own value would win).
        pointer = options["connect_timeout"] == nil ? Self.connectBlocking(conninfo) : PQconnectdb(conninfo)
      }
    }
    guard let handle = pointer else {
      throw PostgresError(code: .connectionFailed, message: "libpq could not allocate a connection")
    }
    self.handle = handle
    // From here on `deinit` (which runs for an initialiser that throws once every property is
    // set) finishes the handle.
    if !plan.blocking {
      // Before the first poll: the notices of the session's start (a stored setting that no
      // longer applies) would otherwise go to standard error. (A FATAL error while starting
      // fails the connection; it is not a notice.)
      conveyor_pq_watch_notices(handle, sessionEnded)
      let timeout = Duration.seconds(plan.timeout)
      let giveUp = min(deadline ?? started + timeout, started + timeout)
      var waitFor = Int16(POLLOUT)  // before the first poll, as if it had asked to write
      while PQstatus(handle) != CONNECTION_BAD {
        // Looked at on every pass: a server that sends a byte now and then keeps the socket
        // ready, and must not keep the attempt alive.
        if isCancelled() { throw CancellationError() }
        let now = ContinuousClock.now
        if now >= giveUp {
          let limit = giveUp - started
          let seconds = Double(limit.components.seconds) + Double(limit.components.attoseconds) / 1e18
          throw PostgresError(
            code: .connectionFailed,
            message: "the server did not complete the connection within \(String(format: "%.1f", seconds)) s "
              + "(connect_timeout in the URL, 30 s without one, or once a call failed its reconnectTimeout, sets this)"
          )
        }
        let socket = PQsocket(handle)  // may change between polls (another address, SSL retry)
        if socket >= 0 {
          let left = giveUp - now
          let slice =
            left < .milliseconds(50) ? Int32(left.components.attoseconds / 1_000_000_000_000_000) + 1 : 50
          var descriptor = pollfd(fd: socket, events: waitFor, revents: 0)
          let ready = poll(&descriptor, 1, slice)
          if ready == 0 || (ready < 0 && errno == EINTR) { continue }
        }
        switch PQconnectPoll(handle) {
        case PGRES_POLLING_OK:
          return
        case PGRES_POLLING_READING: waitFor = Int16(POLLIN)
        case PGRES_POLLING_WRITING: waitFor = Int16(POLLOUT)
        default: break  // failed: the status is CONNECTION_BAD
        }
      }
    }
    guard PQstatus(handle) == CONNECTION_OK else {
      let message = scrubber.scrub(String(cString: PQerrorMessage(handle)))
      throw PostgresError(code: .connectionFailed, message: Self.trimmed(message))
    }
    conveyor_pq_watch_notices(handle, sessionEnded)
  }

  /// How to connect with `options` (as libpq resolved them): without blocking, giving up after
  /// `timeout` seconds; or through libpq's blocking connect, for several hosts (libpq gives each
  /// its own `connect_timeout`) or a `connect_timeout` libpq refuses (it then says so).
  static func plan(_ options: [String: String]) -> (blocking: Bool, timeout: Int) {
    if options["host"]?.contains(",") == true || options["hostaddr"]?.contains(",") == true {
      return (true, defaultConnectTimeout)
    }
    guard let text = options["connect_timeout"] else { return (false, defaultConnectTimeout) }
    // libpq's rule: an integer (strtol, after white space), then only white space; zero or less
    // is none, and less than 2 s is 2 s.
    let space: Set<Character> = [" ", "\t", "\n", "\r", "\u{0B}", "\u{0C}"]
    let digits = String(text.drop { space.contains($0) }.reversed().drop { space.contains($0) }.reversed())
    guard let seconds = Int32(digits) else { return (true, defaultConnectTimeout) }
    return (false, seconds > 0 ? max(Int(seconds), 2) : defaultConnectTimeout)
  }

  /// The connection's options that have a value, as libpq resolved them.
  private static func options(_ handle: OpaquePointer) -> [String: String] {
    guard let options = PQconninfo(handle) else { return [:] }
    defer { PQconninfoFree(options) }
    return values(of: options)
  }

  /// The options of a libpq option array (`PQconninfo`, `PQconninfoParse`) that have a value.
  static func values(of options: UnsafeMutablePointer<PQconninfoOption>) -> [String: String] {
    var found: [String: String] = [:]
    var option = options
    while let keyword = option.pointee.keyword {
      if let value = option.pointee.val { found[String(cString: keyword)] = String(cString: value) }
      option += 1
    }
    return found
  }

  /// libpq's blocking connect, with a `connect_timeout` of 30 s unless the conninfo sets one
  /// (array entries before the expanded conninfo are overridden by its own).
  private static func connectBlocking(_ conninfo: String) -> OpaquePointer? {
    let texts: [String] = ["connect_timeout", "dbname", String(defaultConnectTimeout), conninfo]
    let strings = texts.map { strdup($0) }
    defer { for string in strings { free(string) } }
    let keywords: [UnsafePointer<CChar>?] = [UnsafePointer(strings[0]), UnsafePointer(strings[1]), nil]
    let values: [UnsafePointer<CChar>?] = [UnsafePointer(strings[2]), UnsafePointer(strings[3]), nil]
    return PQconnectdbParams(keywords, values, 1)
  }

  deinit {
    PQfinish(handle)
    sessionEnded.deallocate()
  }

  /// Whether the connection is usable: reads what the server sent while it was idle (a
  /// termination notice from `pg_terminate_backend` or a shutdown), without blocking.
  var isHealthy: Bool {
    guard PQstatus(handle) == CONNECTION_OK else { return false }
    guard PQconsumeInput(handle) == 1 else { return false }
    // A server that ended the session while it was idle (`pg_terminate_backend`, a shutdown) sent
    // a FATAL message, which libpq takes for a notice, then closed the socket; libpq sees the close
    // only on its next read, after the next statement was sent (and a statement that may commit is
    // then reported as perhaps committed). The notice marks the session ended; a close without one
    // shows as the end of the socket, looked for without reading.
    // (`PQconsumeInput` only reads; `PQisBusy` parses what it read, and hands such a message to the
    // notice receiver.)
    _ = PQisBusy(handle)
    if sessionEnded.pointee != 0 || peerClosed { return false }
    // A transaction left open (its ROLLBACK failed) would swallow the next call's statements.
    return PQstatus(handle) == CONNECTION_OK && PQtransactionStatus(handle) == PQTRANS_IDLE
      && PQpipelineStatus(handle) == PQ_PIPELINE_OFF
  }

  /// Whether the server closed its end of the socket (end of file waits to be read).
  private var peerClosed: Bool {
    let socket = PQsocket(handle)
    guard socket >= 0 else { return true }
    var byte: UInt8 = 0
    let flags = Int32(MSG_PEEK) | Int32(MSG_DONTWAIT)
    return withUnsafeMutablePointer(to: &byte) { recv(socket, $0, 1, flags) } == 0
  }

  /// The object `PQcancel` uses to cancel this connection's running statement from another thread.
  func makeCancelHandle() -> OpaquePointer? { PQgetCancel(handle) }

  /// The connection's socket descriptor, or -1.
  var socketDescriptor: Int32 { PQsocket(handle) }

  /// Runs one statement with bound parameters and returns its rows in binary format.
  ///
  /// - Parameter prepared: Whether to prepare the statement once per connection and then only
  ///   execute it (the server may then plan it once for all values); false sends it whole and has
  ///   it planned for these values.
  @discardableResult
  func execute(_ sql: String, _ parameters: [PostgresValue] = [], prepared: Bool = true) throws -> QueryResult
  {
    if transactionSettings != nil && !inTransaction && sql != "BEGIN" {
      // Its own transaction through the pooler: the settings, then the statement, in one round trip.
      return try pipeline([(sql, parameters)])[0]
    }
    if sql != "ROLLBACK" && isCancelled() { throw CancellationError() }
    let mayCommit = !inTransaction || sql == "COMMIT"
    let (encoded, types, count, lengths, formats) = try Self.encode(parameters)
    // A statement with parameters is prepared once per connection and then only executed: the
    // store's statements are few and fixed, and parsing and planning one (the insert with its
    // trigger, the settlement's CTEs) cost more than running it.
    let name =
      encoded.isEmpty || !prepared || transactionSettings != nil ? nil : try prepare(sql, types: types)
    let result: OpaquePointer? = withPointers(to: encoded.map(\.bytes)) { values in
      if let name {
        PQexecPrepared(handle, name, count, values, lengths, formats, 1)
      } else {
        PQexecParams(handle, sql, count, types, values, lengths, formats, 1)
      }
    }
    guard let result else {
      lostDuringCommit = mayCommit
      throw connectionError(sql: sql)
    }
    switch PQresultStatus(result) {
    case PGRES_COMMAND_OK, PGRES_TUPLES_OK:
      return QueryResult(result)
    default:
      let error = serverError(result, sql: sql)
      PQclear(result)
      // A table changed under a prepared statement (a migration, an administrator's ALTER):
      // prepare every statement afresh; the caller runs the call again.
      if name != nil && error.isStalePreparedStatement { self.prepared.removeAll() }
      if error.isConnectionLoss || PQstatus(handle) != CONNECTION_OK { lostDuringCommit = mayCommit }
      throw error
    }
  }

  /// The name of `sql` prepared with these parameter types on this connection, preparing it the
  /// first time. Preparing commits nothing: a connection lost here leaves no doubt.
  private func prepare(_ sql: String, types: [UInt32]) throws -> String {
    let key = PreparedKey(sql: ExactText(sql), types: types)
    if let name = prepared[key] { return name }
    let name = "conveyor_\(preparedCount + 1)"
    // `execute` checked that the count fits the protocol's 16 bits.
    guard let result = PQprepare(handle, name, sql, Int32(truncatingIfNeeded: types.count), types) else {
      throw connectionError(sql: sql)
    }
    defer { PQclear(result) }
    guard PQresultStatus(result) == PGRES_COMMAND_OK else { throw serverError(result, sql: sql) }
    preparedCount += 1
    prepared[key] = name
    return name
  }

  /// The parameters in the protocol's binary form, checked against its limits before anything
  /// is sent: a parameter count in 16 bits, each length in 32.
  private static func encode(_ parameters: [PostgresValue]) throws -> (
    encoded: [(oid: UInt32, bytes: [UInt8]?)], types: [UInt32], count: Int32, lengths: [Int32],
    formats: [Int32]
  ) {
    let encoded = parameters.map(\.encoded)
    let types = encoded.map(\.oid)
    // The store's statements take a handful.
    guard let count = Int32(exactly: encoded.count), count <= 65_535 else {
      throw PostgresError(
        code: .valueTooLarge,
        message: "a statement with \(encoded.count) parameters is more than PostgreSQL takes (65,535)")
    }
    let lengths = try encoded.map { value -> Int32 in
      guard let length = Int32(exactly: value.bytes?.count ?? 0) else {
        throw PostgresError(
          code: .valueTooLarge,
          message: "a value of \(value.bytes?.count ?? 0) bytes is larger than PostgreSQL can take (2 GiB); "
            + "store large data elsewhere and queue a reference to it")
      }
      return length
    }
    return (encoded, types, count, lengths, [Int32](repeating: 1, count: encoded.count))
  }

  /// Runs statements with bound parameters in one round trip to the server (libpq's pipeline
  /// mode), as one transaction: they run in order, and the first that fails rolls back the ones
  /// before it and skips the rest. Returns each statement's rows, in order.
  ///
  /// Must not be called inside ``transaction(_:)``: the statements are their own transaction, which
  /// commits when the server reaches the end of the pipeline. A connection lost once they are sent
  /// leaves that commit unknown (``lostDuringCommit``).
  func pipeline(_ statements: [(sql: String, parameters: [PostgresValue])]) throws -> [QueryResult] {
    precondition(!inTransaction, "a pipeline is a transaction of its own")
    if isCancelled() { throw CancellationError() }
    // Through a transaction pooler: the transaction's settings first, and nothing prepared.
    let settings = transactionSettings.map { [(sql: $0, parameters: [PostgresValue]())] } ?? []
    let statements = settings + statements
    let encoded = try statements.map { statement in
      let parameters = try Self.encode(statement.parameters)
      // Prepared first (PQprepare cannot run in pipeline mode); a loss here commits nothing.
      let name = transactionSettings == nil ? try prepare(statement.sql, types: parameters.types) : nil
      return (name: name, sql: statement.sql, parameters: parameters)
    }
    guard PQenterPipelineMode(handle) == 1 else { throw connectionError(sql: statements.first?.sql) }
    defer { _ = PQexitPipelineMode(handle) }
    for (index, statement) in encoded.enumerated() {
      let sent = withPointers(to: statement.parameters.encoded.map(\.bytes)) { values in
        if let name = statement.name {
          PQsendQueryPrepared(
            handle, name, statement.parameters.count, values, statement.parameters.lengths,
            statement.parameters.formats, 1)
        } else {
          PQsendQueryParams(
            handle, statement.sql, statement.parameters.count, statement.parameters.types, values,
            statement.parameters.lengths, statement.parameters.formats, 1)
        }
      }
      guard sent == 1 else {
        lostDuringCommit = true
        throw connectionError(sql: statements[index].sql)
      }
    }
    guard PQpipelineSync(handle) == 1 else {
      lostDuringCommit = true
      throw connectionError(sql: statements.last?.sql)
    }
    var results: [QueryResult] = []
    var failure: PostgresError?
    for (index, statement) in statements.enumerated() {
      // One result per statement, then NULL; an aborted one (after a failure) has no rows.
      while let result = PQgetResult(handle) {
        let status = PQresultStatus(result)
        if (status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK) && results.count == index {
          results.append(QueryResult(result))  // owns the result from here
          continue
        }
        if status != PGRES_PIPELINE_ABORTED && failure == nil {
          failure = serverError(result, sql: statement.sql)
        }
        PQclear(result)
      }
    }
    let sync = PQgetResult(handle)
    let synced = sync.map { PQresultStatus($0) == PGRES_PIPELINE_SYNC } ?? false
    if let sync { PQclear(sync) }
    if PQstatus(handle) != CONNECTION_OK || !synced || (failure?.isConnectionLoss ?? false) {
      // The end of the pipeline (the commit) may or may not have been reached.
      lostDuringCommit = true
      if var failure {
        failure.code = .connectionFailed
        throw failure
      }
      throw connectionError(sql: statements.last?.sql)
    }
    if let failure {
      if failure.isStalePreparedStatement { prepared.removeAll() }
      throw failure
    }
    guard results.count == statements.count else {
      throw PostgresError(
        code: .protocolViolation,
        message: "the server answered \(results.count) of \(statements.count) statements")
    }
    return Array(results.dropFirst(settings.count))
  }

  /// Runs a script of several statements without parameters (the simple query protocol): for
  /// migrations and `LISTEN`.
  func executeScript(_ sql: String) throws {
    if isCancelled() { throw CancellationError() }
    guard let result = PQexec(handle, sql) else { throw connectionError(sql: sql) }
    defer { PQclear(result) }
    switch PQresultStatus(result) {
    case PGRES_COMMAND_OK, PGRES_TUPLES_OK, PGRES_EMPTY_QUERY: return
    default: throw serverError(result, sql: sql)
    }
  }

  /// Runs `body` in a transaction: commits when it returns, rolls back when it throws.
  func transaction<T>(_ body: () throws -> T) throws -> T {
    try execute("BEGIN")
    inTransaction = true
    if let transactionSettings {
      do {
        try execute(transactionSettings)
      } catch {
        if PQstatus(handle) == CONNECTION_OK { _ = try? execute("ROLLBACK") }
        inTransaction = false
        throw error
      }
    }
    do {
      let value = try body()
      try execute("COMMIT")
      inTransaction = false
      return value
    } catch {
      // Best effort: the body's error is what the caller needs; a failed ROLLBACK means the
      // connection broke, and the server rolls the transaction back itself.
      if PQstatus(handle) == CONNECTION_OK { _ = try? execute("ROLLBACK") }
      inTransaction = false
      throw error
    }
  }

  private func connectionError(sql: String?) -> PostgresError {
    PostgresError(
      code: .connectionFailed, message: Self.trimmed(scrubber.scrub(String(cString: PQerrorMessage(handle)))),
      sql: sql)
  }

  private func serverError(_ result: OpaquePointer, sql: String) -> PostgresError {
    let state = conveyor_pq_sqlstate(result).map { String(cString: $0) }
    let message = String(cString: PQresultErrorMessage(result))
    let primary = conveyor_pq_primary_message(result).map { String(cString: $0) }
    let detail = message == primary ? nil : Self.trimmed(scrubber.scrub(message))
    var error = PostgresError(
      code: .server, message: Self.trimmed(scrubber.scrub(primary ?? message)), sqlState: state, sql: sql,
      detail: detail)
    if state == nil || PQstatus(handle) != CONNECTION_OK {
      error.code = .connectionFailed
    }
    return error
  }

  /// libpq's message on one line: each line break, with the tabs that indent the next line,
  /// becomes one space (the rest is kept as it is: a detail can quote data).
  static func trimmed(_ message: String) -> String {
    message.trimmingCharacters(in: .whitespacesAndNewlines)
      .split(omittingEmptySubsequences: false, whereSeparator: \.isNewline)
      .map { $0.drop(while: { $0 == "\t" }) }.joined(separator: " ")
  }
}

/// Calls `body` with C pointers to the byte arrays (NULL for nil), valid during the call.
private func withPointers<R>(
  to arrays: [[UInt8]?], _ body: ([UnsafePointer<CChar>?]) -> R
) -> R {
  var pointers: [UnsafePointer<CChar>?] = []
  pointers.reserveCapacity(arrays.count)
  func recurse(_ index: Int) -> R {
    guard index < arrays.count else { return body(pointers) }
    guard let bytes = arrays[index] else {
      pointers.append(nil)
      return recurse(index + 1)
    }
    // An empty value still needs a non-NULL pointer (NULL means SQL NULL).
    let storage = bytes.isEmpty ? [0] : bytes
    return storage.withUnsafeBufferPointer { buffer in
      buffer.baseAddress!.withMemoryRebound(to: CChar.self, capacity: buffer.count) { pointer in
        pointers.append(pointer)
        return recurse(index + 1)
      }
    }
  }
  return recurse(0)
}

/// Removes a password from messages: libpq may quote part of a connection string it cannot parse.
struct Scrubber: Sendable {
  private let secrets: [String]

  init(secrets: [String]) {
    self.secrets = secrets.filter { $0.count >= 1 }.sorted { $0.count > $1.count }
  }

  func scrub(_ message: String) -> String {
    secrets.reduce(message) { $0.replacingOccurrences(of: $1, with: "***") }
  }
}
