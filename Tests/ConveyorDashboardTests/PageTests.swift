import Conveyor
import ConveyorDashboard
import Foundation
import Testing

/// Pages and actions through the entry point: what they show, what they change, and the
/// headers every answer carries.
@Suite struct PageTests {
  /// Retry of a dead job, pause and resume of a queue, and a bulk removal, each as the page's
  /// forms post them: the store changes as the notice says.
  @Test func actionsChangeTheStore() async throws {
    let harness = try DashboardHarness()
    let dead = try await harness.deadJob(queue: "mail")
    let second = try await harness.deadJob(queue: "mail")
    let token = try await harness.formToken("/jobs/\(dead.rawValue)")
    let retried = await harness.post("/jobs/\(dead.rawValue)/retry", form: [("csrf", token)])
    #expect(retried.status == 303, "\(retried)")
    #expect(try await harness.store.job(dead)?.status == .pending)
    #expect(await harness.get("/jobs/\(dead.rawValue)?notice=requeued").body.contains("Job re-queued"))
    #expect(await harness.post("/queues/pause", form: [("csrf", token), ("queue", "mail")]).status == 303)
    #expect(try await harness.store.isPaused(queue: "mail"))
    #expect(await harness.get("/").body.contains("badge paused"))
    #expect(await harness.post("/queues/resume", form: [("csrf", token), ("queue", "mail")]).status == 303)
    #expect(try await harness.store.isPaused(queue: "mail") == false)
    let confirm = await harness.get("/confirm?action=remove&state=waiting&queue=mail")
    #expect(confirm.body.contains("Remove 1 waiting job of queue mail?"), "\(confirm)")
    let removed = await harness.post(
      "/bulk",
      form: [
        ("csrf", token), ("action", "remove"), ("queue", "mail"), ("state", "waiting"), ("expected", "1"),
        ("through", String(dead.rawValue)),
      ])
    #expect(removed.status == 303, "\(removed)")
    #expect(try await harness.store.job(dead) == nil)
    #expect(try await harness.store.job(second)?.status == .dead)
  }

