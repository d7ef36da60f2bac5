// swift-tools-version:6.0
import PackageDescription

let package = Package(
  name: "Conveyor",
  platforms: [.macOS(.v15), .iOS(.v18), .tvOS(.v18), .watchOS(.v11)],
  products: [
    .library(name: "Conveyor", targets: ["Conveyor"]),
    .library(name: "ConveyorSQLite", targets: ["ConveyorSQLite"]),
    .library(name: "ConveyorPostgres", targets: ["ConveyorPostgres"]),
    .library(name: "ConveyorNetworking", targets: ["ConveyorNetworking"]),
    .library(name: "ConveyorDashboard", targets: ["ConveyorDashboard"]),
    // Helpers for users' test targets: run a queue until idle on a manual clock, expect jobs.
    .library(name: "ConveyorTesting", targets: ["ConveyorTesting"]),
    // Drop-in shapes for the three libraries Conveyor grew out of (see each module's Migrating… guide).
    .library(name: "ConveyorBismuth", targets: ["ConveyorBismuth"]),
    .library(name: "ConveyorOperationKit", targets: ["ConveyorOperationKit"]),
    .library(name: "ConveyorAsyncTaskPerformer", targets: ["ConveyorAsyncTaskPerformer"]),
    .executable(name: "conveyor", targets: ["conveyor"]),
  ],
  targets: [
    // System libraries (Debian: libsqlite3-dev, libpq-dev).
    .systemLibrary(
      name: "CSQLite",
      pkgConfig: "sqlite3",
      providers: [.apt(["libsqlite3-dev"]), .brew(["sqlite3"])]
    ),
    .systemLibrary(
      name: "CLibPQ",
      pkgConfig: "libpq",
      providers: [.apt(["libpq-dev"]), .brew(["libpq"])]
    ),

    // Core: operations, pipelines, the queue engine, the JobStore protocol, the in-memory store.
    .target(name: "Conveyor"),
    .target(name: "ConveyorSQLite", dependencies: ["Conveyor", "CSQLite"]),
    .target(name: "ConveyorPostgres", dependencies: ["Conveyor", "CLibPQ"]),
    .target(name: "ConveyorNetworking", dependencies: ["Conveyor"]),
    // The web dashboard as a library a host server mounts: a request value in, a response out.
    .target(name: "ConveyorDashboard", dependencies: ["Conveyor"]),
    .target(name: "ConveyorTesting", dependencies: ["Conveyor"]),
    // Drop-in shapes of the old libraries' APIs on Conveyor's engine: change only the import.
    .target(name: "ConveyorBismuth", dependencies: ["Conveyor", "ConveyorSQLite"]),
    .target(name: "ConveyorOperationKit", dependencies: ["Conveyor", "ConveyorNetworking"]),
    .target(name: "ConveyorAsyncTaskPerformer", dependencies: ["Conveyor"]),
    .executableTarget(
      name: "conveyor",
      dependencies: [
        "Conveyor", "ConveyorSQLite", "ConveyorPostgres", "ConveyorNetworking", "ConveyorDashboard",
        "ConveyorHTTPServer", "LoopbackHTTPServer",
      ]
    ),

    // The bounded HTTP/1.1 server `conveyor dashboard` serves on: limits, timeouts, keep-alive.
    .target(name: "ConveyorHTTPServer"),

    // A small HTTP/1.1 server on 127.0.0.1 that the networking tests and `conveyor demo` use, so
    // both run without any network. Not a product.
    .target(name: "LoopbackHTTPServer"),

    // Test support: the JobStore conformance suite every store runs, and a worker process
    // the multi-process and crash tests start.
    .target(name: "ConveyorTestSupport", dependencies: ["Conveyor"], path: "Tests/ConveyorTestSupport"),
    .executableTarget(
      name: "conveyor-test-worker",
      dependencies: ["Conveyor", "ConveyorSQLite", "ConveyorTestSupport"],
      path: "Tests/TestWorker"
    ),
    // Deterministic simulation of the queue engine (real `JobQueue`s on a seeded scheduler and a
    // simulated clock, with faults), and the command that searches seeds with it
    // (`swift run -c release conveyor-simulate --seeds N`).
    .target(
      name: "ConveyorSimulation", dependencies: ["Conveyor", "ConveyorTestSupport"],
      path: "Tests/ConveyorSimulation"),
    .executableTarget(
      name: "conveyor-simulate", dependencies: ["ConveyorSimulation"], path: "Tests/Simulate"),
    // The worker process of the PostgreSQL multi-process, crash and restart tests.
    .executableTarget(
      name: "conveyor-postgres-test-worker",
      dependencies: ["Conveyor", "ConveyorPostgres", "ConveyorTestSupport"],
      path: "Tests/PostgresTestWorker"
    ),

    .testTarget(
      name: "ConveyorTests", dependencies: ["Conveyor", "ConveyorTestSupport", "ConveyorSimulation"]),
    .testTarget(
      name: "ConveyorSQLiteTests",
      dependencies: ["Conveyor", "ConveyorSQLite", "ConveyorTestSupport", "CSQLite", "conveyor-test-worker"]
    ),
    .testTarget(
      name: "ConveyorPostgresTests",
      dependencies: [
        "Conveyor", "ConveyorPostgres", "ConveyorTesting", "ConveyorTestSupport", "CLibPQ",
        "conveyor-postgres-test-worker",
      ]
    ),
    .testTarget(
      name: "ConveyorCLITests",
      dependencies: [
        "conveyor", "ConveyorDashboard", "ConveyorSQLite", "ConveyorTestSupport", "LoopbackHTTPServer",
      ]
    ),
    .testTarget(
      name: "ConveyorDashboardTests",
      dependencies: ["Conveyor", "ConveyorDashboard", "ConveyorSQLite", "ConveyorTestSupport"]
    ),
    .testTarget(name: "ConveyorHTTPServerTests", dependencies: ["ConveyorHTTPServer"]),
    .testTarget(
      name: "ConveyorTestingTests",
      dependencies: ["Conveyor", "ConveyorTesting", "ConveyorSQLite", "ConveyorTestSupport"]
    ),
    .testTarget(name: "ConveyorBismuthTests", dependencies: ["ConveyorBismuth"]),
    .testTarget(name: "ConveyorAsyncTaskPerformerTests", dependencies: ["ConveyorAsyncTaskPerformer"]),
    .testTarget(
      name: "ConveyorOperationKitTests",
      dependencies: ["ConveyorOperationKit", "ConveyorTestSupport", "LoopbackHTTPServer"]),
    .testTarget(
      name: "ConveyorNetworkingTests",
      dependencies: [
        "Conveyor", "ConveyorNetworking", "ConveyorSQLite", "ConveyorTestSupport", "LoopbackHTTPServer",
      ]
    ),
  ]
)

// Shared Swift settings, declared once and applied to every Swift target.
for target in package.targets where target.type != .system {
  var settings = target.swiftSettings ?? []
  settings.append(.swiftLanguageMode(.v6))
  target.swiftSettings = settings
}
