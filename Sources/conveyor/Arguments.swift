import Foundation

/// A mistake in how the tool was called: printed with a hint, exit code 2.
struct UsageError: Error, CustomStringConvertible {
  var description: String
}

/// One option a command accepts.
struct OptionSpec {
  /// The names, the first one canonical: `["--concurrency", "-c"]`.
  var names: [String]
  /// The value's placeholder (`N`, `PATH`); nil for a switch that takes none.
  var value: String?
  /// One line for `--help`.
  var help: String
}

/// What a command accepts, declared once: the parser reads it and `--help` prints it.
struct CommandSpec {
  /// The command words, e.g. `add http`.
  var name: String
  /// The positional arguments as shown in the usage line, e.g. `METHOD URL`.
  var operands: String
  /// One line for `conveyor --help`.
  var summary: String
  var options: [OptionSpec]
  /// Whether `--` ends the options and the words after it are operands (`add exec`).
  var takesCommandAfterDashes = false
  /// More lines for `--help`.
  var details: String = ""

  /// `conveyor NAME [options] OPERANDS`.
  var usageLine: String {
    "conveyor \(name)" + (options.isEmpty ? "" : " [options]") + (operands.isEmpty ? "" : " \(operands)")
  }

  /// What `conveyor NAME --help` prints.
  var help: String {
    var lines = ["Usage: \(usageLine)", "", summary]
    if !details.isEmpty { lines += ["", details] }
    if !options.isEmpty {
      lines += ["", "Options:"]
      let labels = options.map { option in
        option.names.joined(separator: ", ") + (option.value.map { " \($0)" } ?? "")
      }
      let width = (labels.map(\.count).max() ?? 0) + 2
      for (label, option) in zip(labels, options) {
        lines.append("  " + label.padding(toLength: width, withPad: " ", startingAt: 0) + option.help)
      }
    }
    lines += [
      "", "Global options go before the command: conveyor [--database PATH] [--queue NAME] \(name) ...",
    ]
    return lines.joined(separator: "\n")
  }
}

/// A command's words parsed against its ``CommandSpec``: options (wherever they appear before
/// `--`) and operands in order. An unknown option, or a global one after the command, is a
/// usage error.
struct Arguments {
  let spec: CommandSpec
  private var values: [String: [String]] = [:]
  private var operands: [String] = []
  /// Whether `--help` or `-h` was given.
  private(set) var wantsHelp = false

  /// Options every command refuses after its name, with where they belong.
  static let globalOptions = ["--database", "-d", "--queue", "-q"]

  init(_ words: [String], for spec: CommandSpec) throws {
    self.spec = spec
    var index = 0
    while index < words.count {
      let word = words[index]
      index += 1
      if word == "--" {
        guard spec.takesCommandAfterDashes else {
          throw UsageError(description: "\"--\" has no meaning for conveyor \(spec.name)")
        }
        operands.append("--")
        operands += words[index...]
        return
      }
      guard word.hasPrefix("-"), word.count > 1, Int(word) == nil else {
        operands.append(word)
        continue
      }
      if word == "--help" || word == "-h" {
        wantsHelp = true
        continue
      }
      let (name, inline) = Self.split(word)
      guard let option = spec.options.first(where: { $0.names.contains(name) }) else {
        throw Self.unknown(name, in: spec)
      }
      let key = option.names[0]
      if option.value == nil {
        guard inline == nil else { throw UsageError(description: "\(name) takes no value") }
        values[key, default: []].append("")
        continue
      }
      if let inline {
        values[key, default: []].append(inline)
      } else {
        guard index < words.count else { throw UsageError(description: "\(name) needs a value") }
        values[key, default: []].append(words[index])
        index += 1
      }
    }
  }

  /// `--name=value` as (`--name`, `value`); a short option or a word without `=` as (word, nil).
  private static func split(_ word: String) -> (String, String?) {
    guard word.hasPrefix("--"), let equals = word.firstIndex(of: "=") else { return (word, nil) }
    return (String(word[..<equals]), String(word[word.index(after: equals)...]))
  }

