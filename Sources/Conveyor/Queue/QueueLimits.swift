import Foundation

/// Limits stored with a queue, which every worker of every process sharing the store obeys.
///
/// Set them with ``JobQueue/setLimits(_:)`` (or `conveyor limits set`); read them with
/// ``JobQueue/limits()``. They are kept in the store beside the queue's jobs and its pause flag,
/// so a process started later, or running on another machine against the same PostgreSQL
/// database, obeys the same limits without being told.
///
/// ```swift
/// try await queue.setLimits(QueueLimits(concurrency: 3))  // at most 3 run at once, everywhere
/// ```
///
/// ## Concurrency
///
/// ``concurrency`` bounds how many of the queue's jobs are *running* at once: claimed by a
/// worker and not yet settled. The store counts them when it claims, inside the claim's
/// transaction, so the bound holds across processes and machines, not per process. A job a
/// worker prefetched (``JobQueueConfiguration/prefetch``) or claimed ahead takes a place though
/// its handler has not started, so handlers running never outnumber the limit.
///
/// The limit is exceeded only by a job whose lease lapsed: when a worker stops heart-beating for
/// longer than its lease (stopped, partitioned, or hung past it), its job is handed to another
/// worker and counted once, while the first worker's handler, if it ever resumes, runs beside it
/// until its outcome is refused. A killed worker's job keeps its place until its lease lapses,
/// then runs again.
///
/// Lowering the limit below the number running stops nothing: no job is claimed until fewer than
/// the new limit run. A worker waiting for a free place claims when one of its own jobs finishes,
/// and otherwise looks again at each ``JobQueueConfiguration/pollInterval``.
///
/// ## Rate
///
/// ``rate`` bounds how often the queue's jobs *start*: claims, across every worker, at most
/// ``RateLimit/perSecond`` per second on average, and at most ``RateLimit/burst`` at once after a
/// quiet spell. It is a token bucket (kept as GCRA's one stored time, inside the claim's
/// transaction): see ``RateLimit``.
public struct QueueLimits: Sendable, Hashable, Codable {
  /// The most jobs of the queue that may run at once across every worker, or nil for no bound
  /// (each queue then runs up to its own ``JobQueueConfiguration/concurrency``). From 1 to
  /// ``maximumConcurrency``.
  public var concurrency: Int?

  /// The largest ``concurrency`` a store keeps.
  public static let maximumConcurrency = 1_000_000

  /// How often the queue's jobs may start across every worker, or nil for no bound.
  public var rate: RateLimit?

  /// The most jobs of any one limit key (``NewJob/limitKey``) that may run at once across every
  /// worker, or nil for no bound per key (a key named in ``keyConcurrencyOverrides`` still has
  /// its own). From 1 to ``maximumConcurrency``. Jobs without a limit key are not bound by it.
  public var keyConcurrency: Int?

  /// Limits of single limit keys, in place of ``keyConcurrency``: "at most 5 for
  /// `api.example.com`". Each from 1 to ``maximumConcurrency``; at most
  /// ``maximumKeyOverrides`` keys, each a valid limit key (``LimitKey``). Stores compare keys byte
  /// for byte: an override binds the jobs whose key has its exact bytes. (A Swift dictionary takes
  /// two canonically equivalent spellings, a precomposed and a decomposed "é", for one key, so only
  /// one of them can have an override here.)
  public var keyConcurrencyOverrides: [String: Int]

  /// The most keys ``keyConcurrencyOverrides`` may name, and the most ``keyRateOverrides`` may.
  public static let maximumKeyOverrides = 10_000

  /// How often the jobs of any one limit key (``NewJob/limitKey``) may start across every worker,
  /// or nil for no bound per key (a key named in ``keyRateOverrides`` still has its own): "at most
  /// 10 a second to each host". Each key has a bucket of its own, as ``rate`` is the queue's: over
  /// any `t` seconds at most `burst + perSecond × t` claims of the key. A claim that reaches a job
  /// of a key whose bucket is empty holds it (``JobRecord/isHeldByLimit``) until the bucket gives
  /// its next start; ``JobStore/nextWake(queue:clock:)`` gives that time. Jobs without a limit key
  /// are not bound by it.
  public var keyRate: RateLimit?

  /// Rates of single limit keys, in place of ``keyRate``: "at most 2 a second to
  /// `api.example.com`". At most ``maximumKeyOverrides`` keys, each a valid limit key
  /// (``LimitKey``), matched byte for byte as in ``keyConcurrencyOverrides``.
  public var keyRateOverrides: [String: RateLimit]

