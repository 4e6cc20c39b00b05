// elastrec dashboard: renders the snapshot the server publishes (GET /api/snapshot, then
// every new one over server-sent events from /api/events). No framework, no CDN.
"use strict";

// What a test (or a curious person in the console) can read: snapshots received, errors.
window.__elastrec = { updates: 0, errors: [] };
window.addEventListener("error", (e) => window.__elastrec.errors.push(String(e.message)));

const token = new URLSearchParams(location.search).get("token");
const withToken = (path) => (token ? `${path}?token=${encodeURIComponent(token)}` : path);

const esc = (v) =>
  String(v ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
const num = (v, digits = 0) =>
  v === null || v === undefined || !Number.isFinite(Number(v))
    ? "–"
    : Number(v).toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: digits });
const badge = (text) => `<span class="badge ${esc(text)}">${esc(text)}</span>`;

const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c"];

// A small line chart of `series` ([{name, points: [[x, y]...]}]) as inline SVG.
function chart(title, series, unit = "") {
  const W = 320, H = 120, P = 4;
  const all = series.flatMap((s) => s.points).filter((p) => Number.isFinite(p[1]));
  let body = "";
  if (all.length === 0) {
    body = `<text x="${W / 2}" y="${H / 2}" text-anchor="middle" fill="#9ca3af">no data yet</text>`;
  } else {
    const xs = all.map((p) => p[0]), ys = all.map((p) => p[1]);
    const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1);
    const y0 = Math.min(0, ...ys), y1 = Math.max(...ys, y0 + 1e-9) * 1.08 || 1;
    const sx = (x) => P + ((x - x0) / (x1 - x0)) * (W - 2 * P);
    const sy = (y) => H - P - ((y - y0) / (y1 - y0)) * (H - 2 * P);
    body = series
      .map((s, i) => {
        const pts = s.points.filter((p) => Number.isFinite(p[1])).map((p) => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`);
        return pts.length ? `<polyline fill="none" stroke="${COLORS[i % COLORS.length]}" stroke-width="2" points="${pts.join(" ")}"/>` : "";
      })
      .join("");
    body += `<text x="${W - P}" y="12" text-anchor="end" font-size="11" fill="#6b7280">max ${esc(num(Math.max(...ys), 2))}${esc(unit)}</text>`;
  }
  const legend = series
    .map((s, i) => {
      const last = s.points.length ? s.points[s.points.length - 1][1] : null;
      return `<span style="color:${COLORS[i % COLORS.length]}">● ${esc(s.name)} ${esc(num(last, 2))}</span>`;
    })
    .join("");
  return `<div class="chart"><h3>${esc(title)}</h3><svg class="chart-svg" viewBox="0 0 ${W} ${H}" preserveAspectRatio="none" data-points="${all.length}">${body}</svg><div class="legend">${legend}</div></div>`;
}

// The points of `get` over the history (readings without a value left out).
const values = (history, get) => history.map((p) => [p.t_s, get(p)]).filter((p) => p[1] !== null && p[1] !== undefined);
const line = (history, key) => values(history, (p) => p[key]);

function nodesTable(nodes) {
  if (!nodes || nodes.length === 0) return "<p class=muted>No nodes yet.</p>";
  const rows = nodes
    .map((n) => {
      const p = n.profile || {};
      return `<tr class="node" data-role="${esc(n.role)}" data-state="${esc(n.state)}">
        <td class=num>${esc(n.id)}</td><td>${esc(n.role)}</td><td>${badge(n.state)}</td>
        <td class=num>${esc(n.pid)}</td><td>${esc(n.addr)}</td>
        <td class=num>${esc(num(n.last_heartbeat_ms_ago))} ms</td><td class=num>${esc(num(n.samples))}</td>
        <td class=num>${esc(n.restarts)}</td><td class=num>${esc(num((p.rss_bytes || 0) / 1048576))}</td>
        <td class=num>${esc(num(p.cpu_s, 1))}</td></tr>`;
    })
    .join("");
  return `<table class="nodes"><thead><tr><th>node</th><th>role</th><th>state</th><th>pid</th><th>address</th>
    <th>heartbeat</th><th>samples</th><th>restarts</th><th>RSS MB</th><th>CPU s</th></tr></thead><tbody>${rows}</tbody></table>`;
}

function scalingTable(autoscale) {
  const rows = (autoscale && autoscale.scaling) || [];
  const last = autoscale && autoscale.last_plan;
  let head = "";
  if (last) {
    head = `<p>Last plan: ${esc(last.kind)} → ${esc(last.workers)} workers, ${esc(last.ps)} PS, predicted ${esc(num(last.predicted_samples_per_s))} samples/s
      (fit error ${esc(num(last.fit_mape_percent, 1))}%). Verdict: ${esc(autoscale.last_verdict || "–")}</p>`;
  }
  if (rows.length === 0) return head + "<p class=muted>No scaling decision yet.</p>";
  const body = rows
    .slice()
    .reverse()
    .map(
      (r) => `<tr class="scaling"><td class=num>${esc(num(r.at_s, 1))}</td><td>${esc(r.before[0])}w/${esc(r.before[1])}ps → ${esc(r.after[0])}w/${esc(r.after[1])}ps</td>
        <td>${esc(r.source)}</td><td class=num>${esc(num(r.measured_before))}</td><td class=num>${esc(num(r.predicted))}</td>
        <td class=num>${esc(num(r.measured_after))}</td><td class="reasons">${(r.reasons || []).map(esc).join("<br>")}</td></tr>`
    )
    .join("");
  return `${head}<table class="decisions"><thead><tr><th>at s</th><th>change</th><th>by</th><th>measured before</th><th>predicted</th>
    <th>measured after</th><th>why</th></tr></thead><tbody>${body}</tbody></table>`;
}

function onlinePart(stream) {
  if (!stream) return "";
  const d = stream.last_decision;
  const decision = d
    ? `<p>Last decision at ${esc(num(d.at_s, 1))} s: ${esc(d.workers)} → ${esc(d.target)} workers for ${esc(num(d.load))} msg/s. <span class="reasons">${esc(d.reason)}</span></p>`
    : "";
  return `<section><h3>Stream</h3><div class="figures">
    <div><b>${esc(num(stream.arrival_rate))}</b>msg/s arriving</div>
    <div><b>${esc(num(stream.lag_s, 1))} s</b>lag (SLO ${esc(num(stream.slo_lag_s))} s)</div>
    <div><b>${esc(num(100 * (stream.slo_violation_rate || 0), 1))}%</b>time above the SLO</div>
    <div><b>${esc(num((stream.downtime_s || 0) / 60, 1))} min</b>downtime</div></div>${decision}</section>`;
}

function checkpointPart(c) {
  if (!c) return "";
  return `<div><b>${esc(c.count)}</b>checkpoints (last ${esc(num(c.last_age_s))} s ago, every ${esc(num(c.interval_s))} s)</div>
    <div><b>${esc(num(100 * (c.pls || 0), 2))}%</b>lost samples (PLS)</div>
    <div><b>${esc(c.recoveries)}</b>recoveries</div>`;
}

function jobCard(job) {
  const s = job.status;
  const h = job.history || [];
  const name = (s && s.job) || (job.result && job.result.job_id) || job.dir;
  let html = `<article class="job" data-dir="${esc(job.dir)}" data-state="${esc(job.state)}"><h2>${esc(name)} ${badge(job.state)}`;
  if (s) html += ` ${badge(s.phase)}`;
  html += ` <span class="muted">${esc(job.dir)}</span></h2>`;
  if (job.state !== "live") {
    if (job.error && job.state === "unreachable") html += `<p class="error">${esc(job.error)}</p>`;
  }
  if (job.result) {
    const r = job.result;
    html += `<div class="figures"><div><b>${esc(r.status)}</b>result</div><div><b>${esc(num(r.samples_per_s))}</b>samples/s overall</div>
      <div><b>${esc(num(r.wall_s, 1))} s</b>wall time</div>${r.eval ? `<div><b>${esc(num(r.eval.auc, 4))}</b>AUC</div><div><b>${esc(num(r.eval.logloss, 4))}</b>logloss</div>` : ""}</div>`;
  }
  if (s) {
    const running = (role) => (s.nodes || []).filter((n) => n.role === role && n.state === "running").length;
    const frac = s.samples_total ? Math.min(1, s.samples_done / s.samples_total) : 0;
    html += `<div class="figures">
      <div><b>${esc(num(s.samples_per_sec))}</b>samples/s</div>
      <div><b>${esc(num(s.samples_done))}</b>of ${esc(num(s.samples_total))} samples</div>
      <div><b>${esc(s.epoch + 1)} / ${esc(s.epochs)}</b>epoch</div>
      <div><b class="workers-running">${esc(running("worker"))}</b>workers running (target ${esc(s.target_workers)})</div>
      <div><b>${esc(running("ps"))}</b>PS</div>${checkpointPart(s.checkpoint)}</div>
      <div class="progress"><div style="width:${(100 * frac).toFixed(1)}%"></div></div>`;
    if (s.checkpoint && s.checkpoint.recovery) html += `<p class="reasons">Recovery policy: ${esc(s.checkpoint.recovery)}</p>`;
  }
  if (h.length > 0) {
    let charts = chart("samples/s", [{ name: "samples/s", points: line(h, "samples_per_s") }]);
    charts += chart("workers", [
      { name: "running", points: line(h, "workers") },
      { name: "target", points: line(h, "target_workers") },
    ]);
    if (h.some((p) => p.arrival_rate !== null)) {
      charts += chart("traffic (msg/s)", [{ name: "arriving", points: line(h, "arrival_rate") }]);
      charts += chart("lag (s)", [{ name: "lag", points: line(h, "lag_s") }], " s");
    }
    // A multi-task job: a line per task on each progressive chart.
    const tasks = Math.max(0, ...h.map((p) => (p.tasks || []).length));
    const perTask = (key, name) =>
      tasks > 1
        ? Array.from({ length: tasks }, (_, t) => ({
            name: `task ${t}`,
            points: values(h, (p) => (p.tasks || [])[t]?.[key]),
          }))
        : [{ name, points: line(h, key) }];
    if (h.some((p) => p.logloss !== null)) charts += chart("progressive logloss", perTask("logloss", "logloss"));
    if (h.some((p) => p.auc !== null)) charts += chart("progressive AUC", perTask("auc", "AUC"));
    if (h.some((p) => p.pls !== null)) charts += chart("portion of lost samples", [{ name: "PLS", points: line(h, "pls") }]);
    html += `<div class="charts">${charts}</div>`;
  }
  if (s) {
    html += onlinePart(s.stream);
    html += `<section><h3>Nodes</h3>${nodesTable(s.nodes)}</section>`;
    html += `<section><h3>Scaling decisions</h3>${scalingTable(s.autoscale)}</section>`;
    const reshards = Array.isArray(s.reshards) ? s.reshards : [];
    if (reshards.length) html += `<section><h3>PS re-shardings</h3><p>${esc(reshards.length)} so far; layout version ${esc(s.layout.version)} with ${esc(s.layout.ps)} PS.</p></section>`;
  }
  return html + "</article>";
}

function render(snapshot) {
  window.__elastrec.updates += 1;
  const jobs = snapshot.jobs || [];
  document.getElementById("jobs").innerHTML = jobs.length
    ? jobs.map(jobCard).join("")
    : `<p class="empty">Waiting for the first reading of the jobs…</p>`;
  document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()} · every ${snapshot.every_ms} ms`;
}

function setConnection(text) {
  const el = document.getElementById("connection");
  el.textContent = text;
  el.className = `badge ${text}`;
}

fetch(withToken("api/snapshot"))
  .then((r) => (r.ok ? r.json() : Promise.reject(new Error(`snapshot: HTTP ${r.status}`))))
  .then(render)
  .catch((e) => setConnection(`failed: ${e.message}`));

const feed = new EventSource(withToken("api/events"));
feed.addEventListener("snapshot", (e) => {
  setConnection("connected");
  render(JSON.parse(e.data));
});
feed.onerror = () => setConnection("reconnecting");
