"""Side-by-side comparison of runs or variants, per stage, with bootstrap confidence intervals.

Groups (groups.py): the runs being compared, grouped by configuration; runs of one configuration
are repeats. Point estimates are the views' own: a group of one run reads its stage_summary row;
a group of repeats pools its runs' request_metrics / itl_chunks rows with the same definitions
(bootstrap.py, all weights 1). Confidence intervals come from a bootstrap over those rows:
resample the runs of a group (when it has repeats), then the requests of each drawn run (in
random blocks of equal size at campaign scale: bootstrap.py says why that is the same
interval), and recompute. A difference is "within noise" when the 95% interval of the ratio to
the baseline contains 1. The compared metrics, their labels and better directions are catalogue.COMPARED.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import numpy as np

from servelab.core.errors import ServelabError

from .bootstrap import Estimator, load_stage, load_stages
from .catalogue import COMPARED, FLAG_MEANING, METRICS, better
from .db import fetch_dicts
from .energy import energy_note
from .exact import EXACT_ITL, exact_itl
from .groups import Group, attach_flags, groups_for_runs, groups_for_variants
from servelab.core.bars import track
from .stats import percentile_interval, ratio

__all__ = ["Comparison", "Group", "MetricResult", "StageComparison", "compare_groups", "compare_runs",
           "groups_for_runs", "groups_for_variants", "stage_verdict"]


@dataclass
class MetricResult:
    metric: str
    values: dict[str, float]
    intervals: dict[str, tuple[float, float] | None]
    ratios: dict[str, float]  # to the baseline
    ratio_intervals: dict[str, tuple[float, float] | None]
    within_noise: dict[str, bool | None]  # vs the baseline
    winner: str | None = None
    winner_clear: bool | None = None  # winner vs runner-up outside noise (None: unknown)
    runner_up: str | None = None


@dataclass
class StageComparison:
    stage: int
    levels: dict[str, float | None]
    kind: str | None
    metrics: list[MetricResult]
    verdict: str
    notes: list[str] = field(default_factory=list)


@dataclass
class Comparison:
    groups: list[Group]
    baseline: str
    class_name: str
    stages: list[StageComparison]
    boot: int
    verdict: str
    itl_exact: bool = False  # one-run groups' ITL percentiles: exact, or sketched (DDSketch, 1%)

    @property
    def caveats(self) -> list[str]:
        """One sentence per flagged group, to print beside the verdict."""
        return [f"{g.label} is flagged {flag}: {FLAG_MEANING.get(flag, 'set by the recorder')}"
                for g in self.groups for flag in g.flags]


def _phrase(metric: str) -> str:
    m = METRICS[metric]
    return ("the highest " if m.better == "higher" else "the lowest ") + m.label


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def stage_verdict(labels: list[str], metrics: list[MetricResult]) -> str:
    judged = [m for m in metrics if m.winner is not None]
    present = [label for label in labels if any(label in m.values and not np.isnan(m.values[label]) for m in metrics)]
    if len(present) < 2:
        return (f"only {present[0]} has measured requests at this stage; nothing to compare" if present
                else "nothing to compare at this stage (no measured requests)")
    if not judged:
        return "every metric is a tie"
    winners = {m.winner for m in judged}
    noisy = [METRICS[m.metric].label for m in judged if m.winner_clear is False]
    tail = f" (a lead within run-to-run noise: {_join(noisy)})" if noisy else ""
    if len(winners) == 1:
        return f"{judged[0].winner} wins every metric{tail}"
    by_winner: dict[str, list[str]] = {}
    for m in judged:
        by_winner.setdefault(m.winner, []).append(m.metric)
    parts = []
    for label in labels:
        if label in by_winner:
            parts.append(f"{label} has " + _join([_phrase(x) for x in by_winner[label]]))
    return "no variant wins every metric: " + "; ".join(parts) + tail


def _summary_points(con: duckdb.DuckDBPyConnection, run_ids: list[str], class_name: str) -> dict[tuple, tuple]:
    """(run_id, stage) -> the compared columns of its stage_summary row, then window_s and
    output_tokens_in_window (the bootstrap's throughput inputs), for all runs in one read: the view
    costs seconds at campaign scale, so it is read once."""
    cols = ", ".join([m.column for m in COMPARED] + ["window_s", "output_tokens_in_window"])
    return {(r[0], r[1]): r[2:] for r in con.execute(
        f"SELECT run_id, stage, {cols} FROM stage_summary WHERE list_contains(?, run_id) AND class_name = ?",
        [run_ids, class_name]).fetchall()}


def _view_point(rows: dict[tuple, tuple], run_id: str, stage: int, class_name: str,
                exact: dict | None = None) -> dict[str, float]:
    """A one-run group's figures: its stage_summary row, read as it stands (ITL percentiles
    sketched), or with `exact` (exact.exact_itl of its run) its ITL percentiles exact."""
    row = rows.get((run_id, stage))
    point = {m.name: math.nan if row is None or row[i] is None else float(row[i]) for i, m in enumerate(COMPARED)}
    if exact is not None and row is not None:
        got = exact.get((run_id, stage, class_name), {})
        point.update({k: math.nan if got.get(k) is None else float(got[k]) for k in point if k in EXACT_ITL})
    return point


def _judge(metric: str, labels: list[str], baseline: str, values: dict[str, float],
           replicates: dict[str, dict[str, np.ndarray]]) -> MetricResult:
    """Intervals, ratios to the baseline, and the winner of one metric at one stage."""
    intervals, ratios, ratio_iv, noise = {}, {}, {}, {}
    for label in values:
        reps = replicates[label].get(metric)
        intervals[label] = percentile_interval(reps) if reps is not None else None
        if baseline in values:
            ratios[label] = float(ratio(values[label], values[baseline]))
            base_reps = replicates[baseline].get(metric)
            if reps is not None and base_reps is not None and label != baseline:
                ratio_iv[label] = percentile_interval(ratio(reps, base_reps))
            else:
                ratio_iv[label] = None
            iv = ratio_iv[label]
            noise[label] = None if iv is None else bool(iv[0] <= 1 <= iv[1])
    result = MetricResult(metric, values, intervals, ratios, ratio_iv, noise)
    ranked = [label for label in labels if label in values and not np.isnan(values[label])]
    if len(ranked) < 2:  # a metric only one group has is not a contest
        return result
    best = ranked[0]
    for label in ranked[1:]:
        if better(metric, values[label], values[best]):
            best = label
    others = [label for label in ranked if label != best]
    runner = others[0]
    for label in others[1:]:
        if better(metric, values[label], values[runner]):
            runner = label
    result.runner_up = runner
    if values[best] == values[runner]:
        best = None  # a tie has no winner
    else:
        a = replicates[best].get(metric)
        b = replicates[runner].get(metric)
        iv = percentile_interval(ratio(a, b)) if a is not None and b is not None else None
        result.winner_clear = None if iv is None else not (iv[0] <= 1 <= iv[1])
    result.winner = best
    return result


def _resolve_baseline(groups: list[Group], baseline: str | None) -> str:
    labels = [g.label for g in groups]
    if baseline is None:
        return labels[0]
    if baseline in labels:
        return baseline
    match = [g.label for g in groups if baseline in g.run_ids or baseline == g.variant]
    if not match:
        raise ServelabError(f"--baseline {baseline}: not one of the compared groups ({', '.join(labels)})")
    return match[0]


def compare_groups(
    con: duckdb.DuckDBPyConnection,
    groups: list[Group],
    baseline: str | None = None,
    class_name: str = "(all)",
    boot: int = 400,
    seed: int = 0,
    exact: bool = False,
) -> Comparison:
    if len(groups) < 2:
        raise ServelabError("compare needs at least two runs or variants (of different configurations)")
    attach_flags(con, groups)
    labels = [g.label for g in groups]
    baseline = _resolve_baseline(groups, baseline)
    rng = np.random.default_rng(seed)
    stage_rows = fetch_dicts(
        con,
        "SELECT run_id, stage, kind, level FROM stages WHERE list_contains(?, run_id) ORDER BY stage",
        [[r for g in groups for r in g.run_ids]],
    )
    singles = [g.run_ids[0] for g in groups if len(g.run_ids) == 1]
    exact_rows = exact_itl(con, singles) if exact else None
    points = _summary_points(con, [r for g in groups for r in g.run_ids], class_name)
    # Default: every stage's rows in two reads beside the stage_summary read above, ITL resampled
    # from the requests' sketches (the figure stage_summary shows); --exact reads each stage's
    # chunk gaps (exact, slower).
    windows = {key: row[len(COMPARED):] for key, row in points.items()}
    batched = None if exact else load_stages(con, [g.run_ids for g in groups], class_name, windows)
    results = []
    stages = sorted({r["stage"] for r in stage_rows})
    for stage in track(stages, "compare: stages", len(stages)):
        levels, notes, estimates, replicates = {}, [], {}, {}
        for g in groups:
            rows = [r for r in stage_rows if r["stage"] == stage and r["run_id"] in g.run_ids]
            levels[g.label] = rows[0]["level"] if rows else None
            if not rows:
                notes.append(f"{g.label} has no stage {stage}")
                continue
            data = batched.get((groups.index(g), stage)) if batched is not None else None
            est = Estimator(data if data is not None else load_stage(con, g.run_ids, stage, class_name))
            estimates[g.label] = (_view_point(points, g.run_ids[0], stage, class_name, exact_rows) if len(g.run_ids) == 1
                                  else est.point())
            replicates[g.label] = est.resample(rng, boot) if est.n else {}
        notes += energy_note(con, groups, stage, baseline)
        distinct_levels = {v for v in levels.values() if v is not None}
        if len(distinct_levels) > 1:
            notes.append("the groups ran this stage at different loads: "
                         + ", ".join(f"{k}={v:g}" for k, v in levels.items() if v is not None))
        metrics = [_judge(m.name, labels, baseline, {k: v[m.name] for k, v in estimates.items()}, replicates)
                   for m in COMPARED]
        kind = next((r["kind"] for r in stage_rows if r["stage"] == stage), None)
        results.append(StageComparison(stage, levels, kind, metrics, stage_verdict(labels, metrics), notes))
    overall = _overall_verdict(labels, results)
    return Comparison(groups, baseline, class_name, results, boot, overall, exact)


def _overall_verdict(labels: list[str], stages: list[StageComparison]) -> str:
    winners = {m.winner for s in stages for m in s.metrics if m.winner is not None}
    if not winners:
        return "no stage had measured requests to compare"
    if len(winners) == 1:
        return f"{winners.pop()} wins every metric at every stage"
    counts = {label: sum(1 for s in stages for m in s.metrics if m.winner == label) for label in labels}
    total = sum(counts.values())
    shares = ", ".join(f"{label} {n} of {total}" for label, n in counts.items() if n)
    return f"no variant wins every metric (metric x stage wins: {shares})"


def compare_runs(db: str | Path | None, runs: list[str] | None = None, *, variants: list[str] | None = None,
                 profile: str | None = None, baseline: str | None = None, class_name: str = "(all)",
                 boot: int = 400, seed: int = 0, console=None, exact: bool = False,
                 wide: bool = False) -> Comparison:
    """``servelab compare`` as a function: compare these runs (ids, unique prefixes or 'latest') or
    these variants' completed runs on one profile, print the tables to `console` (a rich Console;
    None: the terminal's, False: print nothing) and return the comparison."""
    from .db import open_for_reading, resolve_runs
    from .summary import make_console, print_comparison

    if bool(runs) == bool(variants):
        raise ServelabError("give either run ids (servelab compare RUN RUN ...) or --variants A,B,..., not both or neither")
    con = open_for_reading(db)
    try:
        groups = (groups_for_variants(con, variants, profile) if variants
                  else groups_for_runs(con, resolve_runs(con, runs)))
        result = compare_groups(con, groups, baseline, class_name, boot=boot, seed=seed, exact=exact)
    finally:
        con.close()
    if console is not False:
        print_comparison(result, console or make_console(), wide)
    return result