  /// Limits; nil leaves that limit off.
  ///
  /// - Parameters:
  ///   - concurrency: The most jobs of the queue running at once, across every worker.
  ///   - rate: How often the queue's jobs may start, across every worker.
  ///   - keyConcurrency: The most jobs of any one limit key running at once, across every worker.
  ///   - keyConcurrencyOverrides: Limits of single keys, in place of `keyConcurrency`.
  ///   - keyRate: How often the jobs of any one limit key may start, across every worker.
  ///   - keyRateOverrides: Rates of single keys, in place of `keyRate`.
  public init(
    concurrency: Int? = nil, rate: RateLimit? = nil, keyConcurrency: Int? = nil,
    keyConcurrencyOverrides: [String: Int] = [:], keyRate: RateLimit? = nil,
    keyRateOverrides: [String: RateLimit] = [:]
  ) {
    self.concurrency = concurrency
    self.rate = rate
    self.keyConcurrency = keyConcurrency
    self.keyConcurrencyOverrides = keyConcurrencyOverrides
    self.keyRate = keyRate
    self.keyRateOverrides = keyRateOverrides
  }

  private enum CodingKeys: String, CodingKey {
    case concurrency, rate, keyConcurrency, keyConcurrencyOverrides, keyRate, keyRateOverrides
  }

  /// Decodes limits; members a JSON document written before they existed lacks are left off.
  public init(from decoder: any Decoder) throws {
    let container = try decoder.container(keyedBy: CodingKeys.self)
    concurrency = try container.decodeIfPresent(Int.self, forKey: .concurrency)
    rate = try container.decodeIfPresent(RateLimit.self, forKey: .rate)
    keyConcurrency = try container.decodeIfPresent(Int.self, forKey: .keyConcurrency)
    keyConcurrencyOverrides =
      try container.decodeIfPresent([String: Int].self, forKey: .keyConcurrencyOverrides) ?? [:]
    keyRate = try container.decodeIfPresent(RateLimit.self, forKey: .keyRate)
    keyRateOverrides =
      try container.decodeIfPresent([String: RateLimit].self, forKey: .keyRateOverrides) ?? [:]
  }

  /// Whether no limit is set.
  public var isEmpty: Bool { concurrency == nil && rate == nil && !hasKeyLimits }

  /// Whether a limit per key is set (``keyConcurrency``, ``keyRate`` or an override of either).
  public var hasKeyLimits: Bool { keyConcurrency != nil || !keyConcurrencyOverrides.isEmpty || hasKeyRates }

  /// Whether a rate per key is set (``keyRate`` or an override).
  public var hasKeyRates: Bool { keyRate != nil || !keyRateOverrides.isEmpty }

  /// The most jobs of limit key `key` that may run at once: its override, else
  /// ``keyConcurrency``; nil when the key is not bound. Keys match byte for byte, as the stores
  /// match them: an override of the precomposed "é" does not bind the decomposed one.
  public func concurrency(forKey key: String) -> Int? {
    Self.own(keyConcurrencyOverrides, key) ?? keyConcurrency
  }

  /// The value `overrides` holds for `key`'s exact bytes, if any.
  package static func own<Value>(_ overrides: [String: Value], _ key: String) -> Value? {
    // A Swift dictionary finds canonically equivalent keys; it holds at most one of them, so the
    // one it finds is the only candidate.
    guard let index = overrides.index(forKey: key) else { return nil }
    let (stored, value) = overrides[index]
    return stored.utf8.elementsEqual(key.utf8) ? value : nil
  }

  /// How often jobs of limit key `key` may start: its override, else ``keyRate``; nil when the
  /// key's starts are not bound. Keys match byte for byte, as in ``concurrency(forKey:)``.
  public func rate(forKey key: String) -> RateLimit? {
    Self.own(keyRateOverrides, key) ?? keyRate
  }

  /// The keys with a limit (of concurrency or rate), for a listing of at most `listing` keys: of
  /// `read` (the store's ``JobStore/limitKeyUsage(queue:limit:)`` asked for `listing + 1`), those
  /// with a limit, then the keys with a limit of their own and no job running or held, by bytes, as
  /// room allows. Each with its limits; `complete` false when keys were left out.
  package func keysWithLimits(_ read: [LimitKeyUsage], listing: Int) -> (
    keys: [KeyWithLimits], complete: Bool
  ) {
    var keys = read.prefix(listing).compactMap { row -> KeyWithLimits? in
      let limit = concurrency(forKey: row.key)
      let rate = rate(forKey: row.key)
      return limit == nil && rate == nil ? nil : KeyWithLimits(usage: row, limit: limit, rate: rate)
    }
    guard read.count <= listing else { return (keys, false) }
    var seen = Set(read.map { Array($0.key.utf8) })
    var idle: [String] = []
    for key in Array(keyConcurrencyOverrides.keys) + Array(keyRateOverrides.keys)
    where seen.insert(Array(key.utf8)).inserted {
      idle.append(key)
    }
    idle.sort { $0.utf8.lexicographicallyPrecedes($1.utf8) }
    let room = max(0, listing - keys.count)
    for key in idle.prefix(room) {
      keys.append(
        KeyWithLimits(
          usage: LimitKeyUsage(key: key, running: 0, held: 0), limit: concurrency(forKey: key),
          rate: rate(forKey: key)))
    }
    return (keys, idle.count <= room)
  }

