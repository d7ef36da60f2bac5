import Conveyor
import Foundation

/// Worker processes firing a 1-second schedule while one of them is killed and started again
/// about every second, just after a slot (when the workers are firing it): for the crash tests
/// of every store that shares schedules across processes.
public enum SlotFiringProbe {
  /// The schedule the workers fire: every second, its job `{"number":0}`.
  public static func schedule() throws -> ScheduleDefinition {
    try ScheduleDefinition(
      name: "tick", timing: try ScheduleTiming(every: .seconds(1)), payload: Data(#"{"number":0}"#.utf8))
  }

  /// For `duration`, just after each whole second (plus up to 40 ms), kills one of `workers`
  /// (with `kill`, which waits for its exit) and puts the one `start` makes in its place
  /// (`start(slot, generation)`); then kills them all. Returns how many were killed.
  public static func killJustAfterSlots<Worker>(
    _ workers: [Worker], for duration: TimeInterval, kill: (Worker) async -> Void,
    start: (Int, Int) throws -> Worker
  ) async throws -> Int {
    var workers = workers
    var random = SeededRandom(seed: 34)
    let end = Date().addingTimeInterval(duration)
    var kills = 0
    while Date() < end {
      let now = Date().timeIntervalSince1970
      let target = now.rounded(.down) + 1 + Double(random.below(40)) / 1_000
      try await Task.sleep(for: .milliseconds(Int64((target - now) * 1_000)))
      let victim = random.below(workers.count)
      await kill(workers[victim])
      kills += 1
      workers[victim] = try start(victim, kills)
    }
    for worker in workers { await kill(worker) }
    return kills
  }

  /// What is wrong with the slots (whole seconds) of every job `store` holds in `queue`: a slot
  /// added twice, one skipped between the first and the last, or fewer than `least` in all.
  public static func problems(_ store: any JobStore, queue: String, least: Int) async throws -> [String] {
    var seconds: [Int64] = []
    var cursor: JobID?
    while true {
      let page = try await store.jobs(queue: queue, status: nil, after: cursor, limit: 1_000)
      guard let last = page.last else { break }
      seconds += page.map { Int64($0.runAt.timeIntervalSince1970.rounded(.down)) }
      cursor = last.id
    }
    let slots = seconds.sorted()
    var problems: [String] = []
    if Set(slots).count != slots.count { problems.append("a slot fired twice: \(slots)") }
    if slots.count < least { problems.append("\(slots.count) slots fired, fewer than \(least)") }
    if let first = slots.first, let last = slots.last, last - first + 1 != Int64(Set(slots).count) {
      problems.append("a slot was skipped: \(slots)")
    }
    return problems
  }
}