  /// The schedules page, linked from every page's navigation, lists every queue's stored
  /// schedules with their spacing, zone, catch-up, state, next slot (UTC and the zone's) and
  /// job; text from the store is escaped.
  @Test func theSchedulesPageListsEveryQueuesSchedulesEscaped() async throws {
    var configuration = DashboardConfiguration()
    configuration.describe = { _ in
      .command(arguments: ["echo", "<b>hi</b>"], workingDirectory: nil, timeout: nil)
    }
    let harness = try DashboardHarness(configuration)
    #expect(await harness.get("/schedules").body.contains("No schedules"))
    try await harness.schedule("digest", queue: "<q>")
    try await harness.schedule("tick", queue: "mail")
    let page = await harness.get("/schedules")
    #expect(page.status == 200 && page.hasSecurityHeaders, "\(page)")
    #expect(await harness.get("/").urls.contains("/schedules"), "the navigation links the page")
    #expect(
      page.body.contains("<th scope=\"row\">digest</th>") && page.body.contains("<th scope=\"row\">tick</th>")
    )
    #expect(page.body.contains(">&lt;q&gt;</a>") && !page.body.contains("<q>"), "\(page)")
    #expect(page.body.contains("exec echo &lt;b&gt;hi&lt;/b&gt;") && !page.body.contains("<b>hi"))
    #expect(page.body.contains("<code>cron */5 * * * *</code>") && page.body.contains(">Europe/Berlin<"))
    #expect(page.body.contains("<td data-field=\"catch-up\">skip</td>"))
    #expect(page.body.contains("<span class=\"badge\">active</span>"))
    // The next slot in UTC, and in Berlin with its offset.
    #expect(page.body.contains(":00Z</time>"))
    #expect(page.body.contains(":00+01:00</time>") || page.body.contains(":00+02:00</time>"), "\(page)")
  }

  /// Pause and Resume on the schedules page, as their forms post them: the stored schedule is
  /// paused, then resumed, and the page says so; a schedule that is gone is answered 404.
  @Test func aSchedulesPauseAndResumeFormsChangeTheStore() async throws {
    let harness = try DashboardHarness()
    try await harness.schedule("tick", queue: "mail")
    let token = try await harness.formToken("/schedules")
    let form = [("csrf", token), ("queue", "mail"), ("name", "tick")]
    let paused = await harness.post("/schedules/pause", form: form)
    #expect(
      paused.status == 303 && paused.header("Location") == "/schedules?notice=schedule-paused", "\(paused)")
    #expect(try await harness.storedSchedule("tick", queue: "mail")?.paused == true)
    let page = await harness.get("/schedules?notice=schedule-paused")
    #expect(
      page.body.contains("Schedule paused")
        && page.body.contains("<span class=\"badge paused\">paused</span>"))
    #expect(page.body.contains("action=\"/schedules/resume\""), "a paused schedule offers Resume")
    #expect(page.body.contains("<td data-field=\"next\"><span class=\"none\">—</span></td>"), "no next slot")
    let resumed = await harness.post("/schedules/resume", form: form)
    #expect(resumed.status == 303, "\(resumed)")
    #expect(try await harness.storedSchedule("tick", queue: "mail")?.paused == false)
    let gone = await harness.post(
      "/schedules/pause", form: [("csrf", token), ("queue", "mail"), ("name", "other")])
    #expect(gone.status == 404 && gone.body.contains("has no schedule other"), "\(gone)")
  }

  /// Cancel on a waiting job's page, as its form posts it: the job is cancelled in the store, the
  /// page says so and offers no Cancel button any more; a second post answers that it was
  /// already cancelled, one on a dead job that it is dead, one on a running job that its worker
  /// stops it. A finished job's page and row have no Cancel button.
  @Test func aCancelPostCancelsAWaitingJobAndSaysSo() async throws {
    let harness = try DashboardHarness()
    // The dead job first: `deadJob` kills the first ready job of the queue.
    let dead = try await harness.deadJob(queue: "mail")
    let waiting = try await harness.waitingJob(queue: "mail")
    let page = await harness.get("/jobs/\(waiting.rawValue)")
    let cancelForm = "action=\"/jobs/\(waiting.rawValue)/cancel\""
    #expect(page.body.contains(cancelForm), "\(page)")
    #expect(await harness.get("/jobs?queue=mail").body.contains(cancelForm), "the row's Cancel button")
    let token = try await harness.formToken("/jobs/\(waiting.rawValue)")
    let cancelled = await harness.post("/jobs/\(waiting.rawValue)/cancel", form: [("csrf", token)])
    #expect(cancelled.status == 303, "\(cancelled)")
    #expect(cancelled.header("Location") == "/jobs/\(waiting.rawValue)?notice=cancelled-waiting")
    let record = try #require(try await harness.store.job(waiting))
    #expect(record.status == .cancelled && record.finishedAt != nil)
    let after = await harness.get("/jobs/\(waiting.rawValue)?notice=cancelled-waiting")
    #expect(after.body.contains("Job cancelled: it was waiting, and will never run."), "\(after)")
    #expect(after.body.contains("<span class=\"badge cancelled\">cancelled</span>"))
    #expect(!after.body.contains(cancelForm), "a cancelled job offers Cancel")
    let again = await harness.post("/jobs/\(waiting.rawValue)/cancel", form: [("csrf", token)])
    #expect(again.header("Location") == "/jobs/\(waiting.rawValue)?notice=already-cancelled", "\(again)")
    let deadAnswer = await harness.post("/jobs/\(dead.rawValue)/cancel", form: [("csrf", token)])
    #expect(deadAnswer.header("Location") == "/jobs/\(dead.rawValue)?notice=already-dead", "\(deadAnswer)")
    #expect(try await harness.store.job(dead)?.status == .dead)
    #expect(!(await harness.get("/jobs/\(dead.rawValue)").body.contains("/cancel\"")))
    // A running job: cancelled too, and the page says its worker stops the handler.
    let running = try await harness.waitingJob(queue: "mail")
    let lease = Lease(owner: "test", duration: .seconds(60))
    let claimed = try await harness.store.settleAndClaim(
      [], queue: "mail", limit: 1, lease: lease, clock: harness.clock
    ).claimed
    #expect(claimed.map(\.id) == [running])
    #expect(
      await harness.get("/jobs/\(running.rawValue)").body.contains(
        "action=\"/jobs/\(running.rawValue)/cancel\""))
    let stopped = await harness.post("/jobs/\(running.rawValue)/cancel", form: [("csrf", token)])
    #expect(stopped.header("Location") == "/jobs/\(running.rawValue)?notice=cancelled-running", "\(stopped)")
    #expect(try await harness.store.job(running)?.status == .cancelled)
    #expect(
      await harness.get("/jobs/\(running.rawValue)?notice=cancelled-running").body.contains(
        "Job cancelled while it ran"))
    let gone = await harness.post("/jobs/999999/cancel", form: [("csrf", token)])
    #expect(gone.status == 404, "\(gone)")
  }

  /// A completed job's page shows its history: finishing time, attempts, the last attempt's run
  /// time, every attempt's error and its output, all escaped; the time limit is the queue's.
  @Test func aCompletedJobsPageShowsItsHistoryEscaped() async throws {
    let harness = try DashboardHarness()
    let id = try await harness.completedJob(
      queue: "mail", errors: ["<script>alert(1)</script>", "timeout & \"retry\""],
      output: Data(#"{"note":"<b>sent</b>","url":"https://user:hunter2@api.example/x"}"#.utf8),
      runDuration: .milliseconds(1_500))
    let record = try #require(try await harness.store.job(id))
    #expect(record.status == .completed && record.errors.count == 2 && record.output != nil)
    let page = await harness.get("/jobs/\(id.rawValue)")
    #expect(page.status == 200)
    #expect(page.body.contains("<span class=\"badge completed\">completed</span>"), "\(page)")
    #expect(page.body.contains("<th scope=\"row\">Attempts</th><td>3</td>"))
    #expect(page.body.contains("<th scope=\"row\">Run time</th><td>1.5 s (the last attempt)</td>"))
    #expect(page.body.contains("<th scope=\"row\">Time limit</th><td>the queue&#39;s</td>"))
    let finished = try #require(record.finishedAt)
    #expect(page.body.contains("<th scope=\"row\">Finished</th><td>\(finished.ISO8601Format())</td>"))
    #expect(page.body.contains("<li><pre class=\"error\">&lt;script&gt;alert(1)&lt;/script&gt;</pre></li>"))
    #expect(page.body.contains("<li><pre class=\"error\">timeout &amp; &quot;retry&quot;</pre></li>"))
    #expect(!page.body.contains("<script>alert"), "an error inserted as HTML")
    #expect(page.body.contains("&quot;note&quot; : &quot;&lt;b&gt;sent&lt;/b&gt;&quot;"), "the output")
    #expect(
      !page.body.contains("<b>sent") && !page.body.contains("hunter2"), "the output unescaped or unredacted")
    #expect(!page.body.contains("/cancel\""), "a completed job offers Cancel")
  }

  /// The queues page and a queue's job list count completed and cancelled jobs, and the
  /// completed and cancelled filters list those jobs only.
  @Test func theHistoryIsCountedAndFiltered() async throws {
    let harness = try DashboardHarness()
    let completed = try await harness.completedJob(queue: "mail")
    let cancelled = try await harness.waitingJob(queue: "mail")
    let waiting = try await harness.waitingJob(queue: "mail")
    #expect(
      try await harness.store.cancel([cancelled], queue: "mail", clock: harness.clock) == [.cancelledWaiting])
    let queues = await harness.get("/")
    #expect(
      queues.body.contains(
        #"data-field="completed"><a href="/jobs?queue=mail&amp;state=completed">1</a>"#), "\(queues)")
    #expect(
      queues.body.contains(#"data-field="cancelled"><a href="/jobs?queue=mail&amp;state=cancelled">1</a>"#))
    let list = await harness.get("/jobs?queue=mail")
    #expect(
      list.body.contains(#"state=completed" data-field="completed">completed <span class="count">1</span>"#))
    #expect(
      list.body.contains(#"state=cancelled" data-field="cancelled">cancelled <span class="count">1</span>"#))
    for (state, shown) in [("completed", completed), ("cancelled", cancelled)] {
      let page = await harness.get("/jobs?queue=mail&state=\(state)")
      #expect(page.status == 200)
      #expect(page.body.contains("<option value=\"\(state)\" selected>"), "\(page)")
      for id in [completed, cancelled, waiting] {
        #expect(
          page.body.contains("<tr data-job=\"\(id.rawValue)\">") == (id == shown), "\(state) lists job \(id)")
      }
    }
    let api = await harness.get("/api/queues")
    #expect(api.body.contains("\"completed\":1") && api.body.contains("\"cancelled\":1"), "\(api)")
    let metrics = await harness.get("/metrics").body
    #expect(metrics.contains("conveyor_jobs{queue=\"mail\",state=\"completed\"} 1\n"))
    #expect(metrics.contains("conveyor_jobs{queue=\"mail\",state=\"cancelled\"} 1\n"))
  }

  /// Every kind of answer carries the security headers: pages, assets, JSON, metrics, a
  /// redirect, a missing page, a wrong method, a refusal, a sign-in demand, a storage error.
  @Test func everyAnswerCarriesTheSecurityHeaders() async throws {
    var configuration = DashboardConfiguration()
    configuration.token = "a-long-enough-token-0123"
    let harness = try DashboardHarness(configuration)
    _ = try await harness.deadJob(queue: "q")
    let bearer: [(name: String, value: String)] = [("Authorization", "Bearer a-long-enough-token-0123")]
    var answers: [(String, Answer)] = []
    for target in [
      "/", "/jobs", "/api/queues", "/api/activity", "/metrics", "/static/dashboard.js", "/nothing",
    ] {
      answers.append((target, await harness.get(target, headers: bearer)))
    }
    answers.append(("unauthorized", await harness.get("/")))
    answers.append(("method", await harness.get("/", method: "DELETE")))
    answers.append(("no token", await harness.post("/queues/pause", form: [("queue", "q")], headers: bearer)))
    let token = try await harness.formToken(headers: bearer)
    harness.store.fail("setPaused", times: 1)
    let failed = await harness.post(
      "/queues/pause", form: [("csrf", token), ("queue", "q")], headers: bearer)
    #expect(failed.status == 500, "\(failed)")
    #expect(failed.body.contains("disk I/O error (injected)"))
    answers.append(("storage error", failed))
    answers.append(
      (
        "redirect",
        await harness.post("/queues/pause", form: [("csrf", token), ("queue", "q")], headers: bearer)
      ))
    #expect(Set(answers.map(\.1.status)) == [200, 404, 401, 405, 403, 500, 303])
    for (what, answer) in answers {
      #expect(answer.hasSecurityHeaders, "\(what): \(answer)")
      #expect(answer.response.headers.filter { $0.name == "Content-Security-Policy" }.count == 1)
    }
  }

  /// Text from the store is escaped, and the application's job details are redacted: secret
  /// header values, a URL's password and credential-like query values never reach the page.
  @Test func storedTextIsEscapedAndCredentialsAreRedacted() async throws {
    var configuration = DashboardConfiguration()
    configuration.secretHeaders.insert("x-signature")
    configuration.describe = { _ in
      .httpRequest(
        method: "POST", url: URL(string: "https://user:hunter2@api.example/hook?token=tok-secret&page=2")!,
        headers: [
          ("Authorization", "Bearer sk-live-secret"), ("X-Signature", "sig-secret"), ("Accept", "text/plain"),
        ],
        body: Data("<b>hello</b>".utf8))
    }
    configuration.summarize = { _, _ in "<script>alert(1)</script>" }
    let harness = try DashboardHarness(configuration)
    let payload = Data(
      "{\"headers\":{\"Authorization\":\"Bearer sk-live-secret\"},\"note\":\"<img src=x>\"}".utf8)
    let id = try await harness.deadJob(queue: "<q>", payload: payload)
    let job = await harness.get("/jobs/\(id.rawValue)")
    #expect(job.status == 200)
    for secret in ["hunter2", "tok-secret", "sk-live-secret", "sig-secret"] {
      #expect(!job.body.contains(secret), "\(secret) shown")
    }
    #expect(job.body.contains("[redacted]"))
    #expect(job.body.contains("page=2") && job.body.contains("text/plain"))
    #expect(job.body.contains("&lt;b&gt;hello&lt;/b&gt;") && !job.body.contains("<b>hello"))
    #expect(job.body.contains("&lt;img src=x&gt;") && !job.body.contains("<img"))
    #expect(job.body.contains("&lt;q&gt;") && !job.body.contains("<q>"))
    // The one queue, whose name the jobs page's queue parameter would refuse, is listed first.
    let list = await harness.get("/jobs")
    #expect(list.body.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "\(list)")
    #expect(!list.body.contains("<script>alert"))
    let queues = await harness.get("/")
    #expect(
      queues.body.contains("<th scope=\"row\"><a href=\"/jobs?queue=%3Cq%3E\">&lt;q&gt;</a></th>"),
      "\(queues)")
  }

  /// A method the dashboard does not serve is answered 405 with the `Allow` field the status
  /// requires (RFC 9110 15.5.6), so a client learns what to send.
  @Test func aRefusedMethodIsAnsweredWithTheAllowedOnes() async throws {
    let harness = try DashboardHarness()
    for method in ["OPTIONS", "DELETE", "PUT"] {
      let answer = await harness.get("/", method: method)
      #expect(answer.status == 405, "\(method): \(answer)")
      let allow = answer.header("Allow") ?? ""
      #expect(
        Set(allow.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) })
          == ["GET", "HEAD", "POST"], "\(method): Allow \(allow)")
    }
  }

  /// "Retry all dead" applies to the dead jobs the confirmation counted: a job that died after
  /// it is left dead, even when another counted job went away meanwhile and the count is the same.
  @Test func aBulkRetryLeavesAJobThatDiedAfterTheConfirmation() async throws {
    let harness = try DashboardHarness()
    let counted = try await harness.deadJob(queue: "mail")
    let confirm = await harness.get("/confirm?action=retry-dead&state=dead&queue=mail")
    #expect(confirm.body.contains("Re-queue 1 dead job of queue mail?"), "\(confirm)")
    #expect(confirm.body.contains("name=\"through\" value=\"\(counted.rawValue)\""), "\(confirm)")
    let token = try await harness.formToken("/jobs/\(counted.rawValue)")
    // Meanwhile: the counted job is removed (another operator, a script) and another one dies.
    #expect(try await harness.store.remove([counted], queue: "mail") == 1)
    let later = try await harness.deadJob(queue: "mail")
    let answer = await harness.post(
      "/bulk",
      form: [
        ("csrf", token), ("action", "retry-dead"), ("queue", "mail"), ("state", "dead"), ("expected", "1"),
        ("through", String(counted.rawValue)),
      ])
    #expect(answer.status == 409, "\(answer)")
    #expect(
      try await harness.store.job(later)?.status == .dead,
      "a job that died after the confirmation was re-queued")
  }

  /// With no ``DashboardConfiguration/describe``, the payload JSON is shown with URL credentials
  /// redacted wherever a URL is, not only under a key spelled `url`.
  @Test func urlCredentialsAnywhereInThePayloadAreRedacted() async throws {
    let harness = try DashboardHarness()
    let payload = Data(
      """
      {"webhook":"https://user:hunter2@hooks.example/in","URL":"https://api.example/x?api_key=key-secret",
      "request":{"endpoint":"https://u:pw-secret@api.example/"}}
      """.utf8)
    let id = try await harness.deadJob(queue: "mail", payload: payload)
    let job = await harness.get("/jobs/\(id.rawValue)")
    #expect(job.status == 200)
    for secret in ["hunter2", "key-secret", "pw-secret"] {
      #expect(!job.body.contains(secret), "\(secret) shown")
    }
  }

  /// A queue the store holds under a name outside the identifier rules (another program's, or
  /// one with a space) is listed, and its links and forms work: its jobs, its confirmation, pause.
  @Test func theLinksAndFormsOfAQueueWithAnyStoredNameWork() async throws {
    let harness = try DashboardHarness()
    _ = try await harness.deadJob(queue: "daily report")
    let queues = await harness.get("/")
    #expect(queues.urls.contains("/jobs?queue=daily%20report"), "\(queues)")
    #expect(await harness.get("/jobs?queue=daily%20report").status == 200)
    #expect(await harness.get("/confirm?action=retry-dead&state=dead&queue=daily%20report").status == 200)
    let token = try await harness.formToken()
    let paused = await harness.post("/queues/pause", form: [("csrf", token), ("queue", "daily report")])
    #expect(paused.status == 303, "\(paused)")
    #expect(try await harness.store.isPaused(queue: "daily report"))
  }

  /// A URL's user information is a credential too: an API key sent as the user name with an empty
  /// password (`https://sk_live_…:@api…`, as `curl -u KEY:` sends it) or a token as the user
  /// (`https://TOKEN@git…`). The job's page redacts it as it redacts a password (the outbox's own
  /// job list leaves the user out).
  @Test func aURLsUserNameIsRedactedLikeItsPassword() async throws {
    var configuration = DashboardConfiguration()
    configuration.describe = { payload in
      .httpRequest(
        method: "POST", url: URL(string: String(decoding: payload, as: UTF8.self))!, headers: [], body: nil)
    }
    let harness = try DashboardHarness(configuration)
    for (url, secret) in [
      ("https://sk_live_key_secret:@api.payments.example/v1/charges", "sk_live_key_secret"),
      ("https://ghp_token_secret@git.example/org/repo.git", "ghp_token_secret"),
    ] {
      let id = try await harness.deadJob(queue: "mail", payload: Data(url.utf8))
      let job = await harness.get("/jobs/\(id.rawValue)")
      #expect(job.status == 200)
      #expect(!job.body.contains(secret), "\(secret) shown")
    }
  }
}

