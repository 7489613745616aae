/* servelab's LLM tab inside Locust's own web UI (no fork): Locust renders an empty panel for an
 * extended tab without a table, so this script keeps its own panel beside Locust's tabs, shown
 * while the "LLM" tab is selected, and fills it from GET ./servelab/api/live every 1.5 s.
 * It also renames Locust's stats columns to what servelab reports in them (E2E times, output
 * tokens). Charts: uPlot (vendored, MIT, see uPlot.LICENSE); the page needs no network. */
(function () {
  "use strict";
  const POLL_MS = 1500;
  const API = "./servelab/api/";
  const RELABEL = {
    "Median (ms)": "E2E median (ms)", "Average (ms)": "E2E mean (ms)",
    "Min (ms)": "E2E min (ms)", "Max (ms)": "E2E max (ms)",
    "Average size (bytes)": "Avg output tokens",
  };
  const PCTL = /^(\d+(?:\.\d+)?)%ile \(ms\)$/;
  const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2"];
  // [key, title, unit, [[series key, label], ...], source]
  const CHARTS = [
    // the server's own account beside it: its spans' engine queue and prefill (when it sends
    // them: started with --otlp-traces-endpoint)
    ["ttft", "TTFT and the server's queue and prefill", "ms",
      [["ttft_p50_ms", "p50"], ["ttft_p99_ms", "p99"], ["span_queue_p50_ms", "engine queue p50"],
       ["span_prefill_p50_ms", "prefill p50"]]],
    ["itl", "ITL (token view) and TPOT", "ms",
      [["itl_p50_ms", "ITL p50"], ["itl_p99_ms", "ITL p99"], ["tpot_p50_ms", "TPOT p50"]]],
    ["tokens", "Output tokens/s", "tok/s", [["output_tokens_per_s", "output tokens/s"]]],
    ["rates", "Requests, goodput, errors", "1/s",
      [["requests_per_s", "requests/s"], ["goodput", "goodput"], ["errors_per_s", "errors/s"]]],
    ["slo", "SLO attainment", "%", [["slo_attainment", "all"]], "classes"],
    ["load", "Users, in flight, server queue", "count",
      [["users", "users"], ["in_flight", "in flight"], ["running", "server running"],
       ["waiting", "server waiting"]]],
    ["server", "Server cache and speculation", "%",
      [["kv_cache_usage", "KV-cache use"], ["prefix_cache_hit_rate", "prefix-cache hits"],
       ["spec_acceptance_rate", "draft acceptance"]]],
    ["generator", "Load generator health", "",
      [["cpu_percent_max", "CPU % (max worker)"], ["loop_lag_p99_ms_max", "loop lag p99 ms (max)"]]],
  ];
  // the /metrics states that need no banner (anything else is a named outcome of the scrape)
  const SCRAPE_FINE = new Set(["ok", "starting", "absent"]);
  const SHARE = new Set(["slo_attainment", "kv_cache_usage", "prefix_cache_hit_rate",
                         "spec_acceptance_rate"]);

  let again = false;
  let panel = null, plots = {}, data = null, runId = null, step = null, stages = [];

  const el = (tag, attrs, text) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  };
  const num = (v, d = 1) => (v === null || v === undefined) ? "-" :
    (Math.abs(v) >= 10000 ? Math.round(v).toLocaleString() : v.toFixed(d));
  const pct = (v) => (v === null || v === undefined) ? "-" : (100 * v).toFixed(1) + "%";

  function relabel(root) {
    for (const th of root.querySelectorAll("th")) {
      const walker = document.createTreeWalker(th, NodeFilter.SHOW_TEXT);
      for (let n = walker.nextNode(); n; n = walker.nextNode()) {
        const t = n.nodeValue.trim();
        if (RELABEL[t]) n.nodeValue = RELABEL[t];
        else if (PCTL.test(t)) n.nodeValue = "E2E " + t;
      }
    }
  }

  function llmTab() {
    return [...document.querySelectorAll('[role="tab"]')].find((t) => t.textContent.trim()
      .replace(/\s*⚠$/, "") === "LLM");
  }

  function place() {
    const tab = llmTab();
    if (!tab) return;
    const anchor = tab.closest(".MuiTabs-root");
    const host = anchor && anchor.parentElement;
    if (!panel) build();
    if (host && panel.previousElementSibling !== host) host.after(panel);
    const shown = tab.getAttribute("aria-selected") === "true";
    panel.style.display = shown ? "" : "none";
    if (shown) for (const p of Object.values(plots)) fit(p);
    badge(tab);
  }

  function build() {
    panel = el("div", { id: "servelab-llm" });
    panel.append(el("div", { id: "servelab-banners" }), el("div", { id: "servelab-cards" }));
    const grid = el("div", { class: "servelab-grid" });
    for (const [key, title] of CHARTS) {
      const box = el("div", { class: "servelab-chart", "data-chart": key, "data-points": "0" });
      box.append(el("h4", {}, title));
      grid.append(box);
    }
    panel.append(grid, el("div", { id: "servelab-tables" }),
      el("p", { class: "servelab-note" },
        "Figures of the requests stored in the last 10 s (warm-up included); the stored stages are " +
        "the results: `servelab summary`. Dashed lines: a stage's measured window starts."));
  }

  function fit(p) {
    const w = p.root.parentElement.clientWidth - 8;
    if (w > 50 && Math.abs(w - p.width) > 4) p.setSize({ width: w, height: 220 });
  }

  function stageLines(u) {
    const ctx = u.ctx, top = u.bbox.top, h = u.bbox.height;
    ctx.save();
    ctx.font = `${11 * devicePixelRatio}px sans-serif`;
    for (const st of stages) {
      for (const [t, dash] of [[st.started_unix, []], [st.measure_start_unix, [4, 4]]]) {
        if (t === null || t === undefined) continue;
        const x = u.valToPos(t, "x", true);
        if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
        ctx.strokeStyle = "#888"; ctx.setLineDash(dash.map((d) => d * devicePixelRatio));
        ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + h); ctx.stroke();
        if (!dash.length) {
          ctx.fillStyle = "#666";
          const level = st.level === null || st.level === undefined ? "" : ` · ${st.level}`;
          ctx.fillText(`S${st.stage}${level}`, x + 3, top + 12 * devicePixelRatio);
        }
      }
    }
    ctx.restore();
  }

  // The run so far (at least a minute), not uPlot's guess around a lone first point.
  function xRange() {
    const lo = data.started_unix, hi = Math.max(data.t_unix, lo + 60);
    return [lo, hi];
  }

  function yRange(u, lo, hi) {
    if (lo === null || hi === null) return [0, 1];
    return [Math.min(0, lo), hi > lo ? hi * 1.1 : Math.max(hi * 1.5, 1)];
  }

  function chartSeries(def) {
    const [, , unit, lines, extra] = def;
    const out = lines.map(([k, label]) => ({ key: k, label, share: SHARE.has(k) }));
    if (extra === "classes" && data)
      for (const c of Object.keys(data.class_series || {}))
        out.push({ key: null, cls: c, label: `class ${c}`, share: true });
    return out.map((s) => Object.assign(s, { unit }));
  }

  function columns(def) {
    const s = data.series, xs = s.t_unix;
    const cols = [xs];
    for (const line of chartSeries(def)) {
      const src = line.cls !== undefined ? data.class_series[line.cls].slo_attainment : s[line.key];
      cols.push(src.map((v) => (v === null || v === undefined) ? null : (line.share ? 100 * v : v)));
    }
    return cols;
  }

  function draw() {
    if (!panel || !data) return;
    for (const def of CHARTS) {
      const key = def[0], box = panel.querySelector(`[data-chart="${key}"]`);
      const cols = columns(def);
      const want = chartSeries(def).map((l) => l.label).join("|");
      let p = plots[key];
      if (p && p._servelab !== want) { p.destroy(); p = null; }
      if (!p) {
        const series = [{}, ...chartSeries(def).map((l, i) => ({
          label: l.label, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: false,
          value: (u, v) => v === null ? "-" : num(v, 1) }))];
        p = new uPlot({ width: Math.max(box.clientWidth - 8, 300), height: 220, series,
          scales: { x: { time: true, range: xRange },
                    y: key === "slo" ? { range: [0, 105] } : { range: yRange } },
          axes: [{}, { label: def[2], size: 56 }],
          hooks: { draw: [stageLines] }, legend: { live: true } }, cols, box);
        p._servelab = want;
        plots[key] = p;
      } else {
        p.setData(cols);
      }
      const points = cols.slice(1).reduce((n, c) => n + c.filter((v) => v !== null).length, 0);
      box.setAttribute("data-points", String(points));
    }
  }

  function card(label, value, cls, attrs) {
    const c = el("div", Object.assign({ class: "servelab-card" + (cls ? " " + cls : "") },
                                      attrs || {}));
    c.append(el("div", { class: "servelab-card-value" }, value), el("div", {}, label));
    return c;
  }

  function table(title, head, rows) {
    const box = el("div", { class: "servelab-table" });
    box.append(el("h4", {}, title));
    const t = el("table"), tr = el("tr");
    head.forEach((h) => tr.append(el("th", {}, h)));
    t.append(tr);
    for (const r of rows) {
      const row = el("tr");
      r.forEach((v) => row.append(el("td", {}, String(v))));
      t.append(row);
    }
    box.append(t);
    return box;
  }

  function summary(status) {
    const n = data.now, srv = data.server || {}, gen = data.generator || {};
    const banners = panel.querySelector("#servelab-banners");
    banners.replaceChildren();
    const err = status && (status.last_error || status.error);
    if (err) banners.append(el("div", { class: "servelab-banner servelab-error" }, String(err)));
    const lc = status && status.level_check;
    if (lc && lc.mismatch)
      banners.append(el("div", { class: "servelab-banner servelab-error", id: "servelab-level" },
        `Stage ${lc.stage}: level ${lc.level} users, but the generator had ${num(lc.in_flight)} ` +
        "requests in flight (median): the recorded level is not what was sending (run flag " +
        "level_mismatch)."));
    if (gen.saturated || (gen.trips || []).length) {
      const now = Object.entries(gen.workers || {}).filter(([, v]) => v.saturated)
        .map(([w, v]) => `${w}: loop-lag p99 ${num(v.loop_lag_p99_ms_median)} ms, CPU ` +
          `${num(v.cpu_percent_median, 0)}% (${v.cause === "host" ? "host busy" : "generator"})`);
      const past = (gen.trips || []).map((t) => `${t.worker} in stage ${t.stage} (${t.cause === "host" ? "host busy" : "generator"})`);
      banners.append(el("div", { class: "servelab-banner servelab-saturated", id: "servelab-saturated" },
        (gen.saturated ? "LOAD GENERATOR SATURATED NOW: " + now.join("; ") :
          "The load generator was saturated earlier") +
        ` (limits: loop-lag p99 ${gen.limits.loop_lag_p99_ms} ms, CPU ${gen.limits.cpu_percent}%). ` +
        "Latencies include client delay; add workers or use a quieter host. Tripped: " +
        past.join(", ")));
    }
    const scrape = srv.scrape, metrics = (srv.endpoints || {})["/metrics"];
    if (scrape && !SCRAPE_FINE.has(scrape) && metrics && metrics.last_failure)
      banners.append(el("div", { class: "servelab-banner servelab-errors", id: "servelab-scrape" },
        `Server /metrics: ${scrape} (${metrics.last_failure.detail || "-"}). ` +
        `${metrics.reads - (metrics.counts.ok || 0)} of ${metrics.reads} scrapes unusable; the ` +
        "run goes on and no request row is lost (the run's notes and endpoint_events name each)."));
    if (n.errors) {
      const kinds = Object.entries(n.errors_by_kind).map(([k, v]) => `${k} × ${v}`).join(", ");
      banners.append(el("div", { class: "servelab-banner servelab-errors", id: "servelab-errors" },
        `Errors in the last ${data.window_s} s: ${kinds}`));
    }
    const cards = panel.querySelector("#servelab-cards");
    cards.replaceChildren(
      card("run · state", `${data.run_id || "-"} · ${data.state}`),
      card("stage · users · in flight", `${data.stage ?? "-"} · ${n.users ?? "-"} · ${n.in_flight ?? "-"}`),
      card("TTFT p50 / p99 ms", `${num(n.ttft_p50_ms)} / ${num(n.ttft_p99_ms)}`),
      phaseCard(data.spans),
      card("ITL p50 / p99 ms", `${num(n.itl_p50_ms)} / ${num(n.itl_p99_ms)}`),
      card("TPOT p50 ms", num(n.tpot_p50_ms)),
      card("output tokens/s", num(n.output_tokens_per_s)),
      card("requests/s · goodput", `${num(n.requests_per_s, 2)} · ${num(n.goodput, 2)}`),
      card("SLO attainment", pct(n.slo_attainment)),
      card("errors (10 s · run)", `${n.errors} · ${data.errors_total}`, n.errors ? "servelab-bad" : ""),
      card("server running / waiting", `${num(srv.running, 0)} / ${num(srv.waiting, 0)}`),
      card("KV-cache use", pct(srv.kv_cache_usage)),
      card("/metrics", srv.scrape || "-", srv.scrape && !SCRAPE_FINE.has(srv.scrape) ? "servelab-bad" : ""));
    const tables = panel.querySelector("#servelab-tables");
    tables.replaceChildren(
      table("Classes (last window)", ["class", "requests", "goodput /s", "SLO attainment"],
        Object.entries(n.classes).map(([c, v]) => [c, v.requests, num(v.goodput, 2), pct(v.slo_attainment)])),
      table("Errors by kind (run)", ["kind", "count"], Object.entries(data.errors_by_kind_total)),
      table("Generator workers", ["worker", "CPU %", "loop lag p99 ms", "in flight", "verdict"],
        Object.entries(gen.workers || {}).map(([w, v]) => [w, num(v.cpu_percent, 0),
          num(v.loop_lag_p99_ms), v.in_flight ?? "-", v.saturated ? `SATURATED (${v.cause})` : "ok"])),
      table("Server", ["figure", "value"], [
        ["preemptions/s", num(srv.preemptions_per_s, 2)],
        ["prefix-cache hit rate", pct(srv.prefix_cache_hit_rate)],
        ["draft acceptance", pct(srv.spec_acceptance_rate)],
        ["mean acceptance length", num(srv.spec_mean_acceptance_length, 2)],
        ["generated tokens/s (server)", num(srv.generation_tokens_per_s)]]),
      table("Server endpoints", ["endpoint", "reads", "newest", "outcomes", "last failure"],
        Object.entries(srv.endpoints || {}).map(([ep, v]) => [ep, v.reads,
          v.last ? `${v.last.outcome} ${clock(v.last.t_unix)}` : "-",
          Object.entries({ ...v.counts, ...v.quirks }).map(([k, c]) => `${k} × ${c}`).join(", "),
          v.last_failure ? `${v.last_failure.outcome}: ${v.last_failure.detail || ""}` : "-"])),
      table("Stages", ["stage", "kind", "level", "started", "measured from", "ended"],
        stages.map((s) => [s.stage, s.kind ?? "-", s.level ?? "-", clock(s.started_unix),
          clock(s.measure_start_unix), clock(s.ended_unix)])));
  }

  // The server's spans of the last window: engine queue and prefill medians (p99 on hover).
  function phaseCard(sp) {
    if (!sp || !sp.total)
      return card("engine queue / prefill p50 ms", "no spans", "",
        { id: "servelab-phases", "data-spans": "0", title: "the server sends no spans: start " +
          "it with --otlp-traces-endpoint http://127.0.0.1:PORT/v1/traces and " +
          "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf (PORT: --otlp-port)" });
    return card(`engine queue / prefill p50 ms (${sp.spans} spans, 10 s)`,
      `${num(sp.queue_p50_ms)} / ${num(sp.prefill_p50_ms)}`, "",
      { id: "servelab-phases", "data-spans": String(sp.spans),
        "data-queue-p50": sp.queue_p50_ms ?? "", "data-prefill-p50": sp.prefill_p50_ms ?? "",
        title: `p99: engine queue ${num(sp.queue_p99_ms)} ms, prefill ` +
          `${num(sp.prefill_p99_ms)} ms; ${sp.total} spans this run` });
  }

  const clock = (t) => t ? new Date(t * 1000).toLocaleTimeString() : "-";

  function badge(tab) {
    if (!data) return;
    const bad = (data.generator && data.generator.saturated) || (data.now && data.now.errors);
    const span = [...tab.querySelectorAll("span")].find((s) => /^LLM/.test(s.textContent));
    const want = bad ? "LLM ⚠" : "LLM";
    if (span && span.textContent !== want) span.textContent = want;
  }

  function merge(view) {
    if (!data || view.run_id !== runId || view.step_s !== step) {
      data = view;
    } else {
      // only the points newer than ours (a server that ignores ?since= sends them all)
      const last = data.series.t_unix.length ? data.series.t_unix.at(-1) : -Infinity;
      const from = view.series.t_unix.findIndex((t) => t > last);
      const skip = from < 0 ? view.series.t_unix.length : from;
      const n = data.series.t_unix.length;
      for (const [k, v] of Object.entries(view.series)) data.series[k] = (data.series[k] || []).concat(v.slice(skip));
      for (const [c, s] of Object.entries(view.class_series)) {
        const mine = data.class_series[c] || (data.class_series[c] = {});
        for (const [k, v] of Object.entries(s)) {
          // a class first seen now has no earlier points: pad to the shared time axis
          const have = mine[k] || new Array(n).fill(null);
          const fresh = v.slice(v.length - (view.series.t_unix.length - skip));
          mine[k] = have.concat(fresh);
        }
      }
      const { series, class_series, ...rest } = view;
      Object.assign(data, rest);
    }
    runId = view.run_id; step = view.step_s; stages = view.stages || [];
  }

  async function poll() {
    try {
      const last = data && data.series.t_unix.length ? data.series.t_unix.at(-1) : null;
      const r = await fetch(API + "live" + (last !== null ? `?since=${last}` : ""), { cache: "no-store" });
      if (r.ok) {
        const view = await r.json();
        // another run, or a thinned series: start over from the whole series
        if (data && (view.run_id !== runId || view.step_s !== step)) {
          data = null;
          again = true;
          return;
        }
        merge(view);
        let status = null;
        try {
          const s = await fetch(API + "status", { cache: "no-store" });
          if (s.ok) status = await s.json();
        } catch (e) { /* the status route is optional here */ }
        if (panel) { summary(status); if (panel.style.display !== "none") draw(); }
      }
    } catch (e) {
      console.warn("servelab: live data not fetched:", e);
    } finally {
      place();
      setTimeout(poll, again ? 50 : POLL_MS);
      again = false;
    }
  }

  let queued = false;
  new MutationObserver(() => {
    if (queued) return;
    queued = true;
    requestAnimationFrame(() => {
      queued = false;
      relabel(document);
      const wasHidden = panel && panel.style.display === "none";
      place();
      if (wasHidden && panel.style.display !== "none") draw();
    });
  }).observe(document.body, { childList: true, subtree: true, attributes: true,
                              attributeFilter: ["aria-selected"] });
  window.addEventListener("resize", () => Object.values(plots).forEach(fit));
  poll();
})();
