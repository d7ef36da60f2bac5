import Foundation

/// The dashboard's stylesheet and its one script, served from `static/` under the mount path (same origin, so the
/// Content-Security-Policy allows them with no inline code). The script only refreshes the
/// queues page's counts; every page works without it.
enum DashboardAssets {
  static func response(for path: String) -> DashboardResponse {
    switch path {
    case "/static/dashboard.css": .text(200, css, contentType: "text/css; charset=utf-8")
    case "/static/dashboard.js": .text(200, script, contentType: "text/javascript; charset=utf-8")
    default: .text(404, "not found")
    }
  }

  /// Polls `api/queues` (under the mount path the page's `data-base` names) every 3 s and writes the counts into the table with `textContent` (never
  /// as HTML); reloads when the queues, a pause flag or a concurrency limit changed, since their rows hold forms. Rows
  /// are matched by their percent-encoded `key`, never by the name an attribute holds: a browser
  /// changes a name's CR and NUL there, and the page would reload every 3 s.
  /// Every 10 s it fetches the "Last hour" section from `/api/activity` (server-rendered, every
  /// stored text escaped there), parses it with `DOMParser` (inert: nothing in it runs) and swaps
  /// it for the one on the page.
  static let script = """
    "use strict";
    (function () {
      if (document.body.dataset.page !== "queues") return;
      var base = document.body.dataset.base || "";
      var fields = ["ready", "scheduled", "held", "running", "dead", "completed", "cancelled"];
      function refresh() {
        fetch(base + "/api/queues", { credentials: "same-origin", cache: "no-store" })
          .then(function (response) { return response.ok ? response.json() : null; })
          .then(function (data) {
            if (!data) return;
            var rows = document.querySelectorAll("tr[data-queue]");
            if (rows.length !== data.queues.length) { location.reload(); return; }
            for (var i = 0; i < rows.length; i++) {
              var row = rows[i], queue = data.queues[i];
              if (row.dataset.key !== queue.key) { location.reload(); return; }
              var paused = row.querySelector(".badge.paused") !== null;
              if (paused !== queue.paused) { location.reload(); return; }
              var limit = queue.concurrency === null ? "—" : String(queue.concurrency);
              var limitCell = row.querySelector('[data-field="concurrency"]');
              if (limitCell && limitCell.textContent !== limit) { location.reload(); return; }
              fields.forEach(function (field) {
                var cell = row.querySelector('[data-field="' + field + '"] a');
                if (cell && cell.textContent !== String(queue[field])) cell.textContent = String(queue[field]);
              });
            }
            for (var j = 0; j < rows.length; j++) {
              var oldest = rows[j].querySelector('[data-field="oldest"]');
              if (oldest && oldest.textContent !== data.queues[j].oldest) oldest.textContent = data.queues[j].oldest;
            }
            var updated = document.getElementById("updated");
            if (updated) updated.textContent = "live, counts as of " + data.time;
          })
          .catch(function () {});
      }
      function refreshCharts() {
        fetch(base + "/api/activity", { credentials: "same-origin", cache: "no-store" })
          .then(function (response) { return response.ok ? response.text() : null; })
          .then(function (text) {
            if (text === null) return;
            var fresh = new DOMParser().parseFromString(text, "text/html").getElementById("activity");
            var current = document.getElementById("activity");
            if (fresh && current) current.replaceWith(document.importNode(fresh, true));
          })
          .catch(function () {});
      }
      setInterval(refresh, 3000);
      setInterval(refreshCharts, 10000);
    })();
    """

