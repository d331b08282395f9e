// sluice dashboard: polls the agent once a second. Three views, by the
// page's hash:
//   (none)        per device and direction, each class's measured rate
//                 over the last minutes against the link's rate, its
//                 drops and backlog, and a table of the classes with a
//                 meter of measured against rate and ceil;
//   #hosts        the per-host classes, busiest first, with a search
//                 (the top talkers);
//   #host=ADDR    one host's page: its classes in each tree, charted
//                 against their rate and ceil, with drops and backlog.
"use strict";

const charts = {};   // chart div id -> Dygraph
let updates = 0;

// bits is a rate in bytes/s (the API's unit) in bit/s, for display.
const bits = x => x == null ? x : x * 8;

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
function safeID(s) { return s.replace(/[^A-Za-z0-9_-]/g, "_"); }
function count(n) { return n >= 100 ? n.toFixed(0) : n >= 10 ? n.toFixed(1) : n.toFixed(2); }

// view is what the hash asks for: classes, hosts, or one host.
// #hosts?q=SEARCH&sort=KEY opens the hosts with a search (a link one
// can share).
function view() {
  const h = location.hash.slice(1);
  if (h === "hosts" || h.startsWith("hosts?")) return {name: "hosts", params: new URLSearchParams(h.slice(6))};
  if (h.startsWith("host=")) return {name: "host", host: decodeURIComponent(h.slice(5))};
  return {name: "classes"};
}

// fromHash puts a hosts link's search and sort into the form.
function fromHash() {
  const v = view();
  if (v.name !== "hosts") return;
  if (v.params.has("q")) document.getElementById("hosts-search").value = v.params.get("q");
  const sort = v.params.get("sort");
  if (sort && [...document.getElementById("hosts-sort").options].some(o => o.value === sort)) document.getElementById("hosts-sort").value = sort;
}

// meter draws measured against ceil, with a tick where the rate is: a
// class above its rate is borrowing, at its ceil it is capped.
function meter(measured, rate, ceil) {
  const top = Math.max(ceil || 0, rate || 0, measured || 0);
  const box = el("span", {class: "meter", title: "measured " + human(measured) + " of rate " + human(rate) + ", ceil " + human(ceil)});
  if (!top) return box;
  const fill = el("span", {class: "fill" + (measured > rate * 1.02 ? " borrowing" : "")});
  fill.style.width = Math.min(100, 100 * measured / top).toFixed(1) + "%";
  const tick = el("span", {class: "tick"});
  tick.style.left = Math.min(100, 100 * rate / top).toFixed(1) + "%";
  box.append(fill, tick);
  return box;
}

function show(name) {
  for (const id of ["trees", "hosts-view", "host-view"]) document.getElementById(id).hidden = true;
  document.getElementById(name).hidden = false;
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("here", a.dataset.view === view().name);
}

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
    el("div", {class: "chart small", id: "queue-" + id}),
    el("div", {class: "legend", id: "queue-legend-" + id}),
    el("div", {class: "table", id: "table-" + id}),
    el("div", {class: "sharing", id: "sharing-" + id}),
    el("div", {class: "policers", id: "policers-" + id}));
  document.getElementById("trees").append(s);
  return s;
}

// roundTrip shows a class's passive round trips (rtt: on): p50 | p95,
// or how few samples there are.
function roundTrip(r) {
  if (!r) return "";
  if (r.samples < 10) return r.samples + " samples";
  return ms(r.p50_seconds) + " | " + ms(r.p95_seconds);
}

function ms(s) { return (s * 1000).toFixed(s < 0.01 ? 2 : 1) + " ms"; }

