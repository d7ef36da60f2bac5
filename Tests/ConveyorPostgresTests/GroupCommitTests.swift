import Conveyor
import ConveyorTestSupport
import Foundation
import Synchronization
import Testing

@testable import ConveyorPostgres

/// Adds that arrive while another is under way are committed together, each with its own
/// outcome.
@Suite("PostgreSQL group commit")
struct GroupCommitTests {
  func open(_ prefix: String) async throws -> (PostgresServer, PostgresJobStore, String) {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema(prefix)
    // The tests hold key locks while adds pile up behind them, for as long as a loaded machine
    // takes to get there: a lock timeout of two minutes, not five seconds.
    let store = try await PostgresJobStore.open(
      url: server.url, options: .init(schema: schema, lockTimeout: .seconds(120)))
    return (server, store, schema)
  }

  func job(_ text: String, key: String? = nil) -> NewJob {
    NewJob(payload: Data(text.utf8), deduplicationKey: key)
  }

  /// Holds the advisory lock of `key` in `queue` on a connection of its own until the returned
  /// connection runs `COMMIT`: an add with that key waits for it, and every add behind it waits too.
  /// The lock is the database's, whatever the schema: each test uses a key of its own (`held(_:)`),
  /// or a test would wait for another's lock on a thread of the pool.
  func holdKeyLock(_ server: PostgresServer, schema: String, queue: String, key: String) throws
    -> AdminConnection
  {
    let admin = try AdminConnection(server.url)
    try admin.query("BEGIN")
    try admin.query(
      "SELECT pg_advisory_xact_lock(\(schema).dedup_lock_key('\(queue)', convert_to('\(key)', 'UTF8')))")
    return admin
  }

  @Test func concurrentAddsEachGetTheirOwnJobs() async throws {
    let (_, store, _) = try await open("group")
    let clock = SystemJobClock()
    let results = try await withThrowingTaskGroup(of: (Int, [EnqueueResult]).self) { group in
      for caller in 0..<64 {
        group.addTask {
          let jobs = (0...(caller % 3)).map {
            job("c\(caller)-\($0)", key: caller % 5 == 0 ? "k\(caller)-\($0)" : nil)
          }
          return (caller, try await store.enqueue(jobs, queue: "q", clock: clock))
        }
      }
      return try await group.reduce(into: [:]) { $0[$1.0] = $1.1 }
    }
    var seen = Set<JobID>()
    for (caller, outcome) in results {
      #expect(outcome.count == caller % 3 + 1)
      for (index, result) in outcome.enumerated() {
        #expect(result.inserted && seen.insert(result.id).inserted, "each job its own ID")
        let stored = try await store.job(result.id)
        #expect(stored.map { String(decoding: $0.payload, as: UTF8.self) } == "c\(caller)-\(index)")
      }
    }
    #expect(try await store.counts(queue: "q", clock: clock).ready == seen.count)
    await store.close()
  }

  @Test func addsWaitingBehindOneUnderWayAreCommittedAsOneGroup() async throws {
    let (server, store, schema) = try await open("grouped")
    let clock = SystemJobClock()
    // The lead waits for a key lock another session holds; eight adds queue behind it.
    let admin = try holdKeyLock(server, schema: schema, queue: "q", key: "held-\(schema)")
    let lead = Task {
      try await store.enqueue([job("lead", key: "held-\(schema)")], queue: "q", clock: clock)
    }
    try await Task.sleep(for: .milliseconds(200))
    let followers = (0..<8).map { index in
      Task { try await store.enqueue([job("f\(index)")], queue: "q", clock: clock) }
    }
    try await eventually("eight adds wait") { store.adds.waitingCount == 8 }
    try admin.query("COMMIT")
    #expect(try await lead.value.first?.inserted == true)
    let ids = try await followers.asyncMap { try await $0.value.first?.id }
    #expect(Set(ids.compactMap { $0 }).count == 8)
    #expect(store.adds.groupsCommitted == 1, "one group: \(store.adds.groupsCommitted)")
    #expect(try await store.counts(queue: "q", clock: clock).ready == 9)
    await store.close()
  }

