import Foundation
import LoopbackHTTPServer
import Synchronization
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// Adversarial review of issue 8 through the built `conveyor` binary. Tests for the defects it found carry a
/// "Fixed (failed before the fix)" comment.
@Suite struct ReviewHostileInputTests {
  // Fixed (failed before the fix): `conveyor status` prints the database path as given, raw: an ESC sequence recolours
  // the terminal and a newline fakes a line of output. Every other user-visible string goes
  // through printable(). Promise (issue 8): control characters are escaped in everything
  // `conveyor` prints. Where: CLI.status in Sources/conveyor/CLI.swift,
  // `output("database  \(store.path)")`.
  @Test func statusEscapesControlCharactersInTheDatabasePath() async throws {
    let sandbox = try Sandbox()
    let path = sandbox.path("x\u{1B}[31mred\nqueue     forged.sqlite")
    let outcome = try await sandbox.run(["--database", path, "status"], withDatabase: false)
    #expect(outcome.status == 0, "\(outcome)")
    #expect(!outcome.stdout.contains("\u{1B}"), "raw ESC in: \(outcome.stdout.debugDescription)")
    #expect(
      outcome.lines.filter { $0.hasPrefix("queue ") }.count == 1,
      "a forged line: \(outcome.stdout.debugDescription)")
  }

  // Fixed (failed before the fix): a command that leaves the worker's process group (setsid, as daemons and many
  // wrappers do) keeps running after the worker is SIGKILLed. The supervisor only kills its own
  // process group (`kill(0, SIGKILL)`), never the command's PID, so the command itself (not even a
  // grandchild) escapes. Promise (issue 8, ChildProcess docs): "the command does not outlive the
  // worker, even one killed with SIGKILL". Where: ChildProcess.supervise in
  // Sources/conveyor/ChildProcess.swift (the SIGUSR1 handler).
  @Test func aCommandThatCallsSetsidDiesWhenTheWorkerIsKilled() async throws {
    guard FileManager.default.isExecutableFile(atPath: "/usr/bin/setsid") else { return }
    let sandbox = try Sandbox()
    let pidFile = sandbox.path("command.pid")
    // `exec setsid sleep`: the command's own process becomes a session leader; util-linux setsid
    // does not fork when the caller is not a process-group leader (the supervisor is).
    try await sandbox.add(["exec", "--", "sh", "-c", "echo $$ > '\(pidFile)'; exec setsid sleep 300"])
    let worker = try sandbox.start(["work"])
    var pid: pid_t = 0
    try await worker.waitUntil("the command to start") {
      pid = readPID(pidFile) ?? 0
      return pid > 0 && commandLine(of: pid).hasPrefix("sleep")
    }
    defer { kill(pid, SIGKILL) }
    worker.signal(SIGKILL)
    _ = try await worker.waitForExit()
    let deadline = ContinuousClock.now + .seconds(15)
    while isAlive(pid), ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(50)) }
    #expect(!isAlive(pid), "command \(pid) (\(commandLine(of: pid))) outlived the SIGKILLed worker")
  }

  // Fixed (failed before the fix): the same escape defeats `add exec --timeout`: SIGTERM and then SIGKILL go to the
  // supervisor's process group only; the job is recorded as timed out and retried (here: dead)
  // while the command keeps running, so a retry runs it twice at once. Promise (`add exec
  // --help`): "--timeout S  seconds before it is stopped and retried". Where: ChildProcess
  // .stop(after:) / signalGroup signal `-pid` only.
  @Test func aTimedOutCommandThatCallsSetsidIsStopped() async throws {
    guard FileManager.default.isExecutableFile(atPath: "/usr/bin/setsid") else { return }
    let sandbox = try Sandbox()
    let pidFile = sandbox.path("command.pid")
    // 5 s, not 1: under a full test run on two cores, starting the shell once took longer than
    // a 1 s timeout, which stopped it before it wrote its pid.
    try await sandbox.add([
      "exec", "--timeout", "5", "--", "sh", "-c", "echo $$ > '\(pidFile)'; exec setsid sleep 300",
    ])
    let outcome = try await sandbox.run(
      ["work", "--until-empty", "--max-attempts", "1"], timeout: .seconds(60))
    let pid = readPID(pidFile) ?? 0
    defer { if pid > 0 { kill(pid, SIGKILL) } }
    #expect(outcome.stdout.contains("timed out"), "\(outcome)")
    #expect(pid > 0)
    #expect(!isAlive(pid), "command \(pid) (\(commandLine(of: pid))) still runs after its job timed out")
  }

  // Fixed (failed before the fix): credentials in the URL's userinfo reach another origin: the job's server answers
  // `302 Location: //127.0.0.1:<other port>/...` (scheme-relative), swift-corelibs-foundation
  // keeps user:password from the original URL, and libcurl sends them as Basic credentials to
  // the other server. Promise (`add http --help`, issue 8): "A redirect to another host drops
  // Authorization, Cookie and Proxy-Authorization". Where: NetworkSession.redirect(_:from:)
  // (Sources/ConveyorNetworking/NetworkSession.swift) strips headers only, not URL userinfo.
  @Test func userinfoCredentialsAreNotSentToAnotherOriginOnARedirect() async throws {
    let sandbox = try Sandbox()
    let elsewhere = try LoopbackHTTPServer { _, _ in .ok() }
    defer { elsewhere.stop() }
    let origin = try LoopbackHTTPServer { _, _ in
      .status(302, "", headers: [("Location", "//127.0.0.1:\(elsewhere.port)/landed")])
    }
    defer { origin.stop() }
    try await sandbox.add(["http", "GET", "http://user:s3cret@127.0.0.1:\(origin.port)/start"])
    let outcome = try await sandbox.run(["work", "--until-empty", "--max-attempts", "1"])
    #expect(outcome.stdout.contains("1 delivered"), "\(outcome)")
    let landed = try #require(elsewhere.requests.first)
    #expect(
      landed.header("authorization") == nil, "sent to another origin: \(landed.header("authorization") ?? "")"
    )
  }

  // KNOWN GAP (not fixed; README "Known gaps"): the body of a redirect response is not bounded: swift-corelibs-foundation keeps the
  // whole body of every 3xx in memory (`lastRedirectBody`), re-copying it on every chunk, so a
  // 302 with a large body is never got past: the worker burns CPU and memory until the job's
  // deadline. A client that bounded response bodies would drop it and reach the redirect's
  // target (here in a second or two). Promise (issue 8, HTTPDelivery): bounded memory for
  // response bodies, "only the first reasonBodyLimit bytes of a response body are kept; the rest
  // is received and dropped". Where: NetworkSession/TaskRouter rely on `keepingAtMost` applied to
  // didReceive(data:), which never sees 3xx bodies; nothing limits them.
  @Test func aRedirectWithAHugeBodyIsFollowedWithoutHoldingTheBody() async throws {
    let time = URL(fileURLWithPath: "/usr/bin/time")
    guard FileManager.default.isExecutableFile(atPath: time.path) else { return }
    let sandbox = try Sandbox()
    let size = 64 << 20
    let server = try StreamingServer { path, send in
      if path == "/done" {
        _ = send(Data("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok".utf8))
        return
      }
      guard
        send(
          Data(
            "HTTP/1.1 302 Found\r\nLocation: /done\r\nContent-Length: \(size)\r\nConnection: close\r\n\r\n"
              .utf8))
      else { return }
      let chunk = Data(repeating: 0x78, count: 1 << 20)
      for _ in 0..<(size >> 20) where send(chunk) {}
    }
    defer { server.stop() }
    try await sandbox.add(["http", "--timeout", "15", "GET", "http://127.0.0.1:\(server.port)/big"])
    let report = sandbox.path("rss.txt")
    let running = try RunningConveyor(
      executable: time,
      arguments: [
        "-f", "%M", "-o", report, try ConveyorBinary.required().path, "--database", sandbox.database, "work",
        "--until-empty", "--max-attempts", "1",
      ], environment: ProcessInfo.processInfo.environment, folder: sandbox.folder)
    let outcome = try await running.waitForExit(timeout: .seconds(90))
    // The whole-request deadline bounds the time; what Foundation holds meanwhile is not bounded.
    withKnownIssue("swift-corelibs-foundation buffers every 3xx body whole", isIntermittent: true) {
      #expect(outcome.stdout.contains("1 delivered"), "\(outcome)")
      let text = String(decoding: FileManager.default.contents(atPath: report) ?? Data(), as: UTF8.self)
      if let kilobytes = text.split(separator: "\n").compactMap({ Int($0) }).last {
        #expect(kilobytes < 60_000, "peak resident memory \(kilobytes) KB")
      }
    }
  }

  // Passes: options after the command belong to it; misplaced or unknown ones are usage errors;
  // hostile header names/values and methods are refused before anything is stored. (A NUL cannot
  // be tested here: argv truncates at it.)
  @Test(arguments: [
    ["status", "--queue", "x"], ["list", "-d", "x.sqlite"], ["work", "--until-empty=yes"],
    ["list", "--status", "ready\u{1B}[2J"], ["remove", "--", "1"], ["retry", "0"],
    ["add", "--key", "k", "http"],
    ["add", "http", "GET", "http://127.0.0.1:1/", "-H", "X-A\u{2028}B: v"],
    ["add", "http", "GET", "http://127.0.0.1:1/", "-H", "X: a\u{85}b"],
    ["add", "http", "GET", "http://127.0.0.1:0/"],
    ["add", "http", "HEAD", "http://127.0.0.1:1/", "--data", "x"],
    ["add", "http", "POST", "http://127.0.0.1:1/", "-H", "host: evil"],
  ])
  func misplacedOrHostileWordsAreUsageErrors(_ words: [String]) async throws {
    let sandbox = try Sandbox()
    let outcome = try await sandbox.run(words)
    #expect(outcome.status == 2, "\(words.debugDescription): \(outcome)")
    #expect(!outcome.stderr.contains("\u{1B}") && !outcome.stderr.contains("\u{0}"), "\(outcome)")
    #expect(
      !FileManager.default.fileExists(atPath: sandbox.database),
      "\(words.debugDescription) created the database")
  }
}