/// Fair shares on the pages: a job's page names its fairness key, escaped, whole at the longest a
/// key may be.
@Suite struct FairnessKeyPageTests {
  @Test func aJobsPageNamesItsFairnessKeyEscaped() async throws {
    let harness = try DashboardHarness()
    let key = "<b>acme</b>" + String(repeating: "k", count: FairnessKey.maximumBytes - 11)
    let added = try await harness.store.enqueue(
      [NewJob(payload: Data("{}".utf8), fairnessKey: key)], queue: "mail", clock: harness.clock)
    let page = await harness.get("/jobs/\(added[0].id.rawValue)")
    #expect(page.status == 200, "\(page)")
    let shown = "&lt;b&gt;acme&lt;/b&gt;" + String(repeating: "k", count: FairnessKey.maximumBytes - 11)
    #expect(page.body.contains("<th scope=\"row\">Fairness key</th><td>\(shown)</td>"), "\(page)")
    #expect(!page.body.contains("<b>acme"))
    let plain = try await harness.store.enqueue(
      [NewJob(payload: Data("{}".utf8))], queue: "mail", clock: harness.clock)
    let plainPage = await harness.get("/jobs/\(plain[0].id.rawValue)")
    #expect(
      plainPage.body.contains("<th scope=\"row\">Fairness key</th><td><span class=\"none\">"), "\(plainPage)")
  }
}