  @Test func aCallThatFailsInItsGroupFailsAloneAndTheOthersAreStored() async throws {
    let (server, store, schema) = try await open("groupfail")
    let clock = SystemJobClock()
    let admin = try AdminConnection(server.url)
    try admin.query(
      """
      CREATE FUNCTION \(schema).refuse() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        IF convert_from(NEW.payload, 'UTF8') = 'boom' THEN RAISE EXCEPTION 'refused by trigger'; END IF;
        RETURN NEW;
      END $$;
      CREATE TRIGGER refuse BEFORE INSERT ON \(schema).jobs FOR EACH ROW EXECUTE FUNCTION \(schema).refuse();
      """)
    for keyed in [false, true] {
      let hold = try holdKeyLock(server, schema: schema, queue: "q", key: "held-\(schema)-\(keyed)")
      let lead = Task {
        try await store.enqueue([job("lead", key: "held-\(schema)-\(keyed)")], queue: "q", clock: clock)
      }
      try await Task.sleep(for: .milliseconds(200))
      let texts = ["a", "boom", "b", "c"]
      let calls = texts.enumerated().map { index, text in
        Task {
          try await store.enqueue(
            [job("\(text)-\(keyed)", key: keyed ? "k\(index)" : nil)].map {
              text == "boom" ? job("boom", key: $0.deduplicationKey) : $0
            }, queue: "q", clock: clock)
        }
      }
      try await eventually("four adds wait") { store.adds.waitingCount == 4 }
      try hold.query("COMMIT")
      _ = try await lead.value
      for (index, call) in calls.enumerated() {
        let outcome = await call.result
        if texts[index] == "boom" {
          #expect(throws: PostgresError.self) { try outcome.get() }
        } else {
          let id = try #require(try outcome.get().first?.id)
          #expect(try await store.job(id) != nil, "\(texts[index]) stored")
        }
      }
    }
    #expect(try await store.counts(queue: "q", clock: clock).ready == 8)
    await store.close()
  }

  @Test func aCallCancelledWhileItWaitsForItsGroupIsNotAdded() async throws {
    let (server, store, schema) = try await open("groupcancel")
    let clock = SystemJobClock()
    let hold = try holdKeyLock(server, schema: schema, queue: "q", key: "held-\(schema)")
    let lead = Task {
      try await store.enqueue([job("lead", key: "held-\(schema)")], queue: "q", clock: clock)
    }
    try await Task.sleep(for: .milliseconds(200))
    let kept = Task { try await store.enqueue([job("kept")], queue: "q", clock: clock) }
    let cancelled = Task { try await store.enqueue([job("cancelled")], queue: "q", clock: clock) }
    try await eventually("two adds wait") { store.adds.waitingCount == 2 }
    cancelled.cancel()
    await #expect(throws: CancellationError.self) { _ = try await cancelled.value }
    try hold.query("COMMIT")
    _ = try await lead.value
    _ = try await kept.value
    let payloads = try await store.jobs(queue: "q", status: nil, after: nil, limit: 10).map {
      String(decoding: $0.payload, as: UTF8.self)
    }
    #expect(payloads == ["lead", "kept"])
    await store.close()
  }

