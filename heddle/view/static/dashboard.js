// heddle view: the dashboard page. Plain browser JavaScript over the vendored uPlot; no build
// step, no network beyond this server. The page never holds more than a bounded window of
// steps: the server aggregates (api/steps?max=N) and the live stream keeps LIVE_ROWS rows.
(() => {
  "use strict";
  const API = "/dashboard/api/";
  const LIVE_ROWS = 3000; // raw rows the live view keeps; older ones are dropped from the page
  const MAX_POINTS = 1500; // buckets asked of the server for a window
  // Live, the page redraws at most this often: a redraw of every chart costs the browser CPU
  // that, on a small machine, the engine would otherwise have (its cost goes with the number
  // of redraws, not the rows drawn). The stream sends a message every 0.25 s and each one is
  // drawn when it comes: a step is on the page within about 0.25 s + one redraw (target 1 s).
  const MIN_REDRAW_MS = 200;
  const PALETTE = ["#2563eb", "#16a34a", "#db2777", "#ea580c", "#7c3aed", "#0891b2",
    "#ca8a04", "#4b5563", "#dc2626", "#65a30d"];
  const GROUPS = ["prefill", "decode", "running", "waiting", "kv_used"];
  const COLS = ["t", "n", "step_first", "step_last", "end", "dur", "dur_max", "batch",
    "batch_max", "kv_free", "kv_cached", "kv_parked", "preempted", "evicted"];

  // lags: per redraw, the oldest newly drawn step's end on the engine to the page having drawn
  // it; lagParts: that lag split into [waiting in the server's store for the next message,
  // the message's way to the page, the page's wait and redraw] (ms).
  const stats = { stepsSeen: 0, stepsDrawn: 0, messages: 0, lags: [], lagParts: [],
    maxLagMs: 0, lastLagMs: null, draws: 0, errors: [] };
  const state = { meta: null, data: null, follow: true, playing: false, window: null,
    charts: {}, chartKeys: {}, colors: {}, cursor: { steps: 0, events: 0 }, pendingWall: null,
    pendingSent: null, pendingReceived: null,
    renderQueued: false, source: null, selected: null, visible: {}, stale: new Set() };
  const ready = {};
  window.heddleView = { stats, state, ready };

  const $ = (id) => document.getElementById(id);
  const fmtMs = (s) => (s == null ? "–" : s < 1 ? `${(s * 1000).toFixed(s < 0.01 ? 2 : 0)} ms` : `${s.toFixed(2)} s`);
  const esc = (s) => String(s).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

  async function get(path) {
    const response = await fetch(API + path, { credentials: "same-origin" });
    if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
    return response.json();
  }

  function colorOf(key) {
    const cls = key.split("/")[0];
    if (!(cls in state.colors)) {
      state.colors[cls] = PALETTE[Object.keys(state.colors).length % PALETTE.length];
    }
    return state.colors[cls];
  }

  function alpha(hex, a) {
    const v = parseInt(hex.slice(1), 16);
    return `rgba(${(v >> 16) & 255},${(v >> 8) & 255},${v & 255},${a})`;
  }

  function width(el) { return Math.max(300, el.clientWidth || 600); }

  function emptyData() {
    const d = {};
    for (const c of COLS) d[c] = [];
    for (const g of GROUPS) d[g] = {};
    return d;
  }

  // -- the live stream: rows appended to a bounded columnar window --------------------------
  function appendRows(rows) {
    const d = state.data;
    for (const r of rows) {
      const len = d.t.length;
      const [step, start, dur, batch, prefill, decode, running, waiting, kvUsed, kvFree,
        kvCached, kvParked, preempted, evicted] = r;
      const values = { t: start, n: 1, step_first: step, step_last: step, end: start + dur,
        dur, dur_max: dur, batch, batch_max: batch, kv_free: kvFree, kv_cached: kvCached,
        kv_parked: kvParked, preempted, evicted };
      for (const c of COLS) (d[c] || (d[c] = new Array(len).fill(0))).push(values[c]);
      d.kv_total = kvFree + kvCached + kvParked + Math.round(Object.values(kvUsed).reduce((a, b) => a + b, 0));
      const groups = { prefill, decode, running, waiting, kv_used: kvUsed };
      for (const g of GROUPS) {
        const cols = d[g] || (d[g] = {});
        for (const k of Object.keys(groups[g])) if (!(k in cols)) cols[k] = new Array(len).fill(0);
        for (const k of Object.keys(cols)) cols[k].push(groups[g][k] || 0);
      }
    }
    const extra = d.t.length - LIVE_ROWS;
    if (extra > 0) {
      for (const c of COLS) d[c].splice(0, extra);
      for (const g of GROUPS) for (const k of Object.keys(d[g])) d[g][k].splice(0, extra);
    }
  }

  function startStream() {
    if (state.source) state.source.close();
    const url = `${API}stream?steps=${state.cursor.steps}&events=${state.cursor.events}`;
    const source = new EventSource(url);
    state.source = source;
    source.onmessage = (message) => {
      const update = JSON.parse(message.data);
      stats.messages += 1;
      stats.stepsSeen = update.num_steps;
      state.cursor = { steps: update.num_steps, events: update.num_events };
      $("num-steps").textContent = update.num_steps;
      $("num-requests").textContent = update.num_requests;
      $("num-events").textContent = update.num_events;
      if (!state.follow) return;
      if (update.dropped_steps > 0) { loadWindow(null, null, LIVE_ROWS); return; }
      if (update.rows.length) {
        appendRows(update.rows);
        // The oldest step not drawn yet: its lag is the longest any step waits for the page.
        if (state.pendingWall == null) {
          state.pendingWall = update.walls[0];
          state.pendingSent = update.sent;
          state.pendingReceived = Date.now();
        }
        queueRender();
      }
    };
    source.onerror = () => { $("lag").textContent = "stream reconnecting…"; };
  }

  // -- windows from the server --------------------------------------------------------------
  async function loadWindow(start, end, max) {
    const q = [`max=${max || MAX_POINTS}`];
    if (start != null) q.push(`start=${start}`);
    if (end != null) q.push(`end=${end}`);
    const data = await get(`steps?${q.join("&")}`);
    state.data = data;
    if (state.meta.mode === "live" && state.follow && data.num_steps_total != null) {
      state.cursor.steps = Math.max(state.cursor.steps, data.num_steps_total);
    }
    queueRender();
    return data;
  }

  function queueRender() {
    if (state.renderQueued) return;
    state.renderQueued = true;
    const wait = state.meta && state.meta.mode === "live"
      ? Math.max(0, (state.lastRender || 0) + MIN_REDRAW_MS - performance.now()) : 0;
    setTimeout(() => requestAnimationFrame(() => {
      state.lastRender = performance.now();
      state.renderQueued = false;
      try { render(); } catch (e) { stats.errors.push(String(e)); throw e; }
      if (state.pendingWall != null) {
        const drawn = Date.now();
        const lag = drawn - state.pendingWall * 1000;
        stats.lastLagMs = lag;
        stats.maxLagMs = Math.max(stats.maxLagMs, lag);
        stats.lags.push(lag);
        if (state.pendingSent != null) {
          const sent = state.pendingSent * 1000;
          stats.lagParts.push([sent - state.pendingWall * 1000, state.pendingReceived - sent,
            drawn - state.pendingReceived]);
        }
        if (stats.lags.length > 2000) { stats.lags.shift(); }
        if (stats.lagParts.length > 2000) { stats.lagParts.shift(); }
        state.pendingWall = null;
        $("lag").textContent = `page ${Math.max(0, lag).toFixed(0)} ms behind the engine`;
      }
    }), wait);
  }

  // -- charts -------------------------------------------------------------------------------
  function chart(id, opts, data) {
    const el = $(id);
    const keys = opts.series.map((s) => s.label).join("|");
    let u = state.charts[id];
    if (u && state.chartKeys[id] === keys) {
      u.setData(data);
      return u;
    }
    if (u) u.destroy();
    el.innerHTML = "";
    opts.width = width(el);
    u = new uPlot(opts, data, el);
    state.charts[id] = u;
    state.chartKeys[id] = keys;
    return u;
  }

  function noData(id, text) {
    const u = state.charts[id];
    if (u) { u.destroy(); delete state.charts[id]; delete state.chartKeys[id]; }
    $(id).innerHTML = `<div class="empty">${esc(text)}</div>`;
  }

  function zoomable() {
    return {
      drag: { x: true, y: false, setScale: false },
      sync: { key: "heddle-time" },
    };
  }

  function onSelect(u) {
    if (u.select.width < 4) return;
    const start = u.posToVal(u.select.left, "x");
    const end = u.posToVal(u.select.left + u.select.width, "x");
    u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
    setFollow(false);
    state.window = { start, end };
    loadWindow(start, end);
  }

  function stacked(columns) {
    // columns: [{label, values, color}], bottom first -> cumulative arrays, drawn top first.
    const out = [];
    let acc = null;
    for (const c of columns) {
      acc = acc ? acc.map((v, i) => v + (c.values[i] || 0)) : c.values.map((v) => v || 0);
      out.push({ ...c, cumulative: acc });
    }
    return out.reverse();
  }

  function timeAxis() {
    return { label: "seconds", values: (u, ticks) => ticks.map((t) => `${+t.toFixed(2)}`) };
  }

  function render() {
    const d = state.data;
    if (!d) return;
    stats.draws += 1;
    const steps = d.n.reduce((a, b) => a + b, 0);
    stats.stepsDrawn = steps;
    if (!d.t.length) {
      const why = (state.meta.info && state.meta.info.note) || "no steps yet";
      for (const id of ["chart-tokens", "chart-batch", "chart-kv", "chart-queues"]) noData(id, why);
      ready.timeline = ready.kv = ready.queues = true;
      return;
    }
    const aggregated = d.n.some((n) => n > 1);
    $("timeline-foot").textContent = `${steps} steps drawn (${d.t.length} ${aggregated
      ? "buckets: each bar is the mean per step of the steps it holds" : "bars, one per step"}),`
      + ` steps ${d.step_first[0]}–${d.step_last[d.step_last.length - 1]}`;
    // Live, a chart scrolled out of view is not redrawn (its redraw would cost the engine's
    // CPU for nothing): it is marked stale and redrawn when it comes back into view.
    const draw = (panel, chartId, fn) => {
      if (state.meta.mode === "live" && state.charts[chartId] && state.visible[panel] === false) {
        state.stale.add(panel);
        return;
      }
      state.stale.delete(panel);
      fn(d);
    };
    draw("panel-timeline", "chart-tokens", (data) => { renderTokens(data); renderBatch(data); });
    draw("panel-kv", "chart-kv", renderKv);
    draw("panel-queues", "chart-queues", renderQueues);
    ready.timeline = ready.kv = ready.queues = true;
  }

  function watchVisibility() {
    if (!("IntersectionObserver" in window)) return;
    const observer = new IntersectionObserver((entries) => {
      let back = false;
      for (const entry of entries) {
        state.visible[entry.target.id] = entry.isIntersecting;
        if (entry.isIntersecting && state.stale.has(entry.target.id)) back = true;
      }
      if (back) queueRender();
    }, { rootMargin: "200px" });
    for (const id of ["panel-timeline", "panel-kv", "panel-queues"]) observer.observe($(id));
  }

  function renderTokens(d) {
    const classes = [...new Set([...Object.keys(d.prefill), ...Object.keys(d.decode)])].sort();
    const cols = [];
    for (const c of classes) {
      if (d.decode[c]) cols.push({ label: `${c} decode`, values: d.decode[c], color: colorOf(c) });
      if (d.prefill[c]) cols.push({ label: `${c} prefill`, values: d.prefill[c], color: alpha(colorOf(c), 0.45) });
    }
    const stack = stacked(cols);
    // Few steps: one bar each. Many: a stepped area (bars would be thinner than a pixel).
    const paths = d.t.length <= 400 ? uPlot.paths.bars({ size: [1, 40], align: 1 })
      : uPlot.paths.stepped({ align: 1 });
    chart("chart-tokens", {
      height: 200,
      cursor: zoomable(),
      hooks: { setSelect: [onSelect] },
      scales: { x: { time: false } },
      axes: [timeAxis(), { label: "tokens / step", size: 60 }],
      series: [{ label: "t" }, ...stack.map((s) => ({ label: s.label, fill: s.color, stroke: s.color, width: 0, paths, points: { show: false } }))],
    }, [d.t, ...stack.map((s) => s.cumulative)]);
  }

  function renderBatch(d) {
    const marks = (counts) => counts.map((c, i) => (c > 0 ? d.batch_max[i] : null));
    const ms = d.dur.map((v) => v * 1000);
    chart("chart-batch", {
      height: 150,
      cursor: zoomable(),
      hooks: { setSelect: [onSelect] },
      scales: { x: { time: false }, ms: { auto: true } },
      axes: [timeAxis(), { label: "batch size", size: 60 }, { scale: "ms", side: 1, label: "step ms", grid: { show: false }, size: 60 }],
      series: [
        { label: "t" },
        { label: "batch size", stroke: "#111827", width: 1 },
        { label: "step time (ms)", scale: "ms", stroke: "#9ca3af", width: 1 },
        { label: "preemptions", stroke: "#dc2626", paths: () => null, points: { show: true, size: 6, fill: "#dc2626", stroke: "#dc2626" }, value: (u, v, si, i) => (i == null ? "" : d.preempted[i]) },
        { label: "evicted blocks", stroke: "#f59e0b", paths: () => null, points: { show: true, size: 5, fill: "#f59e0b", stroke: "#f59e0b" }, value: (u, v, si, i) => (i == null ? "" : d.evicted[i]) },
      ],
    }, [d.t, d.batch, ms, marks(d.preempted), marks(d.evicted)]);
    const preempted = d.preempted.reduce((a, b) => a + b, 0);
    const evicted = d.evicted.reduce((a, b) => a + b, 0);
    $("timeline-foot").textContent += `; ${preempted} preemptions, ${evicted} cached blocks evicted in this window`;
  }

  function renderKv(d) {
    const used = Object.keys(d.kv_used).sort();
    const cols = used.map((c) => ({ label: `${c} in use`, values: d.kv_used[c], color: colorOf(c) }));
    cols.push({ label: "cached", values: d.kv_cached, color: "#a3e635" });
    cols.push({ label: "parked", values: d.kv_parked, color: "#c084fc" });
    cols.push({ label: "free", values: d.kv_free, color: "#e5e7eb" });
    const stack = stacked(cols);
    chart("chart-kv", {
      height: 220,
      cursor: zoomable(),
      hooks: { setSelect: [onSelect] },
      scales: { x: { time: false }, y: { range: [0, Math.max(1, d.kv_total || state.meta.kv_total || 1)] } },
      axes: [timeAxis(), { label: "KV blocks", size: 60 }],
      series: [{ label: "t" }, ...stack.map((s) => ({ label: s.label, fill: s.color, stroke: s.color, width: 0, points: { show: false } }))],
    }, [d.t, ...stack.map((s) => s.cumulative)]);
    const last = d.t.length - 1;
    const inUse = used.reduce((a, c) => a + d.kv_used[c][last], 0);
    $("kv-foot").textContent = `now: ${inUse.toFixed(0)} in use, ${d.kv_cached[last].toFixed(0)} cached, ${d.kv_free[last].toFixed(0)} free of ${d.kv_total}`;
  }

  function renderQueues(d) {
    const keys = [...new Set([...Object.keys(d.running), ...Object.keys(d.waiting)])].sort();
    const series = [{ label: "t" }];
    const data = [d.t];
    for (const k of keys) {
      series.push({ label: `${k} running`, stroke: colorOf(k), width: 2 });
      data.push(d.running[k] || d.t.map(() => 0));
      series.push({ label: `${k} waiting`, stroke: colorOf(k), width: 1.5, dash: [6, 4] });
      data.push(d.waiting[k] || d.t.map(() => 0));
    }
    chart("chart-queues", {
      height: 220,
      cursor: zoomable(),
      hooks: { setSelect: [onSelect] },
      scales: { x: { time: false } },
      axes: [timeAxis(), { label: "requests", size: 50 }],
      series,
    }, data);
    const last = d.t.length - 1;
    $("queues-foot").textContent = "now: " + keys.map((k) => `${k} ${((d.running[k] || [])[last] || 0).toFixed(0)} running / ${((d.waiting[k] || [])[last] || 0).toFixed(0)} waiting`).join("; ");
  }

  // -- latency ------------------------------------------------------------------------------
  async function loadLatency() {
    const lat = await get("latency");
    const classes = Object.keys(lat.classes).filter((c) => c !== "all" || Object.keys(lat.classes).length <= 2).sort();
    for (const metric of ["ttft", "tpot", "e2e"]) {
      const id = `chart-${metric}`;
      const tables = classes.map((c) => [lat.classes[c][metric].x, lat.classes[c][metric].y]).filter((t) => t[0].length);
      if (!tables.length) { noData(id, `no finished requests with a ${metric.toUpperCase()} yet`); continue; }
      const shown = classes.filter((c) => lat.classes[c][metric].x.length);
      const joined = uPlot.join(tables);
      const target = lat.slo ? lat.slo[metric] : null;
      chart(id, {
        height: 200,
        title: metric.toUpperCase(),
        scales: { x: { time: false }, y: { range: [0, 1] } },
        axes: [{ label: "seconds" }, { label: "fraction", size: 45 }],
        series: [{ label: "s" }, ...shown.map((c) => ({ label: c, stroke: c === "all" ? "#111827" : colorOf(c), width: 2, spanGaps: true }))],
        hooks: target ? { draw: [(u) => drawVLine(u, target, "#dc2626")] } : {},
      }, joined);
    }
    const rows = Object.entries(lat.classes).sort();
    const hasSlo = rows.some(([, e]) => e.attainment != null);
    $("goodput").innerHTML = `<tr><th>class</th><th>finished</th><th>p50 TTFT</th><th>p99 TTFT</th><th>p50 TPOT</th><th>req/s</th>${hasSlo ? "<th>within SLO</th><th>goodput req/s</th>" : ""}</tr>`
      + rows.map(([c, e]) => `<tr><td>${esc(c)}</td><td>${e.completed}</td><td>${fmtMs(pct(e.ttft, 0.5))}</td><td>${fmtMs(pct(e.ttft, 0.99))}</td><td>${fmtMs(pct(e.tpot, 0.5))}</td><td>${e.throughput == null ? "–" : e.throughput.toFixed(2)}</td>${hasSlo ? `<td>${e.attainment == null ? "–" : (100 * e.attainment).toFixed(1) + "%"}</td><td>${e.goodput == null ? "–" : e.goodput.toFixed(2)}</td>` : ""}</tr>`).join("")
      + (lat.slo ? `<tr><td colspan="8" class="muted">SLO: TTFT ≤ ${fmtMs(lat.slo.ttft)}, TPOT ≤ ${fmtMs(lat.slo.tpot)} (a request's own targets override)</td></tr>` : "");
    ready.latency = true;
  }

  function pct(cdf, q) {
    for (let i = 0; i < cdf.y.length; i++) if (cdf.y[i] >= q) return cdf.x[i];
    return null;
  }

  function drawVLine(u, x, color) {
    const ctx = u.ctx;
    const px = Math.round(u.valToPos(x, "x", true));
    if (px < u.bbox.left || px > u.bbox.left + u.bbox.width) return;
    ctx.save();
    ctx.strokeStyle = color;
    ctx.setLineDash([5, 4]);
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    ctx.moveTo(px, u.bbox.top);
    ctx.lineTo(px, u.bbox.top + u.bbox.height);
    ctx.stroke();
    ctx.restore();
  }

  // -- requests -----------------------------------------------------------------------------
  async function loadRequestList() {
    const sort = $("request-sort").value;
    const rows = await get(`requests?sort=${sort}&limit=40`);
    $("request-list").innerHTML = "<tr><th>request</th><th>class</th><th>stalled</th><th>E2E</th><th>preempted</th></tr>"
      + rows.map((r) => `<tr data-id="${esc(r.id)}"><td>${esc(r.id)}</td><td>${esc(r.cls)}</td><td>${fmtMs(r.stall)}</td><td>${fmtMs(r.e2e)}</td><td>${r.preemptions}</td></tr>`).join("");
    ready.requestList = true;
    if (!state.selected && rows.length) showRequest(rows[0].id);
  }

  // A preempted request back in the batch: what it recomputed, and the evictions that made it.
  function recomputeRow(c) {
    const redo = Math.max(0, c.tokens - c.cached);
    const until = c.t1 != null ? ` until ${c.t1.toFixed(3)} s (step ${c.s1})` : " (not caught up)";
    const cause = c.evicted_blocks
      ? `${c.evicted_blocks} of its ${c.cached_blocks} cached blocks evicted at step ${c.evicted_steps.join(", ")} for ${esc(c.evicted_for.join(", "))}`
      : c.cached_blocks ? "its cached blocks were all still there" : "none of its KV was in the prefix cache";
    return `<tr data-recompute="${c.s0}" data-evicted="${c.evicted_blocks}"><td>back at step ${c.s0} (${c.t0.toFixed(3)} s): recomputed ${redo} of ${c.tokens} tokens${until}</td><td>${cause}</td></tr>`;
  }

  async function showRequest(id) {
    state.selected = id;
    const el = $("request-detail");
    let detail;
    try {
      detail = await get(`request/${encodeURIComponent(id)}`);
    } catch (e) {
      el.innerHTML = `<p class="muted">No request ${esc(id)} here (only finished requests are kept, and in-flight ones that have events).</p>`;
      return;
    }
    const r = detail.request;
    const segs = detail.segments;
    const t0 = r.arrival;
    const t1 = Math.max(r.finish ?? t0, ...segs.map((s) => s.end), t0 + 1e-6);
    const span = t1 - t0;
    const lane = segs.map((s) => {
      const left = (100 * (s.start - t0)) / span;
      const w = (100 * (s.end - s.start)) / span;
      const title = `${s.kind}${s.reason ? ": " + s.reason : ""} ${fmtMs(s.end - s.start)} (${s.start.toFixed(3)}–${s.end.toFixed(3)} s)`;
      return `<div class="seg" data-kind="${s.kind}" style="left:${left}%;width:${w}%" title="${esc(title)}"></div>`;
    }).join("");
    const reasons = Object.entries(detail.reasons);
    const kinds = ["queued", "stalled", "preempted", "prefill", "recompute", "decode"];
    el.innerHTML = `
      <div><b>${esc(r.id)}</b> · class ${esc(r.cls)} · ${r.prompt ?? "?"} prompt tokens, ${r.output ?? "?"} output · TTFT ${fmtMs(r.ttft)} · E2E ${fmtMs(r.e2e)}${r.in_flight ? " · <i>in flight</i>" : ""}</div>
      <div class="why" id="why">${esc(detail.text)}</div>
      <div class="lane" id="request-lane">${lane}</div>
      <div class="axis"><span>${t0.toFixed(3)} s (arrival)</span><span>${t1.toFixed(3)} s${r.finish != null ? " (finish)" : ""}</span></div>
      <div class="legend-keys">${kinds.map((k) => `<span><i style="background:var(--k-${k})"></i>${k}</span>`).join("")}</div>
      <table class="table" id="request-reasons"><tr><th>reason</th><th>waited</th></tr>${reasons.map(([k, v]) => `<tr data-reason="${esc(k)}"><td>${esc(k)}</td><td>${fmtMs(v)}</td></tr>`).join("") || '<tr><td colspan="2" class="muted">no stall recorded</td></tr>'}</table>
      <table class="table" id="request-preemptions">${detail.preemptions.map((p) => `<tr data-preempted="${p.step}"><td>preempted at step ${p.step} (${p.t.toFixed(3)} s)</td><td>for ${esc(p.for ?? "its own growth")} · ${esc(p.reason)}</td></tr>`).join("")}</table>
      <table class="table" id="request-recomputes">${(detail.recomputes || []).map(recomputeRow).join("")}</table>`;
    ready.request = id;
  }

  // -- pictures -----------------------------------------------------------------------------
  async function loadPictures() {
    const p = await get("pictures");
    const st = p.step_time;
    const obs = medianByBatch(st.observed);
    const tables = [];
    const series = [{ label: "batch" }];
    if (st.curve) {
      tables.push([st.curve.batch, st.curve.step.map((v) => v * 1000)]);
      series.push({ label: `profile: step ms (context ${st.curve.context})`, stroke: "#2563eb", width: 2, spanGaps: true });
    }
    if (obs.batch.length) {
      tables.push([obs.batch, obs.ms]);
      series.push({ label: "this run: median step ms (decode-only steps)", stroke: "#111827", width: 0, paths: () => null, points: { show: true, size: 6, fill: "#111827" } });
    }
    if (tables.length) {
      chart("chart-steptime", {
        height: 220, title: "Step time against batch size",
        scales: { x: { time: false } },
        axes: [{ label: "sequences in the step" }, { label: "ms", size: 50 }],
        series,
      }, uPlot.join(tables));
    } else {
      noData("chart-steptime", "Step time against batch size: no decode steps yet; load a `heddle profile` JSON");
    }
    $("steptime-sentence").textContent = st.sentence || "";
    const k = p.knee;
    if (k) {
      chart("chart-knee", {
        height: 220, title: "Latency against throughput (load sweep)",
        scales: { x: { time: false }, lat: { auto: true } },
        axes: [{ label: "offered load (req/s)" }, { label: "served req/s", size: 50 }, { scale: "lat", side: 1, label: `${k.latency_key} (s)`, grid: { show: false }, size: 55 }],
        series: [{ label: "offered" }, { label: "served req/s", stroke: "#16a34a", width: 2 }, { label: k.latency_key, scale: "lat", stroke: "#dc2626", width: 2 }],
        hooks: k.knee != null ? { draw: [(u) => drawVLine(u, k.knee, "#6b7280")] } : {},
      }, [k.offered, k.throughput, k.latency]);
      $("knee-sentence").textContent = k.sentence || "";
    } else {
      noData("chart-knee", "The latency/throughput knee: load a sweep JSON (`heddle simulate --sweep rate=A:B:N --output-dir D` writes D/<label>_sweep.json)");
      $("knee-sentence").textContent = "";
    }
    ready.pictures = true;
  }

  function medianByBatch(observed) {
    const by = new Map();
    observed.batch.forEach((b, i) => {
      if (observed.prefill[i]) return;
      if (!by.has(b)) by.set(b, []);
      by.get(b).push(observed.dur[i]);
    });
    const batch = [...by.keys()].sort((a, b) => a - b);
    const ms = batch.map((b) => { const v = by.get(b).sort((x, y) => x - y); return 1000 * v[v.length >> 1]; });
    return { batch, ms };
  }

  async function uploadPicture(file) {
    const text = await file.text();
    const response = await fetch(API + "pictures", { method: "POST", headers: { "content-type": "application/json" }, body: text, credentials: "same-origin" });
    if (!response.ok) {
      const body = await response.json().catch(() => ({}));
      alert((body.error && body.error.message) || `HTTP ${response.status}`);
      return;
    }
    await loadPictures();
  }

  // -- controls -----------------------------------------------------------------------------
  function setFollow(on) {
    state.follow = on;
    $("btn-follow").classList.toggle("on", on);
  }

  async function play() {
    const meta = state.meta;
    if (state.playing) { state.playing = false; $("btn-play").textContent = "play"; return; }
    state.playing = true;
    $("btn-play").textContent = "pause";
    const span = (meta.end - meta.start) || 1;
    const widthS = span / 10;
    let start = state.window ? state.window.start : meta.start;
    while (state.playing && start < meta.end) {
      const speed = parseFloat($("speed").value);
      state.window = { start, end: start + widthS };
      await loadWindow(start, start + widthS, 600);
      await new Promise((r) => setTimeout(r, 150));
      start += (widthS / 40) * speed;
    }
    state.playing = false;
    $("btn-play").textContent = "play";
  }

  function wire() {
    $("btn-all").onclick = () => { setFollow(false); state.window = null; loadWindow(null, null); };
    $("btn-follow").onclick = () => { setFollow(true); state.window = null; loadWindow(null, null, LIVE_ROWS); };
    $("btn-play").onclick = play;
    $("request-sort").onchange = loadRequestList;
    $("request-form").onsubmit = (e) => { e.preventDefault(); const id = $("request-id").value.trim(); if (id) showRequest(id); };
    $("request-list").onclick = (e) => { const tr = e.target.closest("tr[data-id]"); if (tr) showRequest(tr.dataset.id); };
    $("picture-file").onchange = (e) => { if (e.target.files[0]) uploadPicture(e.target.files[0]); };
    let resize = null;
    window.addEventListener("resize", () => {
      clearTimeout(resize);
      resize = setTimeout(() => { for (const [id, u] of Object.entries(state.charts)) u.setSize({ width: width($(id)), height: u.height }); }, 150);
    });
  }

  async function main() {
    wire();
    watchVisibility();
    const meta = await get("meta");
    state.meta = meta;
    document.body.classList.add(meta.mode);
    $("mode").textContent = meta.mode;
    $("mode").classList.add(meta.mode);
    $("title").textContent = meta.title;
    $("num-steps").textContent = meta.num_steps;
    $("num-requests").textContent = meta.num_requests;
    $("num-events").textContent = meta.num_events;
    stats.stepsSeen = meta.num_steps;
    if (meta.info && meta.info.note) { $("note").hidden = false; $("note").textContent = meta.info.note; }
    if (meta.mode === "live") {
      setFollow(true);
      state.data = emptyData();
      const data = await loadWindow(null, null, LIVE_ROWS);
      state.cursor = { steps: data.num_steps_total, events: meta.num_events };
      startStream();
      setInterval(() => { loadLatency(); loadRequestList(); }, 5000);
      setInterval(loadPictures, 30000);
    } else {
      setFollow(false);
      await loadWindow(null, null);
    }
    await Promise.all([loadLatency(), loadRequestList(), loadPictures()]);
    ready.all = true;
  }

  main().catch((e) => { stats.errors.push(String(e)); console.error(e); });
})();
