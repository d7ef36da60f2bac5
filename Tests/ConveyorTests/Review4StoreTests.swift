import Foundation
import Synchronization
import Testing

@testable import Conveyor

// MARK: - Helpers

/// Which role the current task plays for `Review4GatedClock`.
enum Review4ClockRole: Sendable {
  case plain
  /// Blocks inside `now()` (on its own thread) until released: a call that holds the store's lock.
  case holder
  /// Reports each `now()` reading.
  case observed
}

enum Review4Role {
  @TaskLocal static var role: Review4ClockRole = .plain
}

/// A manual clock whose `now()` can block one caller (to hold a store's lock) and report another
/// caller's readings.
final class Review4GatedClock: JobClock, Sendable {
  let base: ManualJobClock
  private let gate = DispatchSemaphore(value: 0)
  let holderEntered: AsyncStream<Void>
  private let holderEnteredContinuation: AsyncStream<Void>.Continuation
  let observedRead: AsyncStream<Void>
  private let observedReadContinuation: AsyncStream<Void>.Continuation

  init(base: ManualJobClock) {
    self.base = base
    (holderEntered, holderEnteredContinuation) = AsyncStream.makeStream()
    (observedRead, observedReadContinuation) = AsyncStream.makeStream()
  }

  func release() { gate.signal() }

  func now() -> Date {
    switch Review4Role.role {
    case .plain:
      return base.now()
    case .holder:
      holderEnteredContinuation.yield()
      // Runs on a dedicated thread (a ThreadExecutor), never on the cooperative pool. The test
      // releases it on every path; the bound is only a last resort. (It was 30 s: beside the other
      // suites on two cores, the test's task once woke from its 2 s wait later than that, and the
      // holder let go before the clock moved.)
      _ = gate.wait(timeout: .now() + 600)
      return base.now()
    case .observed:
      let date = base.now()
      observedReadContinuation.yield()
      return date
    }
  }

  func sleep(until deadline: Date) async throws { try await base.sleep(until: deadline) }
  func uptime() -> Duration { base.uptime() }
  func sleep(untilUptime deadline: Duration) async throws { try await base.sleep(untilUptime: deadline) }
}

/// Whether `stream` yields within `seconds`.
func review4Yields(_ stream: AsyncStream<Void>, within seconds: Double) async -> Bool {
  await withTaskGroup(of: Bool.self) { group in
    group.addTask {
      for await _ in stream { return true }
      return false
    }
    group.addTask {
      try? await Task.sleep(for: .seconds(seconds))
      return false
    }
    let first = await group.next() ?? false
    group.cancelAll()
    return first
  }
}

/// Runs `call` (on a thread of its own) while another call holds the store's lock; while it waits,
/// the clock advances by `advance`. Returns what `call` returned.
func review4WhileLockHeld<T: Sendable>(
  store: InMemoryJobStore, clock: Review4GatedClock, queue: String, advance: Duration,
  _ call: @escaping @Sendable () async throws -> T
) async throws -> T {
  // Whatever happens below, the holder is let go.
  defer { clock.release() }
  let holderThread = ThreadExecutor(name: "Review4.holder")
  let callerThread = ThreadExecutor(name: "Review4.caller")
  let holder = Task(executorPreference: holderThread) {
    try await Review4Role.$role.withValue(.holder) {
      // `counts` reads the clock while it holds the store's lock.
      _ = try await store.counts(queue: queue, clock: clock)
    }
  }
  let entered = await review4Yields(clock.holderEntered, within: 30)
  try #require(entered, "the holder never read the clock")
  let caller = Task(executorPreference: callerThread) {
    try await Review4Role.$role.withValue(.observed) { try await call() }
  }
  // A store that reads the clock before taking its lock reads it now; one that reads it under the
  // lock cannot until the holder lets go (this wait then simply times out).
  _ = await review4Yields(clock.observedRead, within: 2)
  clock.base.advance(by: advance)
  clock.release()
  try await holder.value
  return try await caller.value
}

