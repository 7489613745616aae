"""``servelab report``: one self-contained report.html (inline CSS, PNGs embedded as base64, no
network) plus the PNG files, for one or more runs."""
from __future__ import annotations

import base64
import html
from datetime import datetime, timezone
from pathlib import Path

import duckdb

from servelab import __version__

from . import plots
from .catalogue import FLAG_MEANING, METRICS, comparison_cell, fmt, format_value, level_text, pct
from .compare import compare_groups, groups_for_runs
from .db import fetch_dicts
from .summary import stage_rows, when

CDF_POINTS = [i / 100 for i in range(101)]

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1200px;color:#1d2330;padding:0 16px}
h1{font-size:1.6em;margin-bottom:0}h2{border-bottom:1px solid #d6dae3;padding-bottom:4px;margin-top:32px}
.sub{color:#5b6477;margin-top:2px}
table{border-collapse:collapse;margin:8px 0 16px;font-size:13px}
th,td{border:1px solid #d6dae3;padding:3px 7px;text-align:right;white-space:nowrap}
th{background:#f1f3f7}td.l,th.l{text-align:left}
tr.all td{font-weight:600;background:#fafbfd}
.flag{display:inline-block;background:#b3261e;color:#fff;border-radius:3px;padding:1px 6px;margin:1px;font-size:12px}
.warn{border-left:5px solid #b3261e;background:#fdecea;padding:8px 12px;margin:8px 0}
.verdict{border-left:5px solid #2d6cdf;background:#eef3fd;padding:8px 12px;margin:8px 0}
.noise{color:#8a6d00}
.scroll{overflow-x:auto;max-width:100%}
figure{margin:16px 0}figure img{max-width:100%;border:1px solid #e3e6ee}
figcaption{color:#5b6477;font-size:13px}
dl dt{font-weight:600;margin-top:8px}dl dd{margin-left:16px}
code{background:#f1f3f7;padding:0 3px}
"""

# Runs first: resource errors (a broken image) and script errors are recorded into the DOM, and
# once the page has loaded, body[data-images] says how many images decoded ("loaded/total").
PAGE_SCRIPT = """
(function () {
  var scriptErrors = [], resourceErrors = [];
  window.addEventListener('error', function (e) {
    if (e.target && e.target !== window && e.target.tagName) {
      resourceErrors.push(e.target.tagName + ' ' + (e.target.getAttribute('alt') || ''));
    } else {
      scriptErrors.push(String(e.message || e));
    }
  }, true);
  window.addEventListener('load', function () {
    var imgs = Array.prototype.slice.call(document.images);
    var ok = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length;
    document.body.setAttribute('data-images', ok + '/' + imgs.length);
    document.body.setAttribute('data-script-errors', String(scriptErrors.length));
    document.body.setAttribute('data-resource-errors', String(resourceErrors.length));
    document.body.setAttribute('data-error-text', scriptErrors.concat(resourceErrors).join(' | '));
    document.body.setAttribute('data-ready', 'yes');
  });
})();
"""

DEFINITIONS = [
    ("TTFT", "from the request being sent to the first streamed chunk carrying output text."),
    ("ITL (shown everywhere as ITL)", "the per-token view, <code>itl_tokens</code>: each gap between "
     "consecutive content chunks divided by the tokens in the later chunk, counted once per token. "
     "It measures the pace at which text arrives, so speculative decoding (several tokens per chunk) "
     "is compared on the same scale as plain decoding. The chunk view (<code>itl_chunks</code>, one "
     "sample per gap, what <code>vllm bench serve</code> pools) is drawn dashed in the ITL CDFs where "
     "chunks carry more than one token."),
    ("TPOT", "(E2E - TTFT) / (output tokens - 1), for requests with more than one output token."),
    ("E2E", "from sending to the last chunk carrying output."),
    ("Measured window", "a stage's [measure_start, measure_end): requests count when sent inside it "
     "and not flagged warm-up; throughput counts output tokens of chunks that arrived inside it, "
     "divided by its length, so warm-up and cool-down output are left out."),
    ("Goodput", "completed requests per second (measured window) that met every SLO of their class; "
     "SLO attainment is their share of all counted requests, failures included."),
    ("p99 adj", "error-adjusted percentile: a failed request counts as infinitely slow, so it is "
     "infinite once more than about 1% of requests fail."),
    ("Confidence intervals", "95% bootstrap intervals over the raw requests (runs resampled too where "
     "a configuration was repeated); a difference whose ratio interval contains 1 is marked as within noise."),
]


def _esc(value) -> str:
    return html.escape("" if value is None else str(value))


def _labels(runs: list[dict]) -> dict[str, str]:
    variants = [r["variant"] for r in runs]
    out = {}
    for r in runs:
        if r["variant"] and variants.count(r["variant"]) == 1:
            out[r["run_id"]] = r["variant"]
        elif r["variant"]:
            out[r["run_id"]] = f"{r['variant']} ({r['run_id']})"
        else:
            out[r["run_id"]] = r["run_id"]
    return out


def _img(path: Path, alt: str, caption: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return (f'<figure><img alt="{_esc(alt)}" src="data:image/png;base64,{data}">'
            f'<figcaption>{_esc(caption)} (<a href="{_esc(path.name)}">{_esc(path.name)}</a>)</figcaption></figure>')


def _flag_badges(flags) -> str:
    return "".join(f'<span class="flag">{_esc(f)}</span>' for f in flags or [])


def _runs_table(runs: list[dict], labels: dict[str, str]) -> str:
    head = ["label", "run", "started (UTC)", "profile", "variant", "hardware", "model", "GPUs", "target",
            "status", "requests", "errors", "flags"]
    out = ['<div class="scroll"><table><tr>' + "".join(f'<th class="l">{h}</th>' for h in head) + "</tr>"]
    for r in runs:
        cells = [labels[r["run_id"]], r["run_id"], when(r["started_unix"]), r["profile_name"], r["variant"],
                 r["hardware"], r["model"], r["gpus"], r["target"], r["status"], r["requests"], r["errors"]]
        out.append("<tr>" + "".join(f'<td class="l">{_esc(c if c is not None else "-")}</td>' for c in cells)
                   + f'<td class="l">{_flag_badges(r["flags"])}</td></tr>')
    out.append("</table></div>")
    return "\n".join(out)


# The report's stage table: the count columns, then catalogue metrics (headers and formats).
STAGE_COUNTS = [("stage", "stage", str), ("load", "level", level_text), ("class", "class_name", str),
                ("requests", "requests", str), ("errors", "errors", str)]
STAGE_METRICS = ["ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "ttft_p99_adj_ms", "itl_p50_ms", "itl_p99_ms",
                 "itl_chunk_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "e2e_p50_ms", "e2e_p99_ms",
                 "output_tokens_per_s", "output_tokens_per_s_per_gpu", "output_tokens_per_s_per_user",
                 "requests_per_s", "goodput", "slo_attainment"]
SERVER_COLUMNS = ["running_mean", "waiting_mean", "waiting_max", "kv_cache_usage_mean", "kv_cache_usage_max",
                  "preemptions_per_s", "generation_tokens_per_s", "prefix_cache_hit_rate",
                  "spec_acceptance_rate", "spec_mean_acceptance_length"]
FRONTIER_COLUMNS = ["target", "levels", "max_level_meeting_target", "goodput_at_max_level", "first_failing_level",
                    "slo_ttft_ms", "knee_level", "knee_level_interp"]


def _table(head: list[str], rows: list[list], left: str = "") -> str:
    """A scrollable HTML table of already formatted cells."""
    out = ['<div class="scroll"><table><tr>' + "".join(f"<th{left}>{h}</th>" for h in head) + "</tr>"]
    out += ["<tr>" + "".join(f"<td{left}>{_esc(c)}</td>" for c in cells) + "</tr>" for cells in rows]
    out.append("</table></div>")
    return "\n".join(out)


def _stage_table(rows: list[dict]) -> str:
    head = [h for h, _, _ in STAGE_COUNTS] + [METRICS[n].header for n in STAGE_METRICS]
    out = ['<div class="scroll"><table><tr>' + "".join(f"<th>{h}</th>" for h in head) + "<th class=l>errors by kind</th></tr>"]
    for r in rows:
        texts = [f(r[key]) for _, key, f in STAGE_COUNTS] + [format_value(n, r[n]) for n in STAGE_METRICS]
        cells = [f'<td{" class=l" if i == 2 else ""}>{_esc(t)}</td>' for i, t in enumerate(texts)]
        kinds = ", ".join(f"{k}: {v}" for k, v in sorted((r["errors_by_kind"] or {}).items()))
        cls = ' class="all"' if r["class_name"] == "(all)" else ""
        out.append(f"<tr{cls}>" + "".join(cells) + f'<td class="l">{_esc(kinds)}</td></tr>')
    out.append("</table></div>")
    return "\n".join(out)


def _server_table(rows: list[dict]) -> str:
    if not any(r["samples"] for r in rows):
        return "<p>No server metrics were scraped for this run.</p>"
    return _table(["stage"] + [METRICS[n].header for n in SERVER_COLUMNS],
                  [[r["stage"]] + [format_value(n, r[n]) for n in SERVER_COLUMNS] for r in rows])


def _frontier_table(rows: list[dict]) -> str:
    if not rows:
        return ""
    head = ["class"] + [METRICS[n].header if n in METRICS else n for n in FRONTIER_COLUMNS]
    return _table(head, [[r["class_name"]] + [format_value(n, r[n]) if n in METRICS else r[n]
                                            for n in FRONTIER_COLUMNS] for r in rows])


def _comparison_html(comparison) -> str:
    labels = [g.label for g in comparison.groups]
    flags = {g.label: g.flags for g in comparison.groups}
    out = [f'<div class="verdict"><b>Overall:</b> {_esc(comparison.verdict)}</div>',
           *(f'<div class="warn">{_esc(c)}</div>' for c in comparison.caveats),
           f"<p>Baseline: <b>{_esc(comparison.baseline)}</b>; class {_esc(comparison.class_name)}; "
           f"{comparison.boot} bootstrap resamples. Cells: value [95% CI] and ratio to the baseline; "
           f'<span class="noise">≈</span> marks a difference within run-to-run noise; ★ the winner.</p>']
    for stage in comparison.stages:
        levels = ", ".join(f"{k} {v:g}" for k, v in stage.levels.items() if v is not None)
        out.append(f"<h3>Stage {stage.stage} ({_esc(stage.kind)}: {_esc(levels)})</h3>")
        out.append(f'<div class="verdict">{_esc(stage.verdict)}</div>')
        for note in stage.notes:
            out.append(f'<div class="warn">{_esc(note)}</div>')
        out.append('<div class="scroll"><table><tr><th class="l">metric</th>' + "".join(f"<th>{_esc(l)}{_flag_badges(flags[l])}</th>" for l in labels) + "</tr>")
        for m in stage.metrics:
            cells = []
            for label in labels:
                cell = comparison_cell(m, label, comparison.baseline, times="×")
                if cell is None:
                    cells.append("<td>-</td>")
                    continue
                text, ratio = cell
                text = _esc(text + ratio) + (' <span class="noise">≈</span>' if ratio and m.within_noise.get(label) else "")
                cells.append(f"<td>{'★ ' if m.winner == label else ''}{text}</td>")
            out.append(f'<tr><td class="l">{_esc(METRICS[m.metric].label)}</td>' + "".join(cells) + "</tr>")
        out.append("</table></div>")
    return "\n".join(out)


def _fidelity_html(con: duckdb.DuckDBPyConnection, runs: list[dict], all_rows: dict[str, list[dict]],
                   labels: dict[str, str]) -> str:
    """Output fidelity (view fidelity_summary) of the matrices these runs belong to, beside each
    variant's best output tokens/s, so speed and output quality are read together."""
    matrices = sorted({r["tags"].get("matrix") for r in runs if r["tags"] and r["tags"].get("matrix")})
    if not matrices:
        return ""
    rows = fetch_dicts(con, "SELECT * FROM fidelity_summary WHERE list_contains(?, matrix_id) "
                       "ORDER BY matrix_id, created_unix, candidate", [matrices])
    if not rows:
        return ""
    speed: dict[str, float] = {}
    for r in runs:
        best = max((x["output_tokens_per_s"] for x in all_rows[labels[r["run_id"]]]
                    if x["output_tokens_per_s"] is not None), default=None)
        if r["variant"] and best is not None:
            speed[r["variant"]] = max(speed.get(r["variant"], best), best)
    head = ["matrix", "variant", "peak out tok/s", "prompts", "exact match", "mean first divergence",
            "mean similarity", "tokens"]
    out = ["<h2>Output fidelity</h2>",
           "<p>Greedy outputs (temperature 0, same seed) of each variant against the baseline's on the "
           "fidelity prompts (view <code>fidelity_summary</code>); peak out tok/s is the variant's best "
           "stage in the runs above.</p>",
           '<div class="scroll"><table><tr>' + "".join(f'<th class="l">{h}</th>' for h in head) + "</tr>"]
    shown_baselines = set()
    for r in rows:
        key = (r["matrix_id"], r["baseline"])
        if key not in shown_baselines:
            shown_baselines.add(key)
            cells = [r["matrix_id"], f"{r['baseline']} (baseline)", format_value("output_tokens_per_s", speed.get(r["baseline"])),
                     "-", "-", "-", "-", "-"]
            out.append("<tr>" + "".join(f'<td class="l">{_esc(c)}</td>' for c in cells) + "</tr>")
        div = r["mean_first_divergence"]
        cells = [r["matrix_id"], r["candidate"], format_value("output_tokens_per_s", speed.get(r["candidate"])), r["prompts"],
                 pct(r["exact_match_rate"]), "-" if div is None else f"{div:.1f} tok",
                 fmt(r["mean_similarity"], 3), r["token_source"]]
        out.append("<tr>" + "".join(f'<td class="l">{_esc(c)}</td>' for c in cells) + "</tr>")
    out.append("</table></div>")
    return "\n".join(out)


def build_report(con: duckdb.DuckDBPyConnection, run_ids: list[str], out_dir: Path, boot: int = 200) -> Path:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = [fetch_dicts(con, "SELECT * FROM run_overview WHERE run_id = ?", [r])[0] for r in run_ids]
    labels = _labels(runs)
    per_run = {r: stage_rows(con, r) for r in run_ids}
    all_rows = {labels[r]: [x for x in per_run[r] if x["class_name"] == "(all)"] for r in run_ids}
    slo = con.execute("SELECT min(slo_ttft_ms) FROM run_classes WHERE list_contains(?, run_id)", [run_ids]).fetchone()[0]

    figures: list[str] = []
    path = plots.throughput_vs_load(all_rows, out_dir / "throughput_vs_load.png")
    figures.append(_img(path, "throughput vs load", "Output tokens/s (and goodput) per load level, per run."))
    path = plots.latency_vs_load(all_rows, out_dir / "latency_vs_load.png", slo)
    figures.append(_img(path, "TTFT and ITL vs load", "TTFT and ITL (per-token view) p50 and p99 per load level."))
    path = plots.pareto(all_rows, out_dir / "pareto.png")
    figures.append(_img(path, "latency-throughput Pareto",
                        "Output tokens/s per GPU (runs.gpus) against output tokens/s per user (1000 / mean TPOT); "
                        "up and to the right is better."))
    curves = {}
    for r in run_ids:
        lines = {}
        tokens = fetch_dicts(con, "SELECT stage, level, quantile_cont(itl_ms, ?) AS q FROM itl_tokens "
                             "WHERE run_id = ? AND measured AND ok GROUP BY stage, level ORDER BY stage",
                             [CDF_POINTS, r])
        chunks = {c["stage"]: c for c in fetch_dicts(
            con, "SELECT stage, quantile_cont(gap_ms, ?) AS q, avg(tokens) AS k FROM itl_chunks "
            "WHERE run_id = ? AND measured AND ok GROUP BY stage", [CDF_POINTS, r])}
        for t in tokens:
            name = f"stage {t['stage']} (load {level_text(t['level'])})"
            lines[name] = list(zip(t["q"], CDF_POINTS))
            c = chunks.get(t["stage"])
            if c and c["k"] and c["k"] > 1.0:
                lines[f"{name} (chunk view)"] = list(zip(c["q"], CDF_POINTS))
        curves[labels[r]] = lines
    path = plots.itl_cdf(curves, out_dir / "itl_cdf.png")
    figures.append(_img(path, "ITL CDFs", "ITL CDFs per stage: per-token view solid, chunk view dashed "
                        "where chunks carry several tokens (speculative decoding)."))
    for i, r in enumerate(run_ids):
        client = fetch_dicts(con, "SELECT * FROM client_timeline WHERE run_id = ? ORDER BY t_unix", [r])
        server = fetch_dicts(con, "SELECT * FROM server_timeline WHERE run_id = ? ORDER BY t_unix", [r])
        stages = fetch_dicts(con, "SELECT * FROM stages WHERE run_id = ? ORDER BY stage", [r])
        run = runs[i]
        started = run["started_unix"] or (stages[0]["started_unix"] if stages else 0.0)
        path = plots.timeline(client, server, stages, started, f"{labels[r]}: client (top) and server (below)",
                              out_dir / f"timeline_{i + 1}.png")
        figures.append(_img(path, f"timeline {labels[r]}",
                            f"{labels[r]}: client latency and throughput per second over the server's queue, "
                            "KV-cache use and preemptions, on one time axis."))

    comparison_html = verdict_html = ""
    groups = groups_for_runs(con, run_ids)
    if len(groups) >= 2:
        comparison = compare_groups(con, groups, boot=boot)
        comparison_html = "<h2>Comparison</h2>" + _comparison_html(comparison)
        verdict_html = f'<div class="verdict"><b>Verdict:</b> {_esc(comparison.verdict)} (details under Comparison)</div>'

    warnings = []
    for run in runs:
        for flag in run["flags"] or []:
            warnings.append(f'<div class="warn"><span class="flag">{_esc(flag)}</span> run {_esc(labels[run["run_id"]])}: '
                            f'{_esc(FLAG_MEANING.get(flag, "flag set by the recorder"))}</div>')
        if run["status"] != "completed":
            warnings.append(f'<div class="warn">run {_esc(labels[run["run_id"]])} status is {_esc(run["status"])}</div>')

    sections = []
    for r in run_ids:
        sections.append(f"<h2>Run {_esc(labels[r])}</h2>")
        sections.append(_stage_table(per_run[r]))
        sections.append("<h3>Server</h3>" + _server_table(
            fetch_dicts(con, "SELECT * FROM server_stage_summary WHERE run_id = ? ORDER BY stage", [r])))
        frontier = fetch_dicts(con, "SELECT * FROM slo_frontier WHERE run_id = ? ORDER BY class_name", [r])
        if frontier:
            sections.append("<h3>SLO frontier (target 90%)</h3>" + _frontier_table(frontier))

    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    title = "servelab report: " + ", ".join(labels[r] for r in run_ids)
    body = "\n".join([
        f"<h1>{_esc(title)}</h1>",
        f'<p class="sub">generated {generated} by servelab {__version__}</p>',
        *warnings,
        verdict_html,
        "<h2>Runs</h2>", _runs_table(runs, labels),
        "<h2>Figures</h2>", *figures,
        comparison_html,
        _fidelity_html(con, runs, all_rows, labels),
        *sections,
        "<h2>Definitions</h2><dl>" + "".join(f"<dt>{_esc(k)}</dt><dd>{v}</dd>" for k, v in DEFINITIONS) + "</dl>",
    ])
    page = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{_esc(title)}</title>\n'
            f"<script>{PAGE_SCRIPT}</script>\n<style>{CSS}</style></head>\n<body>\n{body}\n</body></html>\n")
    report = out_dir / "report.html"
    report.write_text(page, encoding="utf-8")
    return report


def write_report(db, runs: list[str], out_dir: Path, boot: int = 200) -> Path:
    """``servelab report`` as a function: report.html and its PNGs for these runs (ids, unique
    prefixes or 'latest') of the database `db` (None: the default one) into `out_dir`."""
    from .db import open_for_reading, resolve_runs

    con = open_for_reading(db)
    try:
        return build_report(con, resolve_runs(con, runs), out_dir, boot=boot)
    finally:
        con.close()


__all__ = ["build_report", "write_report"]
