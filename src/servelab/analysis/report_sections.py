"""The report's sections as HTML: the decision headline (SLO frontier, then per-metric wins, then
the thin-sample warnings), the runs, each run's stages and server figures, the comparison and
the output fidelity. Cells are formatted through the metric catalogue (catalogue.py)."""
from __future__ import annotations

import duckdb

from .catalogue import METRICS, comparison_cell, fmt, format_value, level_text, pct
from .db import fetch_dicts
from .frontier import headline, metric_wins, thin_stages
from .report_html import esc, flag_badges, table
from .summary import when

# Stage table: shown by default, then the columns behind "show all columns".
STAGE_SHOWN = ["ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "tpot_p50_ms", "e2e_p99_ms",
               "output_tokens_per_s", "goodput", "slo_attainment"]
STAGE_MORE = ["ttft_p90_ms", "ttft_p99_adj_ms", "itl_chunk_p99_ms", "tpot_p99_ms", "e2e_p50_ms",
              "output_tokens_per_s_per_gpu", "output_tokens_per_s_per_user", "requests_per_s"]
SERVER_SHOWN = ["running_mean", "waiting_mean", "kv_cache_usage_mean", "preemptions_per_s"]
SERVER_MORE = ["waiting_max", "kv_cache_usage_max", "generation_tokens_per_s", "prefix_cache_hit_rate",
               "spec_acceptance_rate", "spec_mean_acceptance_length"]
UNITS = {"ms": "ms", "tokens/s": "tok/s", "requests/s": "req/s", "share": "%", "1/s": "/s", "count": "", "tokens": "tok"}


def header(name: str) -> str:
    """A metric's column heading with its unit, as a 1,400 px table needs them."""
    m = METRICS[name]
    unit = UNITS.get(m.unit, m.unit)
    return esc(m.header) + (f" <small>({esc(unit)})</small>" if unit and unit not in m.header else "")


def headline_html(data, comparison) -> str:
    """What decides: the frontier per variant, the per-metric wins, the thin-sample warnings."""
    t = data.target
    unit = lambda f: "req/s" if f.kind in ("rate", "trace") else "users"  # noqa: E731
    rows = [[f.label, f"{level_text(f.max_level)} {unit(f)}" if f.max_level is not None else "none",
             format_value("output_tokens_per_s", f.tokens_per_s), format_value("goodput", f.goodput),
             level_text(f.first_failing), f"{level_text(f.top_level)} ({f.levels} levels)"] for f in data.frontier]
    out = [f'<section id="frontier" data-target="{t:g}">',
           f'<div class="headline" id="headline"><b>SLO frontier (target {t:.0%}):</b> {esc(headline(data.frontier, t))}</div>',
           table(["variant", f"highest load with SLO attainment &ge; {t:.0%}", "output tok/s there",
                  "goodput there (req/s)", "first load below target", "highest load tried"], rows, left={0}),
           "<p>From view <code>slo_frontier_at(target)</code>: the highest load before attainment first "
           "drops below the target (a later level that passes again does not count). "
           + ("Figures are <b>predicted</b> (cost model), not measured. " if data.predicted else "")
           + "</p></section>"]
    if comparison is not None:
        wins = metric_wins(comparison)
        items = "".join(f"<li><b>{esc(label)}</b>: " + esc(", ".join(METRICS[m].label for m in ms)) + "</li>"
                        for label, ms in wins.items())
        out.append(f'<h3>Per-metric wins</h3><p>Each metric goes to the variant that wins it at most stages '
                   f"(details under Comparison).</p><ul id=\"wins\">{items or '<li>no metric has a winner</li>'}</ul>")
    notes = thin_stages(data.all_rows, comparison)
    if notes:
        out.append(f'<h3>Too few requests</h3><div id="thin">'
                   + "".join(f'<div class="thin">{esc(n)}</div>' for n in notes[:40])
                   + (f'<div class="thin">... and {len(notes) - 40} more</div>' if len(notes) > 40 else "") + "</div>")
    return "\n".join(out)


def runs_table(runs: list[dict], labels: dict[str, str]) -> str:
    head = ["label", "run", "status", "requests", "errors", "flags", "started (UTC)", "profile", "variant",
            "hardware", "model", "GPUs", "target"]
    rows = [[labels[r["run_id"]], r["run_id"], r["status"], r["requests"], r["errors"], flag_badges(r["flags"]),
             when(r["started_unix"]), r["profile_name"], r["variant"], r["hardware"], r["model"], r["gpus"], r["target"]]
            for r in runs]
    rows = [["-" if c is None else c for c in row] for row in rows]
    return table(head, rows, optional=set(range(6, 13)), left=set(range(13)), raw={5})


