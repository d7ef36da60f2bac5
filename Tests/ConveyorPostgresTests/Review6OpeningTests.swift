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

/// A TCP proxy in front of a server that stops forwarding a connection (both ways) as soon as the
/// client sends `ROLLBACK`: a server that goes silent right when the opening rolls back.
final class Review6RollbackProxy: Sendable {
  let port: Int
  private let target: Int
  private let listener: Int32
  private let sockets = Mutex<[Int32]>([])
  let silenced = Atomic<Int>(0)

  var url: String { "postgresql://postgres@127.0.0.1:\(port)/postgres?sslmode=disable" }

  init(target: Int) throws {
    self.target = target
    (listener, port) = try PostgresServer.loopbackSocket(listening: true)
    Thread { [self] in acceptLoop() }.start()
  }

  func close() {
    shutdown(listener, Int32(SHUT_RDWR))
    for socket in sockets.withLock({ $0 }) { shutdown(socket, Int32(SHUT_RDWR)) }
  }

  private func acceptLoop() {
    while true {
      let client = accept(listener, nil, nil)
      if client < 0 {
        if errno == EINTR { continue }
        return
      }
      guard let server = PostgresServer.connectLoopback(port: target) else {
        shutdown(client, Int32(SHUT_RDWR))
        continue
      }
      sockets.withLock { $0 += [client, server] }
      Thread { [self] in pump(from: client, to: server, watch: true) }.start()
      Thread { [self] in pump(from: server, to: client, watch: false) }.start()
    }
  }

  private func pump(from source: Int32, to sink: Int32, watch: Bool) {
    var buffer = [UInt8](repeating: 0, count: 65_536)
    while true {
      let count = buffer.withUnsafeMutableBytes { recv(source, $0.baseAddress!, $0.count, 0) }
      if count < 0 && errno == EINTR { continue }
      if count <= 0 {
        shutdown(sink, Int32(SHUT_RDWR))
        return
      }
      if watch && String(decoding: buffer[0..<count], as: UTF8.self).contains("ROLLBACK") {
        silenced.add(1, ordering: .relaxed)
      }
      if silenced.load(ordering: .relaxed) > 0 { continue }  // swallowed: never answered
      guard
        buffer.withUnsafeBytes({
          PostgresServer.sendAll(sink, UnsafeRawBufferPointer(rebasing: $0[0..<count]))
        })
      else { return }
    }
  }
}

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
    let proxy = try Review6RollbackProxy(target: server.port)
    defer { proxy.close() }
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
