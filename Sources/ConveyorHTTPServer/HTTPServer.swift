import Dispatch
import Foundation
import Synchronization

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// A small, bounded HTTP/1.1 server on POSIX sockets, for `conveyor dashboard`.
///
/// One thread accepts; each connection is served on its own thread, at most
/// ``HTTPServerLimits/maximumConnections`` at once, so socket I/O never blocks Swift's cooperative
/// pool. The handler is `async` and runs as a task; the connection's thread waits for it. Every
/// wait on a socket is a `poll` with a deadline that also watches a wake-up pipe, so ``stop(gracePeriod:)``
/// ends idle connections at once and no client can hold a thread past the request timeout.
///
/// Refusals close the connection after the answer: 400 for a malformed request, 408 when a head
/// takes longer than ``HTTPServerLimits/headTimeout`` or a request longer than
/// ``HTTPServerLimits/requestTimeout`` to arrive, 413 for a body over the limit, 414 for a long
/// request line, 431 for a large head, 501 for a transfer coding, 505 for another HTTP version,
/// 503 when every connection slot is taken or the peer holds its share of them
/// (``HTTPServerLimits/maximumConnectionsPerPeer``), and 503 to a request whose handler is still
/// running when ``stop(gracePeriod:)``'s grace period ends.
///
/// ```swift
/// let server = try HTTPServer(host: "127.0.0.1", port: 0) { request in
///   .text(200, "hello")
/// }
/// print(server.port)
/// server.stop()
/// ```
public final class HTTPServer: Sendable {
  /// Answers a request.
  public typealias Handler = @Sendable (HTTPServerRequest) async -> HTTPServerResponse

  /// The port the server listens on (the system's choice when 0 was asked for).
  public let port: UInt16
  /// The address it listens on, as given (e.g. `127.0.0.1`, `::1`).
  public let host: String
  /// The bounds it holds connections to.
  public let limits: HTTPServerLimits
  /// Headers added to the answers the server writes itself (400, 408, 413, 414, 431, 501, 503,
  /// 505), which never reach the handler: an application's security headers, say.
  public let refusalHeaders: [(name: String, value: String)]

  private let listener: Int32
  /// A pipe whose read end becomes readable (and stays so) when the server stops: every `poll`
  /// watches it.
  private let wakeRead: Int32
  private let wakeWrite: Int32
  private let handler: Handler
  private let stopping = Atomic<Bool>(false)
  /// Connections served, in all and by peer.
  private let connections = Mutex<(total: Int, byPeer: [Peer: Int])>((0, [:]))
  /// When requests still in progress are answered 503: the end of the stop's grace period.
  private let graceEnd = Mutex<ContinuousClock.Instant?>(nil)
  private let acceptDone = DispatchSemaphore(value: 0)

