import Foundation
import Synchronization

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// A TCP client on raw sockets, so tests can send what no HTTP library would. Its blocking calls
/// run on threads of their own (``blocking(_:)``): the server's handlers need Swift's cooperative
/// pool, which a test blocked in `recv` would starve.
final class RawClient: Sendable {
  let fd: Int32
  /// Bytes received and not yet returned; used by one call at a time.
  private let buffer = Mutex<[UInt8]>([])

  /// Connects to `host` (127.0.0.1 unless told):`port`, from the loopback address `source` (another peer to the
  /// server, e.g. `127.0.0.2`, where Linux routes all of 127/8 to loopback); every read gives up
  /// after `timeout` (a bound a hang blows through, not a pass criterion).
  init(port: UInt16, timeout: Int = 60, from source: String? = nil, to host: String = "127.0.0.1") throws {
    #if canImport(Glibc)
      // Close-on-exec: a child process another test spawns must not hold the connection open.
      fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    #else
      fd = socket(AF_INET, SOCK_STREAM, 0)
    #endif
    if let source {
      var local = sockaddr_in()
      local.sin_family = sa_family_t(AF_INET)
      local.sin_addr = in_addr(s_addr: inet_addr(source))
      let bound = withUnsafePointer(to: &local) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
          bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
        }
      }
      guard bound == 0 else {
        throw ClientError(description: "bind \(source): \(String(cString: strerror(errno)))")
      }
    }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = port.bigEndian
    address.sin_addr = in_addr(s_addr: inet_addr(host))
    let connected = withUnsafePointer(to: &address) {
      $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
        connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
      }
    }
    guard fd >= 0, connected == 0 else {
      // deinit closes the socket: this instance is fully initialised.
      throw ClientError(description: "connect: \(String(cString: strerror(errno)))")
    }
    var limit = timeval(tv_sec: timeout, tv_usec: 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, socklen_t(MemoryLayout<timeval>.size))
  }

  deinit { close(fd) }

  /// Sends bytes; false if the peer closed.
  @discardableResult
  func send(_ bytes: [UInt8]) async -> Bool {
    let fd = fd
    return await blocking { Self.send(bytes, to: fd) }
  }

  /// Sends bytes on a socket; false if the peer closed.
  static func send(_ bytes: [UInt8], to fd: Int32) -> Bool {
    bytes.withUnsafeBytes { raw in
      var offset = 0
      while offset < raw.count {
        #if canImport(Glibc)
          let sent = Glibc.send(fd, raw.baseAddress! + offset, raw.count - offset, Int32(MSG_NOSIGNAL))
        #else
          let sent = Darwin.send(fd, raw.baseAddress! + offset, raw.count - offset, 0)
        #endif
        if sent < 0 && errno == EINTR { continue }
        guard sent > 0 else { return false }
        offset += sent
      }
      return true
    }
  }

  /// Sends text.
  @discardableResult
  func send(_ text: String) async -> Bool { await send(Array(text.utf8)) }

  /// A response: status, lower-cased header names, body.
  struct Response {
    var status: Int
    var headers: [String: String]
    var body: String
  }

  /// Reads one response (by `Content-Length`); nil if the connection closed first.
  func readResponse() async -> Response? {
    await blocking { self.readResponseNow() }
  }

  /// Sends text, blocking the calling thread (never a thread of Swift's cooperative pool).
  @discardableResult
  func sendNow(_ text: String) -> Bool { Self.send(Array(text.utf8), to: fd) }

  /// Reads one response, blocking the calling thread (never a thread of Swift's cooperative pool).
  func readResponseNow() -> Response? {
    var pending = buffer.withLock { $0 }
    defer { buffer.withLock { [pending] in $0 = pending } }
    func receive() -> Bool {
      var chunk = [UInt8](repeating: 0, count: 65_536)
      let count = Self.receive(fd, &chunk)
      if count > 0 { pending += chunk[0..<count] }
      return count > 0
    }
    func find(_ needle: [UInt8]) -> Int? {
      guard pending.count >= needle.count else { return nil }
      for index in 0...(pending.count - needle.count)
      where Array(pending[index..<index + needle.count]) == needle {
        return index
      }
      return nil
    }
    while true {
      if let end = find([13, 10, 13, 10]) {
        let head = String(decoding: pending[..<end], as: UTF8.self).components(separatedBy: "\r\n")
        var headers: [String: String] = [:]
        for line in head.dropFirst() {
          guard let colon = line.firstIndex(of: ":") else { continue }
          headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(
            in: .whitespaces)
        }
        let status = Int(head[0].split(separator: " ").dropFirst().first ?? "") ?? 0
        let length = Int(headers["content-length"] ?? "0") ?? 0
        while pending.count < end + 4 + length {
          guard receive() else { return nil }
        }
        let body = String(decoding: pending[(end + 4)..<(end + 4 + length)], as: UTF8.self)
        pending.removeFirst(end + 4 + length)
        return Response(status: status, headers: headers, body: body)
      }
      guard receive() else { return nil }
    }
  }

  /// `recv`, again when a signal interrupted it (a child process ending, say, which would
  /// otherwise read as a connection the server closed).
  static func receive(_ fd: Int32, _ chunk: inout [UInt8]) -> Int {
    while true {
      let count = recv(fd, &chunk, chunk.count, 0)
      if count < 0 && errno == EINTR { continue }
      return count
    }
  }

  /// Whether the server closed the connection (reads until end of stream or the timeout).
  func isClosedByServer() async -> Bool {
    let fd = fd
    return await blocking {
      var chunk = [UInt8](repeating: 0, count: 65_536)
      while true {
        let count = Self.receive(fd, &chunk)
        if count == 0 { return true }
        if count < 0 { return errno == ECONNRESET }
      }
    }
  }
}

/// Runs a blocking call on a new thread and waits for it without holding a cooperative thread.
func blocking<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
  await withCheckedContinuation { continuation in
    Thread { continuation.resume(returning: body()) }.start()
  }
}

struct ClientError: Error, CustomStringConvertible {
  var description: String
}
