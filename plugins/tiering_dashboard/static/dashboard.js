// The tiering dashboard: fetches the JSON API next to this page and draws the charts as inline SVG.
// No external code; every string from the database goes through textContent / setAttribute (never HTML).
(() => {
  "use strict";

  const BASE = document.querySelector('meta[name="tiering-base"]').content || "./";
  const SVG_NS = "http://www.w3.org/2000/svg";
  const REFRESH_MS = 30000;
  const MAX_BARS = 25;
  const TIER_COLORS = { 1: "tier1", 2: "tier2" };

  // ------------------------------------------------------------------ formatting
  const UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  function formatBytes(n) {
    n = Number(n) || 0;
    let i = 0;
    while (Math.abs(n) >= 1024 && i < UNITS.length - 1) { n /= 1024; i += 1; }
    return i === 0 ? `${n} B` : `${n.toFixed(1)} ${UNITS[i]}`;
  }
  const formatInt = (n) => Number(n || 0).toLocaleString("en-US");
  const pad = (n) => String(n).padStart(2, "0");
  function formatTime(iso, withDate = true) {
    if (!iso) return "—";
    const d = new Date(iso);
    const time = `${pad(d.getHours())}:${pad(d.getMinutes())}`;
    return withDate ? `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${time}:${pad(d.getSeconds())}` : time;
  }
  function formatDuration(seconds) {
    if (seconds === null || seconds === undefined) return "—";
    const s = Math.round(seconds);
    if (s < 60) return `${s} s`;
    if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
    if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
    return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
  }
  function truncate(text, max) {
    const chars = Array.from(String(text));
    return chars.length <= max ? chars.join("") : `${chars.slice(0, max - 1).join("")}…`;
  }

  // ------------------------------------------------------------------ DOM helpers
  function build(ns, tag, attrs, children) {
    const node = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "text") node.textContent = String(value);
      else node.setAttribute(key, String(value));
    }
    for (const child of children || []) {
      if (child !== null && child !== undefined) node.append(child);
    }
    return node;
  }
  const h = (tag, attrs, ...children) => build(null, tag, attrs, children);
  const s = (tag, attrs, ...children) => build(SVG_NS, tag, attrs, children);
  const title = (text) => s("title", { text });
  const $ = (id) => document.getElementById(id);
  function replace(id, ...nodes) { $(id).replaceChildren(...nodes); }

  // ------------------------------------------------------------------ data
  async function getJSON(path) {
    const response = await fetch(BASE + path, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (!response.ok) {
      let detail = "";
      try { detail = (await response.json()).detail; } catch (_) { /* not JSON */ }
      const error = new Error(typeof detail === "string" && detail ? detail : `${response.status} ${response.statusText}`);
      error.status = response.status;
      throw error;
    }
    return response.json();
  }

  // ------------------------------------------------------------------ cards
  function card(label, value, sub, cls) {
    return h("div", { class: `card ${cls || ""}`, "data-card": label },
      h("div", { class: "card-label", text: label }),
      h("div", { class: "card-value", text: value }),
      h("div", { class: "card-sub", text: sub }));
  }
  function renderCards(usage, backlog, lagged, gc, integrity) {
    const t = usage.totals;
    replace("cards",
      card("Topics", formatInt(t.topics), `${formatInt(t.deleted_ledgers)} ledgers deleted by retention`),
      card("Tier 1", formatBytes(t.tier1_bytes), `${formatInt(t.tier1_ledgers)} ledgers on local storage`, "tier1"),
      card("Tier 2", formatBytes(t.tier2_bytes), `${formatInt(t.tier2_ledgers)} ledgers, ${formatBytes(t.tier2_stored_bytes)} stored`, "tier2"),
      card("Offload backlog", formatBytes(backlog.total.bytes), `${formatInt(backlog.total.ledgers)} ledgers, ${formatInt(backlog.total.offloading)} offloading`, "backlog"),
      card("Lagged tier-1 copies", formatInt(lagged.total.copies), `${formatInt(lagged.total.due)} due for deletion (${formatBytes(lagged.total.due_bytes)})`),
      // pending is what the queue holds; due is the part the next GC run may take (the rest waits for its delay)
      card("GC queue", `${formatInt(gc.pending)} pending`, `${formatInt(gc.due)} due now, ${formatInt(gc.failed)} failed`, gc.failed ? "alert" : ""),
      // lost: no tier holds a good copy (reads give a DATALOSS gap); repairable: the last scrub's broken tier-2
      // copies that `tiering repair` can re-make from tier 1
      card("Integrity", `${formatInt(integrity.lost)} lost`,
        integrity.last_scrub.repairable === null ? "no scrub has checked copies yet"
          : `${formatInt(integrity.last_scrub.repairable)} repairable, ${formatInt(integrity.last_scrub.unrepairable)} unrepairable at the last scrub`,
        integrity.lost || integrity.last_scrub.unrepairable ? "alert" : ""));
  }

  // ------------------------------------------------------------------ chart: bytes per tier per topic
  // An axis for byte values: at most `ticks` steps of 1, 2, 2.5 or 5 x 10^k in the unit of the maximum
  // (B, KiB, MiB...), so tick labels read 0, 10 KiB, 20 KiB... rather than 6.1 KiB, 12.2 KiB.
  function byteAxis(max, ticks = 4) {
    if (!(max > 0)) return { top: 1024, step: 256, ticks: [0, 256, 512, 768, 1024] };
    let unit = 1;
    for (let i = 1; i < UNITS.length && max >= unit * 1024; i += 1) unit *= 1024;
    const raw = max / unit / ticks;
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = Math.max(1, [1, 2, 2.5, 5, 10].map((m) => m * mag).find((m) => m >= raw * (1 - 1e-9)) * unit);
    const count = Math.max(1, Math.ceil(max / step - 1e-9));
    return { top: count * step, step, ticks: Array.from({ length: count + 1 }, (_, i) => i * step) };
  }
  function legend(items, x, y) {
    const g = s("g", { class: "legend", transform: `translate(${x},${y})` });
    let offset = 0;
    for (const [cls, label] of items) {
      g.append(s("rect", { x: offset, y: -10, width: 12, height: 12, rx: 2, class: cls }),
        s("text", { x: offset + 17, y: 0, text: label }));
      offset += 30 + label.length * 7;
    }
    return g;
  }
  function renderTierChart(usage) {
    const all = usage.topics.map((r) => ({ ...r, total: r.tier1_bytes + r.tier2_bytes }));
    if (!all.length) { replace("tier-chart", h("p", { class: "empty", text: "No topics yet." })); return; }
    const rows = [...all].sort((a, b) => b.total - a.total || (a.topic < b.topic ? -1 : 1)).slice(0, MAX_BARS);
    const W = 960, labelW = 200, valueW = 240, top = 46, rowH = 30, barH = 18;
    const plotW = W - labelW - valueW - 20;
    const H = top + rows.length * rowH + 10;
    const axis = byteAxis(Math.max(...rows.map((r) => r.total)));
    const x = (v) => (v / axis.top) * plotW;
    const chart = s("svg", { viewBox: `0 0 ${W} ${H}`, class: "tier-chart", role: "img",
      "aria-label": "Bytes per tier per topic, stacked bars" });
    chart.append(legend([["tier1", "Tier 1 (local)"], ["tier2", "Tier 2 (object store)"]], labelW, 14));
    for (const v of axis.ticks) {
      const gx = labelW + x(v);
      chart.append(s("line", { x1: gx, x2: gx, y1: top - 8, y2: H - 6, class: "grid" }),
        s("text", { x: gx, y: top - 12, class: "axis", "text-anchor": "middle", text: formatBytes(v) }));
    }
    rows.forEach((r, i) => {
      const y = top + i * rowH + (rowH - barH) / 2;
      const g = s("g", { class: "bar", "data-topic": r.topic, "data-total-bytes": r.total });
      g.append(s("text", { x: labelW - 8, y: y + barH - 4, class: "bar-label", "text-anchor": "end",
        "data-topic": r.topic, text: truncate(r.topic, 24) }, title(r.topic)));
      let offset = 0;
      for (const tier of [1, 2]) {
        const bytes = r[`tier${tier}_bytes`];
        const ledgers = r[`tier${tier}_ledgers`];
        const extra = tier === 2 ? `, ${formatInt(r.tier2_stored_bytes)} bytes stored` : "";
        g.append(s("rect", { x: labelW + x(offset), y, width: x(bytes), height: barH, class: `segment ${TIER_COLORS[tier]}`,
          "data-topic": r.topic, "data-tier": tier, "data-bytes": bytes, "data-ledgers": ledgers },
        title(`${r.topic} — tier ${tier}: ${formatInt(bytes)} bytes (${formatBytes(bytes)}) in ${formatInt(ledgers)} ledgers${extra}`)));
        offset += bytes;
      }
      g.append(s("text", { x: labelW + x(r.total) + 8, y: y + barH - 4, class: "bar-value", "data-topic": r.topic,
        text: `T1 ${formatBytes(r.tier1_bytes)} · T2 ${formatBytes(r.tier2_bytes)}` }));
      chart.append(g);
    });
    const nodes = [chart];
    if (all.length > rows.length) {
      nodes.push(h("p", { class: "hint", text: `The ${rows.length} largest of ${all.length} topics; every topic is in the Topics table.` }));
    }
    replace("tier-chart", ...nodes);
  }

  // ------------------------------------------------------------------ chart: backlog and offloaded over time
  const SERIES = [
    ["backlog", "backlog_bytes", "backlog_ledgers", "Offload backlog"],
    ["offloaded", "offloaded_bytes", "offloaded_ledgers", "Offloaded in the hour"],
  ];
  function renderSeriesChart(series) {
    const points = series.points;
    if (!points.length) { replace("series-chart", h("p", { class: "empty", text: "No data." })); return; }
    const W = 960, H = 300, left = 80, right = 20, top = 34, bottom = 40;
    const plotW = W - left - right, plotH = H - top - bottom;
    const axis = byteAxis(Math.max(...points.flatMap((p) => [p.backlog_bytes, p.offloaded_bytes])));
    const x = (i) => left + (points.length === 1 ? plotW / 2 : (plotW * i) / (points.length - 1));
    const y = (v) => top + plotH - (v / axis.top) * plotH;
    const multiDay = series.hours > 24;
    const chart = s("svg", { viewBox: `0 0 ${W} ${H}`, class: "series-chart", role: "img",
      "aria-label": "Offload backlog and offloaded bytes over time, line chart" });
    chart.append(legend(SERIES.map(([cls, , , label]) => [cls, label]), left, 16));
    for (const v of axis.ticks) {
      const gy = y(v);
      chart.append(s("line", { x1: left, x2: W - right, y1: gy, y2: gy, class: "grid" }),
        s("text", { x: left - 8, y: gy + 4, class: "axis", "text-anchor": "end", text: formatBytes(v) }));
    }
    const every = Math.max(1, Math.ceil(points.length / 8));
    points.forEach((p, i) => {
      if ((points.length - 1 - i) % every !== 0) return;
      const d = new Date(p.bucket_start);
      const label = multiDay ? `${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${formatTime(p.bucket_start, false)}` : formatTime(p.bucket_start, false);
      chart.append(s("text", { x: x(i), y: H - bottom + 18, class: "axis", "text-anchor": "middle", text: label }));
    });
    for (const [cls, bytesKey, ledgersKey, label] of SERIES) {
      const path = points.map((p, i) => `${i ? "L" : "M"}${x(i).toFixed(1)},${y(p[bytesKey]).toFixed(1)}`).join(" ");
      const g = s("g", { class: `series ${cls}`, "data-series": cls });
      g.append(s("path", { d: path, class: `line ${cls}`, "data-series": cls }));
      points.forEach((p, i) => {
        g.append(s("circle", { cx: x(i), cy: y(p[bytesKey]), r: 3.5, class: `dot ${cls}`, "data-series": cls,
          "data-t": p.bucket_start, "data-bytes": p[bytesKey], "data-ledgers": p[ledgersKey] },
        title(`${formatTime(p.bucket_start)} — ${label}: ${formatInt(p[bytesKey])} bytes (${formatBytes(p[bytesKey])}), ${formatInt(p[ledgersKey])} ledgers`)));
      });
      chart.append(g);
    }
    replace("series-chart", chart);
  }

  // ------------------------------------------------------------------ tables
  function table(id, columns, rows, empty) {
    if (!rows.length) { replace(id, h("p", { class: "empty", text: empty })); return; }
    const head = h("tr", {}, ...columns.map(([label, , cls]) => h("th", { class: typeof cls === "function" ? num : cls, text: label })));
    const body = rows.map((row) => h("tr", {}, ...columns.map(([, value, clsOf]) => {
      const v = value(row);
      const cls = typeof clsOf === "function" ? clsOf(row) : clsOf;
      // a cell that may be cut (class ellipsis, e.g. the run's error) carries its full text as a tooltip
      const cut = typeof cls === "string" && cls.split(" ").includes("ellipsis") && v !== "";
      return v instanceof Node ? h("td", { class: cls }, v) : h("td", { class: cls, text: v, title: cut ? v : null });
    })));
    replace(id, h("table", {}, h("thead", {}, head), h("tbody", {}, ...body)));
  }
  const num = "num";
  function status(value) { return h("span", { class: `pill ${String(value).toLowerCase()}`, text: value }); }

  const off = (n, fmt) => (n < 0 ? "off" : fmt(n));
  function renderSubscriptions(subs) {
    const t = subs.total;
    $("subscriptions-badge").textContent = `${formatInt(t.subscriptions)} · ${formatInt(t.expired)} expired · `
      + `${formatInt(t.backlog_entries)} unread · ${formatInt(t.entries_deleted_unread)} deleted unread`;
    const rows = subs.subscriptions;
    table("subscriptions-table", [
      ["Topic", (r) => r.topic, "ellipsis"], ["Subscription", (r) => r.name, "ellipsis"],
      ["Position", (r) => r.position || "none read", num], ["State", (r) => status(r.state)],
      ["Backlog entries", (r) => formatInt(r.backlog_entries), num],
      ["Backlog bytes", (r) => formatBytes(r.backlog_bytes), num],
      ["Oldest unread", (r) => (r.oldest_unread_age_seconds === null ? "—" : `${formatDuration(r.oldest_unread_age_seconds)} ago`), num],
      ["Last ack", (r) => formatTime(r.last_ack_at), num],
      ["Deleted unread", (r) => formatInt(r.entries_deleted_unread), (r) => (r.entries_deleted_unread ? "num loss" : num)],
      ["Deleted unread bytes", (r) => formatBytes(r.bytes_deleted_unread), (r) => (r.bytes_deleted_unread ? "num loss" : num)],
      ["Last loss", (r) => (r.last_loss_reason ? `${r.last_loss_reason} (${formatTime(r.last_loss_at)})` : "none"), "ellipsis"],
    ], rows, "No subscriptions yet.");
    if (rows.length && rows.length < t.subscriptions) {
      $("subscriptions-table").append(h("p", { class: "hint",
        text: `The ${rows.length} largest backlogs of ${formatInt(t.subscriptions)} subscriptions.` }));
    }
  }

  function renderTables(backlog, lagged, gc, runs, topics) {
    $("backlog-badge").textContent = `${formatInt(backlog.total.ledgers)} ledgers · ${formatBytes(backlog.total.bytes)}`;
    table("backlog-table", [
      ["Topic", (r) => r.topic, "ellipsis"], ["Ledgers", (r) => formatInt(r.ledgers), num],
      ["Bytes", (r) => formatBytes(r.bytes), num], ["Offloading", (r) => formatInt(r.offloading), num],
      ["Oldest sealed", (r) => formatDuration(r.oldest_sealed_for_seconds) + " ago", num],
    ], backlog.by_topic, "Nothing waits for offload.");

    $("lagged-badge").textContent = `${formatInt(lagged.total.copies)} copies · ${formatInt(lagged.total.due)} due`;
    table("lagged-table", [
      ["Topic", (r) => r.topic, "ellipsis"], ["Copies", (r) => formatInt(r.copies), num],
      ["Bytes", (r) => formatBytes(r.bytes), num], ["Due", (r) => formatInt(r.due), num],
      ["Next deletable", (r) => formatTime(r.next_deletable_at), num],
    ], lagged.by_topic, "No tier-1 copy waits for its lag.");

    $("gc-badge").textContent = `${formatInt(gc.due)} due · ${formatInt(gc.total)} queued`;
    table("gc-table", [
      ["State", (r) => status(r.state)], ["Reason", (r) => r.reason, "ellipsis"],
      ["Tasks", (r) => formatInt(r.tasks), num], ["Due", (r) => formatInt(r.due), num],
      ["Still referenced", (r) => formatInt(r.referenced), num], ["Max attempts", (r) => formatInt(r.max_attempts), num],
      ["Next not-before", (r) => formatTime(r.next_not_before), num],
    ], gc.summary, "The GC queue is empty.");

    table("topics-table", [
      ["Topic", (r) => r.topic, "ellipsis"], ["Ledgers", (r) => formatInt(r.open_ledgers + r.sealed_ledgers + r.offloading_ledgers + r.offloaded_ledgers), num],
      ["Entries", (r) => formatInt(r.entries), num], ["Bytes", (r) => formatBytes(r.size_bytes), num],
      ["Offload after", (r) => (r.offload_after_seconds < 0 ? "off" : formatDuration(r.offload_after_seconds)), num],
      ["Threshold", (r) => (r.offload_threshold_bytes < 0 ? "off" : formatBytes(r.offload_threshold_bytes)), num],
      ["Deletion lag", (r) => formatDuration(r.deletion_lag_seconds), num],
      ["Retention", (r) => [r.retention_seconds >= 0 ? formatDuration(r.retention_seconds) : null,
        r.retention_bytes >= 0 ? formatBytes(r.retention_bytes) : null].filter(Boolean).join(" / ") || "unlimited", num],
      ["Retain unread", (r) => (r.retain_unread ? "yes" : "no")],
      ["Ceiling", (r) => [r.max_retention_seconds >= 0 ? formatDuration(r.max_retention_seconds) : null,
        r.max_retention_bytes >= 0 ? formatBytes(r.max_retention_bytes) : null].filter(Boolean).join(" / ") || "none", num],
      ["Subscription expiry", (r) => off(r.subscription_expiry_seconds, formatDuration), num],
      ["Subscriptions", (r) => formatInt(r.subscriptions), num],
    ], topics.topics, "No topics yet.");

    table("runs-table", [
      ["Run", (r) => String(r.run_id), num], ["Kind", (r) => (r.kind || r.job).replaceAll("_", " ")],
      ["Airflow run", airflowRunLink, "ellipsis"], ["Topic", (r) => r.topic || "all", "ellipsis"],
      ["Status", (r) => status(r.status)], ["Started", (r) => formatTime(r.started_at)],
      ["Duration", (r) => formatDuration(r.duration_seconds), num], ["Done", (r) => formatInt(r.items_done), num],
      ["Failed", (r) => formatInt(r.items_failed), num], ["Bytes", (r) => formatBytes(r.bytes), num],
      ["Error", (r) => r.error || "", "ellipsis error-text"],
    ], runs.runs, "No pipeline run recorded yet.");
  }

  // The Airflow UI's page of the DAG run (and try) that ran a job; runs started by hand have none.
  const AIRFLOW_ROOT = new URL("..", new URL(BASE, window.location.href));
  function airflowRunLink(r) {
    if (!r.dag_id || !r.dag_run_id) return "by hand";
    const href = new URL(`dags/${encodeURIComponent(r.dag_id)}/runs/${encodeURIComponent(r.dag_run_id)}`, AIRFLOW_ROOT);
    const label = `${r.dag_run_id}${r.try_number > 1 ? ` (try ${r.try_number})` : ""}`;
    return topLink({ href: href.href, title: `${r.dag_id} / ${r.dag_run_id}`, text: label, "data-ui-route": "1" });
  }

  // Links into Airflow's UI. The UI shows this page in an iframe sandboxed without allow-top-navigation, so
  // the frame may not navigate the UI's window (target=_top is refused). The frame is same-origin
  // (allow-same-origin), so the link acts in the UI's window instead: a UI route (a DAG run) is pushed on
  // the UI's history and announced with popstate, which the UI's router follows without a reload; a server
  // route (the login) is followed by a link made in the UI's own document, a navigation of the UI's window
  // by itself, which its sandbox (none) allows. Standalone (/tiering/), the link is an ordinary _top link.
  function framingWindow() {
    try {
      return window.top !== window && window.top.location.origin === window.location.origin ? window.top : null;
    } catch (_) {
      return null;  // framed by another origin: leave the link to the browser
    }
  }
  function openInUi(ui, href, uiRoute) {
    const url = new URL(href, window.location.href);
    if (uiRoute) {
      try {
        const idx = ui.history.state && Number.isInteger(ui.history.state.idx) ? ui.history.state.idx + 1 : null;
        // the state React Router's history keeps (usr, key, idx), so Back returns to the dashboard
        ui.history.pushState({ usr: null, key: Math.random().toString(36).slice(2, 10), idx }, "",
          url.pathname + url.search + url.hash);
        ui.dispatchEvent(new ui.PopStateEvent("popstate", { state: ui.history.state }));
        return;
      } catch (_) { /* fall back to a full navigation of the UI's window */ }
    }
    const link = ui.document.createElement("a");
    link.href = url.href;
    link.hidden = true;
    ui.document.body.append(link);
    link.click();
    link.remove();
  }
  function topLink(attrs) {
    const a = h("a", { ...attrs, target: "_top" });
    a.addEventListener("click", (event) => {
      const ui = framingWindow();
      if (!ui || event.defaultPrevented || event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey
          || event.altKey) return;
      event.preventDefault();
      openInUi(ui, a.href, a.dataset.uiRoute === "1");
    });
    return a;
  }

  // ------------------------------------------------------------------ refresh loop
  let timer = null;
  let busy = false;
  function showError(error) {
    const box = $("error");
    box.replaceChildren();
    if (error.status === 401 || error.status === 403) {
      // Airflow's login redirect, with `next` = the page the user is on (the UI page that embeds this
      // dashboard, or the dashboard itself), so logging in returns here and not to Airflow's home page
      let here = window.location.href;
      try { here = window.top.location.href; } catch (_) { /* not same-origin: the dashboard's own URL */ }
      const login = new URL(`api/v2/auth/login?next=${encodeURIComponent(here)}`, AIRFLOW_ROOT);
      box.append("Log in to Airflow to see the tiering dashboard: ",
        topLink({ href: login.href, text: "log in" }), ".");
    } else {
      box.append(`Cannot load the dashboard: ${error.message}`);
    }
    box.hidden = false;
  }
  async function refresh() {
    if (busy) return;
    busy = true;
    clearTimeout(timer);
    try {
      const [usage, backlog, lagged, gc, runs, series, topics, subs, integrity] = await Promise.all([
        getJSON("api/tier-usage"), getJSON("api/offload-backlog?limit=20"), getJSON("api/lagged-copies?limit=20"),
        getJSON("api/gc-queue"), getJSON("api/job-runs?limit=50"), getJSON("api/series?hours=24&step_minutes=60"),
        getJSON("api/topics"), getJSON("api/subscriptions?limit=100"), getJSON("api/integrity?limit=20")]);
      renderCards(usage, backlog, lagged, gc, integrity);
      renderTierChart(usage);
      renderSeriesChart(series);
      renderTables(backlog, lagged, gc, runs, topics);
      renderSubscriptions(subs);
      $("error").hidden = true;
      $("updated").textContent = `updated ${formatTime(new Date().toISOString())}`;
      document.body.dataset.state = "ready";
    } catch (error) {
      showError(error);
      $("updated").textContent = "not updated";
      if (document.body.dataset.state !== "ready") document.body.dataset.state = "error";
    } finally {
      busy = false;
      timer = setTimeout(refresh, REFRESH_MS);
    }
  }
  $("refresh").addEventListener("click", refresh);
  refresh();
})();
