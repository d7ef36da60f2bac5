import Conveyor
import ConveyorTestSupport
import Foundation
import Testing

/// Review: queue names and keys are compared byte for byte in the in-memory store, as SQLite and
/// PostgreSQL compare (and sort) them.
@Suite("Review exact text (in memory)")
struct ReviewExactTextTests {
  private let t0 = Date(timeIntervalSince1970: 1_700_000_000)

  private func job(_ text: String, key: String? = nil) -> NewJob {
    NewJob(payload: Data(text.utf8), runAt: t0, deduplicationKey: key)
  }

  /// `queueNames()` is "sorted": SQLite (`ORDER BY name`, BINARY) and PostgreSQL
  /// (`ORDER BY name COLLATE "C"`) sort by bytes. The in-memory store sorts by `String`'s order,
  /// which compares the NFC form: "e\u{301}" (bytes 65 CC 81) comes after "f" (66) there, before
  /// it in both databases.
  @Test func queueNamesAreSortedByBytesAsTheDatabasesSortThem() async throws {
    let store = InMemoryJobStore()
    let decomposed = "e\u{301}"
    for queue in ["f", decomposed] {
      _ = try await store.enqueue([job(queue)], queue: queue, now: t0)
    }
    let names = try await store.queueNames()
    let expected = [decomposed, "f"]
    #expect(
      names.map { Array($0.utf8) } == expected.map { Array($0.utf8) },
      "listed \(names.map { $0.unicodeScalars.map(\.value) }), byte order is \(expected.map { $0.unicodeScalars.map(\.value) })"
    )
  }

  /// Held: the documented semantics with keys of odd content (empty, NUL, noncharacters, long),
  /// and equivalent variants kept apart.
  @Test func oddKeysKeepTheSemantics() async throws {
    let store = InMemoryJobStore()
    let keys = [
      "", "\0", "a\0b", "a\u{FFFD}b", "\u{FFFF}", "\u{10FFFF}", "\u{FEFF}k", "k",
      "\u{212A}", "K", "\u{1100}\u{1161}", "\u{AC00}", "a\u{323}\u{307}", "a\u{307}\u{323}",
      String(repeating: "x", count: 100_000), String(repeating: "x", count: 100_001),
    ]
    let first = try await store.enqueue(keys.map { job($0, key: $0) }, queue: "q", now: t0)
    #expect(first.allSatisfy { $0.inserted })
    #expect(Set(first.map(\.id)).count == keys.count)
    let again = try await store.enqueue(keys.reversed().map { job($0, key: $0) }, queue: "q", now: t0)
    #expect(again.map(\.id) == first.map(\.id).reversed())
    #expect(again.allSatisfy { !$0.inserted })
  }
}
