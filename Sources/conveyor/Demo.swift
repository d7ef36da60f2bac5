import Foundation

enum Demo {
  static func run(_ arguments: inout Arguments) async throws -> Int32 {
    try arguments.finish()
    return ExitCode.success.rawValue
  }
}