  /// Why these limits cannot be stored, or nil when they can.
  public var problem: String? {
    if let concurrency, !(1...Self.maximumConcurrency).contains(concurrency) {
      return "a concurrency limit must be from 1 to \(Self.maximumConcurrency), not \(concurrency); "
        + "pause the queue to stop claims, or pass nil to remove the limit"
    }
    if let keyConcurrency, !(1...Self.maximumConcurrency).contains(keyConcurrency) {
      return
        "a concurrency limit per key must be from 1 to \(Self.maximumConcurrency), not \(keyConcurrency); "
        + "pass nil to remove it"
    }
    if keyConcurrencyOverrides.count > Self.maximumKeyOverrides {
      return "at most \(Self.maximumKeyOverrides) keys may have their own concurrency limit, not "
        + "\(keyConcurrencyOverrides.count); give the others the limit per key"
    }
    for (key, limit) in keyConcurrencyOverrides.sorted(by: {
      $0.key.utf8.lexicographicallyPrecedes($1.key.utf8)
    }) {
      if let problem = LimitKey.problem(key) { return problem }
      if !(1...Self.maximumConcurrency).contains(limit) {
        return "the concurrency limit of key \"\(LimitKey.printable(key))\" must be from 1 to "
          + "\(Self.maximumConcurrency), not \(limit); remove the key to give it the limit per key"
      }
    }
    if let problem = rate?.problem { return problem }
    if let problem = keyRate?.problem { return "the rate per key: " + problem }
    if keyRateOverrides.count > Self.maximumKeyOverrides {
      return "at most \(Self.maximumKeyOverrides) keys may have their own rate, not "
        + "\(keyRateOverrides.count); give the others the rate per key"
    }
    for (key, rate) in keyRateOverrides.sorted(by: { $0.key.utf8.lexicographicallyPrecedes($1.key.utf8) }) {
      if let problem = LimitKey.problem(key) { return problem }
      if let problem = rate.problem { return "the rate of key \"\(LimitKey.printable(key))\": " + problem }
    }
    return nil
  }

  /// Throws ``JobQueueError/invalidLimits(_:)`` when ``problem`` names one.
  package func check() throws {
    if let problem { throw JobQueueError.invalidLimits(problem) }
  }

  /// How many jobs a claim may take when `running` jobs of the queue already run and the worker
  /// asked for `wanted`.
  package func claimable(_ wanted: Int, running: Int) -> Int {
    guard let concurrency else { return wanted }
    return max(0, min(wanted, concurrency - running))
  }
}

/// A limit key's use and limits, as `conveyor status` and the dashboard list them.
package struct KeyWithLimits: Sendable {
  package var usage: LimitKeyUsage
  /// The key's concurrency limit, if any.
  package var limit: Int?
  /// The key's rate, if any.
  package var rate: RateLimit?
}

/// A bound on how often a queue's jobs start, shared by every worker of every process: on average
/// at most ``perSecond`` a second, and at most ``burst`` at once after a quiet spell.
///
/// ```swift
/// // At most 10 calls a second to the partner's API, never more than 5 at once.
/// try await queue.setLimits(QueueLimits(rate: RateLimit(perSecond: 10, burst: 5)))
/// ```
///
/// ## What counts
///
/// A *start* is a claim: each job a worker claims takes one start, whether it is a first attempt,
/// a retry, or a job handed on after a lapsed lease. A job a worker prefetched or claimed ahead
/// (``JobQueueConfiguration/prefetch``) takes its start when it is claimed, so its handler may
/// begin a little later than its start. Over any span of `t` seconds the queue's claims number at
/// most `burst + perSecond × t`.
///
/// The store keeps the bucket as one time per queue (GCRA's theoretical arrival time), read and
/// written inside the claim's transaction: SQLite under the file's write lock, PostgreSQL under
/// the queue's limit lock, the in-memory store under its lock. A claim takes the starts the
/// bucket holds and no more; when it holds none, ``ClaimBatch/nextStart`` says when it will, and
/// ``JobStore/nextWake(queue:clock:)`` gives no run date before then, so workers sleep until the
/// next start instead of polling.
///
/// ## Clocks
///
/// Times are the claim's: the caller's clock, or on PostgreSQL the server's unless the store uses
/// the caller's. A clock stepped back cannot stall the queue for longer than one interval
/// (`1 / perSecond`): a stored time further ahead than a full bucket's worth is cut back to it.
/// A clock stepped forward fills the bucket, as a quiet spell would: at most ``burst`` start at once.
public struct RateLimit: Sendable, Hashable, Codable, CustomStringConvertible {
  /// Starts a second, on average: from ``minimumPerSecond`` (one a day) to ``maximumPerSecond``.
  public var perSecond: Double
  /// The most starts at once after a quiet spell: from 1 (starts evenly spaced) to ``maximumBurst``.
  public var burst: Int