/// The process ID written to `path`, if any.
private func readPID(_ path: String) -> pid_t? {
  (FileManager.default.contents(atPath: path)).flatMap {
    pid_t(String(decoding: $0, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines))
  }
}

/// The command line of a running process (empty once it is gone or a zombie).
private func commandLine(of pid: pid_t) -> String {
  let data = FileManager.default.contents(atPath: "/proc/\(pid)/cmdline") ?? Data()
  return String(decoding: data.map { $0 == 0 ? 0x20 : $0 }, as: UTF8.self)
}

/// A raw HTTP server on 127.0.0.1 that hands each request's path to `handler` with a `send`
/// function (false once the peer is gone), so a body of any size is streamed, never held.
private final class StreamingServer: Sendable {
  let port: UInt16
  private let listener: Int32

  init(_ handler: @escaping @Sendable (_ path: String, _ send: (Data) -> Bool) -> Void) throws {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    var one: Int32 = 1
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr = in_addr(s_addr: inet_addr("127.0.0.1"))
    let bound = withUnsafePointer(to: &address) {
      $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
        bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
      }
    }
    guard bound == 0, listen(fd, 16) == 0 else {
      close(fd)
      throw HarnessError(description: "bind/listen failed: \(errno)")
    }
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    _ = withUnsafeMutablePointer(to: &address) {
      $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
    }
    port = UInt16(bigEndian: address.sin_port)
    listener = fd
    Thread.detachNewThread {
      while true {  // ends when stop() closes the listener
        let client = accept(fd, nil, nil)
        if client < 0 { if errno == EINTR { continue } else { break } }
        Thread.detachNewThread {
          defer { close(client) }
          var head = Data()
          var buffer = [UInt8](repeating: 0, count: 4096)
          while head.range(of: Data("\r\n\r\n".utf8)) == nil {
            let count = recv(client, &buffer, buffer.count, 0)
            if count <= 0 { return }
            head.append(contentsOf: buffer[0..<count])
          }
          let line = String(decoding: head, as: UTF8.self).split(separator: "\r\n").first ?? ""
          let words = line.split(separator: " ")
          let path = words.count > 1 ? String(words[1]) : "/"
          handler(path) { data in
            data.withUnsafeBytes { bytes in
              var offset = 0
              while offset < bytes.count {
                let sent = send(
                  client, bytes.baseAddress! + offset, bytes.count - offset, Int32(MSG_NOSIGNAL))
                if sent <= 0 { return false }
                offset += sent
              }
              return true
            }
          }
        }
      }
    }
  }

  func stop() {
    shutdown(listener, Int32(SHUT_RDWR))
    close(listener)
  }
}
