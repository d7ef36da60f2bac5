import Foundation
import Testing

/// The tests' own server harness.
@Suite("PostgreSQL test harness")
struct PostgresServerTests {
  // Failed before the fix: a private server whose port was taken between its choice and the
  // server's bind exited at once, and `start()` failed (seen once in a full run, where four private
  // servers and many client connections share the loopback ports).
  @Test func aPrivateServerWhosePortIsTakenStartsOnAnotherPort() async throws {
    // Hold a listening socket on a port, then ask for a server there first.
    let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    #expect(descriptor >= 0)
    defer { close(descriptor) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let listening = withUnsafeMutablePointer(to: &address) {
      $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer in
        bind(descriptor, pointer, length) == 0 && getsockname(descriptor, pointer, &length) == 0
          && listen(descriptor, 1) == 0
      }
    }
    #expect(listening)
    let taken = Int(UInt16(bigEndian: address.sin_port))
    let server = try await PostgresServer.start(firstPort: taken)
    defer { server.stop() }
    #expect(server.port != taken)
    #expect(try AdminConnection(server.url).scalar("SELECT 1") == "1")
  }
}
