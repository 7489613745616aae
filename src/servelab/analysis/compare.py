"""Side-by-side comparison of runs or variants, per stage, with bootstrap confidence intervals.

Groups: the runs being compared, grouped by configuration (variant, profile, hardware, model);
runs of one configuration are repeats. Point estimates are computed from the raw rows of
``request_metrics`` and ``itl_chunks`` with the same definitions as ``stage_summary`` (for a
single run they are equal to it). Confidence intervals come from a bootstrap: resample the runs
of a group (when it has repeats), then the requests of each drawn run, and recompute. A
difference is "within noise" when the 95% interval of the ratio to the baseline contains 1.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import duckdb
import numpy as np

from servelab.core.errors import ServelabError

from .db import fetch_dicts
from .stats import percentile_interval, ratio, weighted_quantiles

# (column, label for sentences, better): the metrics compared and judged, in display order.
METRICS = [
    ("output_tokens_per_s", "output tokens/s", "higher"),
    ("goodput", "goodput", "higher"),
    ("slo_attainment", "SLO attainment", "higher"),
    ("ttft_p50_ms", "p50 TTFT", "lower"),
    ("ttft_p99_ms", "p99 TTFT", "lower"),
    ("itl_p50_ms", "p50 ITL", "lower"),
    ("itl_p99_ms", "p99 ITL", "lower"),
    ("tpot_p50_ms", "p50 TPOT", "lower"),
    ("e2e_p99_ms", "p99 E2E", "lower"),
    ("error_rate", "error rate", "lower"),
]
METRIC_LABEL = {m: label for m, label, _ in METRICS}
METRIC_BETTER = {m: better for m, _, better in METRICS}
PERCENTILES = {  # column -> (request column or 'itl', q)
    "ttft_p50_ms": ("ttft_ms", 0.5),
    "ttft_p99_ms": ("ttft_ms", 0.99),
    "tpot_p50_ms": ("tpot_ms", 0.5),
    "e2e_p99_ms": ("e2e_ms", 0.99),
    "itl_p50_ms": ("itl", 0.5),
    "itl_p99_ms": ("itl", 0.99),
}


@dataclass
class Group:
    label: str
    run_ids: list[str]
    variant: str | None = None
    profile: str | None = None
    flags: list[str] = field(default_factory=list)  # union of its runs' run_overview.flags

    @property
    def header(self) -> str:
        """The label as a table column shows it: flagged groups carry their flags, so a number
        from an unverified or mismatched server is never read as a clean one."""
        return self.label + (f" [{', '.join(self.flags)}]" if self.flags else "")


@dataclass
class StageData:
    """Raw rows of one group at one stage, pooled over its runs (requests in run order)."""

    run_sizes: list[int]
    windows: np.ndarray  # per run: measured window (s)
    window_tokens: np.ndarray  # per run: output tokens that arrived in the window
    ok: np.ndarray
    slo_met: np.ndarray
    columns: dict[str, np.ndarray]  # ttft_ms, tpot_ms, e2e_ms per request (NaN when undefined)
    itl_values: np.ndarray  # per chunk gap: gap / tokens
    itl_request: np.ndarray  # index of the gap's request in the pooled arrays
    itl_tokens: np.ndarray  # tokens of the chunk (the gap's weight)


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

    @property
    def caveats(self) -> list[str]:
        """One sentence per flagged group, to print beside the verdict."""
        from .summary import FLAG_MEANING

        return [f"{g.label} is flagged {flag}: {FLAG_MEANING.get(flag, 'set by the recorder')}"
                for g in self.groups for flag in g.flags]


def attach_flags(con: duckdb.DuckDBPyConnection, groups: list[Group]) -> None:
    """Each group's flags: every flag any of its runs carries (run_overview.flags), in first-seen order."""
    rows = {r["run_id"]: r["flags"] or [] for r in fetch_dicts(
        con, "SELECT run_id, flags FROM run_overview WHERE list_contains(?, run_id)",
        [[r for g in groups for r in g.run_ids]])}
    for g in groups:
        g.flags = list(dict.fromkeys(f for r in g.run_ids for f in rows.get(r, [])))


def _config_key(row: dict) -> tuple:
    return (row["variant"], row["profile_name"], row["hardware"], row["model"])