  private static func unknown(_ name: String, in spec: CommandSpec) -> UsageError {
    if globalOptions.contains(name) {
      let long = name.count == 2 ? (name == "-d" ? "--database" : "--queue") : name
      var text =
        "\(name) is not an option of conveyor \(spec.name): \(long) goes before the command, "
        + "e.g. conveyor \(long) \(long == "--database" ? "PATH" : "NAME") \(spec.name) ..."
      if name == "-d" && spec.name == "add http" { text += "; to send a body, use --data TEXT" }
      return UsageError(description: text)
    }
    return UsageError(
      description: "unknown option \"\(name)\" for conveyor \(spec.name); run 'conveyor \(spec.name) --help'")
  }

  /// Whether there is no operand left.
  var isEmpty: Bool { operands.isEmpty }

  /// Takes the next operand, if any.
  mutating func next() -> String? {
    operands.isEmpty ? nil : operands.removeFirst()
  }

  /// Takes the next operand or fails with `what` in the message.
  mutating func required(_ what: String) throws -> String {
    guard let value = next() else {
      throw UsageError(description: "missing \(what); run 'conveyor \(spec.name) --help'")
    }
    return value
  }

  /// Whether the switch `name` (its canonical name) was given.
  func flag(_ name: String) -> Bool { values[name] != nil }

  /// The value of option `name`, the last one if repeated.
  func option(_ name: String) -> String? { values[name]?.last }

  /// Every value of option `name`, in order.
  func options(_ name: String) -> [String] { values[name] ?? [] }

  /// Parses an integer option within a range.
  func integer(_ name: String, in range: ClosedRange<Int>) throws -> Int? {
    guard let text = option(name) else { return nil }
    guard let value = Int(text), range.contains(value) else {
      throw UsageError(
        description:
          "\(name) must be a whole number in \(range.lowerBound)...\(range.upperBound), got \"\(text)\"")
    }
    return value
  }

  /// Parses a duration option given in seconds (fractions allowed, to the millisecond); zero is
  /// refused unless `allowingZero`.
  func seconds(_ name: String, allowingZero: Bool = true) throws -> Duration? {
    guard let text = option(name) else { return nil }
    guard let value = Double(text), value >= 0, value < 1e12 else {
      throw UsageError(description: "\(name) must be a number of seconds, got \"\(text)\"")
    }
    let milliseconds = Int64((value * 1000).rounded())
    guard allowingZero || milliseconds > 0 else {
      throw UsageError(description: "\(name) must be a number of seconds above 0, got \"\(text)\"")
    }
    return .milliseconds(milliseconds)
  }

  /// A duration option written as a whole number and a unit: `90s`, `15m`, `24h`, `7d` (`0`
  /// alone is zero), at most 100 years; nil when absent.
  func duration(_ name: String) throws -> Duration? {
    guard let text = option(name) else { return nil }
    guard let duration = Self.duration(text) else {
      throw UsageError(
        description:
          "\(name) must be a whole number with a unit s, m, h or d (such as 90s, 15m, 24h, 7d; at most "
          + "36500d), got \"\(printable(text))\"")
    }
    return duration
  }

  /// `90s`, `15m`, `24h`, `7d` or `0` as a duration; nil for anything else, or more than 100 years.
  static func duration(_ text: String) -> Duration? {
    if text == "0" { return .zero }
    let units: [Character: Int64] = ["s": 1, "m": 60, "h": 3_600, "d": 86_400]
    guard let unit = text.last, let seconds = units[unit] else { return nil }
    let digits = text.dropLast()
    // Digits only: no sign, no space, no fraction; at most 12 of them, so nothing overflows.
    guard !digits.isEmpty, digits.count <= 12, digits.allSatisfy({ $0.isASCII && $0.isNumber }),
      let count = Int64(digits)
    else { return nil }
    let total = count * seconds
    guard total <= 36_500 * 86_400 else { return nil }
    return .seconds(total)
  }

  /// Fails if an operand is left that the command did not take.
  func finish() throws {
    if let extra = operands.first {
      throw UsageError(
        description: "unexpected argument \"\(extra)\"; run 'conveyor \(spec.name) --help'")
    }
  }
}
