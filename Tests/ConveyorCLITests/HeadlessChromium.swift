import Foundation
import Synchronization

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// Debian's `chromium`, headless: `--dump-dom` and `--screenshot` runs, and a browser driven over
/// the DevTools protocol (a WebSocket) to click buttons and read the page as a person sees it.
enum Chromium {
  /// The executable, if installed (`.ci/run` installs it).
  static let path: String? = ["/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"]
    .first { FileManager.default.isExecutableFile(atPath: $0) }

  static let commonFlags = [
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
  ]

  /// Runs chromium with `arguments` to completion (killed after 60 s); returns standard output.
  static func run(_ arguments: [String], profile: URL) async throws -> String {
    guard let path else { throw HarnessError(description: "chromium is not installed") }
    let process = Process()
    process.executableURL = URL(fileURLWithPath: path)
    process.arguments = commonFlags + ["--user-data-dir=\(profile.path)"] + arguments
    try FileManager.default.createDirectory(at: profile, withIntermediateDirectories: true)
    let output = profile.appendingPathComponent("stdout-\(UUID().uuidString)")
    guard FileManager.default.createFile(atPath: output.path, contents: nil) else {
      throw HarnessError(description: "cannot create \(output.path)")
    }
    let handle = try FileHandle(forWritingTo: output)
    process.standardOutput = handle
    process.standardError = FileHandle.nullDevice
    try process.run()
    try handle.close()
    let deadline = ContinuousClock.now + .seconds(60)
    while process.isRunning {
      if ContinuousClock.now > deadline {
        process.terminate()
        throw HarnessError(description: "chromium \(arguments) did not finish in 60 s")
      }
      try await Task.sleep(for: .milliseconds(50))
    }
    return String(decoding: FileManager.default.contents(atPath: output.path) ?? Data(), as: UTF8.self)
  }

  /// The DOM chromium builds for `url` (scripts run, the policy applied).
  static func dumpDOM(_ url: URL, profile: URL) async throws -> String {
    try await run(["--dump-dom", url.absoluteString], profile: profile)
  }

  /// Saves a PNG of `url` at 1280×720.
  static func screenshot(_ url: URL, to file: URL, profile: URL) async throws {
    _ = try await run(
      ["--window-size=1280,720", "--screenshot=\(file.path)", url.absoluteString], profile: profile)
  }
}

/// A headless chromium kept running and driven over the DevTools protocol (JSON over a
/// WebSocket; the client is ``WebSocket``: swift-corelibs-foundation's URLSession cannot read the
/// DevTools server's headers).
final class DrivenBrowser {
  private let process: Process
  private let socket: WebSocket
  private var nextID = 0

  /// Starts chromium on `url`, with `flags` added to the usual ones, and connects to its page.
  init(_ url: URL, profile: URL, flags: [String] = []) async throws {
    guard let path = Chromium.path else { throw HarnessError(description: "chromium is not installed") }
    try FileManager.default.createDirectory(at: profile, withIntermediateDirectories: true)
    process = Process()
    process.executableURL = URL(fileURLWithPath: path)
    process.arguments =
      Chromium.commonFlags + [
        "--user-data-dir=\(profile.path)", "--remote-debugging-port=0", "--window-size=1280,720",
      ] + flags + [url.absoluteString]
    process.standardOutput = FileHandle.nullDevice
    process.standardError = FileHandle.nullDevice
    try process.run()
    do {
      socket = try await Self.connect(profile: profile, process: process)
    } catch {
      process.terminate()
      process.waitUntilExit()
      throw error
    }
  }

