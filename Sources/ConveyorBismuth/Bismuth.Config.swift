import Foundation

extension Bismuth {
  /// A queue's settings: the old library's names and defaults, plus where the database lives.
  ///
  /// ```swift
  /// var config = Bismuth.Config(identifier: "api-requests")
  /// config.logProxy = { line in print("[REQ] \(line)") }
  /// config.autoStart = false       // Default: true
  /// config.canRunInBackground = false  // Default: true
  /// config.retryTime = 30          // Default: 15
  /// ```
  public struct Config: Sendable {
    /// The queue's name in its database. Characters outside `A-Z a-z 0-9 . _ -` are replaced by
    /// `_` and the name is cut to 128 characters (Conveyor's rule for queue names).
    public let identifier: String
    /// Seconds before an item answered with ``Bismuth/HandleResult/retry`` is handled again.
    /// Default 15. Other items are handled meanwhile.
    public var retryTime: TimeInterval = 15
    /// Whether the queue starts handling items as soon as it is created (and a delegate is set).
    /// Default true; false waits for ``Bismuth/Queue/start()``.
    public var autoStart: Bool = true
    /// Where UIKit exists: whether the queue asks the system for background time while items are
    /// being handled. Default true. Elsewhere it has no effect.
    public var canRunInBackground: Bool = true
    /// Receives the queue's debug log lines. Item contents are never logged. Default nil.
    ///
    /// Called on the queue's threads (one of them serves the synchronous calls): print or hand
    /// the line on, but do not call the queue's synchronous methods from here.
    public var logProxy: (@Sendable (String) -> Void)?
    /// The SQLite database file. Nil (the default) means Conveyor's default database,
    /// `SQLiteJobStore.defaultDatabaseURL()` (`$XDG_DATA_HOME/conveyor/conveyor.sqlite` on
    /// Linux, Application Support on Apple platforms: never a cache folder). Several queues may
    /// share one file.
    public var databaseURL: URL?
    /// Attempts after which a failing item is given up (kept as a dead job in the database).
    /// Default nil: retried forever, as before.
    public var maxAttempts: Int?

    /// The old library's name for ``retryTime``.
    @available(*, deprecated, renamed: "retryTime")
    public var reryTimeInterval: TimeInterval {
      get { retryTime }
      set { retryTime = newValue }
    }

    /// Creates a configuration with the defaults above.
    ///
    /// - Parameter identifier: the queue's name; one database may hold many queues.
    public init(identifier: String) {
      self.identifier = identifier
    }

    /// ``identifier`` made a valid Conveyor queue name.
    var queueName: String {
      let allowed = Set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
      let name = String(identifier.map { allowed.contains($0) ? $0 : "_" }.prefix(128))
      return name.isEmpty ? "bismuth" : name
    }
  }
}
