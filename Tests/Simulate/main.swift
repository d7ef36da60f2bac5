import ConveyorSimulation
import Foundation

// Searches seeds with the deterministic simulation of the queue engine and reports histories per
// second and any violation (its seed, its shrunk scenario and the last events before it).
//
//   swift run -c release conveyor-simulate --seeds 100000 [--from SEED] [--seed SEED]
//                                          [--defect settlesStaleClaims|rescuesLiveLeases|renewsStaleClaims|
//                                                   prunesEarly|prunesUnfinished|
//                                                   ignoresRunningForUniqueness|runsStalePayload|
//                                                   firesSlotTwice|skipsSlot|firesEarly|ignoresOrderingKeys|forgetsLimits|
//                                                   ratePerProcess]
//
// With `--defect`, each seed's scenario has that defect built into the store: a search for seeds
// that catch it (the simulation's own check tests name one).

let arguments = Array(CommandLine.arguments.dropFirst())
@MainActor func option(_ name: String) -> UInt64? {
  guard let index = arguments.firstIndex(of: name), index + 1 < arguments.count else { return nil }
  return UInt64(arguments[index + 1])
}
if arguments.contains("--help") || arguments.contains("-h") {
  print("usage: conveyor-simulate [--seeds N] [--from SEED] | --seed SEED [--defect NAME]")
  exit(0)
}
let defect = arguments.firstIndex(of: "--defect").flatMap { index in
  index + 1 < arguments.count ? SimDefect(rawValue: arguments[index + 1]) : nil
}
if arguments.contains("--defect") && defect == nil {
  print(
    "conveyor-simulate: --defect takes settlesStaleClaims, rescuesLiveLeases, renewsStaleClaims, prunesEarly, "
      + "prunesUnfinished, ignoresRunningForUniqueness, runsStalePayload, firesSlotTwice, skipsSlot, "
      + "firesEarly, ignoresOrderingKeys, forgetsLimits or ratePerProcess"
  )
  exit(2)
}
/// One history of `seed`, with the defect asked for.
func run(_ seed: UInt64) -> SimOutcome {
  guard let defect else { return Simulation.run(seed: seed) }
  var scenario = SimScenario.drawn(from: seed)
  scenario.defect = defect
  return Simulation.run(seed: seed, scenario: scenario)
}

func report(_ outcome: SimOutcome) {
  print("VIOLATION seed \(outcome.seed): \(outcome.violation ?? "")")
  print("scenario: \(outcome.scenario)")
  print("replay: conveyor-simulate --seed \(outcome.seed)")
  print("last events:")
  for line in outcome.trace { print("  " + line) }
}

if let seed = option("--seed") {
  let outcome = run(seed)
  guard outcome.violation != nil else {
    print(
      "seed \(seed): no violation (\(outcome.lifecycles) jobs finished, \(outcome.steps) steps, \(outcome.simulated) simulated)"
    )
    exit(0)
  }
  report(Simulation.shrink(outcome))
  exit(1)
}

let count = option("--seeds") ?? 1_000
let first = option("--from") ?? UInt64(Date().timeIntervalSince1970)
let start = Date()
var lifecycles = 0
var steps = 0
var lastReport = start
for seed in first..<(first + count) {
  let outcome = run(seed)
  lifecycles += outcome.lifecycles
  steps += outcome.steps
  if outcome.violation != nil {
    report(Simulation.shrink(outcome))
    exit(1)
  }
  let now = Date()
  if now.timeIntervalSince(lastReport) >= 10 {
    lastReport = now
    let elapsed = now.timeIntervalSince(start)
    print(
      String(
        format: "%llu histories, %.0f histories/s, %.0f job lifecycles/s", seed - first + 1,
        Double(seed - first + 1) / elapsed, Double(lifecycles) / elapsed))
  }
}
let elapsed = Date().timeIntervalSince(start)
print(
  String(
    format:
      "%llu histories from seed %llu: no violation; %.0f histories/s, %.0f job lifecycles/s (%.0f steps each)",
    count, first, Double(count) / elapsed, Double(lifecycles) / elapsed,
    Double(steps) / Double(max(lifecycles, 1))))
