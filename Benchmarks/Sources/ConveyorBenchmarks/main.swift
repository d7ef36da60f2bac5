import Foundation

let arguments = Array(CommandLine.arguments.dropFirst())
let selected = Set(arguments.isEmpty ? ["all"] : arguments)
func wants(_ name: String) -> Bool { selected.contains("all") || selected.contains(name) }

print("Conveyor benchmarks (release build expected; ratios compare runs made in this process)")
// SQLite first: its peak-memory figure is the process's high-water mark, which the other
// sections (100k operations at once) would otherwise raise.
if wants("sqlite") { try await runSQLiteBenchmarks() }
if wants("operations") { try await runOperationBenchmarks() }
if wants("pipelines") { try await runPipelineBenchmarks() }
if wants("queue") { try await runQueueBenchmarks() }
if wants("history") { try await runHistoryBenchmarks() }
if wants("schedules") { try await runScheduleBenchmarks() }
if wants("ordering") { try await runOrderingBenchmarks() }
if wants("limits") { try await runLimitBenchmarks() }
if wants("workflows") { try await runWorkflowBenchmarks() }
// Needs a server: run through Benchmarks/with-postgres.sh (skipped without CONVEYOR_POSTGRES_URL).
if wants("postgres") { try await runPostgresBenchmarks() }
