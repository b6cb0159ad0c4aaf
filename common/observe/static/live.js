// The live page: polls /api/state (new rows only) and redraws; read-only, same origin, no inline script.
"use strict";
(function () {
  const rows = [];
  let refresh = 2000, timer = null, charts = {}, lastState = null, plane = null, planeAsked = false;
  const $ = (id) => document.getElementById(id);
  const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2"];
  const STATE_COLOUR = { live: "#16a34a", rejoined: "#16a34a", late: "#d97706", lost: "#dc2626", waiting: "#9ca3af",
                         unknown: "#cbd5e1", done: "#64748b" };
  const TRUST_STROKE = { trusted: "#1d4ed8", untrusted: "#7f1d1d" };
  const openGroups = {};  // edge -> whether the user opened its devices table (kept across redraws)
  const SNAPSHOT = $("hfl-snapshot");  // live.html: the final state embedded, no server

  function fmtBytes(n) {
    if (n == null) return "-";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return (i ? n.toFixed(1) : Math.round(n)) + " " + units[i];
  }
  function fmtSeconds(s) {
    if (s == null) return "-";
    if (s < 120) return s.toFixed(1) + " s";
    const m = Math.floor(s / 60);
    return m < 120 ? m + " min " + Math.round(s % 60) + " s" : (s / 3600).toFixed(1) + " h";
  }
  function tick(v) {  // an axis label that fits: 1.2e+12, 0.00031 -> 3.1e-4, 1587.4
    if (v == null) return "";
    const a = Math.abs(v);
    return a >= 1e5 || (a > 0 && a < 1e-3) ? v.toExponential(2) : String(+v.toPrecision(6));
  }
  function pct(x) { return x == null ? "-" : (100 * x).toFixed(2) + "%"; }
  function text(el, value) { el.textContent = value == null ? "-" : String(value); }
  function cell(tr, value, cls) {
    const td = document.createElement("td");
    td.textContent = value == null ? "-" : String(value);
    if (cls) td.className = cls;
    tr.appendChild(td);
  }

  function makeChart(id, series, xLabel) {
    const el = $(id);
    const width = Math.max(320, el.clientWidth || 520);
    const opts = {
      width: width, height: 230,
      scales: { x: { time: false } },
      axes: [xLabel === "round" ? { label: xLabel, incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000] }
                                : { label: xLabel }, { size: 84, values: (u, splits) => splits.map(tick) }],
      series: [{ label: xLabel }].concat(series.map((s, i) => ({
        label: s.label, stroke: COLORS[i % COLORS.length], width: 2, spanGaps: true,
        points: { show: true, size: 5 }, scale: s.scale || "y",
      }))),
      legend: { show: true, live: false },  // series names, not the hovered values ("--" until a hover)
    };
    const data = [[]].concat(series.map(() => []));
    return { plot: new uPlot(opts, data, el), series: series, el: el };
  }

  function seriesFor(keys, labels) {
    return keys.filter((k) => rows.some((r) => r[k] != null)).map((k) => ({ key: k, label: labels[k] || k }));
  }

  function draw(chartId, xKey, keys, labels, xLabel, scale) {
    const series = seriesFor(keys, labels);
    if (!series.length) return;
    let c = charts[chartId];
    if (!c || c.series.map((s) => s.key).join() !== series.map((s) => s.key).join()) {
      if (c) c.plot.destroy();
      c = charts[chartId] = makeChart(chartId, series, xLabel);
    }
    const pts = rows.filter((r) => r[xKey] != null);
    const data = [pts.map((r) => r[xKey])]  // rounds from 0, as in metrics.jsonl and the run's PNGs
      .concat(series.map((s) => pts.map((r) => r[s.key] == null ? null : r[s.key] * (scale || 1))));
    c.plot.setData(data);
    c.el.dataset.points = String(pts.length);
  }

  function drawCharts() {
    const accKeys = ["accuracy", "accuracy_reference", "accuracy_device_mean"];
    const accLabels = { accuracy: "accuracy (%)", accuracy_reference: "reference device (%)",
                        accuracy_device_mean: "mean of devices (%)" };
    draw("chart-accuracy", "round", accKeys, accLabels, "round", 100);
    draw("chart-loss", "round", ["loss", "train_loss"], { loss: "test loss", train_loss: "train loss" }, "round");
    draw("chart-emulated", "emulated_seconds", accKeys, accLabels, "emulated s", 100);
    const figure = $("figure"), keys = new Set();
    for (const r of rows) for (const [k, v] of Object.entries(r)) if (typeof v === "number" && k !== "round") keys.add(k);
    const sorted = [...keys].sort();
    if (sorted.join() !== [...figure.options].map((o) => o.value).join()) {
      const chosen = figure.value || (keys.has("epsilon_max") ? "epsilon_max" : keys.has("activity_rate") ? "activity_rate" : "round_seconds");
      figure.replaceChildren(...sorted.map((k) => new Option(k, k, false, k === chosen)));
    }
    if (figure.value) draw("chart-figure", "round", [figure.value], {}, "round");
    draw("chart-bytes", "round", ["bytes_up", "bytes_down"], { bytes_up: "KiB up", bytes_down: "KiB down" }, "round",
         1 / 1024);
  }

  function drawNodes(nodes) {
    const body = $("nodes").tBodies[0];
    body.replaceChildren();
    for (const n of nodes) {
      const tr = document.createElement("tr");
      cell(tr, n.id);
      cell(tr, n.state, "state-" + n.state);
      cell(tr, n.trust);
      cell(tr, ago(n.last_seen_s));
      cell(tr, n.refused);
      cell(tr, n.devices);
      cell(tr, n.dropped);
      cell(tr, n.restarts);
      cell(tr, n.emulated_seconds == null ? null : n.emulated_seconds.toFixed(3));
      cell(tr, n.fusion_weight == null ? null : Number(n.fusion_weight).toPrecision(4));
      body.appendChild(tr);
    }
  }

  function ago(s) { return s == null ? "never" : s < 1 ? "now" : s + " s ago"; }

  function deviceStates(groups) {
    const out = {};
    for (const g of groups || []) for (const d of g.devices) out[d.id] = d.state;
    return out;
  }

  // one table per edge, collapsed by default when the run has many devices
  function drawDevices(groups) {
    const el = $("devices");
    const total = groups.reduce((n, g) => n + g.devices.length, 0);
    el.dataset.devices = String(total);
    el.replaceChildren(...groups.map((g) => {
      const det = document.createElement("details");
      det.className = "devices";
      det.dataset.edge = g.edge;
      det.open = g.edge in openGroups ? openGroups[g.edge] : total <= 24;
      det.addEventListener("toggle", () => { openGroups[g.edge] = det.open; });
      const counts = {};
      for (const d of g.devices) counts[d.state] = (counts[d.state] || 0) + 1;
      const summary = document.createElement("summary");
      summary.textContent = g.edge + ": " + Object.entries(counts).map(([k, v]) => v + " " + k).join(", ") +
        (g.round == null ? " (no report yet)" : " (as of round " + g.round + ")");
      const table = document.createElement("table");
      const head = table.createTHead().insertRow();
      for (const h of ["device", "state", "last seen", "refused", "round time", "rejoins"]) {
        const th = document.createElement("th");
        th.textContent = h;
        head.appendChild(th);
      }
      const body = table.createTBody();
      for (const d of g.devices) {
        const tr = body.insertRow();
        tr.dataset.device = d.id;
        tr.dataset.state = d.state;
        cell(tr, d.id);
        cell(tr, d.state, "state-" + d.state);
        cell(tr, d.state === "unknown" ? null : ago(d.last_seen_s));
        cell(tr, d.refused);
        cell(tr, d.round_s == null ? null : d.round_s.toFixed(2) + " s");
        cell(tr, d.rejoins);
      }
      det.append(summary, table);
      return det;
    }));
  }

  function keyValues(table, obj, fmt) {
    const body = table.tBodies[0] || table.createTBody();
    body.replaceChildren();
    const keys = Object.keys(obj || {});
    if (!keys.length) { const tr = document.createElement("tr"); cell(tr, "none"); body.appendChild(tr); }
    for (const k of keys) { const tr = document.createElement("tr"); cell(tr, k); cell(tr, fmt ? fmt(obj[k]) : obj[k]); body.appendChild(tr); }
  }

  function drawPrivacy(p) {
    const el = $("privacy");
    if (!p) {
      const claims = rows.filter((r) => r.epsilon_claimed != null);
      el.textContent = claims.length  // relay (paper 004): the DP quantizer's figure, no accountant
        ? "paper's claim: epsilon " + Number(claims[claims.length - 1].epsilon_claimed).toPrecision(4) +
          " per upload (the paper's arithmetic for the DP quantizer: a claim, not a measurement; no accountant in this mode)"
        : "no DP noise in this run";
      el.className = claims.length ? "claim" : "";
      return;
    }
    el.className = "";
    el.replaceChildren();
    const add = (label, value, cls) => {
      const div = document.createElement("div");
      div.textContent = label + ": " + (value == null ? "-" : value);
      if (cls) div.className = cls;
      el.appendChild(div);
    };
    const g = (x) => x == null ? "-" : Number(x).toPrecision(4);
    add("epsilon max (accountant)", g(p.epsilon_max), p.budget_exceeded ? "warn" : null);
    add("epsilon mean (accountant)", g(p.epsilon_mean));
    add("budget", g(p.epsilon_budget) + ", delta " + g(p.delta) + (p.budget_exceeded ? " (exceeded)" : ""));
    add("calibration / accountant / placement", [p.calibration, p.accountant, p.placement].join(" / "));
    add("edge trust", Object.entries(p.trust || {}).map(([e, t]) => e + " " + t).join(", "));
    const parties = p.by_party || {};
    if (Object.keys(parties).length) {  // per cluster: the accountant's epsilon against each party
      const table = document.createElement("table");
      table.className = "parties";
      const head = table.createTHead().insertRow();
      for (const h of ["cluster", "against the cloud", "against its edge", "against outsiders"]) {
        const th = document.createElement("th"); th.textContent = h; head.appendChild(th);
      }
      const body = table.createTBody();
      const e = (x) => x === "inf" ? "inf (no guarantee)" : g(x);
      for (const [edge, v] of Object.entries(parties)) {
        const tr = body.insertRow();
        for (const x of [edge, e(v.cloud), e(v.edge), e(v.outsiders)]) tr.insertCell().textContent = x;
      }
      el.appendChild(table);
    }
    if (p.claimed) add("paper's claim: epsilon " + p.claimed.values.map(g).join(", "), p.claimed.label, "claim");
    for (const c of p.caveats || []) add("caveat", c, "warn");
    $("device-eps").hidden = false;
  }

  function svg(tag, attrs, parent) {
    const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
    if (parent) parent.appendChild(el);
    return el;
  }

  function drawTopology(topo, nodes, devices) {
    const state = Object.fromEntries(nodes.map((n) => [n.id, n.state]));
    const dState = deviceStates(devices);
    const colour = STATE_COLOUR;
    const edges = topo.edges, width = Math.max(520, edges.length * 140), height = 190;
    const root = svg("svg", { width: width, height: height, viewBox: `0 0 ${width} ${height}`, role: "img" });
    const cx = width / 2;
    svg("rect", { x: cx - 40, y: 8, width: 80, height: 26, rx: 5, fill: "#1d4ed8" }, root);
    svg("text", { x: cx, y: 26, "text-anchor": "middle", fill: "#fff" }, root).textContent = "cloud";
    edges.forEach((e, i) => {
      const x = (i + 0.5) * width / edges.length, y = 90;
      svg("line", { x1: cx, y1: 34, x2: x, y2: y - 13, stroke: "#94a3b8" }, root);
      svg("rect", { x: x - 48, y: y - 13, width: 96, height: 26, rx: 5, fill: colour[state[e.id]] || "#9ca3af",
                    stroke: e.trust === "trusted" ? "#1d4ed8" : "#7f1d1d", "stroke-width": e.trust ? 3 : 0 }, root);
      svg("text", { x: x, y: y + 4, "text-anchor": "middle", fill: "#fff" }, root).textContent = e.id;
      if (e.trust) svg("text", { x: x, y: y + 28, "text-anchor": "middle", fill: "#374151" }, root).textContent = e.trust;
      const shown = e.devices.slice(0, 8), dx = 96 / Math.max(1, shown.length);
      shown.forEach((d, j) => {
        const px = x - 48 + (j + 0.5) * dx;
        svg("line", { x1: x, y1: y + 13, x2: px, y2: 150, stroke: "#cbd5e1" }, root);
        svg("circle", { cx: px, cy: 155, r: 5, fill: colour[dState[d]] || "#64748b" }, root).appendChild(
          svg("title", {})).textContent = d + " " + (dState[d] || "");
      });
      svg("text", { x: x, y: 178, "text-anchor": "middle", fill: "#374151" }, root).textContent =
        e.devices.length + " devices";
    });
    $("topology").replaceChildren(root);
    const m = $("medium");
    m.replaceChildren();
    if (topo.medium) {  // a small table of the medium's figures, not a dump of its keys
      const caption = document.createElement("div");
      caption.textContent = "wireless medium";
      const table = document.createElement("table");
      table.className = "medium";
      for (const [k, v] of Object.entries(topo.medium)) {
        if (v == null) continue;
        const tr = table.insertRow();
        tr.insertCell().textContent = k.replace(/_/g, " ");
        tr.insertCell().textContent = typeof v === "number" ? Number(v).toPrecision(4) : String(v);
      }
      m.append(caption, table);
    }
  }

  // The wireless medium's plane: the run's clusters up close, and the whole window with its interferers. Interferer
  // devices are one path of round dots (thousands of them); the run's devices and edges are coloured by state,
  // an edge's outline by its trust as in the topology picture.
  function planeView(pl, dState, eState, trust, zoom) {
    let x0, x1, y0, y1;
    if (zoom) {
      const xs = pl.edges.map((e) => e.x).concat(pl.devices.map((d) => d.x));
      const ys = pl.edges.map((e) => e.y).concat(pl.devices.map((d) => d.y));
      const pad = 1.15 * pl.R + 5;  // every cluster's disc of radius R in full
      [x0, x1, y0, y1] = [Math.min(...xs) - pad, Math.max(...xs) + pad, Math.min(...ys) - pad, Math.max(...ys) + pad];
    } else {
      [x0, x1, y0, y1] = [-pl.window_radius, pl.window_radius, -pl.window_radius, pl.window_radius];
    }
    const size = zoom ? 440 : 280, k = size / Math.max(x1 - x0, y1 - y0, 1e-9);
    const X = (x) => ((x - x0) * k).toFixed(1), Y = (y) => (size - (y - y0) * k).toFixed(1);
    const inside = (x, y) => x >= x0 && x <= x1 && y >= y0 && y <= y1;
    const root = svg("svg", { width: size, height: size, viewBox: `0 0 ${size} ${size}`, role: "img",
                              "data-view": zoom ? "clusters" : "window", class: "plane" });
    svg("rect", { x: 0, y: 0, width: size, height: size, fill: "#f8fafc", stroke: "#e2e8f0" }, root);
    if (!zoom) svg("circle", { cx: X(0), cy: Y(0), r: pl.window_radius * k, fill: "none", stroke: "#94a3b8",
                               "stroke-dasharray": "3 3" }, root);
    const far = pl.interferer_devices.filter(([x, y]) => inside(x, y));
    if (far.length) svg("path", { d: far.map(([x, y]) => `M${X(x)} ${Y(y)}h0`).join(""), stroke: "#cbd5e1",
                                  "stroke-width": zoom ? 4 : 2, "stroke-linecap": "round", fill: "none",
                                  class: "interferer-devices", "data-count": far.length }, root);
    const tri = (x, y, r) => `${X(x)},${(+Y(y) - r).toFixed(1)} ${(+X(x) - r).toFixed(1)},${(+Y(y) + r).toFixed(1)} ` +
                             `${(+X(x) + r).toFixed(1)},${(+Y(y) + r).toFixed(1)}`;
    for (const [x, y] of pl.interferer_edges) {
      if (inside(x, y)) svg("polygon", { points: tri(x, y, zoom ? 6 : 3), fill: "#94a3b8", class: "interferer-edge" }, root);
    }
    for (const e of pl.edges) {
      svg("circle", { cx: X(e.x), cy: Y(e.y), r: Math.max(pl.R * k, 2), fill: "none", stroke: "#93c5fd" }, root);
    }
    for (const d of pl.devices) {
      const dot = svg("circle", { cx: X(d.x), cy: Y(d.y), r: zoom ? 4.5 : 2, fill: STATE_COLOUR[dState[d.id] || "unknown"],
                                  class: "plane-device", "data-id": d.id }, root);
      svg("title", {}, dot).textContent = d.id + " (" + d.edge + "): " + (dState[d.id] || "unknown");
    }
    for (const e of pl.edges) {
      const mark = svg("polygon", { points: tri(e.x, e.y, zoom ? 9 : 5), fill: STATE_COLOUR[eState[e.id]] || "#9ca3af",
                                    stroke: TRUST_STROKE[trust[e.id]] || "#334155", "stroke-width": trust[e.id] ? 2.5 : 1,
                                    class: "plane-edge", "data-id": e.id }, root);
      svg("title", {}, mark).textContent = e.id + ": " + (eState[e.id] || "-") + (trust[e.id] ? ", " + trust[e.id] : "");
      if (zoom) svg("text", { x: +X(e.x) + 11, y: +Y(e.y) - 8, fill: "#1e293b" }, root).textContent = e.id;
    }
    if (zoom) {  // a scale bar of R metres
      const len = pl.R * k;
      svg("line", { x1: 10, y1: size - 12, x2: 10 + len, y2: size - 12, stroke: "#334155", "stroke-width": 2 }, root);
      svg("text", { x: 14 + len, y: size - 8, fill: "#334155" }, root).textContent = pl.R + " m (R)";
    } else {
      svg("text", { x: 6, y: 14, fill: "#334155" }, root).textContent = "window " + pl.window_radius + " m: " +
        pl.interferer_edges.length + " other edges, " + pl.interferer_devices_total + " devices";
    }
    return root;
  }

  function drawPlane(s) {
    const pl = s.plane || plane;
    if (!pl) return;
    const trust = Object.fromEntries(s.topology.edges.map((e) => [e.id, e.trust]));
    const eState = Object.fromEntries(s.nodes.map((n) => [n.id, n.state]));
    const dState = deviceStates(s.devices);
    $("plane-panel").hidden = false;
    $("plane").replaceChildren(planeView(pl, dState, eState, trust, true), planeView(pl, dState, eState, trust, false));
    $("plane").dataset.devices = String(pl.devices.length);
  }

  async function fetchPlane() {
    planeAsked = true;
    try {
      const res = await fetch("/api/plane", { cache: "no-store" });
      plane = (await res.json()).plane;
      if (lastState) drawPlane(lastState);
    } catch (err) { planeAsked = false; }  // asked again with the next state
  }

  function drawEnded(p, snapshot) {
    const el = $("ended");
    el.hidden = !p.ended && !snapshot;
    el.textContent = (p.ended ? "This run has ended: " + p.ended + ". " : "") + (snapshot
      ? "This page is its final state, written to " + snapshot.file + " in the run directory when the cloud stopped (" +
        snapshot.written_at + "); it no longer updates."
      : "Its cloud writes this page's final state to live.html in the run directory (it opens without a server).");
  }

  function render(s) {
    const p = s.progress, run = s.run;
    text($("title"), `${run.algorithm} on ${run.dataset} / ${run.model}, ${run.edges} edges x ${run.devices_per_edge} devices, run ${run.run_id}`);
    $("round").textContent = p.completed + " / " + run.rounds;  // rounds done: the rows written, as the charts
    $("round").dataset.round = String(p.round);
    $("round").dataset.completed = String(p.completed);
    // panels whose content is wider than the panel (a table cut at the window's width), for the browser test
    requestAnimationFrame(() => {
      document.body.dataset.clipped = Array.from(document.querySelectorAll(".panel"))
        .filter((el) => !el.hidden && el.scrollWidth > el.clientWidth + 1).map((el) => el.id || el.querySelector("h2")?.textContent || "?")
        .join(",");
    });
    text($("phase"), p.phase);
    text($("attempt"), p.attempt);
    text($("elapsed"), fmtSeconds(p.elapsed_s));
    text($("emulated"), fmtSeconds(p.emulated_s));
    const evaluated = rows.filter((r) => r.accuracy != null);
    text($("accuracy"), evaluated.length ? pct(evaluated[evaluated.length - 1].accuracy) : "-");
    text($("status"), p.finished ? (p.stop_reason ? "stopped: " + p.stop_reason : "finished")
                                 : p.ended ? "stopped" : "running");
    drawEnded(p, s.snapshot);
    drawCharts();
    drawNodes(s.nodes);
    drawPrivacy(s.privacy);
    keyValues($("links"), s.links, fmtBytes);
    keyValues($("refusals"), s.refusals_at_cloud);
    drawDevices(s.devices || []);
    drawTopology(s.topology, s.nodes, s.devices);
    if (s.run.medium && !s.snapshot && !planeAsked) fetchPlane();
    drawPlane(s);
  }

  async function poll() {
    try {
      const res = await fetch("/api/state?since=" + rows.length, { cache: "no-store" });
      if (!res.ok) throw new Error(res.status + " " + res.statusText);
      const s = await res.json();
      rows.length = Math.min(rows.length, s.rows_from);
      rows.push(...s.rows);
      refresh = 1000 * (s.run.refresh_s || 2);
      lastState = s;
      render(s);
      document.body.dataset.state = "ok";
      if (s.progress.finished) return;  // nothing changes after the end
    } catch (err) {
      // the cloud's process ends with its run: after a last round shown, that is the likely reason
      $("status").textContent = "cloud not answering (" + err.message + ")" +
        (lastState && rows.length ? "; the run may be over (its cloud exits at the end; its final state is in " +
                                     "live.html in the run directory)" : "") + "; retrying";
      document.body.dataset.state = "error";
    }
    timer = setTimeout(poll, refresh);
  }

  $("figure").addEventListener("change", drawCharts);
  $("device-eps").addEventListener("click", async () => {
    const out = $("device-eps-out");
    out.textContent = "computing...";
    try {
      const d = SNAPSHOT ? { devices: lastState.device_epsilons || {} }
                         : await (await fetch("/api/privacy/devices", { cache: "no-store" })).json();
      const table = document.createElement("table");
      keyValues(table, d.devices, (x) => Number(x).toPrecision(4));
      out.replaceChildren(table);
    } catch (err) { out.textContent = "failed: " + err.message; }
  });
  window.addEventListener("resize", () => {
    for (const c of Object.values(charts)) c.plot.setSize({ width: Math.max(320, c.el.clientWidth), height: 230 });
  });
  if (SNAPSHOT) {  // live.html: render the embedded final state once; nothing to poll
    const s = JSON.parse(SNAPSHOT.textContent);
    rows.push(...s.rows);
    lastState = s;
    $("served").textContent = "a snapshot of the live page (no server; Prometheus metrics were served by the cloud);";
    render(s);
    document.body.dataset.state = "snapshot";
  } else {
    poll();
  }
})();
