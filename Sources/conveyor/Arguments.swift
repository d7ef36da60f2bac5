import Foundation

/// A mistake in how the tool was called: printed with a hint, exit code 2.
struct UsageError: Error, CustomStringConvertible {
  var description: String
}

/// The words after the command name, consumed front to back.
struct Arguments {
  private(set) var remaining: [String]

  init(_ arguments: [String]) { remaining = arguments }

  var isEmpty: Bool { remaining.isEmpty }

  /// Takes the next positional word, if any.
  mutating func next() -> String? {
    remaining.isEmpty ? nil : remaining.removeFirst()
  }

  /// Takes the next positional word or fails with `what` in the message.
  mutating func required(_ what: String) throws -> String {
    guard let value = next() else { throw UsageError(description: "missing \(what)") }
    return value
  }

  /// Removes `--name` (a switch) if present.
  mutating func flag(_ names: String...) -> Bool {
    guard let index = remaining.firstIndex(where: { names.contains($0) }) else { return false }
    remaining.remove(at: index)
    return true
  }

  /// Removes `--name VALUE` or `--name=VALUE` and returns the value (the last one if repeated).
  mutating func option(_ names: String...) throws -> String? {
    try options(names).last
  }

  /// Removes every `--name VALUE` / `--name=VALUE` and returns the values in order.
  mutating func options(_ names: [String]) throws -> [String] {
    var values: [String] = []
    var index = 0
    while index < remaining.count {
      let word = remaining[index]
      if word == "--" { break }
      if names.contains(word) {
        guard index + 1 < remaining.count else { throw UsageError(description: "\(word) needs a value") }
        values.append(remaining[index + 1])
        remaining.removeSubrange(index...(index + 1))
        continue
      }
      if let name = names.first(where: { word.hasPrefix($0 + "=") }) {
        values.append(String(word.dropFirst(name.count + 1)))
        remaining.remove(at: index)
        continue
      }
      index += 1
    }
    return values
  }

  /// Parses an integer option within a range.
  mutating func integer(_ names: String..., in range: ClosedRange<Int>) throws -> Int? {
    guard let text = try options(names).last else { return nil }
    guard let value = Int(text), range.contains(value) else {
      throw UsageError(
        description:
          "\(names[0]) must be a whole number in \(range.lowerBound)...\(range.upperBound), got \"\(text)\"")
    }
    return value
  }

  /// Parses a duration option given in seconds (fractions allowed, to the millisecond); zero is
  /// refused unless `allowingZero`.
  mutating func seconds(_ names: String..., allowingZero: Bool = true) throws -> Duration? {
    guard let text = try options(names).last else { return nil }
    guard let value = Double(text), value >= 0, value < 1e12 else {
      throw UsageError(description: "\(names[0]) must be a number of seconds, got \"\(text)\"")
    }
    let milliseconds = Int64((value * 1000).rounded())
    guard allowingZero || milliseconds > 0 else {
      throw UsageError(description: "\(names[0]) must be a number of seconds above 0, got \"\(text)\"")
    }
    return .milliseconds(milliseconds)
  }

  /// Fails if anything is left that no command consumed.
  func finish() throws {
    if let extra = remaining.first {
      throw UsageError(description: "unexpected argument \"\(extra)\"")
    }
  }
}
