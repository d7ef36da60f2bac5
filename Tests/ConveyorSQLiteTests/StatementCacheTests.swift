import Conveyor
import ConveyorTestSupport
import Foundation
import Testing

@testable import ConveyorSQLite

/// `Connection.statement(_:)` keeps prepared statements by their SQL text (a short `recent` list,
/// then a dictionary): texts that Swift's `==` calls equal but whose bytes differ are different
/// statements.
@Suite("SQLite connection: the statement cache", .timeLimit(.minutes(10)))
struct StatementCacheTests {
  /// The text `sql` returns as its first column, as UTF-8 bytes.
  static func bytes(_ db: Connection, _ sql: String) throws -> [UInt8] {
    var result: [UInt8] = []
    try db.query(sql) { row in result = Array((row.text(0) ?? "").utf8) }
    return result
  }

  /// Two SQL texts that Swift's `==` calls equal (canonically equivalent: the same two combining
  /// marks in either order) but that are different texts of the same UTF-8 length. The statement
  /// returned for the second must be the second's, not the first's from `recent`.
  @Test func canonicallyEquivalentTextsOfEqualLengthGetTheirOwnStatements() throws {
    let folder = try TemporaryFolder()
    let db = try Connection(path: folder.path("stmt.sqlite"), create: true)
    defer { db.close() }
    let first = "SELECT 'e\u{301}\u{323}'"
    let second = "SELECT 'e\u{323}\u{301}'"
    #expect(first == second && first.utf8.count == second.utf8.count)
    #expect(Array(first.utf8) != Array(second.utf8))
    let a = try Self.bytes(db, first)
    let b = try Self.bytes(db, second)
    #expect(a == Array("e\u{301}\u{323}".utf8))
    #expect(
      b == Array("e\u{323}\u{301}".utf8),
      "the statement for the second text returned \(b), the first text's bytes")
    #expect(Array(try db.statement(second).sql.utf8) == Array(second.utf8))
  }

  /// The same with texts of different lengths (precomposed and decomposed é), found once the
  /// first has left `recent`: the dictionary behind it.
  @Test func canonicallyEquivalentTextsOfDifferentLengthGetTheirOwnStatements() throws {
    let folder = try TemporaryFolder()
    let db = try Connection(path: folder.path("stmt.sqlite"), create: true)
    defer { db.close() }
    let composed = "SELECT '\u{e9}'"
    let decomposed = "SELECT 'e\u{301}'"
    #expect(composed == decomposed && composed.utf8.count != decomposed.utf8.count)
    #expect(try Self.bytes(db, composed) == Array("\u{e9}".utf8))
    let got = try Self.bytes(db, decomposed)
    #expect(got == Array("e\u{301}".utf8), "decomposed text answered \(got)")
  }
}
