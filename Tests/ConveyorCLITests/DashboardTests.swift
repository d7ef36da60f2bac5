import Foundation
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// Jobs every dashboard test starts from, in a sandbox's database.
struct SeededJobs {
  /// A dead exec job whose command line and error hold `<script>`, quotes and an apostrophe.
  var dead: Int
  /// A waiting HTTP job with an `Authorization` header and a password in its URL.
  var http: Int
  /// A waiting exec job in the queue `emails`.
  var email: Int

  static let hostileText = #"<script>alert("pwned")</script> it's "quoted""#

  static func seed(_ sandbox: Sandbox) async throws -> SeededJobs {
    let dead = try await sandbox.add([
      "exec", "--", "sh", "-c",
      "printf '%s' '\(hostileText.replacingOccurrences(of: "'", with: "'\\''"))' >&2; exit 3",
    ])
    let work = try await sandbox.run(["work", "--until-empty", "--max-attempts", "1"])
    #expect(work.status == 1, "\(work)")
    let http = try await sandbox.add([
      "http", "-H", "Authorization: Bearer SECRET-TOKEN-123", "-H", "X-Trace: trace-7", "--data",
      #"{"sku":"A-42"}"#,
      "POST", "https://alice:hunter2@api.example.com/orders?api_key=KEY-999&page=2",
    ])
    let outcome = try await sandbox.succeed(["--queue", "emails", "add", "exec", "--", "echo", "welcome"])
    guard let email = Int(outcome.stdout.trimmingCharacters(in: .whitespacesAndNewlines)) else {
      throw HarnessError(description: "no job ID: \(outcome)")
    }
    return SeededJobs(dead: dead, http: http, email: email)
  }
}