def stage_table(rows: list[dict]) -> str:
    names = STAGE_SHOWN + STAGE_MORE
    head = ["stage", "load", "class", "requests", "errors"] + [header(n) for n in names] + ["errors by kind"]
    cells = []
    for r in rows:
        kinds = ", ".join(f"{k}: {v}" for k, v in sorted((r["errors_by_kind"] or {}).items()))
        cells.append([r["stage"], level_text(r["level"]), r["class_name"], r["requests"], r["errors"]]
                     + [format_value(n, r[n]) for n in names] + [kinds])
    first_more = 5 + len(STAGE_SHOWN)
    return table(head, cells, optional=set(range(first_more, len(head))), left={2, len(head) - 1},
                 row_class=["all" if r["class_name"] == "(all)" else "" for r in rows])


def server_table(rows: list[dict]) -> str:
    if not any(r["samples"] for r in rows):
        return "<p>No server metrics were scraped for this run (predicted runs and targets without /metrics have none).</p>"
    names = SERVER_SHOWN + SERVER_MORE
    return table(["stage"] + [header(n) for n in names], [[r["stage"]] + [format_value(n, r[n]) for n in names] for r in rows],
                 optional=set(range(1 + len(SERVER_SHOWN), 1 + len(names))))


def energy_html(con: duckdb.DuckDBPyConnection, run_id: str) -> str:
    """The run's GPU energy per stage (view gpu_stage_energy), or nothing without GPU samples."""
    from .energy import SHOWN, energy_rows

    rows = energy_rows(con, run_id)
    if not rows:
        return ""
    return ("<h3>GPU energy</h3>" + table(
        ["stage", "method"] + [header(n) for n in SHOWN],
        [[r["stage"], r["method"] or "-"] + [format_value(n, r[n]) for n in SHOWN] for r in rows])
        + "<p>From view <code>gpu_stage_energy</code>: the GPUs' energy in each measured window "
          "(the board's energy counter, else power integrated over the samples) over the output "
          "tokens that arrived in it.</p>")


def comparison_html(comparison) -> str:
    labels = [g.label for g in comparison.groups]
    flags = {g.label: g.flags for g in comparison.groups}
    out = [f'<div class="verdict"><b>Overall:</b> {esc(comparison.verdict)}</div>',
           *(f'<div class="warn">{esc(c)}</div>' for c in comparison.caveats),
           f"<p>Baseline: <b>{esc(comparison.baseline)}</b>; class {esc(comparison.class_name)}; "
           f"{comparison.boot} bootstrap resamples. Cells: value [95% CI] and ratio to the baseline; "
           f'<span class="noise">≈</span> marks a difference within run-to-run noise; ★ the winner.</p>']
    for stage in comparison.stages:
        levels = ", ".join(f"{k} {v:g}" for k, v in stage.levels.items() if v is not None)
        out.append(f"<h3>Stage {stage.stage} ({esc(stage.kind)}: {esc(levels)})</h3>")
        out.append(f'<div class="verdict">{esc(stage.verdict)}</div>')
        for note in stage.notes:
            out.append(f'<div class="warn">{esc(note)}</div>')
        out.append('<div class="scroll"><table><tr><th class="l">metric</th>' + "".join(f"<th>{esc(l)}{flag_badges(flags[l])}</th>" for l in labels) + "</tr>")
        for m in stage.metrics:
            cells = []
            for label in labels:
                cell = comparison_cell(m, label, comparison.baseline, times="×")
                if cell is None:
                    cells.append("<td>-</td>")
                    continue
                text, ratio = cell
                text = esc(text + ratio) + (' <span class="noise">≈</span>' if ratio and m.within_noise.get(label) else "")
                cells.append(f"<td>{'★ ' if m.winner == label else ''}{text}</td>")
            out.append(f'<tr><td class="l">{esc(METRICS[m.metric].label)}</td>' + "".join(cells) + "</tr>")
        out.append("</table></div>")
    return "\n".join(out)


def fidelity_html(con: duckdb.DuckDBPyConnection, runs: list[dict], all_rows: dict[str, list[dict]], labels: dict[str, str]) -> str:
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
            out.append("<tr>" + "".join(f'<td class="l">{esc(c)}</td>' for c in cells) + "</tr>")
        div = r["mean_first_divergence"]
        cells = [r["matrix_id"], r["candidate"], format_value("output_tokens_per_s", speed.get(r["candidate"])), r["prompts"],
                 pct(r["exact_match_rate"]), "-" if div is None else f"{div:.1f} tok",
                 fmt(r["mean_similarity"], 3), r["token_source"]]
        out.append("<tr>" + "".join(f'<td class="l">{esc(c)}</td>' for c in cells) + "</tr>")
    out.append("</table></div>")
    return "\n".join(out)