// MARK: - InMemoryJobStore

@Suite(.timeLimit(.minutes(3))) struct Review4StoreTests {
  static let payload = Data("{}".utf8)

  // Found by review (fixed): settleAndClaim read the clock before taking its lock, so a claim that
  // waited for the lock committed a lease computed before the wait: here already expired when it is committed
  // (JobStore.swift: "a call that waited for the lock never commits a lease or run date computed
  // before the wait"; Lease: "a lease is never committed already expired").
  @Test func review4ClaimThatWaitedForTheLockGetsAFullLease() async throws {
    let store = InMemoryJobStore()
    let clock = Review4GatedClock(base: ManualJobClock())
    let queue = "q"
    _ = try await store.enqueue([NewJob(payload: Self.payload)], queue: queue, clock: clock)
    let lease = Lease(owner: "w", duration: .seconds(30))
    let batch = try await review4WhileLockHeld(
      store: store, clock: clock, queue: queue, advance: .seconds(60)
    ) {
      try await store.settleAndClaim([], queue: queue, limit: 1, lease: lease, clock: clock)
    }
    let claimed = try #require(batch.claimed.first)
    let now = clock.base.now()
    #expect(
      claimed.leaseExpiresAt == now.addingTimeInterval(30),
      "lease committed at \(now) ends at \(String(describing: claimed.leaseExpiresAt))")
    // A lease committed already expired: another worker's rescue takes the job at once.
    #expect(try await store.rescueExpiredLeases(queue: queue, clock: clock) == 0)
  }

  // Found by review (fixed): the same for a retry's run date: computed from a clock reading taken
  // before the wait for the lock, so the job was ready at once instead of 10 s after its outcome was committed.
  @Test func review4RetryThatWaitedForTheLockRunsAfterItsDelay() async throws {
    let store = InMemoryJobStore()
    let clock = Review4GatedClock(base: ManualJobClock())
    let queue = "q"
    _ = try await store.enqueue([NewJob(payload: Self.payload)], queue: queue, clock: clock)
    let lease = Lease(owner: "w", duration: .seconds(300))
    let first = try await store.settleAndClaim([], queue: queue, limit: 1, lease: lease, clock: clock)
    let claim = try #require(first.claimed.first).claim
    let settlement = JobSettlement(claim: claim, action: .retry(after: .seconds(10), error: "boom"))
    let batch = try await review4WhileLockHeld(
      store: store, clock: clock, queue: queue, advance: .seconds(60)
    ) {
      try await store.settleAndClaim([settlement], queue: queue, limit: 0, lease: lease, clock: clock)
    }
    let committedAt = clock.base.now()
    #expect(batch.staleSettlements.isEmpty)
    #expect(batch.retryDates[claim.id] == committedAt.addingTimeInterval(10))
    let counts = try await store.counts(queue: queue, clock: clock)
    #expect(counts.scheduled == 1 && counts.ready == 0, "\(counts)")
  }
}

// MARK: - InMemoryJobStore guards (these pass)

