import Foundation
import Synchronization

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// A command started with `posix_spawn` in a clean state: default signal dispositions, nothing
/// blocked, in a process group of its own, with only standard input, output and error open.
///
/// `Foundation.Process` on Linux passes the spawning thread's signal mask on, and the worker's
/// threads block almost every signal, so a command started that way ignored `SIGTERM` (its
/// timeout could not stop it) and could not use signals itself. Its own process group keeps a
/// terminal's Ctrl-C for the worker, which then lets running commands finish, and lets a timeout
/// stop the command's children too.
///
/// On Linux the command does not outlive the worker, even one killed with SIGKILL: it starts
/// under a supervisor (this executable, run as `conveyor \(supervisorWord) …`), the leader of the
/// process group, which asks for a parent-death signal and, when the worker dies, kills the whole
/// group. Otherwise the supervisor only waits for the command and exits as it did. Commands are
/// spawned from one thread that never ends, because the parent-death signal fires when the thread
/// that spawned the process ends, not the process.
final class ChildProcess: Sendable {
  /// How a command ended.
  enum Status: Equatable {
    case exited(Int32)
    case signalled(Int32)
    /// Waiting failed with this `errno`; how the command ended is unknown.
    case unknown(Int32)
  }

  /// Why the command could not be started.
  struct StartError: Error, CustomStringConvertible {
    var description: String
  }

  /// The process ID, which is also its process group ID.
  let pid: pid_t
  /// Set when `stop(after:)` signalled the command.
  private let stopped = Mutex(false)

  /// The commands of this process. Commands are started, signalled and reaped under its lock, so
  /// a signal never hits a process that reused a reaped command's ID, and `killAll` misses none.
  private struct Registry {
    /// Started and not yet reaped.
    var running: Set<pid_t> = []
    /// Set by `killAll`: no command starts after it.
    var closed = false
  }

  private static let registry = Mutex(Registry())

  /// Starts `executable` with `arguments` (the first is the program's name), standard input from
  /// `/dev/null`, and standard output and error on `output`.
  init(executable: String, arguments: [String], directory: String?, output: Int32) throws {
    pid = try Self.spawner.run {
      Result {
        try Self.spawn(executable: executable, arguments: arguments, directory: directory, output: output)
      }
    }.get()
  }

  /// Spawns the command (under its supervisor on Linux) and registers it; runs on the spawn thread.
  private static func spawn(executable: String, arguments: [String], directory: String?, output: Int32) throws
    -> pid_t
  {
    #if canImport(Darwin)
      var actions: posix_spawn_file_actions_t?
      var attributes: posix_spawnattr_t?
    #else
      var actions = posix_spawn_file_actions_t()
      var attributes = posix_spawnattr_t()
    #endif
    try Self.check(posix_spawn_file_actions_init(&actions), "posix_spawn_file_actions_init")
    defer { posix_spawn_file_actions_destroy(&actions) }
    try Self.check(posix_spawnattr_init(&attributes), "posix_spawnattr_init")
    defer { posix_spawnattr_destroy(&attributes) }

    try Self.check(posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0), "stdin")
    try Self.check(posix_spawn_file_actions_adddup2(&actions, output, 1), "stdout")
    try Self.check(posix_spawn_file_actions_adddup2(&actions, output, 2), "stderr")
    if let directory { try Self.check(Self.addChangeDirectory(&actions, directory), "working directory") }
    #if canImport(Darwin)
      let closeOthers = POSIX_SPAWN_CLOEXEC_DEFAULT
    #else
      try Self.check(Self.addCloseFrom(&actions, 3), "closing other descriptors")
      let closeOthers: Int32 = 0
    #endif
    var nothing = sigset_t()
    sigemptyset(&nothing)
    try Self.check(posix_spawnattr_setsigmask(&attributes, &nothing), "signal mask")
    var everything = sigset_t()
    sigfillset(&everything)
    sigdelset(&everything, SIGKILL)
    sigdelset(&everything, SIGSTOP)
    try Self.check(posix_spawnattr_setsigdefault(&attributes, &everything), "signal dispositions")
    try Self.check(posix_spawnattr_setpgroup(&attributes, 0), "process group")
    let flags = POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP | closeOthers
    try Self.check(posix_spawnattr_setflags(&attributes, Int16(flags)), "flags")

