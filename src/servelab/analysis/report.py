"""``servelab report``: one self-contained report.html (inline CSS, PNGs embedded as base64, no
network) plus the PNG files, for one or more runs.

It reads as an engineer picking a variant would: the SLO frontier per variant first (the most
load each sustains within the target attainment, and its throughput there), the per-metric wins,
the stages with too few requests; then the figures (load on a log2 axis; latency scaled to the
data with the SLO marked; TTFT and ITL CDFs of all variants overlaid at shared load levels;
attainment and the latency-throughput curve), the comparison, and each run's tables. The data is
read once (report_data.py) and every figure drawn from it.
"""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import duckdb

from servelab import __version__

from . import plots, report_data
from .catalogue import FLAG_MEANING
from .compare import compare_groups, groups_for_runs
from .frontier import DEFAULT_TARGET
from servelab.core.bars import bar
from .report_html import CSS, DEFINITIONS, PAGE_SCRIPT, esc, img
from .report_phases import phases_html
from .report_sections import (comparison_html, energy_html, fidelity_html, headline_html, server_table,
                              stage_table)

# Kept importable under its old name: tests and callers label runs through it.
_labels = report_data.labels_for


def _figures(data, out_dir: Path, advance) -> list[str]:
    rows = data.all_rows
    kind = "predicted (cost model)" if data.predicted else "measured"
    figs = []
    path, facts = plots.throughput_vs_load(rows, out_dir / "throughput_vs_load.png")
    figs.append(img(path, "Output tokens per second and goodput against load, one line per variant",
                    f"Output tokens/s (solid) and goodput (dotted) per load level, per variant; {kind}, exact "
                    "(counts over each measured window).", facts))
    advance(note="latency")
    path, facts = plots.latency_vs_load(rows, out_dir / "latency_vs_load.png", data.slos)
    figs.append(img(path, "TTFT and ITL p50 and p99 against load per variant, with the SLO marked",
                    f"TTFT (exact) and ITL (per-token view, sketched: DDSketch, within 1%) p50 and p99 per load "
                    f"level; {kind}. Scaled to the data: an SLO outside the range is named at the edge.", facts))
    advance(note="attainment")
    path, facts = plots.attainment_vs_load(rows, out_dir / "slo_attainment_vs_load.png", data.target)
    figs.append(img(path, f"SLO attainment against load per variant, with the {data.target:.0%} target line",
                    f"Share of requests meeting every SLO of their class per load level (exact); {kind}. "
                    "The frontier is the last level before a line first falls below the target.", facts))
    advance(note="CDFs")
    path, facts = plots.cdf_overlay(data.cdf_panels, out_dir / "cdf_overlay.png")
    levels = ", ".join(f"{p['level']:g}" for p in data.cdf_panels) or "none shared"
    figs.append(img(path, "TTFT and ITL CDFs of all variants overlaid at the same load levels",
                    f"TTFT (exact) and ITL (per-token view, sketched within 1%) CDFs, every variant on one axis "
                    f"per load level ({levels}); columns share their x axis; {kind}.", facts))
    advance(note="Pareto")
    path, facts = plots.pareto(rows, out_dir / "pareto.png")
    figs.append(img(path, "Latency-throughput Pareto curve per variant",
                    "Output tokens/s per GPU (runs.gpus) against output tokens/s per user (1000 / mean TPOT), "
                    f"one curve per variant labelled by load; up and to the right is better; {kind}.", facts))
    from .plots_timeline import timeline

    for i, r in enumerate(data.run_ids):
        advance(note=f"timeline {i + 1}")
        stages = data.stages[r]
        started = data.runs[i]["started_unix"] or (stages[0]["started_unix"] if stages else 0.0)
        label = data.labels[r]
        path = timeline(data.client[r], data.server[r], stages, started, f"{label}: client (top) and server (below)",
                        out_dir / f"timeline_{i + 1}.png", engine=data.engine.get(r))
        figs.append(img(path, f"timeline of {label}: client latency and throughput over the server's state",
                        f"{label}: client latency and throughput per second over the server's queue, KV-cache use "
                        f"and preemptions, on one time axis; {kind}.", {"series": 1}))
    return figs


def _warnings(data) -> list[str]:
    out = []
    for run in data.runs:
        label = esc(data.labels[run["run_id"]])
        for flag in run["flags"] or []:
            out.append(f'<div class="warn"><span class="flag">{esc(flag)}</span> run {label}: '
                       f'{esc(FLAG_MEANING.get(flag, "flag set by the recorder"))}</div>')
        if run["status"] != "completed":
            out.append(f'<div class="warn">run {label} status is {esc(run["status"])}</div>')
    return out


def build_report(con: duckdb.DuckDBPyConnection, run_ids: list[str], out_dir: Path, boot: int = 200,
                 target: float = DEFAULT_TARGET, opening: str = "") -> Path:
    """`opening`: HTML placed first, before the frontier (the demo's answer: answer_text.render_html)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    steps = 7 + len(run_ids)
    with bar("report", steps) as advance:
        data = report_data.load(con, run_ids, target)
        advance(note="comparison")
        groups = groups_for_runs(con, run_ids)
        comparison = compare_groups(con, groups, boot=boot) if len(groups) >= 2 else None
        advance(note="throughput")
        figures = _figures(data, out_dir, advance)
        advance(note="page")
        fidelity = fidelity_html(con, data.runs, data.all_rows, data.labels)
    from .report_sections import runs_table
    from .search_section import search_section

    sections = []
    for i, r in enumerate(run_ids):
        sections += [f"<h2>Run {esc(data.labels[r])}</h2>",
                     search_section(con, r, data.labels[r], out_dir, i + 1),
                     stage_table(data.stage_rows[r]),
                     phases_html(con, r),
                     "<h3>Server</h3>" + server_table(data.server_rows[r]),
                     energy_html(con, r)]
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    title = "servelab report: " + ", ".join(data.labels[r] for r in run_ids)
    body = "\n".join([
        f"<h1>{esc(title)}</h1>",
        f'<p class="sub">generated {generated} by servelab {__version__}</p>',
        opening,
        headline_html(data, comparison),
        *_warnings(data),
        f'<div class="verdict"><b>Verdict:</b> {esc(comparison.verdict)} (details under Comparison)</div>'
        if comparison else '<p>One configuration only: nothing to compare, so no verdict.</p>',
        "<h2>Runs</h2>", runs_table(data.runs, data.labels),
        "<h2>Figures</h2>", *figures,
        "<h2>Comparison</h2>" + comparison_html(comparison) if comparison else "",
        fidelity,
        *sections,
        "<h2>Definitions</h2><dl>" + "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in DEFINITIONS) + "</dl>",
    ])
    page = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>\n'
            f"<script>{PAGE_SCRIPT}</script>\n<style>{CSS}</style></head>\n<body>\n{body}\n</body></html>\n")
    report = out_dir / "report.html"
    report.write_text(page, encoding="utf-8")
    return report


def write_report(db, runs: list[str], out_dir: Path, boot: int = 200, target: float = DEFAULT_TARGET,
                 opening: str = "") -> Path:
    """``servelab report`` as a function: report.html and its PNGs for these runs (ids, unique
    prefixes or 'latest') of the database `db` (None: the default one) into `out_dir`."""
    from .db import open_for_reading, resolve_runs

    con = open_for_reading(db)
    try:
        return build_report(con, resolve_runs(con, runs), out_dir, boot=boot, target=target, opening=opening)
    finally:
        con.close()


__all__ = ["build_report", "write_report"]