function drawTable(t, omitted) {
  const id = treeID(t);
  const rtt = t.classes.some(c => c.rtt);
  const heads = ["class", "id", "rate", "ceil", "measured", "of rate | ceil", "sent", "drops", "overlimits", "backlog"];
  // queue now: sluice's own part of the round trips, what the class's
  // queue holds a packet now; the rest is the path's.
  if (rtt) heads.push("round trip p50 | p95", "queue now");
  const head = el("tr", {}, ...heads.map(h => el("th", {}, h)));
  const rows = t.classes.map(c => el("tr", {"data-class": c.name},
    el("td", {class: "name"}, "  ".repeat(c.depth) + c.name),
    el("td", {}, c.id), el("td", {}, human(bits(c.rate_bytes_per_second))), el("td", {}, human(bits(c.ceil_bytes_per_second))),
    el("td", {class: "measured"}, human(bits(c.measured_bytes_per_second))), el("td", {}, meter(bits(c.measured_bytes_per_second), bits(c.rate_bytes_per_second), bits(c.ceil_bytes_per_second))), el("td", {}, bytes(c.bytes)),
    el("td", {class: c.drops ? "red" : ""}, String(c.drops)), el("td", {}, String(c.overlimits)),
    el("td", {}, bytes(c.backlog_bytes)),
    ...(rtt ? [el("td", {class: "rtt"}, roundTrip(c.rtt)),
      el("td", {class: "queue"}, c.queue_delay_seconds == null ? "-" : ms(c.queue_delay_seconds))] : [])));
  const table = el("table", {}, el("thead", {}, head), el("tbody", {}, ...rows));
  const box = document.getElementById("table-" + id);
  box.replaceChildren(table);
  if (t.missing) box.prepend(el("p", {class: "red"}, "the kernel no longer has this tree; the agent will put it back"));
  if (omitted) box.append(el("p", {class: "muted"}, omitted + " per-host classes not listed: ", el("a", {href: "#hosts"}, "see the hosts")));
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
      el("td", {}, human(bits(s.usage_bytes_per_second))),
      el("td", {}, human(bits(s.demand_bytes_per_second)) + (s.hungry ? " (held back)" : "")),
      el("td", {}, human(bits(s.share_bytes_per_second))),
      el("td", {class: s.applied ? "warn" : "muted"}, s.applied ? human(bits(s.limit_bytes_per_second)) + (s.assured ? " (rate)" : " (ceil)") : "none (ceil " + human(bits(s.ceil_bytes_per_second)) + ")"))))));
}

// plot draws (or updates) a Dygraph in the div id from rows; it is
// rebuilt only when its series or options change.
function plot(id, rows, labels, opts) {
  const box = document.getElementById(id);
  box.dataset.points = String(rows.length);
  box.dataset.series = String(labels.length - 1);
  const sig = labels.join("\0") + "\0" + JSON.stringify(opts);
  const g = charts[id];
  if (g && g.sig === sig) {
    g.updateOptions({file: rows});
    return;
  }
  if (g) g.destroy();
  charts[id] = new Dygraph(box, rows, Object.assign({
    labels, legend: "always", labelsSeparateLines: false, strokeWidth: 1.6, animatedZooms: false,
    xAxisLabelWidth: 64, axes: {x: XAXIS},
  }, opts));
  charts[id].sig = sig;
}

// rows turns history series into Dygraph rows; the extra columns hold a
// constant each (reference lines: rate, ceil).
function rows(hist, series, value, extra) {
  return hist.at.map((at, i) => [new Date(at * 1000),
    ...series.map(s => { const v = s.values[i]; return v == null ? null : value(v); }),
    ...(extra || [])]);
}

const DASHED = [6, 4];
// Times as the clock says them, whatever the span (dygraphs writes
// seconds with decimals for a span of a few seconds).
const XAXIS = {pixelsPerLabel: 80, axisLabelFormatter: d => d instanceof Date ? d.toTimeString().slice(0, 8) : String(d)};