def groups_for_runs(con: duckdb.DuckDBPyConnection, run_ids: list[str]) -> list[Group]:
    """Given runs, grouped by configuration: runs sharing variant, profile, hardware and model
    are repeats of one group."""
    rows = {r["run_id"]: r for r in fetch_dicts(
        con, "SELECT run_id, variant, profile_name, hardware, model FROM runs WHERE list_contains(?, run_id)", [run_ids])}
    by_key: dict[tuple, Group] = {}
    for run_id in run_ids:
        row = rows[run_id]
        key = _config_key(row)
        if key not in by_key:
            by_key[key] = Group(label="", run_ids=[], variant=row["variant"], profile=row["profile_name"])
        by_key[key].run_ids.append(run_id)
    groups = list(by_key.values())
    if len(groups) < 2 <= len(run_ids):
        # All given runs share one configuration: the user wants them compared one by one.
        groups = [Group(label="", run_ids=[r], variant=rows[r]["variant"], profile=rows[r]["profile_name"])
                  for r in run_ids]
    variants = [g.variant for g in groups]
    for g in groups:
        if g.variant and variants.count(g.variant) == 1:
            g.label = g.variant
        elif len(g.run_ids) == 1:
            g.label = g.run_ids[0] if not g.variant else f"{g.variant}@{g.run_ids[0]}"
        else:
            g.label = f"{g.variant or 'runs'}({','.join(r[:8] for r in g.run_ids)})"
    return groups


def groups_for_variants(con: duckdb.DuckDBPyConnection, variants: list[str], profile: str | None = None) -> list[Group]:
    """Completed runs of each variant on one profile: the given profile, else the most recently
    run profile that every variant has completed runs of."""
    runs = fetch_dicts(
        con,
        "SELECT run_id, variant, profile_name, started_unix FROM runs "
        "WHERE list_contains(?, variant) AND status = 'completed' ORDER BY started_unix",
        [variants],
    )
    missing = [v for v in variants if not any(r["variant"] == v for r in runs)]
    if missing:
        raise ServelabError(
            f"--variants: no completed run of {', '.join(missing)} in the database; "
            "`servelab runs` lists the variants that were run"
        )
    if profile is None:
        common = set.intersection(*({r["profile_name"] for r in runs if r["variant"] == v} for v in variants))
        if not common:
            raise ServelabError(
                "--variants: these variants were never run with the same traffic profile, so their stages "
                "do not correspond; run them on one profile, or pass the run ids to compare"
            )
        latest = {p: max(r["started_unix"] or 0 for r in runs if r["profile_name"] == p) for p in common}
        profile = max(latest, key=latest.get)
    groups = []
    for v in variants:
        ids = [r["run_id"] for r in runs if r["variant"] == v and r["profile_name"] == profile]
        if not ids:
            raise ServelabError(f"--variants: variant {v} has no completed run with profile {profile}")
        groups.append(Group(label=v, run_ids=ids, variant=v, profile=profile))
    return groups


def load_stage(con: duckdb.DuckDBPyConnection, run_ids: list[str], stage: int, class_name: str) -> StageData:
    class_filter = "" if class_name == "(all)" else "AND coalesce(class_name, '(none)') = ?"
    extra = [] if class_name == "(all)" else [class_name]
    sizes, windows, tokens, parts, itl_parts = [], [], [], [], []
    offset = 0
    for run_id in run_ids:
        req = con.execute(
            "SELECT ok, slo_met, ttft_ms, tpot_ms, e2e_ms FROM request_metrics "
            f"WHERE run_id = ? AND stage = ? AND measured AND NOT dropped {class_filter} ORDER BY request_id",
            [run_id, stage, *extra],
        ).fetchnumpy()
        # The gaps of each request, tagged with the request's position in `req` (same order).
        itl = con.execute(
            f"""WITH r AS (
                    SELECT request_id, row_number() OVER (ORDER BY request_id) - 1 AS idx FROM request_metrics
                    WHERE run_id = ? AND stage = ? AND measured AND NOT dropped {class_filter})
                SELECT r.idx, c.itl_ms, c.tokens FROM itl_chunks c JOIN r USING (request_id)
                WHERE c.run_id = ? AND c.stage = ? AND c.measured AND c.ok""",
            [run_id, stage, *extra, run_id, stage],
        ).fetchnumpy()
        summary = con.execute(
            "SELECT window_s, output_tokens_in_window FROM stage_summary WHERE run_id = ? AND stage = ? AND class_name = ?",
            [run_id, stage, class_name],
        ).fetchone()
        windows.append(summary[0] if summary and summary[0] else np.nan)
        tokens.append(summary[1] if summary else 0.0)
        n = len(req["ok"])
        sizes.append(n)
        parts.append(req)
        itl_parts.append((np.asarray(itl["idx"], dtype=np.int64) + offset, itl["itl_ms"], itl["tokens"]))
        offset += n

    def column(name, parts=parts):
        arrays = [np.ma.filled(np.ma.asarray(p[name], dtype=float), np.nan) for p in parts]
        return np.concatenate(arrays) if arrays else np.zeros(0)

    def flags(name):
        arrays = [np.ma.filled(np.ma.asarray(p[name]), False).astype(bool) for p in parts]
        return np.concatenate(arrays) if arrays else np.zeros(0, dtype=bool)

    return StageData(
        run_sizes=sizes,
        windows=np.array(windows, dtype=float),
        window_tokens=np.array(tokens, dtype=float),
        ok=flags("ok"),
        slo_met=flags("slo_met"),
        columns={k: column(k) for k in ("ttft_ms", "tpot_ms", "e2e_ms")},
        itl_values=np.concatenate([np.asarray(v, dtype=float) for _, v, _ in itl_parts]) if itl_parts else np.zeros(0),
        itl_request=np.concatenate([i for i, _, _ in itl_parts]) if itl_parts else np.zeros(0, dtype=np.int64),
        itl_tokens=np.concatenate([np.asarray(k, dtype=np.int64) for _, _, k in itl_parts]) if itl_parts else np.zeros(0, dtype=np.int64),
    )


