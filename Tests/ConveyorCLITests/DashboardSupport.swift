import Foundation

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// A started `conveyor dashboard` and a raw HTTP/1.1 client for it (raw, so tests can set `Host`,
/// `Origin` and `Sec-Fetch-Site` as a browser or an attacker would).
struct DashboardProcess {
  let running: RunningConveyor
  /// `http://127.0.0.1:PORT/`.
  let url: URL
  let port: UInt16

  /// Seeds nothing; starts `conveyor dashboard --listen 127.0.0.1:0` (plus `arguments`) on the
  /// sandbox's database, or on `database`, and waits for its URL.
  static func start(
    _ sandbox: Sandbox, _ arguments: [String] = ["--listen", "127.0.0.1:0"], database: String? = nil
  ) async throws -> DashboardProcess {
    let running = try sandbox.start(
      (database.map { ["--database", $0] } ?? []) + ["dashboard"] + arguments, withDatabase: database == nil)
    let line = try await running.waitForLine("the dashboard's URL") { $0.hasPrefix("dashboard: http://") }
    let text = line.dropFirst("dashboard: ".count).prefix { $0 != " " }
    guard let url = URL(string: String(text)), let port = url.port.flatMap({ UInt16(exactly: $0) }) else {
      throw HarnessError(description: "no URL in \(line)")
    }
    return DashboardProcess(running: running, url: url, port: port)
  }

  /// A response: status, lower-cased header names (repeated ones joined with "\n"), body.
  struct Response: CustomStringConvertible {
    var status: Int
    var headers: [String: String]
    var body: String
    var description: String { "\(status) \(headers)\n\(body)" }

    /// Splits raw response bytes into status, lower-cased headers (repeats joined by newlines)
    /// and body; nil when the head is incomplete.
    init?(parsing bytes: [UInt8]?) {
      guard let bytes, let end = bytes.firstRange(of: [13, 10, 13, 10]) else { return nil }
      let head = String(decoding: bytes[..<end.lowerBound], as: UTF8.self).components(separatedBy: "\r\n")
      var fields: [String: String] = [:]
      for line in head.dropFirst() {
        guard let colon = line.firstIndex(of: ":") else { continue }
        let name = line[..<colon].lowercased()
        let value = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        fields[name] = fields[name].map { $0 + "\n" + value } ?? value
      }
      status = Int(head[0].split(separator: " ").dropFirst().first ?? "") ?? 0
      headers = fields
      body = String(decoding: bytes[end.upperBound...], as: UTF8.self)
    }
  }

  /// Sends one request with `Connection: close` and reads the whole answer.
  func request(
    _ method: String, _ target: String, headers: [(String, String)] = [], form: [(String, String)]? = nil,
    host: String? = nil
  ) async throws -> Response {
    var lines = ["\(method) \(target) HTTP/1.1", "Host: \(host ?? "127.0.0.1:\(port)")", "Connection: close"]
    lines += headers.map { "\($0.0): \($0.1)" }
    var body = ""
    if let form {
      body = form.map { formEncode($0.0) + "=" + formEncode($0.1) }.joined(separator: "&")
      lines += ["Content-Type: application/x-www-form-urlencoded", "Content-Length: \(body.utf8.count)"]
    }
    let raw = lines.joined(separator: "\r\n") + "\r\n\r\n" + body
    let port = port
    let bytes = await onThread { exchange(port: port, Array(raw.utf8)) }
    guard let response = Response(parsing: bytes) else {
      throw HarnessError(description: "no response to \(method) \(target)")
    }
    return response
  }

  /// GET with optional headers.
  func get(_ target: String, headers: [(String, String)] = []) async throws -> Response {
    try await request("GET", target, headers: headers)
  }

  /// The form token embedded in a page.
  static func formToken(in page: String) throws -> String {
    guard let range = page.range(of: #"name="csrf" value="([0-9a-f]{64})""#, options: .regularExpression)
    else {
      throw HarnessError(description: "no form token in the page")
    }
    return String(page[range].dropFirst(#"name="csrf" value=""#.count).prefix(64))
  }

  /// The value of the hidden field `name` of a form in `page`.
  static func field(_ name: String, in page: String) throws -> String {
    guard let range = page.range(of: #"name="\#(name)" value="[^"]*""#, options: .regularExpression) else {
      throw HarnessError(description: "no field \(name) in the page")
    }
    return String(page[range].dropFirst(#"name="\#(name)" value=""#.count).dropLast())
  }

  /// A POST as a browser sends it from the dashboard's own page.
  func post(_ target: String, _ form: [(String, String)], cookie: String? = nil) async throws -> Response {
    var headers = [("Origin", "http://127.0.0.1:\(port)"), ("Sec-Fetch-Site", "same-origin")]
    if let cookie { headers.append(("Cookie", cookie)) }
    return try await request("POST", target, headers: headers, form: form)
  }
}

func formEncode(_ text: String) -> String {
  var allowed = CharacterSet.alphanumerics
  allowed.insert(charactersIn: "-._~")
  return text.addingPercentEncoding(withAllowedCharacters: allowed) ?? text
}

/// Runs a blocking call on its own thread, keeping Swift's cooperative pool free.
func onThread<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
  await withCheckedContinuation { continuation in
    Thread { continuation.resume(returning: body()) }.start()
  }
}

/// Connects to `address`:`port` (127.0.0.1 unless told), sends `request`, reads until the server
/// closes or the body's `Content-Length` arrived (30 s at most).
func exchange(port: UInt16, address: String = "127.0.0.1", _ request: [UInt8]) -> [UInt8]? {
  guard let fd = connectLoopback(port: port, address: address) else { return nil }
  defer { close(fd) }
  var sent = 0
  while sent < request.count {
    let count = request.withUnsafeBytes { send(fd, $0.baseAddress! + sent, $0.count - sent, 0) }
    if count < 0 && errno == EINTR { continue }
    guard count > 0 else { return nil }
    sent += count
  }
  var response: [UInt8] = []
  var chunk = [UInt8](repeating: 0, count: 65_536)
  while true {
    // A signal (a child process ending) interrupts a read; it is not the end of the answer.
    let count = recv(fd, &chunk, chunk.count, 0)
    if count < 0 && errno == EINTR { continue }
    if count <= 0 { break }
    response += chunk[0..<count]
    if let end = response.firstRange(of: [13, 10, 13, 10]) {
      let head = String(decoding: response[..<end.lowerBound], as: UTF8.self).lowercased()
      let length = head.components(separatedBy: "\r\n").first { $0.hasPrefix("content-length:") }
        .flatMap { Int($0.dropFirst("content-length:".count).trimmingCharacters(in: .whitespaces)) }
      if let length, response.count >= end.upperBound + length { break }
    }
  }
  return response
}

/// A blocking TCP socket connected to `address`:`port` (127.0.0.1 unless told) whose reads give up
/// after 60 s (a hang guard), or nil.
func connectLoopback(port: UInt16, address loopback: String = "127.0.0.1") -> Int32? {
  #if canImport(Glibc)
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
  #else
    let fd = socket(AF_INET, SOCK_STREAM, 0)
  #endif
  guard fd >= 0 else { return nil }
  var timeout = timeval(tv_sec: 60, tv_usec: 0)
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
  var address = sockaddr_in()
  address.sin_family = sa_family_t(AF_INET)
  address.sin_port = port.bigEndian
  address.sin_addr = in_addr(s_addr: inet_addr(loopback))
  let connected = withUnsafePointer(to: &address) {
    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
      connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
    }
  }
  guard connected == 0 else {
    close(fd)
    return nil
  }
  return fd
}
