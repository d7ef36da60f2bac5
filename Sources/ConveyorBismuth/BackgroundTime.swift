#if canImport(UIKit) && !os(watchOS)
  import Conveyor
  import UIKit

  /// Asks UIKit for background time while the queue handles items, and gives it back when the
  /// queue has finished, is paused or stopped (``Bismuth/Config/canRunInBackground``).
  ///
  /// If the system ends the time first, the item being handled is interrupted with the app; the
  /// engine hands it out again after its lease, as after a crash.
  final class BackgroundTime: Sendable {
    private let watcher: Task<Void, Never>

    init(events: AsyncStream<JobQueueEvent>) {
      watcher = Task { @MainActor in
        let holder = Holder()
        for await event in events {
          switch event {
          case .started:
            holder.begin()
          case .finished, .stateChanged(.paused), .stateChanged(.stopped):
            holder.end()
          default:
            break
          }
        }
        holder.end()
      }
    }

    deinit {
      watcher.cancel()
    }

    /// The background task currently held, on the main actor as UIKit wants.
    @MainActor
    private final class Holder {
      private var identifier = UIBackgroundTaskIdentifier.invalid

      func begin() {
        guard identifier == .invalid else { return }
        identifier = UIApplication.shared.beginBackgroundTask(withName: "Conveyor queue") {
          MainActor.assumeIsolated { self.end() }
        }
      }

      func end() {
        guard identifier != .invalid else { return }
        UIApplication.shared.endBackgroundTask(identifier)
        identifier = .invalid
      }
    }
  }
#endif
