import Conveyor
import ConveyorDashboard
import Foundation
import Testing

/// The host application's authorization hook and the built-in token sign-in.
@Suite struct AuthorizationTests {
  /// A request the hook denies is answered with the hook's response (plus the security headers)
  /// and never reaches the store: no page, no JSON, no metrics, no action.
  @Test func aDeniedRequestIsAnsweredByTheHookAndReadsNothing() async throws {
    var configuration = DashboardConfiguration(mountPath: "/jobs-admin")
    configuration.authorize = { request in
      request.header("X-User") == "admin"
        ? .allow : .deny(DashboardResponse(status: 403, body: Data("admins only".utf8)))
    }
    let harness = try DashboardHarness(configuration)
    _ = try await harness.deadJob(queue: "mail")
    let admin: [(name: String, value: String)] = [("X-User", "admin")]
    let page = await harness.get("/jobs-admin/", headers: admin)
    #expect(page.status == 200)
    let token = try #require(page.body.range(of: "name=\"csrf\" value=\"")).upperBound
    let formToken = String(page.body[token...].prefix { $0 != "\"" })
    harness.store.resetCalls()
    for target in [
      "/jobs-admin/", "/jobs-admin/jobs?queue=mail", "/jobs-admin/api/queues", "/jobs-admin/metrics",
    ] {
      let denied = await harness.get(target, headers: [("X-User", "guest")])
      #expect(denied.status == 403, "\(target): \(denied)")
      #expect(denied.body == "admins only")
      #expect(denied.hasSecurityHeaders)
    }
    let action = await harness.post(
      "/jobs-admin/queues/pause", form: [("csrf", formToken), ("queue", "mail")],
      headers: [("X-User", "guest")])
    #expect(action.status == 403)
    #expect(harness.store.totalCalls == 0, "\(harness.store.calls)")
    #expect(try await harness.store.isPaused(queue: "mail") == false)
    // The same action, allowed, is done.
    let allowed = await harness.post(
      "/jobs-admin/queues/pause", form: [("csrf", formToken), ("queue", "mail")], headers: admin)
    #expect(allowed.status == 303, "\(allowed)")
    #expect(try await harness.store.isPaused(queue: "mail"))
  }

  /// With a token, a request needs it as a bearer token or the session cookie the sign-in form
  /// sets; the cookie's path is the mount path, and a wrong token reads nothing.
  @Test func theBuiltInSignInSetsASessionCookieUnderTheMountPath() async throws {
    var configuration = DashboardConfiguration(mountPath: "/ops")
    configuration.token = "a-long-enough-token-0123"
    configuration.signInHint = "Ask <ops> for the token."
    let harness = try DashboardHarness(configuration)
    harness.store.resetCalls()
    let anonymous = await harness.get("/ops/")
    #expect(anonymous.status == 401)
    #expect(anonymous.body.contains("<p>Ask &lt;ops&gt; for the token.</p>"))
    #expect(anonymous.urls.contains("/ops/login"))
    #expect(await harness.get("/ops/api/queues").status == 401)
    let wrong = await harness.post("/ops/login", form: [("token", "not-the-token-at-all")])
    #expect(wrong.status == 401)
    #expect(harness.store.totalCalls == 0, "\(harness.store.calls)")
    #expect(
      await harness.get("/ops/api/queues", headers: [("Authorization", "Bearer a-long-enough-token-0123")])
        .status == 200)
    let signedIn = await harness.post("/ops/login", form: [("token", "a-long-enough-token-0123")])
    #expect(signedIn.status == 303)
    #expect(signedIn.header("Location") == "/ops/")
    let cookie = try #require(signedIn.header("Set-Cookie"))
    #expect(
      cookie.contains("; Path=/ops;") && cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"))
    #expect(cookie.contains("Secure"), "signed in from an https origin")
    let session = String(cookie.prefix { $0 != ";" })
    #expect(!session.contains("a-long-enough-token-0123"))
    #expect(await harness.get("/ops/", headers: [("Cookie", session)]).status == 200)
  }

  /// With allowed host names, any other `Host` (a rebinding attacker's name) is answered 421
  /// before the hook or the store.
  @Test func aHostOutsideTheAllowedNamesIsRefused() async throws {
    var configuration = DashboardConfiguration()
    configuration.allowedHosts = ["127.0.0.1:8080", "localhost:8080"]
    let harness = try DashboardHarness(configuration)
    harness.store.resetCalls()
    for host in ["evil.example:8080", "127.0.0.1:8081", "127.0.0.1", DashboardHarness.host] {
      let answer = Answer(
        await harness.dashboard.respond(
          to: DashboardRequest(method: "GET", target: "/", headers: [("Host", host)])))
      #expect(answer.status == 421, "\(host): \(answer)")
      #expect(answer.hasSecurityHeaders)
    }
    #expect(harness.store.totalCalls == 0, "\(harness.store.calls)")
    let allowed = await harness.dashboard.respond(
      to: DashboardRequest(method: "GET", target: "/", headers: [("Host", "LOCALHOST:8080")]))
    #expect(allowed.status == 200)
  }

  /// An empty token (an unset environment variable read as "") does not turn the sign-in into an
  /// open door: the configuration is refused, or signing in with an empty or missing token fails
  /// and sets no cookie.
  @Test func anEmptyTokenOpensNothing() async throws {
    var configuration = DashboardConfiguration()
    configuration.token = ""
    let harness: DashboardHarness
    do {
      harness = try DashboardHarness(configuration)
    } catch is DashboardConfigurationError {
      return
    }
    _ = try await harness.deadJob(queue: "mail")
    #expect(await harness.get("/").status == 401)
    for form in [[("token", "")], []] {
      let signIn = await harness.post("/login", form: form)
      #expect(signIn.status == 401, "\(form): \(signIn)")
      #expect(signIn.header("Set-Cookie") == nil, "\(form): a session for an empty token")
    }
  }

  /// A request with two `Host` fields names no one host (RFC 9112 3.2: a server must answer it
  /// 400): with allowed host names it is refused before the hook or the store, whichever of the
  /// two comes first, since a server or proxy in front may go by the other.
  @Test func aRequestWithTwoHostFieldsIsRefused() async throws {
    var configuration = DashboardConfiguration()
    configuration.allowedHosts = ["localhost:8080"]
    let harness = try DashboardHarness(configuration)
    harness.store.resetCalls()
    for hosts in [["localhost:8080", "evil.example:8080"], ["evil.example:8080", "localhost:8080"]] {
      let answer = Answer(
        await harness.dashboard.respond(
          to: DashboardRequest(method: "GET", target: "/", headers: hosts.map { ("Host", $0) })))
      #expect([400, 421].contains(answer.status), "\(hosts): \(answer.status)")
      #expect(answer.hasSecurityHeaders)
    }
    #expect(harness.store.totalCalls == 0, "\(harness.store.calls)")
  }
}
