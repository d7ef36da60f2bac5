import Conveyor
import Foundation
import Testing

@testable import ConveyorBismuth

/// `Config.queueName`: the name a queue's jobs are stored under, one per identifier.
@Suite("Bismuth: one queue name per identifier")
struct QueueNameTests {
  private func name(_ identifier: String) -> String {
    Bismuth.Config(identifier: identifier).queueName
  }

  @Test("an identifier that is a valid queue name is the name, as databases already store it")
  func validIdentifiersKeepTheirNames() {
    for identifier in ["api-requests", "a", "uploads_wifi", "v1.2", String(repeating: "x", count: 128)] {
      #expect(name(identifier) == identifier)
    }
  }

  @Test("identifiers that differ only in replaced characters get different valid names")
  func replacedCharactersStayApart() throws {
    let names = ["uploads (wifi)", "uploads [wifi]", "uploads {wifi}", "uploads_(wifi)", "uploads__wifi_"]
      .map(name)
    #expect(Set(names).count == names.count)
    for name in names { try JobQueueConfiguration.validate(identifier: name) }
    // Readable, and fixed by the identifier alone (the same on every platform and launch).
    #expect(name("uploads (wifi)") == "uploads__wifi_-71ae37d5fffe552b")
  }

  @Test("long identifiers that differ after 128 characters get different names of at most 128")
  func longIdentifiersStayApart() throws {
    let prefix = String(repeating: "a", count: 130)
    let first = name(prefix + "1")
    let second = name(prefix + "2")
    #expect(first != second)
    #expect(first.count <= 128 && second.count <= 128)
    try JobQueueConfiguration.validate(identifier: first)
  }

  @Test("spellings of one identifier that Swift calls equal give one name; the empty one a valid name")
  func equalSpellingsShareAName() throws {
    let composed = "caf\u{E9}"
    let decomposed = "cafe\u{301}"
    #expect(composed == decomposed)
    #expect(name(composed) == name(decomposed))
    #expect(name(composed) != name("caf_"))
    try JobQueueConfiguration.validate(identifier: name(""))
  }
}
