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

// Distinguishable on white and for the common colour-vision deficiencies (Okabe-Ito).
const COLORS = ["#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9"];

// A step of 1, 2 or 5 x 10^k that cuts `span` into about `n` parts.
function niceStep(span, n) {
  const raw = span / Math.max(1, n);
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const f = raw / mag;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
}

// A tick label without float noise: as many decimals as the step needs, thousands grouped.
function tickLabel(v, step) {
  const digits = Math.min(6, Math.max(0, -Math.floor(Math.log10(step) + 1e-9)));
  return Number(v.toFixed(digits)).toLocaleString("en-US", { maximumFractionDigits: digits });
}

// The value axis: linear ticks (from 0 when `zero`), or decades on a log scale where the
// values span more than 20x (all of them positive).
function valueAxis(ys, zero = true) {
  const lo = Math.min(...ys), hi = Math.max(...ys);
  if (lo > 0 && hi / lo > 20) {
    const a = Math.floor(Math.log10(lo)), b = Math.ceil(Math.log10(hi));
    const ticks = [];
    for (let k = a; k <= b; k++) ticks.push(Math.pow(10, k));
    return { log: true, y0: Math.pow(10, a), y1: Math.pow(10, b), ticks, label: (v) => tickLabel(v, Math.min(1, v)) };
  }
  let y0 = zero ? Math.min(0, lo) : lo;
  let y1 = hi > y0 ? hi : y0 + (Math.abs(y0) * 0.01 || 1);
  const step = niceStep(y1 - y0, 4);
  y0 = Math.floor(y0 / step) * step;
  y1 = Math.ceil(y1 / step) * step;
  const ticks = [];
  for (let v = y0; v <= y1 + step / 2; v += step) ticks.push(v);
  return { log: false, y0, y1, ticks, label: (v) => tickLabel(v, step) };
}

// The time axis (the x values are seconds since the Unix epoch): ticks at round clock
// times, the range widened to the ticks around the data, so there are always two.
const TIME_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];
function timeAxis(lo, hi) {
  const step = TIME_STEPS.find((s) => (hi - lo) / s <= 4) || 86400;
  const x0 = Math.floor(lo / step) * step;
  const x1 = Math.max(Math.ceil(hi / step) * step, x0 + step);
  const ticks = [];
  for (let t = x0; t <= x1 + step / 2; t += step) ticks.push(t);
  const seconds = step < 60;
  const label = (t) =>
    new Date(t * 1000).toLocaleTimeString("en-GB", { hour: "2-digit", minute: "2-digit", second: seconds ? "2-digit" : undefined });
  return { x0, x1, ticks, label };
}

// A line chart of `series` ([{name, points: [[unix_s, y]...]}]) as inline SVG with
// labelled axes: clock time across, `unit` up (from 0 unless `zero` is false: the AUC
// and logloss charts show their changes, not their distance from 0).
function chart(title, series, unit, { zero = true } = {}) {
  const W = 380, H = 200, L = 56, R = 28, T = 10, B = 38;
  const all = series.flatMap((s) => s.points).filter((p) => Number.isFinite(p[1]));
  let body = "";
  if (all.length === 0) {
    body = `<text x="${W / 2}" y="${H / 2}" text-anchor="middle" fill="#6b7280">no data yet</text>`;
  } else {
    const xs = all.map((p) => p[0]);
    const time = timeAxis(Math.min(...xs), Math.max(...xs));
    const { x0, x1 } = time;
    const ax = valueAxis(all.map((p) => p[1]), zero);
    const f = (y) => (ax.log ? Math.log10(Math.max(y, ax.y0)) : y);
    const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
    const sy = (y) => H - B - ((f(y) - f(ax.y0)) / (f(ax.y1) - f(ax.y0) || 1)) * (H - T - B);
    body += ax.ticks
      .map((v) => `<line x1="${L}" x2="${W - R}" y1="${sy(v).toFixed(1)}" y2="${sy(v).toFixed(1)}" stroke="#e5e7eb"/>
        <text class="tick-y" x="${L - 6}" y="${(sy(v) + 4).toFixed(1)}" text-anchor="end">${esc(ax.label(v))}</text>`)
      .join("");
    body += time.ticks
      .map((t) => `<line x1="${sx(t).toFixed(1)}" x2="${sx(t).toFixed(1)}" y1="${H - B}" y2="${H - B + 4}" stroke="#6b7280"/>
        <text class="tick-x" x="${sx(t).toFixed(1)}" y="${H - B + 16}" text-anchor="middle">${esc(time.label(t))}</text>`)
      .join("");
    body += `<line x1="${L}" x2="${W - R}" y1="${H - B}" y2="${H - B}" stroke="#6b7280"/><line x1="${L}" x2="${L}" y1="${T}" y2="${H - B}" stroke="#6b7280"/>`;
    body += `<text class="axis-title" x="${(L + W - R) / 2}" y="${H - 4}" text-anchor="middle">time (local clock)</text>`;
    body += `<text class="axis-title" transform="translate(12 ${(T + H - B) / 2}) rotate(-90)" text-anchor="middle">${esc(unit)}${ax.log ? " (log)" : ""}</text>`;
    body += series
      .map((s, i) => {
        const pts = s.points.filter((p) => Number.isFinite(p[1])).map((p) => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`);
        return pts.length ? `<polyline fill="none" stroke="${COLORS[i % COLORS.length]}" stroke-width="2" points="${pts.join(" ")}"/>` : "";
      })
      .join("");
  }
  const legend = series
    .map((s, i) => {
      const last = s.points.length ? s.points[s.points.length - 1][1] : null;
      return `<span style="color:${COLORS[i % COLORS.length]}">● ${esc(s.name)} ${esc(num(last, 2))}</span>`;
    })
    .join("");
  return `<div class="chart"><h3>${esc(title)}</h3><svg class="chart-svg" viewBox="0 0 ${W} ${H}" data-points="${all.length}">${body}</svg><div class="legend">${legend}</div></div>`;
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
    let charts = chart("training speed", [{ name: "samples/s", points: line(h, "samples_per_s") }], "samples/s");
    charts += chart("workers", [
      { name: "running", points: line(h, "workers") },
      { name: "target", points: line(h, "target_workers") },
    ], "workers");
    if (h.some((p) => p.arrival_rate !== null)) {
      charts += chart("traffic", [{ name: "arriving", points: line(h, "arrival_rate") }], "messages/s");
      charts += chart("lag", [{ name: "lag", points: line(h, "lag_s") }], "seconds");
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
    if (h.some((p) => p.logloss !== null)) charts += chart("progressive logloss", perTask("logloss", "logloss"), "logloss", { zero: false });
    if (h.some((p) => p.auc !== null)) charts += chart("progressive AUC", perTask("auc", "AUC"), "AUC", { zero: false });
    if (h.some((p) => p.pls !== null)) charts += chart("portion of lost samples", [{ name: "PLS", points: line(h, "pls") }], "share of samples");
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
