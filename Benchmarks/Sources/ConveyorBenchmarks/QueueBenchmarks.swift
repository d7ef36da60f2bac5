func runQueueBenchmarks() async throws {
  section("Queue: not written yet")
}