  static let css = """
    :root { color-scheme: light; --ink: #1d2330; --muted: #5b6475; --line: #dfe3ea; --accent: #2f5bd3;
      --ready: #1f7a3f; --scheduled: #6b5a00; --running: #2f5bd3; --dead: #b3261e; }
    * { box-sizing: border-box; }
    body { margin: 0; font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--ink);
      background: #f6f7f9; }
    header { display: flex; align-items: center; gap: 2rem; padding: .8rem 2rem; background: #1d2330; }
    header a { color: #e8ecf4; text-decoration: none; margin-right: 1.2rem; }
    header .brand { font-weight: 700; letter-spacing: .02em; }
    main { max-width: 1200px; margin: 0 auto; padding: 1.5rem 2rem 3rem; }
    h1 { font-size: 1.5rem; margin: .2rem 0 1rem; }
    h2 { font-size: 1.1rem; margin: 1.5rem 0 .5rem; }
    table { border-collapse: collapse; width: 100%; background: #fff; border: 1px solid var(--line); }
    th, td { text-align: left; padding: .5rem .75rem; border-bottom: 1px solid var(--line); vertical-align: top; }
    thead th { font-size: .8rem; text-transform: uppercase; letter-spacing: .04em; color: var(--muted);
      background: #fafbfc; }
    th.count { text-align: right; }
    td.count { font-variant-numeric: tabular-nums; text-align: right; }
    td.count a { color: inherit; text-decoration: none; }
    td.dead a { color: var(--dead); font-weight: 600; }
    td time { white-space: nowrap; }
    td.summary { font-family: ui-monospace, monospace; font-size: .85rem; word-break: break-all; }
    td.error { color: var(--dead); font-size: .85rem; word-break: break-word; }
    a { color: var(--accent); }
    .badge { display: inline-block; padding: .05rem .5rem; border-radius: 999px; font-size: .8rem;
      background: #e9edf3; color: var(--muted); }
    .badge.ready { background: #e1f3e7; color: var(--ready); }
    .badge.scheduled { background: #fbf3d0; color: var(--scheduled); }
    .badge.held { background: #f1e6fa; color: #6a3d8f; }
    .held-by { display: block; color: var(--muted); font-family: system-ui, sans-serif; }
    .badge.running { background: #e3eafb; color: var(--running); }
    .badge.dead, .badge.paused { background: #fbe4e2; color: var(--dead); }
    .badge.completed { background: #e1f3e7; color: var(--ready); }
    .badge.cancelled { background: #eceef2; color: var(--muted); text-decoration: line-through; }
    p.counts { font-size: .9rem; color: var(--muted); }
    p.counts .count { font-variant-numeric: tabular-nums; font-weight: 600; }
    ol.errors { padding-left: 1.5rem; }
    ol.errors pre { margin: .3rem 0; }
    form.inline { display: inline; }
    button, .button { font: inherit; font-size: .85rem; padding: .3rem .8rem; border-radius: 6px;
      border: 1px solid #b9c2d0; background: #fff; color: var(--ink); cursor: pointer; text-decoration: none;
      display: inline-block; }
    button:hover, .button:hover { border-color: var(--accent); }
    button.danger, .button.danger { color: var(--dead); border-color: #e2b3af; }
    .filters { display: flex; flex-wrap: wrap; gap: 1rem; align-items: end; margin-bottom: 1rem; }
    .filters label { display: flex; flex-direction: column; font-size: .8rem; color: var(--muted); }
    .filters input, .filters select { font: inherit; padding: .3rem .4rem; min-width: 12rem; }
    .notice { background: #e1f3e7; border: 1px solid #b8dfc5; padding: .6rem .9rem; border-radius: 6px; }
    .notice.error { background: #fbe4e2; border-color: #efbdb8; }
    .notice.held { background: #f1e6fa; border-color: #d8c2ea; }
    .meta, .none, .empty { color: var(--muted); font-size: .85rem; }
    pre { background: #fff; border: 1px solid var(--line); padding: .8rem; overflow: auto; max-height: 30rem;
      white-space: pre-wrap; word-break: break-word; }
    pre.error { color: var(--dead); }
    table.facts { width: auto; min-width: 30rem; }
    table.facts th { width: 10rem; color: var(--muted); font-weight: 500; }
    .sign-in label { display: block; margin-bottom: .8rem; }
    section.activity { margin-top: 2rem; }
    .activity-row { display: grid; grid-template-columns: 10rem 1fr 1fr; gap: 1rem; align-items: start;
      background: #fff; border: 1px solid var(--line); padding: .6rem .9rem; margin-bottom: .6rem; }
    .activity-row h3 { font-size: .95rem; margin: .2rem 0; word-break: break-all; }
    figure.chart { margin: 0; }
    figure.chart svg { display: block; width: 100%; height: auto; }
    .activity-row.quiet p { grid-column: 2 / 4; margin: .2rem 0; }
    figure.chart figcaption { font-size: .8rem; color: var(--muted); }
    svg .axis { stroke: var(--line); stroke-width: 1; }
    svg .tick { font-size: 10px; fill: var(--muted); }
    svg rect.ok { fill: var(--ready); }
    svg rect.retry { fill: #c9a400; }
    svg rect.died { fill: var(--dead); }
    svg rect.wait { fill: var(--running); }
    """
}
