/// Text compared and hashed by its UTF-8 bytes, as SQLite and PostgreSQL compare it: for the
/// stores' caches of prepared statements, and for queue names and deduplication keys held in
/// memory.
///
/// `String` compares canonically equivalent texts as equal, such as a precomposed and a decomposed
/// "é": as SQL they are different statements, and must not share a prepared one; as queue names
/// or keys they are two queues or two keys in a database, and must be in memory too.
package struct ExactText: Hashable, Comparable, Sendable {
  package let text: String

  package init(_ text: String) { self.text = text }

  package static func == (a: ExactText, b: ExactText) -> Bool {
    guard a.text.utf8.count == b.text.utf8.count else { return false }
    // The same storage (the same string constant, as the hot calls pass) is equal at once.
    let same = a.text.utf8.withContiguousStorageIfAvailable { first in
      b.text.utf8.withContiguousStorageIfAvailable { second in
        first.baseAddress == second.baseAddress || first.elementsEqual(second)
      }
    }
    return (same ?? nil) ?? a.text.utf8.elementsEqual(b.text.utf8)
  }

  package func hash(into hasher: inout Hasher) {
    let hashed: Void? = text.utf8.withContiguousStorageIfAvailable {
      hasher.combine(bytes: UnsafeRawBufferPointer($0))
    }
    if hashed == nil { for byte in text.utf8 { hasher.combine(byte) } }
  }

  /// Byte order, as SQLite (`ORDER BY` a text column) and PostgreSQL (`COLLATE "C"`) sort.
  package static func < (a: ExactText, b: ExactText) -> Bool {
    a.text.utf8.lexicographicallyPrecedes(b.text.utf8)
  }
}
