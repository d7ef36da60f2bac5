import Foundation

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// One accepted connection, served on its own thread: read a request within the deadlines, answer
/// it, and go on while the connection is kept alive.
struct Connection {
  let fd: Int32
  let server: HTTPServer

  private var limits: HTTPServerLimits { server.limits }

  /// What a wait for bytes ended with.
  private enum Wait {
    case readable
    case timedOut
    case stopping
  }

  func serve() {
    defer { close(fd) }
    var one: Int32 = 1
    setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
    #if canImport(Darwin)
      setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, socklen_t(MemoryLayout<Int32>.size))
    #endif
    var timeout = timeval(
      tv_sec: Int(clamping: limits.writeTimeout.components.seconds),
      tv_usec: .init(limits.writeTimeout.components.attoseconds / 1_000_000_000_000))
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))

    var buffer: [UInt8] = []
    var served = 0
    let start = ContinuousClock.now
    while served < limits.maximumRequestsPerConnection {
      // The first request's head is due within the head timeout of the connection's start; a
      // later one's first byte within the idle timeout, and its head within the head timeout of
      // that byte. A whole request is due within the request timeout of its first byte.
      var headDeadline = start + limits.headTimeout
      if served > 0 {
        if buffer.isEmpty {
          guard wait(until: .now + limits.idleTimeout) == .readable, receive(into: &buffer) else { return }
        }
        headDeadline = .now + limits.headTimeout
      }
      var deadline: ContinuousClock.Instant? = buffer.isEmpty ? nil : .now + limits.requestTimeout
      var head: RequestHead?
      var headLength = 0
      while head == nil {
        switch RequestHeadParser.parse(buffer, limits: limits) {
        case .complete(let parsed, let length):
          head = parsed
          headLength = length
        case .failure(let status, let reason):
          refuse(status, reason)
          return
        case .incomplete:
          // Before its first byte, a new connection is idle: it closes after the idle timeout.
          switch wait(
            until: deadline.map { min($0, headDeadline) } ?? min(headDeadline, start + limits.idleTimeout))
          {
          case .readable:
            guard receive(into: &buffer) else { return }
            if deadline == nil { deadline = .now + limits.requestTimeout }
          case .timedOut:
            // A connection that sent nothing at all is closed quietly, as an idle one is.
            if served == 0 && buffer.isEmpty { return }
            refuse(408, "the request head took too long to arrive")
            return
          case .stopping: return
          }
        }
      }
      guard let head else { return }
      buffer.removeFirst(headLength)
      if head.expectsContinue && head.contentLength > buffer.count {
        guard sendAll(Array("HTTP/1.1 100 Continue\r\n\r\n".utf8)) else { return }
      }
      let bodyDeadline = deadline ?? .now + limits.requestTimeout
      while buffer.count < head.contentLength {
        switch wait(until: bodyDeadline) {
        case .readable: guard receive(into: &buffer) else { return }
        case .timedOut:
          refuse(408, "the body took too long to arrive")
          return
        case .stopping: return
        }
      }
      let body = Data(buffer.prefix(head.contentLength))
      buffer.removeFirst(head.contentLength)
      served += 1
      let request = HTTPServerRequest(
        method: head.method, target: head.target, version: head.version,
        headers: head.headers.map { (name: $0.name, value: $0.value) }, body: body)
      let response = server.respond(to: request)
      let keepAlive =
        head.keepAlive && !server.isStopping && served < limits.maximumRequestsPerConnection
      guard write(response, keepAlive: keepAlive, omitBody: head.method == "HEAD") else { return }
      if !keepAlive {
        linger()
        return
      }
    }
  }

  /// Waits until the socket is readable, the deadline passes, or the server stops. Bytes already
  /// there count, even past the deadline: a thread that started late (a loaded machine) does not
  /// refuse a client that was on time.
  private func wait(until deadline: ContinuousClock.Instant) -> Wait {
    while true {
      if server.isStopping { return .stopping }
      let remaining = ContinuousClock.now.duration(to: deadline)
      let milliseconds =
        remaining <= .zero
        ? 0
        : Int32(
          clamping: remaining.components.seconds * 1000 + remaining.components.attoseconds
            / 1_000_000_000_000_000
            + 1)
      var fds = [
        pollfd(fd: fd, events: Int16(POLLIN), revents: 0),
        pollfd(fd: server.wakeDescriptor, events: Int16(POLLIN), revents: 0),
      ]
      let ready = poll(&fds, 2, milliseconds)
      if ready < 0 && errno != EINTR { return .stopping }
      if ready > 0 {
        if fds[1].revents != 0 { return .stopping }
        if fds[0].revents != 0 { return .readable }
      }
      if remaining <= .zero { return .timedOut }
    }
  }

  /// Reads what is there (the socket was readable); false at end of stream or on an error.
  private func receive(into buffer: inout [UInt8]) -> Bool {
    var chunk = [UInt8](repeating: 0, count: 16_384)
    while true {
      let count = recv(fd, &chunk, chunk.count, 0)
      if count < 0 && errno == EINTR { continue }
      guard count > 0 else { return false }
      buffer.append(contentsOf: chunk[0..<count])
      return true
    }
  }

  /// Answers a refused request and closes: the request's remains are not worth reading.
  private func refuse(_ status: Int, _ reason: String) {
    var response = HTTPServerResponse.text(
      status, "\(status) \(HTTPServerResponse.reason(status)): \(reason)\n")
    response.headers += server.refusalHeaders
    _ = write(response, keepAlive: false, omitBody: false)
    linger()
  }

  private func write(_ response: HTTPServerResponse, keepAlive: Bool, omitBody: Bool) -> Bool {
    let reserved: Set<String> = ["content-length", "connection", "date", "transfer-encoding"]
    var head = "HTTP/1.1 \(response.status) \(HTTPServerResponse.reason(response.status))\r\n"
    for (name, value) in response.headers where !reserved.contains(name.lowercased()) {
      // A handler's header can never split the response: CR and LF are dropped.
      let clean = { (text: String) in text.filter { $0 != "\r" && $0 != "\n" && $0 != "\r\n" } }
      head += "\(clean(name)): \(clean(value))\r\n"
    }
    head += "Date: \(Self.httpDate())\r\n"
    head += "Content-Length: \(response.body.count)\r\n"
    head += "Connection: \(keepAlive ? "keep-alive" : "close")\r\n\r\n"
    var bytes = Array(head.utf8)
    if !omitBody && response.status != 204 && response.status != 304 { bytes += response.body }
    return sendAll(bytes)
  }

  private func sendAll(_ bytes: [UInt8]) -> Bool {
    bytes.withUnsafeBytes { raw in
      var offset = 0
      while offset < raw.count {
        let sent = sendBytes(fd, raw.baseAddress! + offset, raw.count - offset)
        if sent < 0 && errno == EINTR { continue }
        // A timeout (SO_SNDTIMEO) or a closed peer ends the connection.
        guard sent > 0 else { return false }
        offset += sent
      }
      return true
    }
  }

  /// After the last response: stop sending, then read and drop what the client still sends (up
  /// to 2 s and 256 KiB, or until it closes), so closing does not reset the connection before the
  /// client read the answer.
  private func linger() {
    shutdown(fd, Int32(SHUT_WR))
    let deadline = ContinuousClock.now + .seconds(2)
    var scratch: [UInt8] = []
    var drained = 0
    while drained < 262_144, wait(until: deadline) == .readable, receive(into: &scratch) {
      drained += scratch.count
      scratch.removeAll(keepingCapacity: true)
    }
  }

  private static func httpDate() -> String {
    var now = time(nil)
    var parts = tm()
    gmtime_r(&now, &parts)
    var text = [Int8](repeating: 0, count: 64)
    let count = strftime(&text, text.count, "%a, %d %b %Y %H:%M:%S GMT", &parts)
    return String(decoding: text[0..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
  }
}
