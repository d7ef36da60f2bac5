import CLibPQ
import Conveyor
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import ConveyorPostgres

#if canImport(Glibc)
  import Glibc
#endif

private func openDescriptors() -> Int {
  (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd").count) ?? -1
}

private func link(_ descriptor: Int32) -> String? {
  try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/\(descriptor)")
}

/// Review of 1f01cef: `SocketDeadline` (a `dup` of the socket, `restart()` per statement) and
/// `Migrations.apply(…, beforeEachStatement:)`.
@Suite("Review 6: SocketDeadline per statement", .serialized, .timeLimit(.minutes(3)))
struct Review6OpeningTests {
  /// A database at a newer version is refused with `.newerSchema`. The opening then rolls its
  /// transaction back; when that ROLLBACK gets no answer (a server gone silent at that moment)
  /// the deadline fires during it, `fired` is true when the `catch … where deadline?.fired`
  /// runs, and the `.newerSchema` the body already threw is rewritten as `.timedOut` ("got no
  /// answer … raise callTimeout"), hiding that the database is newer than the build.
  @Test func aNewerSchemaIsNotReportedAsTimedOutWhenTheRollbackHangs() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("rev6n")
    let store = try await PostgresJobStore.open(url: server.url, options: .init(schema: schema))
    await store.close()
    let admin = try AdminConnection(server.url)
    try admin.query("INSERT INTO \(schema).schema_migrations (version) VALUES (999)")
    let proxy = try ReviewTimedOutProxy(target: server.port, silencing: "ROLLBACK")
    defer { proxy.close() }
    proxy.startSilencing()
    do {
      _ = try await PostgresJobStore.open(
        url: proxy.url, options: .init(schema: schema, callTimeout: .seconds(1)))
      Issue.record("opened a store on a newer schema")
    } catch let error as PostgresError {
      #expect(proxy.silenced.load(ordering: .relaxed) > 0, "the proxy never saw the ROLLBACK")
      #expect(error.code == .newerSchema, "code \(error.code): \(error)")
    }
  }

  /// The duplicate descriptor is made with plain `dup`, without close-on-exec: libpq marks its
  /// socket FD_CLOEXEC, but while an opening runs, any process the program spawns (another
  /// thread's `Process`, `posix_spawn`) inherits a descriptor of the database connection.
  @Test func theDuplicateDescriptorIsCloseOnExec() throws {
    var pair: [Int32] = [0, 0]
    #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &pair) == 0)
    defer {
      close(pair[0])
      close(pair[1])
    }
    let target = try #require(link(pair[0]))
    let deadline = SocketDeadline(socket: pair[0], after: .seconds(60))
    defer { deadline.disarm() }
    let names = try FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")
    let duplicates = names.compactMap(Int32.init).filter { $0 != pair[0] && link($0) == target }
    #expect(duplicates.count == 1, "duplicates of the socket: \(duplicates)")
    for duplicate in duplicates {
      let flags = fcntl(duplicate, F_GETFD)
      #expect(
        flags >= 0 && flags & FD_CLOEXEC != 0, "descriptor \(duplicate) flags \(flags): inherited by children"
      )
    }
  }

  /// No descriptor leaks across many openings: successful ones, ones refused for a newer schema,
  /// ones refused before connecting (invalid schema name), ones whose connect fails. The count is
  /// the process's, which the tests running beside this one move by tens: 200 openings of each
  /// kind, and a leak of one each would add 200 (a margin of 100; 50 and 25 failed in a full run).
  @Test func manyOpeningsLeakNoDescriptors() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("rev6f")
    let newer = uniqueSchema("rev6g")
    let warm = try await PostgresJobStore.open(url: server.url, options: .init(schema: newer))
    await warm.close()
    try AdminConnection(server.url).query("INSERT INTO \(newer).schema_migrations (version) VALUES (999)")
    let url = server.url
    var opened: [Int] = [openDescriptors()]
    for _ in 0..<200 {
      let store = try await PostgresJobStore.open(
        url: url, options: .init(schema: schema, callTimeout: .seconds(5)))
      await store.close()
    }
    try await Task.sleep(for: .seconds(1))
    opened += [openDescriptors()]
    #expect(opened[1] - opened[0] < 100, "successful opens: descriptors \(opened)")
    let counts = try await onOwnThread(name: "rev6-opens") { () -> [Int] in
      var counts: [Int] = []
      for round in 1..<4 {
        let before = openDescriptors()
        for _ in 0..<200 {
          switch round {
          case 1: _ = try? PostgresJobStore(url: url, options: .init(schema: newer, callTimeout: .seconds(5)))
          case 2:
            _ = try? PostgresJobStore(url: url, options: .init(schema: "1bad", callTimeout: .seconds(5)))
          default:
            _ = try? PostgresJobStore(
              url: "postgresql://postgres@127.0.0.1:1/postgres",
              options: .init(schema: schema, callTimeout: .seconds(5)))
          }
        }
        Thread.sleep(forTimeInterval: 1)
        counts += [before, openDescriptors()]
      }
      return counts
    }
    for round in 0..<3 {
      #expect(counts[2 * round + 1] - counts[2 * round] < 100, "round \(round): descriptors \(counts)")
    }
  }
}
