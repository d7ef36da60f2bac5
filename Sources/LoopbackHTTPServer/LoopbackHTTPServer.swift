import Foundation
import Synchronization

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// A request the loopback server received.
public struct LoopbackRequest: Sendable {
  /// The method, e.g. `GET`.
  public var method: String
  /// The request target, e.g. `/items?x=1`.
  public var target: String
  /// Header names lower-cased.
  public var headers: [String: String]
  /// The body, decoded from chunked transfer encoding if it was sent so.
  public var body: Data

  /// The target without its query.
  public var path: String { String(target.prefix { $0 != "?" }) }
  /// A header's value, by case-insensitive name.
  public func header(_ name: String) -> String? { headers[name.lowercased()] }
  /// The body as UTF-8 text.
  public var bodyText: String { String(decoding: body, as: UTF8.self) }
}

/// What the loopback server answers.
public struct LoopbackReply: Sendable {
  /// The status code.
  public var status = 200
  /// Headers, in order; `Content-Length` is added unless given.
  public var headers: [(String, String)] = []
  /// The body.
  public var body = Data()
  /// Wait this long before sending anything.
  public var delay: Duration = .zero
  /// Send the body in pieces of this size with `pause` between them.
  public var chunkSize: Int?
  /// The pause between pieces.
  public var pause: Duration = .zero
  /// Send these bytes instead of an HTTP response, then close.
  public var raw: Data?

  /// Creates a reply.
  public init(
    status: Int = 200, headers: [(String, String)] = [], body: Data = Data(), delay: Duration = .zero,
    chunkSize: Int? = nil, pause: Duration = .zero, raw: Data? = nil
  ) {
    self.status = status
    self.headers = headers
    self.body = body
    self.delay = delay
    self.chunkSize = chunkSize
    self.pause = pause
    self.raw = raw
  }

  /// A reply with a status, a text body and headers.
  public static func status(_ status: Int, _ body: String = "", headers: [(String, String)] = [])
    -> LoopbackReply
  {
    LoopbackReply(status: status, headers: headers, body: Data(body.utf8))
  }

  /// 200 with a text body.
  public static func ok(_ body: String = "ok") -> LoopbackReply { .status(200, body) }
}

/// A small HTTP/1.1 server on 127.0.0.1, for tests and for `conveyor demo`: POSIX sockets, a
/// thread per connection, `Connection: close` on every answer. It records every request it
/// parsed. It binds only the loopback address, on a port the system picks.
///
/// ```swift
/// let server = try LoopbackHTTPServer { request, index in index == 0 ? .status(503) : .ok() }
/// defer { server.stop() }
/// let url = server.url("/orders")
/// ```
public final class LoopbackHTTPServer: Sendable {
  /// Chooses the reply to a request; `index` counts requests from 0 in arrival order.
  public typealias Responder = @Sendable (_ request: LoopbackRequest, _ index: Int) -> LoopbackReply

  /// The port the server listens on.
  public let port: UInt16
  private let listener: Int32
  private let responder: Responder
  private let log = Mutex<[LoopbackRequest]>([])
  private let stopped = Atomic<Bool>(false)
  /// Set by the first ``stop()``, before it touches the listener; later calls do nothing.
  private let stopRequested = Atomic<Bool>(false)
  private let acceptDone: DispatchSemaphore

