/// `text` cut to its first `count` Unicode scalars, "…" marking a cut. A scalar is at most 4
/// bytes in UTF-8, so the result is bounded in bytes as well; a `Character` is not (one letter
/// with 60,000 combining marks is one Character of 120 KB). Never splits a scalar. Shared by
/// the command-line tool and the dashboard.
package func cut(_ text: String, to count: Int) -> String {
  var scalars = text.unicodeScalars.makeIterator()
  var kept = String.UnicodeScalarView()
  for _ in 0..<max(0, count) {
    guard let scalar = scalars.next() else { return text }
    kept.append(scalar)
  }
  return scalars.next() == nil ? text : String(kept) + "…"
}