// drawChart draws each class's measured rate and, for classes under a
// sharing controller, the limit it keeps them at (as "CLASS limit"),
// against the link's rate (dashed); below, each class's drops per
// second and backlog.
function drawChart(t, hist) {
  const id = treeID(t);
  const mine = s => s.interface === t.interface && s.direction === t.direction && s.class !== "(root)" && !s["class"].includes("/");
  const series = hist.series.filter(s => mine(s) && (!s.kind || s.kind === "limit"));
  if (!series.length || hist.at.length < 2) return;
  const root = (t.classes || []).find(c => c.name === "(root)");
  const link = root && root.ceil_bytes_per_second ? [bits(root.ceil_bytes_per_second) / 1e6] : [];
  const labels = ["time", ...series.map(s => s.kind ? s.class + " " + s.kind : s.class), ...(link.length ? ["link rate"] : [])];
  // Rates orders of magnitude apart (a 160 kbit class beside 12 Mbit
  // ones) vanish on a linear axis: beyond 30:1 the axis is logarithmic.
  const rates = (t.classes || []).filter(c => c.name !== "(root)" && bits(c.rate_bytes_per_second) > 0).map(c => bits(c.rate_bytes_per_second));
  const log = rates.length > 1 && Math.max(...rates) / Math.min(...rates) > 30;
  document.getElementById("chart-" + id).dataset.scale = log ? "log" : "linear";
  plot("chart-" + id, rows(hist, series, v => v * 8 / 1e6, link), labels, {
    ylabel: log ? "Mbit/s (log)" : "Mbit/s", includeZero: !log, logscale: log,
    labelsDiv: document.getElementById("legend-" + id),
    series: {"link rate": {strokePattern: DASHED, color: "#888", strokeWidth: 1}},
  });
  drawQueue("queue-" + id, hist, s => mine(s));
}

// drawQueue charts drops per second (left axis) and backlog in kB
// (right axis, dashed) of the series that pick() selects.
function drawQueue(id, hist, pick) {
  const drops = hist.series.filter(s => pick(s) && s.kind === "drops");
  const backlog = hist.series.filter(s => pick(s) && s.kind === "backlog");
  if (!drops.length && !backlog.length) return;
  const name = s => s["class"].includes("/") ? s.direction : s["class"];
  const labels = ["time", ...drops.map(s => name(s) + " drops/s"), ...backlog.map(s => name(s) + " backlog kB")];
  const data = hist.at.map((at, i) => [new Date(at * 1000),
    ...drops.map(s => s.values[i]), ...backlog.map(s => s.values[i] == null ? null : s.values[i] / 1000)]);
  const series = {};
  for (const s of backlog) series[name(s) + " backlog kB"] = {axis: "y2", strokePattern: DASHED};
  plot(id, data, labels, {
    ylabel: "drops/s", y2label: "backlog kB", includeZero: true, series,
    axes: {x: XAXIS, y2: {independentTicks: true, axisLabelWidth: 60}},
    labelsDiv: document.getElementById(id.replace(/^queue-/, "queue-legend-")),
  });
}

// drawHosts lists the top talkers that match the search.
function drawHosts(h) {
  const box = document.getElementById("hosts-table");
  document.getElementById("hosts-count").textContent = h.matched === h.total ?
    h.total + " per-host classes" : h.matched + " of " + h.total + " per-host classes match";
  if (!h.hosts.length) {
    box.replaceChildren(el("p", {class: "muted"}, h.total ? "no host matches" : "this policy has no per-host classes"));
    return;
  }
  box.replaceChildren(hostTable("hosts-list", h.hosts));
}

// hostTable is a table of per-host rows, with their round trips where
// any row has them.
function hostTable(id, hosts) {
  const rtt = hosts.some(r => r.rtt);
  const heads = ["host", "class", "device", "rate", "ceil", "measured", "of rate | ceil", "sent", "drops", "backlog"];
  if (rtt) heads.push("round trip p50 | p95");
  const head = el("tr", {}, ...heads.map(x => el("th", {}, x)));
  return el("table", {id}, el("thead", {}, head), el("tbody", {}, ...hosts.map(r => el("tr", {"data-host": r.host},
    el("td", {}, el("a", {href: "#host=" + encodeURIComponent(r.host)}, r.host)),
    el("td", {class: "name"}, r.parent), el("td", {}, r.interface + " " + r.direction),
    el("td", {}, human(bits(r.rate_bytes_per_second))), el("td", {}, human(bits(r.ceil_bytes_per_second))),
    el("td", {class: "measured"}, human(bits(r.measured_bytes_per_second))), el("td", {}, meter(bits(r.measured_bytes_per_second), bits(r.rate_bytes_per_second), bits(r.ceil_bytes_per_second))),
    el("td", {}, bytes(r.bytes)), el("td", {class: r.drops ? "red" : ""}, String(r.drops)), el("td", {}, bytes(r.backlog_bytes)),
    ...(rtt ? [el("td", {class: "rtt"}, roundTrip(r.rtt))] : [])))));
}