@Suite(.timeLimit(.minutes(1))) struct Review4StoreGuardTests {
  static let payload = Data("{}".utf8)
  let lease = Lease(owner: "w", duration: .seconds(30))

  /// Ready marks survive a backward step of the wall clock; scheduled jobs stay scheduled; claim
  /// order is priority, run date, ID; counts and nextWake agree with that.
  @Test func review4ReadinessSurvivesAClockStepBack() async throws {
    let store = InMemoryJobStore()
    let clock = ManualJobClock()
    let start = clock.now()
    let q = "q"
    let ids = try await store.enqueue(
      [
        NewJob(payload: Self.payload, priority: 0),  // 1: ready
        NewJob(payload: Self.payload, priority: 0, runTime: .after(.seconds(10))),  // 2: scheduled
        NewJob(payload: Self.payload, priority: 5, runTime: .after(.seconds(20))),  // 3: scheduled
        NewJob(payload: Self.payload, priority: 1),  // 4: ready
      ], queue: q, clock: clock
    ).map(\.id)
    clock.advance(by: .seconds(15))
    // Promotes job 2 (its date came); job 3 stays scheduled.
    let first = try await store.settleAndClaim([], queue: q, limit: 1, lease: lease, clock: clock)
    #expect(first.claimed.map(\.id) == [ids[3]])
    clock.step(by: .seconds(-100))
    var counts = try await store.counts(queue: q, clock: clock)
    #expect(counts == JobCounts(ready: 2, scheduled: 1, running: 1, dead: 0), "\(counts)")
    let hint = try await store.nextWake(queue: q, clock: clock)
    #expect(hint.nextRun == clock.now())
    #expect(hint.nextLeaseExpiry == start.addingTimeInterval(45))
    let second = try await store.settleAndClaim([], queue: q, limit: 5, lease: lease, clock: clock)
    #expect(second.claimed.map(\.id) == [ids[0], ids[1]])
    counts = try await store.counts(queue: q, clock: clock)
    #expect(counts == JobCounts(ready: 0, scheduled: 1, running: 3, dead: 0), "\(counts)")
    #expect(try await store.nextWake(queue: q, clock: clock).nextRun == start.addingTimeInterval(20))
  }

  /// A claim whose lease lapsed and that was re-claimed settles as stale and changes nothing; a
  /// removed job's settlement is stale; release keeps the old place; kill then requeueDead.
  @Test func review4StaleSettlementsChangeNothing() async throws {
    let store = InMemoryJobStore()
    let clock = ManualJobClock()
    let q = "q"
    let ids = try await store.enqueue(
      [NewJob(payload: Self.payload, deduplicationKey: "k"), NewJob(payload: Self.payload)], queue: q,
      clock: clock
    ).map(\.id)
    let a = try await store.settleAndClaim([], queue: q, limit: 1, lease: lease, clock: clock).claimed[0]
    #expect(a.id == ids[0])
    // Running: the key no longer blocks a new job.
    let dup = try await store.enqueue(
      [NewJob(payload: Self.payload, deduplicationKey: "k")], queue: q, clock: clock)
    #expect(dup[0].inserted)
    clock.advance(by: .seconds(31))
    #expect(try await store.rescueExpiredLeases(queue: q, clock: clock) == 1)
    // Both waiting with key "k" now: a third is deduplicated to the older.
    let dup2 = try await store.enqueue(
      [NewJob(payload: Self.payload, deduplicationKey: "k")], queue: q, clock: clock)
    #expect(!dup2[0].inserted && dup2[0].id == ids[0])
    let b = try await store.settleAndClaim([], queue: q, limit: 1, lease: lease, clock: clock).claimed[0]
    #expect(b.id == ids[0] && b.claimToken == a.claimToken + 1 && b.attempts == 2)
    let stale = try await store.settleAndClaim(
      [JobSettlement(claim: a.claim, action: .complete)], queue: q, limit: 0, lease: lease, clock: clock)
    #expect(stale.staleSettlements == [a.claim])
    #expect(try await store.job(ids[0])?.status == .running)
    let released = try await store.settleAndClaim(
      [JobSettlement(claim: b.claim, action: .release(error: nil))], queue: q, limit: 1, lease: lease,
      clock: clock)
    #expect(released.claimed.map(\.id) == [ids[0]] && released.claimed[0].attempts == 2)
    let c = released.claimed[0]
    _ = try await store.settleAndClaim(
      [JobSettlement(claim: c.claim, action: .kill(error: "x"))], queue: q, limit: 0, lease: lease,
      clock: clock)
    // A job with key "k" waits: the dead one is not requeued.
    #expect(try await store.requeueDead(nil, queue: q, clock: clock) == 0)
    #expect(try await store.remove([dup[0].id], queue: q) == 1)
    #expect(try await store.requeueDead(nil, queue: q, clock: clock) == 1)
    // Job 2 (run date of the start) comes before job 1 (re-queued now).
    let both = try await store.settleAndClaim([], queue: q, limit: 2, lease: lease, clock: clock).claimed
    #expect(both.map(\.id) == [ids[1], ids[0]])
    let d = both[1]
    #expect(d.attempts == 1)
    #expect(try await store.remove([ids[0]], queue: q) == 1)
    let gone = try await store.settleAndClaim(
      [JobSettlement(claim: d.claim, action: .complete)], queue: q, limit: 0, lease: lease, clock: clock)
    #expect(gone.staleSettlements == [d.claim])
    #expect(
      try await store.counts(queue: q, clock: clock) == JobCounts(ready: 0, scheduled: 0, running: 1, dead: 0)
    )
  }

  /// A retry into the future stays scheduled when the clock steps forward and back again only if
  /// no claim promoted it; after a claim promoted it, it is ready whatever the clock says.
  @Test func review4PromotedRetryStaysReadyAfterAStepBack() async throws {
    let store = InMemoryJobStore()
    let clock = ManualJobClock()
    let q = "q"
    _ = try await store.enqueue([NewJob(payload: Self.payload)], queue: q, clock: clock)
    let a = try await store.settleAndClaim([], queue: q, limit: 1, lease: lease, clock: clock).claimed[0]
    _ = try await store.settleAndClaim(
      [JobSettlement(claim: a.claim, action: .retry(after: .seconds(10), error: "e"))], queue: q, limit: 0,
      lease: lease, clock: clock)
    clock.step(by: .seconds(11))
    #expect(try await store.counts(queue: q, clock: clock).ready == 1)
    clock.step(by: .seconds(-11))
    #expect(try await store.counts(queue: q, clock: clock).scheduled == 1)
    clock.step(by: .seconds(11))
    // Neither a paused call nor a limit-0 call claims, so neither promotes the job.
    try await store.setPaused(true, queue: q)
    let paused = try await store.settleAndClaim([], queue: q, limit: 1, lease: lease, clock: clock)
    #expect(paused.paused && paused.claimed.isEmpty)
    try await store.setPaused(false, queue: q)
    _ = try await store.settleAndClaim([], queue: q, limit: 0, lease: lease, clock: clock)
    clock.step(by: .seconds(-11))
    let claimed = try await store.settleAndClaim([], queue: q, limit: 1, lease: lease, clock: clock)
    #expect(claimed.claimed.isEmpty, "limit 0 and a paused call promote nothing")
    clock.step(by: .seconds(11))
    #expect(
      try await store.settleAndClaim([], queue: q, limit: 1, lease: lease, clock: clock).claimed.count == 1)
  }
}