  /// Starts listening on 127.0.0.1, on a port the system picks.
  public init(_ responder: @escaping Responder) throws {
    let fd = socket(AF_INET, sockStream, 0)
    guard fd >= 0 else { throw LoopbackServerError("socket: \(errno)") }
    _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
    var one: Int32 = 1
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = 0
    address.sin_addr = in_addr(s_addr: inet_addr("127.0.0.1"))
    let bound = withUnsafePointer(to: &address) {
      $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
        bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
      }
    }
    guard bound == 0, listen(fd, 64) == 0 else {
      close(fd)
      throw LoopbackServerError("bind/listen: \(errno)")
    }
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    _ = withUnsafeMutablePointer(to: &address) {
      $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
    }
    listener = fd
    let done = DispatchSemaphore(value: 0)
    acceptDone = done
    port = UInt16(bigEndian: address.sin_port)
    self.responder = responder
    Thread.detachNewThread { [weak self] in
      while let server = self, server.acceptOnce() {}
      // Released or stopped: the loop owns the listener and closes it.
      close(fd)
      done.signal()
    }
  }

  /// Convenience: the same reply for every request.
  public convenience init(always reply: LoopbackReply) throws {
    try self.init { _, _ in reply }
  }

  /// `http://127.0.0.1:<port><path>`.
  public func url(_ path: String) -> URL { URL(string: "http://127.0.0.1:\(port)\(path)")! }

  /// Every request received so far, in arrival order.
  public var requests: [LoopbackRequest] { log.withLock { $0 } }

  /// Stops accepting and closes the listening socket (waits up to 2 s for that); connections in
  /// progress finish on their own threads.
  public func stop() {
    // Only the first call acts: once the loop has closed the listener, its number may belong to
    // another socket.
    guard !stopRequested.exchange(true, ordering: .acquiringAndReleasing) else { return }
    // Wake the accept loop's poll at once; the socket stays open (and its number ours) until
    // the loop sees `stopped` and closes it.
    shutdown(listener, Int32(SHUT_RDWR))
    stopped.store(true, ordering: .releasing)
    _ = acceptDone.wait(timeout: .now() + 2)
  }

  /// Waits up to 50 ms for a connection and serves it on a new thread; false once stopped.
  private func acceptOnce() -> Bool {
    if stopped.load(ordering: .acquiring) { return false }
    var poller = pollfd(fd: listener, events: Int16(POLLIN), revents: 0)
    guard poll(&poller, 1, 50) > 0 else { return true }
    // Close-on-exec at once (`accept4` is not visible from Swift's Glibc).
    let connection = accept(listener, nil, nil)
    if connection >= 0 { _ = fcntl(connection, F_SETFD, FD_CLOEXEC) }
    if connection >= 0 {
      Thread.detachNewThread { self.serve(connection) }
    }
    return true
  }

  private func serve(_ fd: Int32) {
    defer { close(fd) }
    var timeout = timeval(tv_sec: 5, tv_usec: 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    #if canImport(Darwin)
      var one: Int32 = 1
      setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, socklen_t(MemoryLayout<Int32>.size))
    #endif
    guard let request = readRequest(fd) else { return }
    let index = log.withLock { log -> Int in
      log.append(request)
      return log.count - 1
    }
    let reply = responder(request, index)
    sleep(reply.delay)
    if let raw = reply.raw {
      _ = send(fd, raw)
      return
    }
    var head = "HTTP/1.1 \(reply.status) \(reason(reply.status))\r\n"
    var names = Set<String>()
    for (name, value) in reply.headers {
      head += "\(name): \(value)\r\n"
      names.insert(name.lowercased())
    }
    if !names.contains("content-length") { head += "Content-Length: \(reply.body.count)\r\n" }
    head += "Connection: close\r\n\r\n"
    guard send(fd, Data(head.utf8)) else { return }
    let size = reply.chunkSize ?? max(reply.body.count, 1)
    var offset = 0
    while offset < reply.body.count {
      let end = min(offset + size, reply.body.count)
      guard send(fd, reply.body[offset..<end]) else { return }
      offset = end
      if offset < reply.body.count { sleep(reply.pause) }
    }
    shutdown(fd, Int32(SHUT_WR))
    // Let the client read everything before the close.
    var scratch = [UInt8](repeating: 0, count: 256)
    _ = recv(fd, &scratch, scratch.count, 0)
  }

  private func readRequest(_ fd: Int32) -> LoopbackRequest? {
    var buffer = Data()
    var chunk = [UInt8](repeating: 0, count: 16_384)
    let separator = Data("\r\n\r\n".utf8)
    var headerEnd: Range<Data.Index>?
    while headerEnd == nil {
      let count = recv(fd, &chunk, chunk.count, 0)
      if count <= 0 { return nil }
      buffer.append(contentsOf: chunk[0..<count])
      headerEnd = buffer.range(of: separator)
    }
    guard let headerEnd else { return nil }
    let lines = String(decoding: buffer[..<headerEnd.lowerBound], as: UTF8.self)
      .components(separatedBy: "\r\n")
    let parts = lines[0].split(separator: " ")
    guard parts.count >= 2 else { return nil }
    var headers: [String: String] = [:]
    for line in lines.dropFirst() {
      guard let colon = line.firstIndex(of: ":") else { continue }
      headers[line[..<colon].lowercased()] = line[line.index(after: colon)...]
        .trimmingCharacters(in: .whitespaces)
    }
    if headers["expect"]?.lowercased() == "100-continue" {
      _ = send(fd, Data("HTTP/1.1 100 Continue\r\n\r\n".utf8))
    }
    var body = Data(buffer[headerEnd.upperBound...])
    let length = Int(headers["content-length"] ?? "0") ?? 0
    while body.count < length {
      let count = recv(fd, &chunk, min(chunk.count, length - body.count), 0)
      if count <= 0 { return nil }
      body.append(contentsOf: chunk[0..<count])
    }
    if headers["transfer-encoding"]?.lowercased() == "chunked" {
      body = readChunked(fd, initial: body) ?? Data()
    }
    return LoopbackRequest(method: String(parts[0]), target: String(parts[1]), headers: headers, body: body)
  }

  /// Decodes a chunked request body (enough for what URLSession sends).
  private func readChunked(_ fd: Int32, initial: Data) -> Data? {
    var buffer = initial
    var chunk = [UInt8](repeating: 0, count: 16_384)
    while buffer.range(of: Data("0\r\n\r\n".utf8)) == nil {
      let count = recv(fd, &chunk, chunk.count, 0)
      if count <= 0 { return nil }
      buffer.append(contentsOf: chunk[0..<count])
    }
    var body = Data()
    var rest = buffer[...]
    while let lineEnd = rest.range(of: Data("\r\n".utf8)) {
      let size = Int(String(decoding: rest[..<lineEnd.lowerBound], as: UTF8.self), radix: 16) ?? 0
      if size == 0 { break }
      let start = lineEnd.upperBound
      body.append(rest[start..<start + size])
      rest = rest[(start + size + 2)...]
    }
    return body
  }

  private func send(_ fd: Int32, _ data: Data) -> Bool {
    var offset = 0
    while offset < data.count {
      let sent = data.withUnsafeBytes { bytes in
        #if canImport(Darwin)
          Darwin.send(fd, bytes.baseAddress! + offset, data.count - offset, 0)
        #else
          Glibc.send(fd, bytes.baseAddress! + offset, data.count - offset, Int32(MSG_NOSIGNAL))
        #endif
      }
      if sent <= 0 { return false }
      offset += sent
    }
    return true
  }

  private func sleep(_ duration: Duration) {
    if duration > .zero {
      let parts = duration.components
      Thread.sleep(forTimeInterval: Double(parts.seconds) + Double(parts.attoseconds) / 1e18)
    }
  }

  private func reason(_ status: Int) -> String {
    switch status {
    case 200: "OK"
    case 204: "No Content"
    case 301: "Moved Permanently"
    case 302: "Found"
    case 307: "Temporary Redirect"
    case 400: "Bad Request"
    case 404: "Not Found"
    case 408: "Request Timeout"
    case 429: "Too Many Requests"
    case 500: "Internal Server Error"
    case 503: "Service Unavailable"
    default: "Status"
    }
  }
}

/// The server could not start: the text names the failing socket call and errno.
public struct LoopbackServerError: Error, CustomStringConvertible {
  /// What failed.
  public var description: String
  init(_ description: String) { self.description = description }
}

// Close-on-exec from the start where the system can (Linux), so a child process spawned meanwhile
// does not hold a connection open.
#if canImport(Glibc)
  private let sockStream = Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue)
#else
  private let sockStream = SOCK_STREAM
#endif
