func runPipelineBenchmarks() async throws {
  section("Pipeline: not written yet")
}