// MARK: - Heap guards (these pass)

@Suite(.timeLimit(.minutes(1))) struct Review4HeapTests {
  /// Element counts held in the heap's private arrays, read through reflection.
  static func footprint<E>(_ heap: Heap<E>) -> Int {
    var total = 0
    for child in Mirror(reflecting: heap).children {
      if let array = child.value as? [E] { total += array.count }
    }
    return total
  }

  @Test func review4AlternatingTrafficKeepsMemoryBounded() {
    // Several patterns of endless alternation with a small live set.
    var heap = Heap<Int>()
    var live: [Int] = []
    var next = 1_000_000
    var generator = SystemRandomNumberGenerator()
    for step in 0..<200_000 {
      let value: Int
      switch step % 4 {
      case 0: value = next  // in order
      case 1: value = next - Int.random(in: 0...50, using: &generator)  // straggler
      case 2: value = (live.min() ?? next)  // ties with the minimum
      default: value = next + 5
      }
      next += 1
      heap.push(value)
      live.append(value)
      if live.count > 16 || step % 3 != 0 {
        let minimum = live.min()!
        #expect(heap.pop() == minimum)
        live.remove(at: live.firstIndex(of: minimum)!)
      }
      if step % 1000 == 0 {
        #expect(heap.count == live.count)
        #expect(Self.footprint(heap) <= 4 * 1024, "footprint \(Self.footprint(heap)) with \(live.count) live")
      }
    }
  }
}

