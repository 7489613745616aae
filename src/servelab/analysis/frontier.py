"""The report's headline: per variant, the SLO frontier (view slo_frontier_at: the highest load
whose SLO attainment stays at or above the target, and the throughput there), then the
per-metric wins of the comparison, and the stages whose figures rest on too few requests.

The frontier's definition is the SQL macro's (analysis/70_slo_frontier.sql); this module only
reads it at the report's target and orders it for reading.
"""
from __future__ import annotations

from dataclasses import dataclass

import duckdb

from .db import fetch_dicts

DEFAULT_TARGET = 0.95
MIN_REQUESTS = 30  # below this a stage's p99 is one of its few slowest requests


@dataclass
class FrontierRow:
    label: str
    run_id: str
    kind: str | None
    max_level: float | None  # highest load meeting the target before attainment first drops
    tokens_per_s: float | None  # output tokens/s there
    goodput: float | None
    first_failing: float | None
    levels: int
    top_level: float | None  # the highest load the run tried


def frontier_rows(con: duckdb.DuckDBPyConnection, run_ids: list[str], labels: dict[str, str],
                  target: float = DEFAULT_TARGET) -> list[FrontierRow]:
    """One row per run (class '(all)'), best frontier first (highest load, then throughput)."""
    rows = fetch_dicts(con, "SELECT * FROM slo_frontier_at(?) WHERE list_contains(?, run_id) AND class_name = '(all)'",
                       [target, run_ids])
    # A search's probes are stages of kind 'search'; its run's load_kind says users or requests/s.
    load_kinds = dict(con.execute("SELECT run_id, load_kind FROM runs WHERE list_contains(?, run_id)",
                                  [run_ids]).fetchall())
    out = [FrontierRow(labels[r["run_id"]], r["run_id"],
                       load_kinds.get(r["run_id"]) if r["kind"] == "search" else r["kind"],
                       r["max_level_meeting_target"],
                       r["output_tokens_per_s_at_max_level"], r["goodput_at_max_level"], r["first_failing_level"],
                       r["levels"], r["max_level"]) for r in rows]
    out.sort(key=lambda f: (-(f.max_level if f.max_level is not None else -1.0), -(f.tokens_per_s or 0.0)))
    return out


def headline(rows: list[FrontierRow], target: float) -> str:
    """One sentence: who sustains the most load within the target, and by how much."""
    if not rows:
        return "no run has load levels with requests, so there is no SLO frontier to read"
    best = rows[0]
    if best.max_level is None:
        return (f"no variant keeps SLO attainment at or above {target:.0%} even at its lowest load; "
                "read the per-metric wins and the latency panels below")
    unit = "requests/s" if best.kind in ("rate", "trace") else "users"
    tail = ""
    if len(rows) > 1:
        second = rows[1]
        if second.max_level is None:
            tail = f"; {second.label} meets it at no load tried"
        elif second.max_level == best.max_level:
            tail = f"; {second.label} reaches the same load"
        else:
            tail = f", {best.max_level / second.max_level:.2g}x the {second.max_level:g} {unit} of {second.label}"
    tps = "-" if best.tokens_per_s is None else f"{best.tokens_per_s:,.0f}"
    return (f"{best.label} sustains {best.max_level:g} {unit} with SLO attainment at or above {target:.0%} "
            f"({tps} output tokens/s there){tail}")


def metric_wins(comparison) -> dict[str, list[str]]:
    """label -> the compared metrics it wins at the most stages (clear wins and noisy ones alike)."""
    tally: dict[str, dict[str, int]] = {}
    for stage in comparison.stages:
        for m in stage.metrics:
            if m.winner is not None:
                tally.setdefault(m.metric, {}).setdefault(m.winner, 0)
                tally[m.metric][m.winner] += 1
    wins: dict[str, list[str]] = {}
    for metric, counts in tally.items():
        wins.setdefault(max(counts, key=counts.get), []).append(metric)
    return wins


def thin_stages(stage_rows: dict[str, list[dict]], comparison=None) -> list[str]:
    """Sentences naming the stages whose figures rest on too few samples: fewer than MIN_REQUESTS
    completed requests, or a latency interval of zero width (every resample drew the same value:
    too few distinct requests). Shares at 0% or 100% have zero-width intervals honestly, so only
    millisecond metrics are checked."""
    notes = []
    for label, rows in stage_rows.items():
        for r in rows:
            if r["class_name"] == "(all)" and (r["completed"] or 0) < MIN_REQUESTS:
                notes.append(f"{label} stage {r['stage']}: {r['completed'] or 0} completed requests "
                             f"(fewer than {MIN_REQUESTS}): its percentiles are a few requests' values")
    if comparison is not None:
        from .catalogue import METRICS

        for stage in comparison.stages:
            for m in stage.metrics:
                # Sketched ITL can be zero-width from the 1% buckets alone (a stage inside one bucket).
                if METRICS[m.metric].unit != "ms" or (m.metric.startswith("itl") and not comparison.itl_exact):
                    continue
                for label, iv in m.intervals.items():
                    if iv is not None and iv[0] == iv[1]:
                        notes.append(f"{label} stage {stage.stage}: the {METRICS[m.metric].label} interval has "
                                     "zero width (too few distinct samples to say how noisy it is)")
    return notes