    #if os(Linux)
      let supervisor = "/proc/self/exe"
      let words = ["conveyor", Self.supervisorWord, String(getpid()), executable] + arguments
    #else
      let supervisor = executable
      let words = arguments
    #endif
    let argv = words.map { strdup($0) } + [nil]
    let environment = ProcessInfo.processInfo.environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
    defer { for pointer in argv + environment { free(pointer) } }
    var pid = pid_t()
    let result = Self.registry.withLock { registry -> Int32 in
      guard !registry.closed else { return ECANCELED }
      let result = posix_spawn(&pid, supervisor, &actions, &attributes, argv, environment)
      if result == 0 { registry.running.insert(pid) }
      return result
    }
    try Self.check(result, executable)
    return pid
  }

  /// The word after which `conveyor` acts as a command's supervisor: `conveyor WORD PARENT-PID
  /// EXECUTABLE ARGV0 [ARGUMENTS...]`.
  static let supervisorWord = "__supervise-command"

  /// The thread every command is spawned from: it never ends, so no parent-death signal fires
  /// while the worker lives.
  private static let spawner = SpawnThread()

  /// Runs as `conveyor __supervise-command PARENT-PID EXECUTABLE ARGV0 [ARGUMENTS...]` in the
  /// command's process group (Linux): kills the group when the worker dies, else waits for the
  /// command and exits as it did. Never returns.
  static func supervise(_ words: [String]) -> Never {
    guard words.count >= 3, let parent = pid_t(words[0]) else {
      printError("conveyor: \(supervisorWord) is for conveyor's own use")
      exit(ExitCode.usage.rawValue)
    }
    #if os(Linux)
      // Stop requests go to the whole group from the worker; the command decides about them. A
      // command that left the group (setsid) gets a SIGTERM passed on.
      for number in [SIGINT, SIGHUP] { signal(number, SIG_IGN) }
      signal(SIGTERM) { _ in
        let command = supervisedCommand
        if command > 0 && getpgid(command) != getpgrp() { kill(command, SIGTERM) }
      }
      // The parent-death signal, and the worker's "kill now": end the command, even one that left
      // the group, and the whole group.
      // While the command is being started (its ID not stored yet), the handler leaves the
      // killing to the check after the start: killing the group at once would end this process
      // and leave a command that left the group (setsid) running, as a worker killed right after
      // its command started did.
      signal(SIGUSR1) { _ in
        guard supervisedCommand > 0 else {
          killRequested = 1
          return
        }
        kill(supervisedCommand, SIGKILL)
        kill(0, SIGKILL)
      }
      typealias Prctl = @convention(c) (Int32, UInt, UInt, UInt, UInt) -> Int32
      if let library = dlopen(nil, RTLD_NOW), let symbol = dlsym(library, "prctl") {
        let setParentDeathSignal: Int32 = 1  // PR_SET_PDEATHSIG in <linux/prctl.h>; not imported
        _ = unsafeBitCast(symbol, to: Prctl.self)(setParentDeathSignal, UInt(SIGUSR1), 0, 0, 0)
      }
      if getppid() != parent { kill(0, SIGKILL) }  // the worker died before the request
      var attributes = posix_spawnattr_t()
      posix_spawnattr_init(&attributes)
      var nothing = sigset_t()
      sigemptyset(&nothing)
      posix_spawnattr_setsigmask(&attributes, &nothing)
      var everything = sigset_t()
      sigfillset(&everything)
      sigdelset(&everything, SIGKILL)
      sigdelset(&everything, SIGSTOP)
      posix_spawnattr_setsigdefault(&attributes, &everything)
      posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
      let argv = words.dropFirst(2).map { strdup($0) } + [nil]
      var child = pid_t()
      let result = posix_spawn(&child, words[1], nil, &attributes, argv, environ)
      guard result == 0 else {
        printError("conveyor: cannot start \(words[1]): \(String(cString: strerror(result)))")
        exit(127)
      }
      supervisedCommand = child
      if killRequested != 0 || getppid() != parent {  // asked to kill, or the worker died, meanwhile
        kill(child, SIGKILL)
        kill(0, SIGKILL)
      }
      var status: Int32 = 0
      while waitpid(child, &status, 0) == -1 && errno == EINTR {}
      let number = status & 0x7F
      if number == 0 { exit((status >> 8) & 0xFF) }
      // Die of the same signal, so the worker sees what the command saw.
      signal(number, SIG_DFL)
      var unblocked = sigset_t()
      sigemptyset(&unblocked)
      sigaddset(&unblocked, number)
      sigprocmask(SIG_UNBLOCK, &unblocked, nil)
      kill(getpid(), number)
      exit(128 + number)
    #else
      exit(ExitCode.usage.rawValue)  // commands are started directly here
    #endif
  }

  /// Sends SIGKILL to every running command's process group, and starts no command after: the
  /// worker is exiting at once and their jobs will run again, so they must not go on unwatched.
  static func killAll() {
    registry.withLock { registry in
      registry.closed = true
      for pid in registry.running { Self.killNow(supervisor: pid) }
    }
  }

  /// Kills a command at once: on Linux by asking its supervisor (`pid`), which kills the command
  /// even if it left the process group, then the group; elsewhere the process group.
  private static func killNow(supervisor pid: pid_t) {
    #if os(Linux)
      Glibc.kill(pid, SIGUSR1)
    #else
      Darwin.kill(-pid, SIGKILL)
    #endif
  }

  #if canImport(Darwin)
    private static func addChangeDirectory(_ actions: inout posix_spawn_file_actions_t?, _ path: String)
      -> Int32
    {
      posix_spawn_file_actions_addchdir_np(&actions, path)
    }
  #else
    /// `posix_spawn_file_actions_addchdir_np` (glibc 2.29 and later); ENOSYS without it.
    private static func addChangeDirectory(_ actions: inout posix_spawn_file_actions_t, _ path: String)
      -> Int32
    {
      typealias Function =
        @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, UnsafePointer<CChar>) -> Int32
      guard let function = gnuFunction("posix_spawn_file_actions_addchdir_np", as: Function.self) else {
        return ENOSYS
      }
      return function(&actions, path)
    }

    /// `posix_spawn_file_actions_addclosefrom_np` (glibc 2.34 and later), so the command does not
    /// inherit the worker's descriptors (a pipe held by a command keeps its reader waiting). An
    /// older glibc lacks it: the command then inherits descriptors not marked close-on-exec.
    private static func addCloseFrom(_ actions: inout posix_spawn_file_actions_t, _ first: Int32) -> Int32 {
      typealias Function = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32
      guard let function = gnuFunction("posix_spawn_file_actions_addclosefrom_np", as: Function.self) else {
        return 0
      }
      return function(&actions, first)
    }

    /// A GNU extension of glibc, looked up at run time: the Glibc module does not declare them.
    private static func gnuFunction<Function>(_ name: String, as type: Function.Type) -> Function? {
      guard let library = dlopen(nil, RTLD_NOW) else { return nil }
      defer { dlclose(library) }
      return dlsym(library, name).map { unsafeBitCast($0, to: type) }
    }
  #endif

  private static func check(_ result: Int32, _ what: String) throws {
    guard result == 0 else { throw StartError(description: "\(what): \(String(cString: strerror(result)))") }
  }

  /// Whether `stop(after:)` had to signal the command.
  var wasStopped: Bool { stopped.withLock { $0 } }

  /// After `seconds`, sends SIGTERM to the command's process group if it is still running, and
  /// SIGKILL 5 seconds later if it is still running then.
  func stop(after seconds: Double) {
    DispatchQueue.global().asyncAfter(deadline: .now() + seconds) { [self] in
      guard signalGroup(SIGTERM, stopping: true) else { return }
      DispatchQueue.global().asyncAfter(deadline: .now() + 5) { [self] in _ = signalGroup(SIGKILL) }
    }
  }

  /// Signals the process group unless the process was reaped; returns whether it signalled.
  /// `stopping` marks the command as stopped in the same step, so `wasStopped` is set by the time
  /// `waitForExit` returns.
  private func signalGroup(_ signal: Int32, stopping: Bool = false) -> Bool {
    Self.registry.withLock { registry in
      guard registry.running.contains(pid) else { return false }
      if stopping { stopped.withLock { $0 = true } }
      if signal == SIGKILL { Self.killNow(supervisor: pid) } else { kill(-pid, signal) }
      return true
    }
  }

  /// Waits (on a thread of its own, as waiting blocks) until the command exits, and reaps it.
  func waitForExit() async -> Status {
    await withCheckedContinuation { continuation in
      Thread.detachNewThread { [self] in
        // Wait without reaping first: until it is reaped under the lock, `signalGroup` cannot
        // hit a process that reused the ID.
        var info = siginfo_t()
        while waitid(P_PID, id_t(pid), &info, WEXITED | WNOWAIT) == -1 && errno == EINTR {}
        var status: Int32 = 0
        let failure = Self.registry.withLock { registry -> Int32? in
          var result: pid_t
          repeat { result = waitpid(pid, &status, 0) } while result == -1 && errno == EINTR
          registry.running.remove(pid)
          return result == -1 ? errno : nil
        }
        // The wait(2) status word: the low 7 bits are the signal, or 0 and the exit code above.
        let signal = status & 0x7F
        continuation.resume(
          returning: failure.map(Status.unknown)
            ?? (signal == 0 ? .exited((status >> 8) & 0xFF) : .signalled(signal)))
      }
    }
  }
}