  /// Binds `host:port` and starts serving.
  ///
  /// - Parameters:
  ///   - host: A numeric IPv4 or IPv6 address, or `localhost`.
  ///   - port: The port; 0 lets the system pick (read it from ``port``).
  ///   - limits: The bounds; the defaults suit a dashboard.
  ///   - refusalHeaders: Headers for the answers the server writes itself. Default:
  ///     `X-Content-Type-Options: nosniff` and a Content-Security-Policy that allows nothing.
  ///   - handler: Answers each request.
  /// - Throws: ``HTTPServerError`` when the address cannot be resolved or bound.
  public init(
    host: String, port: UInt16, limits: HTTPServerLimits = HTTPServerLimits(),
    refusalHeaders: [(name: String, value: String)] = [
      ("Content-Security-Policy", "default-src 'none'; frame-ancestors 'none'"),
      ("X-Content-Type-Options", "nosniff"),
    ],
    handler: @escaping Handler
  ) throws {
    self.host = host
    self.limits = limits
    self.refusalHeaders = refusalHeaders
    self.handler = handler
    var hints = addrinfo()
    hints.ai_family = AF_UNSPEC
    hints.ai_socktype = socketStream
    hints.ai_flags = AI_PASSIVE
    var results: UnsafeMutablePointer<addrinfo>?
    let lookup = getaddrinfo(host, String(port), &hints, &results)
    guard lookup == 0, let first = results else {
      throw HTTPServerError(description: "cannot resolve \(host): \(String(cString: gai_strerror(lookup)))")
    }
    defer { freeaddrinfo(results) }
    let fd = socket(first.pointee.ai_family, socketStreamClosingOnExec, 0)
    guard fd >= 0 else { throw HTTPServerError(description: "socket: \(Self.errorText())") }
    _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
    var one: Int32 = 1
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
    guard bind(fd, first.pointee.ai_addr, first.pointee.ai_addrlen) == 0, listen(fd, 128) == 0 else {
      let text = Self.errorText()
      close(fd)
      throw HTTPServerError(description: "cannot listen on \(host):\(port): \(text)")
    }
    var storage = sockaddr_storage()
    var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
    _ = withUnsafeMutablePointer(to: &storage) {
      $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
    }
    let family = storage.ss_family
    self.port = withUnsafePointer(to: &storage) { pointer in
      if family == sa_family_t(AF_INET6) {
        pointer.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) {
          UInt16(bigEndian: $0.pointee.sin6_port)
        }
      } else {
        pointer.withMemoryRebound(to: sockaddr_in.self, capacity: 1) {
          UInt16(bigEndian: $0.pointee.sin_port)
        }
      }
    }
    var pipeEnds: [Int32] = [0, 0]
    guard pipe(&pipeEnds) == 0 else {
      close(fd)
      throw HTTPServerError(description: "pipe: \(Self.errorText())")
    }
    for end in pipeEnds { _ = fcntl(end, F_SETFD, FD_CLOEXEC) }
    listener = fd
    wakeRead = pipeEnds[0]
    wakeWrite = pipeEnds[1]
    let thread = Thread { [self] in acceptLoop() }
    thread.name = "conveyor-http-accept"
    thread.start()
  }

  deinit {
    // Every connection thread holds the server, so none is left when this runs.
    close(wakeRead)
    close(wakeWrite)
  }

  /// How many connections are being served now.
  public var connectionCount: Int { connections.withLock { $0.total } }

  /// Stops accepting, closes idle connections at once, lets requests in progress finish for up to
  /// `gracePeriod`, and returns. A request whose handler has not returned by then is answered 503
  /// (the handler's task is left to finish on its own, its answer dropped); sending those answers
  /// may take up to a second more. Calling it again does nothing.
  public func stop(gracePeriod: Duration = .seconds(5)) {
    guard !stopping.exchange(true, ordering: .acquiringAndReleasing) else { return }
    let deadline = ContinuousClock.now + gracePeriod
    graceEnd.withLock { $0 = deadline }
    var byte: UInt8 = 1
    _ = write(wakeWrite, &byte, 1)
    acceptDone.wait()
    // The refusals are small and sent without waiting on a client that does not read them
    // (``HTTPServerLimits/writeTimeout`` still bounds each).
    let end = deadline + .seconds(1)
    while connectionCount > 0 && ContinuousClock.now < end {
      Thread.sleep(forTimeInterval: 0.01)
    }
  }

  // MARK: accepting

  private func acceptLoop() {
    defer {
      close(listener)
      acceptDone.signal()
    }
    while !stopping.load(ordering: .acquiring) {
      var fds = [
        pollfd(fd: listener, events: Int16(POLLIN), revents: 0),
        pollfd(fd: wakeRead, events: Int16(POLLIN), revents: 0),
      ]
      let ready = poll(&fds, 2, -1)
      if ready < 0 {
        if errno == EINTR { continue }
        return
      }
      if fds[1].revents != 0 { return }
      guard fds[0].revents & Int16(POLLIN) != 0 else { continue }
      var address = sockaddr_storage()
      var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
      let connection = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { accept(listener, $0, &length) }
      }
      guard connection >= 0 else { continue }
      _ = fcntl(connection, F_SETFD, FD_CLOEXEC)
      let peer = Peer(address)
      let admitted = connections.withLock { count -> Bool in
        guard count.total < limits.maximumConnections,
          count.byPeer[peer, default: 0] < limits.maximumConnectionsPerPeer
        else { return false }
        count.total += 1
        count.byPeer[peer, default: 0] += 1
        return true
      }
      guard admitted else {
        refuseBusy(connection)
        continue
      }
      let thread = Thread { [self] in
        defer {
          connections.withLock { count in
            count.total -= 1
            count.byPeer[peer, default: 1] -= 1
            if count.byPeer[peer] == 0 { count.byPeer[peer] = nil }
          }
        }
        Connection(fd: connection, server: self).serve()
      }
      thread.name = "conveyor-http-connection"
      thread.start()
    }
  }

  /// Answers 503 without waiting on the client (a send that would block is dropped) and closes.
  private func refuseBusy(_ fd: Int32) {
    let flags = fcntl(fd, F_GETFL)
    _ = fcntl(fd, F_SETFL, flags | O_NONBLOCK)
    let extra = refusalHeaders.map { "\($0.name): \($0.value)\r\n" }.joined()
    let text =
      "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\nRetry-After: 1\r\n"
      + extra + "\r\n"
    _ = Array(text.utf8).withUnsafeBytes { sendBytes(fd, $0.baseAddress!, $0.count) }
    close(fd)
  }

  // MARK: what connections use

  var isStopping: Bool { stopping.load(ordering: .acquiring) }
  var wakeDescriptor: Int32 { wakeRead }

  /// Runs the handler as a task and waits for it on the calling (connection) thread, until the
  /// stop's grace period ends: then the answer is 503.
  func respond(to request: HTTPServerRequest) -> HTTPServerResponse {
    let result = Mutex<HTTPServerResponse?>(nil)
    let done = DispatchSemaphore(value: 0)
    let handler = self.handler
    Task {
      let response = await handler(request)
      result.withLock { $0 = response }
      done.signal()
    }
    while done.wait(timeout: .now() + .milliseconds(50)) == .timedOut {
      if let end = graceEnd.withLock({ $0 }), ContinuousClock.now >= end {
        var response = HTTPServerResponse.text(503, "503 Service Unavailable: the server is stopping\n")
        response.headers += refusalHeaders
        return response
      }
    }
    return result.withLock { $0 } ?? .text(500, "no response")
  }

  static func errorText() -> String { String(cString: strerror(errno)) }
}

