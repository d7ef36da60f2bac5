import Conveyor
import ConveyorDashboard
import Foundation
import Testing

/// The dashboard mounted under a path prefix: everything it emits carries the prefix, and
/// nothing outside the prefix is answered.
@Suite struct MountPathTests {
  static let mount = "/admin/jobs"

  /// Every link, form action and asset URL of every page starts with the prefix, and the assets
  /// and the script's fetches are served there.
  @Test func everyURLOfEveryPageCarriesThePrefix() async throws {
    let harness = try DashboardHarness(DashboardConfiguration(mountPath: Self.mount))
    let dead = try await harness.deadJob(queue: "mail")
    var checked = 0
    for target in [
      "/admin/jobs", "/admin/jobs/", "/admin/jobs/jobs?queue=mail&state=dead",
      "/admin/jobs/jobs/\(dead.rawValue)",
      "/admin/jobs/confirm?action=retry-dead&state=dead&queue=mail", "/admin/jobs/no-such-page",
    ] {
      let page = await harness.get(target)
      #expect(page.status == (target.hasSuffix("no-such-page") ? 404 : 200), "\(target): \(page)")
      #expect(!page.urls.isEmpty, "\(target)")
      for url in page.urls {
        #expect(url.hasPrefix(Self.mount + "/"), "\(target) links to \(url)")
        checked += 1
      }
    }
    // Pause, resume and retry forms, the stylesheet and the script, the jobs links.
    let queues = await harness.get("/admin/jobs/")
    #expect(queues.urls.contains("/admin/jobs/queues/pause"))
    #expect(queues.urls.contains("/admin/jobs/static/dashboard.css"))
    #expect(queues.urls.contains("/admin/jobs/static/dashboard.js"))
    #expect(queues.body.contains("data-base=\"/admin/jobs\""))
    #expect(checked > 30)
    let script = await harness.get("/admin/jobs/static/dashboard.js")
    #expect(script.status == 200)
    #expect(script.body.contains("base + \"/api/queues\""))
    #expect(await harness.get("/admin/jobs/static/dashboard.css").status == 200)
    #expect(await harness.get("/admin/jobs/api/queues").status == 200)
    #expect(
      await harness.get("/admin/jobs/metrics").body.contains("conveyor_jobs{queue=\"mail\",state=\"dead\"} 1")
    )
  }

  /// A redirect after an action stays under the prefix.
  @Test func redirectsAfterActionsCarryThePrefix() async throws {
    let harness = try DashboardHarness(DashboardConfiguration(mountPath: Self.mount))
    let dead = try await harness.deadJob(queue: "mail")
    let token = try await harness.formToken("/admin/jobs/")
    let paused = await harness.post("/admin/jobs/queues/pause", form: [("csrf", token), ("queue", "mail")])
    #expect(paused.status == 303, "\(paused)")
    #expect(paused.header("Location") == "/admin/jobs/?notice=paused")
    let retried = await harness.post("/admin/jobs/jobs/\(dead.rawValue)/retry", form: [("csrf", token)])
    #expect(retried.header("Location") == "/admin/jobs/jobs/\(dead.rawValue)?notice=requeued", "\(retried)")
  }

  /// Paths outside the prefix, or that merely start with its text, are answered 404 without
  /// reading the store; so are paths of a root-mounted dashboard's pages.
  @Test func requestsOutsideThePrefixAreNotFoundAndReadNothing() async throws {
    let harness = try DashboardHarness(DashboardConfiguration(mountPath: Self.mount))
    _ = try await harness.deadJob(queue: "mail")
    harness.store.resetCalls()
    for target in [
      "/", "/jobs", "/metrics", "/static/dashboard.css", "/admin", "/admin/jobsx", "/admin/jobs.css", "x",
    ] {
      let answer = await harness.get(target)
      #expect(answer.status == 404, "\(target): \(answer)")
      #expect(answer.hasSecurityHeaders, "\(target)")
    }
    let token = try await harness.formToken("/admin/jobs/")
    harness.store.resetCalls()
    let outside = await harness.post("/queues/pause", form: [("csrf", token), ("queue", "mail")])
    #expect(outside.status == 404)
    #expect(harness.store.totalCalls == 0, "\(harness.store.calls)")
    #expect(try await harness.store.isPaused(queue: "mail") == false)
  }

  /// A request outside the prefix is answered 404 whatever its method: a host that passes every
  /// request to the dashboard (a fallback route) gets "not found" for its own paths, not "method
  /// not allowed".
  @Test func aRequestOutsideThePrefixIsNotFoundWhateverItsMethod() async throws {
    let harness = try DashboardHarness(DashboardConfiguration(mountPath: Self.mount))
    for method in ["PUT", "DELETE", "OPTIONS", "PATCH"] {
      for target in ["/", "/api/users", "/admin/jobsx"] {
        let answer = await harness.get(target, method: method)
        #expect(answer.status == 404, "\(method) \(target): \(answer)")
      }
    }
  }

  /// A mount path that is not a plain path is refused with an error that says what is expected.
  @Test func aMalformedMountPathIsRefused() throws {
    for path in ["admin", "/admin/", "/", "/a b", "/a/../b", "/a\"b", "/a?b", "//a", "/a/<b>"] {
      #expect(throws: DashboardConfigurationError.self, "\(path)") {
        try Dashboard(store: InMemoryJobStore(), configuration: DashboardConfiguration(mountPath: path))
      }
    }
    for path in ["", "/admin", "/admin/jobs", "/a-b_c.d~e/2"] {
      #expect(throws: Never.self, "\(path)") {
        try Dashboard(store: InMemoryJobStore(), configuration: DashboardConfiguration(mountPath: path))
      }
    }
  }
}