/// A thread that runs the closures given to it, one at a time, for the life of the process.
private final class SpawnThread: Sendable {
  private let work = Mutex<[@Sendable () -> Void]>([])
  private let available = DispatchSemaphore(value: 0)

  init() {
    let thread = Thread { [self] in
      while true {
        available.wait()
        let next = work.withLock { $0.isEmpty ? nil : $0.removeFirst() }
        next?()
      }
    }
    thread.name = "conveyor.spawn"
    thread.start()
  }

  /// Runs `body` on the thread and returns its result.
  func run<T: Sendable>(_ body: @escaping @Sendable () -> T) -> T {
    let result = Mutex<T?>(nil)
    let done = DispatchSemaphore(value: 0)
    work.withLock {
      $0.append {
        let value = body()
        result.withLock { $0 = value }
        done.signal()
      }
    }
    available.signal()
    done.wait()
    return result.withLock { $0! }
  }
}

/// The command a supervisor process started (0 before it did): read by its signal handlers, which
/// cannot capture context. Written once, on the supervisor's only thread, before any handler can
/// need it; a handler reading 0 still ends the process group.
nonisolated(unsafe) private var supervisedCommand: pid_t = 0
/// Set by the supervisor's SIGUSR1 handler when a kill was asked for before the command's ID was
/// stored (a word written whole; read once the start returned).
nonisolated(unsafe) private var killRequested: Int32 = 0
