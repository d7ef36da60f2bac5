// swift-tools-version:6.0
import PackageDescription

// Benchmarks live in their own package so they never weigh on the library's build or tests.
// Run: swift run -c release --package-path Benchmarks conveyor-benchmarks [all|operations|pipelines|sqlite|queue|postgres]
// PostgreSQL: Benchmarks/with-postgres.sh swift run -c release --package-path Benchmarks conveyor-benchmarks postgres
let package = Package(
  name: "ConveyorBenchmarks",
  platforms: [.macOS(.v15), .iOS(.v18), .tvOS(.v18), .watchOS(.v11)],
  dependencies: [.package(name: "Conveyor", path: "..")],
  targets: [
    .systemLibrary(name: "CSQLiteBench", pkgConfig: "sqlite3", providers: [.apt(["libsqlite3-dev"])]),
    // The raw libpq baseline of the PostgreSQL benchmarks.
    .systemLibrary(name: "CLibPQBench", pkgConfig: "libpq", providers: [.apt(["libpq-dev"])]),
    .executableTarget(
      name: "conveyor-benchmarks",
      dependencies: [
        .product(name: "Conveyor", package: "Conveyor"),
        .product(name: "ConveyorSQLite", package: "Conveyor"),
        .product(name: "ConveyorPostgres", package: "Conveyor"),
        "CSQLiteBench",
        "CLibPQBench",
      ],
      path: "Sources/ConveyorBenchmarks",
      swiftSettings: [.swiftLanguageMode(.v6)]
    ),
  ]
)
