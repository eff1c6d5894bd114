// cachemesh dashboard: polls api/snapshot and draws it with uPlot (vendored beside this file).
// Each chart and table writes how much it holds into data-points / data-rows (the browser test reads them).
"use strict";

const POLL_MS = 1000;
const COLORS = ["#2563eb", "#16a34a", "#d97706", "#dc2626", "#7c3aed"];
const charts = {};
// What fills each panel, shown while it is empty (data-empty="1" on the hint then).
const HINTS = {
  hit_rate: "No lookups yet: the line starts with the first lookups a tier node serves (your client, the gateway, or cachemesh demo).",
  traffic: "No 1 s windows yet: the streams worker computes them from access events on cache.access.v1 (engines, the bridge, the demo).",
  warmup_delta: "No warmups applied yet: a point is one warmup's lead over the turn it prepared (the warmup service commands a tier node to load blocks before a conversation's next turn).",
  invalidations: "No invalidations yet: a write that replaces an answer, or a rewritten source document, invalidates what depended on it.",
  nodes: "No tier node answered yet.",
  drift: "No drift clusters yet: the streams worker forms one when the keys asked shift together over a window.",
  heat: "No heat decisions yet: the heat service scores keys from access events and publishes keep / evict / promote.",
  warmups: "No warmup decisions yet: the warmup service decides from heat scores and conversations' turn rhythm.",
  mode_changes: "No node changed mode: a node with peers goes local-only while its hit rate is below 85%.",
  instances: "No engine instances: a gateway in front of vLLM instances lists them here.",
  routes: "No routing decisions: a gateway with several instances routes each request by the prefix blocks they hold.",
};
const TIER_ZERO = {
  l2: "L2 (this node's block pool, then peers') answers exact keys that L1 evicted and KV blocks",
  l3: "L3 (Postgres) answers what no memory tier holds: cold entries and other nodes' writes",
};

function hint(name, empty, text) {
  const el = document.getElementById("hint-" + name);
  if (!el) return;
  el.dataset.empty = empty ? "1" : "0";
  el.textContent = empty ? (text || HINTS[name]) : "";
}

function clock(seconds) {
  return new Date(seconds * 1000).toLocaleTimeString([], { hour12: false });
}

function makeChart(name, series) {
  const el = document.getElementById("chart-" + name);
  const opts = {
    width: 580, height: 220,
    scales: { x: { time: true } },
    // hh:mm:ss ticks at least 90 px apart (uPlot's default labels sub-second ticks as ":10.500")
    // and the same clock in the legend; y gutters wide enough for "-20,000" (uPlot's default clips it).
    series: [{ value: (u, v) => (v === null || v === undefined ? "--" : clock(v)) }].concat(series.map((s, i) => ({ label: s.label, stroke: COLORS[i % COLORS.length], scale: s.scale || "y", spanGaps: true, points: { show: true, size: 4 } }))),
    axes: [{ space: 90, values: (u, splits) => splits.map(clock) }].concat(
      [...new Set(series.map((s) => s.scale || "y"))].map((scale, i) => ({ scale: scale, side: i === 0 ? 3 : 1, grid: { show: i === 0 }, size: 64 }))
    ),
  };
  charts[name] = { plot: new uPlot(opts, [[]].concat(series.map(() => [])), el), el: el, columns: series.map((s) => s.column) };
}

function fill(name, data) {
  const c = charts[name];
  c.plot.setData([data.t].concat(c.columns.map((col) => data[col])));
  c.el.dataset.points = String(data.t.length);
  hint(name, data.t.length === 0);
}

function tierZeros(data) {
  // A tier whose line sits at 0 over the whole chart says why, instead of looking broken.
  if (data.t.length === 0) return;
  const zero = Object.keys(TIER_ZERO).filter((t) => (data[t] || []).every((v) => !v));
  const el = document.getElementById("hint-tiers");
  el.dataset.tiers = zero.join(",");
  el.textContent = zero.length ? "0 so far: " + zero.map((t) => TIER_ZERO[t]).join("; ") + "." : "";
}

function fmt(v) {
  if (v === null || v === undefined) return "";
  if (typeof v === "number" && !Number.isInteger(v)) return v.toFixed(3);
  if (Array.isArray(v)) return v.join(", ");
  return String(v);
}

function table(name, rows, columns) {
  const el = document.getElementById("table-" + name);
  el.dataset.rows = String(rows.length);
  const head = "<tr>" + columns.map((c) => "<th>" + c + "</th>").join("") + "</tr>";
  const body = rows.map((r) => "<tr>" + columns.map((c) => {
    const v = c.endsWith("_ms") && c.startsWith("at") ? new Date(r[c]).toLocaleTimeString() : fmt(r[c]);
    const bad = (c === "breaker" && v !== "closed" && v !== "") || (c === "mode" && v === "local_only") || (c === "healthy" && v === "false");
    return "<td" + (bad ? ' class="bad"' : "") + ">" + v.replace(/</g, "&lt;") + "</td>";
  }).join("") + "</tr>").join("");
  el.innerHTML = head + body;
  hint(name, rows.length === 0);
}

async function poll() {
  const status = document.getElementById("status");
  try {
    const response = await fetch("api/snapshot", { cache: "no-store" });
    const snap = await response.json();
    fill("hit_rate", snap.series.hit_rate);
    tierZeros(snap.series.hit_rate);
    fill("traffic", snap.series.traffic);
    fill("warmup_delta", snap.series.warmup_delta);
    fill("invalidations", snap.series.invalidations);
    table("nodes", snap.nodes, ["node_id", "mode", "serving", "breaker", "window_hit_rate", "lookups", "hit_rate", "l1_entries", "pending_writes"]);
    table("drift", snap.drift, ["cluster_id", "pattern", "shard", "size", "keys", "duration_ms", "variance"]);
    table("heat", snap.heat, ["at_ms", "key", "decision", "score", "model_version"]);
    table("warmups", snap.warmups, ["at_ms", "action", "source", "keys", "tier", "reason"]);
    table("mode_changes", snap.mode_changes, ["at_ms", "node_id", "previous_mode", "mode", "reason"]);
    table("instances", snap.instances, ["gateway", "name", "healthy", "in_flight", "waiting", "blocks", "pool_blocks", "survive_ms", "ftl_base_ms", "ftl_delta_ms", "calls"]);
    table("routes", snap.routes, ["at_ms", "gateway", "instance", "reason", "conversation", "prompt_blocks", "predicted_blocks", "realised_blocks"]);
    document.getElementById("totals").textContent = Object.entries(snap.totals).map(([k, v]) => k + " " + v).join(" · ");
    status.dataset.polls = String(Number(status.dataset.polls) + 1);
    status.textContent = "live · " + snap.tiers.length + " tier node(s) · " + new Date(snap.now_ms).toLocaleTimeString();
  } catch (err) {
    status.textContent = "cannot reach the dashboard: " + err;
  }
}

makeChart("hit_rate", [
  { label: "all", column: "all" }, { label: "L1", column: "l1" }, { label: "L2", column: "l2" }, { label: "L3", column: "l3" },
]);
makeChart("traffic", [{ label: "QPS", column: "qps" }, { label: "entropy (bits)", column: "entropy_bits", scale: "bits" }]);
makeChart("warmup_delta", [{ label: "Δt ms", column: "delta_t_ms" }]);
makeChart("invalidations", [{ label: "dependants", column: "dependants" }]);
poll();
setInterval(poll, POLL_MS);