  /// Reads the DevTools port chromium writes into its profile, finds the page, opens its socket.
  private static func connect(profile: URL, process: Process) async throws -> WebSocket {
    let portFile = profile.appendingPathComponent("DevToolsActivePort")
    let deadline = ContinuousClock.now + .seconds(30)
    while ContinuousClock.now < deadline && process.isRunning {
      let text = (try? String(contentsOf: portFile, encoding: .utf8)) ?? ""
      if let port = UInt16(text.split(separator: "\n").first ?? ""),
        let bytes = await onThread({
          exchange(
            port: port, Array("GET /json/list HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".utf8))
        }),
        let end = bytes.firstRange(of: [13, 10, 13, 10]),
        let targets = try? JSONSerialization.jsonObject(with: Data(bytes[end.upperBound...]))
          as? [[String: Any]],
        let address = targets.first(where: { $0["type"] as? String == "page" })?["webSocketDebuggerUrl"]
          as? String,
        let url = URL(string: address)
      {
        return try await WebSocket.open(port: port, path: url.path)
      }
      try await Task.sleep(for: .milliseconds(100))
    }
    throw HarnessError(description: "chromium did not open its DevTools port with a page")
  }

  deinit {
    socket.close()
    if process.isRunning {
      // SIGTERM can leave headless chromium shutting down for half a minute; its helper
      // processes exit when it is gone.
      kill(process.processIdentifier, SIGKILL)
      process.waitUntilExit()
    }
  }

  /// Evaluates a JavaScript expression in the page; returns its value as text ("" on an error,
  /// e.g. while the page navigates).
  func evaluate(_ expression: String) async throws -> String {
    nextID += 1
    let id = nextID
    let command: [String: Any] = [
      "id": id, "method": "Runtime.evaluate",
      "params": ["expression": expression, "returnByValue": true, "awaitPromise": true],
    ]
    let text = String(decoding: try JSONSerialization.data(withJSONObject: command), as: UTF8.self)
    try await socket.send(text)
    while true {
      let message = try await socket.receive()
      guard let object = try JSONSerialization.jsonObject(with: Data(message.utf8)) as? [String: Any],
        object["id"] as? Int == id
      else { continue }
      let result = (object["result"] as? [String: Any])?["result"] as? [String: Any]
      if let value = result?["value"] { return "\(value)" }
      return ""
    }
  }

  /// Evaluates `expression` until it returns `"true"`; fails after `timeout` (a bound a hang
  /// blows through, not a pass criterion).
  func waitUntil(_ what: String, _ expression: String, timeout: Duration = .seconds(30)) async throws {
    let deadline = ContinuousClock.now + timeout
    while try await evaluate("String(Boolean(\(expression)))") != "true" {
      guard ContinuousClock.now < deadline else {
        let body = try await evaluate(
          "location.href + \" \" + document.documentElement.outerHTML.slice(0, 3000)")
        throw HarnessError(description: "timed out waiting for \(what); the page shows:\n\(body)")
      }
      try await Task.sleep(for: .milliseconds(100))
    }
  }
}

/// A minimal WebSocket client (RFC 6455) for the DevTools protocol: text frames, masked as a
/// client must, fragmented messages joined, pings ignored. Blocking calls run on their own threads.
final class WebSocket: Sendable {
  let fd: Int32
  /// Bytes received and not yet parsed; used by one call at a time.
  private let pending = Mutex<[UInt8]>([])

  private init(fd: Int32) { self.fd = fd }

  static func open(port: UInt16, path: String) async throws -> WebSocket {
    guard let fd = await onThread({ connectLoopback(port: port) }) else {
      throw HarnessError(description: "cannot connect to the DevTools port")
    }
    let socket = WebSocket(fd: fd)
    let key = Data((0..<16).map { _ in UInt8.random(in: 0...255) }).base64EncodedString()
    let request =
      "GET \(path) HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
      + "Sec-WebSocket-Key: \(key)\r\nSec-WebSocket-Version: 13\r\n\r\n"
    guard await socket.write(Array(request.utf8)) else {
      throw HarnessError(description: "handshake not sent")
    }
    let head = await onThread { socket.readHead() }
    guard let head, head.hasPrefix("HTTP/1.1 101") else {
      throw HarnessError(description: "WebSocket handshake refused: \(head ?? "no answer")")
    }
    return socket
  }

  func close() {
    shutdown(fd, Int32(SHUT_RDWR))
    #if canImport(Glibc)
      Glibc.close(fd)
    #else
      Darwin.close(fd)
    #endif
  }

