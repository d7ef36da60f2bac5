import Conveyor
import ConveyorSQLite
import ConveyorTestSupport
import Foundation
import Testing

@testable import ConveyorNetworking

#if canImport(FoundationNetworking)
  import FoundationNetworking
#endif

/// Random strings as URLs, methods, header names and values, deduplication keys and queue names:
/// nothing traps, and everything is either refused with an error or stored and read back exactly.
@Suite("Fuzzing HTTP requests and their storage", .timeLimit(.minutes(10)))
struct HTTPFuzzTests {
  /// A deterministic generator, so a failure repeats.
  struct Generator: RandomNumberGenerator {
    var state: UInt64
    mutating func next() -> UInt64 {
      state &+= 0x9E37_79B9_7F4A_7C15
      var value = state
      value = (value ^ (value >> 30)) &* 0xBF58_476D_1CE4_E5B9
      value = (value ^ (value >> 27)) &* 0x94D0_49BB_1331_11EB
      return value ^ (value >> 31)
    }
  }

  /// Random text leaning on what breaks parsers: controls, NUL, CR, LF, separators, non-ASCII,
  /// and lone bytes decoded as UTF-8 (replacement characters).
  static func text(_ random: inout Generator, maximumLength: Int = 24) -> String {
    let alphabet: [Unicode.Scalar] = [
      "\0", "\r", "\n", "\t", " ", ":", "/", "?", "#", "%", "@", "\"", "\\", "\u{1B}", "\u{7F}", "\u{85}",
      "\u{9B}", "é", "€", "😀", "\u{2028}", "\u{FEFF}", "a", "Z", "0", "-", "_", ".", "~",
    ]
    let length = Int.random(in: 0...maximumLength, using: &random)
    var scalars = String.UnicodeScalarView()
    for _ in 0..<length {
      switch Int.random(in: 0..<4, using: &random) {
      case 0: scalars.append(alphabet.randomElement(using: &random)!)
      case 1: scalars.append(Unicode.Scalar(UInt8.random(in: 0x20...0x7E, using: &random)))
      default:
        let bytes = (0..<Int.random(in: 1...3, using: &random)).map { _ in
          UInt8.random(in: 0...255, using: &random)
        }
        scalars.append(contentsOf: String(decoding: bytes, as: UTF8.self).unicodeScalars)
      }
    }
    return String(scalars)
  }

  @Test func randomRequestsAreValidatedWithoutTrappingAndValidOnesAreSafeOnTheWire() {
    var random = Generator(state: 8)
    var accepted = 0
    for round in 0..<4000 {
      let urlText =
        round % 3 == 0
        ? "http://127.0.0.1:\(Int.random(in: -5...70_000, using: &random))/" + Self.text(&random)
        : Self.text(&random, maximumLength: 40)
      let url = URL(string: urlText) ?? URL(string: "http://127.0.0.1/")!
      let method = round % 2 == 0 ? Self.text(&random, maximumLength: 8) : "POST"
      let headers = [Self.text(&random, maximumLength: 10): Self.text(&random)]
      let request = HTTPRequest(
        method: method, url: url, headers: headers, body: round % 5 == 0 ? Data([0, 1]) : nil,
        timeout: round % 7 == 0 ? Double.random(in: -10...1e10, using: &random) : nil)
      do {
        try request.validate()
      } catch {
        #expect(!error.description.isEmpty)
        continue
      }
      accepted += 1
      // What validation let through cannot break a request line or a header line.
      #expect(!request.method.unicodeScalars.contains { $0.value <= 0x20 || $0.value >= 0x7F })
      for (name, value) in request.headers {
        #expect(!name.unicodeScalars.contains { $0.value <= 0x20 || $0.value >= 0x7F || $0 == ":" })
        #expect(!value.unicodeScalars.contains { $0 == "\r" || $0 == "\n" || $0 == "\0" })
      }
      #expect(["http", "https"].contains(request.url.scheme))
      _ = request.urlRequest
    }
    #expect(accepted > 0)
  }

  @Test func randomKeysQueueNamesAndPayloadsAreStoredExactlyOrRefused() async throws {
    var random = Generator(state: 9)
    let folder = try TemporaryFolder()
    let store = try SQLiteJobStore(path: folder.file("fuzz.sqlite").path)
    var queues: [String: JobQueue<HTTPRequest>] = [:]
    var expected: [String: [HTTPRequest]] = [:]
    for round in 0..<2000 {
      let name = round % 10 == 0 ? Self.text(&random, maximumLength: 12) : "fuzz"
      do {
        try JobQueueConfiguration.validate(identifier: name)
      } catch {
        #expect(!"\(error)".isEmpty)
        continue
      }
      let queue: JobQueue<HTTPRequest>
      if let existing = queues[name] {
        queue = existing
      } else {
        queue = try JobQueue(
          configuration: .init(identifier: name, autoStart: false), store: store, delivery: HTTPDelivery())
        queues[name] = queue
      }
      let key = Self.text(&random)
      let request = HTTPRequest(
        method: "PUT", url: URL(string: "http://127.0.0.1:1/\(round)")!,
        headers: ["X-Fuzz": Self.text(&random)],
        body: Data(Self.text(&random, maximumLength: 64).utf8), deduplicationKey: key)
      if expected[name, default: []].contains(where: { $0.deduplicationKey == key }) { continue }
      _ = try await queue.add(request)
      expected[name, default: []].append(request)
    }
    for (name, queue) in queues {
      let stored = try await queue.jobs(in: .pending, limit: 10_000).map { try queue.item(of: $0) }
      #expect(stored == expected[name, default: []], "queue \(name.debugDescription)")
    }
    await store.close()
  }
}