/// Ordering keys on the pages: a held job's page says which key holds it, rows and counts mark
/// held jobs, and a key is escaped wherever it is shown.
@Suite struct OrderingKeyPageTests {
  @Test func aHeldJobsPageSaysHeldAndEscapesItsKey() async throws {
    let harness = try DashboardHarness()
    let key = "<script>alert(1)</script>"
    let escaped = "&lt;script&gt;alert(1)&lt;/script&gt;"
    let added = try await harness.store.enqueue(
      [
        NewJob(payload: Data("{}".utf8), orderingKey: key),
        NewJob(payload: Data("{}".utf8), orderingKey: key),
      ],
      queue: "mail", clock: harness.clock)
    let (first, second) = (added[0].id, added[1].id)
    #expect(try await harness.store.job(second)?.isHeld == true)

    let page = await harness.get("/jobs/\(second.rawValue)")
    #expect(page.status == 200 && page.hasSecurityHeaders, "\(page)")
    #expect(page.body.contains("<span class=\"badge held\">held</span>"), "\(page)")
    #expect(
      page.body.contains(
        "Held by ordering key <code>\(escaped)</code> (waits for the earlier job of its key)"),
      "\(page)")
    #expect(page.body.contains("<th scope=\"row\">Ordering key</th><td>\(escaped)</td>"))
    #expect(!page.body.contains("<script>alert"), "the key is escaped")
    let head = await harness.get("/jobs/\(first.rawValue)")
    #expect(head.body.contains("<span class=\"badge ready\">ready</span>") && !head.body.contains("Held by"))
    #expect(head.body.contains("<td>\(escaped)</td>") && !head.body.contains("<script>alert"))

