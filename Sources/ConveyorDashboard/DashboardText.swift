import Foundation

/// Fields of an `application/x-www-form-urlencoded` text: a query string or a form's body.
struct HTTPForm: Sendable, Hashable {
  /// The decoded fields in order; a name may repeat.
  var fields: [Field]

  /// One decoded field.
  struct Field: Sendable, Hashable {
    /// The decoded name.
    var name: String
    /// The decoded value.
    var value: String
  }

  /// Decodes `name=value&…`: `+` is a space, `%XX` a byte; malformed escapes are kept as text.
  init(encoded: String) {
    fields = encoded.split(separator: "&", omittingEmptySubsequences: true).map { pair in
      let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
      return Field(
        name: Self.decode(parts[0]), value: parts.count > 1 ? Self.decode(parts[1]) : "")
    }
  }

  /// The first value of `name`, or nil.
  subscript(name: String) -> String? {
    fields.first { $0.name == name }?.value
  }

  /// Every value of `name`, in order.
  func values(_ name: String) -> [String] {
    fields.filter { $0.name == name }.map(\.value)
  }

  /// Percent-encodes `text` for a query or form value (everything but unreserved characters).
  static func encode(_ text: String) -> String {
    var result = ""
    for byte in text.utf8 {
      switch byte {
      case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
        UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"),
        UInt8(ascii: "~"):
        result.unicodeScalars.append(Unicode.Scalar(byte))
      default:
        result +=
          "%" + String(byte >> 4, radix: 16, uppercase: true)
          + String(byte & 0xF, radix: 16, uppercase: true)
      }
    }
    return result
  }

  private static func decode(_ text: Substring) -> String {
    var bytes: [UInt8] = []
    var iterator = Array(text.utf8)[...]
    while let byte = iterator.popFirst() {
      if byte == UInt8(ascii: "+") {
        bytes.append(UInt8(ascii: " "))
      } else if byte == UInt8(ascii: "%"), iterator.count >= 2,
        let high = hexValue(iterator[iterator.startIndex]),
        let low = hexValue(iterator[iterator.startIndex + 1])
      {
        bytes.append(high << 4 | low)
        iterator = iterator.dropFirst(2)
      } else {
        bytes.append(byte)
      }
    }
    return String(decoding: bytes, as: UTF8.self)
  }

  private static func hexValue(_ byte: UInt8) -> UInt8? {
    switch byte {
    case UInt8(ascii: "0")...UInt8(ascii: "9"): byte - UInt8(ascii: "0")
    case UInt8(ascii: "a")...UInt8(ascii: "f"): byte - UInt8(ascii: "a") + 10
    case UInt8(ascii: "A")...UInt8(ascii: "F"): byte - UInt8(ascii: "A") + 10
    default: nil
    }
  }
}

/// A date as pages show it: ISO 8601 in UTC.
func timestamp(_ date: Date) -> String {
  date.ISO8601Format()
}
