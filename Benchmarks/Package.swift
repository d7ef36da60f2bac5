// swift-tools-version:6.0
import PackageDescription

// Benchmarks live in their own package so they never weigh on the library's build or tests.
// Run: swift run -c release --package-path Benchmarks conveyor-benchmarks [all|operations|pipelines|sqlite|queue]
let package = Package(
  name: "ConveyorBenchmarks",
  platforms: [.macOS(.v15), .iOS(.v18), .tvOS(.v18), .watchOS(.v11)],
  dependencies: [.package(name: "Conveyor", path: "..")],
  targets: [
    .systemLibrary(name: "CSQLiteBench", pkgConfig: "sqlite3", providers: [.apt(["libsqlite3-dev"])]),
    .executableTarget(
      name: "conveyor-benchmarks",
      dependencies: [
        .product(name: "Conveyor", package: "Conveyor"),
        .product(name: "ConveyorSQLite", package: "Conveyor"),
        "CSQLiteBench",
      ],
      path: "Sources/ConveyorBenchmarks",
      swiftSettings: [.swiftLanguageMode(.v6)]
    ),
  ]
)
