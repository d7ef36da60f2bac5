import Foundation

let arguments = Array(CommandLine.arguments.dropFirst())
let selected = Set(arguments.isEmpty ? ["all"] : arguments)
func wants(_ name: String) -> Bool { selected.contains("all") || selected.contains(name) }

print("Conveyor benchmarks (release build expected; ratios compare runs made in this process)")
if wants("operations") { try await runOperationBenchmarks() }
if wants("pipelines") { try await runPipelineBenchmarks() }
if wants("sqlite") { try await runSQLiteBenchmarks() }
if wants("queue") { try await runQueueBenchmarks() }
