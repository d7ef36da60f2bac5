import Foundation

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// A raw HTTP server on 127.0.0.1 that hands each request's path to `handler` with a `send`
/// function (false once the peer is gone), so a body of any size is streamed, never held.
final class StreamingServer: Sendable {
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
