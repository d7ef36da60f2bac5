import Conveyor
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
    /// The queue's name. An identifier that is a valid Conveyor queue name (1 to 128 characters
    /// of `A-Z a-z 0-9 . _ -`) is the queue's name in its database as it is. Any other identifier
    /// gets a name of its own: its characters outside that set replaced by `_`, cut to 111
    /// characters, then `-` and 16 hexadecimal digits of a hash of the whole identifier, so that
    /// two identifiers never share a queue by accident ("uploads (wifi)" and "uploads [wifi]"
    /// are two queues).
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

    /// ``identifier`` made a valid Conveyor queue name, one per identifier: a valid name as it
    /// is (the name an existing database knows it by), any other identifier readable and with
    /// a hash of it, so that no two identifiers an app would use map to one queue.
    var queueName: String {
      do {
        try JobQueueConfiguration.validate(identifier: identifier)
        return identifier
      } catch {
        // Not a valid name as it is: made one below.
      }
      // Canonically equivalent spellings (é as one scalar or two) are one identifier, as for `==`.
      let normalized = identifier.precomposedStringWithCanonicalMapping
      let hash = String(Self.fnv1a64(normalized.utf8), radix: 16)
      let suffix = "-" + String(repeating: "0", count: 16 - hash.count) + hash
      let allowed = Set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
      let readable = String(normalized.map { allowed.contains($0) ? $0 : "_" }.prefix(128 - suffix.count))
      return (readable.isEmpty ? "bismuth" : readable) + suffix
    }

    /// The 64-bit FNV-1a hash of `bytes`: fixed by its definition, so the same on every platform,
    /// process and release (unlike `Hasher`, which is seeded per process).
    static func fnv1a64(_ bytes: some Sequence<UInt8>) -> UInt64 {
      var hash: UInt64 = 0xcbf2_9ce4_8422_2325
      for byte in bytes {
        hash ^= UInt64(byte)
        hash = hash &* 0x0000_0100_0000_01b3
      }
      return hash
    }
  }
}
