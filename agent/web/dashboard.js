// sluice dashboard: polls the agent once a second and draws, per device
// and direction, the measured rate of each class over the last minutes
// (dygraphs) and a table of the classes' configuration and counters.
"use strict";

const charts = {};   // tree id -> Dygraph
let updates = 0;

function human(bps) {
  if (bps == null) return "";
  const units = [["Gbit", 1e9], ["Mbit", 1e6], ["kbit", 1e3]];
  for (const [u, f] of units) if (Math.abs(bps) >= f) return (bps / f).toFixed(2) + " " + u;
  return bps.toFixed(0) + " bit";
}
function bytes(b) {
  const units = [["GB", 1e9], ["MB", 1e6], ["kB", 1e3]];
  for (const [u, f] of units) if (b >= f) return (b / f).toFixed(1) + " " + u;
  return b + " B";
}
function ago(t) {
  if (!t || t.startsWith("0001")) return "never";
  const s = (Date.now() - Date.parse(t)) / 1000;
  return s < 1 ? "just now" : s.toFixed(0) + " s ago";
}
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const k of kids) e.append(k);
  return e;
}
function treeID(t) { return (t.interface + "-" + t.direction).replace(/[^A-Za-z0-9_-]/g, "_"); }

function drawHealth(h) {
  document.getElementById("policy").textContent =
    h.policy + (h.netns ? " in netns " + h.netns : "") + " · every " + h.interval_s + " s";
  const b = document.getElementById("health");
  b.replaceChildren(
    el("span", {class: h.last_result === "error" ? "bad" : "good", id: "last-result"},
       "last pass: " + h.last_result + ", " + ago(h.last_reconcile) + " (" + (h.apply_seconds * 1000).toFixed(0) + " ms)"),
    el("span", {id: "passes"}, h.reconciles + " passes"),
    el("span", {class: h.repairs ? "warn" : "", id: "repairs"}, h.repairs + " repairs" + (h.repairs ? ", last " + ago(h.last_repair) : "")),
    el("span", {class: h.reload_error ? "bad" : "", id: "reload"}, "last reload: " + ago(h.last_reload)),
  );
  if (h.waiting && h.waiting.length) b.append(el("span", {class: "warn"}, "waiting for " + h.waiting.join(", ")));
  const re = document.getElementById("reload-error");
  re.hidden = !h.reload_error;
  re.textContent = h.reload_error ? "policy refused, the one in force stays:\n" + h.reload_error : "";
  const le = document.getElementById("last-error");
  le.hidden = !h.last_error;
  le.textContent = h.last_error ? "last pass failed:\n" + h.last_error : "";
}

function section(t) {
  const id = treeID(t);
  let s = document.getElementById("tree-" + id);
  if (s) return s;
  s = el("section", {id: "tree-" + id, class: "tree"},
    el("h2", {}, t.interface + " " + t.direction + (t.device !== t.interface ? " (on " + t.device + ")" : "")),
    el("div", {class: "chart", id: "chart-" + id}),
    el("div", {class: "legend", id: "legend-" + id}),
    el("div", {class: "table", id: "table-" + id}),
    el("div", {class: "sharing", id: "sharing-" + id}),
    el("div", {class: "policers", id: "policers-" + id}));
  document.getElementById("trees").append(s);
  return s;
}

function drawTable(t, omitted) {
  const id = treeID(t);
  const head = el("tr", {}, ...["class", "id", "rate", "ceil", "measured", "sent", "drops", "overlimits", "backlog"].map(h => el("th", {}, h)));
  const rows = t.classes.map(c => el("tr", {"data-class": c.name},
    el("td", {class: "name"}, "  ".repeat(c.depth) + c.name),
    el("td", {}, c.id), el("td", {}, human(c.rate_bps)), el("td", {}, human(c.ceil_bps)),
    el("td", {class: "measured"}, human(c.measured_bps)), el("td", {}, bytes(c.bytes)),
    el("td", {class: c.drops ? "red" : ""}, String(c.drops)), el("td", {}, String(c.overlimits)),
    el("td", {}, bytes(c.backlog_bytes))));
  const table = el("table", {}, el("thead", {}, head), el("tbody", {}, ...rows));
  const box = document.getElementById("table-" + id);
  box.replaceChildren(table);
  if (t.missing) box.prepend(el("p", {class: "red"}, "the kernel no longer has this tree; the agent will put it back"));
  if (omitted) box.append(el("p", {class: "muted"}, omitted + " per-host classes not listed (see /api/v1/status)"));
  const pol = document.getElementById("policers-" + id);
  if (!t.policers || !t.policers.length) { pol.replaceChildren(); return; }
  pol.replaceChildren(el("table", {},
    el("thead", {}, el("tr", {}, ...["policer", "green", "yellow", "red (dropped)"].map(h => el("th", {}, h)))),
    el("tbody", {}, ...t.policers.map(p => el("tr", {},
      el("td", {}, p.class),
      el("td", {class: "green"}, p.green.packets + " pkts"),
      el("td", {class: "yellow"}, p.yellow.packets + " pkts"),
      el("td", {class: "red"}, p.red.packets + " pkts"))))));
}