  /// The slowest rate a store keeps: one start a day.
  public static let minimumPerSecond: Double = 1.0 / 86_400
  /// The fastest rate a store keeps.
  public static let maximumPerSecond: Double = 1_000_000
  /// The largest ``burst`` a store keeps.
  public static let maximumBurst = 1_000_000

  /// A rate of `perSecond` starts a second with bursts of up to `burst`.
  public init(perSecond: Double, burst: Int = 1) {
    self.perSecond = perSecond
    self.burst = burst
  }

  /// Why this rate cannot be stored, or nil when it can.
  public var problem: String? {
    guard perSecond.isFinite, perSecond >= Self.minimumPerSecond, perSecond <= Self.maximumPerSecond else {
      return "a rate limit must be from one start a day (\(Self.minimumPerSecond)/s) to "
        + "\(Int(Self.maximumPerSecond))/s, not \(perSecond)/s; pause the queue to stop claims, or pass nil "
        + "to remove the limit"
    }
    guard (1...Self.maximumBurst).contains(burst) else {
      return "a rate limit's burst must be from 1 to \(Self.maximumBurst), not \(burst)"
    }
    return nil
  }

  /// The rate as `conveyor limits` prints it: "10/s", "30/min" for 0.5 a second, "2/h", with
  /// " (bursts of B)" when the burst is more than 1.
  public var description: String {
    let (value, unit) =
      perSecond >= 1
      ? (perSecond, "s") : perSecond * 60 >= 1 ? (perSecond * 60, "min") : (perSecond * 3_600, "h")
    let rounded = (value * 1_000).rounded() / 1_000
    let number =
      rounded == rounded.rounded() && abs(rounded) < 1e15 ? String(Int64(rounded)) : String(rounded)
    return "\(number)/\(unit)" + (burst > 1 ? " (bursts of \(burst))" : "")
  }

  /// The time between two starts, in microseconds: from 1 to a day's, whatever ``perSecond``
  /// holds (a value out of range never traps: a store reads what it stored).
  package var intervalMicroseconds: Int64 {
    let day = 86_400_000_000.0
    let raw = (1_000_000 / perSecond).rounded(.up)
    return Int64(raw.isNaN ? day : min(max(raw, 1), day))
  }

  /// ``burst`` within 1 to ``maximumBurst``.
  private var boundedBurst: Int64 { Int64(min(max(burst, 1), Self.maximumBurst)) }

  /// The bucket at `now` (microseconds since 1970) with the stored time `tat` (nil: full):
  /// how many of `wanted` starts it gives, the time to store after taking them, the earliest
  /// time (microseconds) it gives the next one after them (`now` or earlier: at once), and whether
  /// the time must be stored even when no start was taken (``take(_:tat:now:)`` cut it back).
  package func take(_ wanted: Int, tat: Int64?, now: Int64) -> (
    starts: Int, tat: Int64, next: Int64, mustStore: Bool
  ) {
    let interval = intervalMicroseconds
    let slack = (boundedBurst - 1) * interval
    // Never further ahead than a full bucket's worth, which no claim at `now` or later can store:
    // a clock stepped back stalls one interval. The cut time is stored, or the next claim would
    // cut it again, one interval ahead of its own time, for as long as the clock is behind.
    let ceiling = now + slack + interval
    let cut = (tat ?? now) > ceiling
    let base = max(min(tat ?? now, ceiling), now)
    let available = now + slack < base ? 0 : Int((now + slack - base) / interval) + 1
    let starts = max(0, min(wanted, available))
    let stored = base + Int64(starts) * interval
    return (starts, stored, stored - slack, cut || starts > 0)
  }

  /// When the bucket with the stored time `tat` gives its next start (microseconds), or nil when
  /// it gives one at `now`.
  package func nextStart(tat: Int64?, now: Int64) -> Int64? {
    let next = take(0, tat: tat, now: now).next
    return next > now ? next : nil
  }

  /// Microseconds since 1970 of `date`.
  package static func microseconds(_ date: Date) -> Int64 {
    let value = (date.timeIntervalSince1970 * 1_000_000).rounded(.down)
    return Int64(max(min(value, 4e18), -4e18))
  }

  /// The date of `microseconds` since 1970.
  package static func date(_ microseconds: Int64) -> Date {
    Date(timeIntervalSince1970: Double(microseconds) / 1_000_000)
  }
}
