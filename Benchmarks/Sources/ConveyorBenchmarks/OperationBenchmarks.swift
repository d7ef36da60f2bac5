func runOperationBenchmarks() async throws {
  section("Operation: not written yet")
}