// drawSharing lists what the sharing controllers last decided: each
// class's weight, usage, demand, share and the limit in force.
function drawSharing(t) {
  const box = document.getElementById("sharing-" + treeID(t));
  if (!t.sharing || !t.sharing.length) { box.replaceChildren(); return; }
  box.replaceChildren(el("table", {},
    el("thead", {}, el("tr", {}, ...["sharing", "weight", "usage", "demand", "share", "limit"].map(h => el("th", {}, h)))),
    el("tbody", {}, ...t.sharing.map(s => el("tr", {"data-class": s["class"]},
      el("td", {class: "name"}, (s.owner ? s.owner + " / " : "") + s["class"] + (s.prod ? " (prod)" : "")),
      el("td", {}, String(+s.weight.toPrecision(4))),
      el("td", {}, human(s.usage_bps)),
      el("td", {}, human(s.demand_bps) + (s.hungry ? " (held back)" : "")),
      el("td", {}, human(s.share_bps)),
      el("td", {class: s.applied ? "warn" : "muted"}, s.applied ? human(s.limit_bps) + (s.assured ? " (rate)" : " (ceil)") : "none (ceil " + human(s.ceil_bps) + ")"))))));
}

// drawChart draws each class's measured rate and, for classes under a
// sharing controller, the limit it keeps them at (as "CLASS limit").
function drawChart(t, hist) {
  const id = treeID(t);
  const series = hist.series.filter(s => s.interface === t.interface && s.direction === t.direction && s.class !== "(root)" &&
    (!s.kind || s.kind === "limit"));
  if (!series.length || hist.at.length < 2) return;
  const rows = hist.at.map((at, i) => [new Date(at * 1000), ...series.map(s => s.bps[i] == null ? null : s.bps[i] / 1e6)]);
  const labels = ["time", ...series.map(s => s.kind ? s.class + " " + s.kind : s.class)];
  const box = document.getElementById("chart-" + id);
  box.dataset.points = String(rows.length);
  box.dataset.series = String(series.length);
  // Rates orders of magnitude apart (a 160 kbit class beside 12 Mbit
  // ones) vanish on a linear axis: beyond 30:1 the axis is logarithmic.
  const rates = (t.classes || []).filter(c => c.name !== "(root)" && c.rate_bps > 0).map(c => c.rate_bps);
  const log = rates.length > 1 && Math.max(...rates) / Math.min(...rates) > 30;
  box.dataset.scale = log ? "log" : "linear";
  const g = charts[id];
  if (g && g.getLabels().join("\0") === labels.join("\0") && g.getOption("logscale") === log) {
    g.updateOptions({file: rows});
    return;
  }
  if (g) g.destroy();
  charts[id] = new Dygraph(box, rows, {
    labels, ylabel: log ? "Mbit/s (log)" : "Mbit/s", includeZero: !log, logscale: log, legend: "always",
    labelsDiv: document.getElementById("legend-" + id), labelsSeparateLines: false,
    strokeWidth: 1.6, animatedZooms: false, xAxisLabelWidth: 64, axes: {x: {pixelsPerLabel: 80}},
  });
}

async function refresh() {
  try {
    const [sr, hr] = await Promise.all([fetch("/api/v1/status?hosts=0"), fetch("/api/v1/history")]);
    if (!sr.ok || !hr.ok) throw new Error("agent answered " + sr.status + "/" + hr.status);
    const st = await sr.json(), hist = await hr.json();
    drawHealth(st.health);
    const trees = (st.sample && st.sample.trees) || [];
    if (trees.length) {
      const p = document.querySelector("#trees > p.muted");
      if (p) p.remove();
    }
    for (const t of trees) {
      section(t);
      drawTable(t, t.host_classes_omitted);
      drawSharing(t);
      drawChart(t, hist);
    }
    updates++;
    document.body.dataset.updates = String(updates);
  } catch (e) {
    const le = document.getElementById("last-error");
    le.hidden = false;
    le.textContent = "cannot reach the agent: " + e.message;
  }
}

refresh();
setInterval(refresh, 1000);