    // The job list: the queue's held count, the held row marked, and the held filter.
    let list = await harness.get("/jobs?queue=mail")
    #expect(list.body.contains("data-field=\"held\""), "\(list)")
    #expect(list.body.contains(">held <span class=\"count\">1</span></a>"), "\(list)")
    #expect(
      list.body.contains("held by ordering key <code>\(escaped)</code>")
        && !list.body.contains("<script>alert"))
    let held = await harness.get("/jobs?queue=mail&state=held")
    #expect(
      held.body.contains("data-job=\"\(second.rawValue)\"")
        && !held.body.contains("data-job=\"\(first.rawValue)\""))
    let ready = await harness.get("/jobs?queue=mail&state=ready")
    #expect(
      ready.body.contains("data-job=\"\(first.rawValue)\"")
        && !ready.body.contains("data-job=\"\(second.rawValue)\""))

    // The queues page, its JSON and the metrics count it.
    #expect(
      await harness.get("/").body.contains(
        "<td class=\"count\" data-field=\"held\"><a href=\"/jobs?queue=mail&amp;state=held\">1</a></td>"))
    let api = try #require(
      try JSONSerialization.jsonObject(with: await harness.get("/api/queues").response.body) as? [String: Any]
    )
    #expect((api["queues"] as? [[String: Any]])?.first?["held"] as? Int == 1)
    #expect(await harness.get("/metrics").body.contains("conveyor_jobs{queue=\"mail\",state=\"held\"} 1\n"))
  }
}
