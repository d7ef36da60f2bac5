import Foundation

/// The rules an ordering key (``NewJob/orderingKey``, ``Queueable/orderingKey``) follows.
///
/// A key is 1 to ``maximumBytes`` UTF-8 bytes with no NUL character. Keys are compared byte for
/// byte, within one queue. Every store refuses any other key with
/// ``JobQueueError/invalidOrderingKey(_:)`` and stores nothing of the call.
public enum OrderingKey {
  /// The longest key, in UTF-8 bytes: room for an order number, a URL's host or a tenant's name,
  /// and small enough for every store's index.
  public static let maximumBytes = 512

  /// Why `key` cannot be an ordering key, or nil when it can.
  public static func problem(_ key: String) -> String? { KeyRules.problem(key, kind: "an ordering key") }

  /// Throws ``JobQueueError/invalidOrderingKey(_:)`` for the first job whose key is refused.
  package static func check(_ jobs: [NewJob]) throws {
    for job in jobs {
      if let key = job.orderingKey, let problem = problem(key) {
        throw JobQueueError.invalidOrderingKey(problem)
      }
      if let key = job.limitKey, let problem = LimitKey.problem(key) {
        throw JobQueueError.invalidLimitKey(problem)
      }
    }
  }
}

/// The rules a limit key (``NewJob/limitKey``, ``Queueable/limitKey``, and the keys of
/// ``QueueLimits/keyConcurrencyOverrides``) follows: those of an ``OrderingKey``.
///
/// A key is 1 to ``maximumBytes`` UTF-8 bytes with no NUL character, compared byte for byte
/// within one queue. Every store refuses any other key of a job with
/// ``JobQueueError/invalidLimitKey(_:)`` and stores nothing of the call.
public enum LimitKey {
  /// The longest key, in UTF-8 bytes: room for a URL's host or a tenant's name.
  public static let maximumBytes = OrderingKey.maximumBytes

  /// Why `key` cannot be a limit key, or nil when it can.
  public static func problem(_ key: String) -> String? { KeyRules.problem(key, kind: "a limit key") }

  /// `key` for a message: control characters escaped, cut to 100 characters.
  package static func printable(_ key: String) -> String {
    let escaped = key.unicodeScalars.map { scalar -> String in
      scalar.properties.generalCategory == .control ? scalar.escaped(asASCII: true) : String(scalar)
    }
    let joined = escaped.joined()
    return joined.count > 100 ? String(joined.prefix(100)) + "…" : joined
  }
}

/// The rules ordering and limit keys share.
private enum KeyRules {
  static func problem(_ key: String, kind: String) -> String? {
    let bytes = key.utf8.count
    if bytes == 0 { return "\(kind) cannot be empty; pass nil for a job without one" }
    if bytes > OrderingKey.maximumBytes {
      return "\(kind) is at most \(OrderingKey.maximumBytes) UTF-8 bytes, this one has \(bytes); pass a "
        + "shorter key (an ID or a hash of a long one)"
    }
    if key.utf8.contains(0) { return "\(kind) cannot contain NUL (U+0000)" }
    return nil
  }
}
