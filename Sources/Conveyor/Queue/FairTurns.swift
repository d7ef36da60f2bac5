/// Fair shares' turns (``NewJob/fairnessKey``, ``JobStore/keepsFairShares``), the one rule every
/// store applies when jobs become ready.
///
/// Claims take a priority's ready jobs by *place*: a job with a fairness key has its key's turn as
/// its place, a job without one its run date (both in milliseconds since 1970). A job of key `K`
/// at priority `p` that becomes ready (added ready, retried straight into the ready state, or
/// promoted when its run date comes, or given a new payload by ``DeduplicationConflict/replace``)
/// takes the turn
///
///     max(head(p), previous(K, p) + 1)
///
/// where `head(p)` is the place of the first job of priority `p` that waits in its place (ready, or
/// held by its limit key's limit or rate: which of those a claim has held yet is each store's own
/// choice, so the rule counts both), or, with none at that priority, the later of the job's run
/// date and the latest turn any key took at `p`; and
/// `previous(K, p)` is the key's latest turn at `p` (none: no lower bound). Each turn a key takes
/// is one millisecond after its last, and a key without a backlog starts at the head: after one
/// job of each other key at most, its job is next. That is start-time fair queuing with the head
/// of the queue as its virtual time; without the latest turn, a key whose turns ran ahead of the
/// clock would wait behind everyone after the queue ran empty. Turns are kept per priority.
///
/// Jobs take their turns one at a time, each seeing the ones before it: an add's jobs in their
/// order; jobs whose run dates come by one claim in ID order (the order they were added); jobs
/// re-queued by one call as the re-queue takes them (given jobs by ID; every dead job, those
/// without a deduplication key first, each group by ID); a retried job before the held job its limit key then lets go. The
/// jobs one settlement call retries into the ready state take their turns in the call's order on
/// the in-memory and SQLite stores, and in the order its statement reaches them on PostgreSQL.
package struct FairTurns: Sendable {
  /// A key at a priority.
  package struct Key: Hashable, Sendable {
    package var priority: Int
    package var key: ExactText
    package init(priority: Int, key: String) {
      self.priority = priority
      self.key = ExactText(key)
    }
  }

  /// The place of the first job waiting in its place at each priority that has one.
  package var heads: [Int: Int64]
  /// The latest turn any key took at each priority where one did.
  package var latest: [Int: Int64]
  /// Each key's latest turn at each priority (keys compared byte for byte).
  package var previous: [Key: Int64]

  package init(heads: [Int: Int64] = [:], latest: [Int: Int64] = [:], previous: [Key: Int64] = [:]) {
    self.heads = heads
    self.latest = latest
    self.previous = previous
  }

  /// The turn of a job of `key` at `priority`, run date `runAt`, as it becomes ready; notes it.
  package mutating func take(key: String, priority: Int, runAt: Int64) -> Int64 {
    let exact = Key(priority: priority, key: key)
    let floor = heads[priority] ?? max(runAt, latest[priority] ?? .min)
    let turn = previous[exact].map { max(floor, $0 == .max ? .max : $0 + 1) } ?? floor
    previous[exact] = turn
    latest[priority] = max(latest[priority] ?? .min, turn)
    if heads[priority] == nil { heads[priority] = turn }
    return turn
  }
}
