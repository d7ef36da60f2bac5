import Conveyor
import ConveyorNetworking
import Foundation
import Testing

@testable import ConveyorDashboard
@testable import conveyor

/// What listings and pages show is bounded in bytes whatever the stored text holds, and says
/// where it was cut.
@Suite struct ShownTextTests {
  /// Cutting counts Unicode scalars, which have a bound in bytes, where a Character has none.
  @Test func cuttingBoundsBytesAndNeverSplitsAScalar() {
    let letter = "a" + String(repeating: "\u{301}", count: 60_000)
    #expect(letter.count == 1)
    let shown = cut(letter, to: 300)
    #expect(shown.unicodeScalars.count == 301 && shown.hasSuffix("…"))
    #expect(shown.utf8.count <= 300 * 4 + 3)
    #expect(cut("😀é", to: 1) == "😀…")
    #expect(cut("😀é", to: 2) == "😀é")
    #expect(cut("", to: 0) == "" && cut("x", to: 0) == "…")
  }

  /// The wait for a rate's next start is shown for any duration, the longest and a negative one
  /// included (a clock stepped back), without a trap: `Int(seconds)` of `Duration`'s largest value
  /// trapped.
  @Test func aRatesWaitIsShownWhateverItsLength() {
    let limits = QueueLimits(rate: RateLimit(perSecond: 1))
    let counts = JobCounts(ready: 2)
    #expect(LimitsCommands.rateReachedText(limits, counts, wait: .milliseconds(1_500)).hasSuffix("in 1.5 s"))
    #expect(LimitsCommands.rateReachedText(limits, counts, wait: .seconds(3_725)).hasSuffix("in 1 h 2 min"))
    #expect(LimitsCommands.rateReachedText(limits, counts, wait: .seconds(-5)).hasSuffix("in 0.0 s"))
    let longest = LimitsCommands.rateReachedText(limits, counts, wait: .seconds(Int64.max))
    #expect(longest.hasSuffix(" h 0 min") && longest.utf8.count < 200, "\(longest)")
  }

  /// A job's pretty JSON is cut at a byte bound (counted as escaped for HTML), with a note, and
  /// its indentation stops growing: 200 arrays deep around 60,000 numbers made 24 MB.
  @Test func prettyJSONIsBoundedWhateverItsShape() throws {
    let deep = Data(
      (String(repeating: "[", count: 200) + String(repeating: "0,", count: 60_000) + "0"
        + String(repeating: "]", count: 200)).utf8)
    let text = Dashboard.indented(deep, limit: 256 * 1024)
    #expect(text.utf8.count < 300 * 1024)
    #expect(text.contains("… (cut here"))
    #expect(!text.contains(String(repeating: " ", count: 2 * Dashboard.deepestIndent + 1)))
    let quotes = Data(("[" + String(repeating: #""\"\"\"","#, count: 50_000) + "1]").utf8)
    #expect(html(Dashboard.indented(quotes, limit: 100_000)).utf8.count < 100_200)
    let small = Data(#"{"a":[1,{}],"b":"x:\",y","c":[]}"#.utf8)
    #expect(
      Dashboard.indented(small, limit: 1000)
        == "{\n  \"a\" : [\n    1,\n    {}\n  ],\n  \"b\" : \"x:\\\",y\",\n  \"c\" : []\n}")
    let accents = Data(("\"" + String(repeating: "é", count: 1000) + "\"").utf8)
    // The quote counts 6 bytes (`&quot;`), each é 2: the cut falls after the 50th, never inside the 51st.
    let cutText = Dashboard.indented(accents, limit: 106)
    #expect(cutText.hasPrefix("\"" + String(repeating: "é", count: 50) + "\n… (cut here"))
    #expect(!cutText.contains("\u{FFFD}"))
  }

  /// A URL longer than what a listing reads is shown up to its query once its host was read,
  /// never its user information, and not at all while the host is cut.
  @Test func aURLCutShortIsShownOnlyAsFarAsIsSafe() {
    #expect(
      PayloadPrefix.shownStart(ofURL: "http://127.0.0.1:9/upload/0?q=xxxx") == "http://127.0.0.1:9/upload/0?…"
    )
    #expect(PayloadPrefix.shownStart(ofURL: "https://alice:pw@h.example/a/b") == "https://h.example/a/b…")
    #expect(PayloadPrefix.shownStart(ofURL: "https://h.example/%C3%A9/%C") == "https://h.example/%C3%A9/…")
    #expect(PayloadPrefix.shownStart(ofURL: "https://h.example#frag") == "https://h.example?…")
    #expect(PayloadPrefix.shownStart(ofURL: "https://alice:pass") == nil)
    #expect(PayloadPrefix.shownStart(ofURL: "https://alice:pass@host.exa") == nil)
  }

  /// `add` stores the job's kind first, then the method and URL, so a long `--key` or long headers
  /// never push the summary out of the first bytes read; the value is the same to a decoder.
  @Test func theSummaryIsStoredFirstWhateverTheKeyAndHeaders() throws {
    let job = OutboxJob(
      kind: .http(
        HTTPRequest(
          method: "POST", url: try #require(URL(string: "https://h.example/orders")),
          headers: ["X-Big": String(repeating: "h", count: 20_000)], body: Data(repeating: 1, count: 100_000))
      ),
      key: String(repeating: "k", count: 20_000))
    let payload = try #require(PayloadPrefix.summaryMembersFirst(try JSONEncoder().encode(job)))
    #expect(try JSONDecoder().decode(OutboxJob.self, from: payload) == job)
    #expect(OutboxJob.summary(ofStart: payload.prefix(200), payloadSize: payload.count) == job.summary)
  }
}