// drawLatency lists the hosts with the longest round trips (p95), beside
// the top talkers; hidden where no host has enough samples.
function drawLatency(h) {
  const worst = h.hosts.filter(r => r.rtt && r.rtt.samples >= 10);
  document.getElementById("latency").hidden = !worst.length;
  document.getElementById("latency-table").replaceChildren(worst.length ? hostTable("latency-list", worst) : "");
}

// drawHost draws one host's page: per tree it is in, its measured rate
// against its rate and ceil, its drops and backlog, and its counters.
function drawHost(host, h, hist) {
  document.getElementById("host-title").textContent = host;
  const box = document.getElementById("host-trees");
  if (!h.hosts.length) {
    box.replaceChildren(el("p", {class: "red"}, "no per-host class for " + host + " in the last reading"));
    return;
  }
  for (const r of h.hosts) {
    const id = safeID(r.interface + "-" + r.direction);
    if (!document.getElementById("host-" + id)) {
      box.append(el("section", {id: "host-" + id, class: "tree"},
        el("h2", {}, r.interface + " " + r.direction + ": " + r["class"] + " (" + r.id + ")"),
        el("div", {class: "chart", id: "hchart-" + id}), el("div", {class: "legend", id: "hlegend-" + id}),
        el("div", {class: "chart small", id: "queue-h" + id}), el("div", {class: "legend", id: "queue-legend-h" + id}),
        el("div", {class: "table", id: "htable-" + id})));
    }
    const heads = ["rate", "ceil", "measured", "of rate | ceil", "sent", "drops", "backlog"];
    if (r.rtt) heads.push("round trip p50 | p95", "p99", "samples");
    document.getElementById("htable-" + id).replaceChildren(el("table", {},
      el("thead", {}, el("tr", {}, ...heads.map(x => el("th", {}, x)))),
      el("tbody", {}, el("tr", {}, el("td", {}, human(bits(r.rate_bytes_per_second))), el("td", {}, human(bits(r.ceil_bytes_per_second))),
        el("td", {class: "measured"}, human(bits(r.measured_bytes_per_second))), el("td", {}, meter(bits(r.measured_bytes_per_second), bits(r.rate_bytes_per_second), bits(r.ceil_bytes_per_second))),
        el("td", {}, bytes(r.bytes)), el("td", {class: r.drops ? "red" : ""}, String(r.drops)), el("td", {}, bytes(r.backlog_bytes)),
        ...(r.rtt ? [el("td", {class: "rtt"}, roundTrip(r.rtt)), el("td", {}, r.rtt.samples < 10 ? "" : ms(r.rtt.p99_seconds)), el("td", {}, String(r.rtt.samples))] : [])))),
      el("p", {class: "muted"}, r.rtt ?
        "Round trips are timed from the host's own TCP packets (rtt: on), through sluice's queue and the path, since the classifier was loaded; the chart shows each second's mean." :
        "Round trips are timed where the interface has rtt: on (docs/policy.md); sluice lab measures latency under load (docs/lab.md)."));
    const mine = s => s.interface === r.interface && s.direction === r.direction && s["class"] === r["class"];
    const rate = hist.series.filter(s => mine(s) && !s.kind);
    if (!rate.length || hist.at.length < 2) {
      document.getElementById("hchart-" + id).dataset.points = "0";
      continue;
    }
    // Only the passes since the page asked: before, the host was not kept.
    const first = rate[0].values.findIndex(v => v != null);
    const cut = {at: hist.at.slice(first), series: hist.series.filter(mine).map(s => Object.assign({}, s,
      {values: s.values.slice(first)}))};
    plot("hchart-" + id, rows(cut, cut.series.filter(s => !s.kind), v => v * 8 / 1e6, [bits(r.rate_bytes_per_second) / 1e6, bits(r.ceil_bytes_per_second) / 1e6]),
      ["time", "measured", "rate", "ceil"], {
        ylabel: "Mbit/s", includeZero: true, labelsDiv: document.getElementById("hlegend-" + id),
        series: {rate: {strokePattern: DASHED, color: "#1a7f37", strokeWidth: 1}, ceil: {strokePattern: DASHED, color: "#cf222e", strokeWidth: 1}},
      });
    drawQueue("queue-h" + id, cut, () => true);
    const rtt = cut.series.filter(s => s.kind === "rtt");
    if (rtt.length) {
      if (!document.getElementById("rtt-h" + id)) {
        document.getElementById("htable-" + id).before(el("div", {class: "chart small", id: "rtt-h" + id}), el("div", {class: "legend", id: "rtt-legend-h" + id}));
      }
      plot("rtt-h" + id, cut.at.map((at, i) => [new Date(at * 1000), rtt[0].values[i] == null ? null : rtt[0].values[i] * 1000]),
        ["time", "round trip ms"], {ylabel: "ms", includeZero: true, connectSeparatedPoints: true, axes: {x: XAXIS},
          labelsDiv: document.getElementById("rtt-legend-h" + id)});
    }
  }
}