/// `conveyor dashboard` over HTTP on a real socket: pages, escaping, redaction, actions and every
/// refusal of the security model.
@Suite(.timeLimit(.minutes(3))) struct DashboardTests {
  @Test func theQueuesPageListsQueuesWithStrictSecurityHeaders() async throws {
    let sandbox = try Sandbox()
    _ = try await SeededJobs.seed(sandbox)
    let dashboard = try await DashboardProcess.start(sandbox)
    let page = try await dashboard.get("/")
    #expect(page.status == 200)
    let policy = try #require(page.headers["content-security-policy"])
    #expect(policy.contains("default-src 'self'"))
    #expect(policy.contains("script-src 'self';"))
    #expect(policy.contains("frame-ancestors 'none'"))
    #expect(!policy.contains("unsafe-inline"))
    #expect(page.headers["x-content-type-options"] == "nosniff")
    #expect(page.headers["cache-control"] == "no-store")
    #expect(page.body.contains(#"<tr data-queue="outbox">"#))
    #expect(page.body.contains(#"<tr data-queue="emails">"#))
    #expect(page.body.contains(#"data-field="dead"><a href="/jobs?queue=outbox&amp;state=dead">1</a>"#))
    // No inline script anywhere: the one script is a same-origin file.
    #expect(page.body.components(separatedBy: "<script").count == 2)
    #expect(page.body.contains(#"<script src="/static/dashboard.js" defer></script>"#))
    let script = try await dashboard.get("/static/dashboard.js")
    #expect(script.status == 200 && script.headers["content-type"]?.hasPrefix("text/javascript") == true)
  }

  @Test func payloadsAndErrorsAreEscapedAndCredentialsRedacted() async throws {
    let sandbox = try Sandbox()
    let jobs = try await SeededJobs.seed(sandbox)
    let dashboard = try await DashboardProcess.start(sandbox)
    for target in ["/jobs?queue=outbox", "/jobs/\(jobs.dead)"] {
      let page = try await dashboard.get(target)
      #expect(page.status == 200)
      #expect(!page.body.contains("<script>alert"), "\(target) inserted the stored text as HTML")
      #expect(!page.body.contains(#"("pwned")"#))
      #expect(
        page.body.contains(
          "&lt;script&gt;alert(&quot;pwned&quot;)&lt;/script&gt; it&#39;s &quot;quoted&quot;"))
    }
    let http = try await dashboard.get("/jobs/\(jobs.http)")
    #expect(http.status == 200)
    for secret in ["SECRET-TOKEN-123", "hunter2", "KEY-999"] {
      #expect(!http.body.contains(secret), "\(secret) is shown")
    }
    #expect(http.body.contains("<th scope=\"row\">Authorization</th><td>[redacted]</td>"))
    #expect(http.body.contains("<th scope=\"row\">X-Trace</th><td>trace-7</td>"))
    #expect(
      http.body.contains("POST https://alice:redacted@api.example.com/orders?api_key=redacted&amp;page=2"))
    #expect(http.body.contains("&quot;Authorization&quot; : &quot;[redacted]&quot;"), "the payload JSON too")
    let command = try await dashboard.get("/jobs/\(jobs.dead)")
    #expect(command.body.contains("<ol class=\"argv\"><li><code>sh</code></li><li><code>-c</code></li>"))
  }

  @Test func aDeadJobIsRetriedByAPostFromThePage() async throws {
    let sandbox = try Sandbox()
    let jobs = try await SeededJobs.seed(sandbox)
    let dashboard = try await DashboardProcess.start(sandbox)
    let page = try await dashboard.get("/jobs/\(jobs.dead)")
    let token = try DashboardProcess.formToken(in: page.body)
    let retried = try await dashboard.post("/jobs/\(jobs.dead)/retry", [("csrf", token)])
    #expect(retried.status == 303)
    #expect(retried.headers["location"] == "/jobs/\(jobs.dead)?notice=requeued")
    #expect(try await sandbox.counts() == counts(ready: 2))
    let after = try await dashboard.get("/jobs/\(jobs.dead)?notice=requeued")
    #expect(after.body.contains("Job re-queued"))
    #expect(after.body.contains(#"<span class="badge ready">ready</span>"#))
  }

  @Test func crossSiteAndTokenlessPostsAreRefused() async throws {
    let sandbox = try Sandbox()
    let jobs = try await SeededJobs.seed(sandbox)
    let dashboard = try await DashboardProcess.start(sandbox)
    let token = try DashboardProcess.formToken(in: try await dashboard.get("/").body)
    let target = "/jobs/\(jobs.dead)/retry"
    let noToken = try await dashboard.post(target, [])
    #expect(noToken.status == 403)
    let wrongToken = try await dashboard.post(target, [("csrf", String(repeating: "0", count: 64))])
    #expect(wrongToken.status == 403)
    let otherOrigin = try await dashboard.request(
      "POST", target, headers: [("Origin", "http://evil.example")], form: [("csrf", token)])
    #expect(otherOrigin.status == 403)
    let crossSite = try await dashboard.request(
      "POST", target, headers: [("Sec-Fetch-Site", "cross-site")], form: [("csrf", token)])
    #expect(crossSite.status == 403)
    let notAForm = try await dashboard.request(
      "POST", target, headers: [("Content-Type", "text/plain"), ("Content-Length", "0")])
    #expect(notAForm.status == 415 || notAForm.status == 403)
    let viaGet = try await dashboard.get(target + "?csrf=" + token)
    #expect(viaGet.status == 404, "a GET never acts")
    #expect(try await sandbox.counts() == counts(ready: 1, dead: 1), "nothing was re-queued")
    // DNS rebinding: a page served from another name that resolves to 127.0.0.1.
    let rebound = try await dashboard.request("GET", "/", host: "evil.example:\(dashboard.port)")
    #expect(rebound.status == 421)
  }

  @Test func filtersNarrowTheListAndPagesUseAfter() async throws {
    let sandbox = try Sandbox()
    let jobs = try await SeededJobs.seed(sandbox)
    let dashboard = try await DashboardProcess.start(sandbox)
    let all = try await dashboard.get("/jobs?queue=outbox")
    #expect(
      all.body.contains("<tr data-job=\"\(jobs.dead)\">")
        && all.body.contains("<tr data-job=\"\(jobs.http)\">"))
    #expect(!all.body.contains("<tr data-job=\"\(jobs.email)\">"), "another queue's job")
    let dead = try await dashboard.get("/jobs?queue=outbox&state=dead")
    #expect(
      dead.body.contains("<tr data-job=\"\(jobs.dead)\">")
        && !dead.body.contains("<tr data-job=\"\(jobs.http)\">"))
    let text = try await dashboard.get("/jobs?queue=outbox&q=api.example")
    #expect(
      !text.body.contains("<tr data-job=\"\(jobs.dead)\">")
        && text.body.contains("<tr data-job=\"\(jobs.http)\">"))
    let later = try await dashboard.get("/jobs?queue=outbox&after=\(jobs.dead)")
    #expect(
      !later.body.contains("<tr data-job=\"\(jobs.dead)\">")
        && later.body.contains("<tr data-job=\"\(jobs.http)\">"))
    let emails = try await dashboard.get("/jobs?queue=emails&state=ready")
    #expect(emails.body.contains("<tr data-job=\"\(jobs.email)\">"))
  }

  @Test func bulkRetryConfirmsTheCountFirst() async throws {
    let sandbox = try Sandbox()
    _ = try await SeededJobs.seed(sandbox)
    let dashboard = try await DashboardProcess.start(sandbox)
    let confirm = try await dashboard.get("/confirm?action=retry-dead&state=dead&queue=outbox")
    #expect(confirm.status == 200)
    #expect(confirm.body.contains("Re-queue 1 dead job of queue outbox?"))
    let token = try DashboardProcess.formToken(in: confirm.body)
    let fields = [("csrf", token), ("action", "retry-dead"), ("queue", "outbox"), ("state", "dead")]
    let stale = try await dashboard.post("/bulk", fields + [("expected", "5")])
    #expect(stale.status == 409)
    #expect(stale.body.contains("The number changed"))
    #expect(try await sandbox.counts() == counts(ready: 1, dead: 1))
    let done = try await dashboard.post("/bulk", fields + [("expected", "1")])
    #expect(done.status == 303)
    #expect(done.headers["location"] == "/jobs?queue=outbox&notice=bulk-requeued&count=1")
    #expect(try await sandbox.counts() == counts(ready: 2))
    let removeToken = try DashboardProcess.formToken(in: try await dashboard.get("/").body)
    let removed = try await dashboard.post(
      "/bulk",
      [
        ("csrf", removeToken), ("action", "remove"), ("queue", "outbox"), ("state", "waiting"),
        ("expected", "2"),
      ])
    #expect(removed.status == 303)
    #expect(try await sandbox.counts() == counts())
  }

  @Test func pauseAndResumeAreStoredForEveryWorker() async throws {
    let sandbox = try Sandbox()
    _ = try await SeededJobs.seed(sandbox)
    let dashboard = try await DashboardProcess.start(sandbox)
    let token = try DashboardProcess.formToken(in: try await dashboard.get("/").body)
    #expect(try await dashboard.post("/queues/pause", [("csrf", token), ("queue", "outbox")]).status == 303)
    #expect(try await sandbox.succeed(["status", "--json"]).object()["paused"] as? Bool == true)
    let metrics = try await dashboard.get("/metrics")
    #expect(metrics.headers["content-type"]?.hasPrefix("text/plain; version=0.0.4") == true)
    #expect(metrics.body.contains("conveyor_queue_paused{queue=\"outbox\"} 1\n"))
    #expect(metrics.body.contains("conveyor_jobs{queue=\"outbox\",state=\"dead\"} 1\n"))
    #expect(metrics.body.contains("conveyor_jobs{queue=\"emails\",state=\"ready\"} 1\n"))
    #expect(try await dashboard.post("/queues/resume", [("csrf", token), ("queue", "outbox")]).status == 303)
    #expect(try await sandbox.succeed(["status", "--json"]).object()["paused"] as? Bool == false)
  }

  @Test func offLoopbackATokenIsRequiredOnEveryRequest() async throws {
    let sandbox = try Sandbox()
    _ = try await SeededJobs.seed(sandbox)
    let refused = try await sandbox.run(["dashboard", "--listen", "0.0.0.0:0"])
    #expect(refused.status == 2)
    #expect(refused.stderr.contains("needs a token"))
    let short = try await sandbox.run(["dashboard", "--listen", "0.0.0.0:0", "--token", "short"])
    #expect(short.status == 2)

    let token = "correct-horse-battery-staple"
    let dashboard = try await DashboardProcess.start(
      sandbox, ["--listen", "0.0.0.0:0", "--token", token])
    let anonymous = try await dashboard.get("/")
    #expect(anonymous.status == 401)
    #expect(anonymous.body.contains("Sign in") && !anonymous.body.contains("data-queue"))
    #expect(try await dashboard.get("/metrics").status == 401)
    #expect(try await dashboard.get("/jobs?queue=outbox").status == 401)
    #expect(
      try await dashboard.get("/", headers: [("Authorization", "Bearer wrong-token-wrong-token")]).status
        == 401)
    let bearer = try await dashboard.get("/metrics", headers: [("Authorization", "Bearer \(token)")])
    #expect(bearer.status == 200 && bearer.body.contains("conveyor_jobs"))

    let wrong = try await dashboard.post("/login", [("token", "not-the-token-at-all")])
    #expect(wrong.status == 401)
    let signedIn = try await dashboard.post("/login", [("token", token)])
    #expect(signedIn.status == 303)
    let setCookie = try #require(signedIn.headers["set-cookie"])
    #expect(setCookie.contains("HttpOnly") && setCookie.contains("SameSite=Strict"))
    #expect(!setCookie.contains(token), "the cookie is a session, not the token")
    let cookie = String(setCookie.prefix { $0 != ";" })
    let page = try await dashboard.get("/", headers: [("Cookie", cookie)])
    #expect(page.status == 200 && page.body.contains("data-queue=\"outbox\""))
    // Signed in, an action still needs the form token.
    let noForm = try await dashboard.post("/queues/pause", [("queue", "outbox")], cookie: cookie)
    #expect(noForm.status == 403)
  }

  @Test func sigtermStopsTheDashboardCleanly() async throws {
    let sandbox = try Sandbox()
    let dashboard = try await DashboardProcess.start(sandbox)
    #expect(try await dashboard.get("/").status == 200)
    dashboard.running.signal(SIGTERM)
    let outcome = try await dashboard.running.waitForExit()
    #expect(outcome.status == 0, "\(outcome)")
    #expect(outcome.stdout.contains("dashboard: stopping"))
  }
}
