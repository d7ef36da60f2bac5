import Foundation
import Testing

@testable import Conveyor

/// `RateLimit`'s bucket arithmetic (GCRA), which the in-memory and SQLite stores run as it is and
/// PostgreSQL runs in SQL.
@Suite struct RateLimitTests {
  /// A rate read back from a store is used as it is: whatever it holds (a value no check would
  /// have let in), taking starts never traps, and gives a bounded interval and burst.
  @Test func anyStoredValueTakesStartsWithoutTrapping() {
    let rates: [Double] = [0, -1, .nan, .infinity, -.infinity, .leastNonzeroMagnitude, 1e-300, 1e300]
    let bursts = [Int.min, -1, 0, 1, Int.max]
    for perSecond in rates {
      for burst in bursts {
        let rate = RateLimit(perSecond: perSecond, burst: burst)
        #expect(rate.problem != nil || perSecond == 1e300, "\(perSecond)/s burst \(burst) is refused")
        #expect((1...86_400_000_000).contains(rate.intervalMicroseconds), "\(perSecond)/s")
        for tat: Int64? in [nil, 0, Int64(4e18), -Int64(4e18)] {
          let taken = rate.take(5, tat: tat, now: 1_700_000_000_000_000)
          #expect(
            (0...5).contains(taken.starts), "\(perSecond)/s burst \(burst) tat \(String(describing: tat))")
        }
      }
    }
  }

  /// The bucket's arithmetic by hand: 4 a second (250 ms apart), bursts of 3.
  @Test func theBucketGivesItsBurstThenOneStartAnInterval() {
    let rate = RateLimit(perSecond: 4, burst: 3)
    let second: Int64 = 1_000_000
    let first = rate.take(10, tat: nil, now: 10 * second)
    #expect(first.starts == 3 && first.tat == 10 * second + 750_000 && first.next == 10 * second + 250_000)
    #expect(rate.nextStart(tat: first.tat, now: 10 * second) == 10 * second + 250_000)
    let early = rate.take(10, tat: first.tat, now: 10 * second + 249_999)
    #expect(early.starts == 0 && !early.mustStore)
    let due = rate.take(10, tat: first.tat, now: 10 * second + 250_000)
    #expect(due.starts == 1 && due.mustStore)
    // A stored time far ahead (a clock stepped back) is cut to a full bucket's worth, and stored.
    let back = rate.take(10, tat: 100 * second, now: 10 * second)
    #expect(back.starts == 0 && back.mustStore && back.tat == 10 * second + 750_000)
    #expect(RateLimit(perSecond: 0.5, burst: 4).description == "30/min (bursts of 4)")
    #expect(RateLimit(perSecond: 10).description == "10/s")
    #expect(RateLimit(perSecond: 2.5 / 3_600).description == "2.5/h")
  }
}
