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
  public static func problem(_ key: String) -> String? {
    let bytes = key.utf8.count
    if bytes == 0 { return "an ordering key cannot be empty; pass nil for a job without one" }
    if bytes > maximumBytes {
      return "an ordering key is at most \(maximumBytes) UTF-8 bytes, this one has \(bytes); pass a shorter "
        + "key (an ID or a hash of a long one)"
    }
    if key.utf8.contains(0) { return "an ordering key cannot contain NUL (U+0000)" }
    return nil
  }

  /// Throws ``JobQueueError/invalidOrderingKey(_:)`` for the first job whose key is refused.
  package static func check(_ jobs: [NewJob]) throws {
    for job in jobs {
      if let key = job.orderingKey, let problem = problem(key) {
        throw JobQueueError.invalidOrderingKey(problem)
      }
    }
  }
}