/// Whose connections are counted together: an IPv4 address, or the first 64 bits of an IPv6
/// address (an IPv4-mapped one counts as its IPv4 address).
struct Peer: Hashable {
  var bytes: [UInt8]

  init(_ storage: sockaddr_storage) {
    var storage = storage
    let family = Int32(storage.ss_family)
    bytes = withUnsafeBytes(of: &storage) { raw -> [UInt8] in
      if family == AF_INET {
        let offset = MemoryLayout<sockaddr_in>.offset(of: \sockaddr_in.sin_addr)!
        return Array(raw[offset..<offset + 4])
      }
      if family == AF_INET6 {
        let offset = MemoryLayout<sockaddr_in6>.offset(of: \sockaddr_in6.sin6_addr)!
        let address = Array(raw[offset..<offset + 16])
        if address[0..<10].allSatisfy({ $0 == 0 }) && address[10] == 0xFF && address[11] == 0xFF {
          return Array(address[12..<16])
        }
        return Array(address[0..<8])
      }
      return []
    }
  }
}

/// The server could not start: the text says which address and why.
public struct HTTPServerError: Error, CustomStringConvertible {
  /// What failed.
  public var description: String
}

/// Sends without raising SIGPIPE; returns what `send` returns.
func sendBytes(_ fd: Int32, _ bytes: UnsafeRawPointer, _ count: Int) -> Int {
  #if canImport(Darwin)
    Darwin.send(fd, bytes, count, 0)
  #else
    Glibc.send(fd, bytes, count, Int32(MSG_NOSIGNAL))
  #endif
}

// Sockets are made close-on-exec as they are created where the system can (Linux): one set
// afterwards can be inherited by a child process another thread spawns in between, which then
// holds the connection open for as long as it lives (the client never sees the close).
#if canImport(Glibc)
  let socketStream = Int32(SOCK_STREAM.rawValue)
  let socketStreamClosingOnExec = socketStream | Int32(SOCK_CLOEXEC.rawValue)
#else
  let socketStream = SOCK_STREAM
  let socketStreamClosingOnExec = SOCK_STREAM
#endif
