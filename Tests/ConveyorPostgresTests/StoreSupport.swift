import Conveyor
import ConveyorPostgres
import Foundation
import Synchronization

/// Opens a store on `server` with `options`; its connections carry the schema as their
/// `application_name`, so a test finds its own backends in `pg_stat_activity` among the other
/// tests' ones.
func openNamedStore(_ server: PostgresServer, _ options: PostgresJobStore.Options) async throws
  -> PostgresJobStore
{
  try await PostgresJobStore.open(url: server.url + "?application_name=\(options.schema)", options: options)
}

/// A job whose payload is `text`.
func textJob(_ text: String = "x", runTime: RunTime = .now, key: String? = nil, priority: Int = 0) -> NewJob {
  NewJob(payload: Data(text.utf8), priority: priority, runTime: runTime, deduplicationKey: key)
}

/// A flag set from any task or thread.
final class Flag: Sendable {
  let value = Mutex(false)
  func set() { value.withLock { $0 = true } }
  var isSet: Bool { value.withLock { $0 } }
}

/// Whether `flag` becomes set within `seconds`.
func becomes(_ flag: Flag, within seconds: Double) async -> Bool {
  let deadline = Date().addingTimeInterval(seconds)
  while Date() < deadline {
    if flag.isSet { return true }
    try? await Task.sleep(for: .milliseconds(50))
  }
  return flag.isSet
}

/// A fixed, millisecond-aligned date for the jobs of tests that do not read the clock.
let epoch = Date(timeIntervalSince1970: 1_700_000_000)

/// The Unicode scalars of `text` in hex, dot-separated: text compared by bytes, shown so that
/// equivalent spellings differ.
func scalarsInHex(_ text: String) -> String {
  text.unicodeScalars.map { String($0.value, radix: 16) }.joined(separator: ".")
}

/// A store on a new schema of the shared server, on the caller's clock.
func openCallerClockStore() async throws -> PostgresJobStore {
  let server = try await PostgresServer.shared()
  return try await PostgresJobStore.open(
    url: server.url, options: .init(schema: uniqueSchema(), clock: .caller))
}
