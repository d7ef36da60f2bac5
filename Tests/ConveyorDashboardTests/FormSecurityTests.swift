import Conveyor
import ConveyorDashboard
import Foundation
import Testing

/// Cross-site request forgery: every POST needs the instance's form token, a same-origin
/// `Origin` and `Sec-Fetch-Site`, and a form body; a refused POST (pause, retry, cancel) changes
/// nothing in the store.
@Suite struct FormSecurityTests {
  /// Refused: no token, another instance's token, a foreign or `null` origin, a cross-site fetch,
  /// a JSON body. The queue stays unpaused and the dead job dead; then the same form from the
  /// page's own origin pauses it.
  @Test func aForgedPostIsRefusedAndChangesNothing() async throws {
    let harness = try DashboardHarness()
    let dead = try await harness.deadJob(queue: "mail")
    let waiting = try await harness.waitingJob(queue: "mail")
    let token = try await harness.formToken()
    let other = try DashboardHarness()
    _ = try await other.deadJob(queue: "mail")
    let otherToken = try await other.formToken()
    #expect(otherToken != token, "a form token is per instance")
    let pause = "/queues/pause"
    let retry = "/jobs/\(dead.rawValue)/retry"
    let cancel = "/jobs/\(waiting.rawValue)/cancel"
    let refusals: [(String, Answer)] = [
      ("no token", await harness.post(pause, form: [("queue", "mail")])),
      ("empty token", await harness.post(pause, form: [("csrf", ""), ("queue", "mail")])),
      (
        "another instance's token",
        await harness.post(pause, form: [("csrf", otherToken), ("queue", "mail")])
      ),
      (
        "foreign origin",
        await harness.post(pause, form: [("csrf", token), ("queue", "mail")], origin: "https://evil.example")
      ),
      ("null origin", await harness.post(pause, form: [("csrf", token), ("queue", "mail")], origin: "null")),
      (
        "other port",
        await harness.post(
          pause, form: [("csrf", token), ("queue", "mail")], origin: "https://jobs.example.test:8443")
      ),
      (
        "cross-site fetch",
        await harness.post(pause, form: [("csrf", token), ("queue", "mail")], fetchSite: "cross-site")
      ),
      (
        "same-site fetch",
        await harness.post(pause, form: [("csrf", token), ("queue", "mail")], fetchSite: "same-site")
      ),
      ("retry without token", await harness.post(retry, form: [])),
      (
        "retry from another site",
        await harness.post(retry, form: [("csrf", token)], origin: "http://evil.example")
      ),
      ("cancel without token", await harness.post(cancel, form: [])),
      ("cancel with another instance's token", await harness.post(cancel, form: [("csrf", otherToken)])),
      (
        "cancel from another site",
        await harness.post(cancel, form: [("csrf", token)], origin: "http://evil.example")
      ),
      (
        "cancel cross-site fetch",
        await harness.post(cancel, form: [("csrf", token)], fetchSite: "cross-site")
      ),
    ]
    for (what, answer) in refusals {
      #expect(answer.status == 403, "\(what): \(answer)")
      #expect(answer.hasSecurityHeaders, "\(what)")
    }
    let json = await harness.dashboard.respond(
      to: DashboardRequest(
        method: "POST", target: pause,
        headers: [("Host", DashboardHarness.host), ("Content-Type", "application/json")],
        body: Data("{\"csrf\":\"\(token)\",\"queue\":\"mail\"}".utf8)))
    #expect(json.status == 415)
    #expect(try await harness.store.isPaused(queue: "mail") == false)
    #expect(try await harness.store.job(dead)?.status == .dead)
    #expect(try await harness.store.job(waiting)?.status == .pending, "a refused cancel cancelled")
    let paused = await harness.post(pause, form: [("csrf", token), ("queue", "mail")])
    #expect(paused.status == 303, "\(paused)")
    #expect(try await harness.store.isPaused(queue: "mail"))
  }

  /// A schedule's pause form without the instance's token, or from another site, is refused and
  /// leaves the schedule firing; the same form with the page's token pauses it.
  @Test func aForgedSchedulePauseIsRefusedAndChangesNothing() async throws {
    let harness = try DashboardHarness()
    try await harness.schedule("tick", queue: "mail")
    let token = try await harness.formToken("/schedules")
    let other = try DashboardHarness()
    try await other.schedule("tick", queue: "mail")
    let otherToken = try await other.formToken("/schedules")
    let pause = "/schedules/pause"
    let fields = [("queue", "mail"), ("name", "tick")]
    let refusals: [(String, Answer)] = [
      ("no token", await harness.post(pause, form: fields)),
      ("empty token", await harness.post(pause, form: [("csrf", "")] + fields)),
      ("another instance's token", await harness.post(pause, form: [("csrf", otherToken)] + fields)),
      (
        "foreign origin",
        await harness.post(pause, form: [("csrf", token)] + fields, origin: "https://evil.example")
      ),
      ("null origin", await harness.post(pause, form: [("csrf", token)] + fields, origin: "null")),
      (
        "cross-site fetch",
        await harness.post(pause, form: [("csrf", token)] + fields, fetchSite: "cross-site")
      ),
    ]
    for (what, answer) in refusals {
      #expect(answer.status == 403, "\(what): \(answer)")
      #expect(answer.hasSecurityHeaders, "\(what)")
    }
    #expect(
      try await harness.storedSchedule("tick", queue: "mail")?.paused == false, "a refused pause paused")
    let paused = await harness.post(pause, form: [("csrf", token)] + fields)
    #expect(paused.status == 303, "\(paused)")
    #expect(try await harness.storedSchedule("tick", queue: "mail")?.paused == true)
  }

  /// A POST from the public origin is accepted when the `Host` a proxy passed on differs.
  @Test func aPostFromThePublicOriginIsAccepted() async throws {
    var configuration = DashboardConfiguration()
    configuration.publicOrigin = DashboardOrigin("https://dash.example.com")
    let harness = try DashboardHarness(configuration)
    _ = try await harness.deadJob(queue: "q")
    let token = try await harness.formToken()
    let answer = await harness.post(
      "/queues/pause", form: [("csrf", token), ("queue", "q")], origin: "https://dash.example.com")
    #expect(answer.status == 303, "\(answer)")
    #expect(try await harness.store.isPaused(queue: "q"))
  }
}
