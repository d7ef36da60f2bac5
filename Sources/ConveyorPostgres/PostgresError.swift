/// An error from ``PostgresJobStore``: a failed connection, a failed statement, or a database
/// this build cannot use.
///
/// ``description`` is safe to log and show: it never includes a password (libpq's messages are
/// scrubbed of the one the store was given) nor a bound value. ``debugDescription`` adds the
/// statement's SQL text and the server's detail and hint.
///
/// ```swift
/// do { _ = try await store.counts(queue: "mail", clock: SystemJobClock()) }
/// catch let error as PostgresError where error.code == .connectionFailed { /* the server is down */ }
/// ```
public struct PostgresError: Error, Sendable, Hashable, CustomStringConvertible, CustomDebugStringConvertible
{
  /// What kind of failure; new codes may be added without breaking the API.
  public struct Code: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    /// The code's name.
    public var rawValue: String

    /// Wraps a code name.
    public init(rawValue: String) { self.rawValue = rawValue }

    /// The code's name.
    public var description: String { rawValue }

    /// The connection could not be opened, or broke and could not be opened again in time.
    public static let connectionFailed = Code(rawValue: "connectionFailed")
    /// The server reported an error for a statement (see ``PostgresError/sqlState``).
    public static let server = Code(rawValue: "server")
    /// The database holds a Conveyor schema newer than this build knows; it was left untouched.
    public static let newerSchema = Code(rawValue: "newerSchema")
    /// A schema name that is not a plain identifier (`[a-z_][a-z0-9_]*`, at most 63 bytes).
    public static let invalidSchemaName = Code(rawValue: "invalidSchemaName")
    /// An option of ``PostgresJobStore/Options`` is out of range (the message names it).
    public static let invalidOptions = Code(rawValue: "invalidOptions")
    /// The connection URL or conninfo string could not be parsed.
    public static let invalidURL = Code(rawValue: "invalidURL")
    /// The connection broke while a transaction was committing, so whether it committed is
    /// unknown (only reported for ``PostgresJobStore/enqueue(_:queue:clock:)``, which is not
    /// retried because a retry could add the jobs twice).
    public static let commitUnknown = Code(rawValue: "commitUnknown")
    /// The server answered with something the store did not expect.
    public static let protocolViolation = Code(rawValue: "protocolViolation")
    /// The store was closed with ``PostgresJobStore/close()``.
    public static let closed = Code(rawValue: "closed")
    /// A call got no answer within ``PostgresJobStore/Options/callTimeout`` (a server that
    /// stopped answering, a network cut, or a statement waiting on another session's lock with
    /// ``PostgresJobStore/Options/lockTimeout`` zero), and no answer on a new connection before
    /// ``PostgresJobStore/Options/reconnectTimeout`` either.
    public static let timedOut = Code(rawValue: "timedOut")
    /// A value (a payload, a key) is larger than the protocol can send (2 GiB); nothing was sent.
    public static let valueTooLarge = Code(rawValue: "valueTooLarge")
  }

  /// What kind of failure.
  public var code: Code
  /// What went wrong, scrubbed of passwords.
  public var message: String
  /// The server's five-character SQLSTATE, when the server reported the error.
  public var sqlState: String?
  /// The statement that failed, without bound values (only in ``debugDescription``).
  public var sql: String?
  /// The server's detail and hint, if any (only in ``debugDescription``: a detail can quote data).
  public var detail: String?

  /// Creates an error.
  public init(code: Code, message: String, sqlState: String? = nil, sql: String? = nil, detail: String? = nil)
  {
    self.code = code
    self.message = message
    self.sqlState = sqlState
    self.sql = sql
    self.detail = detail
  }

  /// What went wrong, without the SQL text, bound values or passwords.
  public var description: String {
    var text = "PostgreSQL"
    if let sqlState { text += " error \(sqlState)" }
    text += ": \(message)"
    if let advice { text += (message.last.map { ".?!".contains($0) } == true ? " " : ". ") + advice }
    return text
  }

  /// ``description`` plus the SQL text and the server's detail.
  public var debugDescription: String {
    var text = "\(description) [code \(code)]"
    if let detail { text += " — detail: \(detail)" }
    if let sql { text += " — while executing `\(sql)`" }
    return text
  }

  /// A hint for the failures a person can act on.
  var advice: String? {
    switch code {
    case .connectionFailed:
      return "Check that the server is running and reachable, and the URL's host, port, user and database"
    case .timedOut:
      return "Check that the server answers (a busy or frozen host, a long lock), or raise callTimeout"
    case .newerSchema:
      return "Upgrade Conveyor to use this database"
    default:
      return nil
    }
  }

  /// Whether the failure means the connection is gone (class 08, or the server shutting down).
  var isConnectionLoss: Bool {
    if code == .connectionFailed || code == .timedOut { return true }
    guard let sqlState else { return false }
    return sqlState.hasPrefix("08") || ["57P01", "57P02", "57P03"].contains(sqlState)
  }

  /// Whether a prepared statement failed because a table it reads changed under it (SQLSTATE
  /// 0A000, "cached plan must not change result type"): the connection forgets its prepared
  /// statements, and the call runs once more.
  var isStalePreparedStatement: Bool { sqlState == "0A000" }
}