async function getJSON(url) {
  const r = await fetch(url);
  if (!r.ok) throw new Error(url + ": the agent answered " + r.status);
  return r.json();
}

async function refresh() {
  try {
    const v = view();
    show(v.name === "classes" ? "trees" : v.name + "-view");
    if (v.name === "hosts") {
      const q = document.getElementById("hosts-search").value, sort = document.getElementById("hosts-sort").value;
      const [st, h, worst] = await Promise.all([getJSON("/api/v1/status?hosts=0"),
        getJSON("/api/v1/hosts?limit=25&sort=" + sort + (q ? "&q=" + encodeURIComponent(q) : "")),
        getJSON("/api/v1/hosts?limit=10&sort=rtt" + (q ? "&q=" + encodeURIComponent(q) : ""))]);
      drawHealth(st.health);
      drawHosts(h);
      drawLatency(worst);
    } else if (v.name === "host") {
      const [st, h, hist] = await Promise.all([getJSON("/api/v1/status?hosts=0"),
        getJSON("/api/v1/hosts?host=" + encodeURIComponent(v.host)), getJSON("/api/v1/history")]);
      drawHealth(st.health);
      drawHost(v.host, h, hist);
    } else {
      const [st, hist] = await Promise.all([getJSON("/api/v1/status?hosts=0"), getJSON("/api/v1/history")]);
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
    }
    document.getElementById("last-error").hidden = true;
    updates++;
    document.body.dataset.updates = String(updates);
  } catch (e) {
    const le = document.getElementById("last-error");
    le.hidden = false;
    le.textContent = "cannot reach the agent: " + e.message;
  }
}

window.addEventListener("hashchange", () => {
  fromHash();
  // A new host's page starts empty: its charts are the new host's.
  document.getElementById("host-trees").replaceChildren();
  for (const id of Object.keys(charts)) if (id.startsWith("hchart-") || id.startsWith("queue-h") || id.startsWith("rtt-h")) { charts[id].destroy(); delete charts[id]; }
  refresh();
});
document.getElementById("hosts-search").addEventListener("input", () => refresh());
document.getElementById("hosts-sort").addEventListener("change", () => refresh());
fromHash();
refresh();
setInterval(refresh, 1000);