  /// Sends one text frame.
  func send(_ text: String) async throws {
    let payload = Array(text.utf8)
    var frame: [UInt8] = [0x81]
    if payload.count < 126 {
      frame.append(0x80 | UInt8(payload.count))
    } else if payload.count <= 0xFFFF {
      frame += [0x80 | 126, UInt8(payload.count >> 8), UInt8(payload.count & 0xFF)]
    } else {
      frame.append(0x80 | 127)
      frame += (0..<8).reversed().map { UInt8((UInt64(payload.count) >> (8 * UInt64($0))) & 0xFF) }
    }
    let mask = (0..<4).map { _ in UInt8.random(in: 0...255) }
    frame += mask
    frame += payload.enumerated().map { $0.element ^ mask[$0.offset % 4] }
    guard await write(frame) else { throw HarnessError(description: "the DevTools socket closed") }
  }

  /// Receives the next complete text message.
  func receive() async throws -> String {
    guard let message = await onThread({ self.readMessage() }) else {
      throw HarnessError(description: "the DevTools socket closed")
    }
    return message
  }

  private func write(_ bytes: [UInt8]) async -> Bool {
    let fd = fd
    return await onThread {
      bytes.withUnsafeBytes { raw in
        var offset = 0
        while offset < raw.count {
          #if canImport(Glibc)
            let sent = Glibc.send(fd, raw.baseAddress! + offset, raw.count - offset, Int32(MSG_NOSIGNAL))
          #else
            let sent = Darwin.send(fd, raw.baseAddress! + offset, raw.count - offset, 0)
          #endif
          guard sent > 0 else { return false }
          offset += sent
        }
        return true
      }
    }
  }

  /// Blocking: reads up to the end of the handshake's head.
  private func readHead() -> String? {
    pending.withLock { buffer in
      while true {
        if let end = buffer.firstRange(of: [13, 10, 13, 10]) {
          let head = String(decoding: buffer[..<end.lowerBound], as: UTF8.self)
          buffer.removeFirst(end.upperBound)
          return head
        }
        guard Self.fill(fd, &buffer) else { return nil }
      }
    }
  }

  /// Blocking: reads frames until a whole text message arrived.
  private func readMessage() -> String? {
    pending.withLock { buffer in
      var message: [UInt8] = []
      while true {
        guard let (final, opcode, payload) = Self.frame(fd, &buffer) else { return nil }
        if opcode == 0x8 { return nil }
        if opcode == 0x1 || opcode == 0x0 { message += payload }
        if final && (opcode == 0x1 || opcode == 0x0) { return String(decoding: message, as: UTF8.self) }
      }
    }
  }

  private static func frame(_ fd: Int32, _ buffer: inout [UInt8]) -> (Bool, UInt8, [UInt8])? {
    func need(_ count: Int) -> Bool {
      while buffer.count < count { guard fill(fd, &buffer) else { return false } }
      return true
    }
    guard need(2) else { return nil }
    let final = buffer[0] & 0x80 != 0
    let opcode = buffer[0] & 0x0F
    var length = Int(buffer[1] & 0x7F)
    var header = 2
    if length == 126 {
      guard need(4) else { return nil }
      length = Int(buffer[2]) << 8 | Int(buffer[3])
      header = 4
    } else if length == 127 {
      guard need(10) else { return nil }
      length = (2..<10).reduce(0) { $0 << 8 | Int(buffer[$1]) }
      header = 10
    }
    guard need(header + length) else { return nil }
    let payload = Array(buffer[header..<(header + length)])
    buffer.removeFirst(header + length)
    return (final, opcode, payload)
  }

  private static func fill(_ fd: Int32, _ buffer: inout [UInt8]) -> Bool {
    var chunk = [UInt8](repeating: 0, count: 65_536)
    let count = recv(fd, &chunk, chunk.count, 0)
    guard count > 0 else { return false }
    buffer += chunk[0..<count]
    return true
  }
}