class _Estimator:
    """Every compared metric of one group at one stage, for the original sample (all weights 1,
    every run once) or for a bootstrap resample (request and run multiplicities)."""

    def __init__(self, data: StageData):
        self.data = data
        self.n = int(data.ok.size)
        self.sorted = {}
        for name, values in data.columns.items():
            usable = data.ok & ~np.isnan(values)
            idx = np.nonzero(usable)[0]
            order = idx[np.argsort(values[idx], kind="stable")]
            self.sorted[name] = (values[order], order)
        order = np.argsort(data.itl_values, kind="stable")
        self.itl_sorted = (data.itl_values[order], data.itl_request[order], data.itl_tokens[order])

    def evaluate(self, request_counts: np.ndarray, run_counts: np.ndarray, itl: bool = True) -> dict[str, np.ndarray]:
        """request_counts: (B, n) multiplicities; run_counts: (B, runs); itl=False skips the ITL
        percentiles (NaN), the costly ones: they read every chunk gap."""
        d = self.data
        out: dict[str, np.ndarray] = {}
        for metric, (column, q) in PERCENTILES.items():
            if column == "itl" and not itl:
                out[metric] = np.full(request_counts.shape[0], np.nan)
                continue
            if column == "itl":
                values, req, k = self.itl_sorted
                weights = request_counts[:, req] * k[None, :]
            else:
                values, order = self.sorted[column]
                weights = request_counts[:, order]
            out[metric] = weighted_quantiles(values, weights, [q])[:, 0]
        total = request_counts.sum(axis=1).astype(float)
        met = (request_counts * d.slo_met[None, :]).sum(axis=1)
        failed = (request_counts * ~d.ok[None, :]).sum(axis=1)
        window = (run_counts * np.nan_to_num(d.windows, nan=0.0)[None, :]).sum(axis=1)
        tokens = (run_counts * d.window_tokens[None, :]).sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            out["slo_attainment"] = np.where(total > 0, met / total, np.nan)
            out["error_rate"] = np.where(total > 0, failed / total, np.nan)
            out["goodput"] = np.where(window > 0, met / window, np.nan)
            out["output_tokens_per_s"] = np.where(window > 0, tokens / window, np.nan)
        return out

    def point(self) -> dict[str, float]:
        res = self.evaluate(np.ones((1, self.n), dtype=np.int64), np.ones((1, len(self.data.run_sizes)), dtype=np.int64))
        return {k: float(v[0]) for k, v in res.items()}

    def resample(self, rng: np.random.Generator, boot: int) -> dict[str, np.ndarray]:
        runs = len(self.data.run_sizes)
        starts = np.concatenate([[0], np.cumsum(self.data.run_sizes)])
        request_counts = np.zeros((boot, self.n), dtype=np.int32)
        if runs > 1:
            run_counts = rng.multinomial(runs, np.full(runs, 1 / runs), size=boot)
        else:
            run_counts = np.ones((boot, 1), dtype=np.int64)
        for j in range(runs):
            size = self.data.run_sizes[j]
            if size == 0:
                continue
            for b in np.nonzero(run_counts[:, j])[0]:
                request_counts[b, starts[j]:starts[j + 1]] = rng.multinomial(run_counts[b, j] * size, np.full(size, 1 / size))
        # Weighted quantiles build (batch x samples) matrices: keep each batch near 4M cells. The ITL
        # percentiles read every chunk gap per resample, so a stage with millions of gaps gets
        # fewer ITL resamples (at least 50; about 4e8 cell operations in all).
        width = max(self.n, self.itl_sorted[0].size, 1)
        step = max(1, 4_000_000 // width)
        itl_boot = min(boot, max(50, int(4e8 // max(self.itl_sorted[0].size, 1))))
        parts = [self.evaluate(request_counts[i:i + step], run_counts[i:i + step], itl=i < itl_boot)
                 for i in range(0, boot, step)]
        out = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        if runs == 1:
            # One run: its window and token count are fixed, so the bootstrap says nothing about the
            # run-to-run noise of throughput; leave it unknown rather than falsely exact.
            out["output_tokens_per_s"] = np.full(boot, np.nan)
        return out


def _better(metric: str, a: float, b: float) -> bool:
    if np.isnan(a):
        return False
    if np.isnan(b):
        return True
    return a > b if METRIC_BETTER[metric] == "higher" else a < b


def _phrase(metric: str) -> str:
    return ("the highest " if METRIC_BETTER[metric] == "higher" else "the lowest ") + METRIC_LABEL[metric]


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
    noisy = [METRIC_LABEL[m.metric] for m in judged if m.winner_clear is False]
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


def compare_groups(
    con: duckdb.DuckDBPyConnection,
    groups: list[Group],
    baseline: str | None = None,
    class_name: str = "(all)",
    boot: int = 400,
    seed: int = 0,
) -> Comparison:
    if len(groups) < 2:
        raise ServelabError("compare needs at least two runs or variants (of different configurations)")
    attach_flags(con, groups)
    labels = [g.label for g in groups]
    if baseline is None:
        baseline = labels[0]
    elif baseline not in labels:
        match = [g.label for g in groups if baseline in g.run_ids or baseline == g.variant]
        if not match:
            raise ServelabError(f"--baseline {baseline}: not one of the compared groups ({', '.join(labels)})")
        baseline = match[0]
    rng = np.random.default_rng(seed)
    stage_rows = fetch_dicts(
        con,
        "SELECT run_id, stage, kind, level FROM stages WHERE list_contains(?, run_id) ORDER BY stage",
        [[r for g in groups for r in g.run_ids]],
    )
    stage_ids = sorted({r["stage"] for r in stage_rows})
    results = []
    for stage in stage_ids:
        levels = {}
        notes = []
        estimates, replicates = {}, {}
        for g in groups:
            rows = [r for r in stage_rows if r["stage"] == stage and r["run_id"] in g.run_ids]
            levels[g.label] = rows[0]["level"] if rows else None
            if not rows:
                notes.append(f"{g.label} has no stage {stage}")
                continue
            data = load_stage(con, g.run_ids, stage, class_name)
            est = _Estimator(data)
            estimates[g.label] = est.point()
            replicates[g.label] = est.resample(rng, boot) if est.n else {}
        distinct_levels = {v for v in levels.values() if v is not None}
        if len(distinct_levels) > 1:
            notes.append("the groups ran this stage at different loads: "
                         + ", ".join(f"{k}={v:g}" for k, v in levels.items() if v is not None))
        metrics = []
        for metric, _, _ in METRICS:
            values = {k: v[metric] for k, v in estimates.items()}
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
            if len(ranked) >= 2:  # a metric only one group has is not a contest
                best = ranked[0]
                for label in ranked[1:]:
                    if _better(metric, values[label], values[best]):
                        best = label
                others = [label for label in ranked if label != best]
                runner = others[0]
                for label in others[1:]:
                    if _better(metric, values[label], values[runner]):
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
            metrics.append(result)
        kind = next((r["kind"] for r in stage_rows if r["stage"] == stage), None)
        results.append(StageComparison(stage, levels, kind, metrics, stage_verdict(labels, metrics), notes))
    overall = _overall_verdict(labels, results)
    return Comparison(groups, baseline, class_name, results, boot, overall)


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
