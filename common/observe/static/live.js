// The live page: polls /api/state (new rows only) and redraws; read-only, same origin, no inline script.
"use strict";
(function () {
  const rows = [];
  let refresh = 2000, timer = null, charts = {}, lastState = null;
  const $ = (id) => document.getElementById(id);
  const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2"];

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
      legend: { show: true },
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
    const data = [pts.map((r) => xKey === "round" ? r.round + 1 : r[xKey])]
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
      cell(tr, n.last_seen_s == null ? "never" : n.last_seen_s < 1 ? "now" : n.last_seen_s + " s ago");
      cell(tr, n.refused);
      cell(tr, n.devices);
      cell(tr, n.dropped);
      cell(tr, n.restarts);
      cell(tr, n.emulated_seconds == null ? null : n.emulated_seconds.toFixed(3));
      cell(tr, n.fusion_weight == null ? null : Number(n.fusion_weight).toPrecision(4));
      body.appendChild(tr);
    }
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

  function drawTopology(topo, nodes) {
    const state = Object.fromEntries(nodes.map((n) => [n.id, n.state]));
    const colour = { live: "#16a34a", rejoined: "#16a34a", late: "#d97706", lost: "#dc2626", waiting: "#9ca3af" };
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
        svg("circle", { cx: px, cy: 155, r: 5, fill: "#64748b" }, root).appendChild(
          svg("title", {})).textContent = d;
      });
      svg("text", { x: x, y: 178, "text-anchor": "middle", fill: "#374151" }, root).textContent =
        e.devices.length + " devices";
    });
    $("topology").replaceChildren(root);
    const m = $("medium");
    m.textContent = topo.medium ? "wireless medium: " + Object.entries(topo.medium)
      .filter(([, v]) => v != null).map(([k, v]) => k + " " + (typeof v === "number" ? Number(v).toPrecision(4) : v))
      .join(", ") : "";
  }

  function render(s) {
    const p = s.progress, run = s.run;
    text($("title"), `${run.algorithm} on ${run.dataset} / ${run.model}, ${run.edges} edges x ${run.devices_per_edge} devices, run ${run.run_id}`);
    $("round").textContent = (p.round < 0 ? 0 : Math.min(p.round + 1, run.rounds)) + " / " + run.rounds;
    $("round").dataset.round = String(p.round);
    $("round").dataset.completed = String(p.completed);
    text($("phase"), p.phase);
    text($("attempt"), p.attempt);
    text($("elapsed"), fmtSeconds(p.elapsed_s));
    text($("emulated"), fmtSeconds(p.emulated_s));
    const evaluated = rows.filter((r) => r.accuracy != null);
    text($("accuracy"), evaluated.length ? pct(evaluated[evaluated.length - 1].accuracy) : "-");
    text($("status"), p.finished ? (p.stop_reason ? "stopped: " + p.stop_reason : "finished") : "running");
    drawCharts();
    drawNodes(s.nodes);
    drawPrivacy(s.privacy);
    keyValues($("links"), s.links, fmtBytes);
    keyValues($("refusals"), s.refusals_at_cloud);
    drawTopology(s.topology, s.nodes);
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
        (lastState && rows.length ? "; the run may be over (its cloud exits at the end)" : "") + "; retrying";
      document.body.dataset.state = "error";
    }
    timer = setTimeout(poll, refresh);
  }

  $("figure").addEventListener("change", drawCharts);
  $("device-eps").addEventListener("click", async () => {
    const out = $("device-eps-out");
    out.textContent = "computing...";
    try {
      const res = await fetch("/api/privacy/devices", { cache: "no-store" });
      const d = await res.json();
      const table = document.createElement("table");
      keyValues(table, d.devices, (x) => Number(x).toPrecision(4));
      out.replaceChildren(table);
    } catch (err) { out.textContent = "failed: " + err.message; }
  });
  window.addEventListener("resize", () => {
    for (const c of Object.values(charts)) c.plot.setSize({ width: Math.max(320, c.el.clientWidth), height: 230 });
  });
  poll();
})();