// MARK: - PayloadDecoder guards (these pass)

struct Review4Item: Queueable, Equatable {
  var name: String
  var count: Int
  var tags: [String]
  var ratio: Double?
}

@Suite(.timeLimit(.minutes(1))) struct Review4DecoderTests {
  /// Mutated payloads: never a trap, and the fast path only ever returns JSONDecoder's value.
  @Test func review4MutatedPayloadsNeverTrapAndAgree() {
    let seeds = [
      #"{"name":"a\u00e9\ud83d\ude00\n","count":-9223372036854775808,"tags":["x","y\\"],"ratio":1.5e-3}"#,
      #"{"name":"","count":0,"tags":[],"ratio":null}"#,
      #"{"name":"é😀","count":18,"tags":["\ud800\udc00"],"ratio":-0.0}"#,
    ]
    let alphabet =
      Array(#"{}[]":,\u0123456789abcdefABCDEF-+.eE ntrufls"#.utf8) + [0x00, 0x80, 0xC3, 0xED, 0xF4, 0xFF]
    var generator = SystemRandomNumberGenerator()
    let decoder = PayloadDecoder()
    for _ in 0..<20_000 {
      var bytes = Array(seeds.randomElement(using: &generator)!.utf8)
      for _ in 0..<Int.random(in: 1...4, using: &generator) {
        let position = Int.random(in: 0..<bytes.count, using: &generator)
        switch Int.random(in: 0..<3, using: &generator) {
        case 0: bytes[position] = alphabet.randomElement(using: &generator)!
        case 1: bytes.insert(alphabet.randomElement(using: &generator)!, at: position)
        default: if bytes.count > 1 { bytes.remove(at: position) }
        }
      }
      let data = Data(bytes)
      let reference = Result { try JSONDecoder().decode(Review4Item.self, from: data) }
      let mine = Result { try decoder.decode(Review4Item.self, from: data) }
      switch (reference, mine) {
      case (.success(let a), .success(let b)):
        #expect(
          a == b && a.ratio?.bitPattern == b.ratio?.bitPattern, "\(String(decoding: data, as: UTF8.self))")
      case (.failure(let a), .failure(let b)):
        #expect(String(describing: a) == String(describing: b))
      default:
        Issue.record("disagree on \(String(decoding: data, as: UTF8.self)): \(reference) vs \(mine)")
      }
    }
  }

  /// `item(of:)` from many tasks at once gives JSONDecoder's value or error every time.
  @Test func review4ItemOfIsSafeFromManyTasks() async throws {
    let store = InMemoryJobStore()
    var configuration = JobQueueConfiguration(identifier: "items", autoStart: false)
    configuration.clock = ManualJobClock()
    let queue = try JobQueue<Review4Item>(configuration: configuration, store: store) { _, _ in .handled }
    let good = Data(#"{"name":"n","count":3,"tags":["a"],"ratio":2.5}"#.utf8)
    let bad = Data(#"{"name":"n","count":3.5,"tags":["a"]}"#.utf8)
    let records = [good, bad].map { payload in
      JobRecord(
        id: JobID(1), queue: "items", payload: payload, status: .pending, priority: 0, attempts: 0,
        runAt: Date(), createdAt: Date(), deduplicationKey: nil)
    }
    let expectedGood = try JSONDecoder().decode(Review4Item.self, from: good)
    let expectedBad = String(describing: Result { try JSONDecoder().decode(Review4Item.self, from: bad) })
    try await withThrowingTaskGroup(of: Void.self) { group in
      for task in 0..<32 {
        group.addTask {
          for round in 0..<500 {
            let record = records[(task + round) % 2]
            let result = Result { try queue.item(of: record) }
            if record.payload == good {
              #expect((try? result.get()) == expectedGood)
            } else {
              #expect(String(describing: result) == expectedBad)
            }
          }
        }
      }
      try await group.waitForAll()
    }
  }
}
