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
      if let key = job.fairnessKey, let problem = FairnessKey.problem(key, orderingKey: job.orderingKey) {
        throw JobQueueError.invalidFairnessKey(problem)
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

/// The rules a fairness key (``NewJob/fairnessKey``, ``Queueable/fairnessKey``) follows: those of
/// an ``OrderingKey``, and a job with one has no ordering key.
///
/// A key is 1 to ``maximumBytes`` UTF-8 bytes with no NUL character, compared byte for byte
/// within one queue. Every store refuses any other key of a job with
/// ``JobQueueError/invalidFairnessKey(_:)`` and stores nothing of the call.
public enum FairnessKey {
  /// The longest key, in UTF-8 bytes: room for a tenant's name or ID.
  public static let maximumBytes = OrderingKey.maximumBytes

  /// Why `key` cannot be a fairness key, or nil when it can.
  public static func problem(_ key: String) -> String? { KeyRules.problem(key, kind: "a fairness key") }

  /// Why a job cannot carry the fairness key `key` with the ordering key `orderingKey`, or nil.
  ///
  /// An ordering key already runs its jobs one at a time, each taking the key's place when the
  /// one before it finishes; a turn among fairness keys would be taken then, outside the claims
  /// that keep turns, so the two are not combined yet.
  package static func problem(_ key: String, orderingKey: String?) -> String? {
    if let problem = problem(key) { return problem }
    if orderingKey != nil {
      return "a job cannot carry both an ordering key and a fairness key yet; drop one (an ordering "
        + "key's jobs already run one at a time)"
    }
    return nil
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
