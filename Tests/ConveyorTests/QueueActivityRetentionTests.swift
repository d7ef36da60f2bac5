import Foundation
import Testing

@testable import Conveyor

/// Which minutes a store deletes when it records activity: by the clock the minutes were keyed
/// with, never later than the wall clock.
@Suite("Activity retention cutoff")
struct QueueActivityRetentionTests {
  let now = Date(timeIntervalSince1970: 1_700_000_000)
  let day: TimeInterval = 86_400

  @Test func aDayBeforeTheNewestMinuteRecorded() {
    let minute = QueueActivity.minute(containing: now.addingTimeInterval(-3_600))
    let rows = [
      QueueActivity(queue: "a", minute: minute.addingTimeInterval(-600), succeeded: 1),
      QueueActivity(queue: "a", minute: minute, succeeded: 1),
    ]
    #expect(QueueActivity.retentionCutoff(recording: rows, now: now) == minute.addingTimeInterval(-day))
  }

  @Test func aClockAheadOfTheWallClockDeletesNothingEarly() {
    let ahead = [QueueActivity(queue: "a", minute: now.addingTimeInterval(7 * day), succeeded: 1)]
    #expect(QueueActivity.retentionCutoff(recording: ahead, now: now) == now.addingTimeInterval(-day))
  }

  @Test func nothingRecordedUsesTheWallClock() {
    #expect(QueueActivity.retentionCutoff(recording: [], now: now) == now.addingTimeInterval(-day))
  }
}
