import Foundation

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// A small TLS-terminating reverse proxy in front of a dashboard, as an operator would run nginx:
/// Python's `http.server` with the `ssl` module and a self-signed certificate made by `openssl`,
/// forwarding every request to `127.0.0.1:UPSTREAM`. It keeps the browser's `Host`, or rewrites it
/// to the upstream's address as nginx does by default (`proxy_set_header Host $proxy_host`).
final class TLSProxy {
  /// How the proxy passes the `Host` header on.
  enum HostHandling: String {
    /// The browser's, as `proxy_set_header Host $host` does.
    case keep
    /// The upstream's address (nginx's default).
    case rewrite
  }

  /// `/usr/bin/python3` and `/usr/bin/openssl`, when both are installed.
  static var isAvailable: Bool {
    ["/usr/bin/python3", "/usr/bin/openssl"].allSatisfy { FileManager.default.isExecutableFile(atPath: $0) }
  }

  /// The port it serves https on, on 127.0.0.1.
  let port: UInt16
  private let process: Process
  private let input: Pipe

  /// Makes a certificate in `folder`, starts the proxy and reads its port; ``forward(to:)`` then
  /// gives it the upstream's port (known only once the dashboard started with the proxy's URL).
  init(in folder: URL, host: HostHandling) async throws {
    let certificate = folder.appendingPathComponent("proxy-cert.pem").path
    let key = folder.appendingPathComponent("proxy-key.pem").path
    let script = folder.appendingPathComponent("proxy.py").path
    try Self.run(
      "/usr/bin/openssl",
      [
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", certificate, "-days", "2",
        "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
      ])
    guard FileManager.default.createFile(atPath: script, contents: Data(Self.script.utf8)) else {
      throw HarnessError(description: "cannot write \(script)")
    }
    let output = folder.appendingPathComponent("proxy-\(UUID().uuidString).out")
    guard FileManager.default.createFile(atPath: output.path, contents: nil) else {
      throw HarnessError(description: "cannot create \(output.path)")
    }
    let handle = try FileHandle(forWritingTo: output)
    defer { closeQuietly(handle) }
    input = Pipe()
    process = Process()
    process.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
    process.arguments = [script, certificate, key, host.rawValue]
    process.standardInput = input
    process.standardOutput = handle
    process.standardError = handle
    try process.run()
    let deadline = ContinuousClock.now + .seconds(30)
    var port: UInt16?
    while port == nil {
      let text = String(decoding: FileManager.default.contents(atPath: output.path) ?? Data(), as: UTF8.self)
      port = text.split(separator: "\n").first.flatMap { UInt16($0) }
      guard port == nil else { break }
      guard process.isRunning, ContinuousClock.now < deadline else {
        kill(process.processIdentifier, SIGKILL)
        throw HarnessError(description: "the TLS proxy did not start: \(text)")
      }
      try await Task.sleep(for: .milliseconds(20))
    }
    self.port = port ?? 0
  }

  deinit {
    kill(process.processIdentifier, SIGKILL)
  }

  /// Sends requests on to 127.0.0.1:`upstream` from now on.
  func forward(to upstream: UInt16) {
    input.fileHandleForWriting.write(Data("\(upstream)\n".utf8))
  }

  private static func run(_ executable: String, _ arguments: [String]) throws {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: executable)
    process.arguments = arguments
    process.standardOutput = FileHandle.nullDevice
    process.standardError = FileHandle.nullDevice
    try process.run()
    process.waitUntilExit()
    guard process.terminationStatus == 0 else {
      throw HarnessError(description: "\(executable) \(arguments) failed: \(process.terminationStatus)")
    }
  }

  /// The proxy: prints its port, reads the upstream's from standard input, then forwards each
  /// request (hop-by-hop headers dropped, `X-Forwarded-Proto: https` added), one thread each.
  static let script = #"""
    import http.client, http.server, ssl, sys

    certificate, key, host_handling = sys.argv[1], sys.argv[2], sys.argv[3]
    HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade"}
    upstream_port = None

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self):
            self.request.do_handshake()
            super().setup()

        def forward(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            upstream = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=60)
            upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for name, value in self.headers.items():
                if name.lower() in HOP:
                    continue
                if name.lower() == "host" and host_handling == "rewrite":
                    value = "127.0.0.1:%d" % upstream_port
                upstream.putheader(name, value)
            upstream.putheader("X-Forwarded-Proto", "https")
            upstream.endheaders(body)
            response = upstream.getresponse()
            data = response.read()
            self.send_response_only(response.status, response.reason)
            for name, value in response.getheaders():
                if name.lower() in HOP or name.lower() == "content-length":
                    continue
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
            upstream.close()

        do_GET = do_POST = do_HEAD = forward

        def log_message(self, *arguments):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certificate, key)
    server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    print(server.server_address[1], flush=True)
    upstream_port = int(sys.stdin.readline())
    server.serve_forever()
    """#
}