  /// The deduplication locks are taken in one fixed order "so two enqueuers never deadlock"
  /// (`SQL.lockKeys`). A group takes the keys of its calls call by call, so a group whose first
  /// call holds key B (its insert is slow: here a trigger sleeps) and whose second call then asks
  /// for key A deadlocks with another process's add of A and B, which holds A and waits for B.
  /// Each session's `deadlock_timeout` only chooses which of the two the server aborts: here the
  /// other process's add, which then fails with "deadlock detected" although nothing was wrong
  /// with it.
  @Test func aGroupNeverDeadlocksWithAnotherProcessesAddOfTheSameKeys() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema("groupdeadlock")
    func url(deadlockTimeout: String) -> String {
      server.url + "?options=-c%20deadlock_timeout%3D\(deadlockTimeout)"
    }
    let grouping = try await PostgresJobStore.open(
      url: url(deadlockTimeout: "60s"), options: .init(schema: schema, lockTimeout: .zero))
    let other = try await PostgresJobStore.open(
      url: url(deadlockTimeout: "4s"), options: .init(schema: schema, lockTimeout: .zero))
    let clock = SystemJobClock()
    let admin = try AdminConnection(server.url)
    // The slow insert waits for a lock the test holds (`gate`) and lets go of: a fixed sleep ended
    // before a loaded machine's test looked for it.
    let gateKey = "hashtext('\(schema)-gate')"
    let gate = try AdminConnection(server.url)
    try gate.query("SELECT pg_advisory_lock(\(gateKey))")
    try admin.query(
      """
      CREATE FUNCTION \(schema).slow() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        IF convert_from(NEW.payload, 'UTF8') = 'slow' THEN
          PERFORM pg_advisory_lock(\(gateKey));
          PERFORM pg_advisory_unlock(\(gateKey));
        END IF;
        RETURN NEW;
      END $$;
      CREATE TRIGGER slow BEFORE INSERT ON \(schema).jobs FOR EACH ROW EXECUTE FUNCTION \(schema).slow();
      """)
    // The key a one-call add of both locks first (the locks go by their hash), and the other.
    let aFirst =
      try admin.scalar(
        "SELECT \(schema).dedup_lock_key('q', convert_to('kA', 'UTF8')) < "
          + "\(schema).dedup_lock_key('q', convert_to('kB', 'UTF8'))") == "t"
    let (first, second) = aFirst ? ("kA", "kB") : ("kB", "kA")
    // A group of two calls: the first with `second` (slow), then one with `first`.
    let hold = try holdKeyLock(server, schema: schema, queue: "q", key: "held-\(schema)")
    let lead = Task {
      try await grouping.enqueue([job("lead", key: "held-\(schema)")], queue: "q", clock: clock)
    }
    try await Task.sleep(for: .milliseconds(200))
    let slow = Task { try await grouping.enqueue([job("slow", key: second)], queue: "q", clock: clock) }
    try await eventually("one add waits") { grouping.adds.waitingCount == 1 }
    let quick = Task { try await grouping.enqueue([job("quick", key: first)], queue: "q", clock: clock) }
    try await eventually("two adds wait") { grouping.adds.waitingCount == 2 }
    try hold.query("COMMIT")
    _ = try await lead.value
    // The group holds `second` while its slow insert runs; another process adds both keys.
    let watcher = try AdminConnection(server.url)
    func waitingOnLocks() throws -> String? {
      try watcher.scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = 'advisory' "
          + "AND query LIKE '%\(schema)%'")
    }
    try await waitFor("the group's slow insert runs") { try waitingOnLocks() == "1" }
    let adding = Task {
      try await other.enqueue([job("m1", key: first), job("m2", key: second)], queue: "q", clock: clock)
    }
    // The other add waits for the group's key lock too; then the slow insert goes on.
    try await waitFor("the other process's add to wait") { try waitingOnLocks() == "2" }
    try gate.query("SELECT pg_advisory_unlock(\(gateKey))")
    let both = await adding.result
    switch both {
    case .success(let results):
      // No deadlock: the add waited for the group's locks, then found the group's jobs with the
      // same keys waiting (deduplicated onto them).
      #expect(results.count == 2)
      for (result, key) in zip(results, [first, second]) {
        #expect(try await other.job(result.id)?.deduplicationKey == key)
      }
    case .failure(let error): Issue.record("the other process's add failed: \(error)")
    }
    _ = try await slow.value
    _ = try await quick.value
    await grouping.close()
    await other.close()
  }

  /// A call that fails in its group fails alone, the others are stored. When the failing call,
  /// run again alone, loses the connection (here its trigger ends its own session), the calls of
  /// the group after it are failed with "nothing of it was stored" instead of being run on a new
  /// connection, as an add that is not in a group would be.
  @Test func aCallThatLosesTheConnectionWhenRunAloneDoesNotFailTheOthersOfItsGroup() async throws {
    let (server, store, schema) = try await open("grouploss")
    let clock = SystemJobClock()
    let admin = try AdminConnection(server.url)
    try admin.query(
      """
      CREATE SEQUENCE \(schema).boom_attempts;
      CREATE FUNCTION \(schema).boom() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        IF convert_from(NEW.payload, 'UTF8') = 'boom' THEN
          IF nextval('\(schema).boom_attempts') = 1 THEN RAISE EXCEPTION 'refused by trigger'; END IF;
          PERFORM pg_terminate_backend(pg_backend_pid());
          PERFORM pg_sleep(5);
        END IF;
        RETURN NEW;
      END $$;
      CREATE TRIGGER boom BEFORE INSERT ON \(schema).jobs FOR EACH ROW EXECUTE FUNCTION \(schema).boom();
      """)
    let hold = try holdKeyLock(server, schema: schema, queue: "q", key: "held-\(schema)")
    let lead = Task {
      try await store.enqueue([job("lead", key: "held-\(schema)")], queue: "q", clock: clock)
    }
    try await Task.sleep(for: .milliseconds(200))
    var calls: [Task<[EnqueueResult], any Error>] = []
    for (index, text) in ["boom", "a", "b"].enumerated() {
      calls.append(Task { try await store.enqueue([job(text)], queue: "q", clock: clock) })
      try await eventually("\(index + 1) adds wait") { store.adds.waitingCount == index + 1 }
    }
    try hold.query("COMMIT")
    _ = try await lead.value
    _ = await calls[0].result  // boom: its own failure, whatever it is
    for (index, text) in ["a", "b"].enumerated() {
      switch await calls[index + 1].result {
      case .success(let results):
        let id = try #require(results.first?.id)
        #expect(try await store.job(id) != nil, "\(text) stored")
      case .failure(let error):
        Issue.record("\(text) failed with the call that failed in its group: \(error)")
      }
    }
    await store.close()
  }

  /// A trigger of the application's that drops a row (`RETURN NULL`) refuses one call's job. In a
  /// group without keys the calls' statements commit together at the end of the pipeline, and the
  /// missing row is only noticed afterwards: the group is then run again call by call, so every
  /// other call of the group is committed a second time.
  @Test func aCallWhoseJobATriggerDropsDoesNotCommitTheOthersOfItsGroupTwice() async throws {
    let (server, store, schema) = try await open("groupdrop")
    let clock = SystemJobClock()
    let admin = try AdminConnection(server.url)
    try admin.query(
      """
      CREATE FUNCTION \(schema).drop_some() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        IF convert_from(NEW.payload, 'UTF8') = 'dropped' THEN RETURN NULL; END IF;
        RETURN NEW;
      END $$;
      CREATE TRIGGER drop_some BEFORE INSERT ON \(schema).jobs
        FOR EACH ROW EXECUTE FUNCTION \(schema).drop_some();
      """)
    let hold = try holdKeyLock(server, schema: schema, queue: "q", key: "held-\(schema)")
    let lead = Task {
      try await store.enqueue([job("lead", key: "held-\(schema)")], queue: "q", clock: clock)
    }
    try await Task.sleep(for: .milliseconds(200))
    var calls: [Task<[EnqueueResult], any Error>] = []
    for (index, text) in ["a", "dropped", "b"].enumerated() {
      calls.append(Task { try await store.enqueue([job(text)], queue: "q", clock: clock) })
      try await eventually("\(index + 1) adds wait") { store.adds.waitingCount == index + 1 }
    }
    try hold.query("COMMIT")
    _ = try await lead.value
    for call in calls { _ = await call.result }
    let stored = try admin.query(
      "SELECT convert_from(payload, 'UTF8'), count(*) FROM \(schema).jobs GROUP BY 1 ORDER BY 1")
    #expect(stored == [["a", "1"], ["b", "1"], ["lead", "1"]], "each job once: \(stored)")
    await store.close()
  }

  @Test func duplicatesAcrossTheCallsOfAGroupAreOneJob() async throws {
    let (server, store, schema) = try await open("groupdup")
    let clock = SystemJobClock()
    let hold = try holdKeyLock(server, schema: schema, queue: "q", key: "held-\(schema)")
    let lead = Task {
      try await store.enqueue([job("lead", key: "held-\(schema)")], queue: "q", clock: clock)
    }
    try await Task.sleep(for: .milliseconds(200))
    let first = Task { try await store.enqueue([job("one", key: "same")], queue: "q", clock: clock) }
    try await eventually("one add waits") { store.adds.waitingCount == 1 }
    let second = Task { try await store.enqueue([job("two", key: "same")], queue: "q", clock: clock) }
    try await eventually("two adds wait") { store.adds.waitingCount == 2 }
    try hold.query("COMMIT")
    _ = try await lead.value
    let a = try #require(try await first.value.first)
    let b = try #require(try await second.value.first)
    #expect(a.inserted && !b.inserted && a.id == b.id, "\(a) \(b)")
    await store.close()
  }

  /// Two stores enqueue overlapping keys (with equivalent variants) in opposite orders, many times
  /// at once: no deadlock, one job per key.
  @Test func overlappingBatchesInOppositeOrdersDoNotDeadlock() async throws {
    let server = try await PostgresServer.shared()
    let schema = uniqueSchema()
    let a = try await PostgresJobStore.open(url: server.url, options: .init(schema: schema, clock: .caller))
    let b = try await PostgresJobStore.open(url: server.url, options: .init(schema: schema, clock: .caller))
    let keys = (0..<12).flatMap { ["k\($0)\u{E9}", "k\($0)e\u{301}"] }
    let clock = FixedJobClock(epoch)
    for round in 0..<20 {
      let queue = "q\(round)"
      async let one = a.enqueue(
        keys.map { NewJob(payload: Data($0.utf8), runAt: epoch, deduplicationKey: $0) }, queue: queue,
        clock: clock)
      async let two = b.enqueue(
        keys.reversed().map { NewJob(payload: Data($0.utf8), runAt: epoch, deduplicationKey: $0) },
        queue: queue,
        clock: clock)
      let (x, y) = try await (one, two)
      #expect(x.map(\.id) == y.map(\.id).reversed(), "round \(round)")
      #expect(Set(x.map(\.id)).count == keys.count)
      #expect(x.filter { $0.inserted }.count + y.filter { $0.inserted }.count == keys.count)
    }
    await a.close()
    await b.close()
  }
}

extension Array {
  /// The results of `transform` on each element, in order, one after another.
  func asyncMap<T>(_ transform: (Element) async throws -> T) async rethrows -> [T] {
    var results: [T] = []
    for element in self { results.append(try await transform(element)) }
    return results
  }
}
