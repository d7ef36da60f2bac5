func runSQLiteBenchmarks() async throws {
  section("SQLite: not written yet")
}
